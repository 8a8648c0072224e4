"""llmopt serve: the OpenAI-compatible server over the tiny model, through a real uvicorn
server on 127.0.0.1 (completions, chat, streaming, usage, concurrency, queue limits,
disconnects, errors, metrics), the token stream of the transformers runtime, the text
stream with stop strings, and the CLI."""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from llmopt.errors import UsageError
from llmopt.server import ServedModel, bind, create_app
from llmopt.model.chat import NoChatTemplate, read_template, render_chat, render_template, special_tokens
from llmopt.server.model import load_model, locate
from llmopt.server.text import TextStream

from conftest import ROOT, wait_for

CHATML = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
          "{% if add_generation_prompt %}<|assistant|>{% endif %}")
MAX_LEN = 128
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Where does the river run?"}]


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny model runs faster on one thread than on a busy machine's two
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def chat_model(tiny_model, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("served") / "tiny-chat"
    shutil.copytree(tiny_model, folder)
    (folder / "chat_template.jinja").write_text(CHATML)
    return folder


@contextmanager
def running(served: ServedModel, max_queue: int = 8, parallel: int = 1, api_key: str | None = None):
    """A uvicorn server in a thread on a free loopback port; yields its base URL."""
    with serving(create_app(served, max_queue, parallel, api_key)) as url:
        yield url


@contextmanager
def serving(app):
    """``app`` served by uvicorn in a thread on a free loopback port; yields its base URL."""
    import uvicorn

    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started, "the server did not start"
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)


@pytest.fixture(scope="module")
def served(chat_model) -> ServedModel:
    return load_model(chat_model, max_model_len=MAX_LEN, name="tiny")


@pytest.fixture(scope="module")
def url(served):
    with running(served) as base:
        yield base


class SlowRuntime:
    """The real runtime, pausing after each token so that requests overlap in time."""

    name = "transformers"

    def __init__(self, inner, delay: float):
        self.inner, self.delay, self.tokenizer = inner, delay, inner.tokenizer

    def encode(self, text, bos=True):
        return self.inner.encode(text, bos)

    def decode(self, ids):
        return self.inner.decode(ids)

    def stream(self, *args, **kwargs):
        for token in self.inner.stream(*args, **kwargs):
            time.sleep(self.delay)
            yield token


@pytest.fixture(scope="module")
def slow_url(chat_model):
    served = load_model(chat_model, max_model_len=MAX_LEN, name="tiny")
    served.runtime = SlowRuntime(served.runtime, 0.05)
    with running(served, max_queue=1) as base:
        yield base


def post(base: str, path: str, body: dict, timeout: float = 60) -> httpx.Response:
    return httpx.post(base + path, json=body, timeout=timeout)


def events(response: httpx.Response) -> list:
    """The JSON payloads of a server-sent event stream, with "[DONE]" as a string."""
    out = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            payload = line[len("data: "):]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
        else:
            assert line == "", f"unexpected line in the stream: {line!r}"
    return out


def streamed(base: str, path: str, body: dict) -> list:
    with httpx.stream("POST", base + path, json={**body, "stream": True}, timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        return events(response)


def metrics(base: str) -> dict[str, float]:
    """/metrics parsed with a line parser: {'name{labels}': value}; checks the format as it goes."""
    text = httpx.get(base + "/metrics", timeout=10).text
    sample = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="[^"]*",?)*\})? (\S+)$')
    values, typed = {}, set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            name, kind = line.split()[2:4]
            assert kind in ("counter", "gauge", "histogram", "summary")
            typed.add(name)
        elif line.startswith("# HELP ") or not line:
            continue
        else:
            match = sample.match(line)
            assert match, f"not a Prometheus sample line: {line!r}"
            family = re.sub(r"_(bucket|sum|count)$", "", match.group(1))
            assert match.group(1) in typed or family in typed, f"{line!r} has no TYPE line"
            values[line.rsplit(" ", 1)[0]] = float(match.group(4))
    return values


def requests(m: dict, endpoint: str, status: str) -> float:
    return m[f'llmopt_requests_total{{endpoint="{endpoint}",status="{status}"}}']


# ---- the runtime's token stream and the text stream ------------------------------------


def test_stream_greedy_equals_generate_and_sampling_repeats_with_a_seed(served):
    rt = served.runtime
    prompt = rt.encode("The river runs")
    assert list(rt.stream(prompt, 12)) == rt.generate(prompt, 12)
    first = list(rt.stream(prompt, 12, temperature=1.0, top_p=0.9, seed=5))
    assert first == list(rt.stream(prompt, 12, temperature=1.0, top_p=0.9, seed=5))
    assert len(set(first)) > 1 and first != list(rt.stream(prompt, 12, temperature=1.0, seed=6))
    tokens = rt.stream(prompt, 12)
    assert [next(tokens), next(tokens)] == rt.generate(prompt, 2)
    tokens.close()  # stopping early is allowed


