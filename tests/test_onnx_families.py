"""`[export] format = "onnx"` on a tiny trained model of each family onnxruntime-genai's model builder knows
(tests/families.py): llama, qwen2, qwen3, mistral, gemma2, gemma3_text, phi3, granite.

* ``test_float_export_scores_as_pytorch``: an fp32 export, checked on the CPU EP (sliding-window layers included),
  scores the perplexity of the PyTorch model on 128-token windows, twice the models' sliding window, within 0.1%
  (measured 2026-12-07: at most 0.011%, gemma3_text). That is what proves the graph: on these models a sliding
  window left out moves the perplexity by 0.15% (gemma2) to 0.7% (mistral), Gemma 3's full layers at the sliding
  layers' RoPE base by 0.5%, and Gemma 2 without its attention softcapping by 0.5%. Greedy tokens generated past
  the window (the windowed KV cache) are the PyTorch model's, and so are the scores and tokens of a text shorter
  than the window (``onnx.window_floor``);
* ``test_int4_quickstart_path``: the quickstart's path (GPTQ W4 in groups of 32 with zero points, 2 sensitive layers
  at 8 bits, int4 ONNX with an int8 LM head, verified, perplexity and multiple choice, then a completion from
  ``llmopt serve`` on the artifact) within 10% of PyTorch's perplexity (measured: -0.4% to
  +6.8%, qwen2 the highest); the plan's size estimate within 5% of the files written (measured: -3.9% to +1.7%);
  weights smaller than the bf16 checkpoint's; a tied model keeps one 8-bit table for its embedding and LM head,
  and its whole folder is smaller than the bf16 one.

A model with windowed KV caches (sliding-window layers) is not batched by og.Engine's static engine, which fails
prompts of different lengths on them (``onnx_batch.static_refusal``): it is served one request at a time.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime_genai")
pytest.importorskip("onnx_ir")

from llmopt import api  # noqa: E402

from conftest import write_recipe  # noqa: E402
from families import recipe  # noqa: E402

from llmopt.model import families  # noqa: E402

# the families whose ONNX export the family table claims (llmopt/model/families.toml): each claim is run here
BUILDER_FAMILIES = tuple(f for f in families.families() if families.verdict(f, "export.onnx").status == "works")
SLIDING_LAYERS = {"mistral": [0, 1], "gemma2": [0], "gemma3_text": [0, 1]}  # as transformers windows them
ADAPTED = {"gemma3_text": "rope_parameters per layer type", "mistral": "layer_types", "phi3": "original_max_position"}
TIED = {"gemma2", "gemma3_text"}

MULTIPLE_CHOICE = '\n[[eval]]\nname = "mc"\nkind = "multiple_choice"\ndata = "builtin:mc"\nlimit = 20\n'

FLOAT = '[export]\nformat = "onnx"\nprecision = "fp32"\nintra_op_threads = 1\nverify = "fail"\n'
QUICKSTART = """\
[[compress]]
method = "gptq"
group_size = 32
symmetric = false
sensitive_layers = 2

[export]
format = "onnx"
precision = "int4"
execution_provider = "cpu"
lm_head = "int8"
intra_op_threads = 1
verify = "fail"
"""


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """One stage cache for the module: each family's source stage and PyTorch baseline are computed once."""
    return tmp_path_factory.mktemp("onnx-families-cache")


def run(folder: Path, cache: Path, family: str, model: Path, steps: str, tag: str, more: str = ""):
    path = write_recipe(folder, recipe(f"{family}-{tag}", model, steps + more, windows=4), f"{tag}.toml")
    return api.run(path, cache_dir=cache, output_dir=folder / tag)


def outputs(result, name: str) -> dict:
    return next(r for r in result.records if r.name == name).outputs


def scores(result) -> tuple[float, float]:
    base, cand = outputs(result, "eval.prose.baseline"), outputs(result, "eval.prose.candidate")
    assert (base["runtime"], cand["runtime"]) == ("transformers", "onnxruntime")
    assert base["tokens"] == cand["tokens"] > 400
    return base["value"], cand["value"]


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


