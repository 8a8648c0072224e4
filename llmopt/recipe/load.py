"""Read a recipe file: TOML, command-line overrides, then two validation passes.

All problems are collected and raised together as one ``RecipeError``, each with
``file:line: key.path: message (got X)`` and a hint where one exists; a key set
by ``-s key=value`` is named by its override instead of the file line it
replaced. Pass two checks a backend's own options, and the target GPU against the
catalogue, only where pass one found the name parsed cleanly, so one bad name
does not cascade into many errors.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import hashlib
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from llmopt import registry
from llmopt.errors import Problem, RecipeError, UsageError, on_command_line
from llmopt.recipe.lines import index_lines, line_of, render_path
from llmopt.recipe.schema import Recipe

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# (section in the recipe, field naming the backend, backend kind, is a list)
BACKEND_SECTIONS = (
    ("compress", "method", "compress", True),
    ("draft", "method", "compress", True),
    ("eval", "kind", "eval", True),
    ("export", "format", "export", False),
    ("serve", "backend", "serve", False),
)


@dataclass
class LoadedRecipe:
    """A validated recipe with where it came from and its backends' parsed options."""

    recipe: Recipe
    path: Path
    data: dict
    lines: dict = field(repr=False, default_factory=dict)
    # ("compress", 0) -> Options; with several engines in [serve] backend, ("serve", <engine>) -> each one's, and
    # ("serve", None) -> the first listed's (the prediction's default)
    options: dict[tuple, BaseModel] = field(default_factory=dict)
    overrides: dict[tuple, str] = field(default_factory=dict)  # ("compress", 0, "bits") -> "compress[0].bits=8"
    engine_keys: dict[str, dict] = field(default_factory=dict)  # several engines: engine -> the [serve] keys it takes
    engine: str | None = None  # the engine a view of ``for_engine`` is for

    def where(self, *key_path: Any) -> str:
        """``file:line: key.path``, or ``-s spec (command line)`` when an override set the key (or a table above it)."""
        key_path = self._in_engine_table(key_path)
        spec = self.override_of(key_path)
        if spec is not None:
            return spec if self._override_path(key_path) == tuple(key_path) else f"{spec}: {render_path(key_path)}"
        line = line_of(self.lines, key_path)
        loc = f"{self.path}:{line}" if line else str(self.path)
        return f"{loc}: {render_path(key_path)}" if key_path else loc

    def _in_engine_table(self, key_path: tuple) -> tuple:
        """A [serve] key that the engine of this view takes from its ``[serve.<engine>]`` table: that table's path."""
        serve = self.data.get("serve") if self.engine else None
        table = serve.get(self.engine) if isinstance(serve, dict) else None
        if isinstance(table, dict) and tuple(key_path[:1]) == ("serve",) and len(key_path) > 1 and key_path[1] in table:
            return ("serve", self.engine, *key_path[1:])
        return tuple(key_path)

    def for_engine(self, engine: str) -> LoadedRecipe:
        """The recipe as a recipe of ``engine`` alone, one of several [serve] backend lists: its [serve] holds the
        keys that engine takes, and its options are that engine's. A recipe of one engine is itself."""
        serve = self.recipe.serve
        if serve is None or serve.backend == engine:
            return self
        fields = {name: getattr(serve, name) for name in type(serve).model_fields}
        alone = type(serve).model_validate(fields | {"backend": engine} | self.engine_keys[engine])
        return dataclasses.replace(self, recipe=self.recipe.model_copy(update={"serve": alone}), engine=engine,
                                   options={**self.options, ("serve", None): self.options[("serve", engine)]})

    def override_of(self, key_path: tuple) -> str | None:
        """``-s spec (command line)`` of the override that set ``key_path`` or a table above it, else None."""
        found = self._override_path(key_path)
        return None if found is None else f"-s {self.overrides[found]} (command line)"

    def _override_path(self, key_path: tuple) -> tuple | None:
        """The override that set ``key_path`` or a table above it; else, where the file does not have
        ``key_path``, the first override inside it (``-s nokey.x=1`` made the table ``nokey``)."""
        key_path = tuple(key_path)
        for end in range(len(key_path), 0, -1):
            if key_path[:end] in self.overrides:
                return key_path[:end]
        if key_path and key_path not in self.lines:
            return next((key for key in self.overrides if key[: len(key_path)] == key_path), None)
        return None

    @property
    def digest(self) -> str:
        """SHA-256 of the recipe as validated (overrides applied), independent of formatting."""
        doc = json.dumps(self.recipe.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(doc.encode()).hexdigest()

    def options_for(self, section: str, index: int | None = None) -> BaseModel:
        return self.options[(section, index)]


def load_recipe(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> LoadedRecipe:
    path = Path(path)
    if not path.is_file():
        raise RecipeError(f"recipe file not found: {path}", fix="check the path, or list shipped recipes with `llmopt ls recipes`")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise RecipeError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})",
                          fix="save the recipe as UTF-8 (TOML files are UTF-8)") from None
    return parse_recipe(text, path, overrides)


