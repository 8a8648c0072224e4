"""Eval backends on the tiny model: paired per-example scores, and perplexity against plain transformers."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from llmopt.run import evaluate
from llmopt.backends.eval.generation import GenerationOptions, cut, is_correct, normalise
from llmopt.backends.eval.multiple_choice import MultipleChoiceOptions, context_of, example_row

from conftest import DATA, train_tokenizer, write_recipe


def recipe_for(model: Path, evals: str) -> str:
    return f'schema_version = 1\nname = "tiny-evals"\n\n[model]\nsource = "{model}"\n\n{evals}'


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_multiple_choice_and_generation_give_paired_scores(tiny_model, tmp_path):
    body = """
[[eval]]
name = "mc"
kind = "multiple_choice"
limit = 24
metric = "acc_norm"
max_drop = 0.2

[[eval]]
name = "qa"
kind = "generation"
limit = 6
max_new_tokens = 4
max_drop = 0.5
"""
    recipe = write_recipe(tmp_path, recipe_for(tiny_model, body))
    result = evaluate.evaluate(recipe, candidate=tiny_model, output=tmp_path / "reports")
    assert [g["verdict"] for g in result.gates] == ["pass", "pass"]
    for name, n in (("mc", 24), ("qa", 6)):
        base = read_rows(tmp_path / "reports" / f"eval.{name}.baseline.scores.jsonl")
        cand = read_rows(tmp_path / "reports" / f"eval.{name}.candidate.scores.jsonl")
        assert len(base) == n and [r["id"] for r in base] == [r["id"] for r in cand]
        assert all(r["score"] in (0, 1) for r in base + cand)
        gate = next(g for g in result.gates if g["name"] == name)
        assert gate["n"] == n and gate["method"] == "score" and gate["delta"] == 0.0
    mc = read_rows(tmp_path / "reports" / "eval.mc.baseline.scores.jsonl")
    assert all(len(r["loglik"]) == 4 and all(x < 0 for x in r["loglik"]) for r in mc)
    assert all(r["score"] == r["acc_norm"] for r in mc)
    outputs = result.report["evals"]["eval.mc.baseline"]
    assert outputs["value"] == pytest.approx(sum(r["acc_norm"] for r in mc) / 24)
    assert outputs["normalisation"] == "characters" and outputs["chance"] == 0.25


def test_mc_picks_by_total_and_per_character_loglikelihood():
    item = {"id": "q", "choices": ["a", "bbbbbbbb"], "answer": 1}
    row = example_row(item, [-2.0, -4.0], [1, 8], "acc")
    assert (row["pred"], row["pred_norm"], row["score"], row["acc_norm"]) == (0, 1, 0, 1)


def test_mc_few_shot_never_shows_the_question_itself():
    pool = [json.loads(line) for line in (DATA / "mc.jsonl").read_text().splitlines()[:10]]
    options = MultipleChoiceOptions(few_shot=3)
    for item in pool:
        context = context_of(options, item, pool)
        assert context.count("Question:") == 4 and context.endswith(f"Question: {item['question']}\nAnswer:")
        assert context.count(item["question"]) == 1
    assert context_of(options, pool[0], pool) == context_of(options, pool[0], pool)  # seeded


def test_generation_matching_and_normalisation():
    exact = GenerationOptions()
    assert normalise("  The  Answer, is: BLUE! ", exact.normalize) == "the answer is blue"
    assert cut("\n 12\nQuestion: 3", ["\n"]) == "12"
    assert is_correct("Blue.", ["blue"], exact) and not is_correct("light blue", ["blue"], exact)
    assert is_correct("twelve", ["12", "twelve"], exact)
    contains = GenerationOptions(match="contains")
    assert is_correct("It is light blue.", ["blue"], contains) and not is_correct("bluer", ["blue"], contains)
    regex = GenerationOptions(match="regex")
    assert is_correct("The result is 1,024 apples", ["1,024"], regex) and not is_correct("none", ["3"], regex)
    assert not is_correct("", [""], exact)


def independent_perplexity(model_dir: Path, window: int, stride: int, max_windows: int) -> float:
    """Perplexity over the same windows from transformers' own loss, with the context masked by -100."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    paragraphs = [p.strip() for p in (DATA / "prose_eval.txt").read_text().split("\n\n") if p.strip()]
    ids = [tok.bos_token_id] + tok("\n\n".join(paragraphs), add_special_tokens=False)["input_ids"]
    total_nll, total_tokens, scored_until = 0.0, 0, 0
    for begin in range(0, len(ids), stride):
        end = min(begin + window, len(ids))
        chunk = torch.tensor([ids[begin:end]])
        labels = chunk.clone()
        fresh = end - max(scored_until, begin + 1)  # tokens not scored by an earlier window
        labels[0, : chunk.shape[1] - fresh] = -100
        with torch.no_grad():
            loss = model(input_ids=chunk, labels=labels).loss
        total_nll += float(loss) * fresh
        total_tokens += fresh
        scored_until = end
        max_windows -= 1
        if end == len(ids) or max_windows == 0:
            break
    return math.exp(total_nll / total_tokens)


