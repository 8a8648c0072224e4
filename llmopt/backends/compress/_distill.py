"""Plain functions of the distill backend: plan-time checks, the memory model, training, the loss curve.

The training is transformers' ``Trainer`` with a distillation loss (``loss_fn``); see
``llmopt/backends/compress/distill.py`` for what the stage does and docs/architecture.md for
why Trainer and not ModelOpt's ``modelopt.torch.distill``.
Needs: torch, transformers, accelerate (imported inside the functions that train).
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from llmopt import registry

from llmopt.data import calibration

from llmopt.model import estimates
from llmopt.backends.compress import _prune
from llmopt.backends.compress._common import cpu_threads
from llmopt.errors import Problem, StageFailed
from llmopt.libraries import require
from llmopt.model.placement import machine_of
from llmopt.sysinfo import available_ram

CHECKPOINTS = "checkpoints"  # under the stage key's working folder
PROGRESS = "llmopt-progress: "  # a data-parallel worker's progress line on its standard output
ACTIVATION_BYTES_PER_TOKEN_LAYER = 34  # per hidden unit, bf16 activations kept for backward (Korthikanti et al.)


# ---- plan time -------------------------------------------------------------------------------------------

def order_problems(ctx) -> list[Problem]:
    """Distillation trains dense weights: a quantization step before it is an error."""
    for method in ctx.upstream:
        if registry.get("compress", method).quantizes:
            return [ctx.problem(f"distill comes after {method}: llmopt trains unquantized weights only", "method",
                                hint="move the distill step before the quantization step (prune, distill, then "
                                     "quantize)")]
    return []


def data_problems(options, ctx) -> list[Problem]:
    """The training text must be readable: its own ``data``, or the [calibration] data."""
    if options.data is None:
        return calibration.check(ctx.recipe.recipe.calibration, ctx.recipe.path.parent,
                                 ctx.recipe.where("calibration", "data"))
    from llmopt import data as datasets

    problem = datasets.check_spec(options.data, ctx.recipe.path.parent)
    return [ctx.problem(problem, "data")] if problem else []


def teacher_problems(options, ctx, teacher) -> list[Problem]:
    """Teacher and student share a tokenizer: in llmopt's pipeline the student is the source model after
    pruning, so its tokenizer is the source's; the vocabularies must still agree. (A GGUF source teaches as
    the Hugging Face folder its source stage converts it into.)"""
    problems: list[Problem] = []
    if teacher is None or ctx.model is None:
        return problems
    if teacher.vocab_size != ctx.model.vocab_size:
        problems.append(ctx.problem(f"teacher and student vocabularies differ ({teacher.vocab_size} and "
                                    f"{ctx.model.vocab_size} tokens): the logit KL needs one tokenizer", "method",
                                    hint="distill a student made from the source by the earlier steps"))
    if options.hidden_weight and teacher.hidden_size != ctx.model.hidden_size:
        problems.append(ctx.problem(f"hidden_weight needs equal hidden sizes; teacher {teacher.hidden_size}, student "
                                    f"{ctx.model.hidden_size}", "hidden_weight", hint="set hidden_weight = 0"))
    return problems


def parallel_problems(options, ctx) -> list[Problem]:
    """Data parallel needs that many GPUs on the compute machine ([compute] count); on the CPU its processes
    share the cores (a warning when there are more processes than cores)."""
    n = options.data_parallel
    if n == 1:
        return []
    machine = machine_of(ctx.recipe.recipe)
    if machine.gpu is not None:
        count = machine.count
        if n > count:
            return [ctx.problem(f"data_parallel = {n} needs {n} GPUs; the compute machine has {count} ([compute] "
                                f"count)", "data_parallel", hint=f"set [compute] count = {n} if the machine has "
                                f"them, or data_parallel = {count}")]
        return []
    cores = os.cpu_count() or 1
    if n > cores:
        return [ctx.problem(f"data_parallel = {n} processes on a CPU of {cores} cores: each process gets one "
                            "thread and they wait for each other", "data_parallel",
                            hint=f"set data_parallel to at most {cores}", severity="warning")]
    return []


def memory_bytes(options, student, teacher, dtype: str, gpu: bool) -> dict[str, int]:
    """Peak memory of training on one device: the teacher's weights, the student's fp32 weights, gradients and
    AdamW's two moments (16 bytes a parameter), and one batch's activations and logits (student, teacher,
    gradient). Data parallel holds all of it on every device (it adds speed, not room)."""
    tokens = options.batch_size * options.seq_len
    train_dtype = "bfloat16" if (options.bf16 if options.bf16 is not None else gpu) else "float32"
    act_bytes = 2 if train_dtype == "bfloat16" else 4
    acts = tokens * student.hidden_size * student.num_layers * ACTIVATION_BYTES_PER_TOKEN_LAYER * act_bytes // 2
    if options.gradient_checkpointing:
        acts = tokens * student.hidden_size * student.num_layers * act_bytes + acts // max(1, student.num_layers)
    logits = tokens * student.vocab_size * 4 * 4  # student and teacher logits, log-softmaxes and the gradient, fp32
    parts = {"teacher": estimates.float_weight_bytes(teacher, train_dtype if gpu else "float32"),
             "student_and_optimizer": student.total_params * 16, "activations": acts, "logits": logits}
    return parts | {"total": sum(parts.values())}


def memory_problems(options, ctx, teacher) -> list[Problem]:
    """The training memory against the compute machine's GPU (an error) or this machine's RAM (a warning)."""
    if teacher is None or ctx.model is None:
        return []
    dtype = estimates.model_dtype(ctx.recipe.recipe, teacher)
    gpu = machine_of(ctx.recipe.recipe).gpu  # the compute machine's ([compute] gpu, else [target] gpu)
    need = memory_bytes(options, ctx.model, teacher, dtype, gpu is not None)
    fix = ("lower batch_size (raise gradient_accumulation to keep the effective batch) or seq_len, set "
           "gradient_checkpointing = true")
    if gpu is not None and need["total"] > gpu.memory_bytes:
        each = " on each of its data-parallel GPUs" if options.data_parallel > 1 else ""
        return [ctx.problem(f"distillation needs about {need['total'] / 2**30:.1f} GiB{each} (teacher, student, "
                            f"gradients, AdamW state, activations), more than one {gpu.name} "
                            f"({gpu.memory_gib:.0f} GiB)",
                            "batch_size", hint=fix + ", or target a GPU with more memory")]
    ram = available_ram()
    total = need["total"] * (options.data_parallel if gpu is None else 1)
    if gpu is None and ram is not None and total > ram:
        return [ctx.problem(f"distillation needs about {total / 2**30:.1f} GiB; this machine has "
                            f"{ram / 2**30:.1f} GiB available", "batch_size", hint=fix, severity="warning")]
    return []


# ---- run time --------------------------------------------------------------------------------------------

@dataclass
class Trained:
    model: object
    tokenizer: object
    rows: calibration.CalibrationRows
    history: list[dict]
    resumed_from: int
    seconds: float
    plot: str | None
    plot_note: str
    processes: int = 1

    def summary(self) -> dict:
        losses = [h["loss"] for h in self.history]
        return {"steps": self.history[-1]["step"] if self.history else 0, "resumed_from": self.resumed_from,
                "data_parallel": self.processes,
                "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None,
                "seconds": round(self.seconds, 2), "history": "training/loss.json", "plot": self.plot,
                **({"plot_note": self.plot_note} if self.plot_note else {})}


def save_dtype(ctx):
    import torch

    dtype = ctx.recipe.recipe.model.dtype
    return getattr(torch, dtype) if dtype != "auto" else torch.bfloat16


def training_rows(options, ctx, tokenizer) -> calibration.CalibrationRows:
    """Rows of ``seq_len`` tokens for every step (fewer when the text runs out: the Trainer then takes more
    than one pass), in the [calibration] section's seeded order."""
    section = ctx.recipe.recipe.calibration
    need = options.steps * options.batch_size * options.gradient_accumulation * options.data_parallel
    update = {"samples": need, "max_seq_len": options.seq_len}
    if options.data is not None:
        update |= {"data": options.data, "text_field": options.text_field}
    rows = calibration.token_rows(section.model_copy(update=update), tokenizer, ctx.recipe.path.parent, ctx.name)
    ctx.log.info("distill: %s (%d rows for %d steps)", rows.summary(), need, options.steps)
    return rows


