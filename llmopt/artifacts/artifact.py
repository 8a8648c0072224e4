"""Assemble the deployable artifact from finished stages.

Layout::

    <output>/model/           the final model folder
    <output>/draft/           the draft model [[draft]] made, for speculative decoding (when the recipe has one)
    <output>/deploy/<engine>/ launch configs (when the recipe has [serve])
    <output>/reports/         report.json, report.md, junit.xml, per-example scores, run.log
    <output>/manifest.json    provenance, metrics, verdicts, the checksum of every file
    <output>/README.md        the compression card

Everything is written into a temporary sibling folder and renamed into place, so
an artifact folder is either the old one or the new one, never half of each. The
model's weight files are hard links to the stage cache's files where both are on
one filesystem (``cache.place_tree``), copies otherwise. Checksums are BLAKE3 (what
``b3sum`` prints) unless the recipe's ``[output] checksum`` says "sha256".
"""

from __future__ import annotations

import json
import os
import shutil
from datetime import datetime, timezone
from pathlib import Path

import llmopt
from llmopt.artifacts import reports
from llmopt.libraries import versions
from llmopt.store.cache import checksums, place_tree, swap_into_place, write_json
from llmopt.plan import Plan


def model_dir(plan: Plan, manifest: dict) -> Path:
    """Where a model-producing stage's model folder is."""
    where = Path(manifest["outputs"].get("model_dir", "model"))
    return where if where.is_absolute() else plan.cache.path(manifest["key"]) / where


