"""`[export] embedding`: the token embedding table as GatherBlockQuantized (int4 / int8) in the ONNX export of
the tiny model, loaded by onnxruntime-genai, verified on the CPU EP, sized by the plan; and what the plan refuses."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("onnxruntime_genai")
pytest.importorskip("onnx_ir")

from llmopt import api  # noqa: E402
from llmopt.backends.export import onnx_embedding, onnx_verify  # noqa: E402

from conftest import tiny_recipe, write_recipe  # noqa: E402

# [export] body -> (bits of the embedding's GatherBlockQuantized, whether its table is the LM head's)
VARIANTS = {
    "int4": ('precision = "int4"\nlm_head = "int8"\nembedding = "int4"\n', 4, False),
    "int8": ('precision = "int4"\nlm_head = "int8"\nembedding = "int8"\n', 8, True),  # the tied int8 head's table
    "int8-under-fp32": ('precision = "fp32"\nembedding = "int8"\n', 8, False),
    "int4-tied-head": ('precision = "int4"\nlm_head = "int4"\n', 4, True),
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def exported(request, tiny_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"embed-{request.param}")
    body = VARIANTS[request.param][0]
    recipe = write_recipe(folder, tiny_recipe(tiny_model) + f'[export]\nformat = "onnx"\nintra_op_threads = 1\n{body}')
    return request.param, api.run(recipe, cache_dir=folder / "cache", output_dir=folder / "artifact")


def graph_gathers(model_file) -> list[tuple[str, int | None]]:
    import onnx

    model = onnx.load(model_file, load_external_data=False)
    out = []
    for node in model.graph.node:
        if node.name.startswith("/model/embed_tokens/") and "Gather" in node.op_type:
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            out.append((node.op_type, attrs.get("bits", 4) if node.op_type == "GatherBlockQuantized" else None))
    return out


def test_the_graph_gathers_from_a_table_of_the_expected_bits(exported):
    name, result = exported
    _, bits, shared = VARIANTS[name]
    model = result.artifact / "model"
    assert graph_gathers(model / "model.onnx") == [("GatherBlockQuantized", bits)]
    export = next(r for r in result.records if r.name == "export.onnx").outputs
    assert export["embedding"] == {"op": "GatherBlockQuantized", "bits": bits, "block_size": 32,
                                   "shared_with_lm_head": shared}
    assert f"embedding table int{bits} GatherBlockQuantized" in (result.artifact / "README.md").read_text()


def test_verify_finds_the_quantized_gather_running_on_the_cpu_ep(exported):
    _, result = exported
    verify = next(r for r in result.records if r.name == "export.onnx").outputs["verify"]
    assert verify["status"] == "passed"
    assert verify["gatherblockquantized"] == {"in_graph": 1, "executed": 1}


def test_the_size_estimate_is_what_the_export_writes(exported):
    _, result = exported
    model = result.artifact / "model"
    assert result.plan.estimates["weight_bytes_after"] == (model / "model.onnx.data").stat().st_size


def test_onnxruntime_genai_loads_and_generates(exported):
    import onnxruntime_genai as og

    _, result = exported
    model = og.Model(str(result.artifact / "model"))
    tokenizer = og.Tokenizer(model)
    prompt = tokenizer.encode("The sun is a star")
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + 8, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(prompt)
    while not generator.is_done():
        generator.generate_next_token()
    tokens = np.asarray(generator.get_sequence(0))
    assert len(tokens) == len(prompt) + 8 and tokens.max() < json.loads(
        (result.artifact / "model" / "genai_config.json").read_text())["model"]["vocab_size"]


def test_int8_blocks_round_trip_within_half_a_step():
    table = np.random.default_rng(0).standard_normal((5, 64)).astype(np.float32)
    table[1, :32] = 0  # an all-zero block keeps scale 0 and codes 128
    codes, scales = onnx_embedding.int8_blocks(table, 32)
    back = (codes.astype(np.float32) - 128).reshape(5, 2, 32) * scales[..., None]
    assert np.all(np.abs(back.reshape(5, 64) - table) <= scales.repeat(32, axis=1) / 2 + 1e-7)
    assert scales[1, 0] == 0 and np.all(codes[1, :32] == 128) and np.abs(codes.astype(int) - 128).max() == 127


def test_verify_fails_a_quantized_gather_that_did_not_run():
    report = {"matmulnbits": {"in_graph": 0, "executed": 0}, "fallback": [], "execution_provider": "cpu",
              "gatherblockquantized": {"in_graph": 1, "executed": 0}}
    assert onnx_verify.judge(report, quantized=False) == ["only 0 of 1 GatherBlockQuantized nodes executed"]


def plan_errors(tmp_path, tiny_model, body: str, severity: str = "error") -> str:
    recipe = write_recipe(tmp_path, tiny_recipe(tiny_model) + f'[export]\nformat = "onnx"\n{body}')
    plan = api.plan(recipe, cache_dir=tmp_path / "cache")
    return "\n".join(str(p) for p in plan.problems if p.severity == severity)


@pytest.mark.parametrize("body, key, said, fix", [
    ('precision = "int8"\nembedding = "int4"\n', "export.embedding", "builder's int4 quantizer",
     'set precision = "int4", or embedding = "int8"'),
    ('lm_head = "int4"\nembedding = "int8"\nshared_embeddings = true\n', "export.embedding",
     "LM head's int4 table, not an int8 one", "remove shared_embeddings"),
    ('precision = "fp32"\nembedding = "int8"\nblock_size = 128\n', "export.block_size",
     "does not divide the embedding width 64", "use one of: 16, 32, 64"),
])
def test_plan_refuses_what_the_embedding_cannot_be(tmp_path, tiny_model, body, key, said, fix):
    text = plan_errors(tmp_path, tiny_model, body)
    assert key in text and said in text and fix in text


def test_plan_warns_that_an_untied_embedding_doubles_the_table(tmp_path, tiny_model):
    text = plan_errors(tmp_path, tiny_model, 'embedding = "float"\n', severity="warning")
    assert "export.embedding" in text and "second copy" in text and "remove embedding (auto)" in text
    assert not plan_errors(tmp_path, tiny_model, 'embedding = "int4"\n', severity="warning")
