"""The recipe's JSON Schema (draft 2020-12), with the options of every registered backend.

pydantic gives the shape of the recipe (``llmopt.recipe.schema``) and each backend's
``Options``; this module joins them. Each backend table (``[[compress]]``, ``[export]``,
``[serve]``, ``[[eval]]``, as listed in ``llmopt.recipe.load.BACKEND_SECTIONS``) becomes:

* its naming key (``method``, ``format``, ``backend``, ``kind``) as an enum of the names
  registered now, built-ins and entry-point backends alike;
* ``oneOf`` one closed branch per backend: the naming key as a ``const``, the section's core
  keys, that backend's options, and ``additionalProperties: false``. So a ``method = "gptq"``
  table is checked against GPTQ's keys, and ``group_sizee`` or perplexity's ``window`` fails;
* for ``[serve]``, whose ``backend`` may list several engines, one more branch: the list, every
  engine's options and a ``[serve.<engine>]`` table of each engine's own.

Editors: taplo (Even Better TOML) gathers completions from ``properties``, ``$ref``,
``oneOf``, ``anyOf`` and ``allOf`` (not from ``if``/``then``) and validates as draft 7. So the
schema uses only keywords that mean the same in draft 7 and 2020-12: nothing that constrains
next to a ``$ref``, no ``prefixItems``, no ``unevaluatedProperties``; and ``oneOf`` branches
rather than ``if``/``then``. taplo does not narrow ``oneOf`` by value, so it completes the
keys of every backend of a section; validation is exact.

The loader (``llmopt.recipe.load``) is the truth. The schema is looser where a rule is Python
code that JSON Schema cannot express: cross-key rules in ``check`` (W8A8 takes no
``group_size``), validators such as onnx's ``trt_profile`` order (min <= opt <= max), and a
[serve] key of several engines, which one of the engines listed must take (the schema: any engine). It is
stricter only where pydantic coerces in lax mode (``group_size = "64"``, ``symmetric = 1``):
it states the type a recipe should use. TOML has no null, so ``null`` alternatives are dropped.
"""

from __future__ import annotations

import re
import sys
from typing import Any

from llmopt import registry
from llmopt.recipe.load import BACKEND_SECTIONS
from llmopt.recipe import schema
from llmopt.recipe.schema import Recipe

DRAFT = "https://json-schema.org/draft/2020-12/schema"
# The rule of Recipe._slug and EvalItem._slug (llmopt.recipe.schema.NAME_PATTERN), Python
# validators pydantic cannot export, anchored for JSON Schema.
NAME_PATTERN = f"^{schema.NAME_PATTERN}$"


def json_schema() -> dict:
    """The recipe's JSON Schema, each backend table with the options of its registered backends."""
    root = Recipe.model_json_schema()
    defs = root["$defs"]
    for names in (root, defs["EvalItem"]):
        names["properties"]["name"]["pattern"] = NAME_PATTERN
    backends = registry.all_backends()
    done = set()  # [[draft]] steps are [[compress]] steps: one table of both
    for section, key, kind, _ in BACKEND_SECTIONS:
        def_name = _ref_name(root["properties"][section])
        if def_name not in done:
            defs[def_name] = _backend_table(defs[def_name], key, kind, backends[kind], defs)
            done.add(def_name)
    head = {"$schema": DRAFT, "title": root.pop("title"),
            "description": "An llmopt recipe (TOML), with the options of the backends installed when "
            "`llmopt schema` wrote it."}
    return _drop_null({**head, **root})


def _ref_name(prop: dict) -> str:
    """The $defs name a recipe property points at: directly, through items, or an anyOf."""
    for candidate in (prop, prop.get("items", {}), *prop.get("anyOf", ())):
        ref = candidate.get("$ref", "")
        if ref.startswith("#/$defs/"):
            return ref.removeprefix("#/$defs/")
    raise ValueError(f"recipe property has no $ref: {prop}")


def _backend_table(core: dict, key: str, kind: str, backends: dict[str, type], defs: dict) -> dict:
    """The section's core keys, ``key`` an enum of ``backends``, and one closed branch per backend."""
    properties = dict(core["properties"])
    default = properties[key].get("default")
    names = list(backends)
    properties[key] = dict(properties[key], enum=names)
    # taplo shows these on hover over the value: each backend's one-line summary
    properties[key]["x-taplo"] = {"docs": {"enumValues": [_summary(cls).split(". ")[0] for cls in backends.values()]}}
    branches = []
    for name, cls in backends.items():
        def_name = _def_name(kind, name)
        defs[def_name] = _branch(core, key, name, cls, needs_key=name != default, defs=defs, prefix=def_name)
        branches.append({"$ref": f"#/$defs/{def_name}"})
    if kind == "serve":  # backend names one engine, or lists several
        one = {k: v for k, v in properties[key].items() if k not in ("anyOf", "description", "title")}
        properties[key] = {"description": properties[key]["description"],
                           "anyOf": [{"type": "string", **one}, ENGINE_LIST | {"items": {"enum": names}}]}
        defs[ENGINES] = _engines_branch(core, key, backends, defs)
        branches.append({"$ref": f"#/$defs/{ENGINES}"})
    table = {k: v for k, v in core.items() if k not in ("properties", "additionalProperties", "required")}
    table.update(type="object", properties=properties, oneOf=branches)
    if core.get("required"):
        table["required"] = core["required"]
    return table


