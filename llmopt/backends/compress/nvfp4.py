"""Compress: NVFP4 weights and activations (llm-compressor NVFP4 scheme).

Weights and activations in 4-bit floating point (E2M1) in groups of 16 with FP8
group scales and one FP32 global scale per tensor; the activations' global scales
are calibrated on data. Computed natively only on Blackwell GPUs (compute
capability 10.0 and newer); elsewhere engines fall back to weight-only kernels.
Needs: llmcompressor, compressed-tensors, torch, transformers (``pip install 'llmopt[compress]'``).
Produces: ``model/``, a compressed-tensors nvfp4-pack-quantized checkpoint with its tokenizer.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from llmopt.model import formats
from llmopt.backends.base import CompressBackend, Options, PlanContext, StageContext
from llmopt.backends.compress import _checks, _llmcompressor as lc
from llmopt.errors import Problem
from llmopt.registry import register

NVFP4_GROUP = 16


class NVFP4Options(Options):
    ignore: list[str] = Field(["lm_head"], description=lc.IGNORE_HELP)
    kv_cache: Literal["none", "fp8"] = lc.kv_cache_field()
    pipeline: lc.Pipeline = Field("auto", description=lc.PIPELINE_HELP)


@register("compress", "nvfp4")
class NVFP4(CompressBackend):
    Options = NVFP4Options
    requires = lc.REQUIRES
    extra = lc.EXTRA
    calibrates = True
    cpu_float32 = True  # on a CPU: computes in float32, saves the recipe's dtype
    quantizes = True

    def produces(self, options: NVFP4Options) -> formats.Format:
        return formats.CT_NVFP4

    def layout(self, options: NVFP4Options, before, ctx: PlanContext):
        """nvfp4-pack-quantized, with the activations' global scales."""
        return lc.layout(before, lc.nvfp4_weights(activations=True), options.ignore, ctx, options.kv_cache)

    def check(self, options: NVFP4Options, ctx: PlanContext) -> list[Problem]:
        problems = _checks.quantizer(ctx, "nvfp4", calibrates=True) + _checks.gpu_compute(ctx, (10, 0), "NVFP4")
        return problems + _checks.group_size(ctx, NVFP4_GROUP, options.ignore, fixed=True)

    def run(self, options: NVFP4Options, ctx: StageContext) -> dict:
        return lc.quantize(ctx, lambda: build(options), calibrates=True, pipeline=options.pipeline,
                           cpu_float32=self.cpu_float32)


def build(options: NVFP4Options) -> list:
    from llmcompressor.modifiers.quantization import QuantizationModifier

    return [QuantizationModifier(targets="Linear", scheme="NVFP4", ignore=options.ignore,
                                 kv_cache_scheme=lc.kv_cache_scheme(options.kv_cache))]
