"""A hub model source at plan time: config.json from one quick request, an unreachable hub is an
error that says so at once, and an offline plan says which checks it could not run.

No test here leaves this machine: the hub is a closed local port or a small local server."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from llmopt import api
from llmopt.cli.main import main

from conftest import run_cli, write_recipe

CONFIG = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
          "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
          "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}
COMMIT = "b" * 40

HUB_RECIPE = """\
schema_version = 1
name = "hub"
[model]
source = "{repo}"
[[compress]]
method = "gptq"
group_size = 128
[[eval]]
name = "prose"
kind = "perplexity"
window = 256
[target]
gpu = "H100"
[serve]
backend = "vllm"
max_model_len = 4096
"""


class FakeHub(BaseHTTPRequestHandler):
    """Answers /<org>/<name>/resolve/<revision>/<file> as the hub does: 404 with the hub's error codes."""

    repos: dict[str, dict[str, bytes]] = {}

    def _answer(self, with_body: bool) -> None:
        parts = self.path.strip("/").split("/")
        repo, name = "/".join(parts[:2]), parts[-1]
        body = self.repos.get(repo, {}).get(name)
        if body is None:
            self.send_response(404)
            self.send_header("X-Error-Code", "RepoNotFound" if repo not in self.repos else "EntryNotFound")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        for key, value in (("X-Repo-Commit", COMMIT), ("ETag", '"e1"'), ("Content-Length", str(len(body)))):
            self.send_header(key, value)
        self.end_headers()
        if with_body:
            self.wfile.write(body)

    def do_HEAD(self):  # noqa: N802
        self._answer(False)

    def do_GET(self):  # noqa: N802
        self._answer(True)

    def log_message(self, *args):
        pass


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    cache = tmp_path / "hub-cache"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def go_online(monkeypatch, endpoint: str) -> None:
    """HF_HUB_OFFLINE off (huggingface_hub read it as on when this process imported it) and the hub at ``endpoint``."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_ENDPOINT", endpoint)


@pytest.fixture
def unreachable(monkeypatch, hub_cache) -> str:
    endpoint = f"http://127.0.0.1:{closed_port()}"
    go_online(monkeypatch, endpoint)
    return endpoint


@pytest.fixture
def fake_hub(monkeypatch, hub_cache):
    FakeHub.repos = {"org/tiny": {"config.json": json.dumps(CONFIG).encode()}, "org/no-config": {"README.md": b"x"}}
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    go_online(monkeypatch, f"http://127.0.0.1:{server.server_port}")
    yield server
    server.shutdown()


def timed_plan(path, *args):
    start = time.perf_counter()
    plan = api.plan(path, *args)
    return plan, time.perf_counter() - start


def test_an_unreachable_hub_is_a_quick_error_that_names_the_offline_option(tmp_path, unreachable):
    path = write_recipe(tmp_path, HUB_RECIPE.format(repo="org/tiny"))
    plan, seconds = timed_plan(path)
    assert seconds < 5, f"{seconds:.1f} s: the probe must not retry (it took 24 s)"
    (problem,) = [p for p in plan.errors if p.where == f"{path}:4: model.source"]
    assert f"cannot reach the Hugging Face hub at {unreachable}" in problem.message
    assert "--offline" in problem.hint and "HF_HUB_OFFLINE=1" in problem.hint
    assert plan.model is None


def test_cli_plan_and_run_exit_2_at_once_when_the_hub_is_unreachable(tmp_path):
    path = write_recipe(tmp_path, HUB_RECIPE.format(repo="org/tiny"))
    env = {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}", "HF_HOME": str(tmp_path / "hf")}
    for command in ("plan", "run"):
        start = time.perf_counter()
        result = run_cli(command, str(path), cwd=tmp_path, env=env, timeout=60)
        seconds = time.perf_counter() - start
        assert result.returncode == 2, result.stderr
        assert seconds < 20, f"{command}: {seconds:.1f} s"
        assert "Retrying" not in result.stderr and "cannot reach the Hugging Face hub" in result.stderr
        assert "--offline" in result.stderr
    assert not (tmp_path / "artifacts").exists()


def test_offline_plan_warns_which_checks_did_not_run(tmp_path, capsys):
    path = write_recipe(tmp_path, HUB_RECIPE.format(repo="org/tiny"))  # HF_HUB_OFFLINE=1 (conftest)
    plan = api.plan(path)
    assert not plan.errors and plan.model is None
    (warning,) = [p for p in plan.problems if p.where == f"{path}:4: model.source"]
    assert warning.message.startswith("model facts unknown: offline")
    assert warning.severity == "warning" and "offline" in warning.message
    for check in ("compress[0] (gptq)", "eval[0] (perplexity)", "serve (vllm)", "estimates"):
        assert check in warning.message
    assert main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert "model facts unknown" in out and "offline" in out and "compress[0] (gptq)" in out
    assert main(["plan", str(path), "--format", "json"]) == 0
    checks = json.loads(capsys.readouterr().out)["checks"]
    assert any(c["severity"] == "warning" and c["message"] == warning.message for c in checks)


def test_the_offline_option_plans_without_the_hub(tmp_path, capsys, unreachable):
    path = write_recipe(tmp_path, HUB_RECIPE.format(repo="org/tiny"))
    start = time.perf_counter()
    assert main(["plan", str(path), "--offline"]) == 0
    assert time.perf_counter() - start < 5
    assert "model facts unknown" in capsys.readouterr().out


def test_offline_plan_reads_config_from_the_local_hub_cache(tmp_path, hub_cache):
    snapshot = hub_cache / "models--org--tiny" / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(CONFIG))
    (hub_cache / "models--org--tiny" / "refs").mkdir()
    (hub_cache / "models--org--tiny" / "refs" / "main").write_text(COMMIT)
    plan = api.plan(write_recipe(tmp_path, HUB_RECIPE.format(repo="org/tiny")))
    assert plan.model is not None and plan.model.hidden_size == 4096
    assert not [p for p in plan.problems if "model facts unknown" in p.message]
    assert plan.estimates["parameters"] > 7e9


def test_online_plan_reads_config_from_the_hub(tmp_path, fake_hub):
    plan, seconds = timed_plan(write_recipe(tmp_path, HUB_RECIPE.format(repo="org/tiny")))
    assert not plan.errors and plan.model.hidden_size == 4096 and seconds < 5
    bad = timed_plan(write_recipe(tmp_path, HUB_RECIPE.format(repo="org/tiny")), ["compress[0].group_size=100"])[0]
    assert any("group_size 100" in p.message for p in bad.errors)


@pytest.mark.parametrize("repo, text", [("org/nope", "org/nope was not found on the Hugging Face hub"),
                                        ("org/no-config", "org/no-config has no config.json")])
def test_a_missing_hub_model_is_an_error(tmp_path, fake_hub, repo, text):
    path = write_recipe(tmp_path, HUB_RECIPE.format(repo=repo))
    (problem,) = [p for p in api.plan(path).errors if p.where.endswith("model.source")]
    assert text in problem.message
