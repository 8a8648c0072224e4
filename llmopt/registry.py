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
  the plan runs it as its deploy stage).

Built-ins come from the explicit list in ``llmopt.backends``; third-party backends
from the ``llmopt.backends`` entry-point group. Duplicate names raise.
"""

from __future__ import annotations

import difflib
import importlib
from importlib.metadata import entry_points

from llmopt.errors import UsageError

KINDS = ("source", "compress", "export", "eval", "serve")
# what each kind must define; serve backends render launch configs instead of running a stage
REQUIRED = {kind: ("Options", "check", "run") for kind in KINDS} | {"serve": ("Options", "check", "render")}

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


def _load() -> None:
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    from llmopt.backends import BUILTIN

    for module in BUILTIN:
        importlib.import_module(module)
    for ep in entry_points(group="llmopt.backends"):
        ep.load()


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
