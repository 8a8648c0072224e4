"""Compress: AWQ (llm-compressor), activation-aware 4-bit weights.

Per decoder layer, AWQ searches a scale for each input channel of the layers that
share an input (q/k/v, gate/up, ...) on calibration activations, folds it into the
preceding norm or linear, then quantizes the weights round-to-nearest in groups.
Asymmetric (zero point) by default, as AWQ checkpoints usually are.
Needs: llmcompressor, compressed-tensors, torch, transformers (``pip install 'llmopt[compress]'``).
On a machine without CUDA, llm-compressor's pinning of cached activations is
turned off for the duration of the call.
Produces: ``model/``, a compressed-tensors pack-quantized checkpoint with its
tokenizer (served by vLLM and SGLang as W4A16).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from llmopt.model import formats
from llmopt.model import estimates
from llmopt.backends.base import CompressBackend, Options, PlanContext, StageContext
from llmopt.backends.compress import _checks, _llmcompressor as lc, _sensitivity
from llmopt.errors import Problem
from llmopt.registry import register


class AWQOptions(Options):
    scheme: Literal["W4A16"] = Field("W4A16", description="4-bit weights in groups, 16-bit activations.")
    group_size: int = Field(128, ge=8, description="Weights sharing one scale along the input dimension; must "
                            "divide every targeted layer's input width.")
    symmetric: bool = Field(False, description="Symmetric weights; false (the AWQ default) stores a zero point per group.")
    duo_scaling: bool | Literal["both"] = Field(
        True, description="Search scales from activations and weights (true), activations only (false), or both "
        "halves of the grid (\"both\").")
    n_grid: int = Field(20, ge=2, le=100, description="Grid points searched per scale; fewer is faster and a little worse.")
    sensitive_layers: int = Field(0, ge=0, description=_sensitivity.HELP)
    ignore: list[str] = Field(["lm_head"], description=lc.IGNORE_HELP)
    kv_cache: Literal["none", "fp8"] = lc.kv_cache_field()
    pipeline: lc.Pipeline = Field("auto", description=lc.PIPELINE_HELP)


def keep(options: AWQOptions) -> lc.Keep:
    return lc.Keep(options.sensitive_layers, 4, options.group_size, options.symmetric, tuple(options.ignore))


@register("compress", "awq")
class AWQ(CompressBackend):
    Options = AWQOptions
    cpu_float32 = True
    requires = lc.REQUIRES
    extra = lc.EXTRA
    calibrates = True
    quantizes = True

    def produces(self, options: AWQOptions) -> formats.Format:
        return formats.CT_W4A16

    def layout(self, options: AWQOptions, before, ctx: PlanContext):
        """pack-quantized int4, a zero point per group unless symmetric."""
        weights = estimates.pack_quantized(4, options.group_size, options.symmetric, lc.load_dtype(before, ctx))
        kept = _sensitivity.planned_parameters(ctx.model, options.sensitive_layers)
        return lc.layout(before, weights, options.ignore, ctx, options.kv_cache, kept)

    def check(self, options: AWQOptions, ctx: PlanContext) -> list[Problem]:
        problems = _checks.quantizer(ctx, "awq", calibrates=True)
        return problems + _checks.group_size(ctx, options.group_size, options.ignore)

    def run(self, options: AWQOptions, ctx: StageContext) -> dict:
        mappings = lc.awq_mappings(lc.architectures(ctx))
        return lc.quantize(ctx, lambda kept=(): build(options, kept, mappings), calibrates=True, pipeline=options.pipeline,
                           wrap=lc.no_pinned_memory, keep=keep(options), cpu_float32=self.cpu_float32)


def build(options: AWQOptions, kept=(), mappings: list | None = None) -> list:
    """The modifiers; ``kept``: module names of the sensitive units, at 8 bits; ``mappings``: AWQ's smoothing
    mappings where llm-compressor has none for the architecture (``lc.awq_mappings``)."""
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from llmcompressor.modifiers.transform import AWQModifier

    groups = lc.weight_scheme(4, options.group_size, options.symmetric)
    if kept:
        groups |= lc.kept_group(kept, options.group_size)
    return [AWQModifier(duo_scaling=options.duo_scaling, n_grid=options.n_grid, mappings=mappings),
            QuantizationModifier(config_groups=groups, ignore=options.ignore,
                                 kv_cache_scheme=lc.kv_cache_scheme(options.kv_cache))]
