"""SGLang launch configs: ``python -m sglang.launch_server`` with ``ServerArgs`` options.

The memory model (``llmopt.model.memory``) picks ``--tp-size``, ``--max-running-requests``,
``--chunked-prefill-size`` and ``--mem-fraction-static`` (weights plus KV pool as a share
of the GPU; the rest is left for activations and CUDA graphs) for the recipe's target GPU,
``--context-length`` and workload; ``extra_args`` are laid over them (``llmopt.deploy.extras``).
SGLang reads compressed-tensors, AWQ and GPTQ quantization from config.json by itself;
ModelOpt checkpoints get the ``--quantization`` SGLang 0.5.23 maps their ``quant_algo`` to, and
one it cannot load is refused. Expert parallelism stays inside the tensor-parallel group, as
SGLang defines it. Where SGLang is installed (a Python named by option ``engine_python`` or
``$LLMOPT_SGLANG_PYTHON``; ``make sglang-env`` builds one), the config is written for its version and the
deploy stage parses the launch arguments with that SGLang's own ``ServerArgs`` (``llmopt.deploy.validate_engine``,
on the CPU): an option it lacks is a plan error. Otherwise they are checked against llmopt's flag table of
SGLang 0.5.23.
Needs: pyyaml (the ``deploy`` extra); SGLang itself only to validate, in its own environment.
Produces: ``deploy/sglang/launch.sh``, ``docker-compose.yaml`` and ``kubernetes.yaml``
(image ``lmsysorg/sglang``); the arguments are in the manifest's deploy record. For a replica over
``[target] nodes`` > 1, every node runs launch_server with ``--nnodes``, ``--node-rank`` and
``--dist-init-addr`` (``llmopt.deploy.nodes``: per-node launch.sh, compose services, a LeaderWorkerSet).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from llmopt import apikey
from llmopt.deploy import validate_engine

from llmopt.model import formats, memory
from llmopt.backends.base import PlanContext, ServeBackend, StageContext
from llmopt.deploy import extras, files, flags, inputs, nodes, speculative, versions
from llmopt.deploy.compat import YES, Rule
from llmopt.errors import Problem, StageFailed, UsageError
from llmopt.registry import register

# What SGLang 0.5.23 loads, from its support matrix as summarised in DESIGN.md ("What serves what") and its
# quantization configs: compressed-tensors WNA16 takes 4- and 8-bit weights (WNA16_SUPPORTED_TYPES_MAP) on
# Marlin kernels; the ModelOpt loaders (modelopt_quant.py) take FP8 (from CC 8.9), NVFP4 (native on Blackwell),
# MXFP8 and mixed-precision checkpoints and raise for any other quant_algo (``MODELOPT_METHODS`` below).
# SGLang's Marlin GEMM (sglang/kernels/jit/csrc/gemm/marlin/gptq_marlin.cuh, the same in 0.5.17 and 0.5.23) runs a
# layer in tiles of (K, N) = (128, 128), (64, 128) or (128, 64), and (64, 256) for large batches, where K is the
# layer's input width on one GPU and N its output width: a layer that no tile divides has no kernel, and the server
# dies at its first forward pass ("Invalid thread config"). Its layers as SGLang fuses them: q, k and v in one
# qkv_proj, gate and up in one gate_up_proj (column parallel: N split over the GPUs), o_proj and down_proj row
# parallel (K split). Seen on an H100 (2026-12-06): SGLang 0.5.17 serving the demo model's W4A16 checkpoint died
# on qkv_proj (K 576, N 960), which vLLM 0.26's Marlin kernels served.
MARLIN_TILES = ((128, 128), (64, 128), (128, 64), (64, 256))


def marlin_misfits(info, tp: int = 1) -> str | None:
    """Why SGLang's Marlin kernels cannot run this model's layers at tensor parallel ``tp``, or None (also for
    multi-head latent attention and routed experts, which go through other kernels and are not checked here)."""
    if info.kv_lora_rank:
        return None
    q, kv = info.num_heads * info.head_dim, info.num_kv_heads * info.head_dim
    h, w = info.hidden_size, info.intermediate_size
    layers = {"qkv_proj": (h, (q + 2 * kv) // tp), "o_proj": (q // tp, h)}
    if not info.num_experts or info.dense_layers:
        layers |= {"gate_up_proj": (h, 2 * w // tp), "down_proj": (w // tp, h)}
    bad = [f"{name} (K {k}, N {n})" for name, (k, n) in layers.items()
           if not any(k % tk == 0 and n % tn == 0 for tk, tn in MARLIN_TILES)]
    if not bad:
        return None
    on = f" at tensor parallel {tp}" if tp > 1 else ""
    return (f"SGLang's Marlin kernels have no tile for {', '.join(bad)}{on}: each layer's input width K must be "
            "a multiple of 64 and its output width N of 128, or K of 128 and N of 64, else the server dies at its "
            "first forward pass")


MARLIN_FIX = ("serve it with serve.backend = \"vllm\" (whose Marlin kernels take these shapes), or quantize to FP8 "
              "(method = \"fp8\"), which SGLang runs on other kernels")
MARLIN = Rule("yes", "Marlin int4 kernels need CC 8.0", (8, 0), shapes=marlin_misfits, shapes_fix=MARLIN_FIX)
MODELOPT_LOADS = ("SGLang 0.5.23's ModelOpt loaders take FP8, NVFP4 (also W4A16_NVFP4, NVFP4_AWQ), MXFP8 and "
                  "mixed-precision checkpoints")
BLACKWELL = Rule("yes", "NVFP4 needs Blackwell (CC 10.0+)", (10, 0))
NOT_ONNX = Rule("no", "SGLang does not serve ONNX models", fix="use serve.backend = \"ort\"")
ACCEPTS: dict[formats.Format, Rule] = {
    formats.DENSE: YES,
    formats.SPARSE_2_4: Rule("undocumented", "SGLang does not document 2:4 sparse checkpoints"),
    formats.CT_W4A16: MARLIN,
    formats.CT_W4A16_GIDX: MARLIN,
    formats.CT_W8A16: Rule("yes", "Marlin kernels need CC 8.0", (8, 0), shapes=marlin_misfits, shapes_fix=MARLIN_FIX),
    formats.CT_WNA16: Rule("no", "SGLang's compressed-tensors WNA16 scheme takes 4- and 8-bit weights only",
                           fix="use bits = 4 or 8"),
    formats.CT_INT8: Rule("yes", "INT8 W8A8 needs CC 7.5", (7, 5)),
    formats.CT_FP8: Rule("yes", "FP8 W8A8 compute needs CC 8.9; from 8.0 it runs weight-only", (8, 0), (8, 9)),
    formats.CT_NVFP4: BLACKWELL,
    formats.CT_NVFP4A16: BLACKWELL,
    # ModelOptFp8Config.get_min_capability() is 89 in SGLang 0.5.23
    formats.MODELOPT_FP8: Rule("yes", "SGLang's modelopt_fp8 needs CC 8.9 (Ada, Hopper, Blackwell)", (8, 9)),
    formats.MODELOPT_NVFP4: BLACKWELL,
    formats.MODELOPT_INT4_AWQ: Rule("no", MODELOPT_LOADS + ", not INT4 AWQ",
                                    fix="use awq or gptq (compressed-tensors) for SGLang, or "
                                    "serve.backend = \"trtllm\""),
    formats.MODELOPT_INT8_SQ: Rule("no", MODELOPT_LOADS + ", not INT8 SmoothQuant",
                                   fix="use int8_sq (compressed-tensors INT8 W8A8) for SGLang"),
    formats.ONNX_INT4: NOT_ONNX, formats.ONNX_INT8: NOT_ONNX, formats.ONNX_FLOAT: NOT_ONNX,
}
# How SGLang 0.5.23 reads a ModelOpt checkpoint's quant_algo (sglang/srt/configs/model_config.py,
# _parse_modelopt_quant_config, and the loaders of layers/quantization/modelopt_quant.py): FP8 -> modelopt_fp8;
# NVFP4, W4A16_NVFP4, NVFP4_AWQ -> modelopt_fp4; MXFP8 -> mxfp8; MIXED_PRECISION -> modelopt_mixed when a layer
# is NVFP4, else w4afp8. Any other quant_algo (W4A16 / W4A8 AWQ, INT8 SmoothQuant, FP8 per-block or per-channel)
# falls to ModelOptFp8Config, which raises for everything but FP8.
MODELOPT_METHODS = {"FP8": "modelopt_fp8", "NVFP4": "modelopt_fp4", "W4A16_NVFP4": "modelopt_fp4",
                    "NVFP4_AWQ": "modelopt_fp4", "MXFP8": "mxfp8"}
# the parallel sizes the memory model plans (launch_server's names), and the option that plans each
PARALLEL = {"tp-size": "tensor_parallel_size", "pp-size": "pipeline_parallel_size", "dp-size": "data_parallel_size"}
# GPUs of one server: --dp-size replicas of tp x pp ranks (attention DP and EP split the TP ranks: SGLang
# 0.5.23's runtime_context.derive_parallel_widths, moe_tp_size = tp_size // ep_size // moe_dp_size)
GPU_KEYS = ("tp-size", "pp-size", "dp-size")
# the memory model's scheduler limits, and launch_server's option for each
LIMITS = {"max_num_seqs": "max-running-requests", "max_num_batched_tokens": "chunked-prefill-size"}


class SglangOptions(files.DeploymentOptions):
    gpu_memory_utilization: float | None = Field(
        None, gt=0.1, le=0.99, description="Share of each GPU the server may use in total; llmopt "
        "turns it into --mem-fraction-static (default: SGLang's own for the GPU and step budget).")
    kv_cache_dtype: Literal["auto", "fp8_e4m3", "fp8_e5m2", "bf16"] = Field(
        "auto", description="KV cache precision (--kv-cache-dtype); auto: the model's dtype.")
    tensor_parallel_size: int | None = Field(
        None, ge=1, description="--tp-size; default: the smallest size that fits.")
    pipeline_parallel_size: int = Field(1, ge=1, description="--pp-size: pipeline stages.")
    data_parallel_size: int | Literal["auto"] = Field(
        1, description="--dp-size: model copies behind one server; auto: as many as the target's GPUs hold.")
    max_num_seqs: int | None = Field(
        None, ge=1, description="--max-running-requests; default: SGLang's own (from its KV pool, 2048..4096), "
        "fewer when the KV cache holds fewer of the workload's sequences.")
    max_num_batched_tokens: int | None = Field(
        None, ge=16, description="--chunked-prefill-size; default: SGLang's own for the GPU's memory (8192 on "
        "H100 and H200), smaller when serve.slo.tpot_p99_ms needs shorter steps.")
    enable_chunked_prefill: bool = Field(True, description="Chunk long prompts (off: --chunked-prefill-size -1).")
    enable_prefix_caching: bool = Field(True, description="The radix cache of shared prefixes (off: --disable-radix-cache).")
    extra_args: dict[str, Any] = Field(
        default_factory=dict, description="Other launch_server options by long name (e.g. {\"schedule-policy\" = "
        "\"lpm\"}); checked by the installed SGLang's parser, else by llmopt's flag table.")
    override: list[str] = Field(
        default_factory=list, description="Keys of extra_args whose value wins over the one llmopt planned (e.g. "
        "[\"tp-size\"]: the memory model then plans with it); an extra that contradicts a planned value is "
        "otherwise an error.")
    port: int = Field(8000, ge=1, le=65535, description="HTTP port of the server.")
    image: str = Field("lmsysorg/sglang", description="Container image of the deployment files.")
    tag: str | None = Field(None, description="Image tag; default: v<engine_version> (v0.5.23).")
    engine_version: str | None = Field(
        None, pattern=versions.PATTERN,
        description=f"SGLang release the config is written for; default: the SGLang installed here (engine_python), "
        f"else {flags.SGLANG_VERSION}, the one release llmopt has a flag table of.")
    engine_python: str | None = Field(
        None, description="Python with SGLang installed, whose version and own ServerArgs parser check the launch "
        "arguments (default: $LLMOPT_SGLANG_PYTHON; none: llmopt's flag table of engine_version).")


def engine_choice(options: SglangOptions) -> tuple[versions.Choice, tuple[str, str, str] | None]:
    """The SGLang release the config is written for and, when a named Python has no SGLang, (what, where, fix)."""
    installed, bad = versions.installed("sglang", "SGLang", options.engine_python, validate_engine.SGLANG_ENV_VAR)
    stated = versions.normalized(options.engine_version) if options.engine_version else None
    return versions.choose("SGLang", stated, installed, flags.SGLANG_TABLES, flags.SGLANG_VERSION), bad


def modelopt_algo(quant: dict | None) -> str | None:
    if not quant or str(quant.get("quant_method", "")).lower() != "modelopt":
        return None
    return str(quant.get("quant_algo") or "").upper()


def sglang_quantization(quant: dict | None) -> str | None:
    """--quantization for a ModelOpt checkpoint (``MODELOPT_METHODS``); SGLang detects the others from
    config.json, and ``refusal`` names the ModelOpt algorithms it cannot load."""
    algo = modelopt_algo(quant)
    if algo == "MIXED_PRECISION":
        layers = (quant or {}).get("quantized_layers") or {}
        nvfp4 = any(str(layer.get("quant_algo", "")).upper() in ("NVFP4", "W4A16_NVFP4")
                    for layer in layers.values() if isinstance(layer, dict))
        return "modelopt_mixed" if nvfp4 else "w4afp8"
    return MODELOPT_METHODS.get(algo) if algo else None


def refusal(quant: dict | None) -> str | None:
    """Why SGLang 0.5.23 cannot load the checkpoint's ModelOpt quantization, or None."""
    algo = modelopt_algo(quant)
    if algo is None or algo == "MIXED_PRECISION" or algo in MODELOPT_METHODS:
        return None
    return f"the checkpoint's ModelOpt quant_algo {algo or '(none)'} cannot be served: {MODELOPT_LOADS}"


