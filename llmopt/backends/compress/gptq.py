"""Compress: GPTQ (llm-compressor), integer weights chosen layer by layer to minimise output error.

Schemes: W4A16 (4-bit weights in groups, 16-bit activations; vLLM's Marlin kernels),
W8A16 (8-bit weights per channel) and W8A8 (8-bit weights per channel and 8-bit
dynamic per-token activations). Each decoder linear layer's Hessian is gathered on
the recipe's calibration data, then its columns are quantized in order (optionally
by activation order) with the error pushed onto the columns not yet quantized.
Needs: llmcompressor, compressed-tensors, torch, transformers (``pip install 'llmopt[compress]'``).
Produces: ``model/``, a compressed-tensors checkpoint (pack-quantized for 4 bits)
with its tokenizer; config.json carries ``quantization_config`` (quant_method
compressed-tensors).
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

DEFAULT_GROUP = {"W4A16": 128, "W8A16": None, "W8A8": None}


class GPTQOptions(Options):
    scheme: Literal["W4A16", "W8A16", "W8A8"] = Field(
        "W4A16", description="W4A16: 4-bit weights, 16-bit activations; W8A16: 8-bit weights; W8A8: 8-bit weights "
        "and dynamic per-token 8-bit activations (INT8 compute).")
    group_size: int | None = Field(
        None, ge=8, description="Weights sharing one scale along the input dimension; must divide every targeted "
        "layer's input width. Default: 128 for W4A16, per output channel (no groups) for W8A16 / W8A8.")
    symmetric: bool = Field(True, description="Symmetric weights (no zero point); false stores a zero point per group.")
    actorder: Literal["weight", "group", "none"] = Field(
        "weight", description="Activation ordering: weight (quantize columns by Hessian diagonal, same format and "
        "speed), group (also reorders groups; slower kernels), none.")
    dampening_frac: float = Field(0.01, gt=0, lt=1, description="Fraction of the Hessian's mean diagonal added to it "
                                  "before inversion (numerical stability).")
    block_size: int = Field(128, ge=1, description="Columns updated together in one GPTQ block.")
    sensitive_layers: int = Field(0, ge=0, description=_sensitivity.HELP + " W4A16 only.")
    ignore: list[str] = Field(["lm_head"], description=lc.IGNORE_HELP)
    kv_cache: Literal["none", "fp8"] = lc.kv_cache_field()
    pipeline: lc.Pipeline = Field("auto", description=lc.PIPELINE_HELP)


def group_of(options: GPTQOptions) -> int | None:
    return options.group_size if options.group_size is not None else DEFAULT_GROUP[options.scheme]


@register("compress", "gptq")
class GPTQ(CompressBackend):
    Options = GPTQOptions
    cpu_float32 = True
    requires = lc.REQUIRES
    extra = lc.EXTRA
    calibrates = True
    builds_hessians = True
    quantizes = True

    def produces(self, options: GPTQOptions) -> formats.Format:
        """The scheme decides the format; activation order by group adds a g_idx permutation."""
        if options.scheme == "W8A8":
            return formats.CT_INT8
        if options.scheme == "W8A16":
            return formats.CT_W8A16
        return formats.CT_W4A16_GIDX if options.actorder == "group" else formats.CT_W4A16

    def layout(self, options: GPTQOptions, before, ctx: PlanContext):
        """W4A16 / W8A16: pack-quantized (a g_idx with actorder = "group"); W8A8: int8 per row."""
        dtype = lc.load_dtype(before, ctx)
        if options.scheme == "W8A8":
            weights = lc.int8_weights(dtype)
        else:
            weights = estimates.pack_quantized(4 if options.scheme == "W4A16" else 8, group_of(options),
                                               options.symmetric, dtype, options.actorder == "group")
        kept = _sensitivity.planned_parameters(ctx.model, options.sensitive_layers)
        return lc.layout(before, weights, options.ignore, ctx, options.kv_cache, kept)

    def check(self, options: GPTQOptions, ctx: PlanContext) -> list[Problem]:
        problems = _checks.quantizer(ctx, "gptq", calibrates=True)
        if options.scheme == "W8A8" and options.group_size is not None:
            problems.append(ctx.problem("W8A8 quantizes weights per channel; group_size does not apply", "group_size",
                                        hint="remove group_size, or use scheme = \"W8A16\" for grouped 8-bit weights"))
        else:
            problems += _checks.group_size(ctx, group_of(options), options.ignore)
        if options.sensitive_layers and options.scheme != "W4A16":
            problems.append(ctx.problem(f"sensitive_layers keeps layers at 8 bits in a 4-bit model; scheme "
                                        f"{options.scheme} is already 8-bit", "sensitive_layers",
                                        hint="remove sensitive_layers, or use scheme = \"W4A16\""))
        return problems

    def run(self, options: GPTQOptions, ctx: StageContext) -> dict:
        keep = lc.Keep(options.sensitive_layers, 4, group_of(options), options.symmetric, tuple(options.ignore))
        return lc.quantize(ctx, lambda kept=(): build(options, kept), calibrates=True, pipeline=options.pipeline,
                           keep=keep if options.scheme == "W4A16" else None, cpu_float32=self.cpu_float32)


def build(options: GPTQOptions, kept=()) -> list:
    """The modifiers; ``kept``: module names of the sensitive units, at 8 bits (W4A16)."""
    from llmcompressor.modifiers.quantization import GPTQModifier

    actorder = None if options.actorder == "none" else options.actorder
    common = {"ignore": options.ignore, "dampening_frac": options.dampening_frac, "block_size": options.block_size,
              "kv_cache_scheme": lc.kv_cache_scheme(options.kv_cache)}
    if options.scheme == "W8A8":
        return [GPTQModifier(targets="Linear", scheme="W8A8", actorder=actorder, **common)]
    bits = 4 if options.scheme == "W4A16" else 8
    groups = lc.weight_scheme(bits, group_of(options), options.symmetric, actorder)
    if kept:
        groups |= lc.kept_group(kept, group_of(options))
    return [GPTQModifier(config_groups=groups, actorder=actorder, **common)]
