"""Server metrics in the Prometheus text exposition format (version 0.0.4).

Counters of requests by endpoint and outcome and of prompt / generated tokens,
gauges of the queue, and histograms of queue wait, time to first token, time per
output token, request latency and the batching engine's sequences per step.
Thread-safe: the worker thread and the event loop both record.
"""

from __future__ import annotations

import math
import threading

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
ENDPOINTS = ("completions", "chat")
# ok: answered in full; cancelled: the client went away; the rest answered with an HTTP error
STATUSES = ("ok", "cancelled", "invalid", "not_found", "queue_full", "error")
SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, math.inf)
BATCH = (1, 2, 4, 8, 16, 32, 64, 128, 256, math.inf)
TOKEN_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, math.inf)


class Histogram:
    def __init__(self, name: str, help_text: str, buckets: tuple[float, ...] = SECONDS):
        self.name, self.help, self.buckets = name, help_text, buckets
        self.counts = [0] * len(buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
                break
        self.sum += value
        self.count += 1

    def lines(self) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        running = 0
        for bound, n in zip(self.buckets, self.counts):
            running += n
            out.append(f'{self.name}_bucket{{le="{_number(bound)}"}} {running}')
        out += [f"{self.name}_sum {_number(self.sum)}", f"{self.name}_count {self.count}"]
        return out


class Metrics:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = {(e, s): 0 for e in ENDPOINTS for s in STATUSES}
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.waiting = 0
        self.running = 0
        self.scheduler: dict[str, str] = {}  # labels of llmopt_scheduler_info: which scheduler generates
        self.queue_wait = Histogram("llmopt_queue_wait_seconds", "Time from arrival to the start of generation.")
        self.ttft = Histogram("llmopt_time_to_first_token_seconds", "Time from arrival to the first generated token.")
        self.tpot = Histogram("llmopt_time_per_output_token_seconds",
                              "Mean time between generated tokens after the first, per request.", TOKEN_SECONDS)
        self.latency = Histogram("llmopt_request_latency_seconds", "Time from arrival to the last token, "
                                 "for requests answered in full.")
        self.batch = Histogram("llmopt_batch_size", "Sequences in each step of the batching engine (--max-num-seqs).",
                               BATCH)

    def count(self, endpoint: str, status: str) -> None:
        with self.lock:
            self.requests[(endpoint, status)] = self.requests.get((endpoint, status), 0) + 1

    def observe(self, histogram: Histogram, value: float) -> None:
        with self.lock:
            histogram.observe(value)

    def queue(self, waiting: int, running: int) -> None:
        with self.lock:
            self.waiting, self.running = waiting, running

    def finished(self, endpoint: str, status: str, prompt_tokens: int, generated: int,
                 latency: float | None = None) -> None:
        with self.lock:
            self.requests[(endpoint, status)] = self.requests.get((endpoint, status), 0) + 1
            self.prompt_tokens += prompt_tokens
            self.generation_tokens += generated
            if latency is not None:
                self.latency.observe(latency)

    def render(self) -> str:
        with self.lock:
            out = ["# HELP llmopt_requests_total Generation requests by endpoint and outcome.",
                   "# TYPE llmopt_requests_total counter"]
            out += [f'llmopt_requests_total{{endpoint="{e}",status="{s}"}} {n}'
                    for (e, s), n in sorted(self.requests.items())]
            out += _single("llmopt_prompt_tokens_total", "counter", "Prompt tokens of requests that ran.",
                           self.prompt_tokens)
            out += _single("llmopt_generation_tokens_total", "counter", "Tokens generated, cancelled requests included.",
                           self.generation_tokens)
            out += _single("llmopt_queue_depth", "gauge", "Requests waiting for the generation worker.", self.waiting)
            out += _single("llmopt_requests_running", "gauge", "Requests being generated.", self.running)
            if self.scheduler:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(self.scheduler.items()))
                out += ["# HELP llmopt_scheduler_info The scheduler generating: single, processes (--parallel), "
                        "engine-static or engine-dynamic (--max-num-seqs).", "# TYPE llmopt_scheduler_info gauge",
                        f"llmopt_scheduler_info{{{labels}}} 1"]
            for histogram in (self.queue_wait, self.ttft, self.tpot, self.latency, self.batch):
                out += histogram.lines()
        return "\n".join(out) + "\n"


def _single(name: str, kind: str, help_text: str, value: float) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {_number(value)}"]


def _number(value: float) -> str:
    if value == math.inf:
        return "+Inf"
    return repr(float(value)) if isinstance(value, float) else str(value)
