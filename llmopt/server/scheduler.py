"""The generation workers: ``parallel`` threads serve queued jobs, one job each at a time.

Every runtime call happens on a worker thread: generation, and the request handlers'
tokenization and scoring too (``call``), which a worker runs between two tokens of the
generation in progress. One worker (the default) serves every runtime. With several,
worker ``i`` generates through ``generators[i]``: a process of its own with its own copy
of the model (llmopt/server/workers.py), so that requests really compute at once; a
runtime that is safe to share between threads and leaves the interpreter free while it
computes (``concurrent = True``) may instead serve every worker itself. At most
``max_queue`` jobs wait while the workers generate; ``submit`` raises QueueFull beyond
that (HTTP 429). A cancelled job (its client went away) leaves the queue at once, or
stops generating after the token in progress.
"""

from __future__ import annotations

import collections
import logging
from concurrent.futures import Future
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from llmopt.catalog.engines import SWEEP_QUEUE
from llmopt.server.metrics import Metrics
from llmopt.server.text import TextStream

log = logging.getLogger("llmopt.server")


class QueueFull(Exception):
    pass


@dataclass(eq=False)
class Job:
    """One generation request. ``emit`` receives, on the worker thread, ("text", delta,
    completion_tokens so far), then ("done", finish_reason, completion_tokens) or ("error", message).
    ``tokens`` collects the generated token ids, the stop id that ended the generation included (counted
    in ``completion_tokens`` and scored, as vLLM counts and scores it; never in the text)."""

    endpoint: str
    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    top_k: int = 0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    ignore_eos: bool = False
    tokens: list[int] = field(default_factory=list)
    emit: Callable[[tuple], None] = lambda event: None
    arrived: float = field(default_factory=time.monotonic)
    cancelled: threading.Event = field(default_factory=threading.Event)
    finished: threading.Event = field(default_factory=threading.Event)
    completion_tokens: int = 0
    scored: bool = False  # its answer scores the generated tokens (logprobs): the stop id must be the one met


