"""The serving memory model: how a model fits on the target GPUs and what launch numbers follow.

Given the model's config facts, its weight bytes (the artifact's safetensors sizes when
they exist, else the plan's estimate), the target GPU and count, ``max_model_len`` and the
workload, ``plan_memory`` picks the smallest tensor-parallel size that the attention shape
allows and that holds the weights, the engine's overheads and the workload's KV cache with
headroom; then the scheduler limits and the memory fraction, and the predicted KV capacity.
The limits are the pinned engine version's own defaults (``llmopt.catalog.engines``), lower only
where the KV cache holds fewer sequences or a TPOT target needs a shorter step, each such value
with its reason (``MemoryPlan.reasons``); the workload's concurrency sizes the KV cache, never the
limits. What cannot fit raises ``UsageError`` with the reason and a fix.

Per GPU, with tensor parallel size ``tp`` and pipeline parallel size ``pp``::

    total x utilization  >=  weights / (tp x pp)
                            + NON_TORCH + [NCCL if tp x pp > 1] + WORKSPACE + CUDA_GRAPHS
                            + activations(max_num_batched_tokens) + logits(max_num_seqs)
                            + KV cache

    KV bytes per token (whole model) = 2 (K and V) x layers x kv_heads x head_dim x KV dtype bytes
    KV bytes per token on one GPU    = 2 x layers/pp x max(1, kv_heads/tp) x head_dim x KV bytes
    MLA (DeepSeek-V2/V3, Kimi-K2)    = layers/pp x (kv_lora_rank + qk_rope_head_dim) x KV bytes, on every GPU
    sliding-window layers keep min(sequence length, window) tokens of a sequence, so with them the bytes
    per token are an average over the workload's sequence length (``kv_bytes_per_sequence``).

    Speculative decoding with a draft (``Draft``): its weights / tp join the weights, and its layers' KV per
    token joins the target's (vLLM and SGLang keep the draft's KV beside the target's, a token for a token).

The per-token figures equal vLLM 0.33.0's own (the sum of its layers' KV cache spec pages over their
block sizes, ``llmopt.deploy.engine_kv``) and, for SGLang, SGLang 0.5.23's pool cell size (``sglang_cell_bytes``:
no sliding-window discount outside its hybrid architectures, a 0.8 second pool for theirs) for every config
in tests/data/configs: ``tests/test_engine_kv.py``.

The overheads are assumptions, stated as the constants below; engines profile the real
figures at start-up, so the predicted capacity is an estimate to plan with, not a promise.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from llmopt.catalog.gpus import GPU
from llmopt.catalog import engines
from llmopt.errors import UsageError
from llmopt.model.modelinfo import DTYPE_BYTES, ModelInfo

GiB = 2**30
MiB = 2**20

# --- assumptions, per GPU -------------------------------------------------------------
GPU_MEMORY_UTILIZATION = 0.90  # share of the GPU TensorRT-LLM and SGLang may use, in their own terms
#                                (free_gpu_memory_fraction, mem_fraction_static); vLLM gets its own default
#                                (0.92, ``llmopt.catalog.engines``)
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

KV_DTYPE_BYTES = {"auto": None, "bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1,
                  "fp8_inc": 1, "bf16": 2, "nvfp4": 0.5625}  # nvfp4: 4 bits + one fp8 scale per 16 values


@dataclass(frozen=True)
class Draft:
    """What speculative decoding adds to a replica: the draft's weights (split over the tensor-parallel ranks,
    as the engines run it with the target's size) and the KV of the draft's layers (``info``) for every token."""

    method: str
    weight_bytes: int
    info: ModelInfo

    def kv_bytes_per_token_per_gpu(self, kv_bytes: float, tp: int) -> int:
        return int(self.info.num_layers * self.info.kv_values_per_layer(tp) * kv_bytes)


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
    reasons: dict[str, str] = field(default_factory=dict)  # why a limit is not the engine's own default
    engine_defaults: dict = field(default_factory=dict)  # the engine version's own choices on this GPU
    memory_fraction: float | None = None  # the engine's memory knob: gpu-memory-utilization (vLLM),
    #                                       free_gpu_memory_fraction (TensorRT-LLM), mem-fraction-static (SGLang)
    nodes: int = 1  # nodes one replica spans (pipeline stages are split across them)
    draft: dict | None = None  # speculative decoding's draft: method, weight and KV bytes per GPU (within the above)

    @property
    def gpus(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.data_parallel_size

    def to_dict(self) -> dict:
        out = asdict(self)
        if self.draft is None:  # without speculation the record reads as before
            del out["draft"]
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


def kv_bytes_per_sequence(info: ModelInfo, kv_bytes: float, seq_len: int, tp: int = 1, pp: int = 1) -> int:
    """KV cache bytes of one sequence of ``seq_len`` tokens on one GPU: full-attention layers keep every token,
    sliding-window layers the last ``sliding_window`` (what vLLM's SlidingWindowSpec and SGLang's SWA pool keep
    once a sequence is past the window; during a prefill chunk vLLM holds the window plus the chunk)."""
    per_layer = info.kv_values_per_layer(tp) * kv_bytes
    full, sliding = info.num_layers - info.sliding_layers, info.sliding_layers
    tokens = math.ceil(full / pp) * seq_len + math.ceil(sliding / pp) * min(seq_len, info.sliding_window or seq_len)
    return int(per_layer * tokens)


# SGLang 0.5.23 keeps sliding-window layers in a pool of their own only for these architectures
# (configs/model_config.py: is_hybrid_swa_model, SWA_SINK_ARCHS); other models with sliding-window layers
# (Gemma 2 and 3, Mistral) get one pool in which every layer keeps every token. The SWA pool holds
# swa_full_tokens_ratio (0.8 by default) tokens per token of the full pool.
SGLANG_HYBRID_SWA = frozenset({
    "GptOssForCausalLM", "GraniteSWAForCausalLM", "GraniteMoeSWAForCausalLM", "IQuestQ1ForCausalLM", "BeamForCausalLM",
    "Llama4ForConditionalGeneration", "DeepseekV4ForCausalLM", "MiMoV2ForCausalLM", "MiMoV2FlashForCausalLM",
    "Step3p5ForCausalLM", "Step3p7ForConditionalGeneration", "Gemma4ForCausalLM", "Gemma4ForConditionalGeneration",
    "LagunaForCausalLM",
    "MellumForCausalLM", "MuseGlimmerForCausalLM", "MuseGlimmerForConditionalGeneration",
    "InklingForConditionalGeneration"})
SGLANG_SWA_FULL_TOKENS_RATIO = 0.8


def sglang_cell_bytes(info: ModelInfo, kv_bytes: float, tp: int = 1, pp: int = 1) -> int:
    """SGLang 0.5.23's KV bytes per token of its pool on one GPU (its ``_cell_size``, rounded up): every layer in
    full (``DefaultPoolConfigurator._compute_cell_size``), or for its hybrid sliding-window architectures the
    full-attention layers plus ``SGLANG_SWA_FULL_TOKENS_RATIO`` of the sliding ones
    (``HybridSWAPoolConfigurator._recompute_cell_size``). Checked against SGLang's own code:
    tests/data/engine_kv/sglang-0.5.23.json."""
    per_layer = info.kv_values_per_layer(tp) * kv_bytes
    if info.sliding_layers and SGLANG_HYBRID_SWA.intersection(info.architectures):
        full, sliding = info.num_layers - info.sliding_layers, info.sliding_layers
        return math.ceil(per_layer * (math.ceil(full / pp) + SGLANG_SWA_FULL_TOKENS_RATIO * math.ceil(sliding / pp)))
    return int(math.ceil(info.num_layers / pp) * per_layer)


def kv_bytes_per_token_per_gpu(info: ModelInfo, kv_bytes: float, tp: int = 1, pp: int = 1,
                               seq_len: int | None = None, engine: str | None = None) -> int:
    """KV cache bytes of one token on one GPU (with tp = pp = 1: of the whole model); with ``seq_len``, the
    average over a sequence of that length (sliding-window layers keep at most their window), else every
    layer charged in full.

    MLA (``kv_lora_rank``) keeps kv_lora_rank + qk_rope_head_dim values per token and layer, one copy on every
    tensor-parallel rank: vLLM's MLAAttentionSpec (v1/kv_cache_interface.py: block_size x 1 KV head x
    head_size x dtype, head_size = kv_lora_rank + qk_rope_head_dim, no factor 2 for K and V) and SGLang's
    MLATokenToKVPool. Other attention keeps K and V of its share of the KV heads. SGLang (``engine``) sizes
    sliding-window layers its own way: ``sglang_cell_bytes``."""
    if engine == "sglang":
        return sglang_cell_bytes(info, kv_bytes, tp, pp)
    if seq_len and info.sliding_layers:
        return math.ceil(kv_bytes_per_sequence(info, kv_bytes, seq_len, tp, pp) / seq_len)
    return int(math.ceil(info.num_layers / pp) * info.kv_values_per_layer(tp) * kv_bytes)


def activation_bytes(info: ModelInfo, tp: int, batched_tokens: int, num_seqs: int) -> int:
    """Peak activations of one forward pass over ``batched_tokens`` plus the sampler's logits."""
    per_token = ACT_DTYPE_BYTES * (2 * info.hidden_size + 3 * math.ceil(info.intermediate_size / tp))
    return batched_tokens * per_token + num_seqs * info.vocab_size * LOGITS_BYTES


