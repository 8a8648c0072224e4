"""The serving memory model: how a model fits on the target GPUs and what launch numbers follow.

Given the model's config facts, its weight bytes (the artifact's safetensors sizes when
they exist, else the plan's estimate), the target GPU and count, ``max_model_len`` and the
workload, ``plan_memory`` picks the smallest tensor-parallel size that the attention shape
allows and that holds the weights, the engine's overheads and the workload's KV cache with
headroom; then ``max_num_seqs``, ``max_num_batched_tokens`` and the memory fraction, and the
predicted KV capacity. What cannot fit raises ``UsageError`` with the reason and a fix.

Per GPU, with tensor parallel size ``tp`` and pipeline parallel size ``pp``::

    total x utilization  >=  weights / (tp x pp)
                            + NON_TORCH + [NCCL if tp x pp > 1] + WORKSPACE + CUDA_GRAPHS
                            + activations(max_num_batched_tokens) + logits(max_num_seqs)
                            + KV cache

    KV bytes per token (whole model) = 2 (K and V) x layers x kv_heads x head_dim x KV dtype bytes
    KV bytes per token on one GPU    = 2 x layers/pp x max(1, kv_heads/tp) x head_dim x KV bytes

The overheads are assumptions, stated as the constants below; engines profile the real
figures at start-up, so the predicted capacity is an estimate to plan with, not a promise.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from llmopt.catalog.gpus import GPU
from llmopt.errors import UsageError
from llmopt.modelinfo import DTYPE_BYTES, ModelInfo

GiB = 2**30
MiB = 2**20

# --- assumptions, per GPU -------------------------------------------------------------
GPU_MEMORY_UTILIZATION = 0.90  # share of the GPU the engine may use (vLLM's default; SGLang and
#                                TensorRT-LLM get the same budget expressed in their own terms)
NON_TORCH_BYTES = 512 * MiB  # CUDA context and library handles (cuBLAS, cuDNN) the allocator does not see
NCCL_BYTES = 256 * MiB  # NCCL channels and the custom all-reduce buffers, only when tp x pp > 1
WORKSPACE_BYTES = 512 * MiB  # attention-backend and GEMM workspaces, sampler scratch
CUDA_GRAPH_BYTES = 1 * GiB  # private pool of the captured decode graphs (vLLM logs 0.3-1.5 GiB for 1-70B
#                             models; TensorRT-LLM documents up to 200 MB per graph); 0 with eager mode
ACT_DTYPE_BYTES = 2  # activations in bf16/fp16
LOGITS_BYTES = 4  # logits are float32 for sampling
KV_HEADROOM = 1.10  # the workload's KV must fit with 10% to spare (block rounding, bursts) before
#                     a tensor-parallel size is accepted
BLOCK_SIZE = 16  # KV cache block (page) size in tokens; capacity is a whole number of blocks
MIN_PREFILL_CHUNK = 2048  # smallest prefill token budget per step (long prompts are chunked)
MAX_PREFILL_CHUNK = 8192  # largest: more lengthens decode steps that share a batch with a prefill
MAX_NUM_SEQS_CAP = 1024  # no engine schedules more sequences per step usefully

KV_DTYPE_BYTES = {"auto": None, "bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1,
                  "fp8_inc": 1, "bf16": 2, "nvfp4": 0.5625}  # nvfp4: 4 bits + one fp8 scale per 16 values


@dataclass
class MemoryPlan:
    """What the memory model chose and predicts, per serving replica (``data_parallel_size`` of them)."""

    gpu: str
    gpu_memory_bytes: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    data_parallel_size: int
    expert_parallel_size: int
    gpu_memory_utilization: float
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    weight_bytes: int
    weight_source: str  # "safetensors" | "estimate"
    weight_bytes_per_gpu: int
    kv_dtype_bytes: float
    kv_bytes_per_token: int  # whole model
    kv_bytes_per_token_per_gpu: int
    overhead_bytes_per_gpu: int
    kv_budget_bytes_per_gpu: int
    kv_tokens: int  # KV capacity of one replica, in tokens
    full_length_sequences: int  # sequences of max_model_len that fit at once (one replica)
    workload_sequences: int  # sequences of the workload's input + output length that fit at once
    workload_tokens: int  # KV the workload needs at its concurrency (one replica)
    tried: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def gpus(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.data_parallel_size

    def to_dict(self) -> dict:
        out = asdict(self)
        out["gpus"] = self.gpus
        out["assumptions"] = assumptions()
        return out


def assumptions() -> dict:
    return {
        "non_torch_bytes": NON_TORCH_BYTES, "nccl_bytes": NCCL_BYTES, "workspace_bytes": WORKSPACE_BYTES,
        "cuda_graph_bytes": CUDA_GRAPH_BYTES, "activation_dtype_bytes": ACT_DTYPE_BYTES,
        "kv_headroom": KV_HEADROOM, "block_size": BLOCK_SIZE,
        "activation_per_token": "2 x hidden + 3 x intermediate/tp values (residual, normed input, "
                                "gate/up and activated MLP outputs)",
    }


def safetensors_bytes(model_dir: str | Path | None) -> int | None:
    """Total size of the model folder's safetensors files, or None when there are none."""
    if model_dir is None or not Path(model_dir).is_dir():
        return None
    files = list(Path(model_dir).glob("*.safetensors"))
    return sum(f.stat().st_size for f in files) if files else None


