"""Plan-time checks shared by the compression backends (config facts only, no heavy imports).

* (which model families each method runs on is the family table's, ``llmopt.model.families``, judged by the
  planner);
* group size: a group (or block) size must divide the input width of every
  layer it quantizes, else the suggestion names a size that does, or the layers
  to leave out;
* calibration memory: the estimate of ``llmopt.model.estimates.calibration_bytes``
  against this machine's available RAM, when no GPU is named (with one, ``llmopt.model.placement``
  plans where the model is held);
* GPU capability: FP8 / NVFP4 compute needs a recent GPU (said here only when the
  recipe has no [serve] section; the serve backends own the engine x GPU table);
* calibration data: the spec in [calibration] must name readable data, and a warning when
  it fills fewer rows than ``samples`` asks for (counted with the model's tokenizer where it
  is on this machine, ``llmopt.data.calibration.plan_yield``).
"""

from __future__ import annotations

import math
import re

from llmopt.data import calibration

from llmopt.model import estimates
from llmopt.backends.compress._common import WIDENED_ON_CPU
from llmopt.errors import Problem
from llmopt.sysinfo import available_ram

def not_quantized(ctx) -> list[Problem]:
    """The source must hold unquantized weights."""
    info = ctx.model
    if info is None or not info.quantization:
        return []
    method = info.quantization.get("quant_method", "unknown")
    return [ctx.problem(f"the source model is already quantized ({method}); its weights cannot be compressed again",
                        "method", hint="start from the unquantized (bf16/fp16) checkpoint")]


def largest_group(widths: list[int], limit: int = 128) -> int | None:
    """The largest power of two <= ``limit`` that divides every width (None when even 2 does not)."""
    g = limit
    while g >= 2:
        if all(w % g == 0 for w in widths):
            return g
        g //= 2
    return None


MODULE_OF = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
             "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def ignored(layer: str, ignore: list[str]) -> bool:
    """Whether an ignore list (module names or ``re:`` patterns, as llm-compressor reads them) leaves a
    decoder layer kind (q_proj, down_proj...) unquantized; judged on layer 0's module name."""
    return module_ignored(f"model.layers.0.{MODULE_OF.get(layer, 'mlp')}.{layer}", ignore)


def module_ignored(name: str, ignore: list[str]) -> bool:
    """Whether an ignore list names the module ``name`` (exactly, by its last parts, or by a ``re:`` pattern)."""
    for entry in ignore:
        if entry.startswith("re:"):
            try:
                if re.match(entry[3:], name):
                    return True
            except re.error:
                continue
        elif entry in (name, name.rsplit(".", 1)[-1]) or name.endswith("." + entry):
            return True
    return False


def group_size(ctx, size: int | None, ignore: list[str], key: str = "group_size", fixed: bool = False) -> list[Problem]:
    """``size`` must divide the input width of every targeted linear layer (``fixed``: the format's own size)."""
    if ctx.model is None or not size:
        return []
    widths = {name: w for name, w in ctx.model.linear_inputs.items() if not ignored(name, ignore)}
    bad = {name: w for name, w in widths.items() if w % size}
    if not bad:
        return []
    layers = ", ".join(f"{name} ({w})" for name, w in bad.items())
    skip = f"leave these layers unquantized: ignore = {_ignore_list(ignore, bad)}"
    if fixed:
        return [ctx.problem(f"the format's group of {size} does not divide the input width of {layers}", "method",
                            hint=skip)]
    best = largest_group(list(widths.values()))
    hint = f"use {key} = {best}, the largest power of two that divides every targeted layer's input width" if best \
        else "no power-of-two group size divides every input width"
    return [ctx.problem(f"{key} {size} does not divide the input width of {layers}", key, hint=f"{hint}; or {skip}")]


def _ignore_list(ignore: list[str], bad: dict[str, int]) -> str:
    entries = list(ignore) + [f"re:.*{name}$" for name in bad]
    return "[" + ", ".join(f'"{e}"' for e in entries) + "]"


