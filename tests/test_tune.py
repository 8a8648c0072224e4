"""The tune stage and ``llmopt tune`` against simulated engines (tests/sim_engine.py).

A ``vllm`` (or ``trtllm-serve``) on PATH runs the simulator, which takes the engine's real flag set and
answers with latencies that depend on the tuned flags, best at ``LLMOPT_SIM_BEST``. The tests check that
the search finds that setting, that the artifact carries the winner and labels it simulated, that every
started engine process is stopped whatever ends the search, and that a killed search resumes without
repeating finished trials. No test asserts a timing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import load_json, run_cli, write_recipe
from test_bench_fakeserver import alive

from llmopt import api
from llmopt.bench import engine
from llmopt.tune import spaces
from llmopt.tune.search import MIN_GAIN, Budget, Search, TrialStore

SIM = Path(__file__).with_name("sim_engine.py")

RECIPE = """schema_version = 1
name = "tiny"

[model]
source = "{model}"

[target]
gpu = "H100-SXM-80GB"

[serve]
backend = "{backend}"
max_model_len = 256
workload = {{ input_len = 16, output_len = 4, concurrency = 2 }}
slo = {{ ttft_p99_ms = {ttft} }}

[bench]
requests = 6
warmup = 1

[tune]
enabled = true
max_trials = {trials}
repeats = {repeats}
{space}
"""


def tune_recipe(folder: Path, model: Path, backend: str = "vllm", trials: int = 8, repeats: int = 1,
                space: str = "", ttft: float = 60) -> Path:
    return write_recipe(folder, RECIPE.format(model=model, backend=backend, trials=trials, repeats=repeats,
                                              space=space, ttft=ttft))


def put_sim(tmp_path: Path, monkeypatch, engine_name: str = "vllm", best: dict | None = None, **env) -> Path:
    """The simulator as ``vllm`` / ``trtllm-serve`` on PATH; returns the folder where it records its children."""
    bin_dir, children = tmp_path / "bin", tmp_path / "children"
    bin_dir.mkdir(exist_ok=True)
    command = {"vllm": "vllm", "trtllm": "trtllm-serve"}[engine_name]
    (bin_dir / command).write_text(f"#!/bin/sh\nexec {sys.executable} {SIM} {engine_name} \"$@\"\n")
    (bin_dir / command).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("LLMOPT_SIM_CHILDREN", str(children))
    monkeypatch.setenv("LLMOPT_SIM_BEST", json.dumps(best or {}))
    for key, value in env.items():
        monkeypatch.setenv(f"LLMOPT_SIM_{key.upper()}", str(value))
    return children


def nothing_left(children: Path, cache: Path) -> bool:
    """Every simulated engine's worker is gone, and no pid file is left."""
    workers = [int(p.name) for p in children.glob("*")] if children.is_dir() else []
    return not any(alive(pid) for pid in workers) and not list(engine.pid_dir(cache).glob("*.json"))


@pytest.fixture(autouse=True)
def no_server_left(isolated_cache):
    yield
    engine.stop_leftovers(isolated_cache)


def predicted_vllm(tmp_path: Path, tiny_model: Path) -> dict:
    plan = api.plan(tune_recipe(tmp_path, tiny_model))
    assert not plan.errors, plan.errors
    return plan


# --- units ----------------------------------------------------------------------------------------------------

def test_candidates_never_start_below_the_prediction():
    size, fraction, threads, queue = (spaces.Param("p", "yaml", "f", "p", kind) for kind in
                                      ("size", "fraction", "threads", "queue"))
    assert spaces.candidates(size, 256, 4) == [256, 512, 1024]
    assert spaces.candidates(fraction, 0.9, 4) == [0.9, 0.93, 0.95]
    assert spaces.candidates(fraction, 0.95, 4) == [0.95]
    assert spaces.candidates(threads, None, 4, cpus=2) == [None, 1, 2]
    assert spaces.candidates(queue, 16, 4) == [16, 3]


