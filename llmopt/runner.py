"""Run a plan: each stage from the cache when its key is there, else executed.

A stage writes into a temporary folder that is renamed into the cache when it is
complete; libraries' prints and logs go to the run's log file, not the terminal.
After the stages, the artifact is assembled in a temporary folder and renamed
into place. An accuracy gate that fails raises ``GateFailed`` (exit 3) only after
everything is written.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from llmopt import artifact
from llmopt.backends.base import StageContext, pick_device
from llmopt.errors import GateFailed, LlmoptError, RecipeError, StageFailed
from llmopt.output import Output
from llmopt.plan import Plan, Stage
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
    status: str  # "cached" | "ran"
    seconds: float
    outputs: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"name": self.name, "key": self.key, "status": self.status, "seconds": round(self.seconds, 2), "outputs": self.outputs}


@dataclass
class RunResult:
    plan: Plan
    records: list[StageRecord]
    artifact: Path
    gates: list[dict]
    log_path: Path

    @property
    def gate_failed(self) -> bool:
        return any(g["verdict"] == "fail" for g in self.gates)

    def to_dict(self) -> dict:
        return {
            "recipe": self.plan.recipe.recipe.name,
            "artifact": str(self.artifact),
            "log": str(self.log_path),
            "stages": [r.to_dict() for r in self.records],
            "gates": self.gates,
            "passed": not self.gate_failed,
        }


def forced(stage: Stage, plan: Plan, force: list[str]) -> bool:
    """``force`` names stages (or prefixes such as "eval"); "all" forces every stage.
    A forced stage forces everything downstream of it."""
    if not force:
        return False
    if "all" in force:
        return True
    first = next((i for i, s in enumerate(plan.stages) if any(_matches(s.name, f) for f in force)), None)
    return first is not None and plan.stages.index(stage) >= first and _downstream(stage, plan, force)


def _matches(name: str, pattern: str) -> bool:
    return name == pattern or name.startswith(pattern + ".")


def _downstream(stage: Stage, plan: Plan, force: list[str]) -> bool:
    if any(_matches(stage.name, f) for f in force):
        return True
    return any(_downstream(plan.stage(up), plan, force) for up in stage.inputs.values())


def run_plan(plan: Plan, out: Output | None = None, force: list[str] | None = None) -> RunResult:
    out = out or Output("quiet")
    if plan.errors:
        raise RecipeError(f"{plan.recipe.path}: the plan has {len(plan.errors)} problem(s)", problems=plan.errors,
                          fix="fix the recipe; `llmopt plan` shows every check")
    for warning in (p for p in plan.problems if p.severity == "warning"):
        out.warn(str(warning))
    for name, value in QUIET_LIBRARIES.items():
        os.environ.setdefault(name, value)
    cache = plan.cache
    cache.clean_stale()
    log_path, log = _open_log(plan)
    manifests: dict[str, dict] = {}
    records: list[StageRecord] = []
    device = pick_device()
    try:
        for stage in plan.stages:
            if cache.has(stage.key) and not forced(stage, plan, force or []):
                manifests[stage.name] = cache.manifest(stage.key)
                records.append(StageRecord(stage.name, stage.key, "cached", 0.0, manifests[stage.name]["outputs"]))
                out.info(f"[green]✓[/] {stage.name} [dim](cached {stage.key[:12]})[/]")
                log.info("stage %s: cached %s", stage.name, stage.key)
                continue
            record = _execute(stage, plan, manifests, log, out, device)
            records.append(record)
            out.info(f"[green]✓[/] {stage.name} [dim]({record.seconds:.1f}s)[/]")
        with out.status("assembling the artifact"):
            gates = artifact.assemble(plan, manifests, log_path)
    finally:
        for handler in list(log.handlers):
            handler.close()
            log.removeHandler(handler)
    result = RunResult(plan, records, plan.output_dir, gates, log_path)
    if result.gate_failed:
        failed = [g["name"] for g in gates if g["verdict"] == "fail"]
        err = GateFailed(f"accuracy gate failed: {', '.join(failed)}", where=str(plan.recipe.path),
                         fix=f"see {plan.output_dir / 'reports' / 'report.md'}; loosen the threshold only if the drop is acceptable")
        err.result = result
        raise err
    return result


def _execute(stage: Stage, plan: Plan, manifests: dict, log: logging.Logger, out: Output, device: str) -> StageRecord:
    cache = plan.cache
    inputs = {role: cache.path(plan.stage(name).key) for role, name in stage.inputs.items()}
    tmp = cache.begin(stage.key)
    started = datetime.now(timezone.utc)
    t0 = time.monotonic()
    log.info("stage %s: running (key %s) in %s", stage.name, stage.key, tmp)
    with out.status(f"{stage.name}") as update:
        ctx = StageContext(
            name=stage.name, out_dir=tmp, inputs=inputs,
            input_manifests={role: manifests[name] for role, name in stage.inputs.items()},
            recipe=plan.recipe, log=log, progress=_progress(update, log), device=device,
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
                              fix=f"the run log has the details: {log.handlers[0].baseFilename}") from exc
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
    cache.commit(stage.key, tmp, manifest)
    manifests[stage.name] = manifest
    log.info("stage %s: done in %.1fs", stage.name, seconds)
    return StageRecord(stage.name, stage.key, "ran", seconds, outputs)


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
    """Send library prints, warnings and logs to the run log instead of the terminal."""
    handler = log.handlers[0]
    stream = handler.stream
    root = logging.getLogger()
    saved_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    logging.captureWarnings(True)
    try:
        with contextlib.redirect_stdout(stream), contextlib.redirect_stderr(stream):
            _route_transformers()
            yield
    finally:
        stream.flush()
        logging.captureWarnings(False)
        root.removeHandler(handler)
        root.setLevel(saved_level)


def _route_transformers() -> None:
    if "transformers" not in sys.modules:
        try:
            import transformers  # noqa: F401  (imported here so its logs can be routed)
        except ImportError:
            return
    from transformers.utils import logging as tlog

    tlog.disable_default_handler()
    tlog.enable_propagation()
    tlog.disable_progress_bar()