def parse_recipe(text: str, path: Path, overrides=()) -> LoadedRecipe:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        found = re.search(r"\(at line (\d+), column (\d+)\)", str(exc))
        line, col = (found.group(1), found.group(2)) if found else (None, None)
        msg = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(exc))
        where = f"{path}:{line}:{col}" if line else str(path)
        raise RecipeError(f"TOML syntax error: {msg}", where=where, fix="correct the TOML syntax at that position") from None
    return validated(data, path, overrides, index_lines(text))


def resolved_recipe(resolved: dict, path: Path, overrides=()) -> LoadedRecipe:
    """The recipe an artifact's manifest records (``recipe.resolved``, every key as validated), with
    ``overrides``, validated as a recipe file is; ``path`` (the manifest) is where its problems are said to be."""
    return validated(copy.deepcopy(resolved), Path(path), overrides)


def validated(data: dict, path: Path, overrides=(), lines: dict | None = None) -> LoadedRecipe:
    """``data`` with ``overrides`` applied, through the validation passes; every problem in one RecipeError."""
    loaded = LoadedRecipe(recipe=None, path=path, data=data, lines=lines or {})  # type: ignore[arg-type]
    for spec in overrides:
        key = apply_override(data, spec)
        # a table set whole replaces what earlier overrides set inside it
        loaded.overrides = {k: v for k, v in loaded.overrides.items() if k[: len(key)] != key}
        loaded.overrides[key] = spec.strip()
    problems, bad_keys = _shape_pass(data, loaded)
    problems += _backend_pass(data, loaded, bad_keys)
    problems += _catalogue_pass(data, loaded, bad_keys)
    if [p for p in problems if p.severity == "error"]:
        count = len(problems)
        raise RecipeError(
            f"{path}: {count} problem{'s' if count > 1 else ''} in the recipe",
            problems=problems,
            fix=("fix the -s overrides above" if on_command_line(problems) else "edit the recipe")
            + " (`llmopt schema` prints every key with its description)",
        )
    return loaded


def _shape_pass(data: dict, loaded: LoadedRecipe) -> tuple[list[Problem], set[str]]:
    """Problems of the pydantic tree, and the key paths they are at."""
    try:
        loaded.recipe = Recipe.model_validate(data)
        return [], set()
    except ValidationError as exc:
        errors = exc.errors()
        return [_problem(err, loaded, Recipe) for err in errors], {render_path(tuple(err["loc"])) for err in errors}


def _catalogue_pass(data: dict, loaded: LoadedRecipe, bad_keys: set[str]) -> list[Problem]:
    """Names that must be in a catalogue: the target GPU and the compute GPU (checked only where they parsed
    as names)."""
    from llmopt.catalog.gpus import get_gpu

    problems = []
    for section in ("target", "compute"):
        table = data.get(section)
        name = table.get("gpu") if isinstance(table, dict) else None
        if not isinstance(name, str) or f"{section}.gpu" in bad_keys:
            continue
        try:
            get_gpu(name)
        except UsageError as exc:  # names the catalogue, with "did you mean"
            problems.append(Problem(exc.what, loaded.where(section, "gpu"), exc.fix))
    return problems


