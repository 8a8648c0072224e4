"""Compress: NVFP4 weights only (llm-compressor NVFP4A16 scheme), no calibration data.

Weights in 4-bit floating point (E2M1) in groups of 16 with FP8 group scales and
an FP32 global scale per tensor; activations stay 16-bit. No calibration data.
Needs: llmcompressor, compressed-tensors, torch, transformers (``pip install 'llmopt[compress]'``).
Produces: ``model/``, a compressed-tensors nvfp4-pack-quantized checkpoint with its tokenizer.
"""

from __future__ import annotations

from pydantic import Field

from llmopt.model import formats
from llmopt.backends.base import CompressBackend, Options, PlanContext, StageContext
from llmopt.backends.compress import _checks, _llmcompressor as lc
from llmopt.backends.compress.nvfp4 import NVFP4_GROUP
from llmopt.errors import Problem
from llmopt.registry import register


class NVFP4A16Options(Options):
    ignore: list[str] = Field(["lm_head"], description=lc.IGNORE_HELP)


@register("compress", "nvfp4a16")
class NVFP4A16(CompressBackend):
    Options = NVFP4A16Options
    requires = lc.REQUIRES
    extra = lc.EXTRA
    quantizes = True

    def produces(self, options: NVFP4A16Options) -> formats.Format:
        return formats.CT_NVFP4A16

    def layout(self, options: NVFP4A16Options, before, ctx: PlanContext):
        """nvfp4-pack-quantized weights only."""
        return lc.layout(before, lc.nvfp4_weights(activations=False), options.ignore, ctx)

    def check(self, options: NVFP4A16Options, ctx: PlanContext) -> list[Problem]:
        problems = _checks.quantizer(ctx, "nvfp4a16", calibrates=False)
        return problems + _checks.group_size(ctx, NVFP4_GROUP, options.ignore, fixed=True)

    def run(self, options: NVFP4A16Options, ctx: StageContext) -> dict:
        return lc.quantize(ctx, lambda: build(options), calibrates=False)


def build(options: NVFP4A16Options) -> list:
    from llmcompressor.modifiers.quantization import QuantizationModifier

    return [QuantizationModifier(targets="Linear", scheme="NVFP4A16", ignore=options.ignore)]
