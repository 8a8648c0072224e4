"""What a consumer accepts of a checkpoint format, and the verdict on one format x consumer x GPU.

A consumer of checkpoints (every serve backend, and the onnx export) declares in its own
file an ``accepts(options) -> {Format: Rule}``: per format of ``llmopt.model.formats``, whether it
takes the format ("yes"), refuses it ("no": an error) or does not document it
("undocumented": a warning), from which compute capability it runs the format natively
(below: a slower fallback, a warning) and at all (below: an error), and whether it needs a
GPU. The facts and their sources live next to the consumer's code; the planner's
cross-stage rules (``llmopt.plan.rules.cross_stage_rules``) ask ``judge`` about every format the
recipe's stages declare they produce.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from llmopt.errors import Problem
from llmopt.model.formats import AS_INPUT, Format

STATUSES = ("yes", "no", "undocumented")


@dataclass(frozen=True)
class Rule:
    status: str  # "yes" | "no" | "undocumented"
    note: str = ""  # why, in the user's words; said with every problem the rule raises
    min_cc: tuple[int, int] | None = None  # below: the consumer refuses the format (error)
    native_cc: tuple[int, int] | None = None  # below (and >= min_cc): a slower fallback (warning)
    needs_gpu: bool = False  # runs only on a GPU: an error when [target] names none
    fix: str = ""  # what to do instead, for "no"
    # (model facts, tensor parallel size) -> why the consumer's kernels cannot run this model's layers in the
    # format, or None; asked only where the plan knows the model (an error, with ``shapes_fix``)
    shapes: Callable[..., str | None] | None = None
    shapes_fix: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"a rule's status is one of {', '.join(STATUSES)}, not {self.status!r}")
        if self.status != "yes" and not self.note:
            raise ValueError(f"a {self.status!r} rule needs its reason (note)")


YES = Rule("yes")


def cc_text(cc: tuple[int, int]) -> str:
    return f"{cc[0]}.{cc[1]}"


def judge(rules: Mapping[Format, Rule], fmt: Format, what: str, where: str, gpu, info=None,
          tensor_parallel: int = 1) -> list[Problem]:
    """Problems of handing ``fmt`` to the consumer whose declaration is ``rules``, on ``gpu`` (None: no GPU), for
    the model ``info`` (ModelInfo; None: unknown, its shapes unchecked) split over ``tensor_parallel`` GPUs.

    ``what`` names the hand-over in messages ("gptq output (compressed-tensors W4A16) served by vllm")."""
    if fmt == AS_INPUT:
        return []  # a stage that hands its input on unchanged: that input's own stage was judged
    rule = rules.get(fmt)
    if rule is None:
        return [Problem(f"{what}: the consumer declares nothing about {fmt.label}, so nothing is checked", where,
                        "add a rule for this format to the consumer's accepts", severity="warning")]
    if rule.status == "no":
        return [Problem(f"{what}: {rule.note}", where, rule.fix or "choose another method, format or engine")]
    problems = []
    if rule.shapes is not None and info is not None and (why := rule.shapes(info, tensor_parallel)):
        problems.append(Problem(f"{what}: {why}", where, rule.shapes_fix or "choose another method, format or engine"))
    if rule.status == "undocumented":
        problems.append(Problem(f"{what}: {rule.note}", where, severity="warning"))
    if rule.needs_gpu and gpu is None:
        problems.append(Problem(f"{what}: {rule.note}", where, "set [target] gpu"))
    if gpu is None:
        return problems
    if rule.min_cc and gpu.cc < rule.min_cc:
        problems.append(Problem(f"{what} on {gpu.name} (CC {gpu.cc_str}): {rule.note}", where,
                                f"target a GPU with CC {cc_text(rule.min_cc)} or newer, or choose another method"))
    elif rule.native_cc and gpu.cc < rule.native_cc:
        problems.append(Problem(f"{what} on {gpu.name} (CC {gpu.cc_str}): {rule.note}", where, severity="warning"))
    return problems