class Scheduler:
    def __init__(self, runtime, metrics: Metrics, max_queue: int = SWEEP_QUEUE, parallel: int = 1,
                 generators: list | None = None):
        if generators is not None and len(generators) != parallel:
            raise ValueError(f"{len(generators)} generators for {parallel} workers")
        if parallel > 1 and generators is None and not getattr(runtime, "concurrent", False):
            raise ValueError(f"the {runtime.name} runtime generates one request at a time: parallel must be 1, "
                             "or give each worker a generator of its own")
        self.runtime = runtime
        self.metrics = metrics
        self.max_queue = max_queue
        self.parallel = parallel
        self.generators = list(generators) if generators is not None else [runtime] * parallel
        self.scheduler = "processes" if generators is not None else "threads" if parallel > 1 else "single"
        self._cond = threading.Condition()
        self._calls: collections.deque[tuple] = collections.deque()
        self._waiting: collections.deque[Job] = collections.deque()
        self._running: set[Job] = set()
        self._closing = False
        self._threads: list[threading.Thread] = []

    @property
    def alive(self) -> bool:
        return (bool(self._threads) and all(t.is_alive() for t in self._threads)
                and all(getattr(g, "alive", True) for g in self.generators))

    def call(self, fn, *args) -> Future:
        """Run ``fn(*args)`` (tokenization, templating) on the worker thread, soon: between two
        tokens when a job is generating. Await it with ``asyncio.wrap_future``."""
        future: Future = Future()
        with self._cond:
            if self._closing:
                future.set_exception(RuntimeError("the server is shutting down"))
                return future
            self._calls.append((fn, args, future))
            self._cond.notify()
        return future

    def start(self) -> None:
        self._threads = [threading.Thread(target=self._loop, args=(generator,), name=f"llmopt-generate-{i}",
                                          daemon=True) for i, generator in enumerate(self.generators)]
        for thread in self._threads:
            thread.start()

    def close(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._closing = True
            for job in self._waiting:
                job.cancelled.set()
                _send(job, ("error", "the server is shutting down"))
            for _, _, future in self._calls:
                if future.set_running_or_notify_cancel():
                    future.set_exception(RuntimeError("the server is shutting down"))
            self._calls.clear()
            for job in self._running:
                job.cancelled.set()
            self._cond.notify_all()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(deadline - time.monotonic(), 0))
        for generator in self.generators:
            if generator is not self.runtime and hasattr(generator, "close"):
                generator.close()

    def submit(self, job: Job) -> None:
        with self._cond:
            if self._closing or len(self._waiting) >= self.max_queue:
                raise QueueFull(f"{len(self._waiting)} requests are waiting, the most this server queues "
                                f"(llmopt serve --max-queue {self.max_queue}; a client that keeps N requests in "
                                f"flight needs --max-queue N - {self.parallel} or more)")
            self._waiting.append(job)
            self._publish()
            self._cond.notify()

    def cancel(self, job: Job) -> None:
        """Stop a job: drop it from the queue, or end its generation after the current token."""
        if job.finished.is_set():
            return
        job.cancelled.set()
        with self._cond:
            if job in self._waiting:
                self._waiting.remove(job)
                self._publish()
                job.finished.set()
                self.metrics.finished(job.endpoint, "cancelled", 0, 0)

    def _publish(self) -> None:
        self.metrics.queue(len(self._waiting), len(self._running))

    def _run_calls(self) -> None:
        """Run the calls waiting now; with several workers, each call on whichever takes it first."""
        while True:
            with self._cond:
                if not self._calls:
                    return
                fn, args, future = self._calls.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except Exception as exc:  # handed to the awaiting handler
                future.set_exception(exc)

    def _loop(self, generator) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._calls and not self._closing:
                    self._cond.wait()
                if self._closing:
                    return
            self._run_calls()
            with self._cond:
                if not self._waiting:
                    continue
                job = self._waiting.popleft()
                self._running.add(job)
                self._publish()
            try:
                self._generate(job, generator)
            finally:
                with self._cond:
                    self._running.discard(job)
                    self._publish()
                job.finished.set()

    def _generate(self, job: Job, generator) -> None:
        self.metrics.observe(self.metrics.queue_wait, time.monotonic() - job.arrived)
        text = TextStream(self.runtime.decode, job.stop, job.min_tokens)
        tokens, finish, first_at = None, None, None
        try:
            tokens = token_stream(generator, job)
            while not job.cancelled.is_set():
                try:
                    token = next(tokens)
                except StopIteration as end:
                    if end.value is not None:  # the stop id that ended it: generated and counted, not in the text
                        first_at = self._first(job, first_at)
                        job.completion_tokens += 1
                        job.tokens.append(int(end.value))
                    finish = "stop" if end.value is not None or job.completion_tokens < job.max_tokens else "length"
                    break
                job.completion_tokens += 1
                job.tokens.append(token)
                delta, stopped = text.add(token)
                first_at = self._first(job, first_at)
                if delta:
                    _send(job, ("text", delta, job.completion_tokens))
                self._run_calls()
                if stopped:
                    finish = "stop"
                    break
        except Exception as exc:  # a runtime failure ends this request, not the server
            log.exception("generation failed")
            self.metrics.finished(job.endpoint, "error", len(job.prompt_ids), job.completion_tokens)
            _send(job, ("error", f"generation failed: {type(exc).__name__}: {exc}"))
            return
        finally:
            if hasattr(tokens, "close"):
                tokens.close()
        self._finish(job, finish, text, first_at)

    def _first(self, job: Job, first_at: float | None) -> float:
        """When the first token came (now, for the first one: observed as the TTFT)."""
        if first_at is None:
            first_at = time.monotonic()
            self.metrics.observe(self.metrics.ttft, first_at - job.arrived)
        return first_at

    def _finish(self, job: Job, finish: str | None, text: TextStream, first_at: float | None) -> None:
        now = time.monotonic()
        if finish is None:
            self.metrics.finished(job.endpoint, "cancelled", len(job.prompt_ids), job.completion_tokens)
            _send(job, ("done", "cancelled", job.completion_tokens))
            return
        rest = text.flush()
        if rest:
            _send(job, ("text", rest, job.completion_tokens))
        if first_at is not None and job.completion_tokens > 1:
            self.metrics.observe(self.metrics.tpot, (now - first_at) / (job.completion_tokens - 1))
        self.metrics.finished(job.endpoint, "ok", len(job.prompt_ids), job.completion_tokens, now - job.arrived)
        _send(job, ("done", finish, job.completion_tokens))


def token_stream(runtime, job: Job):
    """The runtime's token iterator for a job (``stream``; ``generate`` for a runtime without it,
    which can only be greedy and cannot stop early). ``ignore_eos``: no stop ids at all."""
    if hasattr(runtime, "stream"):
        options = {"temperature": job.temperature, "top_p": job.top_p, "seed": job.seed}
        sampling = {"top_k": job.top_k, "repetition_penalty": job.repetition_penalty, "min_new_tokens": job.min_tokens}
        options.update({k: v for k, v in sampling.items() if v != PLAIN[k]})  # a runtime may predate them
        return iter(runtime.stream(job.prompt_ids, job.max_tokens, set() if job.ignore_eos else None, **options))
    if needs_stream(job):
        raise ValueError(f"the {runtime.name} runtime can only generate greedily: pass temperature 0")
    return iter(runtime.generate(job.prompt_ids, job.max_tokens))


PLAIN = {"top_k": 0, "repetition_penalty": 1.0, "min_new_tokens": 0}


def needs_stream(job: Job) -> bool:
    """Whether the job asks for more than greedy decoding to the end-of-sequence token."""
    return job.temperature > 0 or job.repetition_penalty != 1.0 or job.min_tokens > 0 or job.ignore_eos


def _send(job: Job, event: tuple) -> None:
    try:
        job.emit(event)
    except RuntimeError:  # the event loop has closed: the server is shutting down
        job.cancelled.set()
