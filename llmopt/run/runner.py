"""Run a plan: each stage from the cache when its key is there, else executed.

The one runner of ``llmopt run`` and ``llmopt eval``: one start-up, one log, one cache.
A stage writes into a temporary folder that is renamed into the cache when it is
complete; libraries' prints and logs go to the run's log file, not the terminal.
Work a stage defers (hashing a source's weights) runs in the background while the
next stages run and joins the stage's manifest before anything is assembled.
After the stages, a run's artifact is assembled in a temporary folder and renamed
into place (an eval's reports are written to its folder). An accuracy gate that
fails raises ``GateFailed`` (exit 3) only after everything is written.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from llmopt.artifacts import artifact
from llmopt.backends.base import StageContext
from llmopt.libraries import collector_paused, extra_providing, package_version, pick_device
from llmopt.errors import (LlmoptError, MissingExtra, RecipeError, StageFailed, UsageError, near_name,
                           on_command_line)
from llmopt.output import Output
from llmopt.plan import Plan, Stage
from llmopt.plan.stages import failure
from llmopt.sysinfo import peak_rss_bytes

QUIET_LIBRARIES = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


@dataclass
class StageRecord:
    name: str
    key: str
    status: str  # "cached" | "ran" | "in place"
    seconds: float
    outputs: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"name": self.name, "key": self.key, "status": self.status, "seconds": round(self.seconds, 2), "outputs": self.outputs}


@dataclass
class RunResult:
    plan: Plan
    records: list[StageRecord]
    artifact: Path  # the artifact (scope "run") or the reports folder (scope "eval")
    gates: list[dict]
    log_path: Path
    artifact_seconds: float = 0.0
    evals: dict = field(default_factory=dict)  # eval stage -> metric, value, n, runtime
    report: dict = field(default_factory=dict)  # report.json's content

    @property
    def gate_failed(self) -> bool:
        return any(g["verdict"] == "fail" for g in self.gates)

    def to_dict(self) -> dict:
        where = {"artifact": str(self.artifact)} if self.plan.scope == "run" else {"reports": str(self.artifact)}
        return {
            "recipe": self.plan.recipe.recipe.name,
            **where,
            "log": str(self.log_path),
            "stages": [r.to_dict() for r in self.records],
            "evals": self.evals,
            "gates": self.gates,
            "passed": not self.gate_failed,
        }


# what a plan's scope writes once its stages are done: the artifact, an eval's reports, a tune's or a bench's
# results, a re-judged report
WRITERS = {"run": ("assembling the artifact", "artifact", artifact.assemble),
           "eval": ("writing the reports", "reports", artifact.write_reports),
           "tune": ("writing the tuning results", "tuning results", artifact.write_tuning),
           "bench": ("writing the benchmark results", "benchmark results", artifact.write_bench),
           "gate": ("writing the re-judged report", "re-judged report", artifact.write_rejudged)}


def forced(stage: Stage, plan: Plan, force: list[str]) -> bool:
    """``force`` names stages (or prefixes such as "eval"); "all" forces every stage.
    A forced stage forces everything downstream of it."""
    if not force:
        return False
    if "all" in force:
        return True
    first = next((i for i, s in enumerate(plan.stages) if any(_matches(s.name, f) for f in force)), None)
    return first is not None and plan.stages.index(stage) >= first and _downstream(stage, plan, force)


def check_writable(cache_root: Path, output: Path | None, what: str = "the output folder") -> None:
    """The stage cache and the place of the output folder (``what``) can be written, before any stage runs: a run
    (or a sweep) that could not write its results learnt it only at the end."""
    _writable(cache_root, "the stage cache", cache_root, "--cache-dir (or LLMOPT_CACHE)")
    if output is not None:
        _writable(output.parent, what, output, "-o")


def _writable(folder: Path, what: str, named: Path, flag: str) -> None:
    """``folder`` exists (made if need be) and takes a new entry; else a UsageError about ``what`` (``named``),
    which the option ``flag`` sets."""
    import tempfile

    try:
        folder.mkdir(parents=True, exist_ok=True)
        os.rmdir(tempfile.mkdtemp(prefix=".llmopt-probe-", dir=folder))
    except OSError as exc:
        raise UsageError(f"cannot write {what}, {named}: {exc.strerror or exc}",
                         fix=f"pass {flag} a folder you can write") from None


def check_force(plan: Plan, force: list[str]) -> None:
    """Each ``force`` name is "all", a stage's name or a prefix of names; one that matches nothing would leave
    every stage to the cache, silently."""
    for name in force:
        if name != "all" and not any(_matches(s.name, name) for s in plan.stages):
            parts = [s.name.split(".") for s in plan.stages]
            prefixes = sorted({".".join(p[:i]) for p in parts for i in range(1, len(p) + 1)})
            tops = list(dict.fromkeys(p[0] for p in parts))
            raise UsageError(f"--force {name}: no stage is named so or starts with {name}."
                             f"{near_name(name, prefixes)}",
                             fix=f"name a stage or a prefix (`llmopt plan` lists them): {', '.join(tops)}; or all")


def _matches(name: str, pattern: str) -> bool:
    return name == pattern or name.startswith(pattern + ".")


def _downstream(stage: Stage, plan: Plan, force: list[str]) -> bool:
    if any(_matches(stage.name, f) for f in force):
        return True
    return any(_downstream(plan.stage(up), plan, force) for up in stage.inputs.values())


def run_plan(plan: Plan, out: Output | None = None, force: list[str] | None = None) -> RunResult:
    """Every stage of the plan, then the artifact (scope "run") or the reports (scope "eval")."""
    out = out or Output("quiet")
    if plan.errors:
        raise RecipeError(f"{plan.recipe.path}: the plan has {len(plan.errors)} problem(s)", problems=plan.errors,
                          fix="fix the command line's options above" if on_command_line(plan.errors)
                          else "fix the recipe; `llmopt plan` shows every check")
    check_force(plan, force or [])
    check_writable(plan.cache.root, plan.output_dir)
    for warning in (p for p in plan.problems if p.severity == "warning"):
        out.warn(str(warning))
    for name, value in QUIET_LIBRARIES.items():
        os.environ.setdefault(name, value)
    plan.cache.clean_stale()
    stop_leftover_servers(plan, out)
    log_path, log = _open_log(plan)
    try:
        manifests, records = execute_stages(plan, out, log, pick_device(), force)
        gates = manifests["gate"]["outputs"]["gates"] if "gate" in manifests else []
        doing, what, write = WRITERS[plan.scope]
        with out.status(doing):
            t0 = time.monotonic()
            report = write(plan, manifests, gates, log_path)
            seconds = time.monotonic() - t0
            log.info("%s: %s in %.1fs", what, plan.output_dir, seconds)
    finally:
        for handler in list(log.handlers):
            handler.close()
            log.removeHandler(handler)
    evals = {s.name: {k: manifests[s.name]["outputs"].get(k) for k in ("metric", "value", "n", "runtime")}
             for s in plan.kind("eval")}
    result = RunResult(plan, records, plan.output_dir, report["gates"], log_path, seconds, evals, report)
    if plan.output_dir is None:  # a report judged again and written nowhere
        summary = "the reasons above"
    else:
        summary = str(plan.output_dir / "reports" / "report.md" if plan.scope == "run" else plan.output_dir / "report.md")
    err = failure(result.gates, str(plan.recipe.path), summary)
    if err is not None:
        err.result = result
        raise err
    return result


def stop_leftover_servers(plan: Plan, out: Output) -> None:
    """Stop servers that a bench stage or an ``llmopt bench`` killed with ``kill -9`` left running (their
    pid files are under the cache; ``llmopt.bench.engine``)."""
    from llmopt.bench.engine import stop_leftovers

    for info in stop_leftovers(plan.cache.root):
        out.warn(f"stopped a server left by an earlier llmopt run or bench (pid {info['pid']}: "
                 f"{' '.join(info['argv'][:4])} ...)")


@dataclass
class _Pending:
    """A stage whose deferred work (``StageContext.defer``) runs in the background, then seals it."""

    stage: Stage
    future: Future


def cached(stage: Stage, plan: Plan, force: list[str] | None, state: str | None = None) -> bool:
    """The stage is taken from the cache: its entry is whole, it is not volatile and not forced."""
    state = state or plan.cache.state(stage.key)
    return state == "whole" and not stage.volatile and not forced(stage, plan, force or [])


def require_installed(stages) -> None:
    """Exit 4 before any work when a stage that must run needs a distribution that is not installed (the
    libraries are imported only inside the stage, which may come after an hour of compression)."""
    for stage in stages:
        for dist in () if stage.pinned else stage.impl.requires:  # a pinned stage is a finished cache entry
            extra = extra_providing(dist)
            if extra is not None and package_version(dist) is None:
                raise MissingExtra(dist, extra, f"stage {stage.name}")


def execute_stages(plan: Plan, out: Output, log: logging.Logger, device: str,
                   force: list[str] | None = None) -> tuple[dict[str, dict], list[StageRecord]]:
    """Each stage of the plan from the cache when its entry is whole, else run (volatile stages run
    even when cached: what an endpoint answers can change behind one URL). Deferred work runs on one background thread while the next stages
    run; every stage's manifest is written before this returns."""
    cache = plan.cache
    require_installed(stage for stage in plan.stages if not cached(stage, plan, force))
    manifests: dict[str, dict] = {}
    records: list[StageRecord] = []
    pending: list[_Pending] = []
    ran: dict[str, dict] = {}  # key -> manifest of the stages run here (one key may name two stages)
    background = ThreadPoolExecutor(1, thread_name_prefix="llmopt-deferred")
    try:
        for stage in plan.stages:
            if stage.kind == "in_place":  # a finished artifact's part, read where it is
                manifests[stage.name] = stage.options.manifest(stage)
                records.append(StageRecord(stage.name, stage.key, "in place", 0.0, manifests[stage.name]["outputs"]))
                out.info(f"[green]✓[/] {stage.name} [dim](in place: {stage.options.folder})[/]")
                continue
            if stage.key in ran:  # run a moment ago, perhaps still sealing: the same output
                manifests[stage.name] = ran[stage.key]
                records.append(StageRecord(stage.name, stage.key, "cached", 0.0, ran[stage.key]["outputs"]))
                out.info(f"[green]✓[/] {stage.name} [dim](same as an earlier stage, {stage.key[:12]})[/]")
                continue
            state = cache.state(stage.key)
            if cached(stage, plan, force, state):
                manifests[stage.name] = cache.manifest(stage.key)
                records.append(StageRecord(stage.name, stage.key, "cached", 0.0, manifests[stage.name]["outputs"]))
                out.info(f"[green]✓[/] {stage.name} [dim](cached {stage.key[:12]})[/]")
                log.info("stage %s: cached %s", stage.name, stage.key)
                continue
            if state == "changed":
                out.warn(f"the cached output of {stage.name} changed after it was written (a file linked into an "
                         f"artifact and edited there?); running the stage again")
                log.warning("stage %s: cache entry %s changed on disk; running again", stage.name, stage.key)
            record = _execute(stage, plan, manifests, log, out, device, background, pending)
            ran[stage.key] = manifests[stage.name]
            records.append(record)
            out.info(f"[green]✓[/] {stage.name} [dim]({record.seconds:.1f}s)[/]")
        _settle(pending, plan, log)
    except LlmoptError:
        with contextlib.suppress(LlmoptError):  # finished stages stay cached (a converted source...)
            _settle(pending, plan, log)
        raise
    finally:
        background.shutdown(wait=False, cancel_futures=True)
    return manifests, records


