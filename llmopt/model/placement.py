"""Where the compress stage holds the model, planned from config facts and the machine, never discovered.

Three placements, each the compression library's own mechanism (llmopt moves no weights itself):

* ``gpu``: the whole model on one GPU; calibration runs layer by layer (llm-compressor's sequential
  pipeline keeps the cached activations between layers in host memory).
* ``onload``: the weights stay in host memory and the library onloads one decoder layer at a time to the
  GPU (llm-compressor: a model left on the CPU, whose modules its sequential / datafree pipelines offload
  with ``set_onload_device`` and onload around each layer's forward pass).
* ``multi_gpu``: the weights spread over the machine's GPUs by a device map (``device_map="auto"``),
  each layer computed where it lies.

``footprint`` predicts each one's peak GPU memory (per GPU, as ``torch.cuda.max_memory_allocated``
counts it), peak host memory (resident set, mapped weight files included) and a time class; ``choose``
takes the first that fits, or the forced one, and says what does not fit. The constants are fitted to the
H200 runs in docs/benchmarks.md; docs/architecture.md describes the model.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from llmopt.catalog.gpus import GPU
from llmopt.model.modelinfo import DTYPE_BYTES, ModelInfo

PLACEMENTS = ("gpu", "onload", "multi_gpu")
GIB = 2**30
# Constants measured on the H200 runs of docs/benchmarks.md (llm-compressor 0.14.0.1, torch 2.11, transformers 5.17)
HOST_BASE = int(1.0 * GIB)  # Python, torch, transformers and the library imported, CUDA initialised
GPU_USABLE = 0.92  # share of a GPU's memory a plan fills: the CUDA context and fragmentation take the rest
HOST_USABLE = 0.90
HESSIAN_BYTES = 4  # GPTQ's Hessian per input-column pair, float32
MOE_HESSIAN_FACTOR = 2.95  # an expert layer calibrated with every expert seeing every token holds this many
#                            times its experts' Hessian bytes (fitted to the Mixtral-shape runs; not explained)
GPTQ_TEMP = 3  # GPTQ's temporaries of the module it is quantizing: float32 weight, its error and Q, per value,
#               and two float32 matrices of its Hessian's size (the inverse, its Cholesky factor)
DATAFREE_TEMP = 3  # bytes per value of the module being quantized without data (FP8): its copies in flight
CACHE_BYTES = 2  # cached activations between layers, in the model dtype (bfloat16)
# Seconds of a compress stage: a fixed start, then per billion parameters (weights read, quantized, saved),
# per billion parameters and thousand calibration tokens (GPTQ), and host-to-GPU copies when onloading.
TIME_START_S = 10.0
TIME_PER_BPARAM_S = {"datafree": 2.0, "calibrating": 5.0}
TIME_PER_BPARAM_KTOKEN_S = 0.02
ONLOAD_GBS = 2.5  # effective host-to-GPU rate of the sequential onloading (pageable copies, not overlapped), GB/s
TIME_CLASSES = ((60, "under a minute"), (600, "minutes"), (3600, "tens of minutes"), (6 * 3600, "hours"))


@dataclass(frozen=True)
class Machine:
    """The machine that compresses: ``count`` GPUs of one kind (None: CPU), host memory and free disk."""

    gpu: GPU | None
    count: int = 1
    host_ram_bytes: int | None = None  # None: unknown, not judged
    disk_bytes: int | None = None


@dataclass(frozen=True)
class Work:
    """What the compress stage does: ``calibrates`` with ``tokens`` (samples x sequence length, in sequences of
    ``seq_len``), with a ``hessian`` per linear (GPTQ, SparseGPT), writing ``out_bytes`` to disk."""

    dtype: str = "bfloat16"
    calibrates: bool = False
    hessian: bool = False
    samples: int = 0
    seq_len: int = 0
    out_bytes: int = 0  # the folder the stage writes
    out_linear_bytes: int = 0  # its decoder linears, quantized: held in host memory beside the weights when onloading
    download_bytes: int = 0  # a hub source is fetched to the disk first


@dataclass
class Footprint:
    placement: str
    devices: int
    gpu_bytes: int  # peak on the busiest GPU
    host_bytes: int
    disk_bytes: int
    seconds: float
    time_class: str
    short: list[str] = field(default_factory=list)  # what does not fit, in words (empty: it fits)

    @property
    def fits(self) -> bool:
        return not self.short

    def to_dict(self) -> dict:
        return asdict(self) | {"fits": self.fits}


def layer_bytes(info: ModelInfo, dtype: str) -> int:
    """Weights of the largest decoder layer (every expert of a MoE layer, its router and norms)."""
    size = DTYPE_BYTES.get(dtype, 2)
    router = info.num_experts * info.hidden_size if info.moe_layers else 0
    return (info.linear_params_per_layer + router + 2 * info.hidden_size) * size


def layer_linears(info: ModelInfo) -> list[tuple[int, int]]:
    """(rows, cols) of every linear of the largest decoder layer (one entry per expert)."""
    attention = [(rows, cols) for kind, rows, cols, _ in info.linears() if kind in ("q_proj", "k_proj", "v_proj", "o_proj")]
    h = info.hidden_size
    if info.moe_layers:
        mlp = [(info.expert_width, h), (info.expert_width, h), (h, info.expert_width)] \
            * (info.num_experts + info.shared_experts)
    else:
        mlp = [(info.intermediate_size, h), (info.intermediate_size, h), (h, info.intermediate_size)]
    return attention + mlp


def expert_bytes(info: ModelInfo, dtype: str) -> int:
    """Weights of every routed and shared expert of the model. transformers 5 holds a MoE layer's experts fused
    in 3-D tensors; llm-compressor turns them into one linear per expert (``linearize_moe``), a second copy
    of them all while it runs."""
    count = info.moe_layers * (info.num_experts + info.shared_experts)
    return count * 3 * info.hidden_size * info.expert_width * DTYPE_BYTES.get(dtype, 2)


def layer_work_bytes(info: ModelInfo, work: Work) -> int:
    """GPU memory one layer's calibration needs beyond its weights: the Hessians of all its linears at once
    (an expert layer's scaled by ``MOE_HESSIAN_FACTOR``), the temporaries of the module being quantized, and
    one sequence's activations through the layer."""
    linears = layer_linears(info)
    if not work.calibrates:
        return max(rows * cols for rows, cols in linears) * DATAFREE_TEMP
    hessians, temps = 0, max(rows * cols for rows, cols in linears) * 4
    if work.hessian:
        attention = sum(cols * cols for _, cols in linears[:-3 * max(1, info.num_experts + info.shared_experts)])
        mlp = sum(cols * cols for _, cols in linears) - attention
        hessians = int((attention + mlp * (MOE_HESSIAN_FACTOR if info.moe_layers else 1)) * HESSIAN_BYTES)
        temps = max(rows * cols * GPTQ_TEMP * 4 + 2 * cols * cols * 4 for rows, cols in linears)
    width = max(info.intermediate_size, info.expert_width * max(info.experts_per_token, 1), info.hidden_size)
    activations = work.seq_len * (3 * width + 4 * info.hidden_size) * 4
    return hessians + temps + activations


def cache_bytes(info: ModelInfo, work: Work) -> int:
    """The activations the sequential pipeline keeps between layers, for every sample, in host memory
    (inputs and outputs of the layer being calibrated)."""
    return 2 * work.samples * work.seq_len * info.hidden_size * CACHE_BYTES if work.calibrates else 0


def seconds(info: ModelInfo, work: Work, placement: str, weights: int) -> float:
    bparams = info.total_params / 1e9
    rate = TIME_PER_BPARAM_S["calibrating" if work.calibrates else "datafree"]
    out = TIME_START_S + bparams * rate
    if work.hessian:
        out += bparams * work.samples * work.seq_len / 1000 * TIME_PER_BPARAM_KTOKEN_S
    if placement == "onload":
        passes = 2 if work.calibrates else 1  # calibrate, then propagate the quantized layer's outputs
        out += passes * weights / (ONLOAD_GBS * 1e9)
    return out


def time_class(secs: float) -> str:
    return next((name for limit, name in TIME_CLASSES if secs < limit), "a day or more")


def footprint(info: ModelInfo, work: Work, machine: Machine, placement: str) -> Footprint:
    """The predicted peaks of one placement on ``machine``, and what of it does not fit."""
    from llmopt.model.estimates import float_weight_bytes

    weights = float_weight_bytes(info, work.dtype)
    layer = layer_bytes(info, work.dtype)
    tables = info.vocab_size * info.hidden_size * DTYPE_BYTES.get(work.dtype, 2) * (1 if info.tie_embeddings else 2)
    experts = expert_bytes(info, work.dtype)
    busy = layer_work_bytes(info, work)
    cache = cache_bytes(info, work)
    devices = machine.count if placement == "multi_gpu" else 1
    if placement == "gpu":  # loaded on the host, moved whole; experts linearized on the GPU, all at once
        gpu = max(weights + experts, weights + busy)
        host = HOST_BASE + weights + experts + cache
    elif placement == "onload":  # one layer (or, without data, the embedding and head tables) on the GPU
        gpu = (layer if work.calibrates else tables) + busy
        host = HOST_BASE + weights + max(work.out_linear_bytes, 2 * experts) + cache
    else:  # whole layers per GPU: the first GPU also holds the embedding and head tables
        per_gpu = math.ceil(max(weights - tables, 0) / max(layer, 1) / devices) * layer + tables
        gpu = per_gpu + max(experts // devices, busy)
        host = HOST_BASE + cache + layer + experts
    secs = seconds(info, work, placement, weights)
    out = Footprint(placement, devices, int(gpu), int(host), work.out_bytes + work.download_bytes, round(secs),
                    time_class(secs))
    out.short = shortfalls(out, machine)
    return out


def shortfalls(fp: Footprint, machine: Machine) -> list[str]:
    short = []
    if machine.gpu is None:
        return ["no GPU on the compute machine"]
    if fp.placement == "multi_gpu" and machine.count < 2:
        short.append("multi_gpu needs at least 2 GPUs (compute.count)")
    room = machine.gpu.memory_bytes * GPU_USABLE
    if fp.gpu_bytes > room:
        short.append(f"{fp.gpu_bytes / GIB:.1f} GiB on a GPU, more than {room / GIB:.1f} GiB usable of one "
                     f"{machine.gpu.name}")
    if machine.host_ram_bytes is not None and fp.host_bytes > machine.host_ram_bytes * HOST_USABLE:
        short.append(f"{fp.host_bytes / GIB:.1f} GiB of host memory, more than {HOST_USABLE:.0%} of the "
                     f"{machine.host_ram_bytes / GIB:.0f} GiB there")
    if machine.disk_bytes is not None and fp.disk_bytes > machine.disk_bytes:
        short.append(f"{fp.disk_bytes / GIB:.1f} GiB of disk, more than the {machine.disk_bytes / GIB:.0f} GiB free")
    return short


def choose(info: ModelInfo, work: Work, machine: Machine, forced: str = "auto") -> tuple[Footprint, list[Footprint]]:
    """The placement the compress stage uses (the forced one, or the first of ``PLACEMENTS`` that fits;
    when none fits, the one that comes closest) and the footprint of every placement tried."""
    names = [p for p in PLACEMENTS if p != "multi_gpu" or machine.count > 1] if forced == "auto" else [forced]
    tried = [footprint(info, work, machine, name) for name in names]
    fitting = [fp for fp in tried if fp.fits]
    return (fitting[0] if fitting else min(tried, key=lambda fp: len(fp.short))), tried


def refusal_fix(info: ModelInfo, work: Work, machine: Machine, tried: list[Footprint]) -> str:
    """What to change when no placement fits."""
    fixes = []
    if any("GPU" in s for fp in tried for s in fp.short):
        fixes.append("a GPU with more memory (compute.gpu) or more GPUs (compute.count, placement multi_gpu)")
    if any("host memory" in s for fp in tried for s in fp.short):
        fixes.append("more host memory (compute.host_ram_gib), or GPUs that hold the weights together (multi_gpu)")
    if work.calibrates:
        fixes.append("fewer calibration samples or a shorter calibration.max_seq_len")
    if any("disk" in s for fp in tried for s in fp.short):
        fixes.append("a cache on a larger disk (--cache-dir)")
    return "; or ".join(fixes)


def machine_of(recipe) -> Machine:
    """The compute machine a recipe describes. Host memory and disk are judged only where [compute] gives
    them: the plan may run on another machine than the stage."""
    from llmopt.catalog.gpus import find_gpu

    compute = recipe.compute
    name = compute.gpu or recipe.target.gpu
    ram = int(compute.host_ram_gib * GIB) if compute.host_ram_gib else None
    disk = int(compute.disk_gib * GIB) if compute.disk_gib else None
    return Machine(find_gpu(name) if name else None, compute.count, ram, disk)


def work_of(recipe, info: ModelInfo, steps: list, out: dict | None = None) -> Work:
    """The compress stages' work: each step's backend (``CompressBackend``: whether it calibrates, builds
    Hessians), the heaviest deciding; ``out``: the size model's estimate of the folder the last one writes
    (``estimates.size``)."""
    from llmopt.model.hub import is_hub_id
    from llmopt.model.estimates import float_weight_bytes, model_dtype

    dtype = model_dtype(recipe, info)
    calibrates = any(step.calibrates for step in steps)
    cal = recipe.calibration
    out = out or {}
    return Work(dtype, calibrates, any(step.builds_hessians for step in steps), cal.samples if calibrates else 0,
                cal.max_seq_len if calibrates else 0, out.get("bytes", 0),
                out.get("parts", {}).get("decoder linears", 0),
                float_weight_bytes(info, dtype) if is_hub_id(recipe.model.source) else 0)


def plan_placement(loaded, info: ModelInfo, steps: list, out: dict | None):
    """The plan's placement of the compress stage: (estimates entry, problems). No GPU named: no placement."""
    from llmopt.errors import Problem

    recipe = loaded.recipe
    machine = machine_of(recipe)
    work = work_of(recipe, info, steps, out)
    if machine.gpu is None:
        return None, moe_problems(loaded, info, work, steps)
    chosen, tried = choose(info, work, machine, recipe.compute.placement)
    entry = {"chosen": chosen.placement, "gpu": machine.gpu.name, "count": machine.count,
             "host_ram_bytes": machine.host_ram_bytes, "disk_bytes": machine.disk_bytes,
             "placements": {fp.placement: fp.to_dict() for fp in tried}}
    problems = []
    if not chosen.fits:
        what = "; ".join(f"{fp.placement}: {', '.join(fp.short)}" for fp in tried)
        problems.append(Problem(f"the compress stage does not fit the compute machine ({what})",
                                loaded.where("compute", "placement"), refusal_fix(info, work, machine, tried)))
        entry["chosen"] = None
    return entry, problems + moe_problems(loaded, info, work, steps)


def moe_problems(loaded, info: ModelInfo, work: Work, steps: list) -> list:
    """A MoE model calibrated on too few tokens for its experts. llm-compressor sends every calibration token
    through every expert (``moe_calibrate_all_experts``, on by default), so each expert sees all of them;
    ModelOpt's backends calibrate experts on the tokens routed to them (about tokens x top-k / experts). An
    expert's Hessian (GPTQ) or ranges need at least its input width of tokens."""
    from llmopt.errors import Problem

    if not (info.num_experts and work.calibrates):
        return []
    tokens = work.samples * work.seq_len
    routed = any(step.calibrates and step.expert_tokens == "routed" for step in steps)
    need = max(info.hidden_size, info.expert_width)
    share = max(info.experts_per_token, 1) / info.num_experts if routed else 1.0
    per_expert = int(tokens * share)
    if per_expert >= need:
        return []
    samples = math.ceil(need / (work.seq_len * share))
    how = "routed to each" if routed else "through each (the library calibrates all experts)"
    return [Problem(f"{info.num_experts} experts, and about {per_expert:,} calibration tokens {how} expert: fewer "
                    f"than an expert's input width ({need:,}), so some experts' statistics are rank-deficient",
                    loaded.where("calibration", "samples"),
                    f"calibrate on at least {samples:,} samples of this length (calibration.samples)",
                    severity="warning")]


def for_stage(ctx, step) -> Footprint | None:
    """The placement a compress stage uses where it runs: the recipe's compute machine when it names a GPU,
    else this machine's GPUs as CUDA reports them; None on the CPU. The same choice ``llmopt plan`` shows
    for that machine. ``step``: the stage's backend (``CompressBackend``)."""
    import torch

    from llmopt.model.modelinfo import from_folder

    if not str(ctx.device).startswith("cuda"):
        return None
    from llmopt.sysinfo import available_ram

    recipe = ctx.recipe.recipe
    machine = machine_of(recipe)
    if machine.gpu is None:
        props = torch.cuda.get_device_properties(0)
        local = GPU(props.name, props.total_memory / GIB, (props.major, props.minor), 0, "local")
        machine = Machine(local, min(recipe.compute.count, torch.cuda.device_count()), machine.host_ram_bytes)
    if machine.host_ram_bytes is None:  # the stage runs here: this machine's memory
        machine = Machine(machine.gpu, machine.count, available_ram(), machine.disk_bytes)
    info = from_folder(ctx.model_dir)
    chosen, _ = choose(info, work_of(recipe, info, [step]), machine, recipe.compute.placement)
    return chosen
