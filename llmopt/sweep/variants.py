"""Variants of a recipe: every combination of the sweep's axes, each planned by the one planner.

An axis is a key path and its values, exactly as ``-s key.path=value`` sets them
(``llmopt.recipe.load.apply_override``), so a variant is the recipe loaded with the
command line's ``-s`` overrides and then one override per axis. Each variant is loaded
and planned (``plan.build_plan``) before anything runs: one that cannot work (a value
the schema refuses, a group size that does not divide a layer's width) is kept with the
planner's own problems and skipped. Variants that share a prefix of stages share their
cache keys, so the cache, not the sweep, decides what runs once.
"""

from __future__ import annotations

import itertools
import json
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmopt.store.cache import Cache
from llmopt.errors import LlmoptError, Problem, RecipeError, UsageError
from llmopt.plan import Plan, build_plan, resolve_cache
from llmopt.recipe.load import LoadedRecipe, parse_recipe
from llmopt.recipe.schema import SweepSection

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclass
class Variant:
    """One combination of axis values, its plan, or why it cannot work."""

    index: int  # from 1, in the order of the axes' product
    id: str  # names its artifact folder: variants/<id>
    values: dict[str, Any]  # axis key -> value
    overrides: list[str]  # the command line's -s, then one per axis
    plan: Plan | None = None
    problems: list[Problem] = field(default_factory=list)  # the errors that make it impossible

    @property
    def possible(self) -> bool:
        return self.plan is not None and not self.problems

    @property
    def label(self) -> str:
        return ", ".join(f"{key}={toml_literal(value)}" for key, value in self.values.items()) or "(the recipe)"

    @property
    def keys(self) -> list[str]:
        return [s.key for s in self.plan.stages] if self.plan is not None else []

    def reason(self) -> str:
        return "; ".join(f"{p.where}: {p.message}" + (f" (hint: {p.hint})" if p.hint else "") for p in self.problems)


@dataclass
class SweepPlan:
    """Every variant of a recipe, planned; what the cache already holds."""

    loaded: LoadedRecipe  # the recipe with the command line's overrides, no axis applied
    text: str  # the recipe file's text, which every worker loads again
    settings: SweepSection
    axes: dict[str, list[Any]]
    base_overrides: list[str]
    variants: list[Variant]
    cache: Cache
    folder: Path  # the sweep's folder: variants/<id>/, report.json, report.md, plots, chosen/
    accuracy: str | None  # the eval on the accuracy axis
    cached_before: set[str]  # stage keys the cache held when the sweep was planned
    seconds: float = 0.0

    @property
    def runnable(self) -> list[Variant]:
        return [v for v in self.variants if v.possible]

    @property
    def impossible(self) -> list[Variant]:
        return [v for v in self.variants if not v.possible]

    def to_dict(self) -> dict:
        keys = [k for v in self.runnable for k in v.keys]
        return {
            "schema_version": 1,
            "recipe": {"name": self.loaded.recipe.name, "path": str(self.loaded.path)},
            "axes": self.axes,
            "folder": str(self.folder),
            "cache_dir": str(self.cache.root),
            "variants": [{"id": v.id, "values": v.values, "overrides": v.overrides, "possible": v.possible,
                          "reason": v.reason() or None,
                          "stages": [{"name": s.name, "key": s.key, "cached": s.key in self.cached_before}
                                     for s in (v.plan.stages if v.possible else [])]} for v in self.variants],
            "stage_runs": len(keys),
            "unique_stages": len(set(keys)),
            "cached_stages": len(set(keys) & self.cached_before),
            "plan_seconds": round(self.seconds, 3),
        }


def parse_axis(spec: str) -> tuple[str, list[Any]]:
    """``KEY=V1,V2`` from the command line: the key path and its values, each read as a TOML value
    (``gptq`` without quotes is the string "gptq")."""
    key, sep, raw = spec.partition("=")
    if not sep or not key.strip() or not raw.strip():
        raise UsageError(f"axis {spec!r} is not KEY=V1,V2", fix='write e.g. --axis compress[0].group_size=32,64')
    return key.strip(), [toml_value(part) for part in top_level_parts(raw)]


