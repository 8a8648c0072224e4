"""What every serve backend reads: model facts, weight bytes, the checkpoint's quantization,
and the memory model's plan, at plan time (config facts and estimates) and at render time
(the artifact's model folder)."""

from __future__ import annotations

import json
from pathlib import Path

from llmopt.model import estimates, memory
from llmopt.catalog import engines
from llmopt.errors import Problem, UsageError
from llmopt.model.modelinfo import ModelInfo, from_folder

GPU_ENGINES_NEED_GPU = "set [target] gpu = \"H100-SXM-80GB\" (or another entry of `llmopt ls gpus`)"


def model_dtype(recipe, info: ModelInfo | None, gpu=None) -> str:
    """Activation dtype to serve in: the recipe's, float16 on GPUs without bfloat16 (CC < 8.0)."""
    dtype = recipe.model.dtype if recipe.model.dtype != "auto" else ((info.dtype if info else None) or "bfloat16")
    if dtype == "bfloat16" and gpu is not None and gpu.cc < (8, 0):
        return "float16"
    return dtype if dtype in ("bfloat16", "float16", "float32") else "bfloat16"


def estimated_weight_bytes(loaded, info: ModelInfo) -> int:
    """The size model's weight bytes of the recipe's last model folder (``estimates.model_size``): what the
    engine loads, codes, scales and unquantized tensors as each step writes them."""
    return estimates.model_size(loaded, info)["weight_bytes"]


def estimated_memory(loaded, info: ModelInfo, gpu, weight_bytes: int) -> memory.MemoryPlan:
    """The memory model for the recipe's [serve] section (its engine options where it has them: KV cache
    dtype, CUDA graphs, parallel sizes), or for the default context and workload without one; raises
    UsageError when not even one sequence fits."""
    from llmopt.recipe.schema import Workload

    recipe = loaded.recipe
    serve = recipe.serve
    options = loaded.options_for("serve", None) if serve is not None else None
    kv_name = getattr(options, "kv_cache_dtype", "auto")
    kv = memory.kv_dtype_bytes(kv_name if kv_name in memory.KV_DTYPE_BYTES else "auto", info,
                               model_dtype(recipe, info, gpu))
    eager = bool(getattr(options, "enforce_eager", False)) or not getattr(options, "cuda_graphs", True)
    if options is not None and hasattr(options, "tensor_parallel_size"):
        return memory_plan(serve, recipe.target, info, gpu, options, weight_bytes, "estimate", kv, eager=eager,
                           draft=draft_for(recipe, options, info, gpu))
    max_len, workload = (serve.max_model_len, serve.workload) if serve is not None else (4096, Workload())
    return memory.plan_memory(info, gpu, recipe.target.count, max_len, workload, weight_bytes=weight_bytes,
                              kv_bytes=kv, eager=eager, engine=serve.backend if serve is not None else "vllm",
                              nodes=recipe.target.nodes)


def read_config(model_dir: Path) -> dict:
    path = Path(model_dir) / "config.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def checkpoint_quantization(model_dir: Path) -> dict | None:
    """The checkpoint's quantization as its config.json (or ModelOpt's hf_quant_config.json) states it."""
    quant = read_config(model_dir).get("quantization_config")
    if quant:
        return quant
    modelopt = Path(model_dir) / "hf_quant_config.json"
    if modelopt.is_file():
        data = json.loads(modelopt.read_text()).get("quantization", {})
        return {"quant_method": "modelopt", "quant_algo": data.get("quant_algo"),
                "kv_cache_quant_algo": data.get("kv_cache_quant_algo"),
                "quantized_layers": data.get("quantized_layers")}
    return None


def render_facts(ctx, model_dir: Path) -> tuple[ModelInfo, int, str]:
    """Model facts and weight bytes of the final model's folder (the estimate when it has no safetensors)."""
    info = from_folder(model_dir) if (Path(model_dir) / "config.json").is_file() else ctx.model
    if info is None:
        raise UsageError("cannot write launch configs: the model's config facts are unknown",
                         where=str(model_dir), fix="the model folder needs a config.json")
    actual = memory.safetensors_bytes(model_dir)
    if actual is not None:
        return info, actual, "safetensors"
    return info, estimated_weight_bytes(ctx.recipe, info), "estimate"


def draft_folder(ctx) -> Path | None:
    """Where the draft [[draft]] made is, for a deploy stage that has one."""
    return ctx.input_model_dir("draft") if "draft" in ctx.inputs else None


def draft_for(recipe, options, info: ModelInfo, gpu, folder: Path | None = None) -> memory.Draft | None:
    """The draft speculative decoding adds to the memory model (``llmopt.deploy.speculative``), or None;
    ``folder``: where the draft [[draft]] made is (the deploy stage's input)."""
    import dataclasses

    from llmopt.deploy import speculative

    spec = speculative.spec_of(recipe, options)
    if spec is not None and spec.model == speculative.OWN_DRAFT and folder is not None:
        spec = dataclasses.replace(spec, model=str(folder))
    return speculative.draft_memory(spec, info, model_dtype(recipe, info, gpu))


