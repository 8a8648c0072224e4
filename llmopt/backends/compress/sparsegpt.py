"""Compress: SparseGPT 2:4 semi-structured sparsity (llm-compressor), a prune step.

In every group of four consecutive input weights of each decoder linear layer, the two
whose removal costs least (by the layer's Hessian on the recipe's calibration data) are
set to zero and the rest updated to compensate. A quantization step may follow.
Caution, said at plan time as a warning where the recipe has a [serve]: vLLM removed its 2:4 sparse kernels and
compressed-tensors saves such a model dense (the zeros are stored), so on today's
engines this gives neither speed nor a smaller checkpoint; TensorRT-LLM runs 2:4 only
on its legacy engine path.
Needs: llmcompressor, compressed-tensors, torch, transformers (``pip install 'llmopt[compress]'``).
Produces: ``model/``, a dense safetensors checkpoint with half of the linear weights
zero, and its tokenizer.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from llmopt.model import formats
from llmopt.backends.base import CompressBackend, Options, PlanContext, StageContext
from llmopt.backends.compress import _checks, _llmcompressor as lc
from llmopt.errors import Problem
from llmopt.registry import register


class SparseGPTOptions(Options):
    mask_structure: Literal["2:4"] = Field("2:4", description="Zeros per group: 2 of every 4 consecutive weights.")
    dampening_frac: float = Field(0.01, gt=0, lt=1, description="Fraction of the Hessian's mean diagonal added before "
                                  "inversion.")
    ignore: list[str] = Field(["re:.*lm_head"], description="Layers left dense: `re:` patterns or module names "
                              "(SparseGPT sees the output head as `lm_head.`, so use a pattern for it).")
    pipeline: lc.Pipeline = Field("auto", description=lc.PIPELINE_HELP)


@register("compress", "sparsegpt")
class SparseGPT(CompressBackend):
    Options = SparseGPTOptions
    requires = lc.REQUIRES
    extra = lc.EXTRA
    calibrates = True
    cpu_float32 = True  # on a CPU: computes in float32, saves the recipe's dtype
    builds_hessians = True
    prunes = True

    def produces(self, options: SparseGPTOptions) -> formats.Format:
        return formats.SPARSE_2_4

    def check(self, options: SparseGPTOptions, ctx: PlanContext) -> list[Problem]:
        problems = _checks.quantizer(ctx, "sparsegpt", calibrates=True)
        if ctx.recipe.recipe.serve is None:
            return problems  # a study of what 2:4 costs in accuracy, which the hint below recommends
        problems.append(ctx.problem(
            "2:4 sparsity brings no speed or size gain on current engines: vLLM removed its 2:4 kernels and "
            "compressed-tensors saves the model dense", "method", severity="warning",
            hint="use it for research on sparse kernels; for serving, prefer prune_depth / prune_width or quantization"))
        return problems

    def run(self, options: SparseGPTOptions, ctx: StageContext) -> dict:
        return lc.quantize(ctx, lambda: build(options), calibrates=True, pipeline=options.pipeline,
                           cpu_float32=self.cpu_float32)


def build(options: SparseGPTOptions) -> list:
    from llmcompressor.modifiers.pruning.sparsegpt import SparseGPTModifier

    return [SparseGPTModifier(sparsity=0.5, mask_structure=options.mask_structure, ignore=options.ignore,
                              dampening_frac=options.dampening_frac)]