def test_perplexity_matches_plain_transformers(tiny_model, tmp_path):
    body = '[[eval]]\nname = "prose"\nkind = "perplexity"\nwindow = 64\nstride = 40\nmax_windows = 6\n'
    recipe = write_recipe(tmp_path, recipe_for(tiny_model, body))
    result = evaluate.evaluate(recipe, output=tmp_path / "reports")
    ours = result.report["evals"]["eval.prose"]["value"]
    theirs = independent_perplexity(tiny_model, 64, 40, 6)
    print(f"llmopt perplexity {ours:.4f}, transformers loss {theirs:.4f}")
    assert ours == pytest.approx(theirs, rel=0.005)
    assert result.report["evals"]["eval.prose"]["n"] == 6


def test_a_prompt_starts_with_bos_where_the_tokenizer_puts_one(tmp_path):
    """Issue 37: prompts follow the tokenizer's own rule (lm-eval's and vLLM's), with an option for either other."""
    from tokenizers import processors
    from transformers import AutoTokenizer

    from llmopt.runtimes import hf_adds_bos
    from llmopt.scoring.evalkit import encode_prompt

    train_tokenizer(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    assert not hf_adds_bos(tok)  # a byte-level BPE as SmolLM2's and GPT-2's: no BOS of its own
    tok._tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.bos_token_id)])
    assert hf_adds_bos(tok)  # as Llama's

    def model(adds_bos):
        return SimpleNamespace(adds_bos=adds_bos, encode=lambda text, bos: ([1] if bos else []) + [7])

    assert encode_prompt(model(False), "Q") == [7] and encode_prompt(model(True), "Q") == [1, 7]
    assert encode_prompt(model(False), "Q", bos="always") == [1, 7] and encode_prompt(model(True), "Q", bos="never") == [7]
    chat = SimpleNamespace(bos_token="<s>")  # a chat-formatted text that starts with BOS gets no second one
    assert encode_prompt(model(True), "<s>user", chat) == [7] and encode_prompt(model(True), "<s>user", chat, "always") == [7]


def choice_groups(model) -> list[tuple[list[int], list[list[int]]]]:
    """Two questions' contexts, each with choices of one token and of several, as the multiple-choice eval makes them."""
    from llmopt.backends.eval.multiple_choice import split_pair

    groups = []
    for question, choices in (("Which is a colour?", [" red", " a small stone", " it", " the longest river in it"]),
                              ("Where do fish live?", [" water", " in the dark forest", " sky"])):
        pairs = [split_pair(model, f"Question: {question}\nAnswer:", choice) for choice in choices]
        context = pairs[0][0][:-pairs[0][1]]
        assert all(ids[:-n] == context for ids, n in pairs)
        groups.append((context, [ids[-n:] for ids, n in pairs]))
    return groups


def test_choices_scored_after_one_pass_over_their_context_score_as_each_sequence_whole(tiny_model):
    """The transformers runtime scores the choices of a question from one forward pass over its context, whose
    key/value cache the choices of more than one token then continue: the log-likelihoods of scoring each context
    + choice whole, from fewer tokens (the builtin questions' contexts are 15 tokens, their choices 2)."""
    from llmopt.runtimes.hf import TransformersRuntime

    model = TransformersRuntime(tiny_model)
    groups = choice_groups(model)
    fed, heads = [], []
    hook = model.model.register_forward_pre_hook(lambda module, args, kwargs: fed.append(kwargs["input_ids"].shape),
                                                 with_kwargs=True)
    head = model.model.register_forward_hook(lambda module, args, out: heads.append(out.logits.shape[1]))
    try:
        shared = model.continuation_nll(groups)
    finally:
        hook.remove()
        head.remove()
    whole = model.nll([context + choice for context, choices in groups for choice in choices],
                      [len(choice) for _, choices in groups for choice in choices])
    assert [x for row in shared for x in row] == pytest.approx(whole, abs=1e-4)
    contexts = max(len(context) for context, _ in groups)
    longer = [choice for _, choices in groups for choice in choices if len(choice) > 1]
    assert fed == [(2, contexts), (len(longer), max(len(c) for c in longer) - 1)]
    assert heads[0] == len({len(context) for context, _ in groups})  # the head at each context's last position only