def _settle(pending: list[_Pending], plan: Plan, log: logging.Logger) -> None:
    """Wait until every stage with deferred work is sealed; a job that failed fails its stage."""
    while pending:
        item = pending.pop(0)
        try:
            item.future.result()
        except Exception as exc:
            log.exception("stage %s: deferred work failed", item.stage.name)
            raise StageFailed(f"stage {item.stage.name} failed: {type(exc).__name__}: {exc}", where=str(plan.recipe.path),
                              fix=f"the run log has the details: {_log_file(log)}") from exc


def _finish(stage: Stage, manifest: dict, works: list[Callable[[Path], dict]], plan: Plan, log: logging.Logger) -> None:
    """The deferred work of a stage, on the background thread: its outputs join the manifest, which is
    then written, so the stage is an entry as soon as its work is done (a run killed later keeps it)."""
    t0 = time.monotonic()
    for work in works:
        manifest["outputs"].update(work(plan.cache.path(stage.key)) or {})
    manifest["timing"]["deferred_seconds"] = round(time.monotonic() - t0, 3)
    plan.cache.seal(stage.key, manifest)
    log.info("stage %s: deferred work done in %.1fs", stage.name, manifest["timing"]["deferred_seconds"])


def _execute(stage: Stage, plan: Plan, manifests: dict, log: logging.Logger, out: Output, device: str,
             background: ThreadPoolExecutor, pending: list[_Pending]) -> StageRecord:
    cache = plan.cache
    inputs = {role: plan.folder(name) for role, name in stage.inputs.items()}
    tmp = cache.begin(stage.key)
    started = datetime.now(timezone.utc)
    t0 = time.monotonic()
    log.info("stage %s: running (key %s) in %s", stage.name, stage.key, tmp)
    with out.status(f"{stage.name}") as update:
        ctx = StageContext(
            name=stage.name, out_dir=tmp, inputs=inputs,
            input_manifests={role: manifests[name] for role, name in stage.inputs.items()},
            recipe=plan.recipe, log=log, progress=_progress(update, log), device=device, model=plan.model,
            gpu=plan.gpu, cache_root=cache.root, work_dir=cache.work_dir(stage.key),
        )
        try:
            with _quiet_libraries(log):
                outputs = stage.impl.run(stage.options, ctx) or {}
        except LlmoptError:
            cache.discard(tmp)
            raise
        except BaseException as exc:
            cache.discard(tmp)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            log.exception("stage %s failed", stage.name)
            raise StageFailed(f"stage {stage.name} failed: {type(exc).__name__}: {exc}", where=str(plan.recipe.path),
                              fix=f"the run log has the details: {_log_file(log)}") from exc
    seconds = time.monotonic() - t0
    manifest = {
        "schema_version": 1,
        "stage": stage.name,
        "kind": stage.kind,
        "backend": stage.backend,
        "key": stage.key,
        "inputs": {role: plan.stage(name).key for role, name in stage.inputs.items()},
        "options": stage.options.model_dump(mode="json"),
        "material": stage.material,
        "outputs": outputs,
        "timing": {"started": started.isoformat(), "seconds": round(seconds, 3)},
        "peak_rss_bytes": peak_rss_bytes(),
        "host": {"platform": platform.platform(), "python": platform.python_version(), "device": device},
    }
    manifests[stage.name] = manifest
    if ctx.deferred:
        cache.commit(stage.key, tmp, None)  # downstream stages may read the folder; _finish seals it
        pending.append(_Pending(stage, background.submit(_finish, stage, manifest, ctx.deferred, plan, log)))
        log.info("stage %s: done in %.1fs; %d deferred job(s) running", stage.name, seconds, len(ctx.deferred))
    else:
        cache.commit(stage.key, tmp, manifest)
        log.info("stage %s: done in %.1fs", stage.name, seconds)
    return StageRecord(stage.name, stage.key, "ran", seconds, outputs)