def memory_plan(serve, target, info: ModelInfo, gpu, options, weight_bytes: int, weight_source: str,
                kv_bytes: float, where: str = "", eager: bool = False,
                draft: memory.Draft | None = None) -> memory.MemoryPlan:
    """The memory model for ``serve.backend``: its own defaults, the recipe's options and ``serve.slo``; ``draft``:
    what speculative decoding adds (``draft_for``)."""
    chunked = getattr(options, "enable_chunked_prefill", True)
    batched = getattr(options, "max_num_batched_tokens", None)
    if not chunked and batched is not None:  # a whole prompt must fit one step
        batched = max(batched, serve.max_model_len)
    return memory.plan_memory(
        info, gpu, target.count, serve.max_model_len, serve.workload, weight_bytes=weight_bytes,
        weight_source=weight_source, kv_bytes=kv_bytes, utilization=getattr(options, "gpu_memory_utilization", None),
        tensor_parallel_size=options.tensor_parallel_size, pipeline_parallel_size=options.pipeline_parallel_size,
        data_parallel_size=getattr(options, "data_parallel_size", 1), max_num_seqs=options.max_num_seqs,
        max_num_batched_tokens=batched, eager=eager, where=where, engine=serve.backend, chunked=chunked,
        tpot_p99_ms=serve.slo.tpot_p99_ms, nodes=target.nodes, draft=draft)


def plan_estimate(options, ctx, kv_cache_dtype: str, eager: bool = False
                  ) -> tuple[list[Problem], memory.MemoryPlan | None]:
    """Plan-time checks every GPU engine shares (a target GPU, the context length, the memory model) and
    the memory model's plan from the estimated weights, or None when it cannot run."""
    recipe = ctx.recipe.recipe
    if ctx.gpu is None:
        if recipe.target.gpu:  # an unknown GPU name is already an error of its own
            return [], None
        return [Problem(f"{recipe.serve.backend} launch configs are written for a GPU, but [target] names none",
                        ctx.recipe.where("target"), GPU_ENGINES_NEED_GPU)], None
    info = ctx.model
    if info is None:
        return [Problem("model facts unknown: the memory model runs when the artifact is written",
                        ctx.where(), severity="warning")], None
    problems = []
    if info.max_position and recipe.serve.max_model_len > info.max_position:
        problems.append(Problem(f"max_model_len {recipe.serve.max_model_len} exceeds the model's context of "
                                f"{info.max_position} tokens", ctx.where("max_model_len"),
                                f"set serve.max_model_len to {info.max_position} or less"))
    kv = memory.kv_dtype_bytes(kv_cache_dtype, info, model_dtype(recipe, info, ctx.gpu))
    try:
        planned = memory_plan(recipe.serve, recipe.target, info, ctx.gpu, options,
                              estimated_weight_bytes(ctx.recipe, info), "estimate", kv, ctx.where(), eager,
                              draft_for(recipe, options, info, ctx.gpu))
    except UsageError as exc:
        return problems + [Problem(exc.what, exc.where, exc.fix)], None
    problems += [Problem(w, ctx.where("workload"), severity="warning") for w in planned.warnings]
    return problems, planned


def plan_quantization(ctx) -> dict | None:
    """The quantization the served checkpoint states, when the plan knows it: the source's own when no step
    compresses it (a pre-quantized checkpoint served as it is); None otherwise (read at render time)."""
    recipe = ctx.recipe.recipe
    if recipe.compress:
        return None
    if ctx.model is not None and ctx.model.quantization:
        return ctx.model.quantization
    source = Path(recipe.model.source).expanduser()
    folder = source if source.is_absolute() else Path(ctx.recipe.path).parent / source
    return checkpoint_quantization(folder) if folder.is_dir() else None


def gpu_problems(engine: str, sizes: dict[str, int], target, where: str) -> list[Problem]:
    """The config reserves more GPUs than [target] has (``sizes``: the parallel sizes that multiply), or a
    replica over several nodes does not fill them evenly."""
    gpus, count, nodes = reserved(sizes), target.count * target.nodes, target.nodes
    product = " x ".join(f"{k} {v}" for k, v in sizes.items() if v != 1) or "1"
    if gpus > count:
        have = f"count is {count}" if nodes == 1 else f"count {target.count} x nodes {nodes} is {count}"
        return [Problem(f"the {engine} config reserves {gpus} GPUs per replica ({product}), but [target] {have}",
                        where, f"raise [target] count to {gpus} or lower the parallel sizes" if nodes == 1 else
                        f"raise [target] nodes to {-(-gpus // target.count)} or lower the parallel sizes")]
    if nodes > 1 and gpus % nodes:
        return [Problem(f"the {engine} config's {gpus} GPUs ({product}) do not split evenly over {nodes} nodes",
                        where, f"use parallel sizes whose product is a multiple of {nodes}")]
    return []


def reserved(sizes: dict[str, int]) -> int:
    gpus = 1
    for value in sizes.values():
        gpus *= value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1
    return gpus


def summary(planned: memory.MemoryPlan) -> str:
    return (f"tp {planned.tensor_parallel_size} x pp {planned.pipeline_parallel_size} x dp "
            f"{planned.data_parallel_size} on {planned.gpu}: KV cache for {planned.kv_tokens:,} tokens "
            f"({planned.full_length_sequences:,} sequences of {planned.max_model_len:,})")


def limit_comments(planned: memory.MemoryPlan, config: dict, keys: dict[str, str], by: str) -> dict[str, str]:
    """A comment for each scheduler limit and memory share the config writes (``keys``: the memory model's
    name -> the engine's key): why, when it is not the engine version's own default, else that it is."""
    own = planned.engine_defaults
    label = f"{engines.LABELS.get(own.get('engine'), own.get('engine'))} {own.get('version')}"
    out = {}
    for name, key in keys.items():
        if key not in config:
            continue
        planned_value = getattr(planned, name)
        if config[key] != planned_value:
            out[key] = f"{key}: set by {by} (the memory model planned {planned_value})"
        elif name in planned.reasons:
            out[key] = f"{key}: {planned.reasons[name]}"
        elif own.get(name) == planned_value:
            out[key] = f"{key}: {label}'s own default {own['where']}"
    return out
