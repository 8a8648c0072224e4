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
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import load_json, run_cli, served_recipe, wait_for, write_recipe
from test_bench_fakeserver import alive

from llmopt import api
from llmopt.bench import engine
from llmopt.catalog.engines import SWEEP_QUEUE
from llmopt.tune import spaces
from llmopt.tune.search import MIN_GAIN, Budget, Search, TrialStore

SIM = Path(__file__).with_name("sim_engine.py")

def tune_recipe(folder: Path, model: Path, backend: str = "vllm", trials: int = 8, repeats: int = 1,
                space: str = "", ttft: float = 60) -> Path:
    return served_recipe(folder, model, backend=backend, ttft_ms=ttft, bench="requests = 6\nwarmup = 1\n",
                         tune=f"enabled = true\nmax_trials = {trials}\nrepeats = {repeats}\n{space}\n")


def put_sim(tmp_path: Path, monkeypatch, engine_name: str = "vllm", best: dict | None = None, **env) -> Path:
    """The simulator as ``vllm`` / ``trtllm-serve`` on PATH, or as the module ``sglang.launch_server`` of the
    ``python3`` on PATH; returns the folder where it records its children."""
    bin_dir, children = tmp_path / "bin", tmp_path / "children"
    bin_dir.mkdir(exist_ok=True)
    if engine_name == "sglang":  # launch.sh runs `python3 -m sglang.launch_server`
        package = tmp_path / "sim-site" / "sglang"
        package.mkdir(parents=True, exist_ok=True)
        (package / "__init__.py").write_text("")
        (package / "launch_server.py").write_text(
            f"import sys\nsys.path.insert(0, {str(SIM.parent)!r})\nfrom sim_engine import main\n"
            "main(['sglang', *sys.argv[1:]])\n")
        (bin_dir / "python3").write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
        (bin_dir / "python3").chmod(0o755)
        monkeypatch.setenv("PYTHONPATH", str(package.parent))
    else:
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
    size, fraction, threads, slots, queue = (spaces.Param("p", "yaml", "f", "p", kind) for kind in
                                             ("size", "fraction", "threads", "slots", "queue"))
    assert spaces.candidates(size, 256, 4) == [256, 512, 1024]
    assert spaces.candidates(fraction, 0.9, 4) == [0.9, 0.93, 0.95]
    assert spaces.candidates(fraction, 0.95, 4) == [0.95]
    assert spaces.candidates(threads, None, 4, cpus=2) == [None, 1, 2]
    # llmopt serve's queue (512, or the workload's concurrency when more); a shorter queue only refuses requests
    assert spaces.candidates(queue, 16, 4) == [16, 512] and spaces.candidates(queue, 512, 4) == [512]
    assert spaces.candidates(queue, 512, 1000) == [512, 1000] and spaces.candidates(queue, 2000, 4) == [2000]
    graph = spaces.Param("p", "yaml", "f", "p", "graph")
    assert spaces.candidates(graph, None, 4) == [None, 1024]  # vLLM's own (at most 512), then larger decode batches
    assert spaces.candidates(graph, 256, 4) == [256, 512]
    assert spaces.candidates(slots, 1, 4, cpus=2) == [1, 2]
    assert spaces.candidates(slots, 1, 1, cpus=2) == [1]  # one request in flight: a second slot would idle


def test_a_sequence_limit_above_the_requests_in_flight_is_not_tried(tmp_path):
    """As on a live vLLM at 256 users of 2,048-token prompts: max-num-seqs 2,048 and 4,096 cannot run more
    than the 256 in flight that 1,024 already runs at once, and their trials (about two minutes each on an
    H200) gained nothing (4,096 measured 24% less, one run). A token budget has no such bound."""
    seqs = spaces.Param("p", "yaml", "f", "p", "seqs")
    assert spaces.candidates(seqs, 1024, 256) == [1024]
    assert spaces.candidates(seqs, 64, 100) == [64, 128]  # the first limit that holds every request, no more
    assert spaces.candidates(seqs, 256, 2000) == [256, 512, 1024]
    folder = tmp_path / "vllm"
    folder.mkdir()
    (folder / "config.yaml").write_text("max-num-seqs: 1024\nmax-num-batched-tokens: 8192\n")
    grid = spaces.grid("vllm", folder, 256)
    assert "max-num-seqs" not in grid and grid["max-num-batched-tokens"] == [8192, 16384, 32768]
    assert spaces.grid("vllm", folder, 1500)["max-num-seqs"] == [1024, 2048]
    # a space the recipe names is searched as given
    assert spaces.grid("vllm", folder, 256, {"max-num-seqs": [1024, 4096]})["max-num-seqs"] == [1024, 4096]
    assert [p.grows for p in spaces.space("trtllm")][0] == [p.grows for p in spaces.space("sglang")][0] == "seqs"


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