def top_level_parts(text: str) -> list[str]:
    """``text`` cut at each comma outside braces, brackets and quotes: ``{ method = "gptq", group_size = 32 },x``
    is two values, an inline table and a word."""
    parts, depth, quote, start = [], 0, "", 0
    for i, char in enumerate(text):
        if quote:
            quote = "" if char == quote and text[i - 1] != "\\" else quote
        elif char in "\"'":
            quote = char
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return parts + [text[start:]]


def toml_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        return text.strip()


def toml_literal(value: Any) -> str:
    """``value`` written as TOML, as the right-hand side of ``-s key=value`` reads it back."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {toml_literal(v)}" for k, v in value.items()) + "}"
    raise UsageError(f"an axis value of type {type(value).__name__} cannot be written as TOML: {value!r}")


def _toml_key(key: Any) -> str:
    key = str(key)
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def axes_of(settings: SweepSection | None, cli_axes: list[str]) -> dict[str, list[Any]]:
    """The recipe's axes, then the command line's (which add axes or replace one of the same key)."""
    axes = dict(settings.axes) if settings else {}
    for spec in cli_axes:
        key, values = parse_axis(spec)
        axes[key] = values
    for key in axes:
        if key.split(".")[0].split("[")[0] == "sweep":
            raise UsageError(f"axis {key!r} varies the sweep itself", fix="vary the recipe's own keys")
    return axes


def variant_ids(combos: list[dict[str, Any]]) -> list[str]:
    """Folder names from the values, unique: a string as it is, another value after its key's last part
    (``gptq-group_size32``), a table by its first value and then each other key whose value differs between
    the axis's tables of that first value (``gptq-group_size32-symmetricfalse``)."""
    ids: list[str] = []
    for index, values in enumerate(combos, 1):
        parts = [_slug(key, value, [c[key] for c in combos]) for key, value in values.items()]
        name = "-".join(p for p in parts if p)[:60] or "recipe"
        ids.append(name if name not in ids else f"{name}-{index}")
    return ids


def _slug(key: str, value: Any, axis: list[Any]) -> str:
    if isinstance(value, dict):
        first = next(iter(value.values()), "table")
        kin = [t for t in axis if isinstance(t, dict) and next(iter(t.values()), "table") == first]
        varying = [k for k in value if k != next(iter(value)) and len({toml_literal(t[k]) if k in t else "" for t in kin}) > 1]
        return "-".join([_slug(key, first, [])] + [_clean(k + _bare(value[k])) for k in varying])
    return _clean(value if isinstance(value, str) else key.replace("]", "").split(".")[-1].split("[")[-1] + toml_literal(value))


def _bare(value: Any) -> str:
    return value if isinstance(value, str) else toml_literal(value)


def _clean(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.]+", "_", text).strip("_.")


def plan_sweep(path: Path, overrides=(), cli_axes=(), cache_dir=None, folder=None, strict: bool = False) -> SweepPlan:
    """Load the recipe, expand its axes and plan every variant. Raises RecipeError when the recipe
    itself is invalid, when no variant can work, or (``strict``) when any variant cannot."""
    t0 = time.monotonic()
    path = Path(path)
    if not path.is_file():
        raise RecipeError(f"recipe file not found: {path}", fix="check the path, or list shipped recipes with `llmopt ls recipes`")
    text = path.read_text(encoding="utf-8")
    base = parse_recipe(text, path, list(overrides))
    settings = base.recipe.sweep or SweepSection()
    axes = axes_of(base.recipe.sweep, list(cli_axes))
    accuracy = accuracy_eval(base, settings)
    folder = Path(folder or Path("sweeps") / base.recipe.name)
    variants = expand(axes, overrides)
    for variant in variants:
        plan_variant(variant, text, path, cache_dir, folder / "variants" / variant.id, strict)
    cache = resolve_cache(cache_dir, base)
    keys = {k for v in variants for k in v.keys}
    the_plan = SweepPlan(base, text, settings, axes, list(overrides), variants, cache, folder, accuracy,
                         {k for k in keys if cache.has(k)})
    the_plan.seconds = time.monotonic() - t0
    refuse(the_plan, strict)
    refuse_speed_without_bench(the_plan)
    return the_plan


def expand(axes: dict[str, list[Any]], overrides=()) -> list[Variant]:
    """One variant per combination of the axes' values, in the order of their product, not yet planned."""
    combos = [dict(zip(axes, values)) for values in itertools.product(*axes.values())]
    return [Variant(index, vid, values, [*overrides, *axis_specs(values)])
            for index, (vid, values) in enumerate(zip(variant_ids(combos), combos), 1)]


