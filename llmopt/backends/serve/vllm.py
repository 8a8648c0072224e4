"""vLLM launch configs: ``vllm serve <model> --config config.yaml`` for the artifact.

The memory model (``llmopt.model.memory``) picks the parallel sizes, ``max_num_seqs``,
``max_num_batched_tokens`` and ``gpu_memory_utilization`` for the recipe's target GPU,
``max_model_len`` and workload; the quantization is read from the checkpoint's config.json.
The config is written for one vLLM release (``llmopt.deploy.versions``): ``engine_version``, else
the vLLM installed here (a Python named by option ``engine_python`` or ``LLMOPT_VLLM_PYTHON``,
``make vllm-env`` builds one; else the ``vllm`` on PATH), else 0.33.0. Its flags are checked against
llmopt's flag table of that release at plan time (0.33.0 and 0.26.0), and by vLLM's own parser
(``EngineArgs`` and ``create_engine_config``) at the deploy stage where that release is installed; the
config's header and the manifest say which. A flag the release lacks is a plan error (exit 2). The
image tag follows the release (``vllm/vllm-openai:v0.26.0``).
Needs: pyyaml (the ``deploy`` extra); vLLM itself only to validate, in its own environment.
Produces: ``deploy/vllm/config.yaml`` (long option names as keys), ``launch.sh``,
``docker-compose.yaml`` and ``kubernetes.yaml`` (image ``vllm/vllm-openai``); for a replica over
``[target] nodes`` > 1, a Ray cluster over the nodes (``llmopt.deploy.nodes``: per-node launch.sh,
leader/worker compose services, a LeaderWorkerSet).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal

from pydantic import Field

from llmopt.model import formats
from llmopt.deploy import validate_engine
from llmopt.model import memory
from llmopt.backends.base import PlanContext, ServeBackend, StageContext
from llmopt.deploy import extras, files, flags, inputs, nodes, speculative, versions
from llmopt.deploy.compat import YES, Rule
from llmopt.errors import Problem, StageFailed, UsageError
from llmopt.recipe.schema import SPECULATIVE_METHODS
from llmopt.registry import register

# the config keys of the parallel sizes the memory model plans, and the option that plans each
PARALLEL = {"tensor-parallel-size": "tensor_parallel_size", "pipeline-parallel-size": "pipeline_parallel_size",
            "data-parallel-size": "data_parallel_size"}
# GPUs of one server: vLLM 0.33's ParallelConfig.world_size (tp x pp x prefill context parallel) times the
# data-parallel ranks (world_size_across_dp), vllm/config/parallel.py
GPU_KEYS = ("tensor-parallel-size", "pipeline-parallel-size", "prefill-context-parallel-size", "data-parallel-size")
# the booleans llmopt plans, each a primary `--x` option of vLLM 0.33's EngineArgs
BOOLEANS = ("enable-chunked-prefill", "enable-prefix-caching", "enable-expert-parallel", "enforce-eager",
            "trust-remote-code")
# the image ships a non-root user `vllm` (UID 2000, GID 0, HOME /home/vllm, group-writable caches) that the
# default image does not switch to (vLLM's docker/Dockerfile, PR #40275, "Non-root support for vllm-openai")
IMAGE_USER = (2000, 0)
# the memory model's scheduler limits and memory share, and vLLM's option for each
LIMITS = {"max_num_seqs": "max-num-seqs", "max_num_batched_tokens": "max-num-batched-tokens",
          "memory_fraction": "gpu-memory-utilization"}

# What vLLM 0.33.0 loads, from its quantization configs: ``get_min_capability`` of each scheme
# (compressed-tensors W8A8 FP8 89 with a W8A16 FP8 Marlin fallback from 75, WNA16 75 with Marlin
# from 80, INT8 W8A8 75, NVFP4 75 with Blackwell-native W4A4; ModelOpt FP8 80, ModelOpt NVFP4 75).
# Sparse compressors raise a deprecation error. The ModelOpt loader (modelopt.py, QUANT_ALGOS)
# takes FP8, FP8_PER_CHANNEL_PER_TOKEN, FP8_PB_WO, NVFP4, W4A16_NVFP4, MXFP8 and MIXED_PRECISION
# checkpoints and raises for any other quant_algo: INT4 AWQ and INT8 SmoothQuant (W8A8_SQ_PER_CHANNEL).
MARLIN_INT4 = Rule("yes", "Marlin int4 kernels need CC 8.0; older GPUs get a slower kernel", (7, 5), (8, 0))
# Without FP4 compute vLLM picks its Marlin NVFP4 kernel and logs "Weight-only FP4 compression will be used
# leveraging the Marlin kernel", for compressed-tensors and ModelOpt NVFP4 alike.
NVFP4_NATIVE = Rule("yes", "NVFP4 computes in FP4 (W4A4) only on Blackwell (CC 10.0); on Hopper and older GPUs vLLM "
                    "runs it weight-only, the FP4 weights through its Marlin kernel with 16-bit activations (measured "
                    "on an H200 with vLLM 0.26: NVFP4A16, 452 output tok/s at one request in flight, TPOT 2.1 ms; "
                    "docs/results/accuracy.md, \"NVFP4 weights\")", (7, 5), (10, 0))
NOT_ONNX = Rule("no", "vLLM does not serve ONNX models", fix="use serve.backend = \"ort\"")
ACCEPTS: dict[formats.Format, Rule] = {
    formats.DENSE: YES,
    formats.SPARSE_2_4: Rule("no", "2:4 sparse checkpoints were removed from vLLM",
                             fix="leave out the 2:4 sparsity step, or choose another serve.backend"),
    formats.CT_W4A16: MARLIN_INT4,
    formats.CT_W4A16_GIDX: MARLIN_INT4,
    formats.CT_W8A16: Rule("yes", "Marlin kernels need CC 8.0; older GPUs get a slower kernel", (7, 5), (8, 0)),
    formats.CT_WNA16: Rule("undocumented", "vLLM documents compressed-tensors integer weights of 4 and 8 bits"),
    formats.CT_INT8: Rule("yes", "INT8 W8A8 needs CC 7.5", (7, 5)),
    formats.CT_FP8: Rule("yes", "FP8 W8A8 compute needs CC 8.9; older GPUs run it weight-only (FP8 Marlin)",
                         (7, 5), (8, 9)),
    formats.CT_NVFP4: NVFP4_NATIVE,
    formats.CT_NVFP4A16: Rule("yes", "FP4 Marlin kernels need CC 8.0", (7, 5), (8, 0)),
    formats.MODELOPT_FP8: Rule("yes", "ModelOpt FP8 compute needs CC 8.9; from 8.0 it runs weight-only",
                               (8, 0), (8, 9)),
    formats.MODELOPT_NVFP4: NVFP4_NATIVE,
    formats.MODELOPT_INT4_AWQ: Rule("no", "vLLM reads ModelOpt FP8 / NVFP4 / MXFP8 checkpoints, not INT4 AWQ",
                                    fix="use awq or gptq (compressed-tensors) for vLLM"),
    formats.MODELOPT_INT8_SQ: Rule("no", "vLLM's ModelOpt loader takes FP8, NVFP4, MXFP8 and mixed-precision "
                                   "checkpoints, not INT8 SmoothQuant (quant_algo W8A8_SQ_PER_CHANNEL)",
                                   fix="use int8_sq (compressed-tensors INT8 W8A8) for vLLM"),
    formats.ONNX_INT4: NOT_ONNX, formats.ONNX_INT8: NOT_ONNX, formats.ONNX_FLOAT: NOT_ONNX,
}


class VllmOptions(files.DeploymentOptions):
    gpu_memory_utilization: float | None = Field(
        None, gt=0.1, le=0.99, description="Share of each GPU vLLM may use (default: vLLM 0.33's own, 0.92).")
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = Field(
        "auto", description="KV cache precision; auto: the model's dtype, or fp8 when the checkpoint quantizes its KV.")
    tensor_parallel_size: int | None = Field(
        None, ge=1, description="GPUs one model copy is split over; default: the smallest size that fits.")
    pipeline_parallel_size: int = Field(1, ge=1, description="Pipeline stages (layers split across GPUs).")
    data_parallel_size: int | Literal["auto"] = Field(
        1, description="Model copies behind one server; auto: as many as the target's GPUs hold.")
    max_num_seqs: int | None = Field(
        None, ge=1, description="Sequences per step; default: vLLM's own for the GPU (1024 on 70 GiB+ GPUs but "
        "A100s, else 256), fewer when the KV cache holds fewer of the workload's sequences.")
    max_num_batched_tokens: int | None = Field(
        None, ge=16, description="Tokens per step (prefill chunk); default: vLLM's own for the GPU (8192 on "
        "70 GiB+ GPUs but A100s, else 2048), smaller when serve.slo.tpot_p99_ms needs shorter steps.")
    enable_chunked_prefill: bool = Field(True, description="Split long prompts into chunks that share steps with decodes.")
    enable_prefix_caching: bool = Field(True, description="Reuse the KV of shared prompt prefixes.")
    enforce_eager: bool = Field(False, description="Run without CUDA graphs (saves their memory, slower decode).")
    speculative_method: Literal[SPECULATIVE_METHODS] | None = Field(  # type: ignore[valid-type]
        None, description="Deprecated: [serve.speculative] method (read as it, with a warning).")
    speculative_model: str | None = Field(
        None, description="Deprecated: [serve.speculative] model.")
    num_speculative_tokens: int = Field(3, ge=1, le=16, description="Deprecated: [serve.speculative] num_tokens.")
    extra_args: dict[str, Any] = Field(
        default_factory=dict, description="Other `vllm serve` options by long name (e.g. {\"block-size\" = 32}); "
        "checked against the vLLM flag table.")
    override: list[str] = Field(
        default_factory=list, description="Keys of extra_args whose value wins over the one llmopt planned (e.g. "
        "[\"tensor-parallel-size\"]: the memory model then plans with it); an extra that contradicts a planned "
        "value is otherwise an error.")
    port: int = Field(8000, ge=1, le=65535, description="HTTP port of the server.")
    image: str = Field("vllm/vllm-openai", description="Container image of docker-compose.yaml and kubernetes.yaml.")
    tag: str | None = Field(None, description="Image tag; default: v<engine_version> (e.g. v0.26.0).")
    engine_version: str | None = Field(
        None, pattern=versions.PATTERN,
        description="vLLM release the config is written for (e.g. \"0.26.0\"); default: the vLLM installed here, "
        "else 0.33.0. Without it installed, it must be one llmopt has a flag table of (0.26.0, 0.33.0).")
    engine_python: str | None = Field(
        None, description="Python with vLLM installed, whose version and own parser check the config (default: "
        "$LLMOPT_VLLM_PYTHON, else the `vllm` on PATH; none: llmopt's flag table of engine_version).")


def vllm_quantization(quant: dict | None, gpu) -> str | None:
    """The ``--quantization`` vLLM would pick for the checkpoint's quantization_config."""
    if not quant:
        return None
    method = str(quant.get("quant_method", "")).lower()
    if method == "modelopt":
        algo = str(quant.get("quant_algo") or "").upper()
        return {"NVFP4": "modelopt_fp4", "W4A16_NVFP4": "modelopt_fp4", "MXFP8": "modelopt_mxfp8",
                "MIXED_PRECISION": "modelopt_mixed"}.get(algo, "modelopt")
    if method in ("awq", "gptq"):
        return f"{method}_marlin" if gpu is not None and gpu.cc >= (8, 0) else method
    return method if method in flags.VLLM_QUANTIZATION else None