def assemble(plan: Plan, manifests: dict, gates: list[dict], log_path: Path) -> dict:
    """The artifact from the finished stages: the final model, the deploy stage's configs, the
    reports and the manifest; returns report.json's content."""
    final = plan.output_dir
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        folder = model_dir(plan, manifests[plan.final_model_stage.name])
        # only the cache's own files are linked: a source folder read in place is the user's, and is copied
        placed = place_tree(folder, tmp / "model", link=folder.resolve().is_relative_to(plan.cache.root.resolve()))
        placed = {f"model/{name}": how for name, how in placed.items()}
        drafts = plan.kind("draft")
        if drafts:  # the draft the launch configs name as {draft}
            folder = model_dir(plan, manifests[drafts[-1].name])
            placed |= {f"draft/{name}": how for name, how in place_tree(folder, tmp / "draft").items()}
        deploy = place_deploy(plan, manifests, tmp)
        manifest = build_manifest(plan, manifests, gates, deploy)
        manifest["model_bytes"] = sum(p.stat().st_size for p in (tmp / "model").rglob("*") if p.is_file())
        report = reports.write_all(tmp / "reports", plan, manifests, gates)
        manifest["bench"] = report.get("bench")  # the bench stage's figures (None without one)
        manifest["tune"] = report.get("tune")  # the tune stage's verdict (None without one)
        if report.get("choice"):  # several engines: which one the artifact is served with, and every one's figures
            manifest["choice"] = report["choice"]
        shutil.copy2(log_path, tmp / "reports" / "run.log")
        (tmp / "README.md").write_text(reports.card(plan, manifest, gates))
        manifest["linked"] = sorted(name for name, how in placed.items() if how == "link")
        manifest["checksum"] = plan.recipe.recipe.output.checksum
        manifest["files"] = checksums(tmp, manifest["checksum"])
        write_json(tmp / "manifest.json", manifest)
        readable(tmp)
        swap_into_place(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return report


def write_reports(plan: Plan, manifests: dict, gates: list[dict], log_path: Path) -> dict:
    """An eval's reports (report.json, report.md, junit.xml, scores, run.log) in the plan's output folder."""
    report = reports.write_all(plan.output_dir, plan, manifests, gates)
    shutil.copy2(log_path, plan.output_dir / "run.log")
    return report


def write_tuning(plan: Plan, manifests: dict, gates: list[dict], log_path: Path) -> dict:
    """``llmopt tune ARTIFACT``'s results in the plan's output folder: the tune stage's tuning.json, the
    winner's ``deploy/`` and tuning.png, and run.log. The artifact itself is not changed."""
    final = write_results(plan, "tune", log_path)
    return {"gates": gates, "tune": json.loads((final / "tuning.json").read_text())}


def write_bench(plan: Plan, manifests: dict, gates: list[dict], log_path: Path) -> dict:
    """``llmopt bench ARTIFACT``'s results in the plan's output folder: the bench stage's bench.json,
    bench.md, requests.jsonl, engine.log and plots, and run.log."""
    final = write_results(plan, "bench", log_path)
    return {"gates": gates, "bench": json.loads((final / "bench.json").read_text())}


def write_rejudged(plan: Plan, manifests: dict, gates: list[dict], log_path: Path) -> dict:
    """``llmopt gate REPORT``'s report: the report (the plan's recipe path) with the gate stage's verdicts, each
    keeping the score files and the eval stages it named. With an output folder, report.json, report.md and
    junit.xml are written there, with every file the report names copied along; without one, nothing."""
    source = Path(plan.recipe.path)
    report = json.loads(source.read_text())
    named = {g["name"]: g for g in report.get("gates", [])}
    keep = ("scores", "baseline_stage", "candidate_stage")
    gates = [record | {k: named[record["name"]][k] for k in keep if k in named[record["name"]]} for record in gates]
    new = dict(report, gates=gates, passed=all(g["verdict"] != "fail" for g in gates))
    if plan.output_dir is not None:
        folder = Path(plan.output_dir)
        reports.copy_named_files(new, source.parent, folder)
        reports.write_reports(folder, report["recipe"], report["recipe_sha256"], report.get("evals", {}), gates,
                              report.get("bench"), report.get("tune"), report.get("training"), report.get("choice"))
    return new


def write_results(plan: Plan, kind: str, log_path: Path) -> Path:
    """The files of the plan's ``kind`` stage and the run's log, written beside the output folder and renamed
    into place (an older folder there is replaced whole); returns the folder."""
    stage = plan.kind(kind)[0]
    final = Path(plan.output_dir)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        shutil.copytree(plan.cache.path(stage.key), tmp, ignore=shutil.ignore_patterns("manifest.json"))
        shutil.copy2(log_path, tmp / "run.log")
        swap_into_place(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def place_deploy(plan: Plan, manifests: dict, root: Path) -> dict:
    """Each deploy stage's launch configs copied to ``deploy/<engine>/`` (its tune stage's, when there is one); the
    outputs of the deploy stage of the engine the artifact is served with (the choose stage's pick, of several), or
    {}."""
    deploys = plan.kind("deploy")
    if not deploys:
        return {}
    tunes = {s.backend: s for s in plan.kind("tune")}  # the tuned launch config (or the prediction, saying it is not)
    for stage in deploys:
        tune = tunes.get(stage.backend)
        source = plan.cache.path(tune.key) / "deploy" if tune is not None else plan.cache.path(stage.key)
        shutil.copytree(source, root / "deploy" / stage.backend, ignore=shutil.ignore_patterns("manifest.json"))
    chosen = plan.kind("choose")
    served = manifests[chosen[0].name]["outputs"]["engine"] if chosen else deploys[0].backend
    return manifests[f"deploy.{served}"]["outputs"]


def readable(root: Path) -> None:
    """Artifact files readable by everyone (0644; scripts 0755): a container or another user serves them."""
    for path in root.rglob("*"):
        if path.is_dir():
            path.chmod(0o755)
        elif path.is_file() and not path.is_symlink():
            path.chmod(0o755 if path.suffix == ".sh" else 0o644)


def build_manifest(plan: Plan, manifests: dict, gates: list[dict], deploy: dict) -> dict:
    recipe = plan.recipe
    source = manifests["source"]
    calibrated = [m for m in manifests.values() if "calibration_sha256" in m.get("material", {})]
    return {
        "schema_version": 1,
        "llmopt_version": llmopt.__version__,
        "created": datetime.now(timezone.utc).isoformat(),
        "recipe": {"name": recipe.recipe.name, "path": str(recipe.path), "sha256": recipe.digest,
                   "resolved": recipe.recipe.model_dump(mode="json")},
        "source": {"spec": recipe.recipe.model.source, "fingerprint": source["outputs"].get("fingerprint")},
        "calibration_sha256": calibrated[0]["material"]["calibration_sha256"] if calibrated else None,
        "stages": [
            {"name": s.name, "backend": s.backend, "key": s.key, "options": manifests[s.name]["options"],
             "versions": manifests[s.name]["material"].get("versions", {}), "timing": manifests[s.name]["timing"],
             "outputs": manifests[s.name]["outputs"]}
            for s in plan.stages
        ],
        "metrics": {s.name: manifests[s.name]["outputs"] for s in plan.stages if s.kind == "eval"},
        "draft": next((manifests[s.name]["outputs"] for s in plan.kind("acceptance")), None),
        "gates": gates,
        "estimates": plan.estimates,
        "target": plan.gpu.to_dict() if plan.gpu else {"device": "cpu"},
        "hardware": {"gpu": plan.gpu.name if plan.gpu else None, "count": recipe.recipe.target.count,
                     "nodes": recipe.recipe.target.nodes,
                     "serving_gpus": deploy.get("gpus", (deploy.get("memory") or {}).get("gpus")),
                     "built_on": _machine()},
        "deploy": deploy,
        "versions": versions(("torch", "transformers", "llmcompressor", "compressed-tensors", "nvidia-modelopt",
                              "onnxruntime", "onnxruntime-genai", "lm-eval")),
    }


def _machine() -> dict:
    import platform

    return {"platform": platform.platform(), "python": platform.python_version()}
