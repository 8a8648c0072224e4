"""The backend contract: one base class a kind, the options base class, and the plan-time and
run-time contexts.

A backend subclasses its kind's class (``CompressBackend``...) and is registered with
``@register(kind, name)`` (``llmopt.registry``). Every capability the planner, the cache or the
placement asks about is declared here with its default, so a backend states only where it
differs; the methods a kind must define are abstract, and registering a class that leaves one
out raises. Helpers backends share (importing an extra, picking the device, library versions)
live in ``llmopt.libraries``.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Literal

from llmopt.errors import Problem
from llmopt.recipe.context import PlanContext  # the plan-time context, which the size model hands out too
from llmopt.recipe.schema import Options


@dataclass
class StageContext:
    """What a backend's ``run`` gets: where to write, what it reads, how to report."""

    name: str
    out_dir: Path
    inputs: dict[str, Path]  # role -> folder of an upstream stage's output ("model", "source")
    input_manifests: dict[str, dict]
    recipe: Any  # LoadedRecipe
    log: logging.Logger
    progress: Callable[[str], None] = lambda message: None
    device: str = "cpu"
    model: Any = None  # ModelInfo of the model as the recipe's steps leave it (config facts), or None
    gpu: Any = None  # the target GPU from the catalogue, or None for the CPU
    cache_root: Path | None = None  # the stage cache (the bench stage records its server's pid there)
    work_dir: Path | None = None  # kept across runs of this key until the stage commits (checkpoints); not created
    deferred: list[Callable[[Path], dict]] = field(default_factory=list)

    def defer(self, work: Callable[[Path], dict]) -> None:
        """Run ``work(folder)`` after ``run`` returns, in the background while the next stages run;
        ``folder`` is where ``out_dir`` is by then (its place in the cache), and the dict ``work``
        returns joins the stage's outputs before its manifest is written. For provenance (hashing
        weights) that nothing downstream reads until the artifact."""
        self.deferred.append(work)

    @property
    def model_dir(self) -> Path:
        """The model folder of the upstream stage (absolute for sources read in place)."""
        return self.input_model_dir("model")

    @property
    def model_format(self) -> str:
        return self.input_manifests.get("model", {}).get("outputs", {}).get("format", "hf")

    def input_model_dir(self, role: str) -> Path:
        """The model folder of the input ``role`` ("model", or "teacher": the source stage, for a backend
        that declares ``teacher = True``)."""
        where = Path(self.input_manifests[role]["outputs"].get("model_dir", "model"))
        return where if where.is_absolute() else self.inputs[role] / where


class Backend(ABC):
    """What every backend declares; ``register`` sets ``kind`` and ``name``."""

    Options: ClassVar[type[Options]]  # the recipe keys of this backend (extra="forbid", a description on each)
    requires: ClassVar[tuple[str, ...]] = ()  # distributions it imports when it runs: their versions join the key
    extra: ClassVar[str | None] = None  # the llmopt extra that installs them
    version: ClassVar[int] = 1  # raised when its output changes for the same options and inputs: part of the key
    # options added after the backend shipped, left out of the key at the value that behaves as before they existed
    keyless_defaults: ClassVar[dict[str, Any]] = {}
    kind: ClassVar[str] = ""
    name: ClassVar[str] = ""
    contract: ClassVar[str] = ""  # the kind whose contract the class meets (each kind's base class sets it)

    @abstractmethod
    def check(self, options, ctx: PlanContext) -> list[Problem]:
        """Plan-time checks: recipe and config facts only, no heavy imports, no weights."""


class SourceBackend(Backend):
    """Reads the recipe's model: ``[model]`` is its options."""

    contract: ClassVar[str] = "source"

    @abstractmethod
    def fingerprint(self, options, base: Path) -> dict:
        """What identifies the source's content in the cache key, without reading weights."""

    @abstractmethod
    def layout(self, options, ctx: PlanContext):
        """The source's weight layout (``llmopt.model.estimates.Layout``) for the size model."""

    @abstractmethod
    def run(self, options, ctx: StageContext) -> dict:
        """Writes (or points at) the model folder; returns its outputs."""


