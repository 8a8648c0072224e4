"""The load generator: a small asyncio client that streams OpenAI-compatible completions.

Each request is one streamed POST (aiohttp, the ``bench`` extra); the client stamps every
chunk with ``time.perf_counter()`` as it is read, so TTFT, ITL, TPOT and end-to-end latency
come from the arrival times of the chunks that carry text. Bodies are encoded before the
clock starts. Two load shapes: a closed loop of ``concurrency`` workers, and an open loop of
Poisson arrivals. While a point runs, a monitor measures how late the event loop wakes up
(``loop_lag_ms``) and the process's CPU seconds: a client that is the bottleneck shows it
there (docs/bench.md, and the fidelity test in tests/test_bench_fidelity.py).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field

from llmopt import apikey
from llmopt.libraries import collector_paused, require

LAG_TICK_S = 0.005
JSON = {"Content-Type": "application/json"}


@dataclass
class Record:
    """One request as the client saw it; times are perf_counter seconds."""

    start: float  # when the client began the request
    scheduled: float | None = None  # open loop: when the request was due
    sent: float | None = None  # when its body was handed to the socket: TTFT and latency count from here
    chunks: list[float] = field(default_factory=list)  # arrival of each chunk with text
    end: float | None = None
    done: bool = False  # the stream finished ([DONE] or a finish_reason)
    prompt_tokens: int | None = None
    output_tokens: int | None = None  # from usage; else the chunk count
    error: str | None = None  # kind: http_429, timeout, connection, stream_error, no_tokens, incomplete
    message: str | None = None
    id: str | None = None
    warmup: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None

    def fail(self, kind: str, message: str = "") -> None:
        self.error, self.message = kind, message[:300]

    def to_dict(self, origin: float) -> dict:
        def rel(t):
            return None if t is None else round(t - origin, 6)

        return {"id": self.id, "start_s": rel(self.start), "scheduled_s": rel(self.scheduled), "sent_s": rel(self.sent),
                "end_s": rel(self.end),
                "chunks_s": [rel(t) for t in self.chunks], "prompt_tokens": self.prompt_tokens,
                "output_tokens": self.output_tokens, "error": self.error, "message": self.message,
                "warmup": self.warmup}


def text_of(choice: dict) -> str:
    delta = choice.get("delta")
    if delta is not None:
        return delta.get("content") or delta.get("reasoning_content") or ""
    return choice.get("text") or ""


def handle_event(rec: Record, data: bytes, now: float) -> None:
    if data == b"[DONE]":
        rec.done = True
        return
    try:
        obj = json.loads(data)
    except ValueError:
        rec.fail("stream_error", f"not JSON: {data[:120]!r}")
        return
    if "error" in obj:
        err = obj["error"]
        rec.fail("stream_error", err.get("message", str(err)) if isinstance(err, dict) else str(err))
        return
    rec.id = rec.id or obj.get("id")
    choices = obj.get("choices") or []
    if choices:
        if text_of(choices[0]):
            rec.chunks.append(now)
        if choices[0].get("finish_reason"):
            rec.done = True
    usage = obj.get("usage")
    if usage:
        rec.prompt_tokens = usage.get("prompt_tokens", rec.prompt_tokens)
        rec.output_tokens = usage.get("completion_tokens", rec.output_tokens)


async def send(session, url: str, body: bytes, rec: Record) -> Record:
    """POST one streamed request and fill ``rec`` as its chunks arrive."""
    import aiohttp

    buf = b""
    try:
        async with session.post(url, data=body, headers=JSON, trace_request_ctx=rec) as resp:
            if resp.status != 200:
                rec.fail(f"http_{resp.status}", (await resp.text())[:300])
                rec.end = time.perf_counter()
                return rec
            async for data in resp.content.iter_any():
                now = time.perf_counter()
                buf += data
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    line = line.strip()
                    if line.startswith(b"data:"):
                        handle_event(rec, line[5:].strip(), now)
                rec.end = now
    except asyncio.TimeoutError:
        rec.fail("timeout", "no complete answer within the request timeout")
    except aiohttp.ClientError as exc:
        rec.fail("connection", f"{type(exc).__name__}: {exc}")
    rec.end = rec.end or time.perf_counter()
    rec.sent = rec.sent or rec.start
    if rec.ok and not rec.chunks:
        rec.fail("no_tokens", "the stream carried no text")
    elif rec.ok and not rec.done:
        rec.fail("incomplete", "the stream ended before [DONE] or a finish_reason")
    if rec.ok and rec.output_tokens is None:
        rec.output_tokens = len(rec.chunks)
    return rec


class LagMonitor:
    """How late the event loop wakes from a short sleep: the client's own queueing delay."""

    def __init__(self):
        self.lags: list[tuple[float, float]] = []  # (when, how late)
        self._task = None

    async def _run(self):
        while True:
            due = time.perf_counter() + LAG_TICK_S
            await asyncio.sleep(LAG_TICK_S)
            now = time.perf_counter()
            self.lags.append((now, max(0.0, now - due)))

    def __enter__(self):
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc):
        self._task.cancel()