def engine_choice(options: VllmOptions) -> tuple[versions.Choice, tuple[str, str, str] | None]:
    """The vLLM release the config is written for and, when a named Python has no vLLM, (what, where, fix)."""
    installed, bad = versions.installed_vllm(options.engine_python, validate_engine.ENV_VAR)
    stated = versions.normalized(options.engine_version) if options.engine_version else None
    return versions.choose("vLLM", stated, installed, flags.VLLM_TABLES, flags.VLLM_VERSION), bad


def spelled(config: dict, version: str) -> dict:
    """The config as the release reads it: ``no-x: true`` for a planned ``x: false`` where its config loader
    drops a false (``flags.VLLM_DROPS_FALSE``)."""
    if version not in flags.VLLM_DROPS_FALSE:
        return config
    return {(f"no-{k}" if v is False and k in BOOLEANS else k): (True if v is False and k in BOOLEANS else v)
            for k, v in config.items()}


def missing_flags(choice: versions.Choice, config: dict, extra: dict) -> list[tuple[str, str]]:
    """(flag, what to do) for each option of the config that llmopt's table of the release lacks."""
    from_user = set(extra) | set(spelled(extra, choice.version))
    out = []
    for flag in choice.missing(config):
        having = [v for v, names in sorted(flags.VLLM_TABLES.items()) if flag in names]
        fix = "remove it from extra_args" if flag in from_user else "leave out the option that writes it"
        out.append((flag, fix + (f", or write for a vLLM that has it (engine_version = \"{having[-1]}\")" if having
                                 else " (a long option of `vllm serve --help`, without the leading --)")))
    return out


