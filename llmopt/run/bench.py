"""``llmopt bench ARTIFACT``: the bench stage over a finished artifact's own launch config, as a plan.

The plan (``llmopt.plan.build_artifact_plan``, scope "bench") reads the recipe the artifact's manifest
records; its stages are the artifact's ``model/`` and ``deploy/<engine>/`` read where they are, and the
bench stage with the command's workload, SLO and load laid over the recipe's, which the one runner
runs as ``llmopt run`` runs its bench stage. A benchmark measures afresh each time (the stage is
volatile). The results (bench.json, bench.md, requests.jsonl, engine.log, the plots, run.log) are
written beside the output folder and renamed into place. A server's URL or a bare model folder has no
recipe to plan: ``llmopt.bench.run_bench`` measures it directly.
"""

from __future__ import annotations

from pathlib import Path

from llmopt.output import Output


def bench_artifact(folder: str | Path, given: dict, out_dir: str | Path | None = None,
                   cache_dir: str | Path | None = None, out: Output | None = None) -> dict:
    """``given``: the command's ``workload`` and ``slo`` fields and BenchOptions' fields (``options``) that
    override what the artifact records. Returns bench.json's content."""
    from llmopt.plan import build_artifact_plan
    from llmopt.run.runner import run_plan

    plan = build_artifact_plan(folder, (), cache_dir, out_dir, scope="bench", bench=given)
    result = run_plan(plan, out)
    return result.report["bench"] | {"out_dir": str(plan.output_dir)}
