"""The memory model's KV bytes per token equal vLLM 0.33.0's own for every config in tests/data/configs
(issue 15), at a bf16 (``auto``) and an fp8 KV cache, on one GPU and per GPU at tensor parallel 8.

What ran: ``llmopt.deploy.engine_kv`` runs a script in the vLLM environment (``make vllm-env``) that builds each
model's vLLM class on the meta device from its config.json and asks every attention layer for its KV cache
spec (``get_kv_cache_spec``: FullAttentionSpec, SlidingWindowSpec, MLAAttentionSpec); bytes per token are the
sum of ``page_size_bytes / block_size`` over the layers. ``tests/data/engine_kv/vllm-0.33.0.json`` records
that output, with the fallbacks the script took where vLLM's code cannot run on a CPU (its ``fallbacks``:
the DeepSeek-R1 and gpt-oss models built without their weight quantization, which has no CPU kernel;
Gemma 3's language model built alone, since the multimodal class imports torchvision; fp8 KV specs rebuilt
from the ``auto`` ones where the CPU attention backend refuses fp8). The fast tests compare llmopt with the
record; the slow one runs vLLM again and checks the record is what vLLM says now.

SGLang 0.5.23: tests/data/engine_kv/sglang_kv.py ran SGLang's own pool configurator on the same configs
(``_cell_size`` of DefaultPoolConfigurator or HybridSWAPoolConfigurator, from ServerArgs, ModelConfig and
KVCacheConfigurator; what was substituted is in its docstring) and wrote ``sglang-0.5.23.json``; the tests
below compare the memory model's SGLang figures with it. The suite does not run SGLang (its environment is
about 50 packages).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from llmopt.deploy import engine_kv

from llmopt.model import families, memory
from llmopt.model.modelinfo import from_config

DATA = Path(__file__).parent / "data"
CONFIGS = {p.stem: json.loads(p.read_text()) for p in sorted((DATA / "configs").glob("*.json"))}
RECORD = DATA / "engine_kv" / "vllm-0.33.0.json"
KV_DTYPES = ("auto", "fp8")
TP_SIZES = (1, 8)
CASES = [(name, kv) for name in CONFIGS for kv in KV_DTYPES]


def ours(name: str, kv_cache_dtype: str, tp: int) -> int:
    """llmopt's KV bytes per token on one GPU of ``tp``, every layer charged in full (as a page is)."""
    info = from_config(CONFIGS[name])
    return memory.kv_bytes_per_token_per_gpu(info, memory.kv_dtype_bytes(kv_cache_dtype, info), tp)


def check(result: dict, name: str, kv_cache_dtype: str) -> None:
    assert "error" not in result, result.get("error")
    for tp in TP_SIZES:
        assert ours(name, kv_cache_dtype, tp) == result["bytes_per_token"][str(tp)], (name, kv_cache_dtype, tp)
    info = from_config(CONFIGS[name])
    sliding = [group for group in result["layers"] if group["spec"] == "SlidingWindowSpec"]
    assert sum(group["layers"] for group in result["layers"]) == info.num_layers
    assert sum(group["layers"] for group in sliding) == info.sliding_layers
    assert {group["sliding_window"] for group in sliding} <= {info.sliding_window}


@pytest.fixture(scope="module")
def record() -> dict:
    return json.loads(RECORD.read_text())


def test_the_record_covers_every_config(record):
    assert sorted(record["results"]) == sorted(f"{name}/{kv}" for name, kv in CASES)
    assert record["version"] == "0.33.0"


@pytest.mark.parametrize("name, kv_cache_dtype", CASES)
def test_bytes_per_token_equal_vllms_recorded_specs(record, name, kv_cache_dtype):
    check(record["results"][f"{name}/{kv_cache_dtype}"], name, kv_cache_dtype)


def test_a_wrong_figure_fails(record):
    """The comparison can fail: a record with one byte more per token does not pass."""
    result = json.loads(json.dumps(record["results"]["mixtral-8x7b/auto"]))
    result["bytes_per_token"]["1"] += 1
    with pytest.raises(AssertionError):
        check(result, "mixtral-8x7b", "auto")


@pytest.mark.slow
def test_vllm_computes_what_the_record_says(vllm_live, record):
    live = {"version": vllm_live["version"],
            "results": {k: v for k, v in vllm_live["results"].items() if k.split("/")[0] in CONFIGS}}
    assert live["version"] == record["version"]
    for name, kv in CASES:
        check(live["results"][f"{name}/{kv}"], name, kv)
    assert figures(live) == figures(record), "vLLM's figures changed: rewrite tests/data/engine_kv/vllm-0.33.0.json"


def figures(output: dict) -> dict:
    """Bytes per token and layer specs of each case, without the fallback texts (which depend on the host's CPU:
    with AVX-512 the fp8 specs come from an fp8 build)."""
    return {key: (r["bytes_per_token"], sorted((g["spec"], g["sliding_window"], g["layers"]) for g in r["layers"]))
            for key, r in output["results"].items()}