class Mark:
    """The client's clocks when the first measured (not warm-up) request starts."""

    def __init__(self):
        self.cpu = self.wall = None

    def hit(self) -> None:
        if self.wall is None:
            self.cpu, self.wall = time.process_time(), time.perf_counter()


async def _body_sent(session, ctx, params) -> None:
    ctx.trace_request_ctx.sent = time.perf_counter()


def session(timeout_s: float):
    """An HTTP session without a connection limit that stamps ``Record.sent`` when a body is written,
    so that the client's own queueing before the send (a burst of requests at the start of a
    closed loop) is not counted as the server's latency. Every request carries the key in
    ``LLMOPT_API_KEY`` as ``Authorization: Bearer``, when it is set."""
    aiohttp = require("aiohttp", "bench", "llmopt bench")
    trace = aiohttp.TraceConfig()
    trace.on_request_chunk_sent.append(_body_sent)
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s),
                                 read_bufsize=2**16, trace_configs=[trace], headers=apikey.headers())


async def closed_loop(http, url: str, items: list[tuple[bytes, bool]], concurrency: int, mark: Mark) -> list[Record]:
    """Send the (body, is warm-up) items in order with ``concurrency`` requests in flight: each worker sends its
    next when one ends, so the measured requests follow the warm-up ones without a pause (steady state)."""
    pending = list(reversed(items))
    records: list[Record] = []

    async def worker():
        while pending:
            body, warm = pending.pop()
            if not warm:
                mark.hit()
            rec = Record(start=time.perf_counter(), warmup=warm)
            records.append(await send(http, url, body, rec))

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(items)))))
    return records


async def open_loop(http, url: str, items: list[tuple[bytes, bool]], rate: float, seed: int, mark: Mark) -> list[Record]:
    """Send the items at Poisson arrivals of ``rate`` per second, whatever is still in flight."""
    rng = random.Random(seed)
    origin, due, tasks = time.perf_counter(), 0.0, []
    for body, warm in items:
        wait = origin + due - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        if not warm:
            mark.hit()
        rec = Record(start=time.perf_counter(), scheduled=origin + due, warmup=warm)
        tasks.append(asyncio.ensure_future(send(http, url, body, rec)))
        due += rng.expovariate(rate)
    return list(await asyncio.gather(*tasks))


async def run_point(url: str, kind: str, value: float, bodies: list[bytes], warmup: list[bytes], timeout_s: float,
                    seed: int) -> dict:
    """The warm-up requests, then at once the measured ones, in one stream of load; the measured records with
    the client's own costs from the first measured request on. The cyclic garbage collector is paused while
    the point runs (a collection is a pause of the event loop, which would show as latency)."""
    items = [(b, True) for b in warmup] + [(b, False) for b in bodies]
    mark = Mark()
    async with session(timeout_s) as http:
        with collector_paused(), LagMonitor() as lag:
            if kind == "concurrency":
                records = await closed_loop(http, url, items, int(value), mark)
            else:
                records = await open_loop(http, url, items, value, seed, mark)
            mark.hit()  # no measured request at all
            cpu, wall = time.process_time() - mark.cpu, time.perf_counter() - mark.wall
    return {"records": [r for r in records if not r.warmup], "warmup": [r for r in records if r.warmup],
            "client_cpu_s": cpu, "client_wall_s": wall, "loop_lag_s": [lag_s for t, lag_s in lag.lags if t >= mark.wall]}


def run(url: str, kind: str, value: float, bodies: list[bytes], warmup: list[bytes], timeout_s: float,
        seed: int = 0) -> dict:
    return asyncio.run(run_point(url, kind, value, bodies, warmup, timeout_s, seed))
