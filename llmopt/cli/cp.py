"""llmopt cp: copy a shipped recipe to edit."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from llmopt.cli.app import FormatOpt, app, sink


@app.command()
def cp(
    name: Annotated[str, typer.Argument(help="Shipped recipe name (see `llmopt ls recipes`).")],
    dest: Annotated[Optional[Path], typer.Argument(help="Destination file or folder (default: ./<name>.toml).")] = None,
    format: FormatOpt = "human",
) -> None:
    """Copy a shipped recipe into the current folder (or DEST) to edit it.

    Examples:

        llmopt cp quickstart

        llmopt cp quickstart recipes/mine.toml
    """
    from llmopt import api

    out = sink(format)
    target = api.copy_recipe(name, dest)
    out.result({"written": str(target)}, lambda c: c.print(f"wrote {target}"))