def canonical(extra: dict) -> dict:
    """extra_args under launch_server's own names: hyphens, and an alias under the option it spells
    (``tensor-parallel-size`` is ``tp-size``: ``flags.SGLANG_ALIASES``)."""
    out = {}
    for key, value in extra.items():
        key = key.replace("_", "-")
        out[flags.SGLANG_ALIASES.get(key, key)] = value
    return out


def overrides(options: SglangOptions) -> list[str]:
    return list(canonical(dict.fromkeys(options.override)))


def effective(options: SglangOptions) -> SglangOptions:
    """The options the memory model plans with: an overridden parallel size of extra_args wins."""
    update = extras.parallel_sizes(canonical(options.extra_args), overrides(options), PARALLEL)
    return options.model_copy(update=update) if update else options


def gpu_sizes(args: dict) -> dict[str, int]:
    return {key: args.get(key, 1) for key in GPU_KEYS}


def mem_fraction_static(planned: memory.MemoryPlan) -> float:
    """Weights plus KV pool as a share of the GPU: SGLang's own for the GPU and step budget, or the recipe's
    gpu_memory_utilization less the predicted activation and graph overheads."""
    return planned.memory_fraction


def notes(planned: memory.MemoryPlan, args: dict) -> list[str]:
    """launch.sh's comments: why the scheduler limits and the memory share have their values."""
    off = args.get("chunked-prefill-size") == -1
    keys = {name: key for name, key in LIMITS.items() if not (off and key == "chunked-prefill-size")}
    out = list(inputs.limit_comments(planned, args, keys, "extra_args").values())
    if off:
        out.append("chunked-prefill-size: -1, chunked prefill is off (enable_chunked_prefill = false)")
    if args.get("mem-fraction-static") == mem_fraction_static(planned):
        why = planned.reasons.get("memory_fraction") or f"SGLang {flags.SGLANG_VERSION}'s own default on {planned.gpu}"
        out.append(f"mem-fraction-static: {why}")
    return out


