"""The bench stage of ``llmopt run``: planned after the deploy stage when [bench] is enabled, run against the
deploy stage's own launch config, cached, carried by the artifact, and never leaving a server behind.

A fake ``vllm`` on PATH (as in tests/test_bench_engine.py) serves the test server of
tests/test_bench_fakeserver.py, so the vLLM launch.sh that the deploy stage writes starts in a second.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import load_json, run_cli, served_recipe, wait_for, write_recipe
from test_bench_engine import put_fake_vllm

from llmopt import api
from llmopt.bench import engine

BENCH = "enabled = true\nrequests = {requests}\nwarmup = 1\nrepeats = 1\n"  # the [bench] keys of these tests


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch) -> Path:
    return put_fake_vllm(tmp_path, monkeypatch)


@pytest.fixture(autouse=True)
def no_server_left(isolated_cache):
    """A test that fails half-way must not leave its server running: stop what the cache's pid files name."""
    yield
    engine.stop_leftovers(isolated_cache)


def bench_recipe(folder: Path, model: Path, requests: int = 4, serve: bool = True) -> Path:
    return served_recipe(folder, model, bench=BENCH.format(requests=requests), serve=serve)


def test_a_missing_bench_client_is_exit_4_before_any_stage_runs(tmp_path, tiny_model, fake_vllm, monkeypatch,
                                                                isolated_cache):
    """The bench stage comes last: without aiohttp the run must stop before the work ahead of it, not after."""
    from llmopt.run import runner
    from llmopt.errors import MissingExtra

    monkeypatch.setattr(runner, "package_version", lambda dist: None if dist == "aiohttp" else "1.0")
    with pytest.raises(MissingExtra) as err:
        api.run(bench_recipe(tmp_path, tiny_model), output_dir=tmp_path / "art")
    assert err.value.exit_code == 4 and err.value.fix == "pip install 'llmopt[bench]'"
    assert err.value.what == "stage bench needs the Python package 'aiohttp', which is not installed"
    assert not list((isolated_cache / "stages").glob("*")) if (isolated_cache / "stages").exists() else True
    assert not fake_vllm.exists() and not (tmp_path / "art").exists()


def server_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_bench_is_planned_after_deploy_and_keyed_on_it(tmp_path, tiny_model, fake_vllm):
    plan = api.plan(bench_recipe(tmp_path, tiny_model))
    assert not plan.errors, plan.errors
    assert [s.name for s in plan.stages] == ["source", "deploy.vllm", "bench"]
    bench = plan.stage("bench")
    assert bench.kind == "bench" and bench.backend == "vllm"
    assert bench.inputs == {"model": "source", "deploy": "deploy.vllm"}
    assert bench.material["inputs"]["deploy"] == plan.stage("deploy.vllm").key
    assert bench.options.workload.input_len == 16 and bench.options.requests == 4
    assert api.plan(bench_recipe(tmp_path, tiny_model, requests=5)).stage("bench").key != bench.key
    other_deploy = api.plan(bench_recipe(tmp_path, tiny_model), overrides=["serve.max_model_len=128"])
    assert other_deploy.stage("bench").key != bench.key


def test_bench_disabled_plans_no_stage(tmp_path, tiny_model):
    plan = api.plan(bench_recipe(tmp_path, tiny_model), overrides=["bench.enabled=false"])
    assert "bench" not in [s.name for s in plan.stages]


def test_bench_without_serve_is_a_plan_error(tmp_path, tiny_model):
    res = run_cli("run", str(bench_recipe(tmp_path, tiny_model, serve=False)), "-o", str(tmp_path / "art"))
    assert res.returncode == 2, res.stderr
    assert "bench.enabled" in res.stderr and "no [serve] section" in res.stderr
    assert "enabled = false" in res.stderr and not (tmp_path / "art").exists()


