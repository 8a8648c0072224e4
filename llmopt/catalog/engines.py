"""What each pinned serving engine does on its own: the scheduler limits and memory share it picks
when a launch config leaves them out, read from the source of the version llmopt pins.

The memory model (``llmopt.model.memory``) starts from these numbers: a launch config is never below
the engine's default unless the KV cache cannot hold that many sequences or the recipe's
``[serve].slo`` asks for a smaller step, and the config's comment then says which. ``ENGINE_DEFAULTS``
holds the constants, each with the place it comes from; ``engine_defaults`` applies the rules the
engines apply (by GPU memory, by KV pool size) for one target GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

GiB = 2**30

ENGINE_DEFAULTS: dict[str, dict] = {
    # vLLM 0.33.0, vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults for `vllm serve`
    # (UsageContext.OPENAI_API_SERVER): a GPU of at least 70 GiB that is not an A100 (PR #17885: larger
    # budgets slowed the A100) gets max_num_seqs 1024 and max_num_batched_tokens 8192, any other GPU 256 and
    # 2048. _set_default_max_num_seqs_and_batched_tokens_args then caps the tokens at max_num_seqs x
    # max_model_len (and raises them to max_model_len without chunked prefill) and the sequences at the tokens.
    # gpu_memory_utilization 0.92: CacheConfig's and the LLM class's default (vllm/entrypoints/llm.py).
    "vllm": {"version": "0.33.0", "large_gpu_gib": 70, "small_gpu_names": ("A100",),
             "max_num_seqs": {"large": 1024, "small": 256}, "max_num_batched_tokens": {"large": 8192, "small": 2048},
             "gpu_memory_utilization": 0.92,
             "keys": {"max_num_seqs": "max-num-seqs", "max_num_batched_tokens": "max-num-batched-tokens",
                      "gpu_memory_utilization": "gpu-memory-utilization"}},
    # TensorRT-LLM 1.2.1, tensorrt_llm/llmapi/llm_args.py: BaseLlmArgs.max_batch_size 2048 and max_num_tokens
    # 8192 on every GPU; KvCacheConfig.free_gpu_memory_fraction 0.9 (of the memory free after the weights and
    # the activation profile); CudaGraphConfig captures batches up to 128 when max_batch_size is unset.
    "trtllm": {"version": "1.2.1", "max_num_seqs": 2048, "max_num_batched_tokens": 8192,
               "free_gpu_memory_fraction": 0.9, "cuda_graph_max_batch_size": 128,
               "keys": {"max_num_seqs": "max_batch_size", "max_num_batched_tokens": "max_num_tokens"}},
    # SGLang 0.5.23: chunked_prefill_size by the GPU's memory (sglang/srt/server_args.py,
    # ServerArgs._handle_gpu_memory_settings: below 35 GiB 2048, below 60 GiB 4096, below 160 GiB 8192, else
    # 16384); max_running_requests from the KV pool the model runner profiles (model_runner, max_num_reqs:
    # pool tokens / context length x 512, clamped to 2048..4096, and at most half the pool's tokens).
    # mem_fraction_static (weights + KV pool as a share of the GPU), same function: the GPU's MiB less a reserve
    # of 512 MiB + 1.5 MiB per chunk token (at least 2048) + 2 MiB per CUDA-graph batch (cuda_graph_max_bs by
    # memory: below 20 GiB 8, below 35 GiB 24 (80 from tp 4), below 60 GiB 32 (160), below 160 GiB 256 (512),
    # else 512) + tp x pp / 8 GiB, at least 10 GiB on GPUs above 60 GiB; rounded to 3 decimals.
    "sglang": {"version": "0.5.23", "chunk_by_gib": ((35, 2048), (60, 4096), (160, 8192)), "chunk_above": 16384,
               "running_per_context": 512, "running_min": 2048, "running_max": 4096,
               "graph_bs_by_gib": ((20, 8, 8), (35, 24, 80), (60, 32, 160), (160, 256, 512)), "graph_bs_above": 512,
               "reserve_mib": 512, "reserve_per_chunk_token_mib": 1.5, "reserve_per_graph_bs_mib": 2,
               "reserve_min_mib_above_60gib": 10 * 1024,
               "keys": {"max_num_seqs": "max-running-requests", "max_num_batched_tokens": "chunked-prefill-size"}},
}

LABELS = {"vllm": "vLLM", "trtllm": "TensorRT-LLM", "sglang": "SGLang"}

# Peak dense BF16/FP16 tensor-core TFLOP/s (vendors' data sheets), to estimate how long a step with a prefill
# chunk takes when a TPOT target asks for a smaller chunk; FP8 models compute faster, so this errs low.
DENSE_TFLOPS = {"T4": 65, "A10G": 70, "A100-40GB": 312, "A100-80GB": 312, "L4": 121, "L40S": 362, "RTX-4090": 165,
                "H100-SXM-80GB": 989, "H100-PCIe-80GB": 756, "H200": 989, "B200": 2250, "RTX-5090": 209}
PREFILL_MFU = 0.5  # share of peak a prefill chunk reaches
MIN_SLO_CHUNK = 256  # the smallest step budget a latency target lowers to


@dataclass(frozen=True)
class Defaults:
    """One engine version's own choices on one GPU (``max_num_seqs`` needs the KV pool for SGLang)."""

    engine: str
    version: str
    max_num_seqs: int
    max_num_batched_tokens: int
    gpu_memory_utilization: float | None  # None: the engine budgets memory in other terms
    where: str  # what the defaults depend on, for comments: "on H200"
    keys: dict