def test_a_tuned_flag_reaches_the_container_manifests_too(tmp_path):
    """SGLang's tuned values are command-line flags: launch.sh, docker-compose.yaml and kubernetes.yaml must all
    start the engine with them, or a deployment from the manifests runs the untuned config."""
    import yaml
    from test_deploy_configs import render

    _, folder = render(tmp_path, "sglang")
    spaces.apply(folder, "sglang", {"max-running-requests": 77, "mem-fraction-static": 0.81})
    compose = next(iter(yaml.safe_load((folder / "docker-compose.yaml").read_text())["services"].values()))
    deployment = next(yaml.safe_load_all((folder / "kubernetes.yaml").read_text()))
    k8s_args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    for argv in (compose["command"], k8s_args):
        assert argv[argv.index("--max-running-requests") + 1] == "77"
        assert argv[argv.index("--mem-fraction-static") + 1] == "0.81"
    assert spaces.read(folder, spaces.SPACES["sglang"][0]) == 77


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


def bench_point(score: float) -> dict:
    return {"points": [{"requests": {"failed": 0}, "goodput": {"requests_per_s": score, "fraction": 1.0},
                        "slo_met": {"ttft_p99_ms": True}, "load": {}, "ttft_ms": None, "tpot_ms": None, "itl_ms": None,
                        "e2e_ms": None, "request_throughput": score, "output_throughput": score,
                        "total_token_throughput": score, "errors": {}}], "target": {}}


def test_a_load_no_trial_serves_within_the_slo_is_said_to_be_unranked(tmp_path):
    """As on a live vLLM at concurrency 256 with 2,048-token prompts and TTFT p99 <= 500 ms: every trial's goodput
    is 0, so no candidate can beat the prediction, and the note says why instead of calling it a measured draw."""
    from llmopt.tune import report

    grid = {"a": [1, 2, 4], "b": [10, 20]}
    result = Search(grid, lambda values, out_dir: bench_point(0.0), TrialStore(tmp_path), Budget(8, None, 1),
                    goodput=True).execute()
    assert result["winner"] == result["default"] and result["no_trial_met_slo"] is True
    text = report.note(result | {"tuned": True})
    assert "no trial met the SLO (goodput 0 in all 4)" in text and "Loosen [serve].slo" in text
    scored = Search(grid, lambda values, out_dir: bench_point(3.0), TrialStore(tmp_path / "met"), Budget(8, None, 0),
                    goodput=True).execute()
    assert scored["no_trial_met_slo"] is False and "no candidate beat" in report.note(scored | {"tuned": True})


def test_workers_and_threads_that_share_the_cores_move_together(tmp_path):
    """What two cores give llmopt serve: two workers of one thread win, but two of two lose to one of two and one
    of one loses too, so one parameter at a time stays at the default; moving the threads with the workers
    (cores // workers) finds the winner."""
    grid = {"parallel": [1, 2], "intra_op_num_threads": [None, 1, 2]}  # as on two cores (the queue: not searched)
    speed = {(1, None): 33.0, (1, 2): 33.0, (1, 1): 19.0, (2, None): 27.0, (2, 2): 27.0, (2, 1): 38.0}

    def measure(values, out_dir):
        return bench_point(speed[(values["parallel"], values["intra_op_num_threads"])])

    alone = Search(grid, measure, TrialStore(tmp_path / "alone"), Budget(12, None, 0), goodput=True).execute()
    assert alone["winner"] == alone["default"]
    follow = spaces.follow("ort", grid, cpus=2)
    result = Search(grid, measure, TrialStore(tmp_path / "moved"), Budget(12, None, 0), goodput=True,
                    follow=follow).execute()
    assert (result["winner"]["parallel"], result["winner"]["intra_op_num_threads"]) == (2, 1)
    assert follow("parallel", {"parallel": 4, "intra_op_num_threads": None}) == {"parallel": 4, "intra_op_num_threads": 1}


