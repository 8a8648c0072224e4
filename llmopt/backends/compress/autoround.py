"""Compress: AutoRound (llm-compressor's AutoRoundModifier over the auto-round package), integer weights
whose rounding and clipping are learned.

Decoder layer by decoder layer, AutoRound learns a rounding offset for every weight
and a clipping range for every group by signed gradient descent (``iters`` steps)
on the layer's output error over the calibration rows, then rounds. The checkpoint
is the same pack-quantized integers as RTN or GPTQ write, so every engine and the
ONNX export that reads those reads it. On a machine without CUDA the tuning loop
runs in eager mode (torch.compile off). Symmetric only: llm-compressor 0.14.0.1 carries
AutoRound's scales into the checkpoint but not its zero points (its AutoRoundModifier maps
``scale`` and leaves ``weight_zero_point`` at 0), so an asymmetric checkpoint dequantizes wrong
(measured on the demo model: +196% to +428% perplexity); the plan refuses ``symmetric = false``.
Needs: llmcompressor, compressed-tensors, auto-round, torch, transformers
(``pip install 'llmopt[compress]'``; llm-compressor brings auto-round).
Produces: ``model/``, a compressed-tensors pack-quantized checkpoint with its
tokenizer (quantization_config with quant_method compressed-tensors).
"""

from __future__ import annotations

from pydantic import Field

from llmopt.model import formats
from llmopt.model import estimates
from llmopt.backends.base import CompressBackend, Options, PlanContext, StageContext
from llmopt.backends.compress import _checks, _llmcompressor as lc
from llmopt.errors import Problem
from llmopt.registry import register


class AutoRoundOptions(Options):
    group_size: int = Field(128, ge=8, description="Weights sharing one scale along the input dimension; must "
                            "divide every targeted layer's input width.")
    symmetric: bool = Field(True, description="Symmetric weights (no zero point). false is refused: llm-compressor "
                            "0.14.0.1 drops AutoRound's zero points from the checkpoint.")
    iters: int = Field(200, ge=1, le=10_000, description="Tuning steps per decoder layer (auto-round's default 200); "
                       "fewer is faster and a little worse.")
    batch_size: int = Field(8, ge=1, description="Calibration rows per tuning step.")
    lr: float | None = Field(None, gt=0, description="Learning rate of the rounding offsets (None: auto-round's, 1/iters).")
    ignore: list[str] = Field(["lm_head"], description=lc.IGNORE_HELP)


@register("compress", "autoround")
class AutoRound(CompressBackend):
    Options = AutoRoundOptions
    requires = lc.REQUIRES + ("auto_round",)
    extra = lc.EXTRA
    calibrates = True
    cpu_float32 = True  # on a CPU: computes in float32, saves the recipe's dtype
    quantizes = True

    def produces(self, options: AutoRoundOptions) -> formats.Format:
        return formats.CT_W4A16

    def layout(self, options: AutoRoundOptions, before, ctx: PlanContext):
        """pack-quantized int4, a zero point per group unless symmetric."""
        weights = estimates.pack_quantized(4, options.group_size, options.symmetric, lc.load_dtype(before, ctx))
        return lc.layout(before, weights, options.ignore, ctx)

    def check(self, options: AutoRoundOptions, ctx: PlanContext) -> list[Problem]:
        problems = _checks.quantizer(ctx, "autoround", calibrates=True)
        if not options.symmetric:
            problems.append(ctx.problem(
                "asymmetric AutoRound writes a wrong checkpoint with llm-compressor 0.14.0.1: its AutoRoundModifier keeps "
                "AutoRound's scales but stores every zero point as 0 (measured on the demo model: perplexity +196% to "
                "+428%)", "symmetric", hint="set symmetric = true, or use awq or gptq with symmetric = false for zero points"))
        return problems + _checks.group_size(ctx, options.group_size, options.ignore)

    def run(self, options: AutoRoundOptions, ctx: StageContext) -> dict:
        # "auto" is llm-compressor's sequential pipeline, whose per-layer hook is where AutoRound tunes
        return lc.quantize(ctx, lambda: build(options, ctx.device), calibrates=True, cpu_float32=self.cpu_float32)


def build(options: AutoRoundOptions, device: str) -> list:
    from llmcompressor.modifiers.autoround import AutoRoundModifier

    return [AutoRoundModifier(config_groups=lc.weight_scheme(4, options.group_size, options.symmetric),
                              ignore=options.ignore, iters=options.iters, batch_size=options.batch_size,
                              lr=options.lr, enable_torch_compile=device.startswith("cuda"))]
