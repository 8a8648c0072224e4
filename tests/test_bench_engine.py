"""llmopt bench on an artifact folder: its deploy/<engine>/launch.sh is started and always stopped.

A fake ``vllm`` on PATH runs the test server (tests/test_bench_fakeserver.py) and a child process,
as vLLM runs worker processes; each test checks that the whole process group is gone afterwards,
whether the benchmark ended normally, with an error, with SIGTERM or Ctrl-C, or was killed with
``kill -9`` (then the next run's cleanup stops it, from the pid file).
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

from conftest import load_json, run_cli, wait_for
from test_bench_fakeserver import alive

from llmopt.bench import engine

FAKE = Path(__file__).with_name("test_bench_fakeserver.py")


def make_artifact(root: Path, backend: str = "vllm", launch: str | None = None) -> Path:
    folder = root / "artifact"
    (folder / "model").mkdir(parents=True)
    (folder / "model" / "config.json").write_text(json.dumps({"vocab_size": 1000, "max_position_embeddings": 4096}))
    resolved = {"schema_version": 1, "name": "fake-art", "model": {"source": str(folder / "model")}, "serve": {"backend": backend, "workload": {"input_len": 8, "output_len": 4,
                                                                                "concurrency": 2},
                                              "slo": {"ttft_p99_ms": 500, "tpot_p99_ms": None, "e2e_p99_ms": None}},
                "bench": {"enabled": False, "requests": 6, "warmup": 1, "repeats": 1}}
    (folder / "manifest.json").write_text(json.dumps({"recipe": {"name": "fake-art", "resolved": resolved}}))
    deploy = folder / "deploy" / backend
    deploy.mkdir(parents=True)
    script = deploy / "launch.sh"
    script.write_text(launch or ("#!/usr/bin/env bash\nset -euo pipefail\ncd \"$(dirname \"$0\")/../..\"\n"
                                 "exec vllm serve ./model --host 0.0.0.0 --port 8000 \"$@\"\n"))
    script.chmod(0o755)
    return folder


def put_fake_vllm(tmp_path: Path, monkeypatch, extra: str = "") -> Path:
    """A ``vllm`` on PATH that serves the test server (with ``extra`` arguments) and starts a child; returns the
    child's pid file."""
    bin_dir, child = tmp_path / "bin", tmp_path / "child.pid"
    bin_dir.mkdir()
    (bin_dir / "vllm").write_text(f"#!/bin/sh\nshift\nexec {sys.executable} {FAKE} --owned-by vllm "
                                  f"--child-pid-file {child} {extra} \"$@\"\n")
    (bin_dir / "vllm").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return child


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch) -> Path:
    """A ``vllm`` on PATH that serves the test server and starts a child; returns the child's pid file."""
    return put_fake_vllm(tmp_path, monkeypatch)



def test_launch_sh_started_and_stopped(tmp_path, fake_vllm, isolated_cache):
    art = make_artifact(tmp_path)
    res = run_cli("bench", str(art), "-o", str(tmp_path / "out"), "--format", "json", "--no-plots")
    assert res.returncode == 0, res.stderr
    result = load_json(res.stdout)
    started = result["target"]["started"]
    assert started["engine"] == "vllm" and started["argv"][-4:-1] == ["--host", "127.0.0.1", "--port"]
    assert result["target"]["server"] == "vllm" and result["client"]["sent"]["ignore_eos"] is True
    assert result["workload"] == {"input_len": 8, "output_len": 4, "concurrency": 2}  # from the manifest
    assert result["slo"]["ttft_p99_ms"] == 500 and result["points"][0]["goodput"] is not None
    assert result["points"][0]["requests"]["sent"] == 6 and result["points"][0]["load"]["value"] == 2
    assert not alive(started["pid"]) and not alive(int(fake_vllm.read_text()))
    assert not list(engine.pid_dir(isolated_cache).glob("*.json"))


def test_bench_of_an_artifact_is_its_bench_stage_run_by_the_runner(tmp_path, fake_vllm, isolated_cache):
    """The quoted case of the house's issue: `llmopt bench ARTIFACT` ran stage code outside the runner. It is now
    the bench stage of a plan (the artifact's model and launch config in place), logged, written whole, and
    measured afresh each time."""
    art, out = make_artifact(tmp_path), tmp_path / "out"
    argv = ("bench", str(art), "-o", str(out), "-c", "1,2", "--format", "json", "--no-plots")
    first = run_cli(*argv)
    assert first.returncode == 0, first.stderr
    result = load_json(first.stdout)
    assert [p["load"]["value"] for p in result["points"]] == [1, 2] and result["out_dir"] == str(out)
    assert {"bench.json", "bench.md", "requests.jsonl", "engine.log", "run.log"} <= {p.name for p in out.iterdir()}
    entries = [json.loads(m.read_text()) for m in (isolated_cache / "stages").glob("*/manifest.json")]
    stage = next(m for m in entries if m["kind"] == "bench")
    assert stage["options"]["load"]["concurrency"] == [1, 2] and stage["options"]["requests"] == 6  # [bench]'s
    assert [p["requests"]["ok"] for p in stage["outputs"]["points"]] == [6, 6]
    assert "stage bench: running" in (out / "run.log").read_text()
    again = run_cli(*argv)  # a benchmark is measured again, not taken from the cache
    assert again.returncode == 0, again.stderr
    assert load_json(again.stdout)["target"]["started"]["pid"] != result["target"]["started"]["pid"]
    mine = tmp_path / "mine"  # -o a folder of other files: refused before anything starts, the files kept
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    refused = run_cli("bench", str(art), "-o", str(mine))
    assert refused.returncode == 2 and "holds other files" in refused.stderr
    assert (mine / "notes.txt").read_text() == "keep" and len(list(mine.iterdir())) == 1


