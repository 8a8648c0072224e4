"""`sensitive_layers = N` (issue 37): the layer groups 4-bit rounding hurts most, measured on the calibration
data, keep 8-bit weights; the checkpoint carries both widths to the engines and into an int4 ONNX model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmopt import api
from llmopt.backends.compress import _llmcompressor as lc
from llmopt.model import estimates

from conftest import onnx_to_checkpoint_perplexity, tiny_recipe, write_recipe

pytest.importorskip("compressed_tensors")


def tiny_model_in_memory(folder: Path):
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(folder).eval()


def batches(count: int = 3, length: int = 32):
    import torch

    generator = torch.Generator().manual_seed(1)
    return [torch.randint(3, 500, (1, length), generator=generator) for _ in range(count)]


def test_units_are_the_linears_that_read_one_input(tiny_model):
    from llmopt.backends.compress import _sensitivity

    units, moments = _sensitivity.units_and_moments(tiny_model_in_memory(tiny_model), batches(), {"lm_head"})
    expected = []
    for i in range(2):
        a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        expected += [(a + "q_proj", a + "k_proj", a + "v_proj"), (a + "o_proj",), (m + "gate_proj", m + "up_proj"),
                     (m + "down_proj",)]
    assert sorted(units) == sorted(expected)
    assert all(bool((moments[u] > 0).all()) for u in units)
    assert moments[expected[3]].shape == (128,)  # down_proj reads the MLP's 128 channels


def test_a_weight_outlier_ranks_its_group_first(tiny_model):
    """An outlier widens its group's 4-bit steps: that unit's rounding error on the data becomes the largest."""
    import torch

    from llmopt.backends.compress import _sensitivity

    model = tiny_model_in_memory(tiny_model)
    before = _sensitivity.rank(model, batches(), 4, 32, False, {"lm_head"})
    assert len(before) == 8 and all(u.score > 0 for u in before)
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight[:, ::32] *= 40  # one outlier in every group of 32
    after = _sensitivity.rank(model, batches(), 4, 32, False, {"lm_head"})
    assert after[0].names == ("model.layers.1.mlp.down_proj",)
    assert before[0].names != after[0].names
    assert after[0].score > next(u.score for u in before if u.names == after[0].names)


def test_kept_bytes_are_the_wider_codes_less_the_zero_points():
    from llmopt.backends.compress._sensitivity import Unit, added_bytes

    unit = [Unit(("x",), 1.0, 64 * 128)]
    assert added_bytes(unit, 4, 32, True) == 64 * 128 // 2  # 4 more bits a weight
    assert added_bytes(unit, 4, 32, False) == 64 * 128 // 2 - 64 * 128 // 32 // 2  # its 4-bit zero points go


@pytest.fixture(scope="module")
def mixed_run(tiny_model, tmp_path_factory):
    """AWQ W4 g32 with zero points, its 2 most sensitive groups at 8 bits -> repack -> ONNX int4 (fp32 compute)."""
    pytest.importorskip("llmcompressor")
    pytest.importorskip("onnxruntime_genai")
    folder = tmp_path_factory.mktemp("sensitive")
    body = ('[calibration]\nsamples = 4\nmax_seq_len = 64\n\n'
            '[[compress]]\nmethod = "awq"\ngroup_size = 32\nsensitive_layers = 2\n\n'
            '[export]\nformat = "onnx"\nprecision = "int4"\naccuracy_level = 1\nintra_op_threads = 1\n')
    recipe = write_recipe(folder, tiny_recipe(tiny_model).replace('name = "tiny"', 'name = "tiny-mixed"') + body)
    return api.run(recipe, cache_dir=folder / "cache", output_dir=folder / "artifact")


def outputs(result, name: str) -> dict:
    return next(r for r in result.records if r.name == name).outputs


def test_the_checkpoint_keeps_the_most_sensitive_groups_at_8_bits(mixed_run):
    measured = outputs(mixed_run, "compress.0.awq")["sensitive_layers"]
    kept = [name for unit in measured["kept"] for name in unit]
    assert len(measured["kept"]) == 2 and len(measured["scores"]) == 8 and measured["added_bytes"] > 0
    top = sorted(measured["scores"].values(), reverse=True)[:2]
    assert sorted(measured["scores"][unit[0]] for unit in measured["kept"]) == sorted(top)
    plan = mixed_run.plan
    config = json.loads((plan.cache.path(plan.stage("compress.0.awq").key) / "model" / "config.json").read_text())
    groups = config["quantization_config"]["config_groups"]
    assert groups["group_0"]["weights"]["num_bits"] == 4 and groups["group_0"]["weights"]["symmetric"] is False
    assert groups["group_1"]["weights"]["num_bits"] == 8 and groups["group_1"]["weights"]["symmetric"] is True
    assert sorted(groups["group_1"]["targets"]) == sorted(kept + lc.fused_names(kept))
    assert measured["kept_parameters"] == sum({"q_proj": 64 * 64, "k_proj": 64 * 64, "v_proj": 64 * 64,
                                               "o_proj": 64 * 64, "gate_proj": 128 * 64, "up_proj": 128 * 64,
                                               "down_proj": 64 * 128}[n.rsplit(".", 1)[1]] for n in kept)


def test_both_widths_reach_the_onnx_model_exactly(mixed_run):
    """The 8-bit groups become 8-bit MatMulNBits: the ONNX model scores as the PyTorch checkpoint."""
    import onnx

    export = outputs(mixed_run, "export.onnx")
    kept = [name for unit in outputs(mixed_run, "compress.0.awq")["sensitive_layers"]["kept"] for name in unit]
    assert export["quantized_input"]["linears_8bit"] == len(kept)
    assert export["verify"]["status"] == "passed" and export["verify"]["fallback_nodes"] == 0
    graph = onnx.load(str(mixed_run.artifact / "model" / "model.onnx"), load_external_data=False).graph
    widths = [next(a.i for a in node.attribute if a.name == "bits") for node in graph.node if node.op_type == "MatMulNBits"]
    assert 8 in widths and 4 in widths
    plan = mixed_run.plan
    compressed = plan.cache.path(plan.stage("compress.0.awq").key) / "model"
    assert abs(onnx_to_checkpoint_perplexity(compressed, mixed_run.artifact / "model") - 1) < 2e-3
    # the plan's size model counts them in the ONNX folder too, at most the two largest groups' four more bits a
    # weight and 8-bit zero points: at least what the two kept groups add
    kept_parameters = outputs(mixed_run, "compress.0.awq")["sensitive_layers"]["kept_parameters"]
    planned = plan.estimates["model_size"]["parts"][estimates.KEPT_PART]
    assert kept_parameters // 2 + kept_parameters // 32 // 2 <= planned == (2 * 2 * 128 * 64) * (1 + 1 / 32) // 2


def test_plan_counts_the_kept_bytes_and_refuses_an_8_bit_scheme(tmp_path, tiny_model):
    def plan(steps: str):
        return api.plan(write_recipe(tmp_path, tiny_recipe(tiny_model) + steps), cache_dir=tmp_path / "cache")

    plain = plan('[[compress]]\nmethod = "gptq"\ngroup_size = 32\n')
    kept = plan('[[compress]]\nmethod = "gptq"\ngroup_size = 32\nsensitive_layers = 3\n')
    assert not plain.errors and not kept.errors
    size = [p.estimates["weight_bytes_after"] for p in (plain, kept)]
    # at most the model's three largest groups, 4 more bits a weight: its two gate/up (2 x 128 x 64 each), then a
    # down_proj or a q/k/v (8,192 weights each); not three gate/up, of which the two layers have two
    assert size[1] - size[0] == (2 * 2 * 128 * 64 + 64 * 128) // 2
    refused = plan('[[compress]]\nmethod = "gptq"\nscheme = "W8A8"\nsensitive_layers = 2\n')
    assert any(str(p.where).endswith("compress[0].sensitive_layers") for p in refused.errors)


def test_kept_units_name_the_fused_modules_vllm_loads_them_into():
    """vLLM loads q/k/v into one qkv_proj (gate/up into gate_up_proj) and, up to 0.26 at least, matches that
    module's name first, then its class name, where the 4-bit group's ``Linear`` matches, and its parts'
    names last (vLLM 0.33 tries the parts second). An H100 run of awq-vllm with sensitive_layers = 16 failed
    to start vLLM 0.26 (``assert param_data.shape == loaded_weight.shape`` in ``load_qkv_weight``): the kept
    units were given the 4-bit scheme. The 8-bit group names the fused module of each whole unit, and only
    of whole units: so named, the awq-vllm and gptq-w4a16-vllm checkpoints with 16 kept started on vLLM 0.26 and
    scored as they do in process (docs/results/accuracy.md, "Through vLLM")."""
    pytest.importorskip("compressed_tensors")
    kept = ["model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.k_proj", "model.layers.1.self_attn.v_proj",
            "model.layers.2.mlp.gate_proj", "model.layers.2.mlp.up_proj", "model.layers.3.mlp.down_proj",
            "model.layers.4.mlp.gate_proj"]
    groups = lc.weight_scheme(4, 32, False) | lc.kept_group(kept, 32)
    assert groups["group_0"].targets == ["Linear"]
    assert groups["group_1"].targets == [*kept, "model.layers.1.self_attn.qkv_proj", "model.layers.2.mlp.gate_up_proj"]
