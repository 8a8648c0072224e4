"""llmopt init: write a starter recipe."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from llmopt.cli.app import FormatOpt, app, sink


@app.command()
def init(
    path: Annotated[Path, typer.Argument(help="Where to write the recipe.")] = Path("recipe.toml"),
    name: Annotated[str, typer.Option(help="Recipe name.")] = "my-recipe",
    source: Annotated[str, typer.Option(help="Model: hub id, folder, .gguf file or builtin:smollm2-135m.")] = "builtin:smollm2-135m",
    format: FormatOpt = "human",
) -> None:
    """Write a starter recipe (baseline perplexity on the demo model) to edit.

    Examples:

        llmopt init

        llmopt init my.toml --name llama-awq --source meta-llama/Llama-3.1-8B-Instruct
    """
    from llmopt import api

    out = sink(format)
    target = api.init(path, name, source)
    out.result({"written": str(target)}, lambda c: c.print(f"wrote {target}; next: llmopt plan {target}"))
