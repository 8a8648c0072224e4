"""The memory model's KV bytes per token equal vLLM 0.33.0's own for every config in tests/data/configs
(issue 15), at a bf16 (``auto``) and an fp8 KV cache, on one GPU and per GPU at tensor parallel 8.

What ran: ``llmopt.engine_kv`` runs a script in the vLLM environment (``make vllm-env``) that builds each
model's vLLM class on the meta device from its config.json and asks every attention layer for its KV cache
spec (``get_kv_cache_spec``: FullAttentionSpec, SlidingWindowSpec, MLAAttentionSpec); bytes per token are the
sum of ``page_size_bytes / block_size`` over the layers. ``tests/data/engine_kv/vllm-0.33.0.json`` records
that output, with the fallbacks the script took where vLLM's code cannot run on a CPU (its ``fallbacks``:
the DeepSeek-R1 and gpt-oss models built without their weight quantization, which has no CPU kernel;
Gemma 3's language model built alone, since the multimodal class imports torchvision; fp8 KV specs rebuilt
from the ``auto`` ones where the CPU attention backend refuses fp8). The fast tests compare llmopt with the
record; the slow one runs vLLM again and checks the record is what vLLM says now.

SGLang 0.5.23 is not run: its per-token size is ``DefaultPoolConfigurator._compute_cell_size``
(sglang/srt/model_executor/pool_configurator.py), a method over a KVCacheConfigurator built from ServerArgs
and the model runner's layer range, reading the process-wide parallel state (``get_parallel()``); importing
it needs SGLang's runtime dependencies (orjson first, then more) and its pools (MHATokenToKVPool,
MLATokenToKVPool in mem_cache/memory_pool.py) allocate on the device. The hand computation from that file:
MHA ``get_num_kv_heads(tp)`` (total // tp, at least 1) x (head_dim + v_head_dim) x layers x dtype bytes;
MLA ``calculate_mla_kv_cache_dim`` (kv_lora_rank + qk_rope_head_dim, mem_cache/kv_cache_configurator.py)
x layers x dtype bytes, whole on every rank; the same figures as vLLM's for these configs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_serve_vllm_engine import vllm_python  # noqa: F401 (a fixture: the vLLM environment, built when missing)

from llmopt import engine_kv, memory
from llmopt.modelinfo import from_config

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
def test_vllm_computes_what_the_record_says(vllm_python, record):  # noqa: F811
    live = engine_kv.vllm_kv_bytes(CONFIGS, KV_DTYPES, TP_SIZES, python=vllm_python)
    assert live["version"] == record["version"]
    for name, kv in CASES:
        check(live["results"][f"{name}/{kv}"], name, kv)
    assert figures(live) == figures(record), "vLLM's figures changed: rewrite tests/data/engine_kv/vllm-0.33.0.json"


def figures(output: dict) -> dict:
    """Bytes per token and layer specs of each case, without the fallback texts (which depend on the host's CPU:
    with AVX-512 the fp8 specs come from an fp8 build)."""
    return {key: (r["bytes_per_token"], sorted((g["spec"], g["sliding_window"], g["layers"]) for g in r["layers"]))
            for key, r in output["results"].items()}