def test_the_multiple_choice_eval_scores_choices_after_their_shared_context(tiny_model, tmp_path, monkeypatch):
    """In process on transformers the eval passes each question's context once (``continuation_nll``), not once a
    choice (``nll``); its log-likelihoods are those of each sequence scored whole."""
    from llmopt.backends.eval.multiple_choice import context_of, MultipleChoiceOptions, choice_text, split_pair
    from llmopt.runtimes.hf import TransformersRuntime
    from llmopt import data as datasets

    whole_calls = []
    nll = TransformersRuntime.nll
    monkeypatch.setattr(TransformersRuntime, "nll", lambda self, *a: whole_calls.append(a) or nll(self, *a))
    body = '[[eval]]\nname = "mc"\nkind = "multiple_choice"\nlimit = 12\n'
    evaluate.evaluate(write_recipe(tmp_path, recipe_for(tiny_model, body)), output=tmp_path / "reports")
    assert whole_calls == []
    rows = read_rows(tmp_path / "reports" / "eval.mc.scores.jsonl")
    model, options = TransformersRuntime(tiny_model), MultipleChoiceOptions()
    items = datasets.load_records("builtin:mc")[:12]
    pairs = [split_pair(model, context_of(options, item, items), choice_text(options.continuation, item, j))
             for item in items for j in range(len(item["choices"]))]
    whole = nll(model, [ids for ids, _ in pairs], [n for _, n in pairs])
    assert [x for row in rows for x in row["loglik"]] == pytest.approx([-x for x in whole], abs=2e-4)


def test_a_cache_that_cannot_be_copied_per_row_scores_the_longer_choices_whole(tiny_model, monkeypatch):
    """A model whose key/value cache has no ``batch_select_indices`` (some hybrid caches) gets its choices of
    more than one token scored as whole sequences: the same log-likelihoods."""
    import transformers

    from llmopt.runtimes.hf import TransformersRuntime

    model = TransformersRuntime(tiny_model)
    groups = choice_groups(model)
    whole = model.nll([context + choice for context, choices in groups for choice in choices],
                      [len(choice) for _, choices in groups for choice in choices])
    owner = next(c for c in transformers.DynamicCache.__mro__ if "batch_select_indices" in vars(c))
    monkeypatch.delattr(owner, "batch_select_indices")
    shared = model.continuation_nll(groups)
    assert [x for row in shared for x in row] == pytest.approx(whole, abs=1e-4)


def test_windows_after_the_first_score_their_first_token_where_a_bos_goes_before_them():
    from llmopt.backends.eval.perplexity import windows

    assert windows(10, 4, 4, None) == [(0, 4, 3), (4, 8, 3), (8, 10, 1)]  # no BOS: a window's first token has no context
    assert windows(10, 4, 4, None, prefixed=True) == [(0, 4, 3), (4, 8, 4), (8, 10, 2)]
    assert windows(10, 4, 2, None, prefixed=True) == [(0, 4, 3), (2, 6, 2), (4, 8, 2), (6, 10, 2)]  # overlap: as before


@pytest.mark.parametrize("post, config, adds", [
    ({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<bos>"}}, {"Sequence": {"id": "A"}}],
      "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2]}}}, {}, True),  # Gemma's
    ({"type": "Sequence", "processors": [{"type": "ByteLevel"}, {"type": "TemplateProcessing", "single": [
        {"SpecialToken": {"id": "<bos>"}}, {"Sequence": {"id": "A"}}], "special_tokens": {"<bos>": {"ids": [2]}}}]},
     {}, True),  # Llama 3's
    ({"type": "ByteLevel"}, {}, False),  # SmolLM2's and GPT-2's
    (None, {"add_bos_token": True}, True),  # Llama 2's slow-tokenizer flag
    ({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<bos>"}}, {"Sequence": {"id": "A"}}],
      "special_tokens": {"<bos>": {"ids": [2]}}}, {"add_bos_token": False}, False),  # the flag wins, as transformers'
])
def test_the_onnx_runtime_reads_whether_texts_start_with_a_bos_from_the_tokenizer_files(tmp_path, post, config, adds):
    """onnxruntime-genai's tokenizer adds no BOS where transformers' does, so the ONNX runtime reads the rule from
    the files transformers reads, and the candidate's windows begin as the baseline's."""
    from llmopt.runtimes.onnx import files_add_bos

    (tmp_path / "tokenizer.json").write_text(json.dumps({"post_processor": post}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<bos>", **config}))
    assert files_add_bos(tmp_path, 2) is adds