def server_args(options: SglangOptions, planned: memory.MemoryPlan, recipe, info, quant, dtype: str
                ) -> extras.Merged:
    """launch_server options by long name (without the leading --): the planned ones with extra_args over them."""
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
    tp = planned.tensor_parallel_size
    if planned.expert_parallel_size > 1 and tp > 1 and info.num_experts % tp == 0:
        args["ep-size"] = tp  # SGLang's experts are split within the TP group: ep_size divides tp_size
    if not options.enable_prefix_caching:
        args["disable-radix-cache"] = True
    if recipe.model.trust_remote_code:
        args["trust-remote-code"] = True
    args |= speculative.sglang_args(speculative.spec_of(recipe))
    return extras.merge(args, canonical(options.extra_args), overrides(options))


def argv(args: dict) -> list[str]:
    out: list[str] = []
    for key, value in args.items():
        if isinstance(value, bool):
            out += [f"--{key}"] if value else []
        else:
            out += [f"--{key}", str(value)]
    return out


@register("serve", "sglang")
class SglangServe(ServeBackend):
    Options = SglangOptions
    requires = ()
    extra = "deploy"

    def accepts(self, options: SglangOptions) -> dict[formats.Format, Rule]:
        """What SGLang serves of each checkpoint format, on which GPUs (``ACCEPTS``)."""
        return ACCEPTS

    def key_material(self, options: SglangOptions) -> dict:
        """The release the config is written for, and whether its own parser checks it: a deploy stage cached
        before SGLang was installed here, or changed, is not reused."""
        choice, _ = engine_choice(options)
        return {"engine_version": choice.version, "parser": choice.installed is not None}

    def check(self, options: SglangOptions, ctx: PlanContext) -> list[Problem]:
        choice, bad = engine_choice(options)
        found_version = versions.problems(choice, bad, ctx)
        extra = canonical(options.extra_args)
        # without a table of the version (only the installed SGLang knows it), its parser checks at the deploy stage
        errors = validate_engine.check_flags(extra, flags.SGLANG_TYPES, choice.table)[0] if choice.table else []
        problems = [Problem(f"SGLang {choice.version}: {e}", ctx.where("extra_args"),
                            "use a long option name of `python -m sglang.launch_server --help`, without --")
                    for e in errors]
        quant = inputs.plan_quantization(ctx)
        if reason := refusal(quant):
            problems.append(Problem(reason, ctx.where(), "serve it with serve.backend = \"trtllm\" or \"vllm\", or "
                                    "quantize to a format SGLang loads (modelopt_fp8, modelopt_nvfp4, fp8, awq)"))
        options = effective(options)
        found, planned = inputs.plan_estimate(options, ctx, kv_bytes_dtype(options))
        merged = extras.Merged({})
        if planned is not None:
            recipe = ctx.recipe.recipe
            merged = server_args(options, planned, recipe, ctx.model, quant,
                                 inputs.model_dtype(recipe, ctx.model, ctx.gpu))
            found += inputs.gpu_problems("sglang", gpu_sizes(merged.config), recipe.target,
                                         ctx.where("extra_args"))
        problems = found_version + problems + speculative.problems(
            speculative.of(ctx.recipe.recipe.serve), "sglang", choice.version, ctx)
        return problems + found + extras.problems(merged, overrides(options), extra, ctx.where("extra_args"),
                                                  "extra_args", PARALLEL)

    def render(self, options: SglangOptions, ctx: StageContext) -> dict:
        recipe, model_dir, folder = ctx.recipe.recipe, ctx.model_dir, ctx.out_dir
        choice, bad = engine_choice(options)
        if bad:
            raise UsageError(bad[0], where=bad[1], fix=bad[2])
        if choice.error:
            raise UsageError(choice.error[0], where="serve.engine_version", fix=choice.error[1])
        if ctx.gpu is None:
            raise UsageError("SGLang launch configs need a target GPU", fix=inputs.GPU_ENGINES_NEED_GPU)
        options = effective(options)
        info, weights, source = inputs.render_facts(ctx, model_dir)
        quant = inputs.checkpoint_quantization(model_dir)
        if reason := refusal(quant):
            raise StageFailed(reason, where="serve.backend", fix="serve it with serve.backend = \"trtllm\" or \"vllm\"")
        dtype = inputs.model_dtype(recipe, info, ctx.gpu)
        planned = inputs.memory_plan(recipe.serve, recipe.target, info, ctx.gpu, options, weights, source,
                                     memory.kv_dtype_bytes(kv_bytes_dtype(options), info, dtype), "serve",
                                     draft=inputs.draft_for(recipe, options, info, ctx.gpu,
                                                      inputs.draft_folder(ctx)))
        merged = server_args(options, planned, recipe, info, quant, dtype)
        extras.refuse(merged, "extra_args")
        args = merged.config
        validation = validated(choice, args, canonical(options.extra_args), model_dir, options.port)
        validation["errors"] += validate_engine.shape_errors(info, args.get("tp-size", 1), planned.max_model_len,
                                                             planned.max_num_seqs, planned.max_num_batched_tokens, True)
        if validation["errors"]:
            raise StageFailed(f"the SGLang arguments fail {validation['validated_by']}: "
                              + "; ".join(validation["errors"]),
                              where="serve", fix="adjust the [serve] options (or extra_args) named in the message")
        gpus = inputs.reserved(gpu_sizes(args))
        launch = files.Launch(
            "sglang", recipe.name, f"{options.image}:{versions.image_tag(options.tag, choice.version, 'v')}",
            ["python3", "-m", "sglang.launch_server"],
            ["--model-path", "{model}", *argv(args), "--host", "0.0.0.0", "--port", str(options.port)],
            options.port, gpus, options,
            # SGLang 0.5.23 (sglang/srt/entrypoints/http_server.py): with --api-key, every route but /health*
            # and /metrics wants the key (sglang/srt/utils/auth.py), /ready too, so /health is the readiness and
            # liveness route; it runs a one-token generation when idle and may wait SGLANG_HEALTH_CHECK_TIMEOUT
            # (20 s) for it, hence the longer timeouts. SGLang reads its key from --api-key only (no variable):
            # each file passes $LLMOPT_API_KEY there. The image (docker/Dockerfile) has no non-root user: it
            # runs as root.
            ready_path="/health", live_path="/health", live_timeout=30, ready_timeout=30,
            key_env=apikey.ENV, key_flag="--api-key", notes=notes(planned, args))
        if planned.nodes > 1:
            launch.gpus = gpus // planned.nodes
            written = nodes.write_all(folder, launch, node_commands(launch, planned.nodes))
        else:
            written = files.write_all(folder, launch)
        return {"engine": "sglang", "engine_version": choice.version, "engine_version_from": choice.source,
                "command": launch.command("."),
                "image": launch.image, "port": options.port, "files": [f"deploy/sglang/{f}" for f in written],
                "served_model_name": recipe.name, "gpus": gpus, "nodes": planned.nodes, "args": args,
                "quantization": args.get("quantization") or (quant or {}).get("quant_method"),
                "memory": planned.to_dict(), "validated_by": validation["validated_by"], "warnings": planned.warnings}


