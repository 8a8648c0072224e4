"""Running the variants: one at a time in this process, in N processes, or as Ray tasks.

Every executor runs the same function, ``run_variant``: the variant's plan through the one
runner (``runner.run_plan``), its artifact written to ``variants/<id>/``; a failed gate is a
result (the artifact is written), a failed stage is a result with its error. A variant run
in another process or on another host is planned again there from the recipe's text and
its overrides, against a cache every worker reaches.

``schedule`` hands variants to an executor so that no two variants build the same stage at
once: a variant starts only when no running variant is building a stage it needs. The first
variant builds the shared source and baseline evals alone; the others then reuse them.
A variant whose artifact is already in the sweep's folder with the same stage keys finished
in an earlier run of the sweep (killed, or run again): it is taken as it is, not repeated.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import time
from pathlib import Path
from typing import Callable

from rich.markup import escape

from llmopt.errors import GateFailed, LlmoptError
from llmopt.output import Output
from llmopt.sweep.variants import SweepPlan, Variant

EXECUTORS = ("local", "ray")


class VariantOutput(Output):
    """The runner's progress lines, each led by the variant it belongs to."""

    def __init__(self, mode: str, label: str):
        super().__init__(mode)
        self.label = label

    def info(self, message: str) -> None:
        super().info(f"[bold]{escape(self.label)}[/] {message}")

    def warn(self, message: str) -> None:
        super().warn(f"{self.label}: {message}")

    def status(self, message: str):  # a spinner shows the label; plain lines get it from ``info``
        spinner = self.mode != "quiet" and self.err.is_terminal
        return super().status(f"{escape(self.label)} {message}" if spinner else message)


def spec_of(sweep: SweepPlan, variant: Variant, mode: str) -> dict:
    """What a worker needs to plan the variant again and run it: plain data, no objects."""
    return {"id": variant.id, "label": f"{variant.index}/{len(sweep.variants)} {variant.id}", "mode": mode,
            "path": str(sweep.loaded.path.resolve()), "text": sweep.text, "overrides": variant.overrides,
            "cache_dir": str(sweep.cache.root.resolve()), "output_dir": str(variant.plan.output_dir.resolve()),
            "keys": variant.keys}


def run_variant(spec: dict, plan=None) -> dict:
    """Run one variant (``plan``, or planned again from ``spec``); its result as plain data."""
    from llmopt.plan import build_plan
    from llmopt.recipe.load import parse_recipe
    from llmopt.run.runner import run_plan

    t0 = time.monotonic()
    planned = 0.0
    if plan is None:
        plan = build_plan(parse_recipe(spec["text"], Path(spec["path"]), spec["overrides"]), spec["cache_dir"],
                          spec["output_dir"])
        planned = time.monotonic() - t0
    keys = [s.key for s in plan.stages]
    status, error, result = "passed", None, None
    try:
        with _no_step_summary():
            result = run_plan(plan, VariantOutput(spec["mode"], spec["label"]))
    except GateFailed as err:
        status, result = "gate_failed", getattr(err, "result", None)
    except LlmoptError as err:
        status, error = "failed", err.to_dict()
    return {"id": spec["id"], "status": status, "error": error, "resumed": False,
            "records": [{k: r.to_dict()[k] for k in ("name", "key", "status", "seconds")} for r in result.records]
            if result else [],
            "keys_match": keys == spec["keys"], "seconds": round(time.monotonic() - t0, 3),
            "plan_seconds": round(planned, 3), "host": platform.node(), "pid": os.getpid()}


