"""llmopt ls: list backends, shipped recipes, built-in data and the GPU catalogue."""

from __future__ import annotations

from typing import Annotated

import typer

from llmopt.cli.app import FormatOpt, app, sink

WHAT = ("backends", "recipes", "data", "gpus")


@app.command()
def ls(
    what: Annotated[str, typer.Argument(help="backends, recipes, data, gpus or all.")] = "all",
    format: FormatOpt = "human",
) -> None:
    """List registered backends, shipped recipes, built-in data (with each set's domain) and the GPU catalogue.

    Examples:

        llmopt ls

        llmopt ls recipes

        llmopt ls data

        llmopt ls gpus --format json
    """
    from llmopt import api
    from llmopt.errors import UsageError

    if what not in (*WHAT, "all"):
        raise UsageError(f"cannot list {what!r}", fix=f"use one of: {', '.join(WHAT)}, all")
    out = sink(format)
    doc = {}
    if what in ("backends", "all"):
        doc["backends"] = api.backends()
    if what in ("recipes", "all"):
        doc["recipes"] = api.shipped_recipes()
    if what in ("data", "all"):
        doc["data"] = api.builtin_data()
    if what in ("gpus", "all"):
        doc["gpus"] = api.gpus()
    out.result(doc, lambda c: _show(c, doc))


def _show(console, doc) -> None:
    from rich.table import Table

    if "backends" in doc:
        table = Table(title="backends")
        for col in ("kind", "name", "extra", "what it does"):
            table.add_column(col)
        for kind, items in doc["backends"].items():
            for item in items:
                table.add_row(kind, item["name"], item["extra"] or "-", item["summary"])
        console.print(table)
    if "recipes" in doc:
        table = Table(title="shipped recipes (llmopt cp NAME)")
        table.add_column("name")
        table.add_column("purpose")
        for item in doc["recipes"]:
            table.add_row(item["name"], item["purpose"])
        console.print(table)
    if "data" in doc:
        table = Table(title="built-in data (data = \"builtin:NAME\")")
        for col in ("name", "role", "domain", "what it holds"):
            table.add_column(col)
        for item in doc["data"]:
            table.add_row(item["name"], item["role"], item["domain"], item["about"])
        console.print(table)
    if "gpus" in doc:
        table = Table(title="GPU catalogue")
        for col in ("name", "memory GiB", "CC", "bandwidth GB/s", "arch"):
            table.add_column(col)
        for g in doc["gpus"]:
            table.add_row(g["name"], f"{g['memory_gib']}", g["cc"], f"{g['bandwidth_gbs']:.0f}", g["arch"])
        console.print(table)
