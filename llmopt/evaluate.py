"""Evaluation outside the pipeline: what ``llmopt eval`` and ``llmopt gate`` call.

``evaluate`` runs a recipe's evals alone, on the recipe's source, another model
folder, or a model served at an OpenAI-compatible endpoint. With a candidate (a
folder or an endpoint URL) it scores the recipe's source as the baseline and the
candidate on the same examples, applies the recipe's gates and raises
``GateFailed`` (exit 3) after writing report.json, report.md and junit.xml. Its
stages use the run's cache with the same keys as ``llmopt run``, so a baseline
that a run has already scored is not scored again; stages that score through an
endpoint always run, since what a server answers can change behind one URL.

``rejudge`` reads a report.json and judges its gates again, from the per-example
score files it names, with other thresholds.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from llmopt import artifact, gate, registry, reports, runner
from llmopt import data as datasets
from llmopt.backends.base import PlanContext
from llmopt.libraries import pick_device
from llmopt.backends.source.gguf import gguf_path, is_gguf
from llmopt.cache import Cache
from llmopt.errors import GateFailed, RecipeError, UsageError
from llmopt.modelinfo import from_folder, from_gguf
from llmopt.output import Output
from llmopt.plan import Plan, Stage, assign_keys
from llmopt.recipe import load_recipe
from llmopt.recipe.schema import EvalItem

GATE_KEYS = ("max_drop", "max_rel_drop_pct", "min_recovery", "max_increase_pct", "confidence", "gate_on", "interval")


@dataclass
class EvalResult:
    plan: Plan
    records: list
    gates: list[dict]
    report: dict
    folder: Path
    log_path: Path
    evals: dict = field(default_factory=dict)

    @property
    def gate_failed(self) -> bool:
        return any(g["verdict"] == "fail" for g in self.gates)

    def to_dict(self) -> dict:
        return {"recipe": self.plan.recipe.recipe.name, "reports": str(self.folder), "log": str(self.log_path),
                "stages": [r.to_dict() for r in self.records], "evals": self.evals, "gates": self.gates,
                "passed": not self.gate_failed}


def is_url(text: str | None) -> bool:
    return bool(text) and str(text).startswith(("http://", "https://"))


def evaluate(recipe: str | Path, overrides=(), model: str | Path | None = None, endpoint: str | None = None,
             candidate: str | Path | None = None, cache_dir=None, output=None, out: Output | None = None,
             force: list[str] | None = None) -> EvalResult:
    """Score the recipe's evals on one model, or baseline against ``candidate`` with the gates."""
    if endpoint and candidate:
        raise UsageError("--endpoint and --candidate together are ambiguous",
                         fix="to gate a served model against the recipe's source, pass its URL as --candidate")
    if endpoint and not is_url(endpoint):
        raise UsageError(f"--endpoint must be an http:// or https:// URL (got {endpoint!r})")
    loaded = load_recipe(recipe, overrides)
    if not loaded.recipe.eval:
        raise UsageError(f"{loaded.path} has no [[eval]] table", fix="add one (`llmopt schema` lists the keys)")
    plan = eval_plan(loaded, model, endpoint, candidate, cache_dir, output)
    out = out or Output("quiet")
    manifests, records, log_path = run_stages(plan, out, force)
    gates = artifact.evaluate_gates(plan, manifests) if candidate else []
    report = reports.write_all(plan.output_dir, plan, manifests, gates)
    shutil.copy2(log_path, plan.output_dir / "run.log")
    evals = {s.name: {k: manifests[s.name]["outputs"].get(k) for k in ("metric", "value", "n", "runtime")}
             for s in plan.stages if s.kind == "eval"}
    result = EvalResult(plan, records, report["gates"], report, plan.output_dir, log_path, evals)
    if result.gate_failed:
        failed = [g["name"] for g in result.gates if g["verdict"] == "fail"]
        err = GateFailed(f"accuracy gate failed: {', '.join(failed)}", where=str(loaded.path),
                         fix=f"see {plan.output_dir / 'report.md'}; loosen the threshold only if the drop is acceptable")
        err.result = result
        raise err
    return result


