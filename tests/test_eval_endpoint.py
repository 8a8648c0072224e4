"""The endpoint runtime against a small OpenAI-compatible server started here, on 127.0.0.1 only."""

from __future__ import annotations

import json
import shutil
import socket
import struct
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from llmopt.run import evaluate
from llmopt.errors import StageFailed
from llmopt.runtimes.endpoint import EndpointRuntime, base_url
from llmopt.runtimes.hf import TransformersRuntime

from conftest import write_recipe


def prompt_logprobs(runtime: TransformersRuntime, ids: list[int]) -> tuple[list, list]:
    """Log-probability of each token given the ones before it (None for the first), and the top one."""
    import torch

    with torch.inference_mode():
        logits = runtime.model(input_ids=torch.tensor([ids])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    token_lp = [None] + [float(logprobs[t - 1, ids[t]]) for t in range(1, len(ids))]
    top = [None] + [{runtime.tokenizer.convert_ids_to_tokens(int(logprobs[t - 1].argmax())): float(logprobs[t - 1].max())}
                    for t in range(1, len(ids))]
    return token_lp, top


def make_app(model_dir: Path, refuse_zero_tokens: bool = False, echo_logprobs: bool = True):
    """A minimal OpenAI-compatible server over the transformers runtime."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    runtime = TransformersRuntime(model_dir)
    app = FastAPI()
    app.state.requests = []

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": "tiny", "object": "model"}]}

    def choice(index: int, prompt, body: dict) -> dict:
        ids = prompt if isinstance(prompt, list) else runtime.encode(prompt)
        max_tokens = body.get("max_tokens", 16)
        new = runtime.generate(ids, max_tokens) if max_tokens else []
        logprobs = None
        if body.get("logprobs") is not None:
            lp, top = prompt_logprobs(runtime, ids + new)
            if not (body.get("echo") and echo_logprobs):  # only the generated tokens
                lp, top = lp[len(ids):], top[len(ids):]
            logprobs = {"token_logprobs": lp, "top_logprobs": top, "tokens": [], "text_offset": []}
        text = (runtime.decode(ids) if body.get("echo") else "") + runtime.decode(new)
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": "length"}

    @app.post("/v1/completions")
    def completions(body: dict):
        app.state.requests.append(body)
        if body.get("max_tokens") == 0 and refuse_zero_tokens:
            return JSONResponse({"error": {"message": "max_tokens must be at least 1"}}, status_code=400)
        prompt = body["prompt"]
        prompts = prompt if isinstance(prompt, list) and prompt and isinstance(prompt[0], list) else [prompt]
        return {"object": "text_completion", "model": "tiny", "choices": [choice(i, p, body) for i, p in enumerate(prompts)]}

    @app.post("/v1/chat/completions")
    def chat(body: dict):
        app.state.requests.append(body)
        text = "".join(f"{m['role']}: {m['content']}\n" for m in body["messages"]) + "assistant:"
        reply = runtime.decode(runtime.generate(runtime.encode(text), body.get("max_tokens", 16)))
        return {"object": "chat.completion", "model": "tiny",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "length"}]}

    return app, runtime


class Server:
    """uvicorn in a thread, listening on a free loopback port."""

    def __init__(self, app):
        import uvicorn

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the test server did not start"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


@pytest.fixture(scope="module")
def served(tiny_model):
    app, runtime = make_app(tiny_model)
    with Server(app) as server:
        yield server, runtime, app


def test_base_url_forms():
    assert base_url("http://h:1") == base_url("http://h:1/v1/") == base_url("http://h:1/v1/completions") == "http://h:1/v1"


def test_endpoint_scores_and_generates_like_the_in_process_runtime(served, tiny_model):
    server, local, _ = served
    remote = EndpointRuntime(tiny_model, url=server.url)
    assert remote.model == "tiny"
    sequences = [local.encode("The river ran past the old mill."), local.encode("A short one.")]
    scored = [5, len(sequences[1]) - 1]
    assert remote.nll(sequences, scored) == pytest.approx(local.nll(sequences, scored), rel=1e-4)
    prompt = local.encode("Once upon a time")
    assert remote.decode(remote.generate(prompt, 6)) == local.decode(local.generate(prompt, 6))
    assert isinstance(remote.chat("Hello", 4), str)


def test_a_server_refusing_max_tokens_zero_gets_one_token_and_it_is_dropped(tiny_model):
    app, local = make_app(tiny_model, refuse_zero_tokens=True)
    with Server(app) as server:
        remote = EndpointRuntime(tiny_model, url=server.url)
        seq = local.encode("Words and more words.")
        assert remote.nll([seq], [4]) == pytest.approx(local.nll([seq], [4]), rel=1e-4)
        assert [r.get("max_tokens") for r in app.state.requests] == [0, 1]


def test_a_server_without_prompt_logprobs_fails_clearly(tiny_model):
    app, local = make_app(tiny_model, echo_logprobs=False)
    with Server(app) as server:
        remote = EndpointRuntime(tiny_model, url=server.url)
        with pytest.raises(StageFailed, match="does not echo prompt log-probabilities"):
            remote.nll([local.encode("Some words here.")], [3])


def test_an_unreachable_endpoint_fails_clearly(tiny_model):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    with pytest.raises(StageFailed, match="could not list the models"):
        EndpointRuntime(tiny_model, url=f"http://127.0.0.1:{port}/v1")


def test_gate_a_served_candidate_against_the_in_process_baseline(served, tiny_model, tmp_path):
    server, _, app = served
    body = f"""schema_version = 1
name = "served"

[model]
source = "{tiny_model}"

[[eval]]
name = "prose"
kind = "perplexity"
window = 64
max_windows = 3
max_increase_pct = 1

[[eval]]
name = "mc"
kind = "multiple_choice"
limit = 12
max_drop = 0.3

[[eval]]
name = "qa"
kind = "generation"
limit = 3
max_new_tokens = 3
max_drop = 0.8
"""
    recipe = write_recipe(tmp_path, body)
    before = len(app.state.requests)
    result = evaluate.evaluate(recipe, candidate=server.url, output=tmp_path / "reports")
    assert len(app.state.requests) > before
    runtimes = {name: e["runtime"] for name, e in result.evals.items()}
    assert runtimes["eval.prose.baseline"] == "transformers" and runtimes["eval.prose.candidate"] == "endpoint"
    prose = next(g for g in result.gates if g["name"] == "prose")
    assert abs(prose["delta"]) < 1e-4 and prose["verdict"] == "pass"  # same weights, served
    mc = next(g for g in result.gates if g["name"] == "mc")
    assert mc["discordant"] == {"candidate_better": 0, "candidate_worse": 0}
    again = evaluate.evaluate(recipe, candidate=server.url, output=tmp_path / "reports")
    status = {r.name: r.status for r in again.records}
    assert status["eval.mc.baseline"] == "cached" and status["eval.mc.candidate"] == "ran"  # a server can change
    report = json.loads((tmp_path / "reports" / "report.json").read_text())
    assert report["passed"] is True


# ---- llmopt eval --candidate URL against llmopt serve, and the endpoint probe before any work ----

SERVED_RECIPE = """schema_version = 1
name = "served"

[model]
source = "{model}"

[[eval]]
name = "prose"
kind = "perplexity"
window = 64
max_windows = 3
max_increase_pct = 1

[[eval]]
name = "mc"
kind = "multiple_choice"
limit = 12
max_drop = 0.3
"""


def cli(capsys, *args) -> tuple[int, str, str]:
    from llmopt.cli.main import main

    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_eval_against_llmopt_serve_scores_perplexity_and_multiple_choice(capsys, tiny_model, tmp_path):
    from llmopt.server import load_model
    from test_server import running

    recipe = write_recipe(tmp_path, SERVED_RECIPE.format(model=tiny_model))
    with running(load_model(tiny_model, name="tiny-served")) as base:
        code, out, err = cli(capsys, "eval", str(recipe), "--candidate", f"{base}/v1", "-o", str(tmp_path / "r"),
                             "-f", "json")
    assert code == 0, err
    gates = {g["name"]: g for g in json.loads(out)["gates"]}
    assert abs(gates["prose"]["delta"]) < 1e-4 and gates["prose"]["verdict"] == "pass"  # the same model, served
    assert gates["mc"]["delta"] == 0 and gates["mc"]["verdict"] == "pass"
    assert gates["mc"]["discordant"] == {"candidate_better": 0, "candidate_worse": 0}


def test_scores_through_llmopt_serve_are_cached_on_what_it_serves_not_its_url(capsys, tiny_model, tmp_path):
    """`llmopt serve` lists its model's digest in /v1/models: the same model served again, on another port,
    is not scored again; a changed model file is."""
    from llmopt.server import load_model
    from test_server import running

    recipe = write_recipe(tmp_path, SERVED_RECIPE.format(model=tiny_model))

    def scored(model: Path) -> tuple[dict, dict]:
        with running(load_model(model, name="tiny-served")) as base:
            code, out, err = cli(capsys, "eval", str(recipe), "--candidate", f"{base}/v1", "-o", str(tmp_path / "r"),
                                 "-f", "json")
            with urllib.request.urlopen(f"{base}/v1/models") as answer:
                card = json.loads(answer.read())["data"][0]
        assert code == 0, err
        return {s["name"]: s["status"] for s in json.loads(out)["stages"]}, card

    first, card = scored(tiny_model)
    assert card["llmopt"]["model_digest"].startswith("sha256:") and card["llmopt"]["runtime"] == "transformers"
    assert first["eval.prose.candidate"] == "ran" and first["eval.mc.candidate"] == "ran"
    again, same = scored(tiny_model)  # another server, another port, the same files
    assert same["llmopt"] == card["llmopt"]
    assert again["eval.prose.candidate"] == "cached" and again["eval.mc.candidate"] == "cached"
    changed = tmp_path / "changed"
    shutil.copytree(tiny_model, changed)
    (changed / "NOTES.md").write_text("one more file: the folder is not the one scored before\n")
    third, other = scored(changed)
    assert other["llmopt"]["model_digest"] != card["llmopt"]["model_digest"]
    assert third["eval.prose.candidate"] == "ran" and third["eval.mc.candidate"] == "ran"


def test_eval_fails_at_once_when_the_server_cannot_echo_logprobs(capsys, tiny_model, tmp_path, isolated_cache):
    recipe = write_recipe(tmp_path, SERVED_RECIPE.format(model=tiny_model))
    app, _ = make_app(tiny_model, echo_logprobs=False)
    with Server(app) as server:
        started = time.monotonic()
        code, _, err = cli(capsys, "eval", str(recipe), "--candidate", server.url, "-o", str(tmp_path / "r"))
        elapsed = time.monotonic() - started
    assert code == 2, err
    assert f"endpoint {server.url} cannot score log-likelihoods" in err
    assert "it does not echo prompt log-probabilities" in err and "vLLM, SGLang" in err  # what is missing, the fix
    assert err.count("cannot score log-likelihoods") == 2  # perplexity and multiple_choice
    assert {bool(r.get("echo")) for r in app.state.requests} <= {True}  # only the probes: nothing was generated
    assert not (isolated_cache / "stages").exists() or not any((isolated_cache / "stages").iterdir())  # no baseline
    assert not (tmp_path / "r").exists() and elapsed < 30


def test_eval_fails_at_once_when_the_endpoint_is_down_or_cannot_chat(capsys, tiny_model, tmp_path):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    recipe = write_recipe(tmp_path, SERVED_RECIPE.format(model=tiny_model))
    code, _, err = cli(capsys, "eval", str(recipe), "--candidate", f"http://127.0.0.1:{port}/v1")
    assert code == 2 and f"endpoint http://127.0.0.1:{port}/v1 does not answer" in err and "llmopt serve" in err
    chat = SERVED_RECIPE.format(model=tiny_model).split("[[eval]]")[0] + """[[eval]]
name = "qa"
kind = "generation"
limit = 2
chat_template = true
max_drop = 0.5
"""
    from fastapi import FastAPI

    bare = FastAPI()  # lists a model and nothing else: chat is a 404
    bare.get("/v1/models")(lambda: {"object": "list", "data": [{"id": "m", "object": "model"}]})
    with Server(bare) as server:
        code, _, err = cli(capsys, "eval", str(write_recipe(tmp_path, chat, "chat.toml")), "--candidate", server.url)
    assert code == 2 and f"endpoint {server.url} cannot answer chat on /v1/chat/completions" in err
    assert "HTTP 404" in err


# ---- a connection the server drops (the README's endpoint eval once failed with "Connection reset by peer") ----


class ResettingServer:
    """A raw HTTP/1.1 server on a loopback port: /v1/models names one model; /v1/completions echoes a
    log-probability of -1 for every prompt token, except that the first ``resets`` requests for it are
    answered with a TCP reset (SO_LINGER 0), as a server closing an idle keep-alive connection at the
    moment the client reuses it looks to the client."""

    def __init__(self, resets: int):
        self.resets, self.completions = resets, 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self.thread = threading.Thread(target=self.accept, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.sock.close()

    def accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self.handle, args=(conn,), daemon=True).start()

    def handle(self, conn: socket.socket):
        stream = conn.makefile("rb")
        with conn:
            while True:
                head = stream.readline()
                if not head:
                    return
                headers = {}
                while (line := stream.readline()) not in (b"\r\n", b""):
                    key, _, value = line.decode().partition(":")
                    headers[key.strip().lower()] = value.strip()
                body = stream.read(int(headers.get("content-length", 0)))
                if b"/completions" in head:
                    self.completions += 1
                    if self.completions <= self.resets:
                        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        return  # closing now sends RST
                    count = len(json.loads(body)["prompt"])
                    answer = {"choices": [{"text": "", "logprobs": {"token_logprobs": [None] + [-1.0] * (count - 1)}}]}
                else:
                    answer = {"object": "list", "data": [{"id": "tiny", "object": "model"}]}
                data = json.dumps(answer).encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)


def test_a_reset_connection_is_retried_once_and_the_score_is_the_same(tiny_model):
    with ResettingServer(resets=1) as server:
        remote = EndpointRuntime(tiny_model, url=server.url)
        assert remote.nll([[1, 2, 3, 4, 5]], [4]) == [4.0]
        assert server.completions == 2  # the reset request, then the same request again


def test_a_server_that_keeps_resetting_fails_clearly(tiny_model):
    with ResettingServer(resets=100) as server:
        remote = EndpointRuntime(tiny_model, url=server.url)
        with pytest.raises(StageFailed, match="did not answer"):
            remote.nll([[1, 2, 3, 4, 5]], [4])
        assert server.completions == 2  # one retry, not a loop
