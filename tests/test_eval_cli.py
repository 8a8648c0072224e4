"""`llmopt eval` and `llmopt gate`: exit codes, report.json schema, JUnit XML, step summary."""

from __future__ import annotations

import json
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest

from llmopt.cli.main import main
from llmopt.artifacts.reports import REPORT_JSON_SCHEMA

from conftest import write_recipe

BODY = """schema_version = 1
name = "gated"

[model]
source = "{model}"

[[eval]]
name = "prose"
kind = "perplexity"
window = 64
max_windows = 4
max_increase_pct = 5

[[eval]]
name = "mc"
kind = "multiple_choice"
limit = 16
max_drop = 0.5
"""


def call(capsys, *args) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def perturbed_copy(model: Path, folder: Path, scale: float = 6.0) -> Path:
    """The tiny model with its (tied) embedding matrix scaled up: sharp, wrong next-token guesses."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(model, folder)
    weights = load_file(folder / "model.safetensors")
    weights["model.embed_tokens.weight"] = weights["model.embed_tokens.weight"] * scale
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.fixture()
def recipe(tiny_model, tmp_path) -> Path:
    return write_recipe(tmp_path, BODY.format(model=tiny_model))


def check_reports(folder: Path, verdicts: dict[str, str]) -> dict:
    report = json.loads((folder / "report.json").read_text())
    jsonschema.validate(report, REPORT_JSON_SCHEMA)
    assert {g["name"]: g["verdict"] for g in report["gates"]} == verdicts
    suite = ET.parse(folder / "junit.xml").getroot()
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == list(verdicts)
    assert int(suite.get("tests")) == len(verdicts)
    assert int(suite.get("failures")) == sum(v == "fail" for v in verdicts.values())
    for case in cases:
        assert (case.find("failure") is not None) == (verdicts[case.get("name")] == "fail")
    for g in report["gates"]:
        assert all((folder / name).is_file() for name in g["scores"].values())
    assert all((folder / e["scores"]).is_file() for e in report["evals"].values())  # the copies, not the cache's
    return report


def test_identical_candidate_passes(capsys, recipe, tiny_model, tmp_path):
    same = shutil.copytree(tiny_model, tmp_path / "same")
    code, out, err = call(capsys, "eval", str(recipe), "--candidate", str(same), "-o", str(tmp_path / "r"), "-f", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["passed"] is True and [g["verdict"] for g in doc["gates"]] == ["pass", "pass"]
    report = check_reports(tmp_path / "r", {"prose": "pass", "mc": "pass"})
    prose = report["gates"][0]
    assert prose["delta"] == 0.0 and prose["method"] == "bootstrap"
    assert "| prose | perplexity |" in (tmp_path / "r" / "report.md").read_text()


def test_damaged_candidate_fails_with_exit_3(capsys, recipe, tiny_model, tmp_path, monkeypatch):
    damaged = perturbed_copy(tiny_model, tmp_path / "damaged")
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    code, out, err = call(capsys, "eval", str(recipe), "--candidate", str(damaged), "-o", str(tmp_path / "r"))
    assert code == 3, err
    assert "accuracy gate failed: prose" in err and "Traceback" not in err
    mc_verdict = json.loads((tmp_path / "r" / "report.json").read_text())["gates"][1]["verdict"]  # chance level either way
    report = check_reports(tmp_path / "r", {"prose": "fail", "mc": mc_verdict})
    prose = report["gates"][0]
    assert prose["candidate"] > 3 * prose["baseline"] and prose["ci"][0] > 1.0  # perplexity several times higher
    assert "FAIL" in (tmp_path / "r" / "report.md").read_text()
    assert "## llmopt accuracy gates: gated" in summary.read_text()

    # judged again: a loose enough threshold passes, without re-scoring anything; a run's other sections stay
    original = json.loads((tmp_path / "r" / "report.json").read_text())
    sections = {"tune": {"tuned": False, "engine": "ort", "files": {}, "reason": "not installed"},
                "training": {"compress.1.distill": {"steps": 2, "loss_first": 1.0, "loss_last": 0.5}}}
    (tmp_path / "r" / "report.json").write_text(json.dumps(original | sections))
    code, out, _ = call(capsys, "gate", str(tmp_path / "r" / "report.json"), "-s", "prose.max_increase_pct=1000",
                        "-s", "mc.max_drop=none", "-o", str(tmp_path / "again"), "-f", "json")
    assert code == 0
    doc = json.loads(out)
    assert [g["verdict"] for g in doc["gates"]] == ["pass", "no-gate"]
    check_reports(tmp_path / "again", {"prose": "pass", "mc": "no-gate"})
    again = json.loads((tmp_path / "again" / "report.json").read_text())
    assert {k: again.get(k) for k in sections} == sections
    # judged again as it was: the gate stage's own verdict function gives the gate stage's records back
    code, out, err = call(capsys, "gate", str(tmp_path / "r" / "report.json"), "-f", "json")
    assert code == 3 and "accuracy gate failed: prose" in err
    keep = ("verdict", "metric", "n", "baseline", "candidate", "delta", "ci", "interval", "domain")
    assert [{k: g.get(k) for k in keep} for g in json.loads(out)["gates"]] == \
        [{k: g.get(k) for k in keep} for g in original["gates"]]
    assert original["gates"][0]["domain"] == "science prose"  # kept: a re-judged report still says what was held


def report_with_files(folder: Path) -> Path:
    """A report folder as `llmopt run` leaves it, written without a model: one gate judged from hand-written
    per-example scores, and bench, tune and training sections whose files (plots among them) lie beside it."""
    from llmopt.artifacts import reports
    from llmopt.scoring import gate
    from llmopt.recipe.schema import EvalItem

    folder.mkdir(parents=True)
    scores = {"baseline": [1, 1, 0, 1, 1, 0], "candidate": [1, 0, 0, 1, 1, 1]}
    for role, values in scores.items():
        rows = [json.dumps({"id": f"x{i}", "score": v}) for i, v in enumerate(values)]
        (folder / f"eval.mc.{role}.scores.jsonl").write_text("\n".join(rows) + "\n")
    read = {role: gate.read_scores(folder / f"eval.mc.{role}.scores.jsonl") for role in scores}
    judged = gate.judge(EvalItem(name="mc", kind="multiple_choice", max_drop=0.5),
                        gate.compare("acc", read["baseline"], read["candidate"], 0.95), True)
    evals = {f"eval.mc.{role}": {"metric": "acc", "value": sum(v) / len(v), "higher_is_better": True, "n": len(v),
                                 "scores": f"eval.mc.{role}.scores.jsonl"} for role, v in scores.items()}
    bench = {"engine": "vllm", "workload": {"input_len": 16, "output_len": 4, "concurrency": 2},
             "slo": {"ttft_p99_ms": 60000}, "options": {"requests": 4, "warmup": 1, "repeats": 1}, "points": [],
             "files": {"json": "bench/bench.json", "markdown": "bench/bench.md", "requests": "bench/requests.jsonl",
                       "log": "bench/engine.log", "plots": ["bench/latency.png", "bench/throughput.png"]}}
    tune = {"tuned": False, "engine": "vllm", "reason": "no trial met the SLO",
            "files": {"json": "tune/tuning.json", "plot": "tune/tuning.png"}}
    training = {"compress.1.distill": {"steps": 2, "loss_first": 1.0, "loss_last": 0.5, "seconds": 1.0,
                                       "history": "training/compress.1.distill.loss.json",
                                       "plot": "training/compress.1.distill.loss.png"}}
    named = [*[v for v in bench["files"].values() if isinstance(v, str)], *bench["files"]["plots"],
             *tune["files"].values(), *[t[k] for t in training.values() for k in ("history", "plot")]]
    for name in named:
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_text(f"contents of {name}")
    reports.write_reports(folder, "tiny", "0" * 64, evals, reports.with_score_files(folder, [judged]), bench, tune,
                          training)
    return folder / "report.json"


def test_gate_into_another_folder_copies_every_file_the_report_names(capsys, tmp_path):
    report = report_with_files(tmp_path / "r")
    code, _, err = call(capsys, "gate", str(report), "-s", "mc.max_drop=0.9", "-o", str(tmp_path / "again"), "-f", "json")
    assert code == 0, err
    again = check_reports(tmp_path / "again", {"mc": "pass"})
    named = [*again["bench"]["files"].values(), *again["tune"]["files"].values(),
             *[t[k] for t in again["training"].values() for k in ("history", "plot")]]
    named = [n for v in named for n in (v if isinstance(v, list) else [v])]
    assert len(named) == 10
    for name in named:
        assert (tmp_path / "again" / name).read_text() == f"contents of {name}", name
    links = re.findall(r"\]\(([^)]+)\)", (tmp_path / "again" / "report.md").read_text())
    assert links and all((tmp_path / "again" / link).is_file() for link in links)
    # judged by the gate stage, run by the one runner over the saved scores read in place: logged, and cached
    # under a key of the thresholds and the score files' contents
    log = next((tmp_path / "cache" / "runs").glob("*.log")).read_text()
    assert "stage gate: running" in log
    entries = [json.loads(m.read_text()) for m in (tmp_path / "cache" / "stages").glob("*/manifest.json")]
    assert [(e["kind"], sorted(e["inputs"])) for e in entries] == [("gate", ["mc.baseline", "mc.candidate"])]
    assert entries[0]["options"]["gates"][0]["max_drop"] == 0.9


def test_gate_rejects_unknown_settings(capsys, recipe, tiny_model, tmp_path):
    assert call(capsys, "eval", str(recipe), "--candidate", str(tiny_model), "-o", str(tmp_path / "r"))[0] == 0
    report = str(tmp_path / "r" / "report.json")
    code, _, err = call(capsys, "gate", report, "-s", "prose.max_dorp=1")
    assert code == 2 and "KEY one of max_drop" in err
    assert "-s prose.max_dorp=1: unknown gate key 'max_dorp' (did you mean 'max_drop'?)" in err  # says which part
    code, _, err = call(capsys, "gate", report, "-s", "nosuch.max_drop=1")
    assert code == 2 and "EVAL one of prose, mc" in err
    assert "-s nosuch.max_drop=1: the report has no eval 'nosuch'" in err
    code, _, err = call(capsys, "gate", report, "-s", "max_drop")
    assert code == 2 and "-s max_drop: no '=' and value" in err
    code, _, err = call(capsys, "gate", report, "-s", "prose.interval=score")
    assert code == 2 and "0/1 scores" in err
    code, out, _ = call(capsys, "gate", report, "-s", "mc.interval=bootstrap", "-f", "json")
    assert code == 0 and json.loads(out)["gates"][1]["method"] == "bootstrap"


def test_eval_a_model_alone(capsys, recipe, tiny_model, tmp_path):
    code, out, err = call(capsys, "eval", str(recipe), "--model", str(tiny_model), "-o", str(tmp_path / "r"), "-f", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["gates"] == [] and set(doc["evals"]) == {"eval.prose", "eval.mc"}
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    jsonschema.validate(report, REPORT_JSON_SCHEMA)
    assert "No gates: the model was scored alone." in (tmp_path / "r" / "report.md").read_text()
    assert ET.parse(tmp_path / "r" / "junit.xml").getroot().get("tests") == "0"


def test_only_runs_the_named_evals_and_their_gates(capsys, recipe, tiny_model, tmp_path):
    """`--only mc` scores and gates mc alone; a name the recipe lacks is exit 2 listing the names it has."""
    damaged = perturbed_copy(tiny_model, tmp_path / "damaged")
    code, out, err = call(capsys, "eval", str(recipe), "--candidate", str(damaged), "--only", "mc", "-o",
                          str(tmp_path / "r"), "-f", "json")
    doc = json.loads(out)
    assert [g["name"] for g in doc["gates"]] == ["mc"] and set(doc["evals"]) == {"eval.mc.baseline", "eval.mc.candidate"}
    assert code == (0 if doc["gates"][0]["verdict"] == "pass" else 3), err  # prose, which it fails, was left out
    check_reports(tmp_path / "r", {"mc": doc["gates"][0]["verdict"]})
    code, _, err = call(capsys, "eval", str(recipe), "--candidate", str(damaged), "--only", "prose,qa")
    assert code == 2 and "--only qa" in err and "name one or more of: prose, mc" in err and "Traceback" not in err


def test_eval_usage_errors(capsys, recipe, tmp_path):
    code, _, err = call(capsys, "eval", str(recipe), "--endpoint", "http://127.0.0.1:9/v1", "--candidate", "x")
    assert code == 2 and "ambiguous" in err
    code, _, err = call(capsys, "eval", str(recipe), "--candidate", str(tmp_path / "missing"))
    assert code == 2 and "model folder not found" in err
    # the problem is the command line's, not the recipe's model.source or eval line
    assert f"--candidate {tmp_path / 'missing'} (command line): model folder not found" in err
    assert "fix: fix the command line" in err
    code, _, err = call(capsys, "eval", str(recipe), "--model", str(tmp_path / "gone"))
    assert code == 2 and f"--model {tmp_path / 'gone'} (command line): model folder not found" in err
    code, _, err = call(capsys, "eval", str(recipe), "--candidate", "http://127.0.0.1:9/v1", "--only", "prose")
    assert code == 2 and "--candidate http://127.0.0.1:9/v1 (command line): endpoint" in err and "does not answer" in err
    code, _, err = call(capsys, "eval", str(recipe), "--endpoint", "http://127.0.0.1:9/v1", "--only", "prose")
    assert code == 2 and "--endpoint http://127.0.0.1:9/v1 (command line): endpoint" in err
    assert str(recipe) + ":" not in err.split("\n", 1)[1]  # no line of the recipe is blamed
    code, _, err = call(capsys, "gate", str(tmp_path / "nope.json"))
    assert code == 2 and "cannot read" in err


@pytest.mark.parametrize("command", ["eval", "gate"])
def test_help_has_examples(capsys, command):
    code, out, _ = call(capsys, command, "--help")
    assert code == 0 and "Examples:" in out and f"llmopt {command} " in out
