"""A sweep from its plan to its report: run the variants, judge them, choose one, write it all.

The sweep's folder::

    <folder>/variants/<id>/   each variant's artifact, as `llmopt run` writes it
    <folder>/chosen/          the chosen variant's artifact (weights linked, other files copied)
    <folder>/report.json      every variant, the front, the choice and why (``schema_version`` 1)
    <folder>/report.md        the same in words, with the plots
    <folder>/accuracy_vs_size-<eval>.png

The sweep's own time (planning, scheduling, workers planning again, the report) is measured
against its wall time and reported, so its overhead can be checked.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.markup import escape

from llmopt.errors import GateFailed, LlmoptError
from llmopt.output import Output
from llmopt.sweep import report as reporting
from llmopt.sweep.execute import make_executor, schedule
from llmopt.sweep.variants import SweepPlan, Variant


class VariantsFailed(LlmoptError):
    """Every variant that could run failed; the exit code is that of the first variant's error."""


@dataclass
class SweepResult:
    plan: SweepPlan
    report: dict = field(default_factory=dict)

    @property
    def chosen(self) -> dict | None:
        return self.report.get("chosen")

    def to_dict(self) -> dict:
        return self.report


@dataclass
class _Ledger:
    """What each variant returned, and which variant built each stage key in this sweep."""

    before: set[str]
    results: dict[str, dict] = field(default_factory=dict)
    built_by: dict[str, str] = field(default_factory=dict)

    def add(self, variant: Variant, result: dict) -> None:
        counts = {"ran": 0, "shared": 0, "cached": 0, "same": 0}
        seen = set()
        for record in result["records"]:
            key = record["key"]
            if record["status"] == "ran":
                how = "ran"
                self.built_by.setdefault(key, variant.id)
            elif key in seen:
                how = "same"  # e.g. an uncompressed candidate's eval is the baseline's
            elif key in self.built_by and key not in self.before:
                how = "shared"
            else:
                how = "cached"
            record["reuse"] = how
            counts[how] += 1
            seen.add(key)
        result["sharing"] = counts
        self.results[variant.id] = result


def run_sweep(sweep: SweepPlan, out: Output, executor: str = "local", jobs: int = 1, address: str | None = None,
              started: float | None = None) -> SweepResult:
    """Run every variant the plan can run, then write the report and the chosen artifact."""
    from llmopt.run.runner import check_writable

    check_writable(sweep.cache.root, sweep.folder, "the sweep folder")
    started = started if started is not None else time.monotonic() - sweep.seconds
    ledger = _Ledger(set(sweep.cached_before))
    t0 = time.monotonic()
    runner = make_executor(executor, jobs, sweep, address)
    setup = time.monotonic() - t0
    for variant in sweep.impossible:
        out.warn(f"variant {variant.id} cannot run, skipped: {variant.reason()}")

    def done(variant: Variant, result: dict) -> None:
        ledger.add(variant, result)
        state = {"passed": "[green]passed[/]", "gate_failed": "[red]gate failed[/]",
                 "failed": "[red]failed[/]"}[result["status"]]
        detail = f": {escape((result.get('error') or {}).get('what', ''))}" if result["status"] == "failed" else ""
        out.info(f"[bold]{escape(variant.id)}[/] {state}{detail} ({len(ledger.results)}/{len(sweep.runnable)} done, "
                 f"{result['sharing']['ran']} stage(s) run)")

    try:
        busy = schedule(sweep, runner, out, done)
    finally:
        runner.close()
    t1 = time.monotonic()
    doc = build_report(sweep, ledger, executor, jobs, address)
    result = SweepResult(sweep, doc)
    report_s = time.monotonic() - t1
    wall = time.monotonic() - started
    worker_plan = sum(r.get("plan_seconds", 0.0) for r in ledger.results.values())
    overhead = sweep.seconds + setup + busy + worker_plan + report_s
    doc["timing"] = {"wall_s": round(wall, 3), "plan_s": round(sweep.seconds, 3), "schedule_s": round(setup + busy, 3),
                     "worker_plan_s": round(worker_plan, 3), "report_s": round(report_s, 3),
                     "variants_s": round(sum(r.get("seconds", 0.0) for r in ledger.results.values()), 3),
                     "overhead_s": round(overhead, 3), "overhead_pct": round(100 * overhead / wall, 2) if wall else 0.0}
    reporting.write(sweep.folder, doc)  # milliseconds: the one step of the sweep's own work not in report_s
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a", encoding="utf-8") as f:
            f.write(reporting.markdown(doc) + "\n")
    raise_when_nothing_qualifies(result, ledger)
    return result