def test_engine_not_installed_is_a_plan_error(tmp_path, tiny_model):
    assert not engine.engine_installed("vllm")  # this machine has no vllm (the fake is not on PATH here)
    res = run_cli("run", str(bench_recipe(tmp_path, tiny_model)), "-o", str(tmp_path / "art"))
    assert res.returncode == 2, res.stderr
    assert "vllm is not installed on this machine" in res.stderr
    assert "install vllm (vllm==" in res.stderr and "[bench] enabled = false" in res.stderr


def test_run_benches_the_artifact_and_caches_it(tmp_path, tiny_model, fake_vllm, isolated_cache):
    recipe, art = bench_recipe(tmp_path, tiny_model), tmp_path / "art"
    res = run_cli("run", str(recipe), "-o", str(art), "--format", "json")
    assert res.returncode == 0, res.stderr
    stages = {s["name"]: s for s in load_json(res.stdout)["stages"]}
    assert stages["bench"]["status"] == "ran"
    stage_dir = isolated_cache / "stages" / stages["bench"]["key"]
    for name in ("bench.json", "bench.md", "requests.jsonl", "engine.log", "latency.png", "throughput.png"):
        assert (stage_dir / name).is_file(), name
    assert not (stage_dir / "target").exists()
    result = json.loads((stage_dir / "bench.json").read_text())
    assert result["target"]["started"]["engine"] == "vllm" and result["options"]["requests"] == 4
    assert result["out_dir"] == "."  # not the temporary folder the stage ran in
    assert server_gone(result["target"]["started"]["pid"]) and server_gone(int(fake_vllm.read_text()))
    assert not list(engine.pid_dir(isolated_cache).glob("*.json"))

    manifest = json.loads((art / "manifest.json").read_text())
    bench = manifest["bench"]
    assert bench["engine"] == "vllm" and bench["workload"] == {"input_len": 16, "output_len": 4, "concurrency": 2}
    point = bench["points"][0]
    assert point["load"] == {"kind": "concurrency", "value": 2.0} and point["requests"] == {"sent": 4, "ok": 4, "failed": 0}
    assert 0 < point["ttft_ms"]["p50"] <= point["ttft_ms"]["p99"] and point["tpot_ms"]["p99"] > 0
    assert point["itl_ms"]["p99"] > 0 and point["output_throughput"] > 0 and point["errors"] == {}
    assert point["goodput"]["fraction"] == 1.0  # every request within a 60 s TTFT
    for name in bench["files"]["plots"] + [bench["files"]["json"], bench["files"]["markdown"]]:
        assert (art / "reports" / name).is_file() and f"reports/{name}" in manifest["files"]
    report = json.loads((art / "reports" / "report.json").read_text())
    assert report["bench"]["points"] == bench["points"]
    summary = (art / "reports" / "report.md").read_text()
    assert "## Serving benchmark: vllm" in summary and "| c=2 | 4 / 4 |" in summary
    assert "## Serving benchmark" in (art / "README.md").read_text()

    again = run_cli("run", str(recipe), "-o", str(art), "--format", "json")
    assert again.returncode == 0, again.stderr
    assert {s["name"]: s["status"] for s in load_json(again.stdout)["stages"]}["bench"] == "cached"
    assert json.loads((art / "manifest.json").read_text())["bench"]["points"] == bench["points"]


def test_failed_bench_is_a_stage_failure_and_stops_the_server(tmp_path, tiny_model, monkeypatch, isolated_cache):
    child = put_fake_vllm(tmp_path, monkeypatch, "--max-inflight 0")  # every request answered 429
    res = run_cli("run", str(bench_recipe(tmp_path, tiny_model)), "-o", str(tmp_path / "art"), "--format", "json")
    assert res.returncode == 1, res.stderr
    assert "no request succeeded" in res.stderr and "429" in res.stderr
    assert server_gone(int(child.read_text())) and not list(engine.pid_dir(isolated_cache).glob("*.json"))
    assert not (tmp_path / "art").exists() and not list((isolated_cache / "tmp").glob("*"))


