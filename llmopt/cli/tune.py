"""llmopt tune: search an artifact's launch parameters against its live engine."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from llmopt.cli.app import CacheOpt, FormatOpt, app, sink
from llmopt.cli.bench import SloOpt, _slo


@app.command()
def tune(
    artifact: Annotated[Path, typer.Argument(help="An artifact folder (manifest.json, model/, deploy/<engine>/).",
                                             show_default=False)],
    max_trials: Annotated[Optional[int], typer.Option(min=1, help="Launch configurations tried (default: [tune] max_trials, 8).")] = None,
    max_minutes: Annotated[Optional[float], typer.Option(min=0.01, help="Stop starting trials after this many minutes.")] = None,
    repeats: Annotated[Optional[int], typer.Option(min=0, help="Rounds that measure default and winner again, alternating (default 1).")] = None,
    requests: Annotated[Optional[int], typer.Option("--requests", "-n", min=1, help="Measured requests per trial (default: [tune] requests, else [bench] requests).")] = None,
    warmup: Annotated[Optional[int], typer.Option(min=0, help="Warm-up requests per trial (default: [bench] warmup).")] = None,
    slo: SloOpt = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Results folder (default: tune/<artifact>-<time>).")] = None,
    cache_dir: CacheOpt = None,
    format: FormatOpt = "human",
) -> None:
    """Start the artifact's engine with each candidate launch config, measure goodput under the SLO, keep the best.

    Writes tuning.json (every trial), the winner's deploy/<engine>/ and tuning.png; the artifact is not
    changed. A killed search resumes without repeating finished trials. See docs/tune.md.

    Examples:

        llmopt tune artifacts/quickstart --max-trials 2 --repeats 0 -n 2 --warmup 1 --slo tpot_p99_ms=200

        llmopt tune artifacts/smollm2-vllm-h100 --max-minutes 30 --format json
    """
    from llmopt import api
    from llmopt.bench.engine import Interrupted

    out = sink(format)
    overrides = {"max_trials": max_trials, "max_minutes": max_minutes, "repeats": repeats, "requests": requests,
                 "warmup": warmup, "slo": _slo(slo) or None}
    try:
        result = api.tune(artifact, overrides, output, cache_dir, out)
    except KeyboardInterrupt:
        raise Interrupted("interrupted; any server that llmopt tune started has been stopped; run it again to "
                          "resume") from None
    out.result(result, lambda c: _show(c, result))


def _show(console, result: dict) -> None:
    from llmopt.tune.report import note

    for trial in result.get("trials", []):
        values = ", ".join(f"{k}={'default' if v is None else v}" for k, v in trial["values"].items())
        console.print(f"{trial['phase']:8} {values}: {trial['score']:.3g} ({trial['verdict']}"
                      f"{', cached' if trial.get('cached') else ''})", markup=False)
    console.print(note(result).replace("\n", " "), markup=False)
    console.print(f"results: {result['out_dir']} (tuning.json, deploy/)", markup=False)