def build_report(sweep: SweepPlan, ledger: _Ledger, executor: str, jobs: int, address: str | None) -> dict:
    rows = [reporting.variant_row(sweep, v, ledger.results.get(v.id)) for v in sweep.variants
            if not v.possible or v.id in ledger.results]
    for row in rows:
        result = ledger.results.get(row["id"])
        if result is not None:
            row["sharing"] = result["sharing"]
    reporting.judge(rows, sweep)
    chosen = reporting.choose(rows, sweep)
    doc = {
        "schema_version": reporting.SCHEMA_VERSION,
        "recipe": {"name": sweep.loaded.recipe.name, "path": str(sweep.loaded.path), "sha256": sweep.loaded.digest},
        "axes": sweep.axes, "objective": sweep.settings.objective, "accuracy": sweep.accuracy,
        "constraints": sweep.settings.constraints.model_dump(mode="json"),
        "executor": {"kind": executor, "jobs": jobs, "address": address},
        "cache_dir": str(sweep.cache.root), "folder": str(sweep.folder),
        "variants": rows, "pareto": [r["id"] for r in rows if r.get("pareto")], "chosen": chosen,
        "pareto_speed": ([r["id"] for r in rows if r.get("pareto_speed")]
                         if any("pareto_speed" in r for r in rows) else None),
        "sharing": sharing(rows, ledger),
    }
    from llmopt.sweep.plots import write_plots

    sweep.folder.mkdir(parents=True, exist_ok=True)
    doc["plots"], doc["plots_skipped"] = write_plots(doc, sweep.folder)
    if chosen is not None:
        place_chosen(Path(next(r["artifact"] for r in rows if r["id"] == chosen["id"])), sweep.folder / "chosen")
    else:  # an earlier run's choice is not this run's
        shutil.rmtree(sweep.folder / "chosen", ignore_errors=True)
    return doc


def sharing(rows: list[dict], ledger: _Ledger) -> dict:
    """Stage counts over every variant that ran: how often a stage was built, reused from another variant
    of this sweep, found in the cache from before, or repeated within a variant."""
    records = [r for result in ledger.results.values() for r in result["records"]]
    counts = {how: sum(r.get("reuse") == how for r in records) for how in ("ran", "shared", "cached", "same")}
    return {"stage_runs": len(records), "unique_stages": len({r["key"] for r in records}), **counts}


def place_chosen(artifact: Path, dest: Path) -> None:
    """The chosen variant's artifact at ``dest``: weights hard-linked, other files copied, renamed into place."""
    from llmopt.store.cache import place_tree, swap_into_place

    tmp = dest.parent / f".{dest.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        place_tree(artifact, tmp, link=True)
        swap_into_place(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def raise_when_nothing_qualifies(result: SweepResult, ledger: _Ledger) -> None:
    """Exit 3 when variants finished but none meets the constraints; a stage's exit code when none finished."""
    if result.chosen is not None:
        return
    report_md = result.plan.folder / "report.md"
    finished = [r for r in ledger.results.values() if r["status"] != "failed"]
    if finished:
        err: LlmoptError = GateFailed("no variant of the sweep meets the constraints", where=str(result.plan.loaded.path),
                                      fix=f"see {report_md}; loosen a threshold or a bound only if the loss is acceptable")
    else:
        first = next(iter(ledger.results.values()), {}).get("error") or {}
        err = VariantsFailed(f"every variant failed; the first: {first.get('what', 'unknown error')}",
                             where=first.get("where", ""), fix=first.get("fix") or f"see {report_md}")
        err.exit_code = first.get("exit_code", 1)
    err.result = result
    raise err