def test_a_batch_and_worker_processes_exclude_each_other(tmp_path):
    """llmopt serve runs requests at once either batched in one model copy (--max-num-seqs) or in worker processes
    (--parallel), never both (exit 2): a trial that moves one sets the other back to its default, and the threads
    move with the workers. Batch sizes stop at the first that holds the workload's concurrency."""
    batch = next(p for p in spaces.space("ort") if p.name == "max-num-seqs")
    assert spaces.candidates(batch, 0, 4) == [0, 2, 4] and spaces.candidates(batch, 0, 1) == [0]
    assert spaces.candidates(batch, 4, 32) == [4, 0, 2, 8, 16]
    grid = {"parallel": [1, 2], "intra_op_num_threads": [None, 1, 2], "max-num-seqs": [0, 2, 4]}
    follow = spaces.follow("ort", grid, cpus=2)
    workers = {"parallel": 2, "intra_op_num_threads": 1, "max-num-seqs": 0}
    assert follow("max-num-seqs", workers | {"max-num-seqs": 4}) == {"parallel": 1, "intra_op_num_threads": 2,
                                                                     "max-num-seqs": 4}
    assert follow("parallel", {"parallel": 2, "intra_op_num_threads": None, "max-num-seqs": 4}) == workers
    speed = {(1, 0): 30.0, (2, 0): 36.0, (1, 2): 40.0, (1, 4): 45.0}  # as measured at 4 in flight (equal lengths)

    def measure(values, out_dir):
        assert not (values["parallel"] > 1 and values["max-num-seqs"]), values  # llmopt serve would refuse it
        return bench_point(speed[(values["parallel"], values["max-num-seqs"])])

    ways = {"parallel": [1, 2], "max-num-seqs": [0, 2, 4]}
    result = Search(ways, measure, TrialStore(tmp_path / "s"), Budget(12, None, 0), goodput=True,
                    follow=spaces.follow("ort", ways, cpus=2)).execute()
    assert result["winner"] == {"parallel": 1, "max-num-seqs": 4}



# --- the stage against the simulated engine -------------------------------------------------------------------

