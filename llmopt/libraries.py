"""Helpers for the libraries llmopt runs: importing an optional extra, their versions, the device.

Every layer may use these (backends, runtimes, data, the runner); they import nothing of
llmopt but its errors.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
from importlib.metadata import PackageNotFoundError, version

from llmopt.errors import MissingExtra


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