def eval_plan(loaded, model=None, endpoint=None, candidate=None, cache_dir=None, output=None) -> Plan:
    """Source stage(s) and eval stages only: no compression, export or serving."""
    recipe, problems = loaded.recipe, []
    section = recipe.model if model is None else recipe.model.model_copy(update={"source": str(Path(model).resolve())})
    source = source_stage("source", section, loaded, problems)
    stages = [source]
    target, url = source, None
    if candidate is not None and is_url(str(candidate)):
        url = str(candidate)
    elif candidate is not None:
        target = source_stage("candidate", recipe.model.model_copy(update={"source": str(Path(candidate).resolve())}),
                              loaded, problems)
        stages.append(target)
    info = model_facts(section.source, loaded.path.parent)
    for index, item in enumerate(recipe.eval):
        options = loaded.options_for("eval", index)
        spec = getattr(options, "data", None)
        digest = datasets.digest(spec, loaded.path.parent) if isinstance(spec, str) else None
        if candidate is None:
            roles = [(f"eval.{item.name}", "", source, endpoint)]
        else:
            roles = [(f"eval.{item.name}.baseline", "baseline", source, None),
                     (f"eval.{item.name}.candidate", "candidate", target, url)]
        for name, role, model_stage, served in roles:
            opts = options if served is None else served_options(options, served, item)
            ctx = PlanContext(recipe=loaded, step=("eval", index), model=info)
            problems += registry.get("eval", item.kind)().check(opts, ctx)
            stages.append(Stage(name, "eval", item.kind, ("eval", index), opts, {"model": model_stage.name},
                                {"data_sha256": digest}, role=role))
    assign_keys(stages)
    folder = Path(output) if output else Path("reports") / recipe.name
    return Plan(loaded, stages, problems, info, None, {}, Cache(cache_dir or recipe.output.cache_dir), folder)


def source_stage(name: str, section, loaded, problems: list) -> Stage:
    """A source stage as ``llmopt run`` plans it (the same cache key for the same model)."""
    stage = Stage(name, "source", "gguf" if is_gguf(section.source) else "hf", ("model",), section)
    problems += stage.impl.check(section, PlanContext(recipe=loaded, step=("model",)))
    stage.material = {"source": stage.impl.fingerprint(section, loaded.path.parent)}
    return stage


def served_options(options, url: str, item):
    """The eval's options scoring through the endpoint at ``url``."""
    if "endpoint" not in type(options).model_fields:
        raise UsageError(f"eval {item.name!r} ({item.kind}) cannot score a model through an endpoint",
                         fix="drop --endpoint, or evaluate the model folder instead")
    return options.model_copy(update={"runtime": "endpoint", "endpoint": url})


def model_facts(source: str, base: Path):
    try:
        if is_gguf(source):
            path = gguf_path(source, base)
            return from_gguf(path) if path.is_file() else None
        folder = Path(source).expanduser()
        folder = folder if folder.is_absolute() else base / folder
        return from_folder(folder) if (folder / "config.json").is_file() else None
    except Exception:  # facts only sharpen checks; the stages report real problems
        return None


def run_stages(plan: Plan, out: Output, force: list[str] | None = None) -> tuple[dict, list, Path]:
    """Each stage from the cache or run, as ``llmopt run`` does; endpoint stages always run."""
    if plan.errors:
        raise RecipeError(f"{plan.recipe.path}: {len(plan.errors)} problem(s) before evaluating", problems=plan.errors,
                          fix="fix the recipe or the model given")
    for warning in (p for p in plan.problems if p.severity == "warning"):
        out.warn(str(warning))
    for name, value in runner.QUIET_LIBRARIES.items():
        os.environ.setdefault(name, value)
    plan.cache.clean_stale()
    log_path, log = runner._open_log(plan)
    try:
        manifests, records = runner.execute_stages(
            plan, out, log, pick_device(), force, always=lambda stage: getattr(stage.options, "runtime", None) == "endpoint")
    finally:
        for handler in list(log.handlers):
            handler.close()
            log.removeHandler(handler)
    return manifests, records, log_path