def _backend_pass(data: dict, loaded: LoadedRecipe, bad_names: set[str]) -> list[Problem]:
    problems: list[Problem] = []
    from llmopt.recipe import schema

    step_models = {"compress": schema.CompressStep, "draft": schema.CompressStep, "eval": schema.EvalItem, "export": schema.ExportSection, "serve": schema.ServeSection}
    for section, name_key, kind, is_list in BACKEND_SECTIONS:
        raw = data.get(section)
        if raw is None:
            if section == "export":
                raw = {}
            else:
                continue
        items = list(enumerate(raw)) if is_list and isinstance(raw, list) else [(None, raw)]
        for index, item in items:
            if not isinstance(item, dict):
                continue
            base = (section,) if index is None else (section, index)
            name = item.get(name_key, "hf" if section == "export" else None)
            if section == "serve" and isinstance(name, list) and "serve.backend" not in bad_names:
                if len(name) != 1:  # several engines (a list of one is that engine)
                    problems += _engines_pass(item, loaded)
                    continue
                name = name[0]
            if not isinstance(name, str) or render_path(base + (name_key,)) in bad_names:
                continue
            try:
                backend = registry.get(kind, name)
            except UsageError as exc:  # names the valid choices
                problems.append(Problem(exc.what, loaded.where(*base, name_key)))
                continue
            core = set(step_models[section].model_fields)
            extras = {k: v for k, v in item.items() if k not in core}
            try:
                loaded.options[(section, index)] = backend.Options.model_validate(extras)
            except ValidationError as exc:
                for err in exc.errors():
                    known = set(backend.Options.model_fields) | core if len(err["loc"]) == 1 else None
                    err = dict(err, loc=base + tuple(err["loc"]))
                    problems.append(_problem(err, loaded, backend.Options, known))
    return problems


def _engines_pass(item: dict, loaded: LoadedRecipe) -> list[Problem]:
    """[serve] backend listing several engines: each once, each registered. Every other key of [serve] must be an
    option of at least one of them and goes to each that has it; a ``[serve.<engine>]`` table holds that engine's
    own values, over those. Each engine's keys are validated against its own options."""
    from llmopt.recipe.schema import ServeSection

    valid = registry.names("serve")
    if not item["backend"]:
        return [Problem("backend lists no engine", loaded.where("serve", "backend"),
                        f"name one engine, or list several of: {', '.join(valid)}")]
    problems: list[Problem] = []
    engines: dict[str, type] = {}
    for index, name in enumerate(item["backend"]):
        if name in engines:
            problems.append(Problem(f"{name!r} is listed twice", loaded.where("serve", "backend", index),
                                    "list each engine once"))
            continue
        try:
            engines[name] = registry.get("serve", name)
        except UsageError as exc:  # "did you mean"
            problems.append(Problem(exc.what, loaded.where("serve", "backend", index),
                                    f"list engines of: {', '.join(valid)}"))
    core = set(ServeSection.model_fields)
    given = {k: v for k, v in item.items() if k not in core}
    tables = {k: given.pop(k) for k in list(given) if k in valid}
    for name, table in tables.items():
        if name not in engines:
            problems.append(Problem(f"[serve.{name}] gives options of {name}, which backend does not list",
                                    loaded.where("serve", name), f'add "{name}" to backend, or remove the table'))
        elif not isinstance(table, dict):
            problems.append(Problem(f"serve.{name} is not a table of {name}'s options", loaded.where("serve", name),
                                    f"write its keys under [serve.{name}]"))
    known = set().union(*(cls.Options.model_fields for cls in engines.values()))
    if len(engines) == len(set(item["backend"])):  # an unknown engine's keys are not judged
        problems += [_problem({"loc": ("serve", key), "type": "extra_forbidden", "msg": ""}, loaded, ServeSection,
                              known | core | set(engines)) for key in given if key not in known]
    for name, cls in engines.items():
        table = tables.get(name) if isinstance(tables.get(name), dict) else {}
        loaded.engine_keys[name] = {k: v for k, v in given.items() if k in cls.Options.model_fields} | table
        try:
            loaded.options[("serve", name)] = cls.Options.model_validate(loaded.engine_keys[name])
        except ValidationError as exc:
            problems += [_engine_problem(err, name, cls.Options, table, loaded) for err in exc.errors()]
    first = ("serve", next(iter(engines), None))
    if first in loaded.options:
        loaded.options[("serve", None)] = loaded.options[first]
    return problems


