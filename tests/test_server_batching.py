"""llmopt serve --max-num-seqs: onnxruntime-genai's engine generating several requests in one model copy
(llmopt/server/batching.py, llmopt/runtimes/onnx_batch.py), over an ONNX build of the tiny model: concurrent
greedy requests of different lengths answer as each does alone, streaming and stop strings as on the
one-at-a-time path, a client that goes away frees its place, a full queue answers 429, and a seeded request
(which the static CPU engine does not take) is generated beside the batch. Over a counting fake engine: a
waiting request joins a dynamic batch at the next step and a static one only once it is done, and what the
engine cannot run goes to the runtime's own generator."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from llmopt.server import create_app
from llmopt.server.model import load_model

from test_server import serving

og = pytest.importorskip("onnxruntime_genai")
pytestmark = pytest.mark.skipif(not hasattr(og, "Engine"), reason="onnxruntime-genai without og.Engine")


@pytest.fixture(scope="module")
def onnx_model(tiny_model, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("batching")
    subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(tiny_model), "-o",
                    str(folder / "tiny-onnx"), "-p", "fp32", "-e", "cpu", "-c", str(folder / "build-cache")],
                   check=True, capture_output=True)
    return folder / "tiny-onnx"


@contextmanager
def running(model: Path, max_queue: int = 8, max_num_seqs: int | None = 4, step_s: float = 0.0):
    """A uvicorn server over ``model`` in a thread; yields (base URL, app). ``step_s``: each engine step
    takes that much longer, so that a request is still generating when the test looks."""
    served = load_model(model, max_model_len=128, name="tiny")
    app = create_app(served, max_queue, 1, None, max_num_seqs)
    if step_s:
        batch = app.state.scheduler.batch
        step = batch.step
        batch.step = lambda: (time.sleep(step_s), step())[1]
    with serving(app) as url:
        yield url, app


def post(base: str, body: dict, path: str = "/v1/completions") -> httpx.Response:
    return httpx.post(base + path, json=body, timeout=60)


BODIES = [{"prompt": f"Request {i} about the river", "max_tokens": n, "temperature": 0}
          for i, n in enumerate((3, 17, 9, 30, 1, 12))]
SCORED = [{"prompt": "The river runs past the mill", "echo": True, "logprobs": 2, "max_tokens": 0},  # between steps
          {"prompt": "The river runs", "logprobs": 2, "max_tokens": 5, "temperature": 0}]  # generated, then scored


@pytest.fixture(scope="module")
def alone(onnx_model) -> list[dict]:
    """Each body's answer from the one-at-a-time scheduler."""
    with running(onnx_model, max_num_seqs=None) as (base, app):
        assert app.state.scheduler.scheduler == "single"
        return [post(base, body).json() for body in BODIES + SCORED]


def test_concurrent_greedy_requests_answer_as_each_does_alone(onnx_model, alone):
    with running(onnx_model, max_num_seqs=4) as (base, app):
        assert app.state.scheduler.scheduler == "engine-static"
        batch, seen = app.state.scheduler.batch, []
        step = batch.step
        batch.step = lambda: (seen.append(len(batch._turns)), step())[1]  # requests in the engine at each step
        with ThreadPoolExecutor(len(BODIES)) as pool:
            together = list(pool.map(lambda body: post(base, body).json(), BODIES))
        assert 2 <= max(seen) <= 4  # batched, never more than --max-num-seqs
        for got, want in zip(together, alone):
            assert got["choices"] == want["choices"] and got["usage"] == want["usage"]
        assert [g["usage"]["completion_tokens"] for g in together] == [3, 17, 9, 30, 1, 12]
        for body, want in zip(SCORED, alone[len(BODIES):]):
            got, want = post(base, body).json()["choices"][0], want["choices"][0]
            assert got["text"] == want["text"] and got["logprobs"]["tokens"] == want["logprobs"]["tokens"]
            scores = want["logprobs"]["token_logprobs"]
            assert got["logprobs"]["token_logprobs"][1:] == pytest.approx(scores[1:], abs=1e-4)
        streamed = httpx.post(base + "/v1/completions", json={**BODIES[3], "stream": True}, timeout=60).text
        chunks = [line for line in streamed.splitlines() if line.startswith("data: {")]
        text = "".join(json.loads(c[6:])["choices"][0]["text"] for c in chunks)
        assert text == alone[3]["choices"][0]["text"] and streamed.rstrip().endswith("data: [DONE]")
        stop = alone[3]["choices"][0]["text"][4:7]
        stopped = post(base, {**BODIES[3], "stop": [stop]}).json()["choices"][0]
        assert stopped["finish_reason"] == "stop" and stopped["text"] == alone[3]["choices"][0]["text"].split(stop)[0]
        metrics = httpx.get(base + "/metrics").text
        assert 'llmopt_scheduler_info{max_num_seqs="4",scheduler="engine-static"} 1' in metrics
        assert f"llmopt_batch_size_count {len(seen)}\n" in metrics and f"llmopt_batch_size_sum {float(sum(seen))}\n" in metrics
        assert httpx.get(base + "/health").json()["scheduler"] == "engine-static"


