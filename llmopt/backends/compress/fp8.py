"""Compress: FP8 dynamic (llm-compressor FP8_DYNAMIC), no calibration data.

Weights become FP8 (E4M3) with one scale per output channel; activations are
quantized to FP8 per token at run time, so nothing is calibrated. The simplest
8-bit method: small loss, half the weight memory, FP8 tensor cores on GPUs of
compute capability 8.9 and newer. For an FP8 KV cache (static scales need
calibration data) use ``fp8_static``.
Needs: llmcompressor, compressed-tensors, torch, transformers (``pip install 'llmopt[compress]'``).
Produces: ``model/``, a compressed-tensors float-quantized checkpoint with its tokenizer.
"""

from __future__ import annotations

from pydantic import Field

from llmopt.model import formats
from llmopt.backends.base import CompressBackend, Options, PlanContext, StageContext
from llmopt.backends.compress import _checks, _llmcompressor as lc
from llmopt.errors import Problem
from llmopt.registry import register


class FP8Options(Options):
    ignore: list[str] = Field(["lm_head"], description=lc.IGNORE_HELP)


@register("compress", "fp8")
class FP8Dynamic(CompressBackend):
    Options = FP8Options
    requires = lc.REQUIRES
    extra = lc.EXTRA
    quantizes = True

    def produces(self, options: FP8Options) -> formats.Format:
        return formats.CT_FP8

    def layout(self, options: FP8Options, before, ctx: PlanContext):
        """float-quantized FP8 with a scale per output row (FP8_DYNAMIC)."""
        return lc.layout(before, lc.fp8_weights(lc.load_dtype(before, ctx), per_row=True), options.ignore, ctx)

    def check(self, options: FP8Options, ctx: PlanContext) -> list[Problem]:
        return _checks.quantizer(ctx, "fp8", calibrates=False) + _checks.gpu_compute(ctx, (8, 9), "FP8")

    def run(self, options: FP8Options, ctx: StageContext) -> dict:
        return lc.quantize(ctx, lambda: build(options), calibrates=False)


def build(options: FP8Options) -> list:
    from llmcompressor.modifiers.quantization import QuantizationModifier

    return [QuantizationModifier(targets="Linear", scheme="FP8_DYNAMIC", ignore=options.ignore)]