def test_tune_stage_finds_the_setting_the_simulator_makes_best(tmp_path, tiny_model, monkeypatch, isolated_cache):
    predicted = predicted_vllm(tmp_path, tiny_model)
    assert [s.name for s in predicted.stages] == ["source", "deploy.vllm", "tune"]
    kv = predicted.estimates["kv_cache"]
    # best: twice the predicted token budget (llmopt's candidates: x1, x2, x4); the predicted sequences, since
    # more cannot run more of the 2 requests in flight (max-num-seqs is not searched)
    best = {"max-num-seqs": kv["max_num_seqs"], "max-num-batched-tokens": kv["max_num_batched_tokens"] * 2}
    children = put_sim(tmp_path, monkeypatch, best=best)
    art = tmp_path / "art"
    result = api.run(tune_recipe(tmp_path, tiny_model, space="space = { gpu-memory-utilization = [0.92] }"),
                     output_dir=art)
    tuning = json.loads((art / "reports" / "tune" / "tuning.json").read_text())
    assert tuning["simulated"] is True and tuning["tuned"] is True
    assert tuning["default"]["max-num-batched-tokens"] == kv["max_num_batched_tokens"]
    assert "max-num-seqs" not in tuning["default"]
    assert tuning["winner"]["max-num-batched-tokens"] == best["max-num-batched-tokens"]
    assert tuning["gain"] > 1 + MIN_GAIN
    assert all(t["simulated"] for t in tuning["trials"]) and len(tuning["trials"]) <= 8 + 2
    config = (art / "deploy" / "vllm" / "config.yaml").read_text()
    assert f"max-num-batched-tokens: {best['max-num-batched-tokens']}\n" in config
    assert f"max-num-seqs: {best['max-num-seqs']}\n" in config and "simulated" in config.splitlines()[0]
    assert "simulated" in (art / "deploy" / "vllm" / "launch.sh").read_text().splitlines()[1]
    manifest = json.loads((art / "manifest.json").read_text())
    assert manifest["tune"]["simulated"] is True and manifest["tune"]["winner"] == tuning["winner"]
    assert result.report["tune"]["winner"] == tuning["winner"]
    summary = (art / "reports" / "report.md").read_text()
    assert "## Launch tuning: vllm" in summary and "simulated" in summary
    assert (art / "reports" / "tune" / "tuning.png").is_file()
    assert nothing_left(children, isolated_cache)

    # llmopt tune ARTIFACT: the same search over the artifact's (now tuned) launch config
    out = tmp_path / "tuned"
    res = run_cli("tune", str(art), "--max-trials", "2", "--repeats", "0", "-o", str(out), "--format", "json")
    assert res.returncode == 0, res.stderr
    again = load_json(res.stdout)
    assert again["default"]["max-num-batched-tokens"] == best["max-num-batched-tokens"] and again["simulated"] is True
    assert len([t for t in again["trials"] if t["round"] == "search"]) == 2 and (out / "tuning.json").is_file()
    assert (out / "deploy" / "config.yaml").is_file() and (out / "run.log").is_file()
    assert nothing_left(children, isolated_cache)
    # it is a plan the one runner runs: the same options again are the tune stage's cache entry, no trial started
    res = run_cli("tune", str(art), "--max-trials", "2", "--repeats", "0", "-o", str(tmp_path / "again"), "--format", "json")
    assert res.returncode == 0, res.stderr
    assert load_json(res.stdout)["trials"] == again["trials"] and "tune (cached" in res.stderr
    assert "model (in place" in res.stderr and "deploy (in place" in res.stderr
    # an option the recipe's schema refuses is a recipe error naming the key it overrides
    res = run_cli("tune", str(art), "--slo", "ttft_p99_ms=-5", "-o", str(tmp_path / "bad"))
    assert res.returncode == 2 and "serve.slo.ttft_p99_ms" in res.stderr and not (tmp_path / "bad").exists()


def test_engine_not_installed_keeps_the_prediction(tmp_path, tiny_model, isolated_cache):
    assert not engine.engine_installed("vllm")
    recipe, art = tune_recipe(tmp_path, tiny_model), tmp_path / "art"
    res = run_cli("run", str(recipe), "-o", str(art), "--format", "json")
    assert res.returncode == 0, res.stderr
    assert "cannot start vllm on this machine" in res.stderr and "stays the prediction" in res.stderr
    tuning = json.loads((art / "reports" / "tune" / "tuning.json").read_text())
    assert tuning["tuned"] is False and "not installed" in tuning["reason"] and tuning["trials"] == []
    launch = (art / "deploy" / "vllm" / "launch.sh").read_text()
    assert "# Not tuned by llmopt: vllm is not installed" in launch
    assert "Not tuned: vllm is not installed" in (art / "reports" / "report.md").read_text()


def test_space_naming_an_unknown_parameter_is_a_plan_error(tmp_path, tiny_model):
    res = run_cli("plan", str(tune_recipe(tmp_path, tiny_model, space="space = { max_batch_size = [8] }")))
    assert res.returncode == 2 and "max_batch_size, which vllm is not tuned on" in res.stderr


