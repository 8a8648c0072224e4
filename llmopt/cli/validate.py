"""llmopt validate: check a recipe without planning or running it."""

from __future__ import annotations

from llmopt.cli.app import FormatOpt, RecipeArg, SetOpt, app, sink


@app.command()
def validate(recipe: RecipeArg, set_: SetOpt = None, format: FormatOpt = "human") -> None:
    """Check a recipe's syntax, keys, types and backend options; report every problem at once.

    Examples:

        llmopt validate recipes/quickstart.toml

        llmopt validate my.toml -s calibration.samples=8 --format json
    """
    from llmopt import api

    out = sink(format)
    loaded = api.validate(recipe, set_ or [])
    doc = {"valid": True, "recipe": loaded.recipe.name, "path": str(loaded.path), "sha256": loaded.digest}
    out.result(doc, lambda c: c.print(f"[green]valid[/]: {loaded.path} ({loaded.recipe.name})"))