def test_engine_not_installed_exits_4(tmp_path, isolated_cache):
    art = make_artifact(tmp_path)
    res = run_cli("bench", str(art), "-o", str(tmp_path / "out"), env={"PATH": "/usr/bin:/bin"})
    assert res.returncode == 4, res.stderr
    assert "starts vllm, which is not installed" in res.stderr and "--engine llmopt" in res.stderr


def test_server_that_dies_at_startup_is_a_stage_failure(tmp_path, isolated_cache):
    art = make_artifact(tmp_path, "ort", "#!/usr/bin/env bash\necho 'cannot load the model' >&2\nexit 3\n")
    res = run_cli("bench", str(art), "-o", str(tmp_path / "out"))
    assert res.returncode == 1
    assert "exited with code 3 before it answered" in res.stderr and "cannot load the model" in res.stderr


def test_startup_timeout_stops_the_server(tmp_path, isolated_cache):
    pid = tmp_path / "server.pid"  # the launch script runs from a copy of deploy/ort/ that bench lays out
    art = make_artifact(tmp_path, "ort", f"#!/usr/bin/env bash\necho $$ > {pid}\nexec sleep 300\n")
    res = run_cli("bench", str(art), "-o", str(tmp_path / "out"), "--startup-timeout", "2")
    assert res.returncode == 1 and "did not answer" in res.stderr
    assert not alive(int(pid.read_text())) and not (tmp_path / "out").exists()  # nothing half-written


def start_bench(art: Path, out: Path) -> subprocess.Popen:
    """A long benchmark, running once the pid file of its server exists."""
    return subprocess.Popen([sys.executable, "-m", "llmopt", "bench", str(art), "-n", "400", "-c", "2", "-o", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_the_server(tmp_path, fake_vllm, isolated_cache, sig):
    art, pids = make_artifact(tmp_path), engine.pid_dir(isolated_cache)
    proc = start_bench(art, tmp_path / "out")
    wait_for(lambda: list(pids.glob("*.json")) and fake_vllm.exists())
    server, child = json.loads(next(pids.glob("*.json")).read_text())["pid"], int(fake_vllm.read_text())
    time.sleep(1.0)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert not alive(server) and not alive(child) and not list(pids.glob("*.json"))


def test_kill_9_leaves_a_pid_file_the_next_run_uses(tmp_path, fake_vllm, isolated_cache):
    art, pids = make_artifact(tmp_path), engine.pid_dir(isolated_cache)
    proc = start_bench(art, tmp_path / "out")
    wait_for(lambda: list(pids.glob("*.json")) and fake_vllm.exists())
    record = next(pids.glob("*.json"))
    server, child = json.loads(record.read_text())["pid"], int(fake_vllm.read_text())
    proc.kill()
    proc.communicate(timeout=30)
    assert alive(server) and alive(child) and record.exists()  # left behind
    fake_vllm.unlink()
    res = run_cli("bench", str(art), "-o", str(tmp_path / "out2"), "--no-plots")
    assert res.returncode == 0, res.stderr
    assert f"stopped a server left by an earlier llmopt run or bench (pid {server}" in res.stderr
    wait_for(lambda: not alive(server) and not alive(child), timeout=10)
    assert not list(pids.glob("*.json"))


def test_another_hosts_server_record_is_left_alone(isolated_cache, monkeypatch):
    """A cache shared by several hosts: a record whose host is not this one names a process that cannot be
    seen from here (its pid may be a different process here), so it is neither stopped nor removed."""
    pids = engine.pid_dir(isolated_cache)
    pids.mkdir(parents=True)
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        record = pids / f"other-host.{sleeper.pid}.json"
        record.write_text(json.dumps({
            "host": "other-host", "pid": sleeper.pid, "pgid": sleeper.pid, "ticks": engine._start_ticks(sleeper.pid),
            "argv": ["sleep"], "owner_pid": 2**22 + 1, "owner_ticks": None}))
        assert engine.stop_leftovers(isolated_cache) == [] and sleeper.poll() is None and record.exists()
        monkeypatch.setattr(engine, "host_tag", lambda: "other-host")  # the same record, seen from its own host
        assert [s["pid"] for s in engine.stop_leftovers(isolated_cache)] == [sleeper.pid] and not record.exists()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_running_bench_keeps_its_server(tmp_path, isolated_cache):
    """stop_leftovers leaves a server alone while the bench that started it is alive."""
    pids = engine.pid_dir(isolated_cache)
    pids.mkdir(parents=True)
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        (pids / f"{sleeper.pid}.json").write_text(json.dumps({
            "pid": sleeper.pid, "pgid": sleeper.pid, "ticks": engine._start_ticks(sleeper.pid), "argv": ["sleep"],
            "owner_pid": os.getpid(), "owner_ticks": engine._start_ticks(os.getpid())}))
        assert engine.stop_leftovers(isolated_cache) == [] and sleeper.poll() is None
        record = json.loads((pids / f"{sleeper.pid}.json").read_text())
        record["owner_pid"] = 2**22 + 1  # an owner that is gone
        (pids / f"{sleeper.pid}.json").write_text(json.dumps(record))
        assert [s["pid"] for s in engine.stop_leftovers(isolated_cache)] == [sleeper.pid]
        assert sleeper.wait(timeout=10) is not None and not list(pids.glob("*.json"))
    finally:
        sleeper.kill()
        sleeper.wait()
