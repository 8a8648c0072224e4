"""What backends receive: option base class, plan-time and run-time contexts, helpers.

Backends never inherit behaviour; they use these plain dataclasses and functions.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import logging
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict

from llmopt.errors import MissingExtra, Problem


class Options(BaseModel):
    """Base of every backend's options: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


@dataclass
class PlanContext:
    """What a backend's ``check`` may look at: the recipe and facts, never weights."""

    recipe: Any  # LoadedRecipe
    step: tuple  # ("compress", 0) or ("export",)
    model: Any = None  # ModelInfo of the model entering this stage, or None when unknown
    gpu: Any = None  # catalogue GPU, or None for CPU
    upstream: list[str] = field(default_factory=list)  # stage kinds/methods before this one

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
        where = Path(self.input_manifests["model"]["outputs"].get("model_dir", "model"))
        return where if where.is_absolute() else self.inputs["model"] / where

    @property
    def model_format(self) -> str:
        return self.input_manifests.get("model", {}).get("outputs", {}).get("format", "hf")


def require(module: str, extra: str, needed_by: str, package: str | None = None):
    """Import ``module`` or raise MissingExtra (exit 4) naming the extra to install."""
    try:
        with collector_paused():
            return importlib.import_module(module)
    except ImportError:
        raise MissingExtra(package or module, extra, needed_by) from None


@contextlib.contextmanager
def collector_paused():
    """CPython's cyclic garbage collector paused for the block, for importing the large libraries.

    Importing torch, transformers and a compression library creates hundreds of thousands of
    objects that live as long as the process and almost no cyclic garbage, yet each full
    collection on the way walks every object made so far (``benchmarks/compress.py`` reports
    the collector's seconds per run; docs/benchmarks.md). Reference counting still frees what
    the imports drop; the collector resumes (if it was running) when the block ends."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def package_version(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def versions(dists: tuple[str, ...] | list[str]) -> dict[str, str | None]:
    return {d: package_version(d) for d in dists}


def pick_device(requested: str = "auto") -> str:
    if requested != "auto":
        return requested
    try:
        with collector_paused():
            import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"