def test_crashed_and_hung_trials_are_failed_and_stopped(tmp_path, tiny_model, monkeypatch, isolated_cache):
    """A candidate that runs out of memory at start-up, and one that never answers: both recorded as failed,
    their servers stopped, and the search goes on."""
    children = put_sim(tmp_path, monkeypatch, oom_above=0.93, hang=json.dumps({"max-num-batched-tokens": "16384"}))
    recipe = tune_recipe(tmp_path, tiny_model, trials=4, repeats=0,
                         space="space = { max-num-batched-tokens = [8192, 16384], gpu-memory-utilization = [0.92, 0.95] }\n"
                         "startup_timeout_s = 5")
    art = tmp_path / "art"
    api.run(recipe, output_dir=art)
    tuning = json.loads((art / "reports" / "tune" / "tuning.json").read_text())
    verdicts = {json.dumps(t["values"], sort_keys=True): t for t in tuning["trials"]}
    failed = [t for t in verdicts.values() if t["verdict"] == "failed"]
    errors = " ".join(t["error"] for t in failed)
    assert len(failed) == 2 and "did not answer" in errors and "exited with code 1" in errors
    assert all(t["values"] != tuning["winner"] for t in failed)  # a failed trial never wins
    assert nothing_left(children, isolated_cache)


