"""A source proven sane before hours of work (``llmopt.backends.source._sanity``): a tokenizer that splits text
into characters or changes it, a model whose greedy tokens ignore the prompt and a baseline perplexity near
the vocabulary's size each fail their stage (exit 1) with what failed, the numbers and the likely cause; the
models the suite runs (random and trained tiny ones, the demo's scores) pass."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch")

from conftest import DATA, run_cli, tiny_recipe, write_recipe  # noqa: E402
from llmopt.backends.source import _sanity as sanity  # noqa: E402
from llmopt.errors import StageFailed  # noqa: E402


def beside(model: Path, folder: Path) -> Path:
    """``folder`` with the tiny model's config and weights, and no tokenizer yet."""
    folder.mkdir(parents=True)
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        shutil.copy(model / name, folder / name)
    return folder


def character_tokenizer(model: Path, folder: Path) -> None:
    """The tiny model's byte-level tokenizer without its merges: every character a token, as the reported
    GGUF conversion gave ("The capital" -> T h e ▁ c a p ...)."""
    from transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer

    spec = json.loads((model / "tokenizer.json").read_text())
    spec["model"]["merges"] = []
    PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)), bos_token="<s>",
                            eos_token="</s>").save_pretrained(folder)


def test_a_character_tokenizer_fails_the_source_stage_through_the_cli(tiny_model, tmp_path):
    folder = beside(tiny_model, tmp_path / "chars")
    character_tokenizer(tiny_model, folder)
    done = run_cli("run", str(write_recipe(tmp_path, tiny_recipe(folder))), "-o", str(tmp_path / "art"))
    assert done.returncode == 1, done.stderr
    assert "source: the tokenizer splits text into single characters: 5.6 tokens a word" in done.stderr
    assert "'Most of the' became 'M o s t Ġ o f Ġ'" in done.stderr
    assert "give the model's own tokenizer files" in done.stderr
    assert not (tmp_path / "art").exists()


def test_a_tokenizer_that_changes_the_text_fails(tiny_model):
    from tokenizers import Tokenizer, normalizers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    tokenizer.normalizer = normalizers.Lowercase()
    with pytest.raises(StageFailed) as failed:
        sanity.check_tokenizer(PreTrainedTokenizerFast(tokenizer_object=tokenizer))
    assert "does not give back the text it encodes" in failed.value.what
    assert "at character 0 of 35193: 'Most of th' came back as 'most of th'" in failed.value.what


def test_the_tiny_models_tokenizer_and_greedy_tokens_pass(tiny_model):
    """Random weights with tied embeddings repeat the prompt's last word, a different one per prompt."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    found = sanity.check_tokenizer(tokenizer) | sanity.check_greedy(AutoModelForCausalLM.from_pretrained(tiny_model),
                                                                     tokenizer)
    assert found["round_trip"] and found["tokens_per_word"] == pytest.approx(2.585, abs=0.01)
    assert found["greedy"] == [" is" * 8, " was" * 8]


@pytest.mark.parametrize("broken", ["silent", "nan"])
def test_a_model_whose_greedy_tokens_ignore_the_prompt_fails(tiny_model, broken):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    with torch.no_grad():  # a final norm of zeros: every logit 0 whatever the input; or one NaN weight
        if broken == "silent":
            model.model.norm.weight.fill_(0.0)
        else:
            model.model.layers[0].mlp.up_proj.weight[0, 0] = float("nan")
    with pytest.raises(StageFailed) as failed:
        sanity.check_greedy(model, AutoTokenizer.from_pretrained(tiny_model))
    expected = {"silent": "one token repeated whatever the prompt",
                "nan": "logits after 'The capital of France is' are not finite"}[broken]
    assert expected in failed.value.what
    assert "the weights were read wrongly" in failed.value.fix


def test_a_baseline_perplexity_near_the_vocabulary_size_fails_the_baseline(tiny_model, tmp_path):
    """A random model over a vocabulary of 8,192 of which the tokenizer uses 512: its tokenizer and greedy
    tokens pass the source stage, and its perplexity (about 8,500) fails the eval that scores it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from llmopt import api

    folder = tmp_path / "wide"
    config = json.loads((tiny_model / "config.json").read_text())
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**{**config, "vocab_size": 8192})).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_model / name, folder / name)
    with pytest.raises(StageFailed) as failed:
        api.run(write_recipe(tmp_path, tiny_recipe(folder)), output_dir=tmp_path / "art")
    assert failed.value.exit_code == 1 and failed.value.where == "eval.prose.baseline"
    assert "the baseline is broken: its perplexity" in failed.value.what
    assert "of the vocabulary's size (8,192)" in failed.value.what and "token frequencies" in failed.value.what


def test_perplexity_thresholds_on_the_reported_case_and_the_suites_models(tiny_model):
    from transformers import AutoTokenizer

    text = (DATA / "prose_eval.txt").read_text()
    characters = [ord(c) for c in text]  # character ids, as the reported baseline was scored on
    with pytest.raises(StageFailed) as failed:
        sanity.check_baseline_perplexity(95_350, characters, 262_144, "eval.prose.baseline")
    assert "perplexity 95,350 is 36% of the vocabulary's size (262,144)" in failed.value.what
    assert "4,627 times the 20.6 of counting" in failed.value.what
    # the suite's random tiny models (515-531 on 512), a trained one (64-90, here on 8,192), the demo (29.6)
    ids = AutoTokenizer.from_pretrained(tiny_model)(text)["input_ids"]
    for perplexity, vocab in ((531.0, 512), (90.0, 8192), (29.6, 49_152)):
        found = sanity.check_baseline_perplexity(perplexity, ids, vocab, "eval.prose.baseline")
        assert found["unigram_perplexity"] == pytest.approx(183.9, abs=0.1)
