"""The backend contract: the options base class and the plan-time and run-time contexts.

Backends never inherit behaviour; they receive these plain dataclasses. Helpers they
share (importing an extra, picking the device, library versions) live in
``llmopt.libraries``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from llmopt.errors import Problem
from llmopt.recipe.schema import Options  # noqa: F401 (the base of every backend's options)


@dataclass
class PlanContext:
    """What a backend's ``check`` may look at: the recipe and facts, never weights."""

    recipe: Any  # LoadedRecipe
    step: tuple  # ("compress", 0) or ("export",)
    model: Any = None  # ModelInfo of the model entering this stage, or None when unknown
    gpu: Any = None  # catalogue GPU, or None for CPU
    upstream: list[str] = field(default_factory=list)  # stage kinds/methods before this one
    source: Any = None  # ModelInfo of the recipe's source model (a distill step's teacher), or None when unknown

    def where(self, *keys: Any) -> str:
        step = tuple(k for k in self.step if k is not None)
        return self.recipe.where(*step, *keys)

    def problem(self, message: str, *keys: Any, hint: str = "", severity: str = "error") -> Problem:
        return Problem(message, self.where(*keys), hint, severity)


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