def load_pair(student_dir: Path, teacher_dir: Path, trust: bool, device: str, bf16: bool, where: str):
    """Tokenizer (the student's), student in float32 and the frozen teacher (bfloat16 when ``bf16``) on
    ``device``."""
    torch = require("torch", _prune.EXTRA, where)
    transformers = require("transformers", _prune.EXTRA, where)
    auto = transformers.AutoModelForCausalLM
    tokenizer = transformers.AutoTokenizer.from_pretrained(student_dir, trust_remote_code=trust)
    student = auto.from_pretrained(student_dir, dtype=torch.float32, trust_remote_code=trust).to(device)
    teacher_dtype = torch.bfloat16 if bf16 else torch.float32
    teacher = auto.from_pretrained(teacher_dir, dtype=teacher_dtype, trust_remote_code=trust)
    teacher.to(device).eval().requires_grad_(False)
    return tokenizer, student, teacher


def layer_map(student_layers: int, teacher_layers: int) -> list[int]:
    """For each student layer, the teacher layer at the same relative depth (hidden-state indices 1..N)."""
    return [round((j + 1) * teacher_layers / student_layers) for j in range(student_layers)]


def loss_fn(options, teacher):
    """The distillation loss of a batch: T^2 x KL(teacher || student) at temperature T, plus the optional
    cross-entropy and hidden-state terms."""
    import torch
    import torch.nn.functional as F

    t = options.temperature
    hidden = options.hidden_weight > 0

    def compute(model, input_ids):
        out = model(input_ids=input_ids, output_hidden_states=hidden, use_cache=False)
        with torch.no_grad():
            ref = teacher(input_ids=input_ids, output_hidden_states=hidden, use_cache=False)
        s = F.log_softmax(out.logits.float() / t, dim=-1)
        p = F.log_softmax(ref.logits.float() / t, dim=-1)
        loss = F.kl_div(s.flatten(0, 1), p.flatten(0, 1), log_target=True, reduction="batchmean") * t * t
        if options.ce_weight:
            ce = F.cross_entropy(out.logits[:, :-1].flatten(0, 1).float(), input_ids[:, 1:].flatten())
            loss = loss + options.ce_weight * ce
        if hidden:
            pairs = zip(out.hidden_states[1:], [ref.hidden_states[i] for i in layer_map(len(out.hidden_states) - 1,
                                                                                         len(ref.hidden_states) - 1)])
            terms = [((a.float() - b.float()) ** 2).mean() / (b.float() ** 2).mean().clamp_min(1e-6) for a, b in pairs]
            loss = loss + options.hidden_weight * torch.stack(terms).mean()
        return loss

    return compute