def rejudge(report_path: str | Path, settings: list[str] = (), output: str | Path | None = None) -> dict:
    """The report's gates judged again on the same pairs, with ``settings`` (``[eval.]key=value``) applied."""
    report_path = Path(report_path)
    try:
        report = json.loads(report_path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {report_path}: {exc}", fix="give the report.json an llmopt run or eval wrote") from None
    if report.get("schema_version") != reports.REPORT_SCHEMA:
        raise UsageError(f"{report_path} has schema_version {report.get('schema_version')!r}; "
                         f"this llmopt reads {reports.REPORT_SCHEMA}", fix="re-judge it with the llmopt that wrote it")
    changes = parse_settings(settings, [g["name"] for g in report.get("gates", [])])
    gates = [judge_again(g, changes.get(g["name"], {}), report_path.parent) for g in report.get("gates", [])]
    new = dict(report, gates=gates, passed=all(g["verdict"] != "fail" for g in gates))
    if output is not None:
        folder = Path(output)
        folder.mkdir(parents=True, exist_ok=True)
        for g in gates:
            for name in g["scores"].values():
                if (report_path.parent / name).resolve() != (folder / name).resolve():
                    shutil.copy2(report_path.parent / name, folder / name)
        reports.write_reports(folder, report["recipe"], report["recipe_sha256"], report.get("evals", {}), gates)
    return new


def parse_settings(settings: list[str], names: list[str]) -> dict[str, dict]:
    """``-s max_drop=0.02`` (every gate) or ``-s arc.max_drop=0.02`` (one gate) -> {gate: {key: value}}."""
    import tomllib

    changes: dict[str, dict] = {name: {} for name in names}
    for spec in settings:
        key, sep, raw = spec.partition("=")
        name, _, leaf = key.strip().rpartition(".")
        if not sep or leaf not in GATE_KEYS or (name and name not in names):
            raise UsageError(f"cannot apply {spec!r}",
                             fix=f"write [EVAL.]KEY=VALUE with EVAL one of {', '.join(names) or '(none)'} and KEY one "
                                 f"of {', '.join(GATE_KEYS)}; VALUE none removes a threshold")
        raw = raw.strip()
        try:
            value = None if raw.lower() in ("none", "null") else tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        for target in [name] if name else names:
            changes[target][leaf] = value
    return changes


def judge_again(record: dict, change: dict, folder: Path) -> dict:
    if "scores" not in record:
        raise UsageError(f"gate {record['name']!r} names no per-example score files",
                         fix="re-run `llmopt run` or `llmopt eval` with this llmopt to write a report that can be re-judged")
    fields = {"name": record["name"], "kind": record["kind"], "confidence": record.get("confidence", 0.95),
              "gate_on": record.get("gate_on", "interval"), **record.get("thresholds", {}), **change}
    method = fields.pop("interval", "auto")
    if method not in gate.METHODS:
        raise UsageError(f"gate {record['name']!r}: unknown interval {method!r}", fix=f"use one of {', '.join(gate.METHODS)}")
    try:
        item = EvalItem.model_validate(fields)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise UsageError(f"gate {record['name']!r}: {problems}", fix="give thresholds as numbers >= 0") from None
    missing = [name for name in record["scores"].values() if not (folder / name).is_file()]
    if missing:
        raise UsageError(f"gate {record['name']!r}: score file {folder / missing[0]} is missing",
                         fix="keep the *.scores.jsonl files next to report.json (upload the whole reports folder)")
    baseline = gate.read_scores(folder / record["scores"]["baseline"])
    candidate = gate.read_scores(folder / record["scores"]["candidate"])
    try:
        comparison = gate.compare(record["metric"], baseline, candidate, item.confidence, method=method)
    except ValueError as exc:
        raise UsageError(f"gate {record['name']!r}: {exc}", fix="use interval=bootstrap for scores that are not 0/1") from None
    return dict(gate.judge(item, comparison, record.get("higher_is_better", True)), scores=record["scores"])