def test_apply_keeps_comments_and_appends_flags(tmp_path):
    folder = tmp_path / "deploy"
    folder.mkdir()
    (folder / "config.yaml").write_text("# header\n# why 256\nmax-num-seqs: 256\ngpu-memory-utilization: 0.9\n")
    (folder / "launch.sh").write_text('#!/usr/bin/env bash\nexec vllm serve ./model --port 8000 "$@"\n')
    spaces.apply(folder, "vllm", {"max-num-seqs": 512}, "Tuned by llmopt")
    text = (folder / "config.yaml").read_text()
    assert "# why 256\nmax-num-seqs: 512\n" in text and text.startswith("# Tuned by llmopt\n")
    assert spaces.read(folder, spaces.SPACES["vllm"][0]) == 512
    sg = tmp_path / "sg"
    sg.mkdir()
    (sg / "launch.sh").write_text('#!/usr/bin/env bash\nexec python3 -m sglang.launch_server --max-running-requests '
                                  '64 --port 1 "$@"\n')
    spaces.apply(sg, "sglang", {"max-running-requests": 128})
    assert spaces.read(sg, spaces.SPACES["sglang"][0]) == 128
    assert (sg / "launch.sh").read_text().rstrip().endswith('--max-running-requests 128 "$@"')


def test_search_finds_a_separable_optimum_within_budget(tmp_path):
    """Coordinate descent on a made-up objective: the best of every parameter, in fewer trials than the grid."""
    grid = {"a": [1, 2, 4], "b": [10, 20, 40], "c": [0.9, 0.95]}
    best = {"a": 4, "b": 20, "c": 0.95}

    def measure(values, out_dir):
        score = 10.0 / (1 + sum(v != best[k] for k, v in values.items()))
        point = {"requests": {"failed": 0}, "goodput": {"requests_per_s": score, "fraction": 1.0}, "slo_met": {"ttft_p99_ms": True},
                 "load": {}, "ttft_ms": None, "tpot_ms": None, "itl_ms": None, "e2e_ms": None,
                 "request_throughput": score, "output_throughput": score, "total_token_throughput": score,
                 "errors": {}}
        return {"points": [point], "target": {}}

    result = Search(grid, measure, TrialStore(tmp_path), Budget(12, None, 1), goodput=True).execute()
    assert result["winner"] == best and result["gain"] == pytest.approx(4.0)
    searched = [t for t in result["trials"] if t["round"] == "search"]
    assert len(searched) < 3 * 3 * 2 and len({json.dumps(t["values"]) for t in searched}) == len(searched)


# --- the stage against the simulated engine -------------------------------------------------------------------

def test_tune_stage_finds_the_setting_the_simulator_makes_best(tmp_path, tiny_model, monkeypatch, isolated_cache):
    plan = predicted_vllm(tmp_path, tiny_model)
    assert [s.name for s in plan.stages] == ["source", "deploy.vllm", "tune"]
    children = put_sim(tmp_path, monkeypatch)  # to read the prediction, then the real best
    recipe = tune_recipe(tmp_path, tiny_model)
    art = tmp_path / "art"
    result = api.run(recipe, output_dir=art)
    default = json.loads((art / "reports" / "tune" / "tuning.json").read_text())["default"]
    assert nothing_left(children, isolated_cache)
    # the simulator's best: twice the predicted sequences and the predicted token budget
    best = {"max-num-seqs": default["max-num-seqs"] * 2, "max-num-batched-tokens": default["max-num-batched-tokens"]}
    put_sim(tmp_path, monkeypatch, best=best)
    result = api.run(tune_recipe(tmp_path, tiny_model, space="space = { gpu-memory-utilization = [0.92] }"),
                     output_dir=art)
    tuning = json.loads((art / "reports" / "tune" / "tuning.json").read_text())
    assert tuning["simulated"] is True and tuning["tuned"] is True
    assert {k: tuning["winner"][k] for k in best} == best and tuning["gain"] > 1 + MIN_GAIN
    config = (art / "deploy" / "vllm" / "config.yaml").read_text()
    assert f"max-num-seqs: {best['max-num-seqs']}\n" in config and "simulated" in config.splitlines()[0]
    assert "SIMULATED" not in json.dumps(result.report.get("bench") or {})
    manifest = json.loads((art / "manifest.json").read_text())
    assert manifest["tune"]["simulated"] is True and manifest["tune"]["winner"] == tuning["winner"]
    assert "Launch tuning: vllm" in (art / "reports" / "report.md").read_text()
    assert "simulated" in (art / "reports" / "report.md").read_text()
    assert (art / "reports" / "tune" / "tuning.png").is_file()
    assert nothing_left(tmp_path / "children", isolated_cache)
