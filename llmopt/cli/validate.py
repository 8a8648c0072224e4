"""llmopt validate: check a recipe without reading its model, planning stages or running them."""

from __future__ import annotations

from llmopt.cli.app import FormatOpt, RecipeArg, SetOpt, app, sink


@app.command()
def validate(recipe: RecipeArg, set_: SetOpt = None, format: FormatOpt = "human") -> None:
    """Check a recipe without its model: syntax, keys, types, catalogue names, backend options, each
    backend's plan-time checks and the rules across stages; report every problem at once (exit 2).
    A recipe with [sweep.axes] is checked whole: each variant the axes make is loaded and checked too,
    and one with an unknown method or key, or a value of the wrong type, is a problem naming the
    variant and the axis.

    Reads no config.json, weights or hub: the checks that need model facts are listed as not run
    (`llmopt plan` runs them).

    Examples:

        llmopt validate recipes/quickstart.toml

        llmopt validate my.toml -s calibration.samples=8 --format json
    """
    from llmopt import api

    out = sink(format)
    result = api.validation(recipe, set_ or [])
    loaded = result.loaded
    doc = {"valid": True, "recipe": loaded.recipe.name, "path": str(loaded.path), "sha256": loaded.digest,
           "warnings": [p.to_dict() for p in result.warnings], "unchecked": result.unchecked}
    out.result(doc, lambda c: _show(c, result))


def _show(console, result) -> None:
    from rich.markup import escape

    console.print(f"[green]valid[/]: {result.loaded.path} ({result.loaded.recipe.name})")
    for problem in result.warnings:
        console.print(f"[yellow]warning[/]: {escape(str(problem))}")
    console.print("[dim]not checked without model facts (`llmopt plan` checks them):[/]")
    for line in result.unchecked:
        console.print(f"[dim]  {escape(line)}[/]")
