"""llmopt gate: judge a report's paired results again with other thresholds."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from llmopt.cli.app import CacheOpt, FormatOpt, app, sink


SET_HELP = ("A gate setting: EVAL.KEY=VALUE, or KEY=VALUE for every gate; KEY is max_drop, max_rel_drop_pct, "
            "min_recovery, max_increase_pct, confidence, gate_on or interval; VALUE none removes a threshold (repeatable).")
OUTPUT_HELP = ("Write the re-judged report.json, report.md and junit.xml here, with every file the report names "
               "(score files, bench and tune files and plots, loss curves).")


@app.command()
def gate(
    report: Annotated[Path, typer.Argument(help="report.json written by `llmopt run` or `llmopt eval`.", show_default=False)],
    set_: Annotated[Optional[list[str]], typer.Option("--set", "-s", help=SET_HELP)] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help=OUTPUT_HELP)] = None,
    cache_dir: CacheOpt = None,
    format: FormatOpt = "human",
) -> None:
    """Judge the gates of a report again, on the same paired examples, with other thresholds.

    Nothing is re-scored: the per-example score files next to report.json are paired again.
    Exits 3 when a gate fails.

    Examples:

        llmopt gate artifacts/quickstart/reports/report.json -s prose.max_increase_pct=5   # exits 3

        llmopt gate reports/report.json -s confidence=0.9 -s prose.max_increase_pct=none

        llmopt gate reports/report.json -s mc.interval=bootstrap -o rejudged/ --format json
    """
    from llmopt.cli.eval import show
    from llmopt.errors import GateFailed
    from llmopt.run.evaluate import rejudge

    out = sink(format)
    try:
        result = rejudge(report, set_ or [], output, cache_dir, out)
    except GateFailed as err:
        failed = getattr(err, "result", None)
        if failed is not None:
            out.result(failed.report, lambda c: show(c, {}, failed.report["gates"], output or report.parent))
        raise
    out.result(result, lambda c: show(c, {}, result["gates"], output or report.parent))
