"""llmopt serve --api-key (and LLMOPT_API_KEY): every request without the key is refused with OpenAI's 401,
on every route, method and unknown path, but /health and /metrics; the key is compared in constant time;
and the clients (the endpoint runtime of `llmopt eval --candidate URL`, llmopt bench's, and so the tune
stage's) send the key in LLMOPT_API_KEY."""

from __future__ import annotations

import json
import shutil

import httpx
import pytest

from llmopt import apikey
from llmopt.errors import StageFailed
from llmopt.server import create_app, load_model
from llmopt.server import auth

from test_server import CHATML, MAX_LEN, running

KEY = "sk-llmopt-" + "5f0c" * 8
OPEN = {"/health", "/metrics"}
BODIES = {"/v1/completions": {"model": "tiny", "prompt": "river", "max_tokens": 2},
          "/v1/chat/completions": {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}}
WITHOUT_THE_KEY = [
    {},
    {"Authorization": "Bearer not-the-key"},
    {"Authorization": f"Bearer {KEY}x"},
    {"Authorization": f"Bearer {KEY[:-1]}"},
    {"Authorization": KEY},  # no scheme
    {"Authorization": f"Basic {KEY}"},
    {"Authorization": "Bearer"},  # no token
    {"X-Api-Key": KEY},  # not OpenAI's header
    {"Api-Key": KEY},
]


@pytest.fixture(scope="module")
def served(tiny_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("auth") / "tiny-chat"
    shutil.copytree(tiny_model, folder)
    (folder / "chat_template.jinja").write_text(CHATML)
    return load_model(folder, max_model_len=MAX_LEN, name="tiny")


@pytest.fixture(scope="module")
def url(served):
    with running(served, api_key=KEY) as base:
        yield base


def every_request(served) -> list[tuple[str, str]]:
    """(method, path) of every route of the app, every method a client might try on it, and paths it lacks."""
    app = create_app(served, api_key=KEY)
    paths = {route.path for route in app.routes}
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models", "/docs", "/openapi.json"} <= paths
    methods = ("GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD")
    unknown = ["/", "/v1", "/v1/embeddings", "/nope", "/health/", "/healthz", "/metrics/x", "//health", "/HEALTH"]
    return [(m, p) for p in sorted(paths - OPEN) for m in methods] + [(m, p) for p in unknown for m in ("GET", "POST")]


def test_every_request_without_the_key_is_refused_across_the_whole_api(url, served):
    refused = 0
    with httpx.Client(base_url=url, timeout=30) as client:
        for method, path in every_request(served):  # every way of sending no key or a wrong one to a route,
            variants = WITHOUT_THE_KEY if path == "/v1/completions" else WITHOUT_THE_KEY[:2]  # two to the rest
            for headers in variants:
                response = client.request(method, path, headers=headers, json=BODIES.get(path))
                assert response.status_code == 401, (method, path, headers, response.text)
                assert response.headers["www-authenticate"] == "Bearer"
                if method != "HEAD":
                    error = response.json()["error"]
                    assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error"
                    assert KEY not in response.text and KEY[:-1] not in response.text  # nothing echoes a key
                    assert ("Missing" in error["message"]) == ("Bearer" not in headers.get("Authorization", "")
                                                                or headers["Authorization"] == "Bearer")
                refused += 1
    assert refused > 100
    # nothing was generated nor counted: the requests stopped before any route
    counted = [line for line in httpx.get(url + "/metrics").text.splitlines() if line.startswith("llmopt_requests_total{")]
    assert counted and all(line.endswith(" 0") for line in counted)


def test_health_and_metrics_stay_open_as_vllm_leaves_them(url):
    for headers in WITHOUT_THE_KEY:
        assert httpx.get(url + "/health", headers=headers).json()["status"] == "ok"
        metrics = httpx.get(url + "/metrics", headers=headers)
        assert metrics.status_code == 200 and "llmopt_" in metrics.text


def test_the_key_opens_every_route(url):
    bearer = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=url, timeout=60, headers=bearer) as client:
        assert client.get("/v1/models").json()["data"][0]["id"] == "tiny"
        for path, body in BODIES.items():
            plain = client.post(path, json=body)
            assert plain.status_code == 200 and plain.json()["usage"]["completion_tokens"] <= 2
            with client.stream("POST", path, json=dict(body, stream=True)) as streamed:
                assert streamed.status_code == 200 and "data: [DONE]" in streamed.read().decode()
        assert client.get("/openapi.json").status_code == 200 and client.get("/docs").status_code == 200
        assert client.get("/nope").status_code == 404  # past the key, an unknown path is what it is
        assert client.post("/v1/completions", json={"prompt": "x", "max_tokens": -1}).status_code == 400
    # the scheme is case-insensitive, as in HTTP
    assert httpx.get(url + "/v1/models", headers={"Authorization": f"bearer {KEY}"}).status_code == 200