def start_run(recipe: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "llmopt", "run", str(recipe), "-o", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def running_server(pids: Path, child: Path) -> tuple[Path, int, int]:
    wait_for(lambda: list(pids.glob("*.json")) and child.exists() and child.read_text().strip(), timeout=120)
    record = next(pids.glob("*.json"))
    return record, json.loads(record.read_text())["pid"], int(child.read_text())


def test_kill_9_during_bench_leaves_no_server_after_the_next_run(tmp_path, tiny_model, fake_vllm, isolated_cache):
    recipe, pids = bench_recipe(tmp_path, tiny_model, requests=2000), engine.pid_dir(isolated_cache)
    proc = start_run(recipe, tmp_path / "art")
    record, server, child = running_server(pids, fake_vllm)
    time.sleep(1.0)
    proc.kill()  # SIGKILL to llmopt only; the server runs in its own process group
    proc.communicate(timeout=30)
    assert not server_gone(server) and not server_gone(child) and record.exists()  # left behind
    planned = load_json(run_cli("plan", str(recipe), "--format", "json").stdout)
    assert not next(s for s in planned["stages"] if s["name"] == "bench")["cached"]  # a killed bench re-runs

    fake_vllm.unlink()
    res = run_cli("run", str(recipe), "-o", str(tmp_path / "art"), "-s", "bench.enabled=false")  # no bench stage:
    assert res.returncode == 0, res.stderr  # the runner's start-up stops the server
    assert f"stopped a server left by an earlier llmopt run or bench (pid {server}" in res.stderr
    assert server_gone(server) and server_gone(child)
    assert not list(pids.glob("*.json"))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_bench_stops_the_server(tmp_path, tiny_model, fake_vllm, isolated_cache, sig):
    recipe, pids = bench_recipe(tmp_path, tiny_model, requests=2000), engine.pid_dir(isolated_cache)
    proc = start_run(recipe, tmp_path / "art")
    _, server, child = running_server(pids, fake_vllm)
    time.sleep(1.0)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert server_gone(server) and server_gone(child) and not list(pids.glob("*.json"))
    assert not (tmp_path / "art").exists()


@pytest.mark.slow
def test_ort_artifact_is_benched_through_llmopt_serve(tmp_path, tiny_model, isolated_cache):
    """The real path of a CPU artifact: the ONNX export served by `llmopt serve` from deploy/ort/launch.sh."""
    body = (f'schema_version = 1\nname = "tiny-ort"\n\n[model]\nsource = "{tiny_model}"\n\n'
            '[export]\nformat = "onnx"\nprecision = "fp32"\nintra_op_threads = 1\n\n'
            '[serve]\nbackend = "ort"\nmax_model_len = 256\nworkload = { input_len = 16, output_len = 4, concurrency = 1 }\n\n'
            '[bench]\nenabled = true\nrequests = 4\nwarmup = 1\nrepeats = 1\nsplit = [64]\n')
    art = tmp_path / "art"
    res = run_cli("run", str(write_recipe(tmp_path, body)), "-o", str(art), "--format", "json")
    assert res.returncode == 0, res.stderr
    bench = json.loads((art / "manifest.json").read_text())["bench"]
    assert bench["engine"] == "ort" and bench["points"][0]["requests"]["ok"] == 4
    # [bench] split = [64]: the prefill / decode split in the manifest and report.md
    assert [row["input_len"] for row in bench["split"]["lengths"]] == [64]
    assert bench["split"]["lengths"][0]["prefill_tokens_per_s"] > 0
    assert "| 64 | 3 / 3 |" in (art / "reports" / "report.md").read_text()
    result = json.loads((art / "reports" / "bench" / "bench.json").read_text())
    assert result["target"]["server"] == "llmopt" and "launch.sh" in " ".join(result["target"]["started"]["argv"])
    assert server_gone(result["target"]["started"]["pid"]) and not list(engine.pid_dir(isolated_cache).glob("*.json"))
