"""Evaluation outside ``llmopt run``: what ``llmopt eval`` and ``llmopt gate`` call.

``evaluate`` plans the "eval" scope of a recipe with the one planner (``build_plan``): its
evals on the recipe's source, another model folder, or a model served at an
OpenAI-compatible endpoint. With a candidate (a model or artifact folder, or an endpoint
URL) it scores the recipe's source as the baseline and the candidate on the same examples,
and the gate stage judges the recipe's thresholds; the one runner (``run_plan``) writes
report.json, report.md and junit.xml and raises ``GateFailed`` (exit 3) when a gate fails.
Stages use the same cache and keys as ``llmopt run``: a baseline a run has scored is not
scored again, nor is an artifact's model whose stage the cache holds; stages that score
through an endpoint always run, since what a server answers can change behind one URL.

``rejudge`` reads a report.json and judges its gates again, from the per-example
score files it names, with other thresholds: the gate stage over those files read in place,
run by the same runner; written into another folder, the new report takes every file the old
one names along (scores, plots, bench / tune / training files).
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from llmopt.artifacts import reports

from llmopt.scoring import gate
from llmopt.errors import UsageError, near_name
from llmopt.output import Output
from llmopt.plan import build_gate_plan, build_plan, is_url
from llmopt.recipe import load_recipe
from llmopt.recipe.schema import EvalItem
from llmopt.run.runner import RunResult, run_plan
from llmopt.plan.stages import GATE_FIELDS, GateSpec

GATE_KEYS = tuple(k for k in GATE_FIELDS if k not in ("name", "kind")) + ("interval",)


def evaluate(recipe: str | Path, overrides=(), model: str | Path | None = None, endpoint: str | None = None,
             candidate: str | Path | None = None, cache_dir=None, output=None, out: Output | None = None,
             force: list[str] | None = None, strict: bool = False, only: list[str] | None = None) -> RunResult:
    """Score the recipe's evals on one model, or baseline against ``candidate`` with the gates; ``only``: the
    names of the evals to run (with their gates), the others left out."""
    if endpoint and candidate:
        raise UsageError("--endpoint and --candidate together are ambiguous",
                         fix="to gate a served model against the recipe's source, pass its URL as --candidate")
    if endpoint and not is_url(endpoint):
        raise UsageError(f"--endpoint must be an http:// or https:// URL (got {endpoint!r})")
    loaded = load_recipe(recipe, overrides)
    if not loaded.recipe.eval:
        raise UsageError(f"{loaded.path} has no [[eval]] table", fix="add one (`llmopt schema` lists the keys)")
    plan = build_plan(loaded, cache_dir, output, scope="eval", baseline=model, endpoint=endpoint,
                      candidate=None if candidate is None else str(candidate), strict=strict, only=only)
    return run_plan(plan, out, force)


def rejudge(report_path: str | Path, settings: list[str] = (), output: str | Path | None = None,
            cache_dir: str | Path | None = None, out: Output | None = None) -> dict:
    """The report's gates judged again on the same pairs, with ``settings`` (``[eval.]key=value``) applied: a
    plan of the gate stage over the report's saved scores (``build_gate_plan``), which the one runner runs.
    Returns the re-judged report; raises ``GateFailed`` (exit 3, with ``result``) when a gate fails."""
    report_path = Path(report_path)
    try:
        report = json.loads(report_path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {report_path}: {exc}", fix="give the report.json an llmopt run or eval wrote") from None
    if report.get("schema_version") != reports.REPORT_SCHEMA:
        raise UsageError(f"{report_path} has schema_version {report.get('schema_version')!r}; "
                         f"this llmopt reads {reports.REPORT_SCHEMA}", fix="re-judge it with the llmopt that wrote it")
    changes = parse_settings(settings, [g["name"] for g in report.get("gates", [])])
    specs = [gate_spec(g, changes.get(g["name"], {}), report_path.parent) for g in report.get("gates", [])]
    return run_plan(build_gate_plan(report_path, report, specs, output, cache_dir), out).report


def parse_settings(settings: list[str], names: list[str]) -> dict[str, dict]:
    """``-s max_drop=0.02`` (every gate) or ``-s arc.max_drop=0.02`` (one gate) -> {gate: {key: value}}."""
    import tomllib

    changes: dict[str, dict] = {name: {} for name in names}
    for spec in settings:
        key, sep, raw = spec.partition("=")
        name, _, leaf = key.strip().rpartition(".")
        wrong = ("no '=' and value" if not sep
                 else f"unknown gate key {leaf!r}{near_name(leaf, GATE_KEYS)}" if leaf not in GATE_KEYS
                 else f"the report has no eval {name!r}{near_name(name, names)}" if name and name not in names else None)
        if wrong:
            raise UsageError(f"-s {spec}: {wrong}",
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


def gate_spec(record: dict, change: dict, folder: Path) -> GateSpec:
    """A report's gate record with ``change`` laid over its thresholds, checked: the gate stage's spec."""
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
    return GateSpec(**{k: getattr(item, k) for k in GATE_FIELDS}, interval=method, domain=record.get("domain"))