@contextlib.contextmanager
def _no_step_summary():
    """A variant's gate table stays out of GITHUB_STEP_SUMMARY; the sweep writes its own report there."""
    saved = os.environ.pop("GITHUB_STEP_SUMMARY", None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ["GITHUB_STEP_SUMMARY"] = saved


def finished_earlier(variant: Variant) -> dict | None:
    """The result of a variant whose artifact an earlier run of the sweep wrote with the same stage keys."""
    manifest_path = variant.plan.output_dir / "manifest.json"
    if not manifest_path.is_file():
        return None
    try:
        manifest = json.loads(manifest_path.read_text())
        keys = [s["key"] for s in manifest["stages"]]
    except (ValueError, KeyError, TypeError):
        return None
    if keys != variant.keys:
        return None
    failed = any(g.get("verdict") == "fail" for g in manifest.get("gates", []))
    records = [{"name": s["name"], "key": s["key"], "status": "cached", "seconds": 0.0} for s in manifest["stages"]]
    return {"id": variant.id, "status": "gate_failed" if failed else "passed", "error": None, "resumed": True,
            "records": records, "keys_match": True, "seconds": 0.0, "plan_seconds": 0.0, "host": platform.node(),
            "pid": os.getpid()}


class Inline:
    """One variant at a time, in this process (the default): libraries are imported once."""

    slots = 1

    def __init__(self):
        self.queue: dict[str, tuple[Variant, dict]] = {}

    def submit(self, variant: Variant, spec: dict):
        self.queue[variant.id] = (variant, spec)
        return variant.id

    def wait(self, handles: list) -> list[tuple]:
        variant, spec = self.queue.pop(handles[0])
        return [(handles[0], run_variant(spec, variant.plan))]

    def close(self) -> None:
        pass


class Processes:
    """``--jobs N``: N worker processes (spawned, so none inherits a half-imported library)."""

    def __init__(self, jobs: int):
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        self.slots = jobs
        self.pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"))

    def submit(self, variant: Variant, spec: dict):
        return self.pool.submit(run_variant, spec)

    def wait(self, handles: list) -> list[tuple]:
        from concurrent.futures import FIRST_COMPLETED, wait

        done, _ = wait(handles, return_when=FIRST_COMPLETED)
        return [(f, f.result()) for f in done]

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


def make_executor(kind: str, jobs: int, sweep: SweepPlan, address: str | None):
    if kind not in EXECUTORS:
        from llmopt.errors import UsageError

        raise UsageError(f"unknown executor {kind!r}", fix=f"use one of: {', '.join(EXECUTORS)}")
    if kind == "ray":
        from llmopt.sweep.ray_executor import RayTasks

        return RayTasks(run_variant, address, jobs, sweep.settings.cpus_per_variant, sweep.settings.gpus_per_variant)
    return Inline() if jobs <= 1 else Processes(jobs)


def schedule(sweep: SweepPlan, executor, out: Output, on_done: Callable[[Variant, dict], None]) -> float:
    """Run every runnable variant on ``executor``; ``on_done`` gets each result. A variant waits while a
    running variant builds a stage it needs. Returns the seconds spent here rather than waiting."""
    known = set(sweep.cached_before)  # stage keys that are whole in the cache
    pending, running = [], {}  # running: handle -> (variant, keys it builds)
    busy = 0.0
    t0 = time.monotonic()
    for variant in sweep.runnable:
        earlier = finished_earlier(variant)
        if earlier is not None:
            out.info(f"[bold]{escape(variant.id)}[/] finished in an earlier run of this sweep: taken from "
                     f"{variant.plan.output_dir}")
            on_done(variant, earlier)
        else:
            pending.append(variant)
    mode = "quiet" if out.mode == "quiet" else "human"
    while pending or running:
        building = set().union(*(keys for _, keys in running.values()))
        for variant in list(pending):
            if len(running) >= executor.slots:
                break
            missing = {k for k in variant.keys if k not in known and not sweep.cache.has(k)}
            known |= set(variant.keys) - missing
            if missing & building:
                continue
            pending.remove(variant)
            out.info(f"[bold]{escape(variant.id)}[/] starting ({len(variant.keys) - len(missing)} of "
                     f"{len(variant.keys)} stages cached): {escape(variant.label)}")
            running[executor.submit(variant, spec_of(sweep, variant, mode))] = (variant, missing)
            building |= missing
        busy += time.monotonic() - t0
        done = executor.wait(list(running))
        t0 = time.monotonic()
        for handle, result in done:
            variant, _ = running.pop(handle)
            known |= {r["key"] for r in result["records"]}
            on_done(variant, result)
    return busy + time.monotonic() - t0