def test_the_key_is_compared_in_constant_time(url, monkeypatch):
    calls = []

    def compare(a, b):
        calls.append((a, b))
        return real(a, b)

    real = auth.hmac.compare_digest
    monkeypatch.setattr(auth.hmac, "compare_digest", compare)
    assert httpx.get(url + "/v1/models", headers={"Authorization": "Bearer guess"}).status_code == 401
    assert httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert calls == [(b"guess", KEY.encode()), (KEY.encode(), KEY.encode())]


def test_without_a_key_the_server_is_open(served):
    with running(served) as base:
        assert httpx.get(base + "/v1/models").status_code == 200


def test_the_cli_reads_the_key_from_llmopt_api_key_and_refuses_a_bad_one(tiny_model, monkeypatch, capsys):
    from llmopt import server
    from llmopt.cli.main import main

    got = {}
    monkeypatch.setattr(server, "serve", lambda served, sock, *a, **kw: (got.update(kw), sock.close()))
    monkeypatch.setenv(apikey.ENV, KEY)
    assert main(["serve", str(tiny_model), "--port", "0", "--format", "json"]) == 0
    out = capsys.readouterr()
    assert got["api_key"] == KEY and json.loads(out.out)["authentication"] == "bearer"
    assert KEY not in out.out + out.err  # the key is never printed
    monkeypatch.setenv(apikey.ENV, "")  # empty: no key
    assert main(["serve", str(tiny_model), "--port", "0", "--format", "json"]) == 0
    assert got["api_key"] is None and json.loads(capsys.readouterr().out)["authentication"] == "none"
    assert main(["serve", str(tiny_model), "--port", "0", "--host", "0.0.0.0", "--format", "json"]) == 0
    assert "without an API key" in capsys.readouterr().err
    assert main(["serve", str(tiny_model), "--port", "0", "--api-key", KEY, "--format", "json"]) == 0
    assert got["api_key"] == KEY and "visible to every user" in capsys.readouterr().err
    for bad in ("two words", "t\u00e9", "tab\tkey"):
        monkeypatch.setenv(apikey.ENV, bad)
        assert main(["serve", str(tiny_model), "--port", "0"]) == 2
        err = capsys.readouterr().err
        assert "printable ASCII without spaces" in err and "LLMOPT_API_KEY" in err and "openssl rand" in err


# --- the clients send the key they are given ------------------------------------------------------------------

def test_the_endpoint_runtime_sends_the_key_and_says_when_it_is_missing(url, tiny_model, monkeypatch):
    from llmopt.runtimes.endpoint import EndpointRuntime, probe

    monkeypatch.delenv(apikey.ENV, raising=False)
    with pytest.raises(StageFailed, match="wants an API key.*401 \\(no key was sent\\)"):
        EndpointRuntime(tiny_model, url=url)
    problems = probe(url, ["answers", "generation"])
    assert len(problems) == 1 and "wants an API key" in problems[0][0] and apikey.ENV in problems[0][1]
    monkeypatch.setenv(apikey.ENV, "wrong")
    assert "the key in LLMOPT_API_KEY was refused" in probe(url, ["answers"])[0][0]
    monkeypatch.setenv(apikey.ENV, KEY)
    assert probe(url, ["answers", "loglikelihood", "generation", "chat"]) == []
    runtime = EndpointRuntime(tiny_model, url=url)
    assert runtime.model == "tiny" and len(runtime.generate(runtime.encode("river"), 2)) <= 2


def test_llmopt_bench_sends_the_key(url, tmp_path, monkeypatch):
    from llmopt.bench.runner import run_bench

    options = {"requests": 2, "warmup": 0, "split": [], "plots": False, "concurrency": [1], "vocab_size": 256}
    workload = {"input_len": 8, "output_len": 2}
    monkeypatch.delenv(apikey.ENV, raising=False)
    with pytest.raises(StageFailed, match="wants an API key") as refused:
        run_bench(url, workload, None, options, tmp_path / "none")
    assert apikey.ENV in refused.value.fix
    monkeypatch.setenv(apikey.ENV, KEY)
    result = run_bench(url, workload, None, options, tmp_path / "keyed")
    assert result["points"][0]["requests"] == {"sent": 2, "ok": 2, "failed": 0}
    written = "".join(p.read_text() for p in (tmp_path / "keyed").rglob("*") if p.is_file())
    assert KEY not in written  # bench.json, bench.md and requests.jsonl hold no key
