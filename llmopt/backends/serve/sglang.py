"""SGLang launch configs: ``python -m sglang.launch_server`` with ``ServerArgs`` options.

The memory model (``llmopt.memory``) picks ``--tp-size``, ``--max-running-requests``,
``--chunked-prefill-size`` and ``--mem-fraction-static`` (weights plus KV pool as a share
of the GPU; the rest is left for activations and CUDA graphs) for the recipe's target GPU,
``--context-length`` and workload. SGLang reads compressed-tensors, AWQ and GPTQ
quantization from config.json by itself; ModelOpt checkpoints get ``--quantization``.
Options are checked against the flag table of SGLang 0.5.23 (SGLang is not installed).
Needs: pyyaml (the ``deploy`` extra).
Produces: ``deploy/sglang/launch.sh``, ``docker-compose.yaml`` and ``kubernetes.yaml``
(image ``lmsysorg/sglang``); the arguments are in the manifest's deploy record.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from llmopt import formats, memory, validate_engine
from llmopt.backends.base import Options, PlanContext, StageContext
from llmopt.deploy import files, flags, inputs
from llmopt.deploy.compat import YES, Rule
from llmopt.errors import Problem, StageFailed, UsageError
from llmopt.registry import register

# What SGLang 0.5.23 loads, from its support matrix as summarised in DESIGN.md ("What serves what") and its
# quantization configs: compressed-tensors WNA16 takes 4- and 8-bit weights (WNA16_SUPPORTED_TYPES_MAP) on
# Marlin kernels; the ModelOpt loader (modelopt_quant.py) takes FP8 (Hopper) and NVFP4 (Blackwell) checkpoints
# and raises for any other quant_algo.
MARLIN = Rule("yes", "Marlin int4 kernels need CC 8.0", (8, 0))
BLACKWELL = Rule("yes", "NVFP4 needs Blackwell (CC 10.0+)", (10, 0))
NOT_ONNX = Rule("no", "SGLang does not serve ONNX models", fix="use serve.backend = \"ort\"")
ACCEPTS: dict[formats.Format, Rule] = {
    formats.DENSE: YES,
    formats.SPARSE_2_4: Rule("undocumented", "SGLang does not document 2:4 sparse checkpoints"),
    formats.CT_W4A16: MARLIN,
    formats.CT_W4A16_GIDX: MARLIN,
    formats.CT_W8A16: Rule("yes", "Marlin kernels need CC 8.0", (8, 0)),
    formats.CT_WNA16: Rule("no", "SGLang's compressed-tensors WNA16 scheme takes 4- and 8-bit weights only",
                           fix="use bits = 4 or 8"),
    formats.CT_INT8: Rule("yes", "INT8 W8A8 needs CC 7.5", (7, 5)),
    formats.CT_FP8: Rule("yes", "FP8 W8A8 compute needs CC 8.9; from 8.0 it runs weight-only", (8, 0), (8, 9)),
    formats.CT_NVFP4: BLACKWELL,
    formats.CT_NVFP4A16: BLACKWELL,
    formats.MODELOPT_FP8: Rule("yes", "SGLang's modelopt_fp8 needs Hopper (CC 9.0+)", (9, 0)),
    formats.MODELOPT_NVFP4: BLACKWELL,
    formats.MODELOPT_INT4_AWQ: Rule("undocumented", "SGLang does not document ModelOpt INT4 AWQ checkpoints"),
    formats.MODELOPT_INT8_SQ: Rule("no", "SGLang's ModelOpt loader takes FP8 and NVFP4 checkpoints only, not INT8 "
                                   "SmoothQuant", fix="use int8_sq (compressed-tensors INT8 W8A8) for SGLang"),
    formats.ONNX_INT4: NOT_ONNX, formats.ONNX_INT8: NOT_ONNX, formats.ONNX_FLOAT: NOT_ONNX,
}


class SglangOptions(Options):
    gpu_memory_utilization: float | None = Field(
        None, gt=0.1, le=0.99, description="Share of each GPU the server may use in total (default 0.90); llmopt "
        "turns it into --mem-fraction-static.")
    kv_cache_dtype: Literal["auto", "fp8_e4m3", "fp8_e5m2", "bf16"] = Field(
        "auto", description="KV cache precision (--kv-cache-dtype); auto: the model's dtype.")
    tensor_parallel_size: int | None = Field(
        None, ge=1, description="--tp-size; default: the smallest size that fits.")
    pipeline_parallel_size: int = Field(1, ge=1, description="--pp-size: pipeline stages.")
    data_parallel_size: int | Literal["auto"] = Field(
        1, description="--dp-size: model copies behind one server; auto: as many as the target's GPUs hold.")
    max_num_seqs: int | None = Field(None, ge=1, description="--max-running-requests; default: from the workload.")
    max_num_batched_tokens: int | None = Field(
        None, ge=16, description="--chunked-prefill-size; default: from the workload's prompt length.")
    enable_chunked_prefill: bool = Field(True, description="Chunk long prompts (off: --chunked-prefill-size -1).")
    enable_prefix_caching: bool = Field(True, description="The radix cache of shared prefixes (off: --disable-radix-cache).")
    extra_args: dict[str, Any] = Field(
        default_factory=dict, description="Other launch_server options by long name (e.g. {\"schedule-policy\" = "
        "\"lpm\"}); checked against the SGLang flag table.")
    port: int = Field(8000, ge=1, le=65535, description="HTTP port of the server.")
    image: str = Field("lmsysorg/sglang", description="Container image of the deployment files.")
    tag: str = Field(f"v{flags.SGLANG_VERSION}", description="Image tag.")


def sglang_quantization(quant: dict | None) -> str | None:
    """--quantization for ModelOpt checkpoints; SGLang detects the others from config.json."""
    if not quant or str(quant.get("quant_method", "")).lower() != "modelopt":
        return None
    algo = str(quant.get("quant_algo") or "").upper()
    return "modelopt_fp4" if "FP4" in algo else "modelopt_fp8"


def mem_fraction_static(planned: memory.MemoryPlan) -> float:
    """Weights plus KV pool as a share of the GPU: the budget less the activation and graph overheads."""
    share = planned.gpu_memory_utilization - planned.overhead_bytes_per_gpu / planned.gpu_memory_bytes
    return round(max(0.1, int(share * 100) / 100), 2)


def server_args(options: SglangOptions, planned: memory.MemoryPlan, recipe, quant, dtype: str) -> dict:
    """launch_server options by long name (without the leading --)."""
    args: dict[str, Any] = {"served-model-name": recipe.name, "dtype": dtype}
    method = sglang_quantization(quant)
    if method:
        args["quantization"] = method
    if options.kv_cache_dtype != "auto":
        args["kv-cache-dtype"] = options.kv_cache_dtype
    args |= {
        "context-length": planned.max_model_len,
        "mem-fraction-static": mem_fraction_static(planned),
        "max-running-requests": planned.max_num_seqs,
        "chunked-prefill-size": planned.max_num_batched_tokens if options.enable_chunked_prefill else -1,
        "tp-size": planned.tensor_parallel_size,
        "pp-size": planned.pipeline_parallel_size,
        "dp-size": planned.data_parallel_size,
    }
    if planned.expert_parallel_size > 1:
        args["ep-size"] = planned.expert_parallel_size
    if not options.enable_prefix_caching:
        args["disable-radix-cache"] = True
    if recipe.model.trust_remote_code:
        args["trust-remote-code"] = True
    return args | options.extra_args


def argv(args: dict) -> list[str]:
    out: list[str] = []
    for key, value in args.items():
        if isinstance(value, bool):
            out += [f"--{key}"] if value else []
        else:
            out += [f"--{key}", str(value)]
    return out


@register("serve", "sglang")
class SglangServe:
    Options = SglangOptions
    requires = ()
    extra = "deploy"

    def accepts(self, options: SglangOptions) -> dict[formats.Format, Rule]:
        """What SGLang serves of each checkpoint format, on which GPUs (``ACCEPTS``)."""
        return ACCEPTS

    def check(self, options: SglangOptions, ctx: PlanContext) -> list[Problem]:
        errors, _ = validate_engine.check_flags(options.extra_args, flags.SGLANG_TYPES, flags.SGLANG_FLAGS)
        problems = [Problem(f"SGLang {flags.SGLANG_VERSION} option {e}", ctx.where("extra_args"),
                            "use a long option name of `python -m sglang.launch_server --help`, without --")
                    for e in errors]
        kv = {"fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "bf16": "bfloat16"}.get(options.kv_cache_dtype, "auto")
        return problems + inputs.plan_problems(options, ctx, kv)

    def render(self, options: SglangOptions, ctx: StageContext) -> dict:
        recipe, model_dir, folder = ctx.recipe.recipe, ctx.model_dir, ctx.out_dir
        if ctx.gpu is None:
            raise UsageError("SGLang launch configs need a target GPU", fix=inputs.GPU_ENGINES_NEED_GPU)
        info, weights, source = inputs.render_facts(ctx, model_dir)
        quant = inputs.checkpoint_quantization(model_dir)
        dtype = inputs.model_dtype(recipe, info, ctx.gpu)
        kv = {"fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "bf16": "bfloat16"}.get(options.kv_cache_dtype, "auto")
        planned = inputs.memory_plan(recipe.serve, recipe.target, info, ctx.gpu, options, weights, source,
                                     memory.kv_dtype_bytes(kv, info, dtype), "serve")
        args = server_args(options, planned, recipe, quant, dtype)
        validation = validate_engine.validate_table("sglang", args, flags.SGLANG_TYPES, flags.SGLANG_FLAGS,
                                                    flags.SGLANG_VERSION)
        validation["errors"] += validate_engine.shape_errors(info, planned.tensor_parallel_size, planned.max_model_len,
                                                             planned.max_num_seqs, planned.max_num_batched_tokens, True)
        if validation["errors"]:
            raise StageFailed("the SGLang arguments fail its flag table: " + "; ".join(validation["errors"]),
                              where="serve", fix="adjust the [serve] options named in the message")
        launch = files.Launch("sglang", recipe.name, f"{options.image}:{options.tag}",
                              ["python3", "-m", "sglang.launch_server"],
                              ["--model-path", "{model}", *argv(args), "--host", "0.0.0.0", "--port", str(options.port)],
                              options.port, planned.gpus)
        written = files.write_all(folder, launch)
        return {"engine": "sglang", "engine_version": flags.SGLANG_VERSION, "command": launch.command("."),
                "image": launch.image, "port": options.port, "files": [f"deploy/sglang/{f}" for f in written],
                "args": args, "quantization": args.get("quantization") or (quant or {}).get("quant_method"),
                "memory": planned.to_dict(), "validated_by": validation["validated_by"], "warnings": planned.warnings}