def last_checkpoint(folder: Path) -> Path | None:
    """The newest complete checkpoint (Trainer writes trainer_state.json last), or None."""
    done = [p for p in folder.glob("checkpoint-*") if (p / "trainer_state.json").is_file() and p.name[11:].isdigit()]
    return max(done, key=lambda p: int(p.name[11:]), default=None)


def train(options, ctx) -> Trained:
    """Train the student against the teacher with ``Trainer``, resuming from the working folder's last
    checkpoint; the loss history and curve under ``training/``. With ``data_parallel`` above 1 the training
    runs in that many processes started by torchrun (``train_distributed``)."""
    if ctx.model_format != "hf":
        raise StageFailed(f"{ctx.name} needs a Hugging Face model folder, got format {ctx.model_format!r}",
                          where=ctx.name, fix="put the distill step before quantization and export")
    gpu = ctx.device != "cpu"
    bf16 = options.bf16 if options.bf16 is not None else gpu
    folder = (ctx.work_dir or ctx.out_dir.with_name(ctx.out_dir.name + ".work")) / CHECKPOINTS
    folder.mkdir(parents=True, exist_ok=True)
    resume = last_checkpoint(folder)
    resumed_from = int(resume.name[11:]) if resume else 0
    if resume:
        ctx.progress(f"resuming from step {resumed_from} ({resume})")
    if options.data_parallel > 1:
        tokenizer, rows, model, history, seconds = train_distributed(options, ctx, folder, resume, bf16)
    else:
        tokenizer, student, teacher = load_pair(ctx.model_dir, ctx.input_model_dir("teacher"),
                                                ctx.recipe.recipe.model.trust_remote_code, ctx.device, bf16, ctx.name)
        rows = training_rows(options, ctx, tokenizer)
        trainer = build_trainer(options, ctx.name, ctx.progress, ctx.device, student, teacher, rows.rows, folder,
                                bf16)
        t0 = time.monotonic()
        with cpu_threads(ctx.device):  # LLMOPT_CPU_THREADS: small steps on a busy CPU run faster on one thread
            trainer.train(resume_from_checkpoint=str(resume) if resume else None)
        seconds = time.monotonic() - t0
        history, model = loss_history(trainer), trainer.model
    plot, note = write_curve(ctx.out_dir / "training", history, ctx.name)
    if ctx.work_dir is None:  # a stage run outside the runner: nothing keeps its checkpoints
        shutil.rmtree(folder.parent, ignore_errors=True)
    return Trained(model.eval(), tokenizer, rows, history, resumed_from, seconds, plot, note, options.data_parallel)