@pytest.mark.parametrize("family", BUILDER_FAMILIES)
def test_float_export_scores_as_pytorch(family, family_model, cache, tmp_path):
    from llmopt.runtimes.hf import TransformersRuntime
    from llmopt.runtimes.onnx import OnnxRuntime

    model = family_model(family)
    result = run(tmp_path, cache, family, model, FLOAT, "fp32")
    export = outputs(result, "export.onnx")
    assert export["verify"]["status"] == "passed", export["verify"]
    assert any(ADAPTED[family] in line for line in export["builder_config"]) if family in ADAPTED \
        else export["builder_config"] == []
    genai = json.loads((result.artifact / "model" / "genai_config.json").read_text())["model"]["decoder"]
    assert (genai.get("sliding_window") or {}).get("layers") == SLIDING_LAYERS.get(family), genai.get("sliding_window")
    baseline, candidate = scores(result)
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    assert baseline < vocab / 4, f"the tiny {family} model is not trained: perplexity {baseline:.1f}"
    assert abs(candidate / baseline - 1) < 1e-3, f"{family} fp32 ONNX {candidate:.3f} against PyTorch {baseline:.3f}"

    ort, hf = OnnxRuntime(result.artifact / "model"), TransformersRuntime(model)
    ids = ort.encode((Path(__file__).parents[1] / "llmopt" / "data" / "prose_eval.txt").read_text())[:90]
    assert ids == hf.encode((Path(__file__).parents[1] / "llmopt" / "data" / "prose_eval.txt").read_text())[:90]
    expected = list(hf.stream(ids, 8, stop_ids=set()))  # from position 90 on: past the 64-token window
    got = ort.generate(ids, 8, stop_ids=set())
    assert got == expected[: len(got)] and (len(got) == 8 or got[-1] in ort.eos_ids), (got, expected)
    short = ids[:40]  # shorter than the window: a generator of 41 tokens still gets the window's KV buffers
    assert ort.nll([short], [39]) == pytest.approx(hf.nll([short], [39]), rel=1e-4)
    assert ort.generate(short, 4, stop_ids=set()) == list(hf.stream(short, 4, stop_ids=set()))[:4]
    # og.Engine's static batch pads prompts to one length, which windowed KV caches refuse: served one at a time
    assert (ort.batch_refusal is not None) is (family in SLIDING_LAYERS) and (ort.batch_kind is None) is (
        family in SLIDING_LAYERS)


@pytest.mark.parametrize("family", BUILDER_FAMILIES)
def test_int4_quickstart_path(family, family_model, cache, tmp_path):
    import urllib.request

    from llmopt.server import load_model
    from test_server import running

    model = family_model(family)
    result = run(tmp_path, cache, family, model, QUICKSTART, "int4", MULTIPLE_CHOICE)
    export = outputs(result, "export.onnx")
    assert export["verify"]["status"] == "passed", export["verify"]
    baseline, candidate = scores(result)
    assert candidate <= baseline * 1.10, f"{family}: int4 ONNX {candidate:.2f} against PyTorch {baseline:.2f}"

    folder = result.artifact / "model"
    estimate, written = result.plan.estimates["artifact_bytes"], folder_bytes(folder)
    assert abs(estimate / written - 1) < 0.05, f"{family}: planned {estimate} bytes, written {written}"
    assert (folder / "model.onnx.data").stat().st_size < (model / "model.safetensors").stat().st_size
    if family in TIED:
        assert export["embedding"] == {"op": "GatherBlockQuantized", "bits": 8, "block_size": 32,
                                       "shared_with_lm_head": True}
        source = folder_bytes(model)
        assert written < source, f"{family}: {written} bytes written, the bf16 folder {source}"
    else:
        assert export["embedding"]["op"] == "Gather" and not export["embedding"]["shared_with_lm_head"]
    mc_base, mc_cand = (outputs(result, f"eval.mc.{role}")["value"] for role in ("baseline", "candidate"))
    assert abs(mc_cand - mc_base) <= 0.25, (mc_base, mc_cand)
    # served: `llmopt serve` on the artifact answers a completion
    with running(load_model(result.artifact, name=family)) as base:
        request = urllib.request.Request(f"{base}/v1/completions", data=json.dumps(
            {"model": family, "prompt": "The capital of France is", "max_tokens": 6}).encode(),
            headers={"Content-Type": "application/json"})
        answer = json.loads(urllib.request.urlopen(request, timeout=60).read())
    assert answer["usage"]["completion_tokens"] >= 1 and answer["choices"][0]["text"].strip(), answer


def test_a_dynamic_engine_batches_windowed_caches_and_a_static_one_does_not():
    from llmopt.runtimes.onnx_batch import static_refusal

    windowed = {"model": {"decoder": {"sliding_window": {"window_size": 64, "layers": [0]}}}}
    assert "prompts of different lengths" in static_refusal(windowed)
    assert static_refusal(windowed | {"engine": {"dynamic_batching": {}}}) is None
    assert static_refusal({"model": {"decoder": {"sliding_window": {"window_size": 64, "layers": []}}}}) is None


def test_the_builder_is_given_rope_it_can_build_and_refused_rope_it_cannot():
    import transformers

    from llmopt.backends.export import onnx_config
    from llmopt.errors import StageFailed

    per_type = {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    config = transformers.Gemma3TextConfig(num_hidden_layers=2, rope_parameters=per_type)
    assert onnx_config.adapt(config, "export.onnx")
    rope = (config.rope_parameters["rope_type"], config.rope_theta, config.rope_local_base_freq)
    assert rope == ("default", 1e6, 1e4)
    linear = per_type | {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}}
    with pytest.raises(StageFailed, match="sliding layers the full layers' scaling"):
        onnx_config.adapt(transformers.Gemma3TextConfig(num_hidden_layers=2, rope_parameters=linear), "export.onnx")
    longrope = {"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0] * 16, "long_factor": [2.0] * 16,
                "original_max_position_embeddings": 4096}
    phi3 = transformers.Phi3Config(hidden_size=128, num_attention_heads=4, max_position_embeddings=131072,
                                   original_max_position_embeddings=4096, rope_parameters=longrope)
    assert onnx_config.adapt(phi3, "export.onnx") == [] and phi3.original_max_position_embeddings == 4096