def kv_cache_dtype(options: VllmOptions, quant: dict | None) -> str:
    if options.kv_cache_dtype != "auto" or not quant:
        return options.kv_cache_dtype
    scheme = quant.get("kv_cache_scheme") or {}
    if (scheme.get("type") == "float" and scheme.get("num_bits") == 8) or quant.get("kv_cache_quant_algo") == "FP8":
        return "fp8"
    return "auto"


def canonical(extra: dict) -> dict:
    """extra_args in vLLM's own spelling: long option names with hyphens, and a negation of a boolean llmopt
    plans (``no-x = true``, or ``disable-x = true`` of an ``--enable-x`` / ``--disable-x`` pair) as ``x = false``,
    so it meets the planned key it changes. Those keys are primary options with a ``--no-x`` form, so ``x = false``
    reaches vLLM (vLLM 0.33's BooleanOptionalAction, EnableDisableAction and load_config_file in
    vllm/utils/argparse_utils.py); other negations are kept as written."""
    out = {}
    for key, value in extra.items():
        key = key.replace("_", "-")
        positive = key[3:] if key.startswith("no-") else f"enable-{key[8:]}" if key.startswith("disable-") else None
        if isinstance(value, bool) and positive in BOOLEANS:
            key, value = positive, not value
        out[key] = value
    return out