def kv_dtype_bytes(kv_cache_dtype: str, info: ModelInfo, model_dtype: str | None = None) -> float:
    """Bytes per KV element for an engine's ``kv_cache_dtype`` ("auto": the checkpoint's KV
    scheme when it quantizes the cache, else the model dtype)."""
    fixed = KV_DTYPE_BYTES.get(kv_cache_dtype)
    if fixed is not None:
        return fixed
    scheme = (info.quantization or {}).get("kv_cache_scheme")
    if scheme and str(scheme.get("type", "float")) == "float" and int(scheme.get("num_bits", 16)) == 8:
        return 1
    return DTYPE_BYTES.get(model_dtype or info.dtype or "bfloat16", 2)


def valid_tp_sizes(info: ModelInfo, limit: int) -> list[int]:
    """Tensor-parallel sizes up to ``limit`` that split the attention heads evenly: heads divisible
    by tp, and kv heads divisible by tp (or tp a multiple of kv heads, which replicates them)."""
    out = []
    for tp in range(1, limit + 1):
        if info.num_heads % tp:
            continue
        if info.num_kv_heads % tp and tp % info.num_kv_heads:
            continue
        out.append(tp)
    return out


def kv_bytes_per_token_per_gpu(info: ModelInfo, kv_bytes: float, tp: int = 1, pp: int = 1) -> int:
    """KV cache bytes of one token on one GPU (with tp = pp = 1: of the whole model)."""
    kv_heads = max(1, info.num_kv_heads // tp) if info.num_kv_heads >= tp else 1
    return int(2 * math.ceil(info.num_layers / pp) * kv_heads * info.head_dim * kv_bytes)


def activation_bytes(info: ModelInfo, tp: int, batched_tokens: int, num_seqs: int) -> int:
    """Peak activations of one forward pass over ``batched_tokens`` plus the sampler's logits."""
    per_token = ACT_DTYPE_BYTES * (2 * info.hidden_size + 3 * math.ceil(info.intermediate_size / tp))
    return batched_tokens * per_token + num_seqs * info.vocab_size * LOGITS_BYTES


def overhead_bytes(info: ModelInfo, tp: int, pp: int, batched_tokens: int, num_seqs: int, eager: bool) -> int:
    fixed = NON_TORCH_BYTES + WORKSPACE_BYTES + (NCCL_BYTES if tp * pp > 1 else 0)
    return fixed + (0 if eager else CUDA_GRAPH_BYTES) + activation_bytes(info, tp, batched_tokens, num_seqs)


def prefill_chunk(input_len: int, max_num_seqs: int) -> int:
    """Token budget per step: the typical prompt (a power of two, 2048..8192), never below max_num_seqs."""
    target = 1 << max(0, math.ceil(math.log2(max(1, input_len))))
    return max(max_num_seqs, min(MAX_PREFILL_CHUNK, max(MIN_PREFILL_CHUNK, target)))


def plan_memory(info: ModelInfo, gpu: GPU, count: int, max_model_len: int, workload, *, weight_bytes: int,
                weight_source: str = "estimate", kv_bytes: float = 2, utilization: float | None = None,
                tensor_parallel_size: int | None = None, pipeline_parallel_size: int = 1,
                data_parallel_size: int | str = 1, max_num_seqs: int | None = None,
                max_num_batched_tokens: int | None = None, eager: bool = False, where: str = "") -> MemoryPlan:
    """Choose parallel sizes and scheduler limits for ``workload`` (input_len, output_len, concurrency)
    on ``count`` GPUs; raise UsageError when not even one ``max_model_len`` sequence fits."""
    util = utilization or GPU_MEMORY_UTILIZATION
    pp = pipeline_parallel_size
    dp = 1 if data_parallel_size == "auto" else int(data_parallel_size)
    if count < pp * dp:
        raise UsageError(f"pipeline x data parallel size {pp} x {dp} needs {pp * dp} GPUs; the target has {count}",
                         where=where, fix="raise [target] count or lower the parallel sizes")
    limit = count // (pp * dp)
    if tensor_parallel_size is not None:
        if tensor_parallel_size not in valid_tp_sizes(info, tensor_parallel_size):
            raise UsageError(f"tensor_parallel_size {tensor_parallel_size} does not split {info.num_heads} attention "
                             f"heads / {info.num_kv_heads} KV heads evenly", where=where,
                             fix=f"use one of {valid_tp_sizes(info, 64)[:8]} or leave it unset to let llmopt choose")
        if tensor_parallel_size > limit:
            raise UsageError(f"tensor_parallel_size {tensor_parallel_size} x pp {pp} x dp {dp} needs more than the "
                             f"{count} GPUs of [target]", where=where, fix="raise [target] count or lower the size")
        candidates = [tensor_parallel_size]
    else:
        candidates = valid_tp_sizes(info, limit)
    seq_len = min(max_model_len, workload.input_len + workload.output_len)
    seqs = max_num_seqs or min(MAX_NUM_SEQS_CAP, math.ceil(workload.concurrency / dp))
    batched = max_num_batched_tokens or prefill_chunk(workload.input_len, seqs)

    def evaluate(tp: int) -> dict:
        per_gpu_weights = math.ceil(weight_bytes / (tp * pp))
        over = overhead_bytes(info, tp, pp, batched, seqs, eager)
        budget = int(gpu.memory_bytes * util) - per_gpu_weights - over
        per_token = kv_bytes_per_token_per_gpu(info, kv_bytes, tp, pp)
        tokens = max(0, budget) // (per_token * BLOCK_SIZE) * BLOCK_SIZE
        fits = tokens >= max_model_len and tokens >= KV_HEADROOM * seqs * seq_len
        return {"tensor_parallel_size": tp, "weight_bytes_per_gpu": per_gpu_weights, "overhead_bytes_per_gpu": over,
                "kv_budget_bytes_per_gpu": max(0, budget), "kv_bytes_per_token_per_gpu": per_token,
                "kv_tokens": tokens, "fits_workload": fits}

    tried = [evaluate(tp) for tp in candidates]
    chosen = next((t for t in tried if t["fits_workload"]), None)
    warnings: list[str] = []
    if chosen is None:
        chosen = next((t for t in reversed(tried) if t["kv_tokens"] >= max_model_len), None)
        if chosen is None:
            raise UsageError(_no_fit_message(info, gpu, count, max_model_len, util, tried[-1]), where=where,
                             fix=_no_fit_fix(info, gpu, count, max_model_len, weight_bytes, kv_bytes, util, pp, batched,
                                             seqs, eager, tried[-1]))
        fitting = max(1, int(chosen["kv_tokens"] / (KV_HEADROOM * seq_len)))
        if max_num_seqs is None:
            seqs = min(seqs, fitting)
        warnings.append(f"the workload needs {math.ceil(KV_HEADROOM * workload.concurrency / dp * seq_len):,} KV tokens "
                        f"per replica; {count} x {gpu.name} hold {chosen['kv_tokens']:,}, so about {fitting} requests "
                        f"of {seq_len} tokens run at once and the rest queue")
    tp = chosen["tensor_parallel_size"]
    if data_parallel_size == "auto":
        dp = max(1, count // (tp * pp))
        if max_num_seqs is None:  # the concurrency is shared by the replicas
            seqs = min(seqs, math.ceil(workload.concurrency / dp))
    return _result(info, gpu, chosen, pp, dp, util, max_model_len, seqs, batched, weight_bytes, weight_source,
                   kv_bytes, seq_len, workload, tried, warnings)


def _result(info, gpu, chosen, pp, dp, util, max_model_len, seqs, batched, weight_bytes, weight_source, kv_bytes,
            seq_len, workload, tried, warnings) -> MemoryPlan:
    tp = chosen["tensor_parallel_size"]
    tokens = chosen["kv_tokens"]
    experts = info.num_experts
    ep = tp * dp if experts and tp * dp > 1 and experts % (tp * dp) == 0 else 1
    return MemoryPlan(
        gpu=gpu.name, gpu_memory_bytes=gpu.memory_bytes, tensor_parallel_size=tp, pipeline_parallel_size=pp,
        data_parallel_size=dp, expert_parallel_size=ep, gpu_memory_utilization=util, max_model_len=max_model_len,
        max_num_seqs=seqs, max_num_batched_tokens=batched, weight_bytes=weight_bytes, weight_source=weight_source,
        weight_bytes_per_gpu=chosen["weight_bytes_per_gpu"], kv_dtype_bytes=kv_bytes,
        kv_bytes_per_token=kv_bytes_per_token_per_gpu(info, kv_bytes, 1),
        kv_bytes_per_token_per_gpu=chosen["kv_bytes_per_token_per_gpu"],
        overhead_bytes_per_gpu=chosen["overhead_bytes_per_gpu"], kv_budget_bytes_per_gpu=chosen["kv_budget_bytes_per_gpu"],
        kv_tokens=tokens, full_length_sequences=tokens // max_model_len, workload_sequences=tokens // seq_len,
        workload_tokens=math.ceil(workload.concurrency / dp) * seq_len, tried=tried, warnings=warnings)


def _no_fit_message(info: ModelInfo, gpu: GPU, count: int, max_model_len: int, util: float, last: dict) -> str:
    return (f"the model does not fit on {count} x {gpu.name}: at tensor parallel size {last['tensor_parallel_size']} "
            f"the weights take {last['weight_bytes_per_gpu'] / GiB:.1f} GiB per GPU and the engine's overheads "
            f"{last['overhead_bytes_per_gpu'] / GiB:.1f} GiB of the {gpu.memory_bytes * util / GiB:.1f} GiB budget "
            f"({util:.0%} of {gpu.memory_gib} GiB), leaving KV cache for {last['kv_tokens']:,} tokens; one sequence "
            f"of max_model_len {max_model_len:,} needs {max_model_len:,}")


def _no_fit_fix(info, gpu, count, max_model_len, weight_bytes, kv_bytes, util, pp, batched, seqs, eager, last) -> str:
    hints = []
    for tp in valid_tp_sizes(info, 64):
        if tp * pp <= count:
            continue
        per_gpu = math.ceil(weight_bytes / (tp * pp))
        budget = int(gpu.memory_bytes * util) - per_gpu - overhead_bytes(info, tp, pp, batched, seqs, eager)
        if budget // kv_bytes_per_token_per_gpu(info, kv_bytes, tp, pp) >= max_model_len:
            hints.append(f"set [target] count = {tp * pp} (tensor parallel {tp})")
            break
    if last["kv_tokens"] >= BLOCK_SIZE:
        hints.append(f"lower serve.max_model_len to {last['kv_tokens']:,} or less")
    hints.append("quantize the weights (fp8 halves them, 4-bit quarters them) or use kv_cache_dtype = \"fp8\"")
    return "; or ".join(hints)
