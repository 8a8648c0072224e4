"""One planner, one runner: `llmopt eval` and `llmopt gate` reuse what `llmopt run` finished."""

from __future__ import annotations

import json
import shutil

import pytest

from llmopt.cli.main import main

from conftest import tiny_recipe, write_recipe

PRUNE = """
[calibration]
samples = 4
max_seq_len = 32

[[compress]]
method = "prune_depth"
layers = 1
protect_first = 0
protect_last = 0
"""


def call(capsys, *args) -> tuple[int, dict]:
    code = main([*args, "--format", "json"])
    out, err = capsys.readouterr()
    return code, json.loads(out)


def statuses(doc: dict) -> dict[str, str]:
    return {s["name"]: s["status"] for s in doc["stages"]}


@pytest.mark.parametrize("how", ["--cache-dir", "LLMOPT_CACHE", "output.cache_dir"])
def test_eval_and_gate_run_nothing_that_run_finished(capsys, tiny_model, tmp_path, monkeypatch, how):
    cache = tmp_path / "chosen-cache"
    extra, flags = "", []
    if how == "--cache-dir":  # the flag wins over the variable
        flags = ["--cache-dir", str(cache)]
        monkeypatch.setenv("LLMOPT_CACHE", str(tmp_path / "other"))
    elif how == "LLMOPT_CACHE":  # the variable wins over the recipe
        monkeypatch.setenv("LLMOPT_CACHE", str(cache))
        extra = f'\n[output]\ncache_dir = "{tmp_path / "other"}"\n'
    else:
        monkeypatch.delenv("LLMOPT_CACHE")
        extra = f'\n[output]\ncache_dir = "{cache}"\n'
    recipe = write_recipe(tmp_path, tiny_recipe(tiny_model, PRUNE + extra))
    art = tmp_path / "art"

    code, run = call(capsys, "run", str(recipe), "-o", str(art), *flags)
    assert code == 0 and set(statuses(run).values()) == {"ran"}
    assert (cache / "stages").is_dir() and not (tmp_path / "other" / "stages").exists()

    code, alone = call(capsys, "eval", str(recipe), "-o", str(tmp_path / "r1"), *flags)
    assert code == 0 and statuses(alone) == {"source": "cached", "eval.prose": "cached"}

    code, gated = call(capsys, "eval", str(recipe), "--candidate", str(art), "-o", str(tmp_path / "r2"), *flags)
    assert code == 0, gated
    assert set(statuses(gated).values()) == {"cached"}, statuses(gated)
    assert gated["gates"] == [dict(g, scores=gated["gates"][0]["scores"]) for g in run["gates"]]

    # llmopt gate has no recipe: its cache is --cache-dir, else LLMOPT_CACHE, else the default
    gate_flags = flags if how != "output.cache_dir" else ["--cache-dir", str(cache)]
    code, judged = call(capsys, "gate", str(tmp_path / "r2" / "report.json"), *gate_flags)
    assert code == 0 and judged["gates"][0]["delta"] == run["gates"][0]["delta"]
    assert not (tmp_path / "other" / "stages").exists()


def test_candidate_artifact_whose_model_changed_is_scored_again(capsys, tiny_model, tmp_path):
    recipe = write_recipe(tmp_path, tiny_recipe(tiny_model, PRUNE))
    art = tmp_path / "art"
    assert main(["run", str(recipe), "-o", str(art), "-f", "quiet"]) == 0
    capsys.readouterr()
    config = art / "model" / "config.json"
    config.write_text(config.read_text().replace("{", '{"edited": true,', 1))  # no longer what the manifest says
    code, doc = call(capsys, "eval", str(recipe), "--candidate", str(art), "-o", str(tmp_path / "r"))
    assert code == 0, doc
    assert statuses(doc)["candidate"] == "ran" and statuses(doc)["eval.prose.candidate"] == "ran"


def test_an_artifacts_model_folder_is_its_cached_model_stage(capsys, tiny_model, tmp_path):
    """`--candidate ART/model` and `--model ART/model` stand for the artifact's model stage, as ART does; the
    same files copied out of the artifact are a folder like any other, read in place."""
    recipe = write_recipe(tmp_path, tiny_recipe(tiny_model, PRUNE))
    art = tmp_path / "art"
    code, run = call(capsys, "run", str(recipe), "-o", str(art))
    assert code == 0
    code, doc = call(capsys, "eval", str(recipe), "--candidate", str(art / "model"), "-o", str(tmp_path / "r1"))
    assert code == 0 and set(statuses(doc).values()) == {"cached"}, statuses(doc)
    assert doc["gates"][0]["candidate"] == run["gates"][0]["candidate"]
    code, alone = call(capsys, "eval", str(recipe), "--model", str(art / "model"), "-o", str(tmp_path / "r2"))
    assert code == 0 and statuses(alone) == {"source": "cached", "eval.prose": "cached"}
    assert alone["evals"]["eval.prose"]["value"] == run["gates"][0]["candidate"]
    copy = shutil.copytree(art / "model", tmp_path / "copied")
    code, doc = call(capsys, "eval", str(recipe), "--candidate", str(copy), "-o", str(tmp_path / "r3"))
    assert code == 0 and statuses(doc)["candidate"] == "ran" and statuses(doc)["eval.prose.candidate"] == "ran"
    assert doc["gates"][0]["candidate"] == pytest.approx(run["gates"][0]["candidate"], rel=1e-6)
