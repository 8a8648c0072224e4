"""lm-eval tasks through lm-eval's own API, offline: a local task YAML and data file made here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmopt.run import evaluate
from conftest import DATA, write_recipe

pytest.importorskip("lm_eval")

TASK_YAML = """\
task: tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: tiny_mc.jsonl
output_type: multiple_choice
test_split: test
doc_to_text: "Question: {{question}}\\nAnswer:"
doc_to_target: "{{answer}}"
doc_to_choice: "{{choices}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
"""


def write_task(folder: Path, items: int = 20) -> Path:
    tasks = folder / "tasks"
    tasks.mkdir()
    lines = (DATA / "mc.jsonl").read_text().splitlines()[:items]
    (tasks / "tiny_mc.jsonl").write_text("\n".join(lines) + "\n")
    (tasks / "tiny_mc.yaml").write_text(TASK_YAML)
    return tasks / "tiny_mc.yaml"


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_local_task_yaml_matches_llmopts_own_multiple_choice(tiny_model, tmp_path):
    write_task(tmp_path)
    body = f"""schema_version = 1
name = "lm-eval-tiny"

[model]
source = "{tiny_model}"

[[eval]]
name = "tiny"
kind = "lm_eval"
task = "tasks/tiny_mc.yaml"
metric = "acc"
max_drop = 0.5

[[eval]]
name = "mine"
kind = "multiple_choice"
limit = 20

[[eval]]
name = "with-bos"
kind = "multiple_choice"
limit = 20
bos = "always"
"""
    recipe = write_recipe(tmp_path, body)
    result = evaluate.evaluate(recipe, candidate=tiny_model, output=tmp_path / "r")
    theirs = rows(tmp_path / "r" / "eval.tiny.baseline.scores.jsonl")
    ours = rows(tmp_path / "r" / "eval.mine.baseline.scores.jsonl")
    assert [r["id"] for r in theirs] == [f"tiny_mc/{i}" for i in range(20)]
    # same prompt, same continuations, same argmax of log-likelihood: the same answers
    assert [r["score"] for r in theirs] == [float(r["score"]) for r in ours]
    # issue 37: each choice's log-likelihood is lm-eval's, not only the pick: no BOS before the context, since
    # this tokenizer (as SmolLM2's) puts none there; with one, the figures differ (the 0.775 against 0.85 seen)
    for mine, lm in zip(ours, theirs):
        assert mine["loglik"] == pytest.approx(lm["loglik"], abs=2e-4), mine["id"]
    with_bos = rows(tmp_path / "r" / "eval.with-bos.baseline.scores.jsonl")
    assert all(row["loglik"] != pytest.approx(lm["loglik"], abs=2e-4) for row, lm in zip(with_bos, theirs))
    tiny = next(g for g in result.gates if g["name"] == "tiny")
    assert tiny["n"] == 20 and tiny["verdict"] == "pass" and tiny["method"] == "score"
    outputs = result.report["evals"]["eval.tiny.baseline"]
    assert outputs["tasks"] == ["tiny_mc"] and outputs["lm_eval"] == "0.4.13"


def test_data_option_feeds_a_local_file_and_wrong_metric_is_named(tiny_model, tmp_path):
    yaml_path = write_task(tmp_path, items=6)
    yaml_path.write_text(TASK_YAML.replace("dataset_path: json", "dataset_path: nobody/not-on-disk")
                         .replace("dataset_kwargs:\n  data_files:\n    test: tiny_mc.jsonl\n", ""))
    body = f"""schema_version = 1
name = "lm-eval-data"

[model]
source = "{tiny_model}"

[[eval]]
name = "tiny"
kind = "lm_eval"
task = "tasks/tiny_mc.yaml"
data = "tasks/tiny_mc.jsonl"
metric = "acc_norm"
"""
    recipe = write_recipe(tmp_path, body)
    result = evaluate.evaluate(recipe, output=tmp_path / "r")
    assert result.evals["eval.tiny"]["n"] == 6 and result.evals["eval.tiny"]["metric"] == "acc_norm"
    from llmopt.errors import StageFailed

    with pytest.raises(StageFailed, match="reports no per-example 'exact_match'"):
        evaluate.evaluate(recipe, overrides=['eval[0].metric="exact_match"'], output=tmp_path / "r2")


def test_lm_eval_through_an_endpoint_matches_in_process(tiny_model, tmp_path):
    from test_eval_endpoint import Server, make_app

    write_task(tmp_path, items=8)
    body = f"""schema_version = 1
name = "lm-eval-served"

[model]
source = "{tiny_model}"

[[eval]]
name = "tiny"
kind = "lm_eval"
task = "tasks/tiny_mc.yaml"
batch_size = 1
max_drop = 0.5
"""
    recipe = write_recipe(tmp_path, body)
    app, _ = make_app(tiny_model)
    with Server(app) as server:
        result = evaluate.evaluate(recipe, candidate=server.url, output=tmp_path / "r")
    assert any(r.get("echo") for r in app.state.requests)  # lm-eval's local-completions scored through it
    base = rows(tmp_path / "r" / "eval.tiny.baseline.scores.jsonl")
    cand = rows(tmp_path / "r" / "eval.tiny.candidate.scores.jsonl")
    assert [r["score"] for r in base] == [r["score"] for r in cand]
    assert result.gates[0]["verdict"] == "pass"


@pytest.mark.slow
def test_registered_task_with_local_data_runs_offline(tiny_model, tmp_path):
    """arc_easy's own YAML and processing, fed a local file in ARC's schema (the hub is off)."""
    records = []
    for line in (DATA / "mc.jsonl").read_text().splitlines()[:10]:
        item = json.loads(line)
        labels = "ABCD"[: len(item["choices"])]
        records.append({"id": item["id"], "question": item["question"], "answerKey": labels[item["answer"]],
                        "choices": {"text": item["choices"], "label": list(labels)}})
    (tmp_path / "arc_like.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    body = f"""schema_version = 1
name = "arc-local"

[model]
source = "{tiny_model}"

[[eval]]
name = "arc"
kind = "lm_eval"
task = "arc_easy"
data = "arc_like.jsonl"
metric = "acc_norm"
"""
    result = evaluate.evaluate(write_recipe(tmp_path, body), output=tmp_path / "r")
    assert result.evals["eval.arc"]["n"] == 10
    assert [r["id"] for r in rows(tmp_path / "r" / "eval.arc.scores.jsonl")] == [f"arc_easy/{i}" for i in range(10)]
