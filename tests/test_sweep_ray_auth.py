"""`llmopt sweep --executor ray --address HOST:PORT` to a real `ray start --head` with token authentication, which
Ray turns on by itself when the head's machine has ~/.ray/auth_token. Without `RAY_AUTH_MODE=token` the client got
'InvalidAuthToken' once a second and a bare ConnectionError; now it joins with the token at hand, or fails at once
(exit 2) saying what to set."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from llmopt import api
from llmopt.sweep import report as reporting

from conftest import make_tiny_llama, tiny_recipe, write_recipe

pytest.importorskip("ray")
pytestmark = pytest.mark.slow  # starts a Ray head: about 40 s on two cores

# Ray replaces 127.0.0.1 with this machine's address unless clusters are off; with them off, the head keeps
# 127.0.0.1 and its servers listen there only. The client needs it too, to look for the head where it is.
LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
RAY_VARIABLES = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_env(home: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in RAY_VARIABLES}
    return dict(env, HOME=str(home), OMP_NUM_THREADS="1", **LOOPBACK, **extra)


def stop_head(proc: subprocess.Popen, root: Path) -> None:
    """Kill the head's process group, then any process of its session left elsewhere (their command lines name
    its temporary folder, which is this test's own)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            line = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if str(root).encode() in line:
            os.kill(int(pid), signal.SIGKILL)


@pytest.fixture(scope="module")
def token_head():
    """A Ray head on 127.0.0.1 whose HOME has a token: Ray turns token authentication on for it."""
    root = Path(tempfile.mkdtemp(prefix="llmopt-ray-", dir="/tmp"))  # short: Ray's socket paths live under it
    home = root / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text(secrets.token_hex(32))
    port = free_port()
    log = (root / "head.log").open("w")
    ray = Path(sys.executable).with_name("ray")
    proc = subprocess.Popen(
        [str(ray), "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={port}",
         f"--dashboard-agent-listen-port={free_port()}", "--include-dashboard=false", "--disable-usage-stats",
         "--num-cpus=1", "--object-store-memory=100000000", f"--temp-dir={root / 'ray'}"],
        env=ray_env(home), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while "Ray runtime started" not in (root / "head.log").read_text():
            assert proc.poll() is None and time.monotonic() < deadline, (root / "head.log").read_text()[-3000:]
            time.sleep(0.2)
        assert "Token authentication is enabled" in (root / "head.log").read_text()
        yield {"address": f"127.0.0.1:{port}", "home": home, "root": root}
    finally:
        stop_head(proc, root)
        log.close()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def recipe(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("ray-auth")
    model = make_tiny_llama(folder / "tiny-llama")
    body = tiny_recipe(model).replace("max_increase_pct = 5", "max_increase_pct = 50")
    return write_recipe(folder, body + '\n[sweep]\nobjective = "smallest"\n\n[sweep.axes]\n"eval[0].max_windows" = [2, 3]\n')


def sweep_on(head: dict, recipe: Path, out: Path, home: Path, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    # the whole environment given, not merged into this process's (as run_cli does): a Ray variable another test
    # left in it (RAY_AUTH_MODE=token) would reach the client
    done = subprocess.run([sys.executable, "-m", "llmopt", "sweep", str(recipe), "-o", str(out), "--executor", "ray",
                           "--address", head["address"]], env=ray_env(home, **env), capture_output=True, text=True,
                          timeout=240)
    return done, time.monotonic() - started


def test_without_a_token_the_sweep_fails_at_once_naming_ray_auth_mode(token_head, recipe, tmp_path):
    home = tmp_path / "home"  # this client's HOME has no ~/.ray/auth_token
    home.mkdir()
    done, seconds = sweep_on(token_head, recipe, tmp_path / "sw", home)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "has token authentication and this client sends no token" in done.stderr
    assert "RAY_AUTH_MODE=token" in done.stderr and "RAY_AUTH_TOKEN" in done.stderr
    assert str(home / ".ray" / "auth_token") in done.stderr  # where to put the head's token
    assert done.stderr.count("InvalidAuthToken") <= 1  # one question to the head, not one a second
    assert "ConnectionError" not in done.stderr and seconds < 30


def test_a_wrong_token_is_refused_at_once(token_head, recipe, tmp_path):
    done, seconds = sweep_on(token_head, recipe, tmp_path / "sw", token_head["home"], RAY_AUTH_TOKEN="0" * 64)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "refuses the token in the RAY_AUTH_TOKEN variable" in done.stderr
    assert "ConnectionError" not in done.stderr and seconds < 30


def test_with_the_head_s_token_the_sweep_joins_and_matches_the_local_table(token_head, recipe, tmp_path):
    done, _ = sweep_on(token_head, recipe, tmp_path / "sw", token_head["home"])  # ~/.ray/auth_token, no RAY_AUTH_MODE
    assert done.returncode == 0, done.stderr[-3000:]
    on_ray = json.loads((tmp_path / "sw" / "report.json").read_text())
    assert on_ray["executor"] == {"kind": "ray", "jobs": 1, "address": token_head["address"]}
    local = api.sweep(recipe, cache_dir=tmp_path / "local-cache", output_dir=tmp_path / "local").report
    assert reporting.table(on_ray, timing=False) == reporting.table(local, timing=False)
    assert on_ray["chosen"]["id"] == local["chosen"]["id"]
