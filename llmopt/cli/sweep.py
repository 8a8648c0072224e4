"""llmopt sweep: run variants of a recipe on one shared cache; report the Pareto front and the chosen one."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from llmopt.cli.app import CacheOpt, FormatOpt, OfflineOpt, RecipeArg, SetOpt, app, sink

AxisOpt = Annotated[Optional[list[str]], typer.Option("--axis", "-a", help=(
    "An axis: KEY=V1,V2 (repeatable), e.g. --axis compress[0].group_size=32,64; adds to the recipe's "
    "[sweep.axes] or replaces the axis of the same key. Values are read as TOML (gptq = \"gptq\"); a comma inside "
    "{ }, [ ] or quotes is part of its value."))]


@app.command()
def sweep(
    recipe: RecipeArg,
    set_: SetOpt = None,
    axis: AxisOpt = None,
    strict: Annotated[bool, typer.Option("--strict", help=(
        "A variant that cannot work (the planner refuses it) is an error (exit 2) rather than skipped; plan-time "
        "warnings are errors too."))] = False,
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help=(
        "Variants run at once: local: worker processes (1: in this process); ray: tasks in flight "
        "(default: as many as the cluster's CPUs fit)."))] = 1,
    executor: Annotated[str, typer.Option("--executor", help="local (this machine) or ray (Ray tasks; needs the ray extra).")] = "local",
    address: Annotated[Optional[str], typer.Option("--address", help=(
        "Ray cluster to join (ray://host:10001, or auto); default: start a local one. The cache and the sweep "
        "folder must be on a filesystem every worker reaches."))] = None,
    cache_dir: CacheOpt = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Sweep folder (default: sweeps/<name>).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Plan every variant and show what would run; run nothing.")] = False,
    offline: OfflineOpt = False,
    format: FormatOpt = "human",
) -> None:
    """Sweep a recipe: every combination of its [sweep] axes, on one shared stage cache.

    Every variant is planned first; one the planner refuses is reported with its reason and skipped
    (--strict: exit 2). Stages that variants share run once. A sweep killed and run again takes finished
    variants from their artifacts and resumes the others. Writes report.json, report.md and plots of
    accuracy against size to the sweep folder, with the chosen variant's artifact in chosen/. Exits 3
    when no variant meets the constraints (every gate passes, and any bounds in [sweep.constraints]).

    Examples:

        llmopt sweep recipes/sweep-onnx-cpu.toml --dry-run

        llmopt sweep recipes/sweep-onnx-cpu.toml --axis 'compress[0]={ method = "rtn" }' --axis compress[0].group_size=64,128 --axis export.lm_head=int8   # exits 3: no RTN variant passes

        llmopt sweep my.toml --executor ray --address auto --cache-dir /shared/llmopt-cache -o /shared/sweeps/my
    """
    from llmopt import api
    from llmopt.errors import LlmoptError

    if offline:
        os.environ["HF_HUB_OFFLINE"] = "1"  # for every library the sweep loads, as the variable itself does
    out = sink(format)
    if dry_run:
        the_plan = api.sweep_plan(recipe, set_ or [], axis or [], cache_dir, output, strict)
        out.result(the_plan.to_dict(), lambda c: _show_plan(c, the_plan))
        return
    try:
        result = api.sweep(recipe, set_ or [], axis or [], cache_dir, output, strict, jobs, executor, address, out)
    except LlmoptError as err:  # a failed gate or stage: the report is written, and shown
        result = getattr(err, "result", None)
        if result is not None:
            out.result(result.to_dict(), lambda c: _show(c, result.report))
        raise
    out.result(result.to_dict(), lambda c: _show(c, result.report))


def _show_plan(console, the_plan) -> None:
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"sweep plan: {the_plan.loaded.recipe.name} ({len(the_plan.variants)} variants)")
    for col in ("variant", "values", "stages", "cached", "to run", "note"):
        table.add_column(col)
    for v in the_plan.variants:
        cached = sum(k in the_plan.cached_before for k in v.keys)
        note = "[red]impossible[/]: " + escape("; ".join(p.message for p in v.problems)) if not v.possible else ""
        table.add_row(v.id, escape(v.label), str(len(v.keys)), str(cached), str(len(v.keys) - cached), note)
    console.print(table)
    doc = the_plan.to_dict()
    console.print(f"{doc['stage_runs']} stages over the runnable variants, {doc['unique_stages']} distinct "
                  f"({doc['cached_stages']} already cached); planned in {the_plan.seconds:.2f}s; folder {the_plan.folder}")


def _show(console, report: dict) -> None:
    from rich.markup import escape
    from rich.table import Table

    from llmopt.sweep.report import table as report_table

    header, rows = report_table(report)
    table = Table(title=f"sweep: {report['recipe']['name']}")
    for col in header:
        table.add_column(col)
    for row in rows:
        table.add_row(*[escape(cell.replace("**", "")) for cell in row])
    console.print(table, width=None if console.is_terminal else max(console.width, 220))  # a file or a pipe: no folding
    chosen = report.get("chosen")
    if chosen:
        console.print(f"[green]chosen[/]: {escape(chosen['id'])}")
        for line in chosen["why"]:
            console.print(f"  {escape(line)}")
        console.print(f"artifact: {chosen['artifact']}")
    else:
        console.print("[red]no variant meets the constraints[/]")
    s, t = report["sharing"], report.get("timing") or {}
    console.print(f"stages: {s['stage_runs']} over all variants, {s['unique_stages']} distinct; {s['ran']} ran, "
                  f"{s['shared']} shared between variants, {s['cached']} from the cache before")
    if t:
        console.print(f"time: {t['wall_s']:.1f}s wall; the sweep's own work {t['overhead_s']:.2f}s "
                      f"({t['overhead_pct']:.2f}%)")
    console.print(f"report: {Path(report['folder']) / 'report.md'}")
