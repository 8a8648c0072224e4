"""Fidelity of llmopt bench's timings: every reported figure within 2% (or 1 ms) of the truth.

The test server (tests/test_bench_fakeserver.py, its own process) injects known delays, 30 to
150 ms before the first token and 10 to 40 ms between tokens with a 3x stall every 5th gap, and
records when it actually wrote each chunk. The truth of each request is the server's own
record: TTFT from reading the body to writing the first token, end-to-end to writing [DONE],
ITL every gap between two chunk writes, TPOT (end-to-end - TTFT) / (tokens - 1). At two
concurrencies and one Poisson rate, three things hold for each of the four:

- the report is the arithmetic of the client's own stamps (requests.jsonl), to the rounding;
- those stamps are the server's: the median of |client - server| over the samples is within
  max(2% of the truth's median, 1 ms), so a client that stamped late would fail;
- the reported mean, p50, p90, p95 and p99 are within max(2% of the truth, 1 ms, the p99 of how
  late the client's event loop woke at that point), so one that lost chunks or averaged the gaps
  (as GuideLLM's ITL does, docs/results/serving.md) would fail.

The third bound's last term is the machine's own scheduling noise, which llmopt bench reports
with every point: a process that waits for a core stamps late whatever its code. On a quiet
machine it is about 1.5 ms and 2% or 1 ms decides; with other work on the cores (the suite runs
two workers) it was 5 to 6 ms, one sample in four was off by more than 2% or 1 ms, and a p90 once
moved 2.4% (CI, 55.54 ms against 56.89 ms). The client's own CPU share is reported and must be far
from a core: the client is not the bottleneck. Where the test may (as root), it runs the client
and the server at a raised CPU priority, which keeps that noise down.
"""

from __future__ import annotations

import contextlib
import json
import os

import numpy as np
import pytest

from test_bench_fakeserver import Running

from llmopt.bench import run_bench

FIGURES = ("mean", "p50", "p90", "p95", "p99")
N, N_OUT = 160, 8


def truth_rows(records: dict[str, dict], ids: list[str]) -> dict[str, list[float]]:
    out = {"ttft_ms": [], "tpot_ms": [], "itl_ms": [], "e2e_ms": []}
    for rid in ids:
        rec = records[rid]
        ttft, e2e = (rec["sent"][0] - rec["arrived"]) * 1e3, (rec["done"] - rec["arrived"]) * 1e3
        out["ttft_ms"].append(ttft)
        out["e2e_ms"].append(e2e)
        out["tpot_ms"].append((e2e - ttft) / (len(rec["sent"]) - 1))
        out["itl_ms"] += [(b - a) * 1e3 for a, b in zip(rec["sent"], rec["sent"][1:])]
    return out


def client_rows(rows: list[dict]) -> dict[str, list[float]]:
    """The same four from the client's own stamps, request by request in the order of ``rows``."""
    out = {"ttft_ms": [], "tpot_ms": [], "itl_ms": [], "e2e_ms": []}
    for row in rows:
        chunks = row["chunks_s"]
        ttft, e2e = (chunks[0] - row["sent_s"]) * 1e3, (row["end_s"] - row["sent_s"]) * 1e3
        out["ttft_ms"].append(ttft)
        out["e2e_ms"].append(e2e)
        out["tpot_ms"].append((e2e - ttft) / ((row["output_tokens"] or len(chunks)) - 1))
        out["itl_ms"] += [(b - a) * 1e3 for a, b in zip(chunks, chunks[1:])]
    return out


def figures(values: list[float]) -> dict[str, float]:
    return {"mean": float(np.mean(values)), **{f"p{q}": float(np.percentile(values, q)) for q in (50, 90, 95, 99)}}