def test_text_stream_holds_back_a_partial_stop_and_cuts_at_it():
    pieces = {1: "Hel", 2: "lo ", 3: "wor", 4: "ld!", 5: " more"}
    text = TextStream(lambda ids: "".join(pieces[i] for i in ids), ["o w", "END"])
    assert text.add(1) == ("Hel", False)
    assert text.add(2) == ("l", False)  # "o " could start "o w": held back
    assert text.add(3) == ("", True)  # "o w" completed: the text ends before it
    assert text.flush() == ""
    plain = TextStream(lambda ids: "".join(pieces[i] for i in ids), ["!?"])
    assert [plain.add(i)[0] for i in (1, 2, 3, 4)] == ["Hel", "lo ", "wor", "ld"]  # "!" may start "!?"
    assert plain.flush() == "!"


def test_text_stream_holds_back_a_split_character():
    chunks = {1: "caf", 2: "\ufffd", 3: "é!"}  # decode of [1, 2] ends in half a character
    seen = {(1,): "caf", (1, 2): "caf\ufffd", (1, 2, 3): "café!"}
    text = TextStream(lambda ids: seen[tuple(ids)], [])
    assert [text.add(i)[0] for i in chunks] == ["caf", "", "é!"]


# ---- completions and chat ---------------------------------------------------------------


def test_health_and_models(url):
    health = httpx.get(url + "/health", timeout=10)
    assert health.status_code == 200 and health.json()["status"] == "ok"
    models = httpx.get(url + "/v1/models", timeout=10).json()
    assert models["object"] == "list"
    assert [(m["id"], m["object"], m["max_model_len"]) for m in models["data"]] == [("tiny", "model", MAX_LEN)]


def test_completion_text_and_usage_match_the_runtime(url, served):
    rt = served.runtime
    prompt = "The river runs past the mill"
    reply = post(url, "/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": 10, "temperature": 0})
    assert reply.status_code == 200
    body = reply.json()
    expected = rt.generate(rt.tokenizer(prompt)["input_ids"], 10)
    n_prompt = len(rt.tokenizer(prompt)["input_ids"])  # as the HF tokenizer gives them: no BOS for the tiny one
    assert body["object"] == "text_completion" and body["model"] == "tiny"
    assert body["choices"][0]["text"] == rt.decode(expected)
    assert body["choices"][0]["finish_reason"] == ("length" if len(expected) == 10 else "stop")
    assert body["usage"] == {"prompt_tokens": n_prompt, "completion_tokens": len(expected),
                             "total_tokens": n_prompt + len(expected)}


def test_streamed_completion_equals_the_plain_one(url):
    body = {"prompt": "Stones in the water", "max_tokens": 12, "temperature": 0.9, "seed": 11}
    plain = post(url, "/v1/completions", body).json()
    chunks = streamed(url, "/v1/completions", {**body, "stream_options": {"include_usage": True}})
    assert chunks[-1] == "[DONE]"
    usage, finals = chunks[-2], chunks[:-2]
    assert usage["choices"] == [] and usage["usage"] == plain["usage"]
    assert len(finals) >= 2 and all(c["object"] == "text_completion" for c in finals)
    assert "".join(c["choices"][0]["text"] for c in finals) == plain["choices"][0]["text"]
    assert [c["choices"][0]["finish_reason"] for c in finals][-1] == plain["choices"][0]["finish_reason"]
    assert all(c["choices"][0]["finish_reason"] is None for c in finals[:-1])
    no_usage = streamed(url, "/v1/completions", body)
    assert all(c == "[DONE]" or c["choices"] for c in no_usage)  # no usage chunk unless asked


def test_chat_plain_and_streamed_with_the_models_template(url, served, chat_model):
    rt = served.runtime
    rendered = rt.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert rendered == render_chat(object(), chat_model, MESSAGES)  # the jinja2 path other runtimes take
    assert rendered.startswith("<s><|system|>Be brief.</s>") and rendered.endswith("<|assistant|>")
    expected = rt.generate(rt.encode(rendered, bos=False), 8)
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 8, "temperature": 0}
    plain = post(url, "/v1/chat/completions", body).json()
    assert plain["object"] == "chat.completion"
    assert plain["choices"][0]["message"] == {"role": "assistant", "content": rt.decode(expected)}
    assert plain["usage"]["prompt_tokens"] == len(rt.encode(rendered, bos=False))
    assert plain["usage"]["completion_tokens"] == len(expected)
    chunks = streamed(url, "/v1/chat/completions", {**body, "stream_options": {"include_usage": True}})
    assert chunks[0]["object"] == "chat.completion.chunk"
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-3]["choices"][0]["delta"] == {} and chunks[-3]["choices"][0]["finish_reason"]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-2]) == rt.decode(expected)
    assert chunks[-2]["usage"] == plain["usage"]


def test_chat_template_from_tokenizer_config_and_without_one(tiny_model, tmp_path):
    with pytest.raises(NoChatTemplate):
        render_chat(object(), tiny_model, MESSAGES)
    config = {"bos_token": {"content": "<s>"}, "eos_token": "</s>",
              "chat_template": [{"name": "tool_use", "template": "x"}, {"name": "default", "template": CHATML}]}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert read_template(tmp_path) == CHATML
    assert special_tokens(tmp_path) == {"bos_token": "<s>", "eos_token": "</s>"}
    assert render_template(CHATML, MESSAGES[1:], special_tokens(tmp_path)) == (
        "<s><|user|>Where does the river run?</s><|assistant|>")


