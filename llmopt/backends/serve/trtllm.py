"""TensorRT-LLM launch configs: ``trtllm-serve <model> --backend pytorch --config config.yaml``.

The PyTorch backend serves Hugging Face checkpoints (plain or ModelOpt-quantized) without
an engine build. The memory model (``llmopt.model.memory``) picks the parallel sizes,
``max_batch_size``, ``max_num_tokens`` and the KV cache's share of the memory left after
the weights and activations (``kv_cache_config.free_gpu_memory_fraction``); ``extra`` is merged
into it deep (``llmopt.deploy.extras``). The YAML keys are ``TorchLlmArgs`` fields, checked
against the field table of TensorRT-LLM 1.2.1, where an unknown key is an error as it is for
TensorRT-LLM (TensorRT-LLM itself is not installed by llmopt). trtllm-serve names the model by
its folder, so the deployment files serve it from a folder named like the recipe. With
``[target] nodes`` > 1, tensor parallel within a node and pipeline parallel across nodes make one MPI
world that the leader's mpirun starts over SSH (``node_commands``; ``llmopt.deploy.nodes``: per-node
launch.sh, compose services, a LeaderWorkerSet).
Needs: pyyaml (the ``deploy`` extra).
Produces: ``deploy/trtllm/config.yaml``, ``launch.sh``, ``docker-compose.yaml`` and
``kubernetes.yaml`` (image ``nvcr.io/nvidia/tensorrt-llm/release``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from llmopt.deploy import validate_engine

from llmopt.model import formats, memory
from llmopt.backends.base import PlanContext, ServeBackend, StageContext
from llmopt.catalog import engines
from llmopt.deploy import extras, files, flags, inputs, nodes, speculative, versions
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
# the parallel sizes the memory model plans, and the option that plans each
PARALLEL = {"tensor_parallel_size": "tensor_parallel_size", "pipeline_parallel_size": "pipeline_parallel_size"}
# GPUs of one server: the world size of TensorRT-LLM's _ParallelConfig, tp x pp x cp (llmapi/llm_args.py);
# attention DP and expert parallelism split the tensor-parallel ranks
GPU_KEYS = ("tensor_parallel_size", "pipeline_parallel_size", "context_parallel_size")
# NVIDIA's documented `docker run` of the TensorRT-LLM release container (TensorRT-LLM quick start guide):
# --ulimit memlock=-1 --ulimit stack=67108864 (and --ipc host, for which compose's shm_size stands here)
ULIMITS = {"memlock": -1, "stack": 67108864}
# the memory model's scheduler limits, and TorchLlmArgs' field for each
LIMITS = {"max_num_seqs": "max_batch_size", "max_num_batched_tokens": "max_num_tokens"}


# A replica over several nodes is one MPI world of tp x pp ranks (TensorRT-LLM's multi-node examples,
# examples/llm-api/llm_mgmn_trtllm_serve.sh): every rank runs `trtllm-llmapi-launch trtllm-serve ...`; rank 0 serves
# HTTP and drives the others, which wait for its work (tensorrt_llm/llmapi/trtllm-llmapi-launch). NVIDIA's examples
# start the world with Slurm's `srun --mpi=pmix`; without Slurm, Open MPI's mpirun on the leader starts the ranks of
# the other nodes over SSH, so the workers run an SSH server. It listens on SSH_PORT, not 22, which the host's own
# sshd holds under host networking.
SSH_PORT = 2222
HOSTFILE = "/tmp/llmopt-hostfile"
NO_SSHD = ("the NGC TensorRT-LLM release image is not documented to run an SSH server, which the workers of a "
           "replica over several nodes run for the leader's mpirun")
NO_SSHD_FIX = ("build an image FROM it with openssh-server and a key pair the leader's root can log in with "
               "(~/.ssh/id_* and authorized_keys), and set image and tag to it")


class TrtllmOptions(files.DeploymentOptions):
    gpu_memory_utilization: float | None = Field(
        None, gt=0.1, le=0.99, description="Share of each GPU the server may use in total; llmopt turns it into "
        "kv_cache_config.free_gpu_memory_fraction (default: TensorRT-LLM's own, 0.9 of the memory the weights and "
        "activations leave).")
    kv_cache_dtype: Literal["auto", "fp8"] = Field(
        "auto", description="KV cache precision; auto: the model's dtype, or fp8 when the checkpoint quantizes its KV.")
    tensor_parallel_size: int | None = Field(
        None, ge=1, description="GPUs one model copy is split over; default: the smallest size that fits.")
    pipeline_parallel_size: int = Field(1, ge=1, description="Pipeline stages (layers split across GPUs).")
    max_num_seqs: int | None = Field(
        None, ge=1, description="max_batch_size; default: TensorRT-LLM's own (2048), fewer when the KV cache holds "
        "fewer of the workload's sequences.")
    max_num_batched_tokens: int | None = Field(
        None, ge=16, description="max_num_tokens per step; default: TensorRT-LLM's own (8192), smaller when "
        "serve.slo.tpot_p99_ms needs shorter steps.")
    enable_chunked_prefill: bool = Field(True, description="Split long prompts into chunks.")
    enable_block_reuse: bool = Field(True, description="Reuse the KV blocks of shared prompt prefixes.")
    cuda_graphs: bool = Field(True, description="Capture CUDA graphs for decode batches (cuda_graph_config).")
    disable_overlap_scheduler: bool = Field(False, description="Turn off the overlap scheduler (lower throughput).")
    enable_attention_dp: bool = Field(False, description="Data-parallel attention (for MoE models at high concurrency).")
    moe_backend: str | None = Field(None, description="moe_config.backend, e.g. CUTLASS, TRTLLM, DEEPGEMM (MoE only).")
    extra: dict[str, Any] = Field(
        default_factory=dict, description="Other TorchLlmArgs keys merged into config.yaml, deep for tables "
        "(e.g. {kv_cache_config = {dtype = \"fp8\"}}); unknown keys are errors.")
    override: list[str] = Field(
        default_factory=list, description="Keys of extra (dotted for tables, e.g. "
        "\"kv_cache_config.free_gpu_memory_fraction\") whose value wins over the one llmopt planned; an extra that "
        "contradicts a planned value is otherwise an error.")
    port: int = Field(8000, ge=1, le=65535, description="HTTP port of the server.")
    image: str = Field("nvcr.io/nvidia/tensorrt-llm/release", description="Container image of the deployment files.")
    tag: str | None = Field(None, description="Image tag; default: <engine_version> (1.2.1).")
    engine_version: str | None = Field(
        None, pattern=versions.PATTERN,
        description=f"TensorRT-LLM release the config is written for; llmopt has a flag table of "
        f"{flags.TRTLLM_VERSION} (the default) only.")


def kv_fraction(planned: memory.MemoryPlan) -> float:
    """free_gpu_memory_fraction: the KV budget as a share of what is free after weights and overheads
    (TensorRT-LLM's own 0.9 unless the recipe sets gpu_memory_utilization)."""
    return planned.memory_fraction


def graph_batch(planned: memory.MemoryPlan) -> int:
    """Largest decode batch with a CUDA graph: TensorRT-LLM's own 128 (CudaGraphConfig without a
    max_batch_size), or max_batch_size when that is smaller (no graph for a batch that cannot run)."""
    return min(planned.max_num_seqs, engines.ENGINE_DEFAULTS["trtllm"]["cuda_graph_max_batch_size"])


def comments(planned: memory.MemoryPlan, config: dict) -> dict[str, str]:
    """Why max_batch_size, max_num_tokens, the KV share and the graphs have their values."""
    out = inputs.limit_comments(planned, config, LIMITS, "extra")
    kv = config.get("kv_cache_config") or {}
    if kv.get("free_gpu_memory_fraction") == kv_fraction(planned):
        why = planned.reasons.get("memory_fraction") or f"TensorRT-LLM {flags.TRTLLM_VERSION}'s own default"
        out["kv_cache_config"] = f"kv_cache_config.free_gpu_memory_fraction: {why}"
    graphs = config.get("cuda_graph_config") or {}
    if graphs.get("max_batch_size") == graph_batch(planned):
        out["cuda_graph_config"] = (f"cuda_graph_config: graphs for decode batches up to {graph_batch(planned)} "
                                    "(TensorRT-LLM's own limit without max_batch_size is 128), padded to the next one")
    return out


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
        config["cuda_graph_config"] = {"enable_padding": True, "max_batch_size": graph_batch(planned)}
    if options.moe_backend:
        config["moe_config"] = {"backend": options.moe_backend}
    if recipe.model.trust_remote_code:
        config["trust_remote_code"] = True
    spec = speculative.trtllm_config(speculative.spec_of(recipe))
    if spec:
        config["speculative_config"] = spec
    return config


def effective(options: TrtllmOptions) -> TrtllmOptions:
    """The options the memory model plans with: an overridden parallel size of ``extra`` wins."""
    update = {field: options.extra[key] for key, field in PARALLEL.items() if key in options.override
              and isinstance(options.extra.get(key), int) and not isinstance(options.extra[key], bool)
              and options.extra[key] >= 1}
    return options.model_copy(update=update) if update else options


def merged_config(options: TrtllmOptions, planned: memory.MemoryPlan, recipe, dtype: str,
                  kv_dtype: str) -> extras.Merged:
    merged = extras.merge(engine_config(options, planned, recipe, dtype, kv_dtype), options.extra, options.override)
    graphs, theirs = merged.config.get("cuda_graph_config"), options.extra.get("cuda_graph_config") or {}
    if isinstance(graphs, dict) and theirs.get("batch_sizes") and "max_batch_size" not in theirs:
        # with both set, CudaGraphConfig requires max_batch_size == max(batch_sizes) (BaseCudaGraphConfig)
        graphs["max_batch_size"] = max(theirs["batch_sizes"])
    return merged


def node_commands(launch: files.Launch, count: int) -> nodes.NodeCommands:
    """A replica over ``count`` nodes as one MPI world: the workers run an SSH server; the leader waits until each
    answers, writes an Open MPI hostfile (``slots`` = GPUs of a node, the leader first, so rank 0 and the HTTP server
    are on it) and runs every rank of ``trtllm-llmapi-launch trtllm-serve`` under mpirun. mpirun is called by its
    absolute path, which Open MPI takes as ``--prefix`` (mpirun(1)), so the ranks it starts over SSH find Open MPI
    without the image's environment; ``-x`` passes PATH and LD_LIBRARY_PATH on to them."""
    world = count * launch.gpus
    serve = nodes.shell_join(["trtllm-llmapi-launch", *launch.entrypoint, *launch.args])
    wait = (f"for host in {{workers}}; do until (exec 3<>/dev/tcp/$host/{SSH_PORT}) 2>/dev/null; do sleep 2; done; "
            "done")
    hostfile = f"printf '%s slots={launch.gpus}\\n' {{leader}} {{workers}} > {HOSTFILE}"
    mpirun = (f"exec `command -v mpirun` --allow-run-as-root --hostfile {HOSTFILE} -np {world} --mca plm_rsh_args "
              f"'-p {SSH_PORT} -o StrictHostKeyChecking=no' -x PATH -x LD_LIBRARY_PATH {serve}")
    return nodes.NodeCommands(
        count, f"{wait} && {hostfile} && {mpirun}",
        f"mkdir -p /run/sshd && ssh-keygen -A && exec /usr/sbin/sshd -D -e -p {SSH_PORT}",
        (f"TensorRT-LLM: one MPI world of {world} ranks (tp x pp); the leader's mpirun starts those of the "
         f"workers over SSH (port {SSH_PORT}).",
         "The workers run /usr/sbin/sshd: the image needs openssh-server and a key pair root logs in with (the NGC "
         "release image is not documented to ship them).",
         "On the leader, WORKER_ADDRESSES lists the workers' addresses (the LeaderWorkerSet derives them from "
         "LWS_LEADER_ADDRESS)."))


def gpu_sizes(config: dict) -> dict[str, int]:
    return {key: config.get(key, 1) for key in GPU_KEYS}


def table_errors(extra: dict) -> list[str]:
    return validate_engine.check_flags(extra, flags.TRTLLM_TYPES, flags.TRTLLM_FIELDS,
                                       nested=flags.TRTLLM_NESTED_FIELDS)[0]


@register("serve", "trtllm")
class TrtllmServe(ServeBackend):
    Options = TrtllmOptions
    requires = ()
    extra = "deploy"

    def accepts(self, options: TrtllmOptions) -> dict[formats.Format, Rule]:
        """What trtllm-serve serves of each checkpoint format, on which GPUs (``ACCEPTS``)."""
        return ACCEPTS

    def check(self, options: TrtllmOptions, ctx: PlanContext) -> list[Problem]:
        choice = versions.table_choice("TensorRT-LLM", options.engine_version, flags.TRTLLM_TABLES,
                                       flags.TRTLLM_VERSION)
        version_problems = [Problem(choice.error[0], ctx.where("engine_version"), choice.error[1])] \
            if choice.error else []
        problems = []
        if ctx.recipe.recipe.target.nodes > 1 and options.image == TrtllmOptions.model_fields["image"].default:
            problems.append(Problem(NO_SSHD, ctx.where("image"), NO_SSHD_FIX, severity="warning"))
        if options.moe_backend and ctx.model is not None and not ctx.model.num_experts:
            problems.append(Problem("moe_backend is set but the model has no experts", ctx.where("moe_backend"),
                                    "remove moe_backend", severity="warning"))
        problems += [Problem(f"TensorRT-LLM {flags.TRTLLM_VERSION}: {e}", ctx.where("extra"),
                             "use a TorchLlmArgs field (TensorRT-LLM's LLM API reference); its models refuse "
                             "unknown keys") for e in table_errors(options.extra)]
        options = effective(options)
        found, planned = inputs.plan_estimate(options, ctx, options.kv_cache_dtype, not options.cuda_graphs)
        merged = extras.Merged({})
        if planned is not None:
            recipe, quant = ctx.recipe.recipe, inputs.plan_quantization(ctx)
            merged = merged_config(options, planned, recipe, inputs.model_dtype(recipe, ctx.model, ctx.gpu),
                                   trtllm_kv_dtype(options, quant))
            found += inputs.gpu_problems("trtllm", gpu_sizes(merged.config), recipe.target, ctx.where("extra"))
        problems = version_problems + problems + speculative.problems(
            speculative.of(ctx.recipe.recipe.serve), "trtllm", choice.version, ctx)
        return problems + found + extras.problems(merged, options.override, options.extra, ctx.where("extra"),
                                                  "extra", PARALLEL)

    def render(self, options: TrtllmOptions, ctx: StageContext) -> dict:
        recipe, model_dir, folder = ctx.recipe.recipe, ctx.model_dir, ctx.out_dir
        choice = versions.table_choice("TensorRT-LLM", options.engine_version, flags.TRTLLM_TABLES,
                                       flags.TRTLLM_VERSION)
        if choice.error:
            raise UsageError(choice.error[0], where="serve.engine_version", fix=choice.error[1])
        if ctx.gpu is None:
            raise UsageError("TensorRT-LLM launch configs need a target GPU", fix=inputs.GPU_ENGINES_NEED_GPU)
        options = effective(options)
        info, weights, source = inputs.render_facts(ctx, model_dir)
        quant = inputs.checkpoint_quantization(model_dir)
        dtype = inputs.model_dtype(recipe, info, ctx.gpu)
        kv_dtype = trtllm_kv_dtype(options, quant)
        planned = inputs.memory_plan(recipe.serve, recipe.target, info, ctx.gpu, options, weights, source,
                                     memory.kv_dtype_bytes(kv_dtype, info, dtype), "serve", not options.cuda_graphs,
                                     inputs.draft_for(recipe, options, info, ctx.gpu,
                                                      inputs.draft_folder(ctx)))
        merged = merged_config(options, planned, recipe, dtype, kv_dtype)
        extras.refuse(merged, "extra")
        config = merged.config
        validation = validate_engine.validate_table("trtllm", config, flags.TRTLLM_TYPES, flags.TRTLLM_FIELDS,
                                                    flags.TRTLLM_VERSION, flags.TRTLLM_NESTED_FIELDS)
        validation["errors"] += validate_engine.shape_errors(info, config.get("tensor_parallel_size", 1),
                                                             planned.max_model_len, planned.max_num_seqs,
                                                             planned.max_num_batched_tokens, True)
        if validation["errors"]:
            raise StageFailed("the TensorRT-LLM config fails its flag table: " + "; ".join(validation["errors"]),
                              where="serve", fix="adjust the [serve] options named in the message")
        files.dump_yaml(config, folder / "config.yaml", f"# TensorRT-LLM {flags.TRTLLM_VERSION} TorchLlmArgs for "
                        f"{recipe.name}: `trtllm-serve <model> --backend pytorch --config config.yaml` (written by "
                        f"llmopt; {inputs.summary(planned)}).", comments(planned, config))
        gpus = inputs.reserved(gpu_sizes(config))
        launch = files.Launch(
            "trtllm", recipe.name, f"{options.image}:{versions.image_tag(options.tag, choice.version, '')}",
            ["trtllm-serve"],
            ["{model}", "--backend", "pytorch", "--config", "{config}/config.yaml", "--host", "0.0.0.0",
             "--port", str(options.port)], options.port, gpus // planned.nodes, options,
            # trtllm-serve's /health asks the executor whether it is alive; /health_generate runs a generation
            # (tensorrt_llm/serve/openai_server.py, register_routes)
            ready_path="/health", live_path="/health",
            # the NGC image's ENTRYPOINT (/opt/nvidia/nvidia_entrypoint.sh of the nvcr.io/nvidia/pytorch base,
            # docker/Dockerfile.multi) sets up the CUDA environment: the command goes to it as arguments
            keep_entrypoint=True, ulimits=ULIMITS,
            # trtllm-serve 1.2.1 has no --served_model_name (added on main by PR #11711, 2026, after the
            # release/1.2 branch); it names a local model folder by its basename (openai_server.py:
            # model_dir.name), so the model is served from a folder named like the recipe
            served_dir=True)
        # trtllm-serve 1.2.1 has no API key option (tensorrt_llm/commands/serve.py): key_env stays None, and the
        # files say that only the address it is published on, or a proxy in front, protects it
        commands = node_commands(launch, planned.nodes) if planned.nodes > 1 else None
        written = ["config.yaml", *(nodes.write_all(folder, launch, commands) if commands
                                    else files.write_all(folder, launch))]
        return {"engine": "trtllm", "engine_version": choice.version,
                "command": "deploy/trtllm/launch.sh", "launch": "deploy/trtllm/launch.sh",
                "image": launch.image, "port": options.port, "files": [f"deploy/trtllm/{f}" for f in written],
                "served_model_name": recipe.name, "gpus": gpus, "nodes": planned.nodes, "args": config,
                "quantization": (quant or {}).get("quant_method"), "memory": planned.to_dict(),
                "validated_by": validation["validated_by"], "warnings": planned.warnings + validation["warnings"]}