def calibration_memory(ctx, name: str | None = None) -> list[Problem]:
    """Warn when the calibration estimate exceeds this machine's RAM, for a compress stage on the CPU, with the
    weights in float32 where method ``name`` computes in it there (``CompressBackend.cpu_float32``). With a
    GPU on the compute machine ([compute] gpu, else [target] gpu) the plan's placement judges the GPU and
    host memory instead (``llmopt.model.placement``)."""
    from llmopt import registry

    info = ctx.model
    recipe = ctx.recipe.recipe
    if info is None or recipe.compute.gpu or recipe.target.gpu:
        return []
    dtype = recipe.model.dtype if recipe.model.dtype != "auto" else (info.dtype or "bfloat16")
    if name is not None and dtype in WIDENED_ON_CPU and registry.get("compress", name).cpu_float32:
        dtype = "float32"
    cal = recipe.calibration
    need = estimates.calibration_bytes(info, dtype, cal.samples, cal.max_seq_len)
    ram = available_ram()
    if ram is None or need <= ram:
        return []
    return [ctx.problem(
        f"calibration needs about {need / 2**30:.1f} GiB; this machine has {ram / 2**30:.1f} GiB available",
        "method", severity="warning",
        hint="run on a larger machine (or name its GPU in [compute] for a planned placement), or lower "
        "calibration.samples / calibration.max_seq_len")]


def gpu_compute(ctx, need_cc: tuple[int, int], what: str) -> list[Problem]:
    """Warn when the target GPU cannot compute in this format (only without a [serve] section)."""
    gpu = ctx.gpu
    if gpu is None or ctx.recipe.recipe.serve is not None or tuple(gpu.cc) >= need_cc:
        return []
    return [ctx.problem(
        f"{what} compute needs compute capability >= {need_cc[0]}.{need_cc[1]}; {gpu.name} has {gpu.cc_str}, "
        "so engines fall back to a slower weight-only path or refuse the checkpoint", "method", severity="warning",
        hint="pick a method your GPU computes natively (gptq / awq for int4 weights), or a newer target GPU")]


def calibration_data(ctx) -> list[Problem]:
    """The [calibration] data spec must name readable data that fills ``samples`` rows."""
    problems = calibration.check(ctx.recipe.recipe.calibration, ctx.recipe.path.parent,
                                 ctx.recipe.where("calibration", "data"))
    return problems or calibration_yield(ctx)


def calibration_yield(ctx) -> list[Problem]:
    """Warn when the calibration data fills fewer rows of ``max_seq_len`` tokens than ``samples``
    (an error when the count is exact and the data fills none: the run would fail)."""
    recipe = ctx.recipe.recipe
    cal = recipe.calibration
    got = calibration.plan_yield(cal, recipe.model, ctx.recipe.path.parent)
    if got is None or got.rows >= cal.samples:
        return []
    approx = "" if got.counted else "about "
    fixes = [f"samples = {got.rows}"] if got.rows else []
    if got.tokens // cal.samples >= 8:
        fixes.append(f"max_seq_len = {got.tokens // cal.samples}")
    hint = "give more text" + (", or set " + " or ".join(fixes) if fixes else "")
    if cal.data != "builtin:mix":
        hint = 'use data = "builtin:mix" (about 46,000 tokens of six kinds of text), ' + hint
    template = "; the chat template's tokens not counted" if cal.chat_template else ""
    fatal = got.rows == 0 and got.counted and not cal.chat_template
    return [Problem(
        f"calibration data {cal.data} fills {approx}{got.rows} of the {cal.samples} rows of {cal.max_seq_len} tokens "
        f"that samples asks for ({approx}{got.tokens:,} tokens in {got.documents} documents, {got.basis}{template}): "
        f"the compression would be calibrated on {got.rows}",
        ctx.recipe.where("calibration", "samples"), hint, "error" if fatal else "warning")]


def quantizer(ctx, name: str, calibrates: bool) -> list[Problem]:
    """Checks every quantization backend runs."""
    problems = not_quantized(ctx)
    if calibrates:
        problems += calibration_data(ctx) + calibration_memory(ctx, name)
    return problems




def round_to(value: float, multiple: int) -> int:
    """``value`` rounded down to a multiple (at least one multiple)."""
    return max(multiple, int(math.floor(value / multiple)) * multiple)