def overrides(options: VllmOptions) -> list[str]:
    """The override entries in the same spelling as the keys of ``canonical``."""
    return [next(iter(canonical({name: True}))) for name in options.override]


def effective(options: VllmOptions) -> VllmOptions:
    """The options the memory model plans with: an overridden parallel size of extra_args wins."""
    update = extras.parallel_sizes(canonical(options.extra_args), overrides(options), PARALLEL)
    return options.model_copy(update=update) if update else options


def gpu_sizes(config: dict) -> dict[str, int]:
    return {key: config.get(key, 1) for key in GPU_KEYS}


def merged_config(options: VllmOptions, planned: memory.MemoryPlan, recipe, quant: dict | None, dtype: str,
                  kv_dtype: str, gpu) -> extras.Merged:
    """The planned config with extra_args laid over it (``llmopt.deploy.extras``)."""
    config = engine_config(options, planned, recipe, quant, dtype, kv_dtype, gpu)
    return extras.merge(config, canonical(options.extra_args), overrides(options))


def engine_config(options: VllmOptions, planned: memory.MemoryPlan, recipe, quant: dict | None, dtype: str,
                  kv_dtype: str, gpu) -> dict:
    """The keys of config.yaml that llmopt plans (vLLM's long option names)."""
    config: dict[str, Any] = {"served-model-name": recipe.name, "dtype": dtype}
    method = vllm_quantization(quant, gpu)
    if method:
        config["quantization"] = method
    if kv_dtype != "auto":
        config["kv-cache-dtype"] = kv_dtype
    config |= {
        "max-model-len": planned.max_model_len,
        "max-num-seqs": planned.max_num_seqs,
        "max-num-batched-tokens": planned.max_num_batched_tokens,
        "gpu-memory-utilization": planned.memory_fraction,
        "tensor-parallel-size": planned.tensor_parallel_size,
        "pipeline-parallel-size": planned.pipeline_parallel_size,
        "data-parallel-size": planned.data_parallel_size,
        "enable-chunked-prefill": options.enable_chunked_prefill,
        "enable-prefix-caching": options.enable_prefix_caching,
    }
    if planned.nodes > 1:  # vLLM 0.33 spans nodes through a Ray cluster (docs/serving/parallelism_scaling.md)
        config["distributed-executor-backend"] = "ray"
    if planned.expert_parallel_size > 1:
        config["enable-expert-parallel"] = True
    if options.enforce_eager:
        config["enforce-eager"] = True
    if recipe.model.trust_remote_code:
        config["trust-remote-code"] = True
    spec = speculative.vllm_config(speculative.spec_of(recipe, options))
    if spec:
        config["speculative-config"] = spec
    return config


