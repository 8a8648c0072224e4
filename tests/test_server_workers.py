"""llmopt serve --parallel's worker processes (llmopt/server/workers.py): each a spawned process with its own
runtime, generating one request at a time; cancelled when its consumer stops early, failing one request and
not the worker when the runtime raises, refusing to start when the model cannot be loaded."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from llmopt.server import workers
from llmopt.server.metrics import Metrics
from llmopt.server.scheduler import Job, Scheduler

COUNTING = "fake_runtimes:Counting"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    started = workers.start(COUNTING, tmp_path_factory.mktemp("model"), 2)
    yield started
    for worker in started:
        worker.close()


def test_workers_are_processes_of_their_own_that_generate_at_once(pair):
    assert len({w.pid for w in pair} | {os.getpid()}) == 3 and all(w.alive for w in pair)
    start = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda w: list(w.stream([10], 30)), pair))
    assert got == [list(range(11, 41))] * 2
    assert time.monotonic() - start < 0.3 * 2 * 0.9  # 30 tokens of 10 ms each, both at once


def test_a_stream_closed_early_is_cancelled_and_the_next_request_starts_clean(pair):
    tokens = pair[0].stream([100], 500)
    assert [next(tokens) for _ in range(3)] == [101, 102, 103]
    started = time.monotonic()
    tokens.close()
    assert time.monotonic() - started < 1.0  # not the other 497 tokens
    assert list(pair[0].stream([5], 3, stop_ids={8})) == [6, 7]


def test_a_failing_request_fails_alone(pair):
    with pytest.raises(RuntimeError, match="negative temperature"):
        list(pair[1].stream([1], 4, temperature=-1.0))
    assert list(pair[1].stream([1], 2)) == [2, 3] and pair[1].alive


def test_a_model_that_cannot_load_refuses_to_start(tmp_path):
    with pytest.raises(RuntimeError, match="could not load the model: FileNotFoundError"):
        workers.start("fake_runtimes:Broken", tmp_path, 2)


def test_a_killed_worker_fails_its_request_and_the_server_is_not_alive(tmp_path):
    import signal

    class Main:  # the server's own runtime: tokenizing and decoding only
        name = "counting"

        def decode(self, ids):
            return " ".join(map(str, ids))

    worker = workers.GenerationProcess(COUNTING, tmp_path)
    scheduler = Scheduler(Main(), Metrics(), parallel=1, generators=[worker])
    scheduler.start()
    try:
        events = []
        job = Job("completions", [1], 1000, emit=events.append)
        scheduler.submit(job)
        time.sleep(0.2)
        os.kill(worker.pid, signal.SIGKILL)
        assert job.finished.wait(10)
        assert events[-1][0] == "error" and "worker process exited" in events[-1][1]
        assert not scheduler.alive  # /health answers 503
    finally:
        scheduler.close()