def _engine_problem(err: dict, engine: str, model: type[BaseModel], table: dict, loaded: LoadedRecipe) -> Problem:
    """A problem of ``engine``'s options: at its ``[serve.<engine>]`` table's key, or at a [serve] key several
    engines take, saying which engine refused it."""
    own = bool(err["loc"]) and err["loc"][0] in table
    base = ("serve", engine) if own else ("serve",)
    problem = _problem(dict(err, loc=base + tuple(err["loc"])), loaded, model,
                       set(model.model_fields) if len(err["loc"]) == 1 else None)
    if own:
        return problem
    return Problem(f"{engine}: {problem.message}", problem.where,
                   "; ".join(filter(None, [problem.hint, f"give {engine} its own value in [serve.{engine}]"])))


def _problem(err: dict, loaded: LoadedRecipe, model: type[BaseModel], known: set | None = None) -> Problem:
    loc = tuple(err["loc"])
    kind = err["type"]
    message = err["msg"]
    hint = ""
    if kind == "extra_forbidden":
        known = sorted(known if known is not None else _fields_at(model, loc[:-1]))
        message = f"unknown key {loc[-1]!r}"
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = (f"did you mean {close[0]!r}? " if close else "") + f"valid keys here: {', '.join(known)}"
    elif kind == "missing":
        message = "required key is missing"
    elif kind == "literal_error":
        close = difflib.get_close_matches(str(err.get("input")), _literal_choices(err), n=1)
        hint = f"did you mean {close[0]!r}?" if close else ""
    if kind not in ("missing", "extra_forbidden") and "input" in err:
        message += f" (got {json.dumps(err['input'], default=str)})"
    return Problem(message, loaded.where(*loc), hint)


def _literal_choices(err: dict) -> list[str]:
    expected = (err.get("ctx") or {}).get("expected", "")
    return [part.strip(" '") for part in expected.replace(" or ", ",").split(",") if part.strip()]


def _fields_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """Field names of the sub-model found by following ``loc`` from ``model``."""
    import typing

    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        field_info = getattr(current, "model_fields", {}).get(part)
        if field_info is None:
            return []
        current = field_info.annotation
        for arg in typing.get_args(current) or ():
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                current = arg
                break
            for inner in typing.get_args(arg):
                if isinstance(inner, type) and issubclass(inner, BaseModel):
                    current = inner
    return list(getattr(current, "model_fields", {}))


def apply_override(data: dict, spec: str) -> tuple:
    """Apply ``key.path=value`` (``compress[0].bits=8`` or ``compress.0.bits=8``) to ``data``; return the key path."""
    if "=" not in spec:
        raise UsageError(f"override {spec!r} has no '='", fix="write -s key.path=value, e.g. -s calibration.samples=16")
    key, _, raw = spec.partition("=")
    parts: list[Any] = []
    for piece in key.strip().replace("]", "").replace("[", ".").split("."):
        if piece:
            parts.append(int(piece) if piece.isdigit() else piece)
    if not parts:
        raise UsageError(f"override {spec!r} names no key", fix="write -s key.path=value")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    node: Any = data
    for part, nxt in zip(parts, parts[1:]):
        if isinstance(part, int):
            if not isinstance(node, list) or part >= len(node):
                raise UsageError(f"override {spec!r}: index {part} is out of range", fix="count the recipe's tables from 0")
            node = node[part]
        else:
            if part not in node or not isinstance(node[part], (dict, list)):
                node[part] = [] if isinstance(nxt, int) else {}
            node = node[part]
    last = parts[-1]
    if isinstance(last, int):
        if not isinstance(node, list) or last >= len(node):
            raise UsageError(f"override {spec!r}: index {last} is out of range", fix="count the recipe's tables from 0")
    node[last] = copy.deepcopy(value)
    return tuple(parts)
