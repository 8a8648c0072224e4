"""Figures of one load point from the client's records, as vLLM's and SGLang's benchmarks define them.

- TTFT: from the request's body leaving the client to the first chunk that carries text.
- ITL: every gap between two successive text chunks, over all requests (a chunk may hold
  more than one token when the server batches its sends).
- TPOT: per request, (end-to-end - TTFT) / (output tokens - 1); requests of one token have none.
- End-to-end: from the request's body leaving the client to the end of its stream.
- Throughput: measured requests (and their tokens) over the time from the first measured
  request's start to the last one's end. Output tokens are the server's usage figure, else
  the number of text chunks.
- Goodput: requests that meet every bound the SLO sets (each bound applied to the request's
  own TTFT, TPOT and end-to-end latency), per second.
"""

from __future__ import annotations

import numpy as np

from llmopt.bench.client import Record

PERCENTILES = (50, 90, 95, 99)
SLO_FIELDS = {"ttft_p99_ms": "ttft_ms", "tpot_p99_ms": "tpot_ms", "e2e_p99_ms": "e2e_ms"}


def stats(values_ms) -> dict | None:
    """mean, p50, p90, p95, p99 (linear interpolation, numpy's default), in ms; None without values."""
    values = np.asarray(values_ms, dtype=float)
    if values.size == 0:
        return None
    out = {"mean": round(float(values.mean()), 3)}
    out.update({f"p{q}": round(float(np.percentile(values, q)), 3) for q in PERCENTILES})
    return out


def per_request(rec: Record) -> dict:
    """TTFT, TPOT and end-to-end latency of one successful request, in ms."""
    ttft = (rec.chunks[0] - rec.sent) * 1e3
    e2e = (rec.end - rec.sent) * 1e3
    n = rec.output_tokens or len(rec.chunks)
    tpot = (e2e - ttft) / (n - 1) if n > 1 else None
    return {"ttft_ms": ttft, "tpot_ms": tpot, "e2e_ms": e2e}


def errors_by_kind(records: list[Record]) -> dict:
    out: dict[str, dict] = {}
    for rec in records:
        if rec.error:
            entry = out.setdefault(rec.error, {"count": 0, "example": rec.message})
            entry["count"] += 1
    return dict(sorted(out.items()))


def goodput(rows: list[dict], slo: dict, duration: float) -> dict | None:
    bounds = {key: value for key, value in slo.items() if value is not None and key in SLO_FIELDS}
    if not bounds:
        return None

    def meets(row):
        return all(row[SLO_FIELDS[key]] is not None and row[SLO_FIELDS[key]] <= bound for key, bound in bounds.items())

    good = sum(meets(row) for row in rows)
    return {"requests_per_s": round(good / duration, 4) if duration > 0 else 0.0, "requests": good,
            "fraction": round(good / len(rows), 4) if rows else 0.0, "bounds": bounds}


def summarize(records: list[Record], slo: dict, client: dict | None = None) -> dict:
    """The figures of one point (warm-up records already left out)."""
    ok = [r for r in records if r.ok]
    rows = [per_request(r) for r in ok]
    spans = [(r.start, r.end) for r in records if r.end is not None]
    duration = (max(e for _, e in spans) - min(s for s, _ in spans)) if spans else 0.0
    out_tokens = sum(r.output_tokens or 0 for r in ok)
    in_tokens = sum(r.prompt_tokens or 0 for r in ok)
    itl = [(b - a) * 1e3 for r in ok for a, b in zip(r.chunks, r.chunks[1:])]
    figures = {
        "requests": {"sent": len(records), "ok": len(ok), "failed": len(records) - len(ok)},
        "errors": errors_by_kind(records),
        "duration_s": round(duration, 4),
        "request_throughput": round(len(ok) / duration, 4) if duration else 0.0,
        "output_throughput": round(out_tokens / duration, 3) if duration else 0.0,
        "total_token_throughput": round((in_tokens + out_tokens) / duration, 3) if duration else 0.0,
        "input_tokens_mean": round(in_tokens / len(ok), 2) if ok and in_tokens else None,
        "output_tokens_mean": round(out_tokens / len(ok), 2) if ok else None,
        "ttft_ms": stats([r["ttft_ms"] for r in rows]),
        "tpot_ms": stats([r["tpot_ms"] for r in rows if r["tpot_ms"] is not None]),
        "itl_ms": stats(itl),
        "e2e_ms": stats([r["e2e_ms"] for r in rows]),
        "goodput": goodput(rows, slo, duration),
        "slo_met": slo_met(rows, slo),
    }
    if client is not None:
        figures["client"] = client
    return figures


def slo_met(rows: list[dict], slo: dict) -> dict | None:
    """Per bound: is the point's own 99th percentile within it."""
    out = {}
    for key, metric in SLO_FIELDS.items():
        bound = slo.get(key)
        values = [r[metric] for r in rows if r[metric] is not None]
        if bound is not None:
            out[key] = bool(values) and float(np.percentile(values, 99)) <= bound
    return out or None


def client_costs(cpu_s: float, wall_s: float, lags_s: list[float]) -> dict:
    """The client's CPU seconds, its share of one core, and how late its event loop woke (ms)."""
    lags = np.asarray(lags_s, dtype=float) * 1e3
    return {"cpu_s": round(cpu_s, 3), "cpu_share_of_one_core": round(cpu_s / wall_s, 4) if wall_s else None,
            "loop_lag_ms": {"p50": round(float(np.percentile(lags, 50)), 3), "p99": round(float(np.percentile(lags, 99)), 3),
                            "max": round(float(lags.max()), 3)} if lags.size else None}


def median_of(points: list[dict]) -> dict:
    """The per-field median of repeated points' figures (numbers only; the rest from the first); request and
    error counts are totals over the repeats."""
    if len(points) == 1:
        return points[0]

    def merge(values):
        first = values[0]
        if isinstance(first, dict):
            return {k: merge([v.get(k) for v in values if isinstance(v, dict)]) for k in first}
        nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if nums and len(nums) == len(values):
            return round(float(np.median(nums)), 4)
        return first

    merged = merge(points)
    merged["requests"] = {k: sum(p["requests"][k] for p in points) for k in points[0]["requests"]}
    merged["errors"] = {k: {"count": sum(p["errors"].get(k, {}).get("count", 0) for p in points),
                            "example": next(p["errors"][k]["example"] for p in points if k in p["errors"])}
                        for k in sorted({k for p in points for k in p["errors"]})}
    return merged
