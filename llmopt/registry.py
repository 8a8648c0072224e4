"""A small explicit registry of backends.

A backend is a class registered with ``@register(kind, name)``. It declares:

* ``Options``: a pydantic model (``extra="forbid"``, a description on every field)
  holding the recipe keys that belong to this backend;
* ``requires``: the distributions it imports when it runs (their versions go into
  cache keys), and ``extra``: the llmopt extra that installs them;
* ``check(options, ctx) -> list[Problem]``: plan-time checks, no heavy imports;
* ``run(options, ctx) -> dict``: does the work, writes into ``ctx.out_dir`` and
  returns metrics (serve backends instead ``render(options, ctx) -> dict``, writing
  the engine's launch configs for the model at ``ctx.model_dir`` into ``ctx.out_dir``;
  the plan runs it as its deploy stage);
* compress and export backends: ``produces(options) -> Format``, the checkpoint format
  they write (``llmopt.formats``); serve backends: ``accepts(options) -> {Format: Rule}``,
  what the engine serves of each format on which GPUs (``llmopt.deploy.compat``). An
  export that consumes checkpoints may declare ``accepts`` too (the onnx export does).
  Registering a backend that lacks what its kind must define raises.

Built-ins are the modules of ``llmopt/backends/<kind>/`` whose names do not start with
"_" (those are shared helpers), all imported when the registry is first read; an import
error raises. Third-party backends come from the ``llmopt.backends`` entry-point group.
Duplicate names raise.
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
from importlib.metadata import entry_points

from llmopt.errors import UsageError

KINDS = ("source", "compress", "export", "eval", "serve")
# what each kind must define; serve backends render launch configs instead of running a stage, and the
# planner asks what compress / export stages produce and what the serving engine accepts
REQUIRED = {kind: ("Options", "check", "run") for kind in KINDS} | {
    "compress": ("Options", "check", "run", "produces"),
    "export": ("Options", "check", "run", "produces"),
    "serve": ("Options", "check", "render", "accepts"),
}

_REGISTRY: dict[str, dict[str, type]] = {kind: {} for kind in KINDS}
_LOADED = False


def register(kind: str, name: str):
    """Register the decorated class as backend ``name`` of ``kind``."""
    if kind not in _REGISTRY:
        raise ValueError(f"unknown backend kind {kind!r}; kinds are {', '.join(KINDS)}")

    def wrap(cls: type) -> type:
        existing = _REGISTRY[kind].get(name)
        if existing is not None and existing is not cls:
            raise ValueError(f"{kind} backend {name!r} is registered twice: {existing.__module__} and {cls.__module__}")
        for attr in REQUIRED[kind]:
            if not hasattr(cls, attr):
                raise TypeError(f"{kind} backend {name!r} ({cls.__module__}) has no {attr}")
        cls.kind, cls.name = kind, name
        cls.requires = tuple(getattr(cls, "requires", ()))
        cls.extra = getattr(cls, "extra", None)
        _REGISTRY[kind][name] = cls
        return cls

    return wrap


def builtin_modules() -> list[str]:
    """The modules of ``llmopt/backends/<kind>/`` whose names do not start with "_", in name order."""
    modules = []
    for kind in KINDS:
        package = importlib.import_module(f"llmopt.backends.{kind}")
        found = sorted(info.name for info in pkgutil.iter_modules(package.__path__))
        modules += [f"{package.__name__}.{name}" for name in found if not name.startswith("_")]
    return modules


def _load() -> None:
    global _LOADED
    if _LOADED:
        return
    for module in builtin_modules():
        importlib.import_module(module)
    for ep in entry_points(group="llmopt.backends"):
        ep.load()
    _LOADED = True


def names(kind: str) -> list[str]:
    _load()
    return sorted(_REGISTRY[kind])


def get(kind: str, name: str, where: str = "") -> type:
    """The backend class, or a UsageError naming the valid choices."""
    _load()
    try:
        return _REGISTRY[kind][name]
    except KeyError:
        raise UsageError(unknown_name_message(kind, name), where=where) from None


def unknown_name_message(kind: str, name: str) -> str:
    valid = names(kind)
    close = difflib.get_close_matches(str(name), valid, n=1)
    text = f"unknown {kind} backend {name!r}"
    if close:
        text += f"; did you mean {close[0]!r}?"
    return text + f" (valid: {', '.join(valid)})"


def all_backends() -> dict[str, dict[str, type]]:
    _load()
    return {kind: dict(sorted(by_name.items())) for kind, by_name in _REGISTRY.items()}
