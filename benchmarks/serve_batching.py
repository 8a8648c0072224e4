"""Output tokens per second of `llmopt serve` at concurrency 1, 2 and 4: batched (--max-num-seqs) against
one request at a time and against worker processes (--parallel).

Each server mode is started as its own `llmopt serve` process over MODEL (an ONNX folder or an artifact:
the quickstart's, or what `llmopt run recipes/gguf-onnx-cpu.toml` writes); at each concurrency, that many
clients each send ROUNDS greedy completions of PROMPT token ids and exactly OUTPUT tokens (`ignore_eos`;
a list of lengths cycles over the requests), after one warm-up request (text: then the server has opened
its tokenizer, which otherwise loads in the background during the first point, on the CPU the measured
requests need). A row: output tok/s over the point's wall time, the server's CPU seconds (its process and
its worker processes) per output token, and the mean time per output token the clients saw.

    .venv/bin/python benchmarks/serve_batching.py artifacts/quickstart --output 64 --rounds 3

The peer: with --llama-server (llama.cpp's own server binary) and --gguf (the GGUF file the artifact was
made from), the mode `llama.cpp` starts `llama-server -m GGUF` with --llama-slots (4) parallel slots
(continuous batching over one copy of the model) and --llama-threads (all CPUs) threads, and the same client
measures it the same way (token-id prompts, `ignore_eos`, greedy, through /v1/completions).

    .venv/bin/python benchmarks/serve_batching.py artifacts/gguf-onnx-cpu --llama-server BIN --gguf FILE \
        --modes "single,parallel 2,max-num-seqs 4,llama.cpp"

Prints one JSON line per point, then a table. On a shared machine the figures move with the other work:
run it twice and compare.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

MODES = {"single": [], "parallel 2": ["--parallel", "2"], "max-num-seqs 4": ["--max-num-seqs", "4"],
         "max-num-seqs 4 len 512": ["--max-num-seqs", "4", "--max-model-len", "512"]}


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and of its children, living and reaped."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    pids = [pid] + [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    for p in pids:
        fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        total += sum(int(fields[i]) for i in (11, 12, 13, 14)) / tick  # utime stime cutime cstime
    return total


def start(model: str, port: int, flags: list[str], argv: list[str] | None = None) -> subprocess.Popen:
    argv = argv or [sys.executable, "-m", "llmopt.cli.main", "serve", model, "--port", str(port), "--max-queue", "64",
                    *flags]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited: {proc.stderr.read()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("the server did not start in 300 s")


def one(base: str, prompt: list[int] | str, output: int) -> tuple[int, float]:
    started = time.perf_counter()
    answer = httpx.post(base + "/v1/completions", timeout=600, json={
        "prompt": prompt, "max_tokens": output, "temperature": 0, "ignore_eos": True}).json()
    return answer["usage"]["completion_tokens"], time.perf_counter() - started


def point(base: str, pid: int, concurrency: int, rounds: int, prompt: list[int], outputs: list[int]) -> dict:
    cpu, started = cpu_seconds(pid), time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        done = list(pool.map(lambda i: one(base, prompt, outputs[i % len(outputs)]), range(concurrency * rounds)))
    wall, cpu = time.perf_counter() - started, cpu_seconds(pid) - cpu
    tokens = sum(n for n, _ in done)
    return {"concurrency": concurrency, "requests": len(done), "output_tokens": tokens, "wall_s": round(wall, 2),
            "output_tok_s": round(tokens / wall, 1), "cpu_ms_per_token": round(1000 * cpu / tokens, 2),
            "client_ms_per_token": round(1000 * sum(s for _, s in done) / tokens, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--prompt", type=int, default=64, help="prompt tokens")
    parser.add_argument("--output", default="64", help="output tokens per request; a list (8,64) cycles over "
                        "the requests: lengths that differ, where a static batch waits for its longest")
    parser.add_argument("--rounds", type=int, default=3, help="requests per client at each concurrency")
    parser.add_argument("--concurrency", default="1,2,4")
    parser.add_argument("--modes", default=",".join(MODES), help=f"of: {', '.join(MODES)}, llama.cpp")
    parser.add_argument("--port", type=int, default=8731)
    parser.add_argument("--llama-server", help="llama.cpp's llama-server binary (the mode llama.cpp)")
    parser.add_argument("--gguf", help="the GGUF file llama-server serves")
    parser.add_argument("--llama-slots", type=int, default=4, help="llama-server --parallel")
    parser.add_argument("--llama-threads", type=int, default=os.cpu_count())
    args = parser.parse_args()
    prompt = [(7 * i + 11) % 300 + 20 for i in range(args.prompt)]
    rows = []
    for mode in args.modes.split(","):
        peer = None
        if mode == "llama.cpp":
            peer = [args.llama_server, "-m", args.gguf, "--port", str(args.port), "--parallel", str(args.llama_slots),
                    "--threads", str(args.llama_threads), "--ctx-size", str(4096 * args.llama_slots)]
        proc = start(args.model, args.port, MODES.get(mode, []), peer)
        base = f"http://127.0.0.1:{args.port}"
        try:
            one(base, "Warm up", 4)  # a text prompt waits for the tokenizer, which loads in the background
            for concurrency in (int(c) for c in args.concurrency.split(",")):
                outputs = [int(n) for n in args.output.split(",")]
                row = {"mode": mode, "output": args.output,
                       **point(base, proc.pid, concurrency, args.rounds, prompt, outputs)}
                print(json.dumps(row), flush=True)
                rows.append(row)
        finally:
            proc.terminate()
            proc.wait(60)
    print(f"\n{'mode':<16}{'conc':>5}{'tok/s':>9}{'CPU ms/tok':>12}{'client ms/tok':>15}")
    for r in rows:
        print(f"{r['mode']:<16}{r['concurrency']:>5}{r['output_tok_s']:>9}{r['cpu_ms_per_token']:>12}"
              f"{r['client_ms_per_token']:>15}")


if __name__ == "__main__":
    main()
