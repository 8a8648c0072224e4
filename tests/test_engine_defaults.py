"""Launch limits no worse than the engines' own defaults (issue 14, item 1): the pinned engine versions'
defaults per GPU, and the memory model's limits for Llama-3.1-8B FP8 on one H100 at 8k context and for the
demo model on an H200: never below the default unless the KV cache holds fewer sequences or a TPOT target
asks for shorter steps, each such value with its reason."""

from __future__ import annotations

import pytest

from llmopt.model import memory
from llmopt.catalog.gpus import get_gpu
from llmopt.catalog.engines import engine_defaults
from llmopt.model.estimates import float_weight_bytes
from llmopt.model.modelinfo import from_config
from llmopt.recipe.schema import Workload

from test_memory import DEMO, LLAMA_8B

H100, H200 = get_gpu("H100-SXM-80GB"), get_gpu("H200")
LLAMA_8B_FP8_BYTES = 9_081_200_640  # FP8 decoder linears, bf16 embeddings / head / norms (test_memory)
DEMO_BYTES = float_weight_bytes(from_config(DEMO), "bfloat16")  # SmolLM2-135M: 269,030,016
ENGINES = ("vllm", "trtllm", "sglang")


@pytest.mark.parametrize("gpu, seqs, batched", [("H100-SXM-80GB", 1024, 8192), ("H200", 1024, 8192),
                                                ("A100-80GB", 256, 2048), ("L40S", 256, 2048), ("L4", 256, 2048)])
def test_vllm_defaults_by_gpu(gpu, seqs, batched):
    own = engine_defaults("vllm", get_gpu(gpu))
    assert (own.max_num_seqs, own.max_num_batched_tokens, own.gpu_memory_utilization) == (seqs, batched, 0.92)


@pytest.mark.parametrize("gpu, chunk", [("L4", 2048), ("L40S", 4096), ("H100-SXM-80GB", 8192), ("H200", 8192),
                                        ("B200", 16384)])
def test_sglang_chunk_by_gpu_memory_and_running_requests_by_pool(gpu, chunk):
    assert engine_defaults("sglang", get_gpu(gpu)).max_num_batched_tokens == chunk
    assert engine_defaults("sglang", H100, kv_tokens=10_000, max_model_len=4096).max_num_seqs == 2048
    assert engine_defaults("sglang", H100, kv_tokens=3_000, max_model_len=4096).max_num_seqs == 1500  # half the pool
    assert engine_defaults("sglang", H100, kv_tokens=10**8, max_model_len=4096).max_num_seqs == 4096


def test_trtllm_defaults_do_not_depend_on_the_gpu():
    for gpu in (H100, H200, get_gpu("L4")):
        own = engine_defaults("trtllm", gpu)
        assert (own.max_num_seqs, own.max_num_batched_tokens) == (2048, 8192)


def plan(config, gpu, weights, engine, max_model_len=8192, concurrency=32, **kw):
    work = Workload(input_len=1024, output_len=256, concurrency=concurrency)
    return memory.plan_memory(from_config(config), gpu, 1, max_model_len, work, weight_bytes=weights, kv_bytes=2,
                              engine=engine, **kw)


@pytest.mark.parametrize("engine", ENGINES)
def test_llama_8b_fp8_on_one_h100_at_8k(engine):
    planned = plan(LLAMA_8B, H100, LLAMA_8B_FP8_BYTES, engine)
    own = planned.engine_defaults
    assert planned.max_num_batched_tokens == own["max_num_batched_tokens"] == 8192
    holds = planned.kv_tokens // 1280
    assert 300 < holds < 1024  # ~500k tokens of KV: fewer 1280-token sequences than any engine's default
    assert planned.max_num_seqs == holds
    assert f"{holds} sequences of the workload's 1,280, fewer than" in planned.reasons["max_num_seqs"]
    assert set(planned.reasons) == {"max_num_seqs"}
    if engine == "vllm":
        assert planned.gpu_memory_utilization == 0.92


@pytest.mark.parametrize("engine, seqs", [("vllm", 1024), ("trtllm", 2048), ("sglang", 4096)])
def test_demo_model_on_an_h200_gets_the_engine_defaults(engine, seqs):
    planned = plan(DEMO, H200, DEMO_BYTES, engine, max_model_len=4096)
    assert planned.full_length_sequences > 1024  # the KV cache holds more than any default
    assert (planned.max_num_seqs, planned.max_num_batched_tokens) == (seqs, 8192)
    assert planned.reasons == {}


@pytest.mark.parametrize("engine", ENGINES)
def test_the_workload_concurrency_sizes_the_kv_cache_not_the_limits(engine):
    few, many = (plan(DEMO, H200, DEMO_BYTES, engine, concurrency=c) for c in (1, 256))
    assert few.max_num_seqs == many.max_num_seqs == few.engine_defaults["max_num_seqs"]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_tight_tpot_target_lowers_the_step_budget_and_says_why(engine):
    tight = plan(LLAMA_8B, H100, LLAMA_8B_FP8_BYTES, engine, tpot_p99_ms=50)
    assert tight.max_num_batched_tokens < 8192
    reason = tight.reasons["max_num_batched_tokens"]
    assert reason.startswith("serve.slo.tpot_p99_ms = 50: a step with a prefill chunk of 8,192 tokens")
    assert f"{tight.max_num_batched_tokens:,} tokens take about" in reason
    loose = plan(LLAMA_8B, H100, LLAMA_8B_FP8_BYTES, engine, tpot_p99_ms=1000)
    assert loose.max_num_batched_tokens == 8192 and "max_num_batched_tokens" not in loose.reasons


def test_limits_set_by_the_recipe_win_and_say_so():
    planned = plan(DEMO, H200, DEMO_BYTES, "vllm", max_num_seqs=64, max_num_batched_tokens=2048)
    assert (planned.max_num_seqs, planned.max_num_batched_tokens) == (64, 2048)
    assert planned.reasons["max_num_seqs"] == "set by the recipe (vLLM 0.33.0's default on H200: 1,024)"


def test_without_chunked_prefill_a_whole_prompt_fits_one_step():
    planned = plan(DEMO, H200, DEMO_BYTES, "vllm", max_model_len=8192, chunked=False, tpot_p99_ms=1)
    assert planned.max_num_batched_tokens == 8192
    short = plan(DEMO, get_gpu("L40S"), DEMO_BYTES, "vllm", max_model_len=8192, chunked=False)
    assert short.max_num_batched_tokens == 8192 and "chunked prefill is off" in short.reasons["max_num_batched_tokens"]


@pytest.mark.parametrize("engine, fraction", [("vllm", 0.92), ("trtllm", 0.9), ("sglang", 0.906)])
def test_memory_knobs_are_the_engine_defaults_unless_the_recipe_sets_a_share(engine, fraction):
    own = plan(DEMO, H200, DEMO_BYTES, engine, max_model_len=4096)
    assert own.memory_fraction == own.engine_defaults["memory_fraction"] == fraction
    assert "memory_fraction" not in own.reasons
    share = plan(DEMO, H200, DEMO_BYTES, engine, max_model_len=4096, utilization=0.8)
    assert share.memory_fraction < fraction and share.kv_tokens < own.kv_tokens
    assert share.reasons["memory_fraction"].startswith("from the recipe's gpu_memory_utilization 0.8")
