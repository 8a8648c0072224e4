"""Compress: FP8 post-training quantization with NVIDIA ModelOpt (per-tensor FP8 weights and activations).

Weights and each linear layer's input get one FP8 (E4M3) scale per tensor, the
activation scales from the maximum seen on the recipe's calibration data
(ModelOpt's "max" calibration). Optionally an FP8 KV cache. The export is
ModelOpt's unified Hugging Face checkpoint, which TensorRT-LLM (PyTorch backend),
vLLM and SGLang load; FP8 compute needs compute capability 8.9 or newer.
Needs: nvidia-modelopt, torch, transformers (``pip install 'llmopt[modelopt]'``).
Produces: ``model/`` with safetensors (FP8 weights, weight_scale, input_scale),
hf_quant_config.json (quant_algo FP8), config.json's quantization_config
(quant_method modelopt) and the tokenizer; format ``modelopt``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from llmopt.model import formats
from llmopt.backends.base import CompressBackend, Options, PlanContext, StageContext
from llmopt.backends.compress import _checks, _modelopt
from llmopt.errors import Problem
from llmopt.registry import register


class ModelOptFP8Options(Options):
    kv_cache: Literal["none", "fp8"] = Field("none", description=_modelopt.KV_HELP)


@register("compress", "modelopt_fp8")
class ModelOptFP8(CompressBackend):
    Options = ModelOptFP8Options
    requires = _modelopt.REQUIRES
    extra = _modelopt.EXTRA
    calibrates = True
    cpu_float32 = True  # on a CPU: computes in float32, saves the recipe's dtype
    expert_tokens = "routed"  # ModelOpt calibrates each expert on the tokens routed to it
    quantizes = True

    def produces(self, options: ModelOptFP8Options) -> formats.Format:
        return formats.MODELOPT_FP8

    def layout(self, options: ModelOptFP8Options, before, ctx: PlanContext):
        """FP8 codes with an FP32 weight scale and input scale per tensor."""
        weights = _modelopt.stored(8, None, 0, 8, 0, 3, "fp8, fp32 weight and input scale per tensor")
        return _modelopt.layout(before, weights, ctx, options.kv_cache)

    def check(self, options: ModelOptFP8Options, ctx: PlanContext) -> list[Problem]:
        return _checks.quantizer(ctx, "modelopt_fp8", calibrates=True) + _checks.gpu_compute(ctx, (8, 9), "FP8")

    def run(self, options: ModelOptFP8Options, ctx: StageContext) -> dict:
        return _modelopt.quantize(ctx, "FP8_DEFAULT_CFG", kv_cache=options.kv_cache)
