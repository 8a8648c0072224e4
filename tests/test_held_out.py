"""Evaluation that is held out: eval data checked against the calibration data at plan time, and
reports that name each eval's domain and the spread of the change across domains."""

from __future__ import annotations

from llmopt import api
from llmopt.cli.main import main
from llmopt.artifacts.reports import across_domains, markdown

from conftest import write_recipe

RECIPE = """schema_version = 1
name = "held-out"

[model]
source = "{model}"

[calibration]
data = "{calibration}"
samples = 4
max_seq_len = 32

[[compress]]
method = "prune_depth"
layers = 1
protect_first = 0
protect_last = 0

[[eval]]
name = "ppl"
kind = "perplexity"
data = "{eval}"
window = 64
max_windows = 2
max_increase_pct = 50
"""


def recipe(tmp_path, model, calibration, eval_data):
    return write_recipe(tmp_path, RECIPE.format(model=model, calibration=calibration, eval=eval_data))


def test_calibration_text_reused_as_eval_data_is_refused_at_plan_time(tiny_model, tmp_path, capsys):
    path = recipe(tmp_path, tiny_model, "builtin:prose", "builtin:prose")
    plan = api.plan(path)
    [error] = [p for p in plan.errors if "not held out" in p.message]
    assert error.where.endswith("eval[0].data") and "contaminated" in error.message
    assert main(["plan", str(path), "-f", "quiet"]) == 2


def test_a_passage_copied_from_calibration_into_eval_data_is_refused(tiny_model, tmp_path):
    from llmopt.data import BUILTIN

    passage = BUILTIN["prose"].path.read_text().split("\n\n")[3]
    clean = BUILTIN["fiction-eval"].path.read_text()
    (tmp_path / "eval.txt").write_text(clean + "\n\n" + passage + "\n")
    plan = api.plan(recipe(tmp_path, tiny_model, "builtin:prose", str(tmp_path / "eval.txt")))
    assert any("not held out" in p.message for p in plan.errors)


def test_same_source_is_a_warning_and_other_domains_are_clean(tiny_model, tmp_path):
    same = api.plan(recipe(tmp_path, tiny_model, "builtin:prose", "builtin:prose-eval"))
    assert not same.errors
    assert any("calibration data's source" in p.message and p.severity == "warning" for p in same.problems)
    other = api.plan(recipe(tmp_path, tiny_model, "builtin:mix", "builtin:fiction-eval"))
    assert not [p for p in other.problems if "held out" in p.message or "source" in p.message]
    gate = next(s for s in other.stages if s.kind == "gate")
    assert gate.options.gates[0].domain == "narrative fiction"


def test_report_shows_the_change_across_domains():
    gates = [
        {"name": "prose", "metric": "perplexity", "delta": 0.24, "baseline": 20.0, "domain": "science prose"},
        {"name": "fiction", "metric": "perplexity", "delta": 0.47, "baseline": 30.0, "domain": "narrative fiction"},
        {"name": "mc", "metric": "acc", "delta": -0.05, "baseline": 0.5, "domain": "multiple-choice questions"},
    ]
    line = across_domains(gates)
    assert line == "perplexity across 2 domains: +24.0% science prose, +47.0% narrative fiction (spread 23.0 points)"
    for g in gates:
        g.update(n=10, ci=[g["delta"], g["delta"]], verdict="pass", reason="ok")
    assert "Relative change by domain: perplexity across 2 domains" in markdown("r", gates)
    assert across_domains(gates[:1]) is None