RAY_PORT = 6379  # the Ray head's port (`ray start --head` default)


def node_commands(launch: files.Launch, count: int) -> nodes.NodeCommands:
    """A replica over ``count`` nodes as vLLM 0.33 documents it (docs/serving/parallelism_scaling.md and
    examples/online_serving/multi-node-serving.sh): a Ray cluster, its head on the leader, which then runs
    ``vllm serve`` with ``distributed-executor-backend: ray`` (config.yaml); the workers join the cluster and
    block. vLLM waits for the Ray placement group of tp x pp GPUs, so the workers may join after it starts."""
    serve = nodes.shell_join(launch.entrypoint + launch.args)
    return nodes.NodeCommands(
        count, f"ray start --head --port={RAY_PORT} && exec {serve}",
        f"exec ray start --block --address={{leader}}:{RAY_PORT}",
        ("vLLM: a Ray cluster of all nodes; the leader's vllm serve places tp x pp workers on it.",))


@register("serve", "vllm")
class VllmServe(ServeBackend):
    Options = VllmOptions
    requires = ()
    extra = "deploy"

    def accepts(self, options: VllmOptions) -> dict[formats.Format, Rule]:
        """What vLLM serves of each checkpoint format, on which GPUs (``ACCEPTS``)."""
        return ACCEPTS

    def key_material(self, options: VllmOptions) -> dict:
        """The release the config is written for, and whether its own parser checks it: a deploy stage cached
        before vLLM was installed here, or changed, is not reused."""
        choice, _ = engine_choice(options)
        return {"engine_version": choice.version, "parser": choice.installed is not None}

    def check(self, options: VllmOptions, ctx: PlanContext) -> list[Problem]:
        extra = canonical(options.extra_args)
        choice, bad = engine_choice(options)
        problems = versions.problems(choice, bad, ctx)
        problems += speculative.problems(speculative.of(ctx.recipe.recipe.serve, options), "vllm", choice.version,
                                         ctx, options)
        if not options.enable_chunked_prefill and options.max_num_batched_tokens is not None \
                and options.max_num_batched_tokens < ctx.recipe.recipe.serve.max_model_len:
            problems.append(Problem("without chunked prefill, max_num_batched_tokens must hold a whole prompt of "
                                    "max_model_len tokens", ctx.where("max_num_batched_tokens"),
                                    "raise it to max_model_len or enable chunked prefill"))
        options = effective(options)
        found, planned = inputs.plan_estimate(options, ctx, options.kv_cache_dtype, options.enforce_eager)
        merged = extras.Merged({})
        if planned is not None:
            recipe, quant = ctx.recipe.recipe, inputs.plan_quantization(ctx)
            merged = merged_config(options, planned, recipe, quant, inputs.model_dtype(recipe, ctx.model, ctx.gpu),
                                   kv_cache_dtype(options, quant), ctx.gpu)
            found += inputs.gpu_problems("vllm", gpu_sizes(merged.config), recipe.target, ctx.where("extra_args"))
        found += extras.problems(merged, overrides(options), extra, ctx.where("extra_args"), "extra_args", PARALLEL)
        if choice.error is None:
            config = spelled(merged.config or extra, choice.version)
            found += [Problem(f"vLLM {choice.version} has no option --{flag} (checked against {choice.table_name}"
                              f"; the version from {choice.source})",
                              ctx.where("extra_args" if flag.removeprefix("no-") in extra or flag in extra
                                        else "engine_version"), fix)
                      for flag, fix in missing_flags(choice, config, extra)]
        return problems + found

    def render(self, options: VllmOptions, ctx: StageContext) -> dict:
        recipe, model_dir, folder = ctx.recipe.recipe, ctx.model_dir, ctx.out_dir
        if ctx.gpu is None:
            raise UsageError("vLLM launch configs need a target GPU", fix=inputs.GPU_ENGINES_NEED_GPU)
        options = effective(options)
        info, weights, source = inputs.render_facts(ctx, model_dir)
        quant = inputs.checkpoint_quantization(model_dir)
        dtype = inputs.model_dtype(recipe, info, ctx.gpu)
        kv_dtype = kv_cache_dtype(options, quant)
        planned = inputs.memory_plan(recipe.serve, recipe.target, info, ctx.gpu, options, weights, source,
                                     memory.kv_dtype_bytes(kv_dtype, info, dtype), "serve", options.enforce_eager,
                                     inputs.draft_for(recipe, options, info, ctx.gpu,
                                                      inputs.draft_folder(ctx)))
        merged = merged_config(options, planned, recipe, quant, dtype, kv_dtype, ctx.gpu)
        extras.refuse(merged, "extra_args")
        choice, bad = engine_choice(options)
        refuse_version(choice, bad)
        config = spelled(merged.config, choice.version)
        refuse_flags(choice, config, canonical(options.extra_args), choice.table_name)
        drafted = own_draft_args(config)
        validation, choice = checked_config(choice, config, folder, model_dir, canonical(options.extra_args),
                                            f"{recipe.name}: `vllm serve <model> --config config.yaml`",
                                            inputs.summary(planned), inputs.limit_comments(planned, config, LIMITS,
                                                                                           "extra_args"))
        gpus = inputs.reserved(gpu_sizes(config))
        # vLLM's /health answers 503 once the engine is dead, and the server listens only after the engine is up
        # (vllm/entrypoints/serve/instrumentator/health.py): one route for readiness and liveness
        launch = files.Launch("vllm", recipe.name, f"{options.image}:{versions.image_tag(options.tag, choice.version)}",
                              ["vllm", "serve"],
                              ["{model}", "--config", "{config}/config.yaml", "--host", "0.0.0.0",
                               "--port", str(options.port), *drafted], options.port, gpus // planned.nodes, options,
                              # vLLM reads its key from VLLM_API_KEY (or --api-key) and leaves /health and
                              # /metrics open (vllm/entrypoints/openai/api_server.py, build_app)
                              user=IMAGE_USER, key_env="VLLM_API_KEY")
        commands = node_commands(launch, planned.nodes) if planned.nodes > 1 else None
        written = ["config.yaml", *(nodes.write_all(folder, launch, commands) if commands
                                    else files.write_all(folder, launch))]
        return {"engine": "vllm", "engine_version": choice.version, "engine_version_from": choice.source,
                "command": launch.command("."),
                "image": launch.image, "port": options.port, "files": [f"deploy/vllm/{f}" for f in written],
                "served_model_name": recipe.name, "gpus": gpus, "nodes": planned.nodes, "args": config,
                "quantization": config.get("quantization"), "memory": planned.to_dict(),
                "validated_by": validation["validated_by"],
                "warnings": planned.warnings + ([choice.warning] if choice.warning else [])}


