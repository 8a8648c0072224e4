"""A small explicit registry of backends.

A backend is a class registered with ``@register(kind, name)`` that subclasses its kind's
contract in ``llmopt.backends.base`` (``CompressBackend``, ``ServeBackend``...): ``Options``
(the recipe keys that belong to it), ``requires`` / ``extra`` (the distributions it imports
when it runs and the extra that installs them), ``check`` (plan-time), ``run`` (or, for serve
backends, ``render``: the engine's launch configs, run as the deploy stage), and each kind's
declared capabilities with their defaults (what a compress step calibrates on, produces, ...).
Registering a class that meets another kind's contract, or none, or leaves one of its
methods undefined, raises.

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

KINDS = ("source", "compress", "export", "eval", "serve")  # the recipe's steps
# the stages the plan adds after them (gate, deploy, bench, tune, choose): registered as "stage" backends named by
# kind, from these modules
STAGE_MODULES = ("llmopt.plan.stages", "llmopt.bench.stage", "llmopt.bench.acceptance", "llmopt.tune.stage",
                 "llmopt.tune.choose")

_REGISTRY: dict[str, dict[str, type]] = {kind: {} for kind in (*KINDS, "stage")}
_LOADED = False


def register(kind: str, name: str):
    """Register the decorated class as backend ``name`` of ``kind``."""
    if kind not in _REGISTRY:
        raise ValueError(f"unknown backend kind {kind!r}; kinds are {', '.join(_REGISTRY)}")

    def wrap(cls: type) -> type:
        existing = _REGISTRY[kind].get(name)
        if existing is not None and existing is not cls:
            raise ValueError(f"{kind} backend {name!r} is registered twice: {existing.__module__} and {cls.__module__}")
        problem = contract_problem(cls, kind)
        if problem:
            raise TypeError(f"{kind} backend {name!r} ({cls.__module__}) {problem}")
        cls.kind, cls.name = kind, name
        _REGISTRY[kind][name] = cls
        return cls

    return wrap


def contract_problem(cls: type, kind: str) -> str:
    """What keeps ``cls`` from being a ``kind`` backend: not a subclass of that kind's contract class in
    ``llmopt.backends.base``, a method of the contract left undefined, or no options model; "" if none."""
    from pydantic import BaseModel

    if not isinstance(cls, type) or cls.__dict__.get("contract") or getattr(cls, "contract", None) != kind:
        return f"must subclass the {kind} contract of llmopt.backends.base"
    if getattr(cls, "__abstractmethods__", None):
        return f"does not define {', '.join(sorted(cls.__abstractmethods__))}"
    options = getattr(cls, "Options", None)
    if not (isinstance(options, type) and issubclass(options, BaseModel)):
        return "has no Options model"
    return ""


def builtin_modules() -> list[str]:
    """The modules of ``llmopt/backends/<kind>/`` whose names do not start with "_", in name order, and the
    stage kinds' modules."""
    modules = list(STAGE_MODULES)
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
    return {kind: dict(sorted(_REGISTRY[kind].items())) for kind in KINDS}


def stage_kind(kind: str, backend: str):
    """The stage the plan adds of ``kind`` (gate, deploy, bench, tune), for the serve backend ``backend``."""
    _load()
    return _REGISTRY["stage"][kind](backend)