SGLANG_RECORD = DATA / "engine_kv" / "sglang-0.5.23.json"  # written by tests/data/engine_kv/sglang_kv.py
SGLANG_KV = {"auto": "auto", "fp8": "fp8_e4m3"}


@pytest.fixture(scope="module")
def sglang_record() -> dict:
    return json.loads(SGLANG_RECORD.read_text())


def sglang_check(result: dict, name: str, kv_cache_dtype: str, tp: int) -> None:
    """llmopt's bytes per token of SGLang's pool equal SGLang's ``_cell_size`` (rounded up: for a hybrid
    sliding-window model it is full layers + 0.8 x sliding layers, not a whole number)."""
    assert "error" not in result, result.get("error")
    info = from_config(CONFIGS[name])
    kv_bytes = memory.kv_dtype_bytes(kv_cache_dtype, info)
    assert memory.kv_bytes_per_token_per_gpu(info, kv_bytes, tp, engine="sglang") == math.ceil(result["cell_size"])
    assert result["dtype_bytes"] == kv_bytes


def test_the_sglang_record_covers_every_config(sglang_record):
    assert sglang_record["version"] == "0.5.23"
    assert sorted(sglang_record["results"]) == sorted(f"{name}/{SGLANG_KV[kv]}/tp{tp}" for name, kv in CASES
                                                      for tp in TP_SIZES)


@pytest.mark.parametrize("name, kv_cache_dtype", CASES)
def test_sglang_pool_bytes_per_token_equal_sglang_s_own_code(sglang_record, name, kv_cache_dtype):
    for tp in TP_SIZES:
        sglang_check(sglang_record["results"][f"{name}/{SGLANG_KV[kv_cache_dtype]}/tp{tp}"], name, kv_cache_dtype, tp)


def test_sglang_sizes_sliding_window_layers_its_own_way(sglang_record):
    """Every layer counted once, SGLang's figure is vLLM's; its pool is not: gpt-oss keeps its sliding layers in
    a second pool of 0.8 tokens per full-pool token; Gemma 3 (not one of SGLang's hybrid architectures) keeps
    every layer at every token, where vLLM keeps its sliding layers to the window."""
    results = sglang_record["results"]
    oss, gemma = results["gpt-oss-20b/auto/tp1"], results["gemma-3-27b-it/auto/tp1"]
    assert oss["configurator"] == "HybridSWAPoolConfigurator" and oss["swa"]["swa_full_tokens_ratio"] == 0.8
    assert oss["bytes_per_token_every_layer"] == 49_152 and math.ceil(oss["cell_size"]) == 44_237
    assert gemma["configurator"] == "DefaultPoolConfigurator" and gemma["cell_size"] == 507_904
    info = from_config(CONFIGS["gemma-3-27b-it"])
    assert memory.kv_bytes_per_token_per_gpu(info, 2, seq_len=32768) < 507_904 // 5  # vLLM's, at 32k tokens
    assert memory.kv_bytes_per_token_per_gpu(info, 2, seq_len=32768, engine="sglang") == 507_904


def test_a_wrong_sglang_figure_fails(sglang_record):
    result = json.loads(json.dumps(sglang_record["results"]["gpt-oss-20b/auto/tp8"]))
    result["cell_size"] += 1
    with pytest.raises(AssertionError):
        sglang_check(result, "gpt-oss-20b", "auto", 8)


@pytest.fixture(scope="module")
def vllm_live(vllm_python, family_model) -> dict:
    """One run of the vLLM script (its start costs most of the time) over tests/data/configs and a tiny model of each
    family in the family table (``FAMILY:<name>``), the latter with a context of 4096 tokens, the script's
    max_model_len (the context enters no KV spec)."""
    configs = dict(CONFIGS)
    for family in families.families():
        config = json.loads((family_model(family) / "config.json").read_text())
        configs[f"FAMILY:{family}"] = config | {"max_position_embeddings": 4096}
    return engine_kv.vllm_kv_bytes(configs, KV_DTYPES, TP_SIZES, python=vllm_python)


@pytest.mark.slow
@pytest.mark.parametrize("family", list(families.families()))
def test_vllm_builds_each_family_as_the_memory_model_sizes_it(vllm_live, family_model, family):
    """vLLM 0.33 resolves the family's architecture to a model class of its own, builds it (on the meta device),
    and sizes its KV cache, sliding-window layers included, as llmopt's memory model does for the launch config."""
    result = vllm_live["results"][f"FAMILY:{family}/auto"]
    info = from_config(json.loads((family_model(family) / "config.json").read_text()))
    assert "error" not in result, result.get("error")
    assert result["model_class"] and not result.get("fallbacks"), result
    kv_bytes = memory.kv_dtype_bytes("auto", info)
    assert result["bytes_per_token"]["1"] == memory.kv_bytes_per_token_per_gpu(info, kv_bytes, 1)
    sliding = sum(group["layers"] for group in result["layers"] if group["spec"] == "SlidingWindowSpec")
    assert sum(group["layers"] for group in result["layers"]) == info.num_layers and sliding == info.sliding_layers
