"""Fidelity and cost of two load generators against the test server's truth: GuideLLM and llmopt's client.

Both measure the same points of the test server (tests/test_bench_fakeserver.py: known TTFT of 30 to
150 ms, ITL of 10 to 40 ms with a 3x stall every 5th gap), one after the other, each in its own
process; the server's own record of every request is the truth. For each point and metric (TTFT,
TPOT, ITL, end-to-end), the row gives the percentile (p50, p90, p95, p99) furthest from the truth,
as a share of the bound max(2% of the truth, 1 ms): over 1.00 breaks the bound. GuideLLM's ITL is
taken as it reports it (each request's mean gap, repeated for each of its gaps; its records hold
no per-chunk times); its first `concurrency` requests are left out as warm-up, as llmopt's are.

GuideLLM lives in its own environment (it needs torch, transformers, datasets and click~=8.4):

    python -m venv /tmp/glvenv && /tmp/glvenv/bin/pip install /path/to/torch-cpu.whl guidellm==0.8.1
    .venv/bin/python benchmarks/bench_client.py --guidellm /tmp/glvenv/bin/guidellm --tokenizer TOKENIZER_DIR

Prints one JSON line per run, then a table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from test_bench_fakeserver import Running  # noqa: E402

N_OUT = 20


def judge(pairs: list[tuple[dict, dict]]) -> dict:
    """pairs of (measured: ttft_s, e2e_s, tokens, gaps_s; truth record) -> metric: (ratio, percentile, error ms)."""
    m = {k: [] for k in ("ttft", "tpot", "itl", "e2e")}
    t = {k: [] for k in m}
    for got, rec in pairs:
        tt, te = rec["sent"][0] - rec["arrived"], rec["sent"][-1] - rec["arrived"]
        m["ttft"].append(got["ttft"] * 1e3)
        m["e2e"].append(got["e2e"] * 1e3)
        m["tpot"].append((got["e2e"] - got["ttft"]) / (got["tokens"] - 1) * 1e3)
        m["itl"] += [g * 1e3 for g in got["gaps"]]
        t["ttft"].append(tt * 1e3)
        t["e2e"].append(te * 1e3)
        t["tpot"].append((te - tt) / (len(rec["sent"]) - 1) * 1e3)
        t["itl"] += [(b - a) * 1e3 for a, b in zip(rec["sent"], rec["sent"][1:])]
    out = {}
    for k in m:
        worst = (0.0, None, 0.0)
        for q in (50, 90, 95, 99):
            pm, pt = np.percentile(m[k], q), np.percentile(t[k], q)
            ratio = abs(pm - pt) / max(0.02 * pt, 1.0)
            worst = max(worst, (round(float(ratio), 2), f"p{q}", round(float(pm - pt), 2)), key=lambda w: w[0])
        out[k] = worst
    return out


def run_guidellm(exe: str, tokenizer: str, server: Running, kind: str, value: float, n: int) -> dict:
    skip = int(value) if kind == "concurrency" else 4
    profile = f"kind=concurrent,streams={int(value)}" if kind == "concurrency" else f"kind=poisson,rate={value}"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        start = time.monotonic()
        proc = subprocess.run(
            ["/usr/bin/time", "-f", "%U %S", exe, "run", "--backend",
             f"kind=openai_http,target={server.url},model=fake-model,request_format=/v1/completions",
             "--data", f"kind=synthetic_text,prompt_tokens=32,output_tokens={N_OUT}",
             "--tokenizer", f"kind=hf_auto,model={tokenizer}", "--profile", profile,
             "--constraint", f"kind=max_requests,count={n + skip}", "--output", f"kind=json,path={out}",
             "--disable-console"], capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
        wall = time.monotonic() - start
        user, system = map(float, proc.stderr.strip().splitlines()[-1].split())
        bench = json.loads(out.read_text())["benchmarks"][0]
    truth = server.truth()
    done = sorted(bench["requests"]["successful"], key=lambda r: r["info"]["timings"]["request_start"])[skip:]
    pairs = []
    for r in done:
        t = r["info"]["timings"]
        n_tok = t["token_iterations"]
        mean_gap = (t["last_token_iteration"] - t["first_token_iteration"]) / (n_tok - 1)
        pairs.append(({"ttft": t["first_token_iteration"] - t["request_start"],
                       "e2e": t["last_token_iteration"] - t["request_start"], "tokens": n_tok,
                       "gaps": [mean_gap] * (n_tok - 1)}, truth[r["response_id"]]))
    return {"worst": judge(pairs), "cpu_s": round(user + system, 2), "wall_s": round(wall, 1), "n": len(pairs)}


def run_llmopt(server: Running, kind: str, value: float, n: int) -> dict:
    code = f"""
import json, os, sys
sys.path.insert(0, {str(ROOT)!r})
from llmopt.bench import client
body = json.dumps({{"model": "fake-model", "prompt": "hi", "max_tokens": {N_OUT}, "stream": True,
                   "stream_options": {{"include_usage": True}}}}).encode()
warm = max(4, int({value})) if {kind!r} == "concurrency" else 4
got = client.run({server.url!r} + "/v1/completions", {kind!r}, {value}, [body] * {n}, [body] * warm, 120)
t = os.times()
print(json.dumps({{"cpu_s": t.user + t.system, "records": [
    {{"id": r.id, "ttft": r.chunks[0] - r.sent, "e2e": r.chunks[-1] - r.sent, "tokens": len(r.chunks),
      "gaps": [b - a for a, b in zip(r.chunks, r.chunks[1:])]}} for r in got["records"]]}}))
"""
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    wall = time.monotonic() - start
    got, truth = json.loads(proc.stdout), server.truth()
    pairs = [(r, truth[r["id"]]) for r in got["records"]]
    return {"worst": judge(pairs), "cpu_s": round(got["cpu_s"], 2), "wall_s": round(wall, 1), "n": len(pairs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--guidellm", required=True, help="the guidellm program of its own environment")
    parser.add_argument("--tokenizer", required=True, help="a local tokenizer folder for GuideLLM's synthetic data")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--requests", type=int, default=160)
    args = parser.parse_args()
    rows = []
    for kind, value in (("concurrency", 16), ("rate", 20.0)):
        for repeat in range(args.repeats):
            for tool in ("guidellm", "llmopt"):
                with Running() as server:
                    got = (run_guidellm(args.guidellm, args.tokenizer, server, kind, value, args.requests)
                           if tool == "guidellm" else run_llmopt(server, kind, value, args.requests))
                row = {"tool": tool, "point": f"{kind}={value:g}", "repeat": repeat, **got}
                print(json.dumps(row), flush=True)
                rows.append(row)
    print("\n| client | point | n | CPU s | wall s | TTFT | TPOT | ITL | E2E |\n|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        cells = [f"{r['worst'][k][0]:.2f} ({r['worst'][k][1]} {r['worst'][k][2]:+.2f} ms)" for k in ("ttft", "tpot", "itl", "e2e")]
        print(f"| {r['tool']} | {r['point']} | {r['n']} | {r['cpu_s']} | {r['wall_s']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