def test_stop_strings_end_the_text_plain_and_streamed(url):
    body = {"prompt": "A long road", "max_tokens": 24, "temperature": 1.0, "seed": 3}
    full = post(url, "/v1/completions", body).json()["choices"][0]["text"]
    assert len(full) >= 8, full
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    cut = full[: full.find(stop)]
    plain = post(url, "/v1/completions", {**body, "stop": [stop, "never-seen"]}).json()
    assert plain["choices"][0]["text"] == cut and plain["choices"][0]["finish_reason"] == "stop"
    assert plain["usage"]["completion_tokens"] < 24
    chunks = streamed(url, "/v1/completions", {**body, "stop": stop})
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == cut
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"


def test_concurrent_clients_get_what_sequential_ones_get(url):
    bodies = [{"prompt": f"Request {i} about the river", "max_tokens": 8, "temperature": 0.0 if i % 2 else 1.0,
               "seed": i} for i in range(6)]
    sequential = [post(url, "/v1/completions", b).json()["choices"][0]["text"] for b in bodies]

    def one(i: int) -> str:
        if i % 3 == 0:
            return "".join(c["choices"][0]["text"] for c in streamed(url, "/v1/completions", bodies[i])[:-1])
        return post(url, "/v1/completions", bodies[i]).json()["choices"][0]["text"]

    with ThreadPoolExecutor(6) as pool:
        concurrent = list(pool.map(one, range(6)))
    assert concurrent == sequential
    assert len(set(sequential)) > 1


# ---- what benchmark clients send: vLLM's sampling extensions --------------------------------

# GuideLLM 0.8.1's bodies with its defaults (streaming, a fixed output length), as it builds them
GUIDELLM_COMPLETION = {"model": "tiny", "stream": True, "max_tokens": 12, "stop": None, "ignore_eos": True,
                       "stream_options": {"include_usage": True, "continuous_usage_stats": True},
                       "prompt": "The river runs past the mill"}
GUIDELLM_CHAT = {"model": "tiny", "stream": True, "max_completion_tokens": 12, "stop": None, "ignore_eos": True,
                 "stream_options": {"include_usage": True, "continuous_usage_stats": True},
                 "messages": [{"role": "user", "content": [{"type": "text", "text": "Where does the river run?"}]}]}


def eos_prompt(rt) -> list[int]:
    """A prompt ending in the end-of-sequence token, after which the tiny model (tied embeddings)
    greedily repeats it: without ignore_eos / min_tokens the answer is empty."""
    return rt.encode("The river") + sorted(rt.eos_ids)[:1]


@pytest.mark.parametrize("path, body", [("/v1/completions", GUIDELLM_COMPLETION),
                                        ("/v1/chat/completions", GUIDELLM_CHAT)])
def test_guidellm_bodies_stream_max_tokens_with_usage_in_every_chunk(url, path, body):
    chunks = streamed(url, path, body)
    assert chunks[-1] == "[DONE]"
    final, payloads = chunks[-2], chunks[:-2]
    assert final["choices"] == [] and final["usage"]["completion_tokens"] == 12  # ignore_eos: all 12
    usages = [c["usage"] for c in payloads]
    assert all(u is not None and u["prompt_tokens"] == final["usage"]["prompt_tokens"] for u in usages)
    counts = [u["completion_tokens"] for u in usages]
    assert counts == sorted(counts) and counts[-1] == 12 and all(u["total_tokens"] == u["prompt_tokens"]
                                                                  + u["completion_tokens"] for u in usages)
    if "messages" in body:
        assert counts[0] == 0  # the role chunk, as vLLM sends it
    plain = post(url, path, {**body, "stream": False, "stream_options": None}).json()
    assert plain["usage"] == final["usage"]
    without = streamed(url, path, {**body, "stream_options": {"include_usage": True}})
    assert all(c == "[DONE]" or c["usage"] is None or not c["choices"] for c in without)  # usage at the end only


