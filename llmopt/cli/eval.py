"""llmopt eval: run a recipe's evals alone, or gate a candidate against the recipe's source."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from llmopt.cli.app import CacheOpt, FormatOpt, RecipeArg, SetOpt, StrictOpt, app, sink

ReportsOpt = Annotated[Optional[Path], typer.Option("--output", "-o", help="Folder for report.json, report.md, junit.xml and per-example scores (default: reports/<recipe name>).")]


@app.command("eval")
def eval_(
    recipe: RecipeArg,
    model: Annotated[Optional[Path], typer.Option("--model", "-m", help="Model folder to score instead of the recipe's source (with --candidate: the baseline).")] = None,
    endpoint: Annotated[Optional[str], typer.Option("--endpoint", help="Score the model served at this OpenAI-compatible URL (tokenizer from --model or the recipe's source).")] = None,
    candidate: Annotated[Optional[str], typer.Option("--candidate", "-c", help="Model folder, artifact folder or endpoint URL to gate against the baseline; exits 3 when a gate fails.")] = None,
    only: Annotated[Optional[list[str]], typer.Option("--only", help="Run only these evals, by name, and their gates (repeatable, or comma-separated: --only prose,mc); default: every [[eval]].")] = None,
    set_: SetOpt = None,
    force: Annotated[Optional[list[str]], typer.Option("--force", help="Re-run these stages even when cached (a name or prefix such as eval, or 'all').")] = None,
    cache_dir: CacheOpt = None,
    output: ReportsOpt = None,
    strict: StrictOpt = False,
    format: FormatOpt = "human",
) -> None:
    """Run a recipe's evals without compressing: on its source, a model folder or a served endpoint.

    With --candidate, the recipe's source (or --model) is the baseline and the candidate is scored
    on the same examples; the recipe's gates decide, and the command exits 3 when one fails.
    Baseline scores that `llmopt run` already computed come from the cache, and so do an artifact's
    own candidate scores while the cache holds its model.

    Examples:

        llmopt eval recipes/quickstart.toml --model artifacts/quickstart/model

        llmopt eval recipes/quickstart.toml --candidate artifacts/quickstart -o reports/

        llmopt eval recipes/quickstart.toml --candidate http://127.0.0.1:8000/v1 --only prose
    """
    from llmopt.errors import GateFailed
    from llmopt.run.evaluate import evaluate

    out = sink(format)
    try:
        names = [name.strip() for value in only or [] for name in value.split(",") if name.strip()] or None
        result = evaluate(recipe, set_ or [], model, endpoint, candidate, cache_dir, output, out, force, strict, names)
    except GateFailed as err:
        result = getattr(err, "result", None)
        if result is not None:
            out.result(result.to_dict(), lambda c: show(c, result.evals, result.gates, result.artifact))
        raise
    out.result(result.to_dict(), lambda c: show(c, result.evals, result.gates, result.artifact))


def show(console, evals: dict, gates: list[dict], folder) -> None:
    from rich.table import Table

    from llmopt.artifacts.reports import fmt

    if gates:
        print_gates(console, gates)
    elif evals:
        table = Table(title="evals")
        for col in ("stage", "metric", "value", "n"):
            table.add_column(col)
        for stage, o in evals.items():
            table.add_row(stage, str(o.get("metric")), fmt(o.get("value")), str(o.get("n")))
        console.print(table)
    console.print(f"reports: {folder}")


def print_gates(console, gates: list[dict]) -> None:
    """The verdict table, then each gate's reason. Only the interval wraps in a narrow terminal."""
    from rich import box
    from rich.table import Table

    from llmopt.artifacts.reports import HEADER, across_domains, gate_rows

    table = Table(title="accuracy gates", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in HEADER:
        if col == "interval":
            table.add_column(col, min_width=9, overflow="fold")
        else:
            table.add_column(col, no_wrap=True)
    for row in gate_rows(gates):
        colour = {"PASS": "green", "FAIL": "red"}.get(row[-1], "yellow")
        table.add_row(*row[:-1], f"[{colour}]{row[-1]}[/]")
    console.print(table)
    spread = across_domains(gates)
    if spread:
        console.print(f"relative change by domain: {spread}", markup=False)
    for gate in gates:
        console.print(f"  {gate['name']}: {gate.get('reason', '')}", markup=False)