def overhead_bytes(info: ModelInfo, tp: int, pp: int, batched_tokens: int, num_seqs: int, eager: bool) -> int:
    fixed = NON_TORCH_BYTES + WORKSPACE_BYTES + (NCCL_BYTES if tp * pp > 1 else 0)
    return fixed + (0 if eager else CUDA_GRAPH_BYTES) + activation_bytes(info, tp, batched_tokens, num_seqs)


def plan_memory(info: ModelInfo, gpu: GPU, count: int, max_model_len: int, workload, *, weight_bytes: int,
                weight_source: str = "estimate", kv_bytes: float = 2, utilization: float | None = None,
                tensor_parallel_size: int | None = None, pipeline_parallel_size: int = 1,
                data_parallel_size: int | str = 1, max_num_seqs: int | None = None,
                max_num_batched_tokens: int | None = None, eager: bool = False, where: str = "",
                engine: str = "vllm", chunked: bool = True, tpot_p99_ms: float | None = None,
                nodes: int = 1, draft: Draft | None = None) -> MemoryPlan:
    """Choose parallel sizes for ``workload`` (input_len, output_len, concurrency) on ``count`` GPUs per node
    of ``nodes`` nodes (tensor parallel within a node, pipeline parallel across nodes: at least ``nodes``
    stages when a replica spans more than one) and the
    scheduler limits of ``engine`` (its own defaults unless the KV cache or ``tpot_p99_ms`` asks for less:
    ``limits``); raise UsageError when not even one ``max_model_len`` sequence fits."""
    own = engines.engine_defaults(engine, gpu, max_model_len=max_model_len)
    util = utilization or own.gpu_memory_utilization or GPU_MEMORY_UTILIZATION
    pp = nodes if nodes > 1 and pipeline_parallel_size == 1 else pipeline_parallel_size
    dp = 1 if data_parallel_size == "auto" else int(data_parallel_size)
    per_node, count = count, count * nodes
    if nodes > 1 and pp % nodes:
        raise UsageError(f"pipeline_parallel_size {pp} does not split over the {nodes} nodes of [target]",
                         where=where, fix=f"leave pipeline_parallel_size unset (it is then {nodes}) or use a "
                         f"multiple of {nodes}")
    if count < pp * dp:
        raise UsageError(f"pipeline x data parallel size {pp} x {dp} needs {pp * dp} GPUs; the target has {count}",
                         where=where, fix="raise [target] count or lower the parallel sizes")
    candidates = _tp_candidates(info, count, pp, dp, tensor_parallel_size, where, per_node, nodes)
    seq_len = min(max_model_len, workload.input_len + workload.output_len)
    concurrency = math.ceil(workload.concurrency / dp)  # what the workload's KV needs, not a scheduler limit
    seqs = max_num_seqs or own.max_num_seqs
    batched = max_num_batched_tokens or (own.max_num_batched_tokens if chunked
                                         else max(own.max_num_batched_tokens, max_model_len))

    own_budget = engine if utilization is None else None  # the engine's own memory knob sizes the KV cache

    def evaluate(tp: int) -> dict:
        per_gpu_weights = math.ceil(weight_bytes / (tp * pp)) + (math.ceil(draft.weight_bytes / tp) if draft else 0)
        over = overhead_bytes(info, tp, pp, batched, seqs, eager)
        budget = kv_budget(own_budget, gpu, util, per_gpu_weights, over, batched, tp, pp)
        per_token = kv_bytes_per_token_per_gpu(info, kv_bytes, tp, pp, seq_len, engine) + (
            draft.kv_bytes_per_token_per_gpu(kv_bytes, tp) if draft else 0)
        tokens = max(0, budget) // (per_token * BLOCK_SIZE) * BLOCK_SIZE
        full = _full_length_tokens(info, kv_bytes, tp, pp, budget, max_model_len, tokens, engine)
        fits = full >= max_model_len and tokens >= KV_HEADROOM * concurrency * seq_len
        return {"tensor_parallel_size": tp, "weight_bytes_per_gpu": per_gpu_weights, "overhead_bytes_per_gpu": over,
                "kv_budget_bytes_per_gpu": max(0, budget), "kv_bytes_per_token_per_gpu": per_token,
                "kv_tokens": tokens, "kv_tokens_at_max_model_len": full, "fits_workload": fits}

    tried = [evaluate(tp) for tp in candidates]
    chosen = next((t for t in tried if t["fits_workload"]), None)
    if chosen is None:
        chosen = next((t for t in reversed(tried) if t["kv_tokens_at_max_model_len"] >= max_model_len), None)
        if chosen is None:
            raise UsageError(_no_fit_message(info, gpu, count, max_model_len, util, tried[-1]), where=where,
                             fix=_no_fit_fix(info, gpu, count, max_model_len, weight_bytes, kv_bytes, util, pp, batched,
                                             seqs, eager, tried[-1], per_node, engine))
    tp = chosen["tensor_parallel_size"]
    if data_parallel_size == "auto":
        dp = max(1, count // (tp * pp))
    for _ in range(3):  # the limits follow the KV cache, whose size follows the limits' overheads
        before = seqs, batched
        seqs, batched, reasons = limits(info, gpu, own, engine, max_model_len, seq_len, chosen, pp, max_num_seqs,
                                        max_num_batched_tokens, chunked, tpot_p99_ms, util)
        chosen = evaluate(tp)
        if (seqs, batched) == before:
            break
    warnings: list[str] = []
    if not chosen["fits_workload"]:
        warnings.append(f"the workload needs {math.ceil(KV_HEADROOM * concurrency * seq_len):,} KV tokens "
                        f"per replica; {count} x {gpu.name} hold {chosen['kv_tokens']:,}, so about "
                        f"{max(1, chosen['kv_tokens'] // seq_len)} requests of {seq_len} tokens run at once and the "
                        "rest queue")
    if own_budget is not None:  # the share of the GPU the engine's own knob amounts to
        used = chosen["weight_bytes_per_gpu"] + chosen["overhead_bytes_per_gpu"] + chosen["kv_budget_bytes_per_gpu"]
        util = round(used / gpu.memory_bytes, 3)
    plan = _result(info, gpu, chosen, pp, dp, util, max_model_len, seqs, batched, weight_bytes, weight_source,
                   kv_bytes, seq_len, workload, tried, warnings, engine)
    own_fraction = engines.memory_fraction(engine, gpu, batched, chosen["tensor_parallel_size"], pp)
    plan.memory_fraction = own_fraction if own_budget is not None else _fraction(engine, plan)
    if plan.memory_fraction != own_fraction:
        reasons["memory_fraction"] = (f"from the recipe's gpu_memory_utilization {utilization} ("
                                      f"{engines.LABELS.get(engine, engine)} {own.version}'s default: {own_fraction})")
    plan.nodes = nodes
    if draft is not None:
        plan.draft = {"method": draft.method, "weight_bytes": draft.weight_bytes,
                      "weight_bytes_per_gpu": math.ceil(draft.weight_bytes / plan.tensor_parallel_size),
                      "kv_bytes_per_token_per_gpu": draft.kv_bytes_per_token_per_gpu(kv_bytes,
                                                                                     plan.tensor_parallel_size)}
    plan.reasons, plan.engine_defaults = reasons, _defaults_dict(own, engine, gpu, chosen, max_model_len)
    plan.engine_defaults["memory_fraction"] = own_fraction
    return plan


def _full_length_tokens(info: ModelInfo, kv_bytes: float, tp: int, pp: int, budget: int, max_model_len: int,
                        tokens: int, engine: str | None = None) -> int:
    """KV capacity in tokens when every sequence is ``max_model_len`` long (``tokens`` unless sliding-window
    layers make the charge per token depend on the length)."""
    if not info.sliding_layers:
        return tokens
    per_token = kv_bytes_per_token_per_gpu(info, kv_bytes, tp, pp, max_model_len, engine)
    return max(0, budget) // (per_token * BLOCK_SIZE) * BLOCK_SIZE


def kv_budget(engine: str | None, gpu: GPU, util: float, weights: int, over: int, batched: int, tp: int,
              pp: int) -> int:
    """KV cache bytes per GPU: what the engine's own memory knob leaves (``engine`` given: TensorRT-LLM's share
    of the memory after weights and activations, SGLang's share of the GPU for weights and KV), else ``util``
    of the GPU less the weights and overheads."""
    total = gpu.memory_bytes
    if engine == "trtllm":
        return int(engines.memory_fraction(engine, gpu, batched, tp, pp) * (total - weights - over))
    if engine == "sglang":
        return int(engines.memory_fraction(engine, gpu, batched, tp, pp) * total) - weights
    return int(total * util) - weights - over


def _fraction(engine: str, plan: MemoryPlan) -> float:
    """The engine's memory knob for a budget of ``gpu_memory_utilization`` of the GPU (rounded down)."""
    total = plan.gpu_memory_bytes
    if engine == "trtllm":  # the KV budget as a share of what is free after weights and overheads
        free = total - plan.weight_bytes_per_gpu - plan.overhead_bytes_per_gpu
        share = plan.kv_budget_bytes_per_gpu / free if free > 0 else 0.0
        return round(min(0.95, max(0.05, int(share * 100) / 100)), 2)
    if engine == "sglang":  # weights plus KV pool: the budget less the activation and graph overheads
        return round(max(0.1, int((plan.gpu_memory_utilization - plan.overhead_bytes_per_gpu / total) * 100) / 100), 2)
    return plan.gpu_memory_utilization


def _tp_candidates(info: ModelInfo, count: int, pp: int, dp: int, tensor_parallel_size: int | None,
                   where: str, per_node: int | None = None, nodes: int = 1) -> list[int]:
    """Tensor parallel sizes to try: within one node (tensor parallel all-reduces every layer, which the
    links between nodes are too slow for)."""
    per_node = per_node or count
    limit = min(count // (pp * dp), per_node)
    if tensor_parallel_size is not None and tensor_parallel_size > per_node:
        across = "; pipeline parallel splits the layers across the nodes" if nodes > 1 else \
            ", or set [target] nodes to spread a replica over more nodes (pipeline parallel across them)"
        raise UsageError(f"tensor_parallel_size {tensor_parallel_size} spans more than one node of {per_node} GPUs",
                         where=where, fix=f"set tensor_parallel_size to {per_node} or less{across}")
    if tensor_parallel_size is None:
        return valid_tp_sizes(info, limit)
    if tensor_parallel_size not in valid_tp_sizes(info, tensor_parallel_size):
        raise UsageError(f"tensor_parallel_size {tensor_parallel_size} does not split {info.num_heads} attention "
                         f"heads / {info.num_kv_heads} KV heads evenly", where=where,
                         fix=f"use one of {valid_tp_sizes(info, 64)[:8]} or leave it unset to let llmopt choose")
    if tensor_parallel_size > limit:
        raise UsageError(f"tensor_parallel_size {tensor_parallel_size} x pp {pp} x dp {dp} needs more than the "
                         f"{count} GPUs of [target]", where=where, fix="raise [target] count or lower the size")
    return [tensor_parallel_size]


def limits(info: ModelInfo, gpu: GPU, own, engine: str, max_model_len: int, seq_len: int, chosen: dict, pp: int,
           max_num_seqs: int | None, max_num_batched_tokens: int | None, chunked: bool, tpot_p99_ms: float | None,
           util: float) -> tuple[int, int, dict[str, str]]:
    """The scheduler limits and, for each that is not the engine's own default, why: sequences at the
    engine's default unless the KV cache holds fewer of the workload's length; the step's token budget at
    the default unless a TPOT target needs a shorter step (a step with a prefill chunk delays every decode
    in it) or chunked prefill is off (a whole prompt must fit one step)."""
    name = f"{engines.LABELS.get(own.engine, own.engine)} {own.version}"
    if engine == "sglang":  # its max_running_requests follows the KV pool it profiles
        own = engines.engine_defaults(engine, gpu, chosen["kv_tokens"], max_model_len)
    reasons: dict[str, str] = {}
    batched = max_num_batched_tokens or own.max_num_batched_tokens
    if max_num_batched_tokens:
        reasons["max_num_batched_tokens"] = f"set by the recipe ({name}'s default {own.where}: " \
                                            f"{own.max_num_batched_tokens:,})"
    elif not chunked and batched < max_model_len:
        batched = max_model_len
        reasons["max_num_batched_tokens"] = "chunked prefill is off: a whole prompt of max_model_len fits one step"
    elif tpot_p99_ms is not None and chunked:
        chunk, ms = engines.slo_chunk(info, gpu, chosen["tensor_parallel_size"], pp, chosen["weight_bytes_per_gpu"],
                                       batched, tpot_p99_ms)
        if chunk < batched:
            full = engines.step_ms(info, gpu, chosen["tensor_parallel_size"], pp, chosen["weight_bytes_per_gpu"],
                                    batched)
            reasons["max_num_batched_tokens"] = (
                f"serve.slo.tpot_p99_ms = {tpot_p99_ms:g}: a step with a prefill chunk of {batched:,} tokens "
                f"({name}'s default) takes about {full:.0f} ms and delays every decode in it; {chunk:,} tokens "
                f"take about {ms:.0f} ms")
            batched = chunk
    holds = max(1, chosen["kv_tokens"] // seq_len)
    seqs = max_num_seqs or min(own.max_num_seqs, holds)
    if max_num_seqs:
        reasons["max_num_seqs"] = f"set by the recipe ({name}'s default {own.where}: {own.max_num_seqs:,})"
    elif seqs < own.max_num_seqs:
        reasons["max_num_seqs"] = (f"the KV cache holds {chosen['kv_tokens']:,} tokens: {holds:,} sequences of the "
                                   f"workload's {seq_len:,}, fewer than {name}'s default {own.max_num_seqs:,}")
    if not max_num_seqs and seqs > batched:  # a step schedules at least one token per sequence
        seqs = batched
        reasons["max_num_seqs"] = f"at most one sequence per token of the step's budget ({batched:,})"
    return seqs, batched, reasons


def _defaults_dict(own, engine: str, gpu: GPU, chosen: dict, max_model_len: int) -> dict:
    if engine == "sglang":
        own = engines.engine_defaults(engine, gpu, chosen["kv_tokens"], max_model_len)
    return {"engine": own.engine, "version": own.version, "max_num_seqs": own.max_num_seqs,
            "max_num_batched_tokens": own.max_num_batched_tokens,
            "gpu_memory_utilization": own.gpu_memory_utilization, "where": own.where}


def _result(info, gpu, chosen, pp, dp, util, max_model_len, seqs, batched, weight_bytes, weight_source, kv_bytes,
            seq_len, workload, tried, warnings, engine=None) -> MemoryPlan:
    tp = chosen["tensor_parallel_size"]
    tokens = chosen["kv_tokens"]
    experts = info.num_experts
    ep = tp * dp if experts and tp * dp > 1 and experts % (tp * dp) == 0 else 1
    return MemoryPlan(
        gpu=gpu.name, gpu_memory_bytes=gpu.memory_bytes, tensor_parallel_size=tp, pipeline_parallel_size=pp,
        data_parallel_size=dp, expert_parallel_size=ep, gpu_memory_utilization=util, max_model_len=max_model_len,
        max_num_seqs=seqs, max_num_batched_tokens=batched, weight_bytes=weight_bytes, weight_source=weight_source,
        weight_bytes_per_gpu=chosen["weight_bytes_per_gpu"], kv_dtype_bytes=kv_bytes,
        kv_bytes_per_token=kv_bytes_per_token_per_gpu(info, kv_bytes, 1, 1, seq_len, engine),
        kv_bytes_per_token_per_gpu=chosen["kv_bytes_per_token_per_gpu"],
        overhead_bytes_per_gpu=chosen["overhead_bytes_per_gpu"], kv_budget_bytes_per_gpu=chosen["kv_budget_bytes_per_gpu"],
        kv_tokens=tokens, full_length_sequences=chosen["kv_tokens_at_max_model_len"] // max_model_len,
        workload_sequences=tokens // seq_len,
        workload_tokens=math.ceil(workload.concurrency / dp) * seq_len, tried=tried, warnings=warnings)


NODE_GPUS = 8  # GPUs of the common GPU server (HGX / DGX boards): the largest count a fix suggests


def _no_fit_message(info: ModelInfo, gpu: GPU, count: int, max_model_len: int, util: float, last: dict) -> str:
    return (f"the model does not fit on {count} x {gpu.name}: at tensor parallel size {last['tensor_parallel_size']} "
            f"the weights take {last['weight_bytes_per_gpu'] / GiB:.1f} GiB per GPU and the engine's overheads "
            f"{last['overhead_bytes_per_gpu'] / GiB:.1f} GiB of the {gpu.memory_bytes * util / GiB:.1f} GiB budget "
            f"({util:.0%} of {gpu.memory_gib} GiB), leaving KV cache for {last['kv_tokens']:,} tokens; one sequence "
            f"of max_model_len {max_model_len:,} needs {max_model_len:,}")


def _no_fit_fix(info, gpu, count, max_model_len, weight_bytes, kv_bytes, util, pp, batched, seqs, eager, last,
                per_node=None, engine=None) -> str:
    hints = []
    for tp in valid_tp_sizes(info, 64):
        if tp * pp <= count:
            continue
        per_gpu = math.ceil(weight_bytes / (tp * pp))
        budget = int(gpu.memory_bytes * util) - per_gpu - overhead_bytes(info, tp, pp, batched, seqs, eager)
        if budget // kv_bytes_per_token_per_gpu(info, kv_bytes, tp, pp, max_model_len, engine) >= max_model_len:
            node = max(per_node or count, NODE_GPUS)
            if tp * pp > node:  # more than one node: tensor parallel within a node, pipeline parallel across
                nodes = math.ceil(tp * pp / node)
                hints.append(f"set [target] count = {node} and nodes = {nodes} (tensor parallel {node} within a "
                             f"node x pipeline parallel {nodes} across nodes)")
            else:
                hints.append(f"set [target] count = {tp * pp} (tensor parallel {tp})")
            break
    if last["kv_tokens"] >= BLOCK_SIZE:
        hints.append(f"lower serve.max_model_len to {last['kv_tokens']:,} or less")
    hints.append("quantize the weights (fp8 halves them, 4-bit quarters them) or use kv_cache_dtype = \"fp8\"")
    return "; or ".join(hints)
