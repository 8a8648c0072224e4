"""Helpers for the libraries llmopt runs: importing an optional extra, their versions, the device.

Every layer may use these (backends, runtimes, data, the runner); they import nothing of
llmopt but its errors.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib
import os
import sys
from importlib.metadata import PackageNotFoundError, version

from llmopt.errors import MissingDependency, MissingExtra


def require(module: str, extra: str, needed_by: str, package: str | None = None):
    """Import ``module``. When it is not installed, raise MissingExtra (exit 4) naming the extra;
    when it is installed but one of its own imports fails (a dependency of it is missing),
    raise MissingDependency (exit 4) naming that module and the package that imports it."""
    try:
        with collector_paused():
            return importlib.import_module(module)
    except ImportError as exc:
        if isinstance(exc, ModuleNotFoundError) and exc.name and (module + ".").startswith(exc.name + "."):
            raise MissingExtra(package or module, extra, needed_by) from None  # the module or a package above it
        raise broken_import(exc, module, extra, needed_by, package) from exc


def broken_import(exc: ImportError, module: str, extra: str, needed_by: str, package: str | None) -> MissingDependency:
    """The error for ``module``, installed, whose import raised ``exc`` further down."""
    importer = _importer(exc) or module
    top = importer.split(".")[0]
    owner = _distribution(top) or top
    head = f"{needed_by} needs '{package or module}', which is installed but cannot be imported"
    reinstall = f"pip install 'llmopt[{extra}]'"
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        missing = exc.name.split(".")[0]
        return MissingDependency(
            f"{head}: it needs the module '{exc.name}', which is not installed (imported by {importer}, "
            f"package {owner})",
            fix=f"install the package that provides '{missing}' (often `pip install {missing}`), or reinstall "
                f"the extra so that pip restores what {owner} depends on: {reinstall}")
    return MissingDependency(f"{head}: importing '{module}' failed in {importer} (package {owner}): {exc}",
                             fix=f"reinstall the extra at the versions llmopt pins: {reinstall} "
                                 "(LLMOPT_DEBUG=1 shows the traceback)")


def _importer(exc: BaseException) -> str | None:
    """The module whose import statement raised: the innermost frame outside importlib's machinery."""
    name, tb = None, exc.__traceback__
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith("<frozen importlib"):
            name = tb.tb_frame.f_globals.get("__name__")
        tb = tb.tb_next
    return name


def _distribution(top_level: str) -> str | None:
    """The installed distribution that provides the top-level module (``modelopt``: nvidia-modelopt)."""
    from importlib.metadata import packages_distributions

    names = packages_distributions().get(top_level)
    return names[0] if names else None


@contextlib.contextmanager
def collector_paused():
    """CPython's cyclic garbage collector paused for the block, for importing the large libraries.

    Importing torch, transformers and a compression library creates hundreds of thousands of
    objects that live as long as the process and almost no cyclic garbage, yet each full
    collection on the way walks every object made so far (``benchmarks/compress.py`` reports
    the collector's seconds per run; docs/results/suite.md). Reference counting still frees what
    the imports drop; the collector resumes (if it was running) when the block ends."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


# Builds of a library published under another name that install the same module (``import onnxruntime``):
# where llmopt needs the library, either build will do. The GPU build is looked for first: installed beside
# the CPU one, it is the one a GPU machine's environment puts ahead on the path.
BUILDS = {"onnxruntime": ("onnxruntime-gpu", "onnxruntime"),
          "onnxruntime-genai": ("onnxruntime-genai-cuda", "onnxruntime-genai")}


@functools.lru_cache(maxsize=None)
def package_version(dist: str) -> str | None:
    """The installed version of ``dist`` (or of another build of it, ``BUILDS``), or None. Read once per
    process: finding a distribution's metadata scans every folder of sys.path (tens of ms each time), and
    what is installed does not change while llmopt runs."""
    for name in BUILDS.get(dist, (dist,)):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


@functools.lru_cache(maxsize=None)
def extra_providing(dist: str) -> str | None:
    """The extra of llmopt that installs the distribution ``dist`` (from llmopt's own package metadata), or
    None when no extra names it."""
    import re
    from importlib.metadata import requires

    def canonical(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    try:
        lines = requires("llmopt") or []
    except PackageNotFoundError:
        return None
    for line in lines:
        name, extra = re.match(r"[A-Za-z0-9._-]+", line), re.search(r'extra\s*==\s*"([^"]+)"', line)
        if name and extra and canonical(name.group(0)) == canonical(dist):
            return extra.group(1)
    return None


def versions(dists: tuple[str, ...] | list[str]) -> dict[str, str | None]:
    return {d: package_version(d) for d in dists}


# Device nodes a GPU that torch can use shows on Linux: NVIDIA's (CUDA), AMD's (ROCm), WSL2's GPU paravirtualization.
GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dxg")


def pick_device(requested: str = "auto") -> str:
    """``requested``, or for "auto" cuda where torch sees a GPU, else cpu. On Linux without a GPU device node the
    answer is cpu without importing torch, which costs seconds in every run, bench and serve that loads no model."""
    if requested != "auto":
        return requested
    if sys.platform.startswith("linux") and not any(os.path.exists(node) for node in GPU_DEVICE_NODES):
        return "cpu"
    try:
        with collector_paused():
            import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"