def validated(choice: versions.Choice, args: dict, extra: dict, model_dir, port: int) -> dict:
    """The launch arguments checked by the installed SGLang's own parser where the config is written for it,
    else by llmopt's flag table of the version. An option the parser lacks is a plan error naming it."""
    if choice.installed is None:
        return validate_engine.validate_table("sglang", args, flags.SGLANG_TYPES, choice.table, choice.version)
    line = ["--model-path", str(model_dir), *argv(args), "--host", "0.0.0.0", "--port", str(port)]
    validation = validate_engine.validate_sglang(line, args, choice.installed.python)
    if unknown := validation.get("unknown"):
        from_user = [flag for flag in unknown if flag in extra]
        raise UsageError(f"SGLang {choice.version} has no option " + ", ".join(f"--{f}" for f in unknown)
                         + f" (checked by {validation['validated_by']}, {choice.installed.python})",
                         where="serve.extra_args" if from_user else "serve.engine_version",
                         fix="; ".join(f"--{f}: " + ("remove it from extra_args" if f in from_user else
                                                     "leave out the option that writes it") for f in unknown)
                         + " (a long option of `python -m sglang.launch_server --help`, without the leading --)")
    return validation


DIST_PORT = 20000  # the leader's port of torch.distributed's rendezvous (SGLang's docs and the LWS example)


def node_commands(launch: files.Launch, count: int) -> nodes.NodeCommands:
    """SGLang 0.5.23's multi-node launch (docs/references/multi_node_deployment): the same launch_server on
    every node with ``--nnodes``, ``--node-rank`` and ``--dist-init-addr <leader>:<port>``; node 0 serves HTTP."""
    line = nodes.shell_join([*launch.entrypoint, *launch.args, "--nnodes", "{nodes}", "--node-rank", "{rank}",
                             "--dist-init-addr", f"{{leader}}:{DIST_PORT}"])
    line += " " + files.key_words(launch).replace("{", "{{").replace("}", "}}")  # the key, when the shell has one
    return nodes.NodeCommands(count, f"exec {line}", f"exec {line}",
                              ("SGLang: every node runs launch_server with its --node-rank; node 0 serves HTTP.",))


def kv_bytes_dtype(options: SglangOptions) -> str:
    """The KV cache dtype in the memory model's terms."""
    return {"fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "bf16": "bfloat16"}.get(options.kv_cache_dtype, "auto")
