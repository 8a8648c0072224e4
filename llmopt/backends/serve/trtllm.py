"""TensorRT-LLM launch configs: ``trtllm-serve <model> --backend pytorch --config config.yaml``.

The PyTorch backend serves Hugging Face checkpoints (plain or ModelOpt-quantized) without
an engine build. The memory model (``llmopt.memory``) picks the parallel sizes,
``max_batch_size``, ``max_num_tokens`` and the KV cache's share of the memory left after
the weights and activations (``kv_cache_config.free_gpu_memory_fraction``). The YAML keys
are ``TorchLlmArgs`` fields, checked against the flag table of TensorRT-LLM 1.2.1
(TensorRT-LLM itself is not installed by llmopt).
Needs: pyyaml (the ``deploy`` extra).
Produces: ``deploy/trtllm/config.yaml``, ``launch.sh``, ``docker-compose.yaml`` and
``kubernetes.yaml`` (image ``nvcr.io/nvidia/tensorrt-llm/release``).
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

# What trtllm-serve's PyTorch backend (TensorRT-LLM 1.2.1) loads, from its support matrix as summarised in
# DESIGN.md ("What serves what"): ModelOpt's unified checkpoints (FP8 on Ada / Hopper / Blackwell, NVFP4 on
# Blackwell, INT4 AWQ from CC 8.0); INT8 SmoothQuant and 2:4 sparsity only on the legacy engine path.
CT = "TensorRT-LLM's PyTorch backend documents ModelOpt checkpoints, not compressed-tensors"
LEGACY_INT8 = Rule("no", "INT8 SmoothQuant runs only on TensorRT-LLM's legacy engine path, not trtllm-serve's "
                   "PyTorch backend", fix="use modelopt_fp8 (or another serve.backend) for INT8 W8A8")
NOT_ONNX = Rule("no", "TensorRT-LLM does not serve ONNX models", fix="use serve.backend = \"ort\"")
ACCEPTS: dict[formats.Format, Rule] = {
    formats.DENSE: YES,
    formats.SPARSE_2_4: Rule("no", "2:4 sparsity runs only on TensorRT-LLM's legacy engine path",
                             fix="leave out the 2:4 sparsity step, or choose another serve.backend"),
    formats.CT_W4A16: Rule("undocumented", CT + "; use modelopt_int4_awq"),
    formats.CT_W4A16_GIDX: Rule("undocumented", CT + "; use modelopt_int4_awq"),
    formats.CT_W8A16: Rule("undocumented", CT),
    formats.CT_WNA16: Rule("undocumented", CT),
    formats.CT_INT8: LEGACY_INT8,
    formats.CT_FP8: Rule("undocumented", CT + "; use modelopt_fp8", (8, 9)),
    formats.CT_NVFP4: Rule("undocumented", CT + "; use modelopt_nvfp4", (10, 0)),
    formats.CT_NVFP4A16: Rule("undocumented", CT),
    formats.MODELOPT_FP8: Rule("yes", "FP8 needs Ada, Hopper or Blackwell (CC 8.9+)", (8, 9)),
    formats.MODELOPT_NVFP4: Rule("yes", "NVFP4 needs Blackwell (CC 10.0+)", (10, 0)),
    formats.MODELOPT_INT4_AWQ: Rule("yes", "INT4 AWQ needs CC 8.0", (8, 0)),
    formats.MODELOPT_INT8_SQ: LEGACY_INT8,
    formats.ONNX_INT4: NOT_ONNX, formats.ONNX_INT8: NOT_ONNX, formats.ONNX_FLOAT: NOT_ONNX,
}


class TrtllmOptions(Options):
    gpu_memory_utilization: float | None = Field(
        None, gt=0.1, le=0.99, description="Share of each GPU the server may use in total (default 0.90); llmopt "
        "turns it into kv_cache_config.free_gpu_memory_fraction.")
    kv_cache_dtype: Literal["auto", "fp8"] = Field(
        "auto", description="KV cache precision; auto: the model's dtype, or fp8 when the checkpoint quantizes its KV.")
    tensor_parallel_size: int | None = Field(
        None, ge=1, description="GPUs one model copy is split over; default: the smallest size that fits.")
    pipeline_parallel_size: int = Field(1, ge=1, description="Pipeline stages (layers split across GPUs).")
    max_num_seqs: int | None = Field(None, ge=1, description="max_batch_size; default: from the workload and KV.")
    max_num_batched_tokens: int | None = Field(
        None, ge=16, description="max_num_tokens per step; default: from the workload's prompt length.")
    enable_chunked_prefill: bool = Field(True, description="Split long prompts into chunks.")
    enable_block_reuse: bool = Field(True, description="Reuse the KV blocks of shared prompt prefixes.")
    cuda_graphs: bool = Field(True, description="Capture CUDA graphs for decode batches (cuda_graph_config).")
    disable_overlap_scheduler: bool = Field(False, description="Turn off the overlap scheduler (lower throughput).")
    enable_attention_dp: bool = Field(False, description="Data-parallel attention (for MoE models at high concurrency).")
    moe_backend: str | None = Field(None, description="moe_config.backend, e.g. CUTLASS, TRTLLM, DEEPGEMM (MoE only).")
    extra: dict[str, Any] = Field(
        default_factory=dict, description="Other TorchLlmArgs keys merged into config.yaml (checked against the "
        "flag table where llmopt knows them).")
    port: int = Field(8000, ge=1, le=65535, description="HTTP port of the server.")
    image: str = Field("nvcr.io/nvidia/tensorrt-llm/release", description="Container image of the deployment files.")
    tag: str = Field(flags.TRTLLM_VERSION, description="Image tag.")


def kv_fraction(planned: memory.MemoryPlan) -> float:
    """free_gpu_memory_fraction: the KV budget as a share of what is free after weights and overheads."""
    free = planned.gpu_memory_bytes - planned.weight_bytes_per_gpu - planned.overhead_bytes_per_gpu
    share = planned.kv_budget_bytes_per_gpu / free if free > 0 else 0.0
    return round(min(0.95, max(0.05, int(share * 100) / 100)), 2)


def trtllm_kv_dtype(options: TrtllmOptions, quant: dict | None) -> str:
    if options.kv_cache_dtype != "auto" or not quant:
        return options.kv_cache_dtype
    scheme = quant.get("kv_cache_scheme") or {}
    fp8 = (scheme.get("type") == "float" and scheme.get("num_bits") == 8) or quant.get("kv_cache_quant_algo") == "FP8"
    return "fp8" if fp8 else "auto"


def engine_config(options: TrtllmOptions, planned: memory.MemoryPlan, recipe, dtype: str, kv_dtype: str) -> dict:
    kv: dict[str, Any] = {"free_gpu_memory_fraction": kv_fraction(planned), "enable_block_reuse": options.enable_block_reuse}
    if kv_dtype != "auto":
        kv["dtype"] = kv_dtype
    config: dict[str, Any] = {
        "dtype": dtype,
        "max_batch_size": planned.max_num_seqs,
        "max_num_tokens": planned.max_num_batched_tokens,
        "max_seq_len": planned.max_model_len,
        "tensor_parallel_size": planned.tensor_parallel_size,
        "pipeline_parallel_size": planned.pipeline_parallel_size,
        "enable_chunked_prefill": options.enable_chunked_prefill,
        "disable_overlap_scheduler": options.disable_overlap_scheduler,
        "enable_attention_dp": options.enable_attention_dp,
        "kv_cache_config": kv,
    }
    if planned.expert_parallel_size > 1:
        config["moe_expert_parallel_size"] = planned.expert_parallel_size
    if options.cuda_graphs:
        config["cuda_graph_config"] = {"enable_padding": True, "max_batch_size": planned.max_num_seqs}
    if options.moe_backend:
        config["moe_config"] = {"backend": options.moe_backend}
    if recipe.model.trust_remote_code:
        config["trust_remote_code"] = True
    return config | options.extra


@register("serve", "trtllm")
class TrtllmServe:
    Options = TrtllmOptions
    requires = ()
    extra = "deploy"

    def accepts(self, options: TrtllmOptions) -> dict[formats.Format, Rule]:
        """What trtllm-serve serves of each checkpoint format, on which GPUs (``ACCEPTS``)."""
        return ACCEPTS

    def check(self, options: TrtllmOptions, ctx: PlanContext) -> list[Problem]:
        problems = []
        if options.moe_backend and ctx.model is not None and not ctx.model.num_experts:
            problems.append(Problem("moe_backend is set but the model has no experts", ctx.where("moe_backend"),
                                    "remove moe_backend", severity="warning"))
        errors, warnings = validate_engine.check_flags(options.extra, flags.TRTLLM_TYPES)
        problems += [Problem(f"TensorRT-LLM {flags.TRTLLM_VERSION} option {e}", ctx.where("extra")) for e in errors]
        problems += [Problem(w, ctx.where("extra"), severity="warning") for w in warnings]
        return problems + inputs.plan_problems(options, ctx, options.kv_cache_dtype, not options.cuda_graphs)

    def render(self, options: TrtllmOptions, ctx: StageContext) -> dict:
        recipe, model_dir, folder = ctx.recipe.recipe, ctx.model_dir, ctx.out_dir
        if ctx.gpu is None:
            raise UsageError("TensorRT-LLM launch configs need a target GPU", fix=inputs.GPU_ENGINES_NEED_GPU)
        info, weights, source = inputs.render_facts(ctx, model_dir)
        quant = inputs.checkpoint_quantization(model_dir)
        dtype = inputs.model_dtype(recipe, info, ctx.gpu)
        kv_dtype = trtllm_kv_dtype(options, quant)
        planned = inputs.memory_plan(recipe.serve, recipe.target, info, ctx.gpu, options, weights, source,
                                     memory.kv_dtype_bytes(kv_dtype, info, dtype), "serve", not options.cuda_graphs)
        config = engine_config(options, planned, recipe, dtype, kv_dtype)
        validation = validate_engine.validate_table("trtllm", config, flags.TRTLLM_TYPES, None, flags.TRTLLM_VERSION)
        validation["errors"] += validate_engine.shape_errors(info, planned.tensor_parallel_size, planned.max_model_len,
                                                             planned.max_num_seqs, planned.max_num_batched_tokens, True)
        if validation["errors"]:
            raise StageFailed("the TensorRT-LLM config fails its flag table: " + "; ".join(validation["errors"]),
                              where="serve", fix="adjust the [serve] options named in the message")
        files.dump_yaml(config, folder / "config.yaml", f"# TensorRT-LLM {flags.TRTLLM_VERSION} TorchLlmArgs for "
                        f"{recipe.name}: `trtllm-serve <model> --backend pytorch --config config.yaml` (written by "
                        f"llmopt; {inputs.summary(planned)}).")
        launch = files.Launch("trtllm", recipe.name, f"{options.image}:{options.tag}", ["trtllm-serve"],
                              ["{model}", "--backend", "pytorch", "--config", "{config}/config.yaml",
                               "--host", "0.0.0.0", "--port", str(options.port)], options.port, planned.gpus)
        written = ["config.yaml", *files.write_all(folder, launch)]
        return {"engine": "trtllm", "engine_version": flags.TRTLLM_VERSION, "command": launch.command("."),
                "image": launch.image, "port": options.port, "files": [f"deploy/trtllm/{f}" for f in written],
                "args": config, "quantization": (quant or {}).get("quant_method"), "memory": planned.to_dict(),
                "validated_by": validation["validated_by"], "warnings": planned.warnings + validation["warnings"]}
