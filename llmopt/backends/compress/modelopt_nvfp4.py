"""Compress: NVFP4 with NVIDIA ModelOpt (4-bit float weights and activations in blocks of 16).

Weights and activations in E2M1 with an FP8 scale per 16 values and an FP32 global
scale per tensor, activation scales calibrated on the recipe's data. ModelOpt's
NVFP4 fake-quantization kernels run on CUDA only; its calibration ("max") and export
do not need them, so on a machine without an NVIDIA GPU the stage still runs, and the
eval stages score the export with llmopt's ModelOpt runtime, which emulates NVFP4
weights and activations in plain PyTorch (the planner says so with a warning).
Computed natively on Blackwell (compute capability 10.0 and newer).
Needs: nvidia-modelopt, torch, transformers (``pip install 'llmopt[modelopt]'``).
Produces: ``model/`` with packed E2M1 weights, FP8 block scales, global scales,
hf_quant_config.json (quant_algo NVFP4) and the tokenizer; format ``modelopt``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from llmopt.model import formats
from llmopt.backends.base import CompressBackend, Options, PlanContext, StageContext
from llmopt.backends.compress import _checks, _modelopt
from llmopt.backends.compress.nvfp4 import NVFP4_GROUP
from llmopt.errors import Problem
from llmopt.registry import register


class ModelOptNVFP4Options(Options):
    kv_cache: Literal["none", "fp8"] = Field("none", description=_modelopt.KV_HELP)


@register("compress", "modelopt_nvfp4")
class ModelOptNVFP4(CompressBackend):
    Options = ModelOptNVFP4Options
    requires = _modelopt.REQUIRES
    extra = _modelopt.EXTRA
    calibrates = True
    cpu_float32 = True  # on a CPU: computes in float32, saves the recipe's dtype
    expert_tokens = "routed"  # ModelOpt calibrates each expert on the tokens routed to it
    quantizes = True

    def produces(self, options: ModelOptNVFP4Options) -> formats.Format:
        return formats.MODELOPT_NVFP4

    def layout(self, options: ModelOptNVFP4Options, before, ctx: PlanContext):
        """E2M1 two to a byte, an FP8 scale per 16 columns, FP32 global weight and input scales."""
        weights = _modelopt.stored(4, NVFP4_GROUP, 1, 8, 0, 4, "fp4 (E2M1), fp8 scale per 16 columns, fp32 global scales")
        return _modelopt.layout(before, weights, ctx, options.kv_cache)

    def check(self, options: ModelOptNVFP4Options, ctx: PlanContext) -> list[Problem]:
        problems = _checks.quantizer(ctx, "modelopt_nvfp4", calibrates=True)
        problems += _checks.gpu_compute(ctx, (10, 0), "NVFP4")
        problems += _checks.group_size(ctx, NVFP4_GROUP, ["lm_head"], fixed=True)
        if not _modelopt.cuda_present():
            problems.append(ctx.problem(
                "no CUDA GPU on this machine: ModelOpt's NVFP4 fake-quantization kernels cannot run here, so the "
                "candidate is scored from the exported checkpoint by llmopt's NVFP4 emulation (plain PyTorch, "
                "slower), not by ModelOpt's own kernels", "method", severity="warning",
                hint="run the recipe on a machine with an NVIDIA GPU to calibrate and score with ModelOpt's kernels"))
        return problems

    def run(self, options: ModelOptNVFP4Options, ctx: StageContext) -> dict:
        return _modelopt.quantize(ctx, "NVFP4_DEFAULT_CFG", kv_cache=options.kv_cache)