def _log_file(log: logging.Logger) -> str:
    return next((h.baseFilename for h in log.handlers if isinstance(h, logging.FileHandler)), "the run log")


def _progress(update, log: logging.Logger):
    def report(message: str) -> None:
        log.info("  %s", message)
        update(message)

    return report


def _open_log(plan: Plan) -> tuple[Path, logging.Logger]:
    runs = plan.cache.root / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    path = runs / f"{stamp}-{plan.recipe.recipe.name}-{os.getpid()}.log"
    log = logging.getLogger(f"llmopt.run.{os.getpid()}")
    log.setLevel(logging.INFO)
    log.propagate = False
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    log.addHandler(handler)
    log.info("llmopt run of %s (recipe sha256 %s)", plan.recipe.path, plan.recipe.digest)
    return path, log


@contextlib.contextmanager
def _quiet_libraries(log: logging.Logger):
    """Send library prints, warnings and logs to the run log instead of the terminal: Python's
    (print, warnings, logging) and native code's too (torch's and ONNX Runtime's C++ warnings write
    to file descriptors 1 and 2 directly)."""
    handler = log.handlers[0]
    stream = handler.stream
    root = logging.getLogger()
    saved_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    logging.captureWarnings(True)
    try:
        with contextlib.redirect_stdout(stream), contextlib.redirect_stderr(stream), _native_output_to(stream):
            _route_transformers()
            yield
    finally:
        stream.flush()
        logging.captureWarnings(False)
        root.removeHandler(handler)
        root.setLevel(saved_level)


@contextlib.contextmanager
def _native_output_to(stream):
    """File descriptors 1 and 2 point at ``stream``'s file for the block. The terminal's progress keeps
    its own descriptor (``llmopt.output.terminal``), so the spinner still reaches the terminal."""
    saved = []
    try:
        for fd in (1, 2):
            for std in (sys.__stdout__, sys.__stderr__):
                if std is not None and std.fileno() == fd:
                    std.flush()
            saved.append((fd, os.dup(fd)))
            os.dup2(stream.fileno(), fd)
    except OSError:  # no such descriptors (an embedding host): Python-level routing only
        pass
    try:
        yield
    finally:
        stream.flush()
        for fd, copy in saved:
            os.dup2(copy, fd)
            os.close(copy)


def _route_transformers() -> None:
    if "transformers" not in sys.modules:
        try:
            with collector_paused():
                import transformers  # noqa: F401  (imported here so its logs can be routed)
        except ImportError:
            return
    from transformers.utils import logging as tlog

    tlog.disable_default_handler()
    tlog.enable_propagation()
    tlog.disable_progress_bar()
