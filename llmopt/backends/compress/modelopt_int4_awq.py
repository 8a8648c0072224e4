"""Compress: INT4 AWQ with NVIDIA ModelOpt (4-bit weights in blocks, 16-bit activations).

ModelOpt's "awq_lite" searches, per linear layer, an activation-aware scale on the
recipe's calibration data, then quantizes weights symmetrically to 4 bits with one
scale per block of ``block_size`` input weights (the block must divide every
layer's input width: 64 for SmolLM2's 576). Exported as the unified Hugging Face
checkpoint for TensorRT-LLM, vLLM and SGLang.
Needs: nvidia-modelopt, torch, transformers (``pip install 'llmopt[modelopt]'``).
Produces: ``model/`` with packed int4 weights (two per byte), per-block scales and
AWQ pre-quantization scales, hf_quant_config.json (quant_algo INT4_AWQ) and the
tokenizer; format ``modelopt``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from llmopt.model import formats
from llmopt.backends.base import CompressBackend, Options, PlanContext, StageContext
from llmopt.backends.compress import _checks, _modelopt
from llmopt.errors import Problem
from llmopt.registry import register


class ModelOptInt4AWQOptions(Options):
    block_size: int = Field(128, ge=16, description="Input weights sharing one scale; must divide every linear "
                            "layer's input width (use 64 for SmolLM2's 576).")
    alpha_step: float = Field(0.1, gt=0, le=0.5, description="Step of awq_lite's search over the scaling exponent "
                              "(smaller: more points, slower).")
    kv_cache: Literal["none", "fp8"] = Field("none", description=_modelopt.KV_HELP)


@register("compress", "modelopt_int4_awq")
class ModelOptInt4AWQ(CompressBackend):
    Options = ModelOptInt4AWQOptions
    requires = _modelopt.REQUIRES
    extra = _modelopt.EXTRA
    calibrates = True
    cpu_float32 = True  # on a CPU: computes in float32, saves the recipe's dtype
    expert_tokens = "routed"  # ModelOpt calibrates each expert on the tokens routed to it
    quantizes = True

    def produces(self, options: ModelOptInt4AWQOptions) -> formats.Format:
        return formats.MODELOPT_INT4_AWQ

    def layout(self, options: ModelOptInt4AWQOptions, before, ctx: PlanContext):
        """int4 two to a byte, a bfloat16 scale per block, a bfloat16 pre-quantization scale per input column."""
        weights = _modelopt.stored(4, options.block_size, 2, 0, 2, 3,
                                   f"int4, bf16 scale per {options.block_size} columns, AWQ pre-quantization scales")
        return _modelopt.layout(before, weights, ctx, options.kv_cache)

    def check(self, options: ModelOptInt4AWQOptions, ctx: PlanContext) -> list[Problem]:
        problems = _checks.quantizer(ctx, "modelopt_int4_awq", calibrates=True)
        return problems + _checks.group_size(ctx, options.block_size, ["lm_head"], key="block_size")

    def run(self, options: ModelOptInt4AWQOptions, ctx: StageContext) -> dict:
        def adjust(config: dict) -> None:
            _modelopt.set_rule(config, "*weight_quantizer", block_sizes={-1: options.block_size, "type": "static"})
            config["algorithm"] = {"method": "awq_lite", "alpha_step": options.alpha_step}

        return _modelopt.quantize(ctx, "INT4_AWQ_CFG", adjust, options.kv_cache)