def own_draft_args(config: dict) -> list[str]:
    """The speculative config of a draft the artifact carries, taken out of ``config`` onto the command line:
    its folder is known only where the command runs ({draft}, filled by the launch files); the rest of the JSON's
    braces doubled for them."""
    spec = config.get("speculative-config")
    if not spec or spec.get("model") != speculative.OWN_DRAFT:
        return []
    text = json.dumps(config.pop("speculative-config")).replace("{", "{{").replace("}", "}}")
    return ["--speculative-config", text.replace("{{draft}}", "{draft}")]


def checked_config(choice: versions.Choice, config: dict, folder, model_dir, extra: dict, what: str, summary: str,
                   comments) -> tuple[dict, versions.Choice]:
    """config.yaml written and checked by the release's own parser where it is installed, else by llmopt's table
    of it. A vLLM found on PATH that cannot build its parser here (a CUDA build on a machine without a GPU) leaves
    the check to the table, with a warning; an option the parser lacks is a plan error, a config it refuses fails
    the stage."""
    path = folder / "config.yaml"

    def write(checked_by: str) -> None:
        files.dump_yaml(config, path, f"# vLLM {choice.version} engine arguments for {what} (written by llmopt; "
                        f"version from {choice.source}; flags checked by {checked_by}; {summary}).", comments)

    write(choice.checked_by)
    validation = validate_engine.validate_vllm(path, model_dir, choice.installed and choice.installed.python,
                                               version=choice.version)
    if not validation["ok"] and validation.get("stage") in ("import", "parser") and choice.installed \
            and choice.installed.found_by.startswith("`vllm` on PATH") and choice.version in flags.VLLM_TABLES:
        reason = (validation["errors"] or ["no reason given"])[0]
        choice = dataclasses.replace(choice, installed=None, warning=(
            f"the vLLM {choice.version} on PATH ({choice.installed.python}) cannot build its parser here ({reason}); "
            f"the config was checked against llmopt's table of vLLM {choice.version}"))
        write(choice.checked_by)
        validation = validate_engine.validate_vllm(path, model_dir, None, version=choice.version)
    if validation.get("unknown"):
        refuse_flags(choice, {k: None for k in validation["unknown"]}, extra, validation["validated_by"],
                     everything=True)
    if not validation["ok"]:
        raise StageFailed(f"{validation['validated_by']} refused the vLLM config: " + "; ".join(validation["errors"]),
                          where=str(path), fix="adjust the [serve] options (or extra_args) named in the message")
    return validation, choice


def refuse_version(choice: versions.Choice, bad: tuple[str, str, str] | None) -> None:
    if bad:
        raise UsageError(bad[0], where=bad[1], fix=bad[2])
    if choice.error:
        raise UsageError(choice.error[0], where="serve.engine_version", fix=choice.error[1])


def refuse_flags(choice: versions.Choice, config: dict, extra: dict, checked_by: str, everything: bool = False) -> None:
    """A plan error naming each option of ``config`` the release lacks (all of them with ``everything``: the
    installed parser found them)."""
    found = ([(flag, "remove it from extra_args" if flag in extra else "leave out the option that writes it")
              for flag in config] if everything else missing_flags(choice, config, extra))
    if found:
        raise UsageError(f"vLLM {choice.version} has no option " + ", ".join(f"--{f}" for f, _ in found)
                         + f" (checked by {checked_by})", where="serve.extra_args" if any(
                             f in extra for f, _ in found) else "serve.engine_version",
                         fix="; ".join(f"--{f}: {fix}" for f, fix in found))