def loss_history(trainer) -> list[dict]:
    return [{"step": h["step"], "loss": h["loss"], "learning_rate": h.get("learning_rate")}
            for h in trainer.state.log_history if "loss" in h]


def train_distributed(options, ctx, folder: Path, resume: Path | None, bf16: bool):
    """Data-parallel training: ``torch.distributed.run`` (torchrun) starts ``data_parallel`` processes of
    ``llmopt.backends.compress._distill_worker``, one per GPU (NCCL) or, on the CPU, sharing its cores (gloo);
    ``Trainer`` wraps the student in DistributedDataParallel and gives each process its share of every batch.
    This process cuts the training rows (written as safetensors for the workers), forwards rank 0's progress
    and, when all have finished, loads the model rank 0 saved. Returns the tokenizer, the rows, the model,
    the loss history and the seconds the workers took."""
    torch = require("torch", _prune.EXTRA, ctx.name)
    transformers = require("transformers", _prune.EXTRA, ctx.name)
    from safetensors.torch import save_file

    n = options.data_parallel
    if ctx.device != "cpu" and torch.cuda.device_count() < n:
        raise StageFailed(f"data_parallel = {n} but this machine shows {torch.cuda.device_count()} GPUs",
                          where=ctx.name, fix=f"run on a machine with {n} GPUs, or lower data_parallel")
    trust = ctx.recipe.recipe.model.trust_remote_code
    tokenizer = transformers.AutoTokenizer.from_pretrained(ctx.model_dir, trust_remote_code=trust)
    rows = training_rows(options, ctx, tokenizer)
    run = folder.parent / "distributed"
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    save_file({"input_ids": torch.tensor(rows.rows, dtype=torch.long)}, str(run / "rows.safetensors"))
    threads = max(1, int(os.environ.get("LLMOPT_CPU_THREADS") or os.cpu_count() or 1) // n)
    spec = {"student": str(ctx.model_dir), "teacher": str(ctx.input_model_dir("teacher")), "trust_remote_code": trust,
            "options": options.model_dump(), "rows": str(run / "rows.safetensors"), "checkpoints": str(folder),
            "resume": str(resume) if resume else None, "bf16": bf16, "device": "cpu" if ctx.device == "cpu" else "cuda",
            "threads": threads if ctx.device == "cpu" else None, "out": str(run / "trained"), "name": ctx.name}
    (run / "spec.json").write_text(json.dumps(spec, indent=1) + "\n")
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}",
            "-m", "llmopt.backends.compress._distill_worker", str(run / "spec.json")]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    ctx.log.info("distill: %d data-parallel processes: %s", n, " ".join(argv))
    tail: collections.deque[str] = collections.deque(maxlen=8)
    raised: list[str] = []  # a worker's exception line ("[rank1]: RuntimeError: ..."), the first one
    t0 = time.monotonic()
    with subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, preexec_fn=_die_with_parent if sys.platform == "linux" else None) as proc:
        for line in proc.stdout:
            line = line.rstrip("\n")
            if line.startswith(PROGRESS):
                ctx.progress(line[len(PROGRESS):])
                continue
            ctx.log.info("distill worker: %s", line)
            tail.append(line)
            if not raised and re.match(r"\[rank\d+\]: \w+(Error|Exception)\b", line):
                raised.append(line)
    seconds = time.monotonic() - t0
    if proc.returncode != 0 or not (run / "trained" / "history.json").is_file():
        shown = "\n".join(raised + ["..."] + list(tail) if raised else tail)
        raise StageFailed(f"data-parallel training exited with code {proc.returncode}:\n{shown}", where=ctx.name,
                          fix="the workers' whole output is in the run log (the cache's runs/ folder); "
                          "data_parallel = 1 trains in this process")
    history = json.loads((run / "trained" / "history.json").read_text())
    model = transformers.AutoModelForCausalLM.from_pretrained(run / "trained", dtype=torch.float32,
                                                              trust_remote_code=trust)
    shutil.rmtree(run, ignore_errors=True)
    return tokenizer, rows, model, history, seconds


