"""Generate docs/recipe.md (from the schema and every backend's options), docs/cli.md
(from the commands' help) and docs/models.md (from the model-family table, llmopt/model/families.toml). ``python -m llmopt.docgen`` writes them; ``--check`` exits 1
when the files on disk are out of date (a test runs it)."""

from __future__ import annotations

import sys
import typing
from pathlib import Path

from pydantic import BaseModel

from llmopt import registry
from llmopt.recipe import schema

DOCS = Path(__file__).resolve().parents[1] / "docs"
SECTIONS = [
    ("", schema.Recipe),
    ("model", schema.ModelSection),
    ("calibration", schema.CalibrationSection),
    ("[compress]", schema.CompressStep),
    ("export", schema.ExportSection),
    ("target", schema.TargetSection),
    ("compute", schema.ComputeSection),
    ("serve", schema.ServeSection),
    ("serve.workload", schema.Workload),
    ("serve.slo", schema.SLO),
    ("serve.speculative", schema.SpeculativeSection),
    ("[eval]", schema.EvalItem),
    ("bench", schema.BenchSection),
    ("tune", schema.TuneSection),
    ("output", schema.OutputSection),
    ("sweep", schema.SweepSection),
    ("sweep.constraints", schema.SweepConstraints),
]
BACKEND_TABLE = {"compress": "[[compress]] method", "export": "[export] format", "eval": "[[eval]] kind", "serve": "[serve] backend"}


def _type_name(annotation) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " \\| ".join(f"`{a!r}`".replace("'", '"') for a in typing.get_args(annotation))
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return " or ".join(_type_name(a) for a in typing.get_args(annotation) if a is not type(None))
    if origin is list:
        return f"list of {_type_name(typing.get_args(annotation)[0])}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "table"
    return getattr(annotation, "__name__", str(annotation))


def _default(field) -> str:
    if field.is_required():
        return "required"
    if field.default_factory is list:
        return "`[]`"
    if field.default_factory is not None:
        return "(table)"
    return f"`{field.default!r}`".replace("'", '"').replace("None", "none").replace("True", "true").replace("False", "false")