def axis_specs(values: dict[str, Any]) -> list[str]:
    return [f"{key}={toml_literal(value)}" for key, value in values.items()]


def plan_variant(variant: Variant, text: str, path: Path, cache_dir, out: Path | None, strict: bool,
                 facts: bool = True) -> None:
    """Load and plan one variant; what the loader or the planner refuses becomes its problems (a variant
    the loader refuses has no plan)."""
    try:
        loaded = parse_recipe(text, path, variant.overrides)
        variant.plan = build_plan(loaded, cache_dir, out, strict=strict, facts=facts)
        problems = variant.plan.errors
    except LlmoptError as exc:  # the loader's problems, or an override that names no key
        problems = exc.problems or [Problem(exc.what, exc.where, exc.fix)]
    for problem in problems:  # an axis is not a command-line -s: say where the value came from
        for spec in axis_specs(variant.values):
            problem.where = problem.where.replace(f"-s {spec} (command line)", f"sweep axis {spec}")
    variant.problems = list(problems)


def axis_problems(loaded: LoadedRecipe, overrides=(), cache_dir=None, facts: bool = True,
                  strict: bool = False) -> list[Problem]:
    """What `llmopt validate` and `llmopt plan` say of a recipe's [sweep.axes], each problem named by its variant
    and axis: a variant the loader refuses (an unknown method or key, a value of the wrong type) is an error,
    as it is in `llmopt sweep`; one the planner refuses is a warning, since `llmopt sweep` skips it (an error
    with ``strict``, as `llmopt sweep --strict` refuses it)."""
    axes = axes_of(loaded.recipe.sweep, [])
    if not axes:
        return []
    text = loaded.path.read_text(encoding="utf-8")
    found = []
    for variant in expand(axes, overrides):
        plan_variant(variant, text, loaded.path, cache_dir, None, strict, facts)
        severity = "error" if variant.plan is None or strict else "warning"
        skipped = "" if severity == "error" else " (`llmopt sweep` skips this variant)"
        found += [Problem(p.message + skipped, f"variant {variant.id}: {p.where}", p.hint, severity)
                  for p in variant.problems]
    return found


def refuse(the_plan: SweepPlan, strict: bool) -> None:
    impossible = the_plan.impossible
    if not impossible or (the_plan.runnable and not strict):
        return
    problems = [Problem(v.reason(), f"variant {v.id}") for v in impossible]
    what = ("no variant of the sweep can run" if not the_plan.runnable
            else f"{len(impossible)} of {len(the_plan.variants)} variants cannot run (--strict)")
    raise RecipeError(what, where=str(the_plan.loaded.path), problems=problems,
                      fix="change the axes' values (each problem names the planner's reason)" +
                      ("" if not the_plan.runnable else ", or drop --strict to skip these variants"))


def refuse_speed_without_bench(the_plan: SweepPlan) -> None:
    """A speed objective or constraint judges what a bench stage measures: every variant must have one."""
    settings, loaded = the_plan.settings, the_plan.loaded
    keys = [("constraints", k) for k in settings.constraints.speed_keys()]
    if settings.objective == "fastest":
        keys.insert(0, ("objective",))
    unbenched = [v.id for v in the_plan.runnable if not v.plan.recipe.recipe.bench.enabled]
    if not keys or not unbenched:
        return
    where = loaded.where("sweep", *keys[0])
    named = ", ".join("sweep." + ".".join(k) for k in keys)
    raise RecipeError(f"{named} judges measured serving speed, and {len(unbenched)} variant(s) have no bench stage "
                      f"({', '.join(unbenched[:3])}{', ...' if len(unbenched) > 3 else ''})", where=where,
                      fix="set [bench] enabled = true (with a [serve] section) so that each variant is benchmarked, "
                      "or use objective smallest / most_accurate without speed constraints")


def accuracy_eval(loaded: LoadedRecipe, settings: SweepSection) -> str | None:
    names = [item.name for item in loaded.recipe.eval]
    if settings.accuracy is None:
        return names[0] if names else None
    if settings.accuracy not in names:
        raise RecipeError(f"sweep.accuracy names no [[eval]]: {settings.accuracy!r}",
                          where=loaded.where("sweep", "accuracy"),
                          fix=f"use one of: {', '.join(names)}" if names else "add an [[eval]] to the recipe")
    return settings.accuracy
