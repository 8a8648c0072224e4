"""Resource estimates made at plan time from config facts alone.

They are estimates, stated with their assumptions in the plan output:
weight bytes before and after compression, calibration memory, artifact size and,
when a target GPU is named, the KV-cache budget left after the weights.
"""

from __future__ import annotations

from llmopt.modelinfo import DTYPE_BYTES, ModelInfo

GiB = 2**30


def weight_bytes(info: ModelInfo, dtype: str, linear_bits: float | None = None) -> int:
    """Bytes of the weights; ``linear_bits`` replaces the decoder linears' precision."""
    base = DTYPE_BYTES.get(dtype, 2)
    other = (info.total_params - info.linear_params) * base
    linear = info.linear_params * (linear_bits / 8 if linear_bits else base)
    return int(other + linear)


def calibration_bytes(info: ModelInfo, dtype: str, samples: int, seq_len: int, layerwise: bool = True) -> int:
    """Peak memory of a calibrating compression pass.

    Assumes the model's weights in ``dtype``, one decoder layer's weights again in
    float32 (Hessians / scales / observers), and the cached activations of every
    calibration sample at one layer boundary in float32 (the sequential pipeline).
    """
    weights = weight_bytes(info, dtype)
    layer_fp32 = info.linear_params_per_layer * 4
    hessians = sum(w * w for w in info.linear_inputs.values()) * 4
    activations = samples * seq_len * info.hidden_size * 4 * (2 if layerwise else info.num_layers)
    return int(weights + layer_fp32 + hessians + activations)


def kv_budget(info: ModelInfo, gpu_bytes: int, count: int, weights: int, max_model_len: int,
              utilization: float = 0.9, kv_dtype_bytes: float = 2, overhead_bytes: int = 2 * GiB) -> dict:
    """Tokens and full-length sequences of KV cache that fit next to the weights."""
    usable = gpu_bytes * count * utilization
    free = usable - weights - overhead_bytes * count
    per_token = info.kv_bytes_per_token(kv_dtype_bytes)
    tokens = max(0, int(free // per_token)) if per_token else 0
    return {
        "gpu_memory_utilization": utilization,
        "kv_bytes_per_token": per_token,
        "kv_budget_bytes": max(0, int(free)),
        "kv_tokens": tokens,
        "full_length_sequences": tokens // max_model_len if max_model_len else 0,
        "fits": free > 0,
        "assumes": f"{utilization:.0%} of GPU memory, {overhead_bytes / GiB:.0f} GiB per GPU for activations, "
        "workspace and CUDA graphs",
    }