def _die_with_parent() -> None:
    """In the torchrun child, before exec: SIGTERM when llmopt dies, even by kill -9 (torchrun then stops its
    workers), so a killed run leaves no training behind to race the resumed one for the checkpoints."""
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def build_trainer(options, where: str, progress, device: str, student, teacher, rows, folder: Path, bf16: bool,
                  configured_state: bool = False):
    """A ``Trainer`` whose loss is the distillation loss, logging each step to ``progress``. ``rows`` are
    token rows of equal length (lists, or a 2-D tensor). ``configured_state``: use the accelerate state the
    caller set up instead of a new one."""
    transformers = require("transformers", _prune.EXTRA, where)
    torch = require("torch", _prune.EXTRA, where)
    compute = loss_fn(options, teacher)

    class DistillTrainer(transformers.Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss = compute(model, inputs["input_ids"])
            return (loss, None) if return_outputs else loss

    class Progress(transformers.TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                progress(f"step {state.global_step}/{state.max_steps} loss {logs['loss']:.4f}")

    if options.gradient_checkpointing:
        student.gradient_checkpointing_enable()
    args = transformers.TrainingArguments(
        output_dir=str(folder), max_steps=options.steps, per_device_train_batch_size=options.batch_size,
        gradient_accumulation_steps=options.gradient_accumulation, learning_rate=options.learning_rate,
        lr_scheduler_type=options.schedule, warmup_steps=options.warmup_steps, weight_decay=options.weight_decay,
        logging_steps=1, save_strategy="steps", save_steps=options.checkpoint_every, save_total_limit=1,
        bf16=bf16, use_cpu=device == "cpu", report_to="none", disable_tqdm=True, seed=options.seed,
        data_seed=options.seed, remove_unused_columns=False, dataloader_num_workers=0,
        **({"accelerator_config": {"use_configured_state": True}} if configured_state else {}))
    data = [{"input_ids": torch.as_tensor(r, dtype=torch.long)} for r in rows]
    return DistillTrainer(model=student, args=args, train_dataset=data, callbacks=[Progress()])


def write_curve(folder: Path, history: list[dict], where: str) -> tuple[str | None, str]:
    """``loss.json`` always; ``loss.png`` when matplotlib is installed (else the note says so)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "loss.json").write_text(json.dumps(history, indent=1) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None, "no loss curve: matplotlib is not installed (pip install 'llmopt[plots]')"
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([h["step"] for h in history], [h["loss"] for h in history])
    ax.set(xlabel="step", ylabel="distillation loss", title=where)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(folder / "loss.png", dpi=100)
    plt.close(fig)
    return "training/loss.png", ""