def _branch(core: dict, key: str, name: str, cls: type, needs_key: bool, defs: dict, prefix: str) -> dict:
    """One backend's table: ``key = name``, the core keys and its options; nothing else."""
    options = cls.Options.model_json_schema()
    _adopt_defs(options, prefix, defs)
    core_keys = {k: v for k, v in core["properties"].items() if k != key}
    # a core key never reaches a backend's options in the loader, so the core schema wins
    own = {k: v for k, v in options.get("properties", {}).items() if k not in core["properties"]}
    required = [k for k in core.get("required", []) if k != key] + options.get("required", [])
    branch = {
        "type": "object",
        "title": f'{key} = "{name}"',
        "description": _summary(cls),
        "properties": {key: {"const": name}, **own, **core_keys},
        "required": ([key] if needs_key else []) + required,
        "additionalProperties": False,
    }
    if not branch["required"]:
        del branch["required"]
    return branch


ENGINES = "ServeEngines"  # the $defs name of [serve] with several engines
ENGINE_LIST = {"type": "array", "minItems": 1, "uniqueItems": True}


def _engines_branch(core: dict, key: str, backends: dict[str, type], defs: dict) -> dict:
    """[serve] listing several engines in ``key``: the core keys, every engine's options (a key several engines
    take: any of their forms) and a table per engine of its own options; nothing else."""
    tables: dict[str, dict] = {}
    shared: dict[str, list] = {}
    for name, cls in backends.items():
        options = cls.Options.model_json_schema()
        _adopt_defs(options, _def_name("serve", name), defs)
        own = {k: v for k, v in options.get("properties", {}).items() if k not in core["properties"]}
        tables[name] = {"type": "object", "description": f"{name}'s own values, over the [serve] keys it takes.",
                        "properties": own, "additionalProperties": False}
        for option, form in own.items():
            forms = shared.setdefault(option, [])
            if form not in forms:
                forms.append(form)
    options = {k: forms[0] if len(forms) == 1 else {"anyOf": forms} for k, forms in shared.items()}
    core_keys = {k: v for k, v in core["properties"].items() if k != key}
    return {"type": "object", "title": f"{key} = [several engines]",
            "description": "Each engine listed is deployed and tuned; the artifact is served by the one measured best.",
            "properties": {key: ENGINE_LIST | {"items": {"enum": list(backends)}}, **options, **tables, **core_keys},
            "required": [key], "additionalProperties": False}


def _adopt_defs(schema: dict, prefix: str, defs: dict) -> None:
    """Move ``schema``'s own $defs into ``defs`` under ``prefix.``, so two backends' models of
    one name (two ``Layer`` models, say) do not overwrite each other, and repoint its $refs."""
    own = schema.pop("$defs", {})
    renamed = {f"#/$defs/{name}": f"#/$defs/{prefix}.{name}" for name in own}

    def repoint(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("$ref") in renamed:
                node["$ref"] = renamed[node["$ref"]]
            for value in node.values():
                repoint(value)
        elif isinstance(node, list):
            for value in node:
                repoint(value)

    repoint(schema)
    for name, sub in own.items():
        repoint(sub)
        defs[f"{prefix}.{name}"] = sub


def _def_name(kind: str, name: str) -> str:
    """A $defs name for a backend, safe inside a JSON pointer (no '/' or '~')."""
    return f"{kind}.{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}"


def _summary(cls: type) -> str:
    """The first paragraph of the backend module's docstring, on one line."""
    doc = (sys.modules[cls.__module__].__doc__ or cls.__doc__ or "").strip()
    return " ".join(doc.split("\n\n")[0].split())


def _drop_null(node: Any) -> Any:
    """Remove ``{"type": "null"}`` alternatives and ``"default": null``: TOML has no null, a
    recipe leaves the key out instead. A one-member ``anyOf`` is folded into its parent."""
    if isinstance(node, list):
        return [_drop_null(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {k: _drop_null(v) for k, v in node.items() if not (k == "default" and v is None)}
    if "anyOf" in node:
        rest = [alt for alt in node["anyOf"] if alt != {"type": "null"}]
        if len(rest) == 1 and not set(rest[0]) & set(node):
            node.pop("anyOf")
            node.update(rest[0])
        else:
            node["anyOf"] = rest
    return node