def engine_defaults(engine: str, gpu, kv_tokens: int | None = None, max_model_len: int = 4096) -> Defaults:
    """The defaults of ``engine`` (vllm, trtllm, sglang; others: vLLM's) on ``gpu``."""
    engine = engine if engine in ENGINE_DEFAULTS else "vllm"
    table = ENGINE_DEFAULTS[engine]
    where = f"on {gpu.name}"
    if engine == "vllm":
        large = gpu.memory_gib >= table["large_gpu_gib"] and not any(n in gpu.name for n in table["small_gpu_names"])
        size = "large" if large else "small"
        seqs, batched = table["max_num_seqs"][size], table["max_num_batched_tokens"][size]
        return Defaults(engine, table["version"], seqs, batched, table["gpu_memory_utilization"], where, table["keys"])
    if engine == "trtllm":
        return Defaults(engine, table["version"], table["max_num_seqs"], table["max_num_batched_tokens"], None,
                        where, table["keys"])
    chunk = next((c for gib, c in table["chunk_by_gib"] if gpu.memory_gib < gib), table["chunk_above"])
    running = table["running_max"]
    if kv_tokens is not None:
        by_pool = int(kv_tokens / max_model_len * table["running_per_context"])
        running = min(max(by_pool, table["running_min"]), table["running_max"], max(1, kv_tokens // 2))
        where += f" with a KV pool of {kv_tokens:,} tokens"
    return Defaults(engine, table["version"], running, chunk, None, where, table["keys"])


def memory_fraction(engine: str, gpu, batched: int, tp: int, pp: int) -> float | None:
    """The engine's own memory knob on ``gpu``: vLLM's gpu_memory_utilization (of the GPU), TensorRT-LLM's
    free_gpu_memory_fraction (of what the weights and activations leave), SGLang's mem_fraction_static (weights
    and KV pool, of the GPU, for the step budget ``batched``)."""
    table = ENGINE_DEFAULTS.get(engine, ENGINE_DEFAULTS["vllm"])
    if engine == "trtllm":
        return table["free_gpu_memory_fraction"]
    if engine != "sglang":
        return table["gpu_memory_utilization"]
    mib = gpu.memory_gib * 1024
    graphs = next(((small if tp < 4 else large) for gib, small, large in table["graph_bs_by_gib"]
                   if gpu.memory_gib < gib), table["graph_bs_above"])
    reserve = (table["reserve_mib"] + max(batched, 2048) * table["reserve_per_chunk_token_mib"]
               + graphs * table["reserve_per_graph_bs_mib"] + tp * pp / 8 * 1024)
    if gpu.memory_gib > 60:
        reserve = max(reserve, table["reserve_min_mib_above_60gib"])
    return round((mib - reserve) / mib, 3)


def step_ms(info, gpu, tp: int, pp: int, weight_bytes_per_gpu: int, tokens: int) -> float:
    """Estimated time of one decode step that also runs a prefill chunk of ``tokens``: the weights read once
    at the GPU's bandwidth plus 2 FLOPs per linear parameter per token at ``PREFILL_MFU`` of peak."""
    read = weight_bytes_per_gpu / (gpu.bandwidth_gbs * 1e9)
    flops = 2 * info.active_linear_params / (tp * pp) * tokens  # MoE: the routed and shared experts only
    compute = flops / (DENSE_TFLOPS.get(gpu.name, 100) * 1e12 * PREFILL_MFU)
    return (read + compute) * 1000


def slo_chunk(info, gpu, tp: int, pp: int, weight_bytes_per_gpu: int, default: int, tpot_p99_ms: float
              ) -> tuple[int, float]:
    """The largest power-of-two step budget up to ``default`` whose step fits ``tpot_p99_ms``
    (``MIN_SLO_CHUNK`` when none does), and that step's estimated time."""
    chunk = default
    while chunk > MIN_SLO_CHUNK and step_ms(info, gpu, tp, pp, weight_bytes_per_gpu, chunk) > tpot_p99_ms:
        chunk = max(MIN_SLO_CHUNK, chunk // 2 if chunk & (chunk - 1) == 0 else 1 << (chunk.bit_length() - 1))
    return chunk, step_ms(info, gpu, tp, pp, weight_bytes_per_gpu, chunk)


# llmopt serve (llmopt/server): the requests that may wait while others generate when --max-queue is not
# given. GuideLLM's default sweep keeps up to 512 requests in flight at its busiest point (llmopt bench
# --sweep stops at 256); a waiting request holds only its prompt's token ids.
SWEEP_QUEUE = 512


def queue_for(concurrency: int | None) -> int:
    """llmopt serve's queue for a ``[serve].workload`` of ``concurrency`` requests in flight (None: no recipe):
    room for a load generator's sweep (``SWEEP_QUEUE``), or the concurrency when that is more. The one rule
    behind ``llmopt serve --max-queue``, the ort deploy's ``launch.sh`` and ``[tune]``'s queue candidates."""
    return max(SWEEP_QUEUE, concurrency or 0)