def fields_table(model: type[BaseModel], skip: set[str] = frozenset()) -> list[str]:
    lines = ["| key | type | default | description |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        desc = (field.description or "").replace("|", "\\|").replace("\n", " ")
        lines.append(f"| `{name}` | {_type_name(field.annotation)} | {_default(field)} | {desc} |")
    return lines


def recipe_md() -> str:
    out = ["# Recipe reference", "", "Generated from the schema by `python -m llmopt.docgen`; do not edit by hand.",
           "", "A recipe is a TOML file. Unknown keys are errors; every problem is reported at once with its",
           "file, line and key path. A backend table (`[[compress]]`, `[export]`, `[serve]`, `[[eval]]`) takes",
           "its own keys below plus the options of the backend it names, listed under Backends.", "",
           "Editor completion and checking: `llmopt schema > recipe.schema.json` writes the JSON Schema",
           "(draft 2020-12) with the options of every installed backend; with taplo / Even Better TOML, put",
           "`#:schema ./recipe.schema.json` on the recipe's first line.", ""]
    for title, model in SECTIONS:
        heading = "Top level" if not title else (f"[[{title[1:-1]}]]" if title.startswith("[") else f"[{title}]")
        out += [f"## {heading}", "", *fields_table(model), ""]
    for kind, label in BACKEND_TABLE.items():
        out += [f"## Backends: {label}", ""]
        for name, cls in registry.all_backends()[kind].items():
            doc = (sys.modules[cls.__module__].__doc__ or "").strip()
            out += [f"### `{name}`", "", doc, ""]
            if cls.Options.model_fields:
                out += fields_table(cls.Options) + [""]
    return "\n".join(out).rstrip() + "\n"


def cli_md() -> str:
    import typer.main

    from llmopt.cli.app import app
    from llmopt.cli.main import reference  # registers every command on app

    group = typer.main.get_command(app)
    out = ["# CLI reference", "", "Generated from the commands' help by `python -m llmopt.docgen`; do not edit by hand.", ""]
    out += [group.help or "", ""]
    for name in sorted(group.commands):
        command = group.commands[name]
        out += [f"## llmopt {name}", "", (command.help or "").strip(), "", "| option | help |", "|---|---|"]
        for param in command.params:
            opts = ", ".join(getattr(param, "opts", []) + getattr(param, "secondary_opts", [])) or param.name
            if param.param_type_name == "argument":
                opts = param.name.upper()
            out.append(f"| `{opts}` | {(getattr(param, 'help', '') or '').replace('|', '/')} |")
        out.append("")
    out.append(reference())
    return "\n".join(out).rstrip() + "\n"


MARK = {"works": "✅", "refused": "✗", "untested": "—"}
GROUPS = [("Sources", "source."), ("Compression", "compress."), ("Draft models", "draft"), ("Exports", "export."),
          ("Evals", "eval."), ("Serving", "deploy.")]


def models_md() -> str:
    """The supported-models page: a matrix a group of paths, then each family's paths with the test that shows
    each ✅ and the reason for each ✗."""
    from llmopt.model import families

    fams, paths = families.families(), families.paths()
    out = ["# Supported models", "", "Generated from llmopt/model/families.toml by `python -m llmopt.docgen`; do not "
           "edit by hand.", "", "✅ works, shown by the test named below on a tiny model of the family, built from its "
           "transformers config class (tests/families.py); ✗ refused at plan time, with the reason; — no test yet: "
           "the plan warns. A model family not listed is refused unless the recipe sets `model.allow_untested = "
           "true`. A family is the `model_type` of the converted checkpoint (a GGUF file's architecture is mapped "
           "to it).", "",
           "Beyond the suite's tiny models: vLLM served tiny models of six families from llmopt's launch configs on "
           "an H100 ([GPU engines](results/gpu-engines.md#other-model-families-on-vllm-tiny-models-of-six-families-"
           "served-from-llmopts-launch-configs-one-h100-2026-12-07)), and a real model of another family, Gemma 3 "
           "270M from its Q4_K_M GGUF, went through the quickstart with only `model.source` changed ([accuracy]"
           "(results/accuracy.md#a-real-model-of-another-family-gemma-3-270m-through-the-quickstart-this-cpu-2026-"
           "12-07)); `tests/test_real_gemma3.py` plans that recipe and runs its source and baseline in the suite.", ""]
    for title, prefix in GROUPS:
        cols = [p for p in paths if p.startswith(prefix)]
        names = [p.split(".", 1)[-1] for p in cols]
        out += [f"## {title}", "", "| family | " + " | ".join(f"`{n}`" for n in names) + " |",
                "|---|" + "---|" * len(cols)]
        for family in fams:
            out.append(f"| {family} | " + " | ".join(MARK[families.verdict(family, p).status] for p in cols) + " |")
        out += ["", "; ".join(f"`{p.split('.', 1)[-1]}`: {paths[p]}" for p in cols) + ".", ""]
    out += ["## Each family", ""]
    for family, entry in fams.items():
        gguf = ", ".join(f"`{g}`" for g in entry.get("gguf", [])) or "none"
        out += [f"### {entry['label']}: `{family}`", "", f"What sets it apart: {entry['traits']}. GGUF "
                f"architecture names: {gguf}.", ""]
        for path in paths:
            v = families.verdict(family, path)
            detail = {"works": f"`{v.test}`", "refused": f"{v.why}; instead: {v.instead}" if v.instead else v.why,
                      "untested": "no test yet"}[v.status]
            out.append(f"- {MARK[v.status]} `{path}`: {detail}")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def generated() -> dict[Path, str]:
    return {DOCS / "recipe.md": recipe_md(), DOCS / "cli.md": cli_md(), DOCS / "models.md": models_md()}


def main(argv: list[str]) -> int:
    stale = [path for path, text in generated().items() if not path.is_file() or path.read_text() != text]
    if "--check" in argv:
        for path in stale:
            print(f"{path} is out of date: run python -m llmopt.docgen")
        return 1 if stale else 0
    for path, text in generated().items():
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
