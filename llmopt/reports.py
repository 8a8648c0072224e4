"""Reports of a run: report.json, a markdown summary, JUnit XML and the model card.

``report.json`` has a stable schema (``schema_version``); ``junit.xml`` holds one
test case per gate so CI systems show each gate; when ``GITHUB_STEP_SUMMARY`` is
set the markdown summary is appended to it.
"""

from __future__ import annotations

import os
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

from llmopt.cache import write_json
from llmopt.output import human_size

REPORT_SCHEMA = 1


def write_all(folder: Path, plan, manifests: dict, gates: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    report = {
        "schema_version": REPORT_SCHEMA,
        "recipe": plan.recipe.recipe.name,
        "recipe_sha256": plan.recipe.digest,
        "evals": {s.name: manifests[s.name]["outputs"] for s in plan.stages if s.kind == "eval"},
        "gates": gates,
        "passed": all(g["verdict"] != "fail" for g in gates),
    }
    write_json(folder / "report.json", report)
    for stage in plan.stages:
        scores = manifests[stage.name]["outputs"].get("scores") if stage.kind == "eval" else None
        if scores:
            shutil.copy2(plan.cache.path(stage.key) / scores, folder / f"{stage.name}.scores.jsonl")
    summary = markdown(plan.recipe.recipe.name, gates)
    (folder / "report.md").write_text(summary)
    (folder / "junit.xml").write_text(junit(plan.recipe.recipe.name, gates))
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        with open(step_summary, "a", encoding="utf-8") as f:
            f.write(summary + "\n")


def fmt(value, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def gate_rows(gates: list[dict]) -> list[list[str]]:
    rows = []
    for g in gates:
        lo, hi = g.get("ci") or [None, None]
        delta = g.get("delta")
        if g.get("metric") == "perplexity" and delta is not None:
            shown = f"{delta * 100:+.2f}%"
            ci = f"[{lo * 100:+.2f}%, {hi * 100:+.2f}%]"
        else:
            shown = f"{delta:+.4f}" if delta is not None else "-"
            ci = f"[{lo:+.4f}, {hi:+.4f}]" if lo is not None else "-"
        rows.append([g["name"], g.get("metric", "-"), fmt(g.get("baseline")), fmt(g.get("candidate")), shown, ci,
                     str(g.get("n", 0)), g["verdict"].upper()])
    return rows


HEADER = ["eval", "metric", "baseline", "candidate", "delta", "interval", "n", "verdict"]


def markdown(name: str, gates: list[dict]) -> str:
    lines = [f"## llmopt accuracy gates: {name}", ""]
    if not gates:
        return "\n".join(lines + ["No evals in this recipe.", ""])
    lines.append("| " + " | ".join(HEADER) + " |")
    lines.append("|" + "---|" * len(HEADER))
    lines += ["| " + " | ".join(row) + " |" for row in gate_rows(gates)]
    lines.append("")
    lines += [f"- **{g['name']}**: {g.get('reason', '')}" for g in gates]
    return "\n".join(lines) + "\n"


def junit(name: str, gates: list[dict]) -> str:
    failures = sum(g["verdict"] == "fail" for g in gates)
    suite = ET.Element("testsuite", name=f"llmopt.{name}", tests=str(len(gates)), failures=str(failures))
    for g in gates:
        case = ET.SubElement(suite, "testcase", classname=f"llmopt.{name}", name=g["name"])
        if g["verdict"] == "fail":
            failure = ET.SubElement(case, "failure", message=g.get("reason", "gate failed"))
            failure.text = f"delta={g.get('delta')} ci={g.get('ci')} n={g.get('n')}"
        elif g["verdict"] == "no-gate":
            ET.SubElement(case, "skipped", message="no threshold set")
    return ET.tostring(ET.ElementTree(suite).getroot(), encoding="unicode", xml_declaration=True)


def card(plan, manifest: dict, gates: list[dict]) -> str:
    recipe = plan.recipe.recipe
    steps = ", ".join(f"{s.method}" for s in recipe.compress) or "none"
    est = plan.estimates
    lines = [
        f"# {recipe.name}",
        "",
        recipe.description or "",
        "",
        "## Compression card",
        "",
        f"- source: `{recipe.model.source}` (fingerprint `{(manifest['source']['fingerprint'] or '')[:16]}`)",
        f"- compression: {steps}",
        f"- export format: {recipe.export.format}",
        f"- calibration: {recipe.calibration.data}, {recipe.calibration.samples} x {recipe.calibration.max_seq_len} tokens"
        + (f" (sha256 `{manifest['calibration_sha256'][:16]}`)" if manifest.get("calibration_sha256") else ""),
        f"- weights: {human_size(est.get('weight_bytes_before'))} -> {human_size(est.get('weight_bytes_after'))} (estimated)",
        f"- target: {plan.gpu.name if plan.gpu else 'CPU'}",
        f"- recipe sha256: `{plan.recipe.digest[:16]}`",
        "",
        "## Accuracy",
        "",
        markdown(recipe.name, gates),
    ]
    deploy = manifest.get("deploy") or {}
    if deploy.get("command"):
        lines += ["## Launch", "", "```sh", deploy["command"], "```", ""]
    lines += ["Every file's SHA-256 is in `manifest.json`; `llmopt verify <this folder>` checks them.", ""]
    return "\n".join(lines)