def test_seeded_sampling_runs_beside_the_static_batch_and_repeats(onnx_model):
    sampled = {"prompt": "The river runs", "max_tokens": 10, "temperature": 0.9, "seed": 4}
    with running(onnx_model, max_num_seqs=2) as (base, _):
        with ThreadPoolExecutor(3) as pool:
            answers = list(pool.map(lambda body: post(base, body).json(), [sampled, BODIES[3], sampled]))
    assert answers[0]["choices"] == answers[2]["choices"] and answers[0]["usage"]["completion_tokens"] == 10
    assert answers[1]["usage"]["completion_tokens"] == 30


def test_a_client_that_goes_away_frees_its_place_and_a_full_queue_answers_429(onnx_model, alone):
    long = {"prompt": "The river runs", "max_tokens": 100, "temperature": 0, "ignore_eos": True, "stream": True}
    with running(onnx_model, max_queue=1, max_num_seqs=1, step_s=0.05) as (base, app):
        with httpx.Client(timeout=60) as client, client.stream("POST", base + "/v1/completions", json=long) as first:
            lines = first.iter_lines()
            assert next(line for line in lines if line.startswith("data: {"))  # generating
            loop_tasks = []
            waiting = threading.Thread(target=lambda: loop_tasks.append(post(base, BODIES[0])))
            waiting.start()
            deadline = time.monotonic() + 10
            while app.state.metrics.waiting < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            full = post(base, BODIES[1])
            assert full.status_code == 429 and full.headers["retry-after"] == "1"
            assert "--max-queue 1" in full.json()["error"]["message"]
        # the stream is closed: its request is cancelled and the waiting one runs
        waiting.join(30)
        assert loop_tasks[0].json()["choices"] == alone[0]["choices"]
        metrics = httpx.get(base + "/metrics").text
        assert 'llmopt_requests_total{endpoint="completions",status="cancelled"} 1' in metrics
        assert 'llmopt_requests_total{endpoint="completions",status="queue_full"} 1' in metrics
        assert app.state.metrics.running == 0 and app.state.metrics.waiting == 0


def test_max_num_seqs_is_not_for_parallel_and_falls_back_where_there_is_no_engine(tiny_model, capsys, caplog):
    from llmopt.cli.main import main

    assert main(["serve", str(tiny_model), "--port", "0", "--parallel", "2", "--max-num-seqs", "4"]) == 2
    assert "--max-num-seqs 4 batches requests in one copy of the model" in capsys.readouterr().err
    served = load_model(tiny_model, max_model_len=128, name="tiny")  # the transformers runtime: no engine
    with caplog.at_level("WARNING", logger="llmopt.server"):
        app = create_app(served, 8, 1, None, 4)
    assert app.state.scheduler.scheduler == "single" and "one request generates at a time" in caplog.text
    assert 'llmopt_scheduler_info{max_num_seqs="1",scheduler="single"} 1' in app.state.metrics.render()


class FakeBatch:
    """An engine that counts: each step gives every turn its next id (prompt's last + k), up to its max."""

    def __init__(self, dynamic: bool):
        self.dynamic, self.kind, self.max_batch_size = dynamic, "dynamic" if dynamic else "static", 2
        self.turns, self.log = [], []  # log: the prompts in the engine at each step

    def open(self):
        pass

    def supports(self, seed):
        return seed is None or self.dynamic

    def start(self, prompt_ids, max_new_tokens, **options):
        from llmopt.runtimes.onnx_batch import Turn

        turn = Turn(request=[prompt_ids[-1], max_new_tokens, 0], turn_id=1)
        self.turns.append(turn)
        return turn

    def cancel(self, turn):
        turn.request[2] = -1

    def step(self):
        time.sleep(0.002)
        self.log.append(sorted(t.request[0] for t in self.turns))
        out = []
        for turn in list(self.turns):
            last, most, done = turn.request
            if done < 0:
                out.append((turn, None, "cancelled"))
            else:
                turn.request[2] = done + 1
                out.append((turn, last + done + 1, "length" if done + 1 == most else None))
            if out[-1][2]:
                turn.finished = True
                self.turns.remove(turn)
        return out