@contextlib.contextmanager
def favoured(niceness: int = -10):
    """This process at a higher CPU priority while the block runs, where that is allowed (root): on a
    machine shared with other work, a process that waits for a core stamps late, whatever its code."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, niceness)
    except PermissionError:
        yield False
        return
    try:
        yield True
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, before)


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    out = tmp_path_factory.mktemp("fidelity")
    with favoured(), Running() as server:  # the server inherits the priority
        result = run_bench(server.url, {"input_len": 8, "output_len": N_OUT}, {"ttft_p99_ms": 120, "tpot_p99_ms": 40},
                           {"concurrency": [8, 16], "rate": [30], "requests": N, "warmup": 4, "vocab_size": 1000,
                            "plots": False}, out)
        truth = server.truth()
    rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    return result, rows, truth


@pytest.mark.parametrize("index", [0, 1, 2], ids=["concurrency-8", "concurrency-16", "poisson-30"])
def test_percentiles_match_the_truth(measured, index):
    result, rows, truth = measured
    point = result["points"][index]
    mine = [r for r in rows if r["point"] == index and not r["warmup"]]
    assert point["requests"] == {"sent": N, "ok": N, "failed": 0} and len(mine) == N
    expected, stamped = truth_rows(truth, [r["id"] for r in mine]), client_rows(mine)
    noise = point["client"]["loop_lag_ms"]["p99"]
    problems = []
    for metric, values in expected.items():
        assert len(stamped[metric]) == len(values), metric  # no chunk lost or made up
        own, true = figures(stamped[metric]), figures(values)
        off = float(np.median(np.abs(np.subtract(stamped[metric], values))))
        if off > max(0.02 * true["p50"], 1.0):
            problems.append(f"{metric}: the client's stamps are {off:.2f} ms off the server's at the median")
        for name in FIGURES:
            got, want = point[metric][name], true[name]
            assert got == pytest.approx(own[name], abs=2e-3), (metric, name)  # the report is its stamps' arithmetic
            if abs(got - want) > max(0.02 * want, 1.0, noise):
                problems.append(f"{metric} {name}: measured {got:.2f} ms, truth {want:.2f} ms")
    assert not problems, f"{point['load']} (event loop p99 lag {noise} ms): " + "; ".join(problems)


def test_goodput_counts_requests_within_every_bound(measured):
    result, rows, truth = measured
    for index, point in enumerate(result["points"]):
        ids = [r["id"] for r in rows if r["point"] == index and not r["warmup"]]
        t = truth_rows(truth, ids)
        good = sum(a <= 120 and b <= 40 for a, b in zip(t["ttft_ms"], t["tpot_ms"]))
        assert abs(point["goodput"]["requests"] - good) <= 2  # requests within 1 ms of a bound may land either side
        assert point["goodput"]["requests_per_s"] == pytest.approx(point["goodput"]["requests"] / point["duration_s"],
                                                                    rel=1e-3)


def test_the_client_is_not_the_bottleneck(measured):
    result, _, _ = measured
    for point in result["points"]:
        client = point["client"]
        assert 0 < client["cpu_s"] and client["cpu_share_of_one_core"] < 0.5, client
        assert client["loop_lag_ms"]["p50"] < 5, client


def test_sent_fields_and_token_counts(measured):
    result, _, truth = measured
    assert result["client"]["sent"]["prompt"] == "token ids"
    assert all(r["keys"] == ["max_tokens", "model", "prompt", "stream", "stream_options", "temperature"]
               for r in truth.values())  # an unknown server gets no ignore_eos
    point = result["points"][0]
    assert point["output_tokens_mean"] == N_OUT and point["input_tokens_mean"] == 8
    assert point["output_throughput"] == pytest.approx(N_OUT * point["request_throughput"], rel=1e-3)


def test_prefill_decode_split_matches_the_truth(tmp_path):
    """The split (one request at a time at each prompt length): TTFT and TPOT medians within 2% (or 1 ms, or the p99
    of the client's event-loop lag at that length, which the split reports as each point does) of the server's own
    stamps, prefill and decode rates derived from them, every answer its full length. One at a time, both processes
    wait idle for each event, so on a busy machine each request's TTFT carries two wake-ups: CI once saw its median
    3.2 ms over the truth (91.80 against 88.62 ms) with the other pytest worker computing."""
    lengths = [64, 256]
    with favoured(), Running("--owned-by", "vllm") as server:
        result = run_bench(server.url, {"input_len": 8, "output_len": 4}, None,
                           {"concurrency": [1], "requests": 2, "warmup": 0, "vocab_size": 1000, "plots": False,
                            "split": lengths, "split_requests": 5, "split_output_len": 12}, tmp_path)
        truth = server.truth()
    rows = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    split = result["split"]
    assert [r["input_len"] for r in split["lengths"]] == lengths and split["skipped_lengths"] == []
    for got in split["lengths"]:
        ids = [r["id"] for r in rows if r.get("split") == got["input_len"] and not r["warmup"]]
        assert len(ids) == 5 and got["requests"] == {"sent": 5, "ok": 5, "failed": 0}
        assert all(len(truth[i]["sent"]) == 12 and "ignore_eos" in truth[i]["keys"] for i in ids)
        t = truth_rows(truth, ids)
        want_ttft, want_tpot = float(np.median(t["ttft_ms"])), float(np.median(t["tpot_ms"]))
        noise = got["client"]["loop_lag_ms"]["p99"]  # the machine's scheduling noise, as for the points
        assert abs(got["ttft_ms"] - want_ttft) <= max(0.02 * want_ttft, 1.0, noise), (got, want_ttft)
        assert abs(got["tpot_ms"] - want_tpot) <= max(0.02 * want_tpot, 1.0, noise), (got, want_tpot)
        assert got["prompt_tokens"] == got["input_len"]
        assert got["prefill_tokens_per_s"] == pytest.approx(got["input_len"] / got["ttft_ms"] * 1e3, rel=0.05)
        assert got["decode_tokens_per_s"] == pytest.approx(1e3 / got["tpot_ms"], rel=0.05)
    assert "Prefill / decode split" in (tmp_path / "bench.md").read_text()