def start_run(recipe: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "llmopt", "run", str(recipe), "-o", str(out), "--format", "json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finished_trials(cache: Path) -> list[Path]:
    return sorted(cache.glob("tune/*/trials/*.json"))



def test_kill_9_then_resume_without_repeating_finished_trials(tmp_path, tiny_model, monkeypatch, isolated_cache):
    children = put_sim(tmp_path, monkeypatch, itl_ms=40)
    recipe = tune_recipe(tmp_path, tiny_model, trials=4, repeats=0, space="space = { gpu-memory-utilization = [0.92] }")
    proc = start_run(recipe, tmp_path / "art")
    wait_for(lambda: len(finished_trials(isolated_cache)) >= 2 and list(engine.pid_dir(isolated_cache).glob("*.json")),
             timeout=120)
    proc.kill()  # SIGKILL to llmopt only; the trial's engine runs in its own process group
    proc.communicate(timeout=30)
    done = {p.stem for p in finished_trials(isolated_cache)}
    left = [json.loads(p.read_text())["pid"] for p in engine.pid_dir(isolated_cache).glob("*.json")]
    assert left and any(alive(pid) for pid in left)  # an engine left behind

    res = run_cli("run", str(recipe), "-o", str(tmp_path / "art"), "--format", "json")
    assert res.returncode == 0, res.stderr
    assert "stopped a server left by an earlier llmopt run" in res.stderr
    assert not any(alive(pid) for pid in left)
    tuning = json.loads((tmp_path / "art" / "reports" / "tune" / "tuning.json").read_text())
    cached = {t["id"] for t in tuning["trials"] if t["cached"]}
    assert done <= cached and len({t["id"] for t in tuning["trials"]}) == len(tuning["trials"])
    assert nothing_left(children, isolated_cache)


def test_ctrl_c_stops_the_engine(tmp_path, tiny_model, monkeypatch, isolated_cache):
    """Ctrl-C during a trial (SIGTERM takes the same path: llmopt.bench.engine.terminate_as_interrupt)."""
    children = put_sim(tmp_path, monkeypatch, itl_ms=40)
    proc = start_run(tune_recipe(tmp_path, tiny_model), tmp_path / "art")
    wait_for(lambda: len(finished_trials(isolated_cache)) >= 1 and list(engine.pid_dir(isolated_cache).glob("*.json")),
             timeout=120)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert nothing_left(children, isolated_cache) and not (tmp_path / "art").exists()


@pytest.mark.slow
def test_ort_artifact_is_tuned_through_llmopt_serve(tmp_path, tiny_model, isolated_cache):
    """The real CPU path: ONNX Runtime's intra-op threads written into genai_config.json and llmopt serve's
    --parallel and --max-queue onto launch.sh's command, each trial served by `llmopt serve`; the figures are
    measured."""
    body = (f'schema_version = 1\nname = "tiny-ort"\n\n[model]\nsource = "{tiny_model}"\n\n'
            '[export]\nformat = "onnx"\nprecision = "fp32"\n\n'
            '[serve]\nbackend = "ort"\nmax_model_len = 256\n'
            'workload = { input_len = 16, output_len = 4, concurrency = 2 }\nslo = { ttft_p99_ms = 60000 }\n\n'
            '[bench]\nrequests = 4\nwarmup = 1\n\n[tune]\nenabled = true\nmax_trials = 5\nrepeats = 0\n'
            'space = { parallel = [1, 2], intra_op_num_threads = [1], max-queue = [4], max-num-seqs = [2] }\n')
    art = tmp_path / "art"
    res = run_cli("run", str(write_recipe(tmp_path, body)), "-o", str(art), "--format", "json")
    assert res.returncode == 0, res.stderr
    tuning = json.loads((art / "reports" / "tune" / "tuning.json").read_text())
    assert tuning["tuned"] and tuning["simulated"] is False and tuning["space"] == {
        "parallel": [1, 2], "intra_op_num_threads": [None, 1], "max-queue": [SWEEP_QUEUE, 4],
        "max-num-seqs": [0, 2]}  # launch.sh's first
    # measured, not simulated: every trial meets the loose SLO. The queue of 4 is above the workload's concurrency
    # of 2, so no trial is refused a request (a queue of 1 may refuse one, 429, when a client's next request
    # arrives before the engine thread has taken the waiting one: a race that made this test fail once)
    assert tuning["trials"][0]["phase"] == "default"
    assert all(t["verdict"] == "meets SLO" and t["figures"] for t in tuning["trials"]), tuning["trials"]
    assert tuning["winner"] == next(t["values"] for t in tuning["trials"] if t["verdict"] == "meets SLO"
                                    and t["values"] == tuning["winner"])
    trial = next(t for t in tuning["trials"] if t["values"]["intra_op_num_threads"] == 1)
    assert trial["figures"]["requests"]["ok"] == 4
    two = next(t for t in tuning["trials"] if t["values"]["parallel"] == 2)  # two requests generated at once
    assert two["figures"]["requests"]["ok"] == 4, two
    batched = next(t for t in tuning["trials"] if t["values"]["max-num-seqs"] == 2)  # two batched in one copy
    assert batched["values"]["parallel"] == 1 and batched["figures"]["requests"]["ok"] == 4, batched
    winner = re.findall(r"--max-num-seqs (\d+)", launch_line := (art / "deploy" / "ort" / "launch.sh").read_text())
    assert (winner[-1] if winner else "0") == str(tuning["winner"]["max-num-seqs"]), launch_line
    launch = (art / "deploy" / "ort" / "launch.sh").read_text()
    assert re.findall(r"--parallel (\d+)", launch.splitlines()[-1])[-1] == str(tuning["winner"]["parallel"])
    config = json.loads((art / "deploy" / "ort" / "genai_config.json").read_text())
    threads = config["model"]["decoder"]["session_options"].get("intra_op_num_threads")
    assert threads == tuning["winner"]["intra_op_num_threads"]
    assert "measured on the live engine" in (art / "deploy" / "ort" / "launch.sh").read_text().splitlines()[1]
    assert not list(engine.pid_dir(isolated_cache).glob("*.json"))


def test_trtllm_search_writes_its_yaml_keys(tmp_path, tiny_model, monkeypatch, isolated_cache):
    """TensorRT-LLM's space: max_batch_size in config.yaml, the KV fraction under kv_cache_config. The recipe
    names the batch sizes, so they are searched although the workload's 2 requests fit the prediction."""
    plan = api.plan(tune_recipe(tmp_path, tiny_model, backend="trtllm"))
    batch = plan.estimates["kv_cache"]["max_num_seqs"]
    children = put_sim(tmp_path, monkeypatch, "trtllm", best={"max_batch_size": batch * 4,
                                                               "free_gpu_memory_fraction": 0.95})
    recipe = tune_recipe(tmp_path, tiny_model, backend="trtllm", trials=5, repeats=0, ttft=5000,  # all within it
                         space=f"space = {{ max_batch_size = [{batch}, {batch * 4}], max_num_tokens = [8192] }}")
    art = tmp_path / "art"
    api.run(recipe, output_dir=art)
    tuning = json.loads((art / "reports" / "tune" / "tuning.json").read_text())
    assert tuning["winner"]["max_batch_size"] == batch * 4 and tuning["winner"]["free_gpu_memory_fraction"] == 0.95
    config = (art / "deploy" / "trtllm" / "config.yaml").read_text()
    assert f"max_batch_size: {batch * 4}\n" in config and "  free_gpu_memory_fraction: 0.95\n" in config
    assert nothing_left(children, isolated_cache)
