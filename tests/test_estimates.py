"""The size model (llmopt.model.estimates): hand-computed layouts, and one figure for the plan, the card and the deploy configs."""

from __future__ import annotations

import pytest

from llmopt import api

from llmopt.model import estimates
from llmopt.backends.export import onnx_size
from llmopt.backends.export.onnx import OnnxExportOptions as Options
from llmopt.deploy import inputs

from conftest import tiny_recipe, write_recipe

DEMO = "builtin:smollm2-135m"  # SmolLM2-135M Q4_1: hidden 576, MLP 1536, 30 layers, vocab 49152, tied, Q8_0 embedding


def plan(tmp_path, body: str):
    return api.plan(write_recipe(tmp_path, f'schema_version = 1\nname = "t"\n{body}'))


def test_packed_codes_round_up_to_whole_words():
    stored = estimates.pack_quantized(4, 64, symmetric=False, scale_dtype="bfloat16")
    # 100 columns: 13 int32 words of codes a row, 2 groups of bf16 scales, the 3 rows' zero points in one int32
    # word per group, the shape
    assert stored.nbytes(3, 100) == 3 * 13 * 4 + 3 * 2 * 2 + 2 * 4 + 16
    nbits = onnx_size.nbits(Options(is_symmetric=False), "int4", "float32")  # MatMulNBits: zero points along a row
    assert nbits.nbytes(3, 96) == 3 * 48 + 3 * 3 * 4 + 3 * 2
    assert estimates.float_stored("float32").nbytes(2, 5) == 40 and not estimates.float_stored("bfloat16").quantized


def test_carried_gguf_blocks_by_hand(tmp_path):
    """gguf-onnx-cpu: every linear Q4_1 in 32-column blocks (codes, float32 scale, 4-bit zero point, float32
    residual), the Q8_0 head as int8, the embedding float32 on its own, float32 norms and rotary caches."""
    est = plan(tmp_path, f'[model]\nsource = "{DEMO}"\ndtype = "float32"\n'
                         '[export]\nformat = "onnx"\nprecision = "int4"\ngguf_blocks = "keep"\n').estimates
    params = 30 * (2 * 576 * 576 + 2 * 192 * 576 + 3 * 1536 * 576)
    linears = params // 2 + params // 32 * 4 + params // 64 + params // 32 * 4
    head = 49152 * 576 + 49152 * 576 // 32 * 4
    expected = linears + 49152 * 576 * 4 + head + 61 * 576 * 4 + 2 * 8192 * 32 * 4
    assert est["weight_bytes_after"] == expected == 228_619_520
    assert est["model_size"]["stored"]["lm_head"] == "int8 MatMulNBits, float32 scale per 32 columns"
    assert est["model_size"]["stored"]["q_proj"].endswith("float32 Q4_1 residual per block")


def test_requantized_gguf_shares_one_int4_table(tmp_path):
    est = plan(tmp_path, f'[model]\nsource = "{DEMO}"\n[export]\nformat = "onnx"\ngguf_blocks = "requantize"\n').estimates
    assert est["model_size"]["stored"]["embedding"].startswith("int4 MatMulNBits")  # GatherBlockQuantized
    assert "embedding" in est["model_size"]["parts"] and "lm_head" not in est["model_size"]["parts"]


def test_mixed_layers_follow_the_builders_rule():
    # 30 layers: the first 4 (< 30/8), the last 3 (>= 7 x 30/8) and 6, 9, ..., 24 between
    assert onnx_size.mixed_share(30) == 14 / 30
    assert onnx_size.mixed_share(2) == 1 / 2


def test_source_folder_estimate_is_the_folder(tmp_path, tiny_model):
    est = plan(tmp_path, tiny_recipe(tiny_model).split("\n", 2)[2]).estimates
    written = sum(p.stat().st_size for p in tiny_model.iterdir() if p.is_file())
    weights = (tiny_model / "model.safetensors").stat().st_size
    assert est["model_bytes_before"] == est["artifact_bytes"]  # nothing compressed, nothing exported
    assert est["weight_bytes_before"] == pytest.approx(weights, abs=50)  # the header at 104 B a tensor
    assert est["model_bytes_before"] - est["weight_bytes_before"] == written - weights  # other files measured


def test_deploy_configs_use_the_plans_figures(tmp_path):
    body = (f'[model]\nsource = "{DEMO}"\ndtype = "bfloat16"\n[[compress]]\nmethod = "fp8"\n[target]\ngpu = "L4"\n'
            '[serve]\nbackend = "vllm"\nmax_model_len = 4096\nkv_cache_dtype = "fp8"\n')
    the_plan = plan(tmp_path, body)
    est = the_plan.estimates
    assert inputs.estimated_weight_bytes(the_plan.recipe, the_plan.model) == est["weight_bytes_after"]
    planned = inputs.estimated_memory(the_plan.recipe, the_plan.model, the_plan.gpu, est["weight_bytes_after"])
    assert est["kv_cache"]["kv_tokens"] == planned.kv_tokens and est["kv_cache"]["kv_dtype_bytes"] == 1  # fp8 KV
    stored = est["model_size"]["stored"]
    assert stored["q_proj"] == "fp8, bfloat16 scale per row" and stored["embedding"] == "bfloat16"


def test_what_does_not_fit_is_said_not_raised(tmp_path):
    body = (f'[model]\nsource = "{DEMO}"\n[target]\ngpu = "T4"\n[serve]\nbackend = "vllm"\nmax_model_len = 8192\n'
            'gpu_memory_utilization = 0.15\n')
    kv = plan(tmp_path, body).estimates["kv_cache"]
    assert kv["fits"] is False and "does not fit" in kv["reason"]


def test_a_depth_pruned_model_is_estimated_with_the_layers_it_keeps(tmp_path):
    """The artifact's estimate is the pruned model's: seen 34% high when the source's layer count was used."""
    from conftest import make_tiny_llama

    model = make_tiny_llama(tmp_path / "six", hidden=128, intermediate=256, layers=6)
    prune = '[[compress]]\nmethod = "prune_depth"\nlayers = 2\n'
    kept = api.plan(write_recipe(tmp_path, tiny_recipe(model, prune), "pruned.toml")).estimates
    whole = api.plan(write_recipe(tmp_path, tiny_recipe(model), "whole.toml")).estimates
    layer = (whole["artifact_bytes"] - kept["artifact_bytes"]) / 2
    assert kept["model_bytes_before"] == whole["artifact_bytes"]  # the source as it is
    per_layer = 2 * (128 * 128 * 2 + 128 * 64 * 2 + 3 * 128 * 256 + 2 * 128)  # bf16 q, o, k, v, MLP, two norms
    assert layer == pytest.approx(per_layer, abs=9 * 110)  # and a safetensors header entry for each of 9 tensors
