"""User extras laid over the config llmopt planned for an engine.

A serve backend's ``extra_args`` (vLLM, SGLang) or ``extra`` (TensorRT-LLM) adds engine options
that llmopt does not plan. ``merge`` lays them over the planned config:

* deep where the engine's config is nested (TensorRT-LLM's ``kv_cache_config``): the planned
  keys an extra table does not name are kept;
* an extra that sets a key llmopt planned, to another value, contradicts the plan and is
  refused, unless the backend's ``override`` list names the key (or a table above it, as a
  dotted path: ``kv_cache_config.free_gpu_memory_fraction``): then the extra wins;
* an ``override`` entry must name a key the extras set (a misspelt one is an error, not a no-op).

Keys are compared in the engine's own canonical spelling, which each backend gives (vLLM's
negated booleans and SGLang's aliases name the planned key they change). The GPUs a replica
reserves are read from the merged config, so an extra parallel size reaches every file that
reserves GPUs.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from llmopt.errors import Problem, StageFailed


@dataclass
class Contradiction:
    path: str  # dotted key path in the engine's spelling
    extra: Any  # the value the extras set
    planned: Any  # the value llmopt planned


@dataclass
class Merged:
    config: dict
    contradictions: list[Contradiction] = field(default_factory=list)


def text(value: Any) -> str:
    """A value as the recipe (TOML) writes it: true / false, 0.5, "fp8"."""
    return json.dumps(value) if isinstance(value, (bool, str)) or value is None else str(value)


def same(a: Any, b: Any) -> bool:
    """Equal as the engine reads them: 1 == 1.0, but True is not 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return a == b


def overridden(path: str, won: Iterable[str]) -> bool:
    return any(path == w or path.startswith(w + ".") for w in won)


def merge(planned: dict, extra: dict, override: Iterable[str] = ()) -> Merged:
    """``planned`` with ``extra`` laid over it (deep for tables), and the extras that contradict it."""
    won = set(override)
    found: list[Contradiction] = []

    def walk(base: dict, top: dict, prefix: str) -> dict:
        out = dict(base)
        for key, value in top.items():
            path, mine = prefix + key, base.get(key)
            if isinstance(value, dict) and isinstance(mine, dict):
                out[key] = walk(mine, value, path + ".")
                continue
            if key in base and not same(mine, value) and not overridden(path, won):
                found.append(Contradiction(path, value, mine))
            out[key] = value
        return out

    return Merged(walk(planned, extra, ""), found)


def paths(tree: dict, prefix: str = "") -> set[str]:
    """Every dotted key path of ``tree``, tables included."""
    out = set()
    for key, value in tree.items():
        out.add(prefix + key)
        if isinstance(value, dict):
            out |= paths(value, prefix + key + ".")
    return out


def problems(merged: Merged, override: Iterable[str], extra: dict, where: str, options_key: str,
             planned_options: dict[str, str] | None = None, severity: str = "error") -> list[Problem]:
    """Plan problems of the merge: contradictions (with the fix) and override entries naming nothing.
    ``planned_options`` maps an engine key to the backend option that plans it (``tensor-parallel-size``:
    ``tensor_parallel_size``), named in the fix."""
    out = []
    for c in merged.contradictions:
        option = (planned_options or {}).get(c.path)
        fix = f"list it in override = [{text(c.path)}] to let {options_key} win"
        if option:
            fix += f", or set {option} = {text(c.extra)} (the memory model then plans with it)"
        out.append(Problem(f"{options_key}: {c.path} = {text(c.extra)} contradicts the planned {text(c.planned)}",
                           where, fix + f", or drop it from {options_key}", severity))
    known = paths(extra)
    for name in override:
        if name not in known:
            out.append(Problem(f"override names {name!r}, but {options_key} does not set it", where,
                               f"name keys of {options_key} (dotted for tables), e.g. "
                               f"{', '.join(sorted(known)[:3]) or 'none set'}"))
    return out


def parallel_sizes(extra: dict, won: Iterable[str], parallel: dict[str, str]) -> dict[str, int]:
    """The backend options an extra's parallel size sets for the memory model: ``parallel`` maps the engine's
    key (canonical spelling) to the option; only keys listed in ``override`` and set to a whole number >= 1."""
    won = set(won)
    return {field: extra[key] for key, field in parallel.items() if key in won and isinstance(extra.get(key), int)
            and not isinstance(extra[key], bool) and extra[key] >= 1}


def refuse(merged: Merged, options_key: str) -> None:
    """At render time: the extras contradict what llmopt planned from the artifact's real weights."""
    if merged.contradictions:
        said = "; ".join(f"{c.path} = {text(c.extra)} (planned {text(c.planned)})" for c in merged.contradictions)
        raise StageFailed(f"{options_key} contradicts the planned config: {said}", where=f"serve.{options_key}",
                          fix=f"list the keys in serve.override to let {options_key} win, or drop them")