class CompressBackend(Backend):
    """One ``[[compress]]`` step: a model folder in, a model folder out."""

    contract: ClassVar[str] = "compress"

    calibrates: ClassVar[bool] = False  # reads [calibration]: its data joins the key and the held-out checks
    builds_hessians: ClassVar[bool] = False  # holds a Hessian per linear layer's inputs (the placement's memory)
    # MoE calibration: every calibration token through every expert ("all"), or only those routed to it
    expert_tokens: ClassVar[Literal["all", "routed"]] = "all"
    quantizes: ClassVar[bool] = False  # one quantization step a recipe, after any pruning
    prunes: ClassVar[bool] = False  # needs unquantized weights: comes before any quantization step
    teacher: ClassVar[bool] = False  # the planner hands it the source stage as the input "teacher"
    # on a CPU, computes in float32 and saves in the recipe's dtype: bfloat16 matrix products run about 8x slower
    # than float32 on a CPU without native bfloat16 (AVX2 only), and a calibrating method is mostly products
    cpu_float32: ClassVar[bool] = False

    @abstractmethod
    def produces(self, options) -> Any:
        """The checkpoint format it writes (``llmopt.model.formats.Format``)."""

    @abstractmethod
    def run(self, options, ctx: StageContext) -> dict:
        """Compresses the model at ``ctx.model_dir`` into ``ctx.out_dir``; returns metrics."""

    def layout(self, options, before, ctx: PlanContext):
        """The weight layout after this step, for the size model; the same layout unless overridden."""
        return before

    def transform_info(self, options, info):
        """The model's config facts after this step (pruning changes shapes); unchanged unless overridden."""
        return info


class ExportBackend(Backend):
    """``[export]``: the final model in the format a runtime loads."""

    contract: ClassVar[str] = "export"

    @abstractmethod
    def produces(self, options) -> Any:
        """The format it writes (``llmopt.model.formats.Format``)."""

    @abstractmethod
    def run(self, options, ctx: StageContext) -> dict:
        """Exports the model at ``ctx.model_dir`` into ``ctx.out_dir``; returns its outputs."""

    def accepts(self, options) -> dict | None:
        """Which incoming formats it converts, on which GPUs (``{Format: llmopt.deploy.compat.Rule}``), or
        None when it takes whatever the steps before it write."""
        return None

    def layout(self, options, before, ctx: PlanContext):
        """The weight layout it writes, for the size model; the same layout unless overridden."""
        return before


class EvalBackend(Backend):
    """One ``[[eval]]``: scores a model per example; the metric's direction is among its outputs."""

    contract: ClassVar[str] = "eval"

    @abstractmethod
    def run(self, options, ctx: StageContext) -> dict:
        """Scores the model; writes per-example scores and returns the metric, its value and direction."""


class ServeBackend(Backend):
    """``[serve]``: an engine's launch configs for the final model, rendered as the deploy stage."""

    contract: ClassVar[str] = "serve"

    @abstractmethod
    def render(self, options, ctx: StageContext) -> dict:
        """Writes the engine's launch configs for the model at ``ctx.model_dir`` into ``ctx.out_dir``."""

    @abstractmethod
    def accepts(self, options) -> dict:
        """What the engine serves of each format on which GPUs (``{Format: llmopt.deploy.compat.Rule}``)."""

    def key_material(self, options) -> dict:
        """What the launch configs depend on beyond the options and the model (the engine release installed
        here, say): it joins the deploy stage's cache key. Nothing unless overridden."""
        return {}


class StageKind(Backend):
    """A stage the plan adds after the recipe's steps (the gate, the deploy configs, bench, tune), registered
    with ``@register("stage", kind)`` and built with the name of the recipe's serve backend, whose launch
    configs deploy, bench and tune act on. Its plan-time problems come from the planner's rules."""

    contract: ClassVar[str] = "stage"
    Options = Options  # each kind's own options model; the deploy stage's are the serve backend's

    def __init__(self, backend: str = "") -> None:
        self.backend = backend

    def check(self, options, ctx: PlanContext) -> list[Problem]:
        return []

    @abstractmethod
    def run(self, options, ctx: StageContext) -> dict:
        """Does the stage's work into ``ctx.out_dir``; returns its outputs."""


CONTRACTS: dict[str, type[Backend]] = {"source": SourceBackend, "compress": CompressBackend, "export": ExportBackend,
                                       "eval": EvalBackend, "serve": ServeBackend, "stage": StageKind}
