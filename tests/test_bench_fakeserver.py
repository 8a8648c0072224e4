"""A test server for llmopt bench: OpenAI-compatible streaming with injected, known delays.

Run as a program (``python tests/test_bench_fakeserver.py --port 0``) it prints ``listening PORT``
and serves until killed. Request i (in arrival order) waits ``ttft_ms(i)`` before its first token,
then ``itl_ms(i)`` between tokens, every 5th gap ``STALL`` times longer (as when an engine runs
another request's prefill); it sends ``max_tokens`` tokens, one per chunk. Deadlines are absolute,
so lateness does not accumulate. The server stamps (CLOCK_MONOTONIC, the clock of the client's
``perf_counter`` on Linux) when each request's body was read, when each chunk and the end of the
stream were written: ``GET /truth`` returns those records, the truth the fidelity test holds the
client's figures to. Raw asyncio, one process, no dependency.

The tests in this file check the server itself: its delays are what it says they are.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

STALL = 3.0


def ttft_ms(i: int) -> float:
    """30 to 150 ms, spread evenly over requests (a continuous spread keeps percentiles meaningful)."""
    return 30.0 + (i * 37 % 101) / 100 * 120.0


def itl_ms(i: int) -> float:
    """10 to 40 ms."""
    return 10.0 + (i * 53 % 97) / 96 * 30.0


class FakeServer:
    def __init__(self, owned_by: str = "fake", max_inflight: int | None = None):
        self.owned_by, self.max_inflight = owned_by, max_inflight
        self.records: list[dict] = []
        self.n = self.inflight = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
                body = await reader.readexactly(int(headers.get("content-length", 0)))
                arrived = time.monotonic()
                if method == "GET":
                    await self.get(path, writer)
                else:
                    await self.post(path, json.loads(body or b"{}"), writer, arrived)
                if headers.get("connection", "").lower() == "close":
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def get(self, path: str, writer) -> None:
        if path.startswith("/truth"):
            payload = {"records": self.records}
        elif path.startswith("/v1/models"):
            payload = {"object": "list", "data": [{"id": "fake-model", "object": "model", "created": 0,
                                                   "owned_by": self.owned_by, "max_model_len": 4096}]}
        else:
            payload = {"status": "ok"}
        await self.send_json(writer, 200, payload)

    @staticmethod
    async def send_json(writer, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        reason = {200: "OK", 429: "Too Many Requests"}.get(status, "Error")
        writer.write(f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(data)}"
                     f"\r\n\r\n".encode() + data)
        await writer.drain()

    async def post(self, path: str, req: dict, writer, arrived: float) -> None:
        if self.max_inflight is not None and self.inflight >= self.max_inflight:
            await self.send_json(writer, 429, {"error": {"message": "busy", "type": "rate_limit_exceeded"}})
            return
        i, self.n = self.n, self.n + 1
        self.inflight += 1
        try:
            await self.stream(i, path, req, writer, arrived)
        finally:
            self.inflight -= 1

    async def stream(self, i: int, path: str, req: dict, writer, arrived: float) -> None:
        n_out = int(req.get("max_tokens") or 16)
        chat, sent = "chat" in path, []
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        due = arrived + ttft_ms(i) / 1e3
        for k in range(n_out):
            due += 0.0 if k == 0 else itl_ms(i) / 1e3 * (STALL if k % 5 == 0 else 1.0)
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            choice = {"index": 0, "delta": {"content": f" t{k}"}} if chat else {"index": 0, "text": f" t{k}"}
            choice["finish_reason"] = "length" if k == n_out - 1 else None
            self.chunk(writer, {"id": f"r{i}", "object": "chunk", "created": 0, "model": "fake-model",
                                "choices": [choice]})
            sent.append(time.monotonic())
            await writer.drain()
        if (req.get("stream_options") or {}).get("include_usage"):
            prompt = req.get("prompt")
            self.chunk(writer, {"id": f"r{i}", "choices": [], "usage": {
                "prompt_tokens": len(prompt) if isinstance(prompt, list) else 8, "completion_tokens": n_out,
                "total_tokens": n_out + (len(prompt) if isinstance(prompt, list) else 8)}})
        writer.write(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
        await writer.drain()
        self.records.append({"id": f"r{i}", "arrived": arrived, "sent": sent, "done": time.monotonic(),
                             "ttft_ms": ttft_ms(i), "itl_ms": itl_ms(i), "keys": sorted(req),
                             "stream_options": req.get("stream_options"), "max_tokens": n_out,
                             "prompt": req.get("prompt"), "messages": req.get("messages")})

    @staticmethod
    def chunk(writer, payload: dict) -> None:
        data = b"data: " + json.dumps(payload).encode() + b"\n\n"
        writer.write(b"%x\r\n" % len(data) + data + b"\r\n")


async def serve(port: int, owned_by: str, max_inflight: int | None) -> None:
    server = await asyncio.start_server(FakeServer(owned_by, max_inflight).handle, "127.0.0.1", port)
    print(f"listening {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)  # the last --port wins, as in the engines' parsers
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--owned-by", default="fake")
    parser.add_argument("--max-inflight", type=int, default=None)
    parser.add_argument("--child-pid-file", default=None, help="start a child process (as an engine's worker) here")
    args, _ = parser.parse_known_args(argv)
    if args.child_pid_file:
        child = subprocess.Popen(["sleep", "300"])
        Path(args.child_pid_file).write_text(str(child.pid))
    asyncio.run(serve(args.port, args.owned_by, args.max_inflight))


class Running:
    """The fake server as a process, for a test: ``url``, ``truth()``, stopped on exit."""

    def __init__(self, *args: str):
        self.proc = subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        assert line.startswith("listening"), line
        self.url = f"http://127.0.0.1:{line.split()[1]}"

    def truth(self) -> dict[str, dict]:
        with urllib.request.urlopen(f"{self.url}/truth") as resp:
            return {r["id"]: r for r in json.loads(resp.read())["records"]}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:  # a zombie is not alive
        return fh.read().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture
def fake_server():
    with Running() as server:
        yield server


def test_delays_are_the_injected_ones(fake_server):
    body = json.dumps({"prompt": "hi", "max_tokens": 11, "stream": True}).encode()
    for _ in range(2):
        req = urllib.request.Request(f"{fake_server.url}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req) as resp:
            text = resp.read().decode()
        assert text.count("data: ") == 12 and text.rstrip().endswith("data: [DONE]")
    for i, rec in enumerate(fake_server.truth().values()):  # never early; late by what a loaded machine adds
        ttft, last = (rec["sent"][0] - rec["arrived"]) * 1e3, (rec["sent"][-1] - rec["arrived"]) * 1e3
        assert ttft_ms(i) - 0.1 <= ttft <= ttft_ms(i) + 25
        due = ttft_ms(i) + itl_ms(i) * (10 + 2 * (STALL - 1))  # gaps 5 and 10 stall
        assert due - 0.1 <= last <= due + 25


def test_spread_of_delays():
    ttfts, itls = [ttft_ms(i) for i in range(101)], [itl_ms(i) for i in range(97)]
    assert min(ttfts) == 30 and max(ttfts) == 150 and len(set(ttfts)) == 101
    assert min(itls) == 10 and max(itls) == 40 and len(set(itls)) == 97


if __name__ == "__main__":
    main(sys.argv[1:])
