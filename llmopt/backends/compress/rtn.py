"""Compress: round-to-nearest integer weights (llm-compressor QuantizationModifier), no calibration data.

Each weight is scaled per group (or per output channel) by its min/max and rounded;
nothing is learned from data, so it is fast and the baseline that GPTQ and AWQ are
measured against. Any width from 2 to 8 bits (2- and 3-bit models are mostly useful
for tests: they damage the model on purpose).
Needs: llmcompressor, compressed-tensors, torch, transformers (``pip install 'llmopt[compress]'``).
Produces: ``model/``, a compressed-tensors checkpoint with its tokenizer
(quantization_config with quant_method compressed-tensors).
"""

from __future__ import annotations

from pydantic import Field

from llmopt.model import formats
from llmopt.model import estimates
from llmopt.backends.base import CompressBackend, Options, PlanContext, StageContext
from llmopt.backends.compress import _checks, _llmcompressor as lc
from llmopt.errors import Problem
from llmopt.registry import register


class RTNOptions(Options):
    bits: int = Field(4, ge=2, le=8, description="Weight bits (2 to 8).")
    group_size: int | None = Field(128, ge=8, description="Weights sharing one scale along the input dimension "
                                   "(must divide every targeted layer's input width); None: one scale per output channel.")
    symmetric: bool = Field(True, description="Symmetric weights (no zero point); false stores a zero point per group.")
    ignore: list[str] = Field(["lm_head"], description=lc.IGNORE_HELP)


@register("compress", "rtn")
class RTN(CompressBackend):
    Options = RTNOptions
    requires = lc.REQUIRES
    extra = lc.EXTRA
    quantizes = True

    def produces(self, options: RTNOptions) -> formats.Format:
        """4- and 8-bit weights are the widths engines document; other widths are their own format."""
        return {4: formats.CT_W4A16, 8: formats.CT_W8A16}.get(options.bits, formats.CT_WNA16)

    def layout(self, options: RTNOptions, before, ctx: PlanContext):
        """pack-quantized ``bits``-bit integers."""
        weights = estimates.pack_quantized(options.bits, options.group_size, options.symmetric, lc.load_dtype(before, ctx))
        return lc.layout(before, weights, options.ignore, ctx)

    def check(self, options: RTNOptions, ctx: PlanContext) -> list[Problem]:
        return _checks.quantizer(ctx, "rtn", calibrates=False) + _checks.group_size(ctx, options.group_size, options.ignore)

    def run(self, options: RTNOptions, ctx: StageContext) -> dict:
        return lc.quantize(ctx, lambda: build(options), calibrates=False)


def build(options: RTNOptions) -> list:
    from llmcompressor.modifiers.quantization import QuantizationModifier

    groups = lc.weight_scheme(options.bits, options.group_size, options.symmetric)
    return [QuantizationModifier(config_groups=groups, ignore=options.ignore)]
