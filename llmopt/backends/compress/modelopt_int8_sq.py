"""Compress: INT8 SmoothQuant with NVIDIA ModelOpt (8-bit weights per channel, 8-bit activations per tensor).

ModelOpt's "smoothquant" calibration migrates activation outliers into the weights
with a per-channel scale on the recipe's calibration data, then quantizes weights
per output channel and each linear layer's input per tensor to INT8. Exported as
the unified Hugging Face checkpoint (TensorRT-LLM's legacy engine path reads
INT8 SmoothQuant; check your engine's support).
Needs: nvidia-modelopt, torch, transformers (``pip install 'llmopt[modelopt]'``).
Produces: ``model/`` with int8 weights, per-channel weight scales, input scales and
smoothing pre-quantization scales, hf_quant_config.json and the tokenizer;
format ``modelopt``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from llmopt.model import formats
from llmopt.backends.base import CompressBackend, Options, PlanContext, StageContext
from llmopt.backends.compress import _checks, _modelopt
from llmopt.errors import Problem
from llmopt.registry import register


class ModelOptInt8SQOptions(Options):
    alpha: float = Field(1.0, gt=0, le=1, description="SmoothQuant migration strength: how much of the activation "
                         "range moves into the weights.")
    kv_cache: Literal["none", "fp8"] = Field("none", description=_modelopt.KV_HELP)


@register("compress", "modelopt_int8_sq")
class ModelOptInt8SQ(CompressBackend):
    Options = ModelOptInt8SQOptions
    requires = _modelopt.REQUIRES
    extra = _modelopt.EXTRA
    calibrates = True
    cpu_float32 = True  # on a CPU: computes in float32, saves the recipe's dtype
    expert_tokens = "routed"  # ModelOpt calibrates each expert on the tokens routed to it
    quantizes = True

    def produces(self, options: ModelOptInt8SQOptions) -> formats.Format:
        return formats.MODELOPT_INT8_SQ

    def layout(self, options: ModelOptInt8SQOptions, before, ctx: PlanContext):
        """int8 codes, a scale per output row, an input scale, a smoothing scale per input column."""
        weights = _modelopt.stored(8, None, 4, 4, 2, 4, "int8, fp32 scale per row, smoothing scales")
        return _modelopt.layout(before, weights, ctx, options.kv_cache)

    def check(self, options: ModelOptInt8SQOptions, ctx: PlanContext) -> list[Problem]:
        return _checks.quantizer(ctx, "modelopt_int8_sq", calibrates=True) + _checks.gpu_compute(ctx, (7, 5), "INT8")

    def run(self, options: ModelOptInt8SQOptions, ctx: StageContext) -> dict:
        def adjust(config: dict) -> None:
            config["algorithm"] = {"method": "smoothquant", "alpha": options.alpha}

        return _modelopt.quantize(ctx, "INT8_SMOOTHQUANT_CFG", adjust, options.kv_cache)