def test_ignore_eos_and_min_tokens_generate_past_the_end_of_sequence(url, served):
    prompt = eos_prompt(served.runtime)
    plain = post(url, "/v1/completions", {"prompt": prompt, "max_tokens": 8, "temperature": 0}).json()
    # the end-of-sequence token is generated and counted (vLLM's usage), not written in the text
    assert plain["usage"]["completion_tokens"] == 1 and plain["choices"][0]["finish_reason"] == "stop"
    assert plain["choices"][0]["text"] == ""
    ignored = post(url, "/v1/completions", {"prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True})
    assert ignored.json()["usage"]["completion_tokens"] == 8
    assert ignored.json()["choices"][0]["finish_reason"] == "length"
    least = post(url, "/v1/completions", {"prompt": prompt, "max_tokens": 8, "temperature": 0, "min_tokens": 3}).json()
    assert least["usage"]["completion_tokens"] >= 3
    text = least["choices"][0]["text"]
    shown = least["usage"]["completion_tokens"] - (least["choices"][0]["finish_reason"] == "stop")  # less the eos
    word = text[: len(text) // shown]  # the repeated token's text
    assert text == word * shown, text
    # a stop string is not looked for before min_tokens: the 3rd token completes it
    stopped = post(url, "/v1/completions", {"prompt": prompt, "max_tokens": 8, "temperature": 0, "min_tokens": 3,
                                            "stop": word}).json()
    assert stopped["choices"][0]["text"] == word * 2 and stopped["usage"]["completion_tokens"] == 3
    assert stopped["choices"][0]["finish_reason"] == "stop"


def test_top_k_one_is_greedy_and_repetition_penalty_changes_greedy_output(url, served):
    body = {"prompt": served.runtime.encode("The river runs"), "max_tokens": 12}  # token ids, a BOS first
    greedy = post(url, "/v1/completions", {**body, "temperature": 0}).json()["choices"][0]["text"]
    for seed in (1, 2, 3):
        top1 = post(url, "/v1/completions", {**body, "temperature": 1.0, "top_k": 1, "seed": seed}).json()
        assert top1["choices"][0]["text"] == greedy
    assert post(url, "/v1/completions", {**body, "temperature": 0, "top_k": 5, "top_p": 0.1}).json()[
        "choices"][0]["text"] == greedy  # greedy ignores top-k and top-p
    rt = served.runtime
    repeated = rt.stream(body["prompt"], 12)
    assert len(set(repeated)) <= 2  # the tiny model repeats itself...
    penalised = post(url, "/v1/completions", {**body, "temperature": 0, "repetition_penalty": 3.0}).json()
    assert penalised["choices"][0]["text"] != greedy  # ...and a penalty on seen tokens stops it
    ids = list(rt.stream(body["prompt"], 12, repetition_penalty=3.0))
    assert len(set(ids)) > 6 and rt.decode(ids) == penalised["choices"][0]["text"]
    assert post(url, "/v1/completions", {**body, "temperature": 0, "repetition_penalty": 1.0}).json()[
        "choices"][0]["text"] == greedy


def test_sampler_keeps_to_the_top_k_and_penalises_seen_tokens():
    import torch

    from llmopt.runtimes.hf import Sampler

    logits = torch.tensor([4.0, 3.0, 2.0, 1.0, -1.0, 0.5])
    picks = {Sampler(torch, "cpu", temperature=2.0, top_k=3, seed=s).pick(logits) for s in range(200)}
    assert picks == {0, 1, 2}
    assert Sampler(torch, "cpu", temperature=2.0, top_k=1, seed=7).pick(logits) == 0
    penalised = Sampler(torch, "cpu", repetition_penalty=2.5)
    penalised.saw([0, 4])  # 4 / 2.5 = 1.6 < 3: the second token wins; -1 * 2.5 stays below
    assert penalised.pick(logits) == 1
    assert Sampler(torch, "cpu").pick(logits, banned={0, 1}) == 2


# ---- errors -------------------------------------------------------------------------------


def test_request_errors_answer_openai_error_json(url):
    before = metrics(url)
    bad_json = httpx.post(url + "/v1/completions", content=b'{"prompt": "x",', timeout=10,
                          headers={"content-type": "application/json"})
    assert bad_json.status_code == 400 and "not valid JSON" in bad_json.json()["error"]["message"]
    form = httpx.post(url + "/v1/completions", content=b'{"prompt": "x"}', timeout=10,
                      headers={"content-type": "application/x-www-form-urlencoded"})
    assert form.status_code == 400 and "Content-Type: application/json" in form.json()["error"]["message"]
    unknown = post(url, "/v1/completions", {"prompt": "x", "temprature": 0.5})
    assert unknown.status_code == 400
    assert unknown.json()["error"] == {"message": "Unrecognized request argument supplied: temprature",
                                       "type": "invalid_request_error", "param": "temprature", "code": None}
    wrong = post(url, "/v1/chat/completions", {"model": "gpt-4o", "messages": MESSAGES})
    assert wrong.status_code == 404 and wrong.json()["error"]["code"] == "model_not_found"
    long_prompt = post(url, "/v1/completions", {"prompt": "river " * 200, "max_tokens": 4})
    assert long_prompt.status_code == 400 and long_prompt.json()["error"]["code"] == "context_length_exceeded"
    assert f"maximum context length is {MAX_LEN} tokens" in long_prompt.json()["error"]["message"]
    too_many = post(url, "/v1/completions", {"prompt": "river", "max_tokens": MAX_LEN})
    assert too_many.status_code == 400 and too_many.json()["error"]["code"] == "context_length_exceeded"
    unsupported = post(url, "/v1/chat/completions", {"messages": MESSAGES, "presence_penalty": 0.5})
    assert unsupported.status_code == 400 and "presence_penalty=0.5 is not supported" in unsupported.text
    out_of_range = post(url, "/v1/completions", {"prompt": "x", "temperature": 3})
    assert out_of_range.status_code == 400 and out_of_range.json()["error"]["param"] == "temperature"
    refused = {"min_tokens (9) must be at most max_tokens (4)": {"min_tokens": 9, "max_tokens": 4},
               "max_tokens must be at least 1": {"max_tokens": 0},
               "supported without stream only": {"stream": True, "logprobs": 1},
               "Unrecognized request argument supplied: top_kk": {"top_kk": 3}}
    for message, extra in refused.items():
        answer = post(url, "/v1/completions", {"prompt": "x", **extra})
        assert answer.status_code == 400 and message in answer.json()["error"]["message"], answer.text
    for extra in ({"repetition_penalty": 0}, {"logprobs": 21}, {"top_k": -2}, {"min_tokens": -1}):
        assert post(url, "/v1/completions", {"prompt": "x", **extra}).json()["error"]["param"] == next(iter(extra))
    assert "without stream only" in post(url, "/v1/chat/completions", {"messages": MESSAGES, "logprobs": True,
                                                                       "stream": True}).text
    after = metrics(url)
    assert requests(after, "completions", "invalid") - requests(before, "completions", "invalid") == 14
    assert requests(after, "chat", "invalid") - requests(before, "chat", "invalid") == 2
    assert requests(after, "chat", "not_found") - requests(before, "chat", "not_found") == 1


# ---- queue limit and disconnects (a slowed runtime, max-queue 1) -------------------------



def test_full_queue_answers_429_and_waiting_requests_are_served(slow_url):
    before = metrics(slow_url)
    with httpx.stream("POST", slow_url + "/v1/completions", timeout=60,
                      json={"prompt": "The river", "max_tokens": 100, "temperature": 0, "stream": True}) as first:
        lines = first.iter_lines()  # kept: dropping the iterator would close the connection
        assert next(lines).startswith("data: ")  # generating now
        waiting = ThreadPoolExecutor(1).submit(post, slow_url, "/v1/completions", {"prompt": "second", "max_tokens": 2})
        wait_for(lambda: metrics(slow_url)["llmopt_queue_depth"] == 1)
        refused = post(slow_url, "/v1/completions", {"prompt": "third", "max_tokens": 2})
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "rate_limit_exceeded" and refused.headers["retry-after"] == "1"
        assert "llmopt serve --max-queue 1; a client that keeps N requests in flight needs --max-queue N - 1" \
            in refused.json()["error"]["message"]  # what a load generator's user needs to know
    # leaving the block disconnects the first client, which frees the worker for the second
    assert waiting.result(timeout=60).status_code == 200
    after = metrics(slow_url)
    assert requests(after, "completions", "queue_full") - requests(before, "completions", "queue_full") == 1
    assert requests(after, "completions", "cancelled") - requests(before, "completions", "cancelled") == 1
    assert requests(after, "completions", "ok") - requests(before, "completions", "ok") == 1
    generated = after["llmopt_generation_tokens_total"] - before["llmopt_generation_tokens_total"]
    assert generated < 100 + 2  # the first stopped early


def test_disconnect_mid_stream_frees_the_slot(slow_url):
    before = metrics(slow_url)
    with httpx.stream("POST", slow_url + "/v1/chat/completions", timeout=60,
                      json={"messages": MESSAGES, "max_tokens": 80, "temperature": 0, "stream": True}) as reply:
        assert reply.status_code == 200
        lines = reply.iter_lines()
        got = [line for line, _ in zip(lines, range(6)) if line.startswith("data: ")]
        assert len(got) == 3  # the role chunk and two tokens
    follow = post(slow_url, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 3, "temperature": 0})
    assert follow.status_code == 200 and follow.json()["usage"]["completion_tokens"] <= 3
    wait_for(lambda: metrics(slow_url)["llmopt_requests_running"] == 0)
    after = metrics(slow_url)
    assert requests(after, "chat", "cancelled") - requests(before, "chat", "cancelled") == 1
    assert requests(after, "chat", "ok") - requests(before, "chat", "ok") == 1
    cancelled_tokens = (after["llmopt_generation_tokens_total"] - before["llmopt_generation_tokens_total"]
                        - follow.json()["usage"]["completion_tokens"])
    assert 2 <= cancelled_tokens < 80


class ConcurrentSlowRuntime(SlowRuntime):
    """SlowRuntime declaring itself safe to generate on several threads (the transformers runtime's stream keeps
    its KV cache in the call, so two calls do not share state), so the server may run it with --parallel."""

    concurrent = True


def test_parallel_workers_generate_requests_at_once_with_the_answers_of_one_worker(chat_model):
    served = load_model(chat_model, max_model_len=MAX_LEN, name="tiny")
    served.runtime = ConcurrentSlowRuntime(served.runtime, 0.05)
    bodies = [{"prompt": f"Request {i} about the river", "max_tokens": 12, "temperature": 0} for i in range(4)]
    with running(served, max_queue=4, parallel=2) as base:
        sequential = [post(base, "/v1/completions", b).json()["choices"][0]["text"] for b in bodies]
        peak = []
        with ThreadPoolExecutor(4) as pool:
            answers = pool.map(lambda b: post(base, "/v1/completions", b).json()["choices"][0]["text"], bodies)
            wait_for(lambda: peak.append(metrics(base)["llmopt_requests_running"]) or peak[-1] == 2)
            assert list(answers) == sequential
        assert max(peak) == 2 and metrics(base)["llmopt_requests_running"] == 0


def test_parallel_needs_a_runtime_that_is_safe_on_several_threads(served, tiny_model, capsys):
    from llmopt.cli.main import main
    from llmopt.server.metrics import Metrics
    from llmopt.server.scheduler import Scheduler

    with pytest.raises(ValueError, match="one request at a time"):
        Scheduler(served.runtime, Metrics(), parallel=2)
    assert main(["serve", str(tiny_model), "--port", "0", "--parallel", "2"]) == 2
    assert "--parallel 2: the transformers runtime generates one request at a time" in capsys.readouterr().err


def test_disconnect_while_waiting_for_a_plain_answer_cancels_it(slow_url):
    before = metrics(slow_url)
    with pytest.raises(httpx.ReadTimeout):
        post(slow_url, "/v1/completions", {"prompt": "The river", "max_tokens": 100, "temperature": 0}, timeout=0.5)
    wait_for(lambda: requests(metrics(slow_url), "completions", "cancelled")
             > requests(before, "completions", "cancelled"))
    wait_for(lambda: metrics(slow_url)["llmopt_requests_running"] == 0)
    generated = metrics(slow_url)["llmopt_generation_tokens_total"] - before["llmopt_generation_tokens_total"]
    assert generated < 100


def test_metrics_are_prometheus_text_with_consistent_histograms(url):
    post(url, "/v1/completions", {"prompt": "count me", "max_tokens": 3})
    m = metrics(url)
    assert requests(m, "completions", "ok") >= 1 and m["llmopt_generation_tokens_total"] >= 1
    assert m["llmopt_queue_depth"] == 0
    for name in ("llmopt_time_to_first_token_seconds", "llmopt_request_latency_seconds", "llmopt_queue_wait_seconds"):
        buckets = [v for k, v in m.items() if k.startswith(name + "_bucket")]
        assert buckets == sorted(buckets) and buckets[-1] == m[name + "_count"] >= 1
        assert m[f'{name}_bucket{{le="+Inf"}}'] == m[name + "_count"] and m[name + "_sum"] > 0


# ---- model folders and the CLI -----------------------------------------------------------


def make_artifact(folder: Path, model: Path) -> Path:
    shutil.copytree(model, folder / "model")
    manifest = {"recipe": {"name": "tiny-artifact"}, "stages": [{"name": "source", "outputs": {"format": "hf"}}]}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def test_locate_artifacts_and_model_folders(tmp_path, tiny_model):
    art = make_artifact(tmp_path / "art", tiny_model)
    assert locate(art) == (art / "model", "hf", "tiny-artifact")
    assert locate(tiny_model) == (tiny_model, "hf", tiny_model.name)
    onnx = tmp_path / "onnx-model"
    onnx.mkdir()
    (onnx / "genai_config.json").write_text(json.dumps({"model": {"context_length": 2048, "vocab_size": 512}}))
    assert locate(onnx) == (onnx, "onnx", "onnx-model")
    with pytest.raises(UsageError, match="neither a model"):
        locate(tmp_path)
    with pytest.raises(UsageError, match="exceeds the model's context of 512"):
        load_model(tiny_model, max_model_len=4096)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # a fresh interpreter importing torch and transformers: 10-30 s on a small CPU machine
def test_cli_serves_an_artifact_until_interrupted(tmp_path, tiny_model):
    art = make_artifact(tmp_path / "art", tiny_model)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "llmopt", "serve", str(art), "--port", str(port),
                             "--max-model-len", "64", "--format", "json"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        base = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            assert proc.poll() is None, proc.stderr.read()
            try:
                return httpx.get(base + "/health", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(healthy, timeout=120)
        models = httpx.get(base + "/v1/models", timeout=10).json()["data"]
        assert [(m["id"], m["max_model_len"]) for m in models] == [("tiny-artifact", 64)]
        reply = post(base, "/v1/completions", {"model": "tiny-artifact", "prompt": "river", "max_tokens": 2})
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] <= 2
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    info = json.loads(out)
    assert info["url"] == f"http://127.0.0.1:{port}/v1" and info["format"] == "hf" and info["model"] == "tiny-artifact"


def test_cli_serve_usage_errors(capsys, tmp_path, tiny_model):
    from llmopt.cli.main import main

    assert main(["serve", str(tmp_path / "missing")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    assert main(["serve", str(tiny_model), "--runtime", "vllm"]) == 2
    assert "unknown runtime 'vllm'" in capsys.readouterr().err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert main(["serve", str(tiny_model), "--port", str(taken.getsockname()[1])]) == 2
    assert "cannot listen on 127.0.0.1" in capsys.readouterr().err
    assert main(["serve", str(tiny_model), "--host", "nowhere.invalid", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "cannot listen on nowhere.invalid" in err and "pass --host an address of this machine" in err
    assert main(["serve", str(tiny_model), "--device", "gpu"]) == 2  # was served, on the CPU, as device "gpu"
    assert "--device gpu: not a device" in capsys.readouterr().err


def test_a_device_the_model_cannot_run_on_is_a_usage_error(tmp_path, tiny_model):
    """An ONNX Runtime GenAI graph runs on the EP it was built for: `--device cuda` on a CPU graph was served on
    the CPU while /v1/models said cuda."""
    from llmopt.libraries import pick_device
    from llmopt.server.model import serving_device

    folder = tmp_path / "onnx"
    folder.mkdir()
    config = folder / "genai_config.json"
    config.write_text(json.dumps({"model": {"decoder": {"session_options": {}}}}))
    with pytest.raises(UsageError, match="--device cuda: this ONNX model's graph was built for the CPU EP"):
        serving_device("cuda", folder, "onnx")
    assert serving_device("cpu", folder, "onnx") == serving_device("auto", folder, "onnx") == "cpu"
    config.write_text(json.dumps({"model": {"decoder": {"session_options": {"provider_options": [{"cuda": {}}]}}}}))
    assert serving_device("cpu", folder, "onnx") == "cpu"  # a GPU graph runs on the CPU EP, its providers cleared
    assert serving_device("cuda:1", folder, "onnx") == "cuda:1"
    if pick_device() == "cpu":
        with pytest.raises(UsageError, match="--device cuda:0: torch sees no CUDA GPU here"):
            serving_device("cuda:0", tiny_model, "hf")


@pytest.mark.slow  # builds an ONNX Runtime GenAI model from the tiny model (about a minute on a small CPU machine)
def test_onnx_model_folder_is_served_like_the_transformers_one(chat_model, url, tmp_path):
    pytest.importorskip("onnxruntime_genai")
    onnx = tmp_path / "tiny-onnx"
    subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(chat_model), "-o", str(onnx),
                    "-p", "fp32", "-e", "cpu", "-c", str(tmp_path / "build-cache")], check=True, capture_output=True)
    served = load_model(onnx, max_model_len=MAX_LEN, name="tiny")
    assert (served.format, served.runtime.name) == ("onnx", "onnxruntime")
    bodies = [("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 8, "temperature": 0}),
              ("/v1/completions", {"prompt": "The river runs", "max_tokens": 10, "temperature": 0})]
    hf = load_model(chat_model, max_model_len=MAX_LEN).runtime
    ids = hf.encode("The river runs")
    for options in ({"repetition_penalty": 1.5}, {"temperature": 0.7, "top_k": 1}, {"repetition_penalty": 3.0}):
        assert list(served.runtime.stream(ids, 10, **options)) == list(hf.stream(ids, 10, **options)), options
    with running(served, parallel=2) as onnx_url:  # two generators over one og.Model, on two threads
        for path, body in bodies:
            onnx_answer, hf_answer = post(onnx_url, path, body).json(), post(url, path, body).json()
            assert onnx_answer["choices"] == hf_answer["choices"] and onnx_answer["usage"] == hf_answer["usage"]
        many = [{"prompt": f"Request {i} about the river", "max_tokens": 10, "temperature": 0} for i in range(4)]
        with ThreadPoolExecutor(4) as pool:
            at_once = list(pool.map(lambda b: post(onnx_url, "/v1/completions", b).json()["choices"], many))
        assert at_once == [post(url, "/v1/completions", b).json()["choices"] for b in many]
        # onnxruntime-genai ends at its end-of-sequence token: ignore_eos masks it instead, for the same length
        ignored = {"prompt": eos_prompt(served.runtime), "max_tokens": 6, "temperature": 0, "ignore_eos": True}
        assert post(onnx_url, "/v1/completions", ignored).json()["usage"]["completion_tokens"] == 6
        scoring = {"prompt": "The river runs past the mill", "echo": True, "logprobs": 2, "max_tokens": 0}
        onnx_lp, hf_lp = (post(base, "/v1/completions", scoring).json()["choices"][0]["logprobs"]
                          for base in (onnx_url, url))
        assert onnx_lp["tokens"] == hf_lp["tokens"] and onnx_lp["token_logprobs"][0] is None
        assert onnx_lp["token_logprobs"][1:] == pytest.approx(hf_lp["token_logprobs"][1:], abs=1e-4)
        sampled = {"prompt": "The river runs", "max_tokens": 10, "temperature": 0.9, "seed": 4}
        plain = post(onnx_url, "/v1/completions", sampled).json()["choices"][0]["text"]
        assert "".join(c["choices"][0]["text"] for c in streamed(onnx_url, "/v1/completions", sampled)[:-1]) == plain


def test_several_prompts_n_choices_chat_logprobs_and_many_stops(url, served):
    """What lm-eval, GuideLLM and the openai client send beyond one prompt and one choice, answered as vLLM
    answers it: choices in order (prompt i's k-th at i * n + k), usage summed, any number of stop strings."""
    prompts = ["The river runs past the mill", "Stones in the water"]
    one = [post(url, "/v1/completions", {"prompt": p, "max_tokens": 6, "temperature": 0}).json() for p in prompts]
    both = post(url, "/v1/completions", {"prompt": prompts, "max_tokens": 6, "temperature": 0, "n": 2}).json()
    assert [c["index"] for c in both["choices"]] == [0, 1, 2, 3]
    assert [c["text"] for c in both["choices"]] == [one[0]["choices"][0]["text"]] * 2 + [one[1]["choices"][0]["text"]] * 2
    assert both["usage"]["prompt_tokens"] == sum(o["usage"]["prompt_tokens"] for o in one)
    assert both["usage"]["completion_tokens"] == 2 * sum(o["usage"]["completion_tokens"] for o in one)
    ids = [served.tokenize(p) for p in prompts]  # lm-eval's batched log-likelihood request: token-id lists
    scored = post(url, "/v1/completions", {"prompt": ids, "echo": True, "logprobs": 1, "max_tokens": 1,
                                           "temperature": 0}).json()
    for choice, p in zip(scored["choices"], ids):
        single = post(url, "/v1/completions", {"prompt": p, "echo": True, "logprobs": 1, "max_tokens": 1,
                                               "temperature": 0}).json()["choices"][0]
        assert choice["logprobs"] == single["logprobs"] and choice["text"] == single["text"]
    sampled = post(url, "/v1/completions", {"prompt": prompts[0], "max_tokens": 8, "n": 3, "seed": 5}).json()
    again = post(url, "/v1/completions", {"prompt": prompts[0], "max_tokens": 8, "n": 3, "seed": 5}).json()
    assert [c["text"] for c in sampled["choices"]] == [c["text"] for c in again["choices"]]
    assert len({c["text"] for c in sampled["choices"]}) > 1  # seed + k: the choices differ
    # chat log-probabilities, OpenAI's shape, and n choices
    chat = post(url, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 5, "temperature": 0,
                                              "logprobs": True, "top_logprobs": 2, "n": 2}).json()
    assert len(chat["choices"]) == 2 and chat["choices"][0]["message"] == chat["choices"][1]["message"]
    content = chat["choices"][0]["logprobs"]["content"]
    assert len(content) == chat["usage"]["completion_tokens"] // 2
    assert "".join(c["token"] for c in content).startswith(chat["choices"][0]["message"]["content"])
    for entry in content:
        assert len(entry["top_logprobs"]) == 2 and entry["logprob"] == entry["top_logprobs"][0]["logprob"]  # greedy
        assert entry["bytes"] == list(entry["token"].encode())
    # more than 4 stop strings (lm-eval adds the tokenizer's eos to a task's 4)
    text = one[0]["choices"][0]["text"]
    stops = ["zzz1", "zzz2", "zzz3", "zzz4", "zzz5", text[2:4]]
    stopped = post(url, "/v1/completions", {"prompt": prompts[0], "max_tokens": 6, "temperature": 0, "stop": stops})
    assert stopped.status_code == 200 and stopped.json()["choices"][0]["text"] == text[: text.find(text[2:4])]
    streamed_n = post(url, "/v1/completions", {"prompt": prompts, "max_tokens": 2, "stream": True})
    assert streamed_n.status_code == 400 and "without stream only" in streamed_n.json()["error"]["message"]


def test_default_queue_holds_a_load_generators_sweep_or_the_recipes_workload(tmp_path, tiny_model):
    """GuideLLM's default sweep keeps up to 512 requests in flight, where the queue held 16."""
    from llmopt.catalog.engines import SWEEP_QUEUE
    from llmopt.server.model import default_queue

    assert SWEEP_QUEUE == 512 and default_queue(tiny_model) == 512  # a plain model folder
    for concurrency, queue in ((1, 512), (1000, 1000)):
        artifact = tmp_path / f"a{concurrency}"
        (artifact / "model").mkdir(parents=True)
        resolved = {"serve": {"workload": {"input_len": 256, "output_len": 128, "concurrency": concurrency}}}
        (artifact / "manifest.json").write_text(json.dumps({"recipe": {"name": "q", "resolved": resolved}}))
        assert default_queue(artifact) == queue


def test_the_tokenizer_opens_at_start_up_without_holding_back_readiness(chat_model, monkeypatch):
    """The server starts opening the model's tokenizer at start-up (a GuideLLM sweep's first request against
    the quickstart waited 8.7 s for its first token while it loaded, the next ones 0.4 s), in the background:
    the server is ready, and token-id requests answer, while it loads; a text request waits for it."""
    from llmopt.server import model as served_module

    release, started = threading.Event(), threading.Event()
    opened = served_module.hf_tokenizer

    def slow_tokenizer(runtime, model_dir):
        started.set()
        assert release.wait(30)
        return opened(runtime, model_dir)

    monkeypatch.setattr(served_module, "hf_tokenizer", slow_tokenizer)
    served = load_model(chat_model, max_model_len=MAX_LEN, name="tiny")
    served.runtime = SlowRuntime(served.runtime, 0)
    served.runtime.tokenizer = None  # as the ONNX Runtime runtime has none: AutoTokenizer opens the folder's
    with running(served) as base:
        assert started.wait(30)  # the load began at start-up, before any request
        assert post(base, "/v1/completions", {"prompt": [3, 4], "max_tokens": 1}).status_code == 200
        assert served.tokenizer is None  # answered while the tokenizer was still loading
        release.set()
        assert post(base, "/v1/completions", {"prompt": "hi", "max_tokens": 1}).status_code == 200
        assert served.tokenizer is not None