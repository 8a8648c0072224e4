"""Compress: FP8 static (llm-compressor FP8 scheme), per-tensor scales calibrated on data.

Weights become FP8 (E4M3) with one scale per tensor; each layer's input gets one
static FP8 scale from the calibration data (the format TensorRT-LLM and vLLM run
with FP8 GEMMs and no per-token scaling). Optionally an FP8 KV cache with static
K/V scales.
Needs: llmcompressor, compressed-tensors, torch, transformers (``pip install 'llmopt[compress]'``).
Produces: ``model/``, a compressed-tensors float-quantized checkpoint with its
tokenizer (input_scale per layer; k_scale / v_scale with kv_cache = "fp8").
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from llmopt.model import formats
from llmopt.backends.base import CompressBackend, Options, PlanContext, StageContext
from llmopt.backends.compress import _checks, _llmcompressor as lc
from llmopt.errors import Problem
from llmopt.registry import register


class FP8StaticOptions(Options):
    ignore: list[str] = Field(["lm_head"], description=lc.IGNORE_HELP)
    kv_cache: Literal["none", "fp8"] = lc.kv_cache_field()
    pipeline: lc.Pipeline = Field("auto", description=lc.PIPELINE_HELP)


@register("compress", "fp8_static")
class FP8Static(CompressBackend):
    Options = FP8StaticOptions
    requires = lc.REQUIRES
    extra = lc.EXTRA
    calibrates = True
    cpu_float32 = True  # on a CPU: computes in float32, saves the recipe's dtype
    quantizes = True

    def produces(self, options: FP8StaticOptions) -> formats.Format:
        return formats.CT_FP8

    def layout(self, options: FP8StaticOptions, before, ctx: PlanContext):
        """float-quantized FP8 with per-tensor weight and input scales (FP8)."""
        return lc.layout(before, lc.fp8_weights(lc.load_dtype(before, ctx), per_row=False), options.ignore, ctx,
                         options.kv_cache)

    def check(self, options: FP8StaticOptions, ctx: PlanContext) -> list[Problem]:
        return _checks.quantizer(ctx, "fp8_static", calibrates=True) + _checks.gpu_compute(ctx, (8, 9), "FP8")

    def run(self, options: FP8StaticOptions, ctx: StageContext) -> dict:
        return lc.quantize(ctx, lambda: build(options), calibrates=True, pipeline=options.pipeline,
                           cpu_float32=self.cpu_float32)


def build(options: FP8StaticOptions) -> list:
    from llmcompressor.modifiers.quantization import QuantizationModifier

    return [QuantizationModifier(targets="Linear", scheme="FP8", ignore=options.ignore,
                                 kv_cache_scheme=lc.kv_cache_scheme(options.kv_cache))]