class Decoder:
    """A runtime that only decodes (the engine, FakeBatch, makes the tokens), with one end-of-sequence id."""

    name, eos_ids = "fake", {0}

    def decode(self, ids):
        return " ".join(map(str, ids))


@pytest.mark.parametrize("dynamic", [True, False])
def test_a_waiting_request_joins_a_dynamic_batch_at_the_next_step_and_a_static_one_when_it_ends(dynamic):
    from llmopt.server.batching import BatchScheduler
    from llmopt.server.metrics import Metrics
    from llmopt.server.scheduler import Job

    batch = FakeBatch(dynamic)
    scheduler = BatchScheduler(Decoder(), batch, Metrics(), max_queue=4, max_num_seqs=2)
    scheduler.start()
    try:
        jobs = [Job("completions", [p], n) for p, n in ((1000, 40), (2000, 3), (3000, 3))]
        for job in jobs:
            scheduler.submit(job)
        assert all(job.finished.wait(10) for job in jobs)
    finally:
        scheduler.close()
    assert [job.tokens for job in jobs] == [list(range(1001, 1041)), [2001, 2002, 2003], [3001, 3002, 3003]]
    joined = next(i for i, prompts in enumerate(batch.log) if 3000 in prompts)
    assert batch.log[joined] == ([1000, 3000] if dynamic else [3000])  # static: only once 1000's batch is done


def test_what_the_engine_cannot_run_is_generated_beside_it_by_the_runtime():
    """A seed on a static engine; scores (logprobs, echo) when the model has several end-of-sequence ids."""
    from llmopt.server.batching import BatchScheduler
    from llmopt.server.metrics import Metrics
    from llmopt.server.scheduler import Job

    class Runtime:
        name, eos_ids = "fake", {0, 1}

        def decode(self, ids):
            return " ".join(map(str, ids))

        def stream(self, prompt_ids, max_new_tokens, stop_ids=None, **options):
            yield from range(prompt_ids[-1] + 1, prompt_ids[-1] + 1 + max_new_tokens)

    batch = FakeBatch(dynamic=False)
    scheduler = BatchScheduler(Runtime(), batch, Metrics(), max_queue=4, max_num_seqs=3)
    scheduler.start()
    try:
        jobs = [Job("completions", [100], 5), Job("completions", [200], 5, temperature=0.5, seed=3),
                Job("completions", [300], 5, scored=True)]
        for job in jobs:
            scheduler.submit(job)
        assert all(job.finished.wait(10) for job in jobs)
    finally:
        scheduler.close()
    assert [job.tokens for job in jobs] == [[101 + i for i in range(5)], [201 + i for i in range(5)],
                                            [301 + i for i in range(5)]]
    assert {p for prompts in batch.log for p in prompts} == {100}  # only the first ran in the engine


@pytest.mark.parametrize("gather_max_s, first_batch", [(5.0, [1000, 2000, 3000, 4000]), (0.5, [1000, 2000, 3000])])
def test_a_static_batch_gathers_requests_that_come_one_after_another(gather_max_s, first_batch):
    """Seen on an H100 (2026-12-06): `llmopt serve --max-num-seqs 32` on the ONNX CUDA artifact, 8 closed-loop
    clients, TTFT p50 598 ms, about one batch's decode. Clients whose answers end together send their next requests
    over more than the 10 ms the static batch waited from the first; the test's second and later requests each
    come within the quiet window of the one before. Now the batch starts once none has come for ``gather_s``, ``gather_max_s`` after the
    first at most (the times here are 35x the server's, for a test on a busy machine)."""
    from llmopt.server.batching import BatchScheduler
    from llmopt.server.metrics import Metrics
    from llmopt.server.scheduler import Job

    batch = FakeBatch(dynamic=False)
    scheduler = BatchScheduler(Decoder(), batch, Metrics(), max_queue=8, max_num_seqs=8)
    scheduler.gather_s, scheduler.gather_max_s = 0.35, gather_max_s
    scheduler.start()
    try:
        jobs = [Job("completions", [p], 100) for p in (1000, 2000, 3000, 4000)]
        for i, job in enumerate(jobs):
            if i:
                time.sleep(0.2)  # each within gather_s of the one before; the last 0.6 s after the first
            scheduler.submit(job)
        assert all(job.finished.wait(20) for job in jobs)
    finally:
        scheduler.close()
    assert batch.log[0] == first_batch
