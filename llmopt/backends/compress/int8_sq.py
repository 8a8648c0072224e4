"""Compress: INT8 W8A8 with SmoothQuant then GPTQ (llm-compressor).

SmoothQuant moves activation outliers into the weights (a per-channel scale folded
into the preceding norm, strength ``smoothing_strength``), then GPTQ quantizes the
weights to 8 bits per channel; activations are quantized to 8 bits per token at
run time. INT8 tensor cores exist from compute capability 7.5 (Turing) on.
Needs: llmcompressor, compressed-tensors, torch, transformers (``pip install 'llmopt[compress]'``).
Produces: ``model/``, a compressed-tensors int-quantized checkpoint with its tokenizer.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from llmopt.model import formats
from llmopt.backends.base import CompressBackend, Options, PlanContext, StageContext
from llmopt.backends.compress import _checks, _llmcompressor as lc
from llmopt.errors import Problem
from llmopt.registry import register


class Int8SQOptions(Options):
    smoothing_strength: float = Field(0.8, gt=0, lt=1, description="SmoothQuant alpha: how much of the activation "
                                      "range moves into the weights (0.5 to 0.9 usual).")
    dampening_frac: float = Field(0.01, gt=0, lt=1, description="GPTQ Hessian dampening (fraction of the mean diagonal).")
    ignore: list[str] = Field(["lm_head"], description=lc.IGNORE_HELP)
    kv_cache: Literal["none", "fp8"] = lc.kv_cache_field()
    pipeline: lc.Pipeline = Field("auto", description=lc.PIPELINE_HELP)


@register("compress", "int8_sq")
class Int8SmoothQuant(CompressBackend):
    Options = Int8SQOptions
    cpu_float32 = True
    requires = lc.REQUIRES
    extra = lc.EXTRA
    calibrates = True
    quantizes = True

    def produces(self, options: Int8SQOptions) -> formats.Format:
        return formats.CT_INT8

    def layout(self, options: Int8SQOptions, before, ctx: PlanContext):
        """int-quantized int8 per row (the smoothing folds into the norms, which keep their size)."""
        return lc.layout(before, lc.int8_weights(lc.load_dtype(before, ctx)), options.ignore, ctx, options.kv_cache)

    def check(self, options: Int8SQOptions, ctx: PlanContext) -> list[Problem]:
        return _checks.quantizer(ctx, "int8_sq", calibrates=True) + _checks.gpu_compute(ctx, (7, 5), "INT8")

    def run(self, options: Int8SQOptions, ctx: StageContext) -> dict:
        mappings = lc.smoothquant_mappings(lc.architectures(ctx))
        return lc.quantize(ctx, lambda: build(options, mappings), calibrates=True, pipeline=options.pipeline,
                           cpu_float32=self.cpu_float32)


def build(options: Int8SQOptions, mappings: list | None = None) -> list:
    """SmoothQuant then GPTQ; ``mappings``: where llm-compressor's own are wrong for the architecture
    (``lc.smoothquant_mappings``)."""
    from llmcompressor.modifiers.quantization import GPTQModifier
    from llmcompressor.modifiers.transform import SmoothQuantModifier

    return [SmoothQuantModifier(smoothing_strength=options.smoothing_strength, mappings=mappings),
            GPTQModifier(targets="Linear", scheme="W8A8", ignore=options.ignore, dampening_frac=options.dampening_frac,
                         kv_cache_scheme=lc.kv_cache_scheme(options.kv_cache))]
