"""Speculative decoding's acceptance at a load point, from the engine's Prometheus counters on ``/metrics``.

The bench reads ``/metrics`` before and after each load point and differences the counters, so a figure is the
point's own (its warm-up requests included), not the server's lifetime average:

* vLLM (0.26.0 and 0.33.0, ``vllm/v1/spec_decode/metrics.py``, SpecDecodingProm): the counters
  ``vllm:spec_decode_num_drafts_total``, ``vllm:spec_decode_num_draft_tokens_total``,
  ``vllm:spec_decode_num_accepted_tokens_total`` and ``vllm:spec_decode_num_accepted_tokens_per_pos_total``
  (label ``position``). Acceptance rate = accepted / drafted tokens; mean acceptance length = 1 + accepted /
  drafts (the bonus token counted, as vLLM's own PromQL in that file defines it); per position: accepted at
  that position / drafts.
* SGLang 0.5.23 (``sglang/srt/observability/metrics_collector.py``, served with ``--enable-metrics``): its
  acceptance figures are gauges of the last batch only, so the bench uses its counters instead:
  ``sglang:spec_verify_calls_total`` and ``sglang:generation_tokens_total``. Mean acceptance length = (output
  tokens - requests, each request's first token coming from its prefill) / verify steps; acceptance rate =
  (length - 1) / tokens drafted per step (the gauge ``sglang:spec_num_draft_tokens`` less one).

``llmopt serve`` with a batching engine (``--max-num-seqs``) has the histogram ``llmopt_batch_size`` (sequences
in each engine step): its ``_sum`` and ``_count`` over a point give the point's mean batch (``batching``).

A server whose ``/metrics`` has none of these (no speculation, llmopt serve, TensorRT-LLM, whose ``/metrics`` is
JSON iteration statistics) gives None: the bench shows no acceptance columns then.
"""

from __future__ import annotations

import re
import urllib.error
import urllib.request

VLLM = {"vllm:spec_decode_num_drafts_total": "drafts", "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
        "vllm:spec_decode_num_accepted_tokens_total": "accepted_tokens"}
VLLM_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
SGLANG = {"sglang:spec_verify_calls_total": "verify_steps", "sglang:generation_tokens_total": "output_tokens",
          "sglang:spec_num_draft_tokens": "draft_window"}
LLMOPT = {"llmopt_batch_size_sum": "batch_sequences", "llmopt_batch_size_count": "engine_steps"}
LINE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)')
POSITION = re.compile(r'position="(\d+)"')


def parse(text: str) -> dict:
    """The counters this module reads, summed over their labels (engines, models); per-position counts as
    ``position:<i>``."""
    out: dict = {}
    for line in text.splitlines():
        match = LINE.match(line)
        if not match:
            continue
        name, labels, value = match.groups()
        try:
            number = float(value)
        except ValueError:
            continue
        if name in VLLM or name in SGLANG or name in LLMOPT:
            key = VLLM.get(name) or SGLANG.get(name) or LLMOPT[name]
            out[key] = number if key == "draft_window" else out.get(key, 0.0) + number
        elif name == VLLM_PER_POSITION and (pos := POSITION.search(labels or "")):
            key = f"position:{pos.group(1)}"
            out[key] = out.get(key, 0.0) + number
    return out


def scrape(base_url: str, timeout_s: float = 10.0) -> dict | None:
    """The speculation counters of the server at ``base_url``, or None when it has no /metrics or none of them."""
    try:
        with urllib.request.urlopen(f"{base_url}/metrics", timeout=timeout_s) as resp:
            counters = parse(resp.read().decode("utf-8", "replace"))
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return counters or None


def point(before: dict | None, after: dict | None, requests: int) -> dict | None:
    """The acceptance of the requests sent between two scrapes (``requests``: how many, warm-up included)."""
    if not before or not after:
        return None
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after if k != "draft_window"}
    if delta.get("drafts", 0) > 0:
        drafts, drafted, accepted = delta["drafts"], delta.get("draft_tokens", 0.0), delta.get("accepted_tokens", 0.0)
        positions = sorted((int(k.split(":")[1]), v) for k, v in delta.items() if k.startswith("position:"))
        return {"source": "vllm /metrics", "drafts": int(drafts), "draft_tokens": int(drafted),
                "accepted_tokens": int(accepted),
                "acceptance_rate": round(accepted / drafted, 4) if drafted else None,
                "mean_acceptance_length": round(1 + accepted / drafts, 3),
                "per_position": [round(v / drafts, 4) for _, v in positions]}
    if delta.get("verify_steps", 0) > 0:
        steps, tokens = delta["verify_steps"], delta.get("output_tokens", 0.0)
        length = max(0.0, tokens - requests) / steps
        window = after.get("draft_window", 0.0) - 1
        return {"source": "sglang /metrics", "verify_steps": int(steps), "output_tokens": int(tokens),
                "acceptance_rate": round((length - 1) / window, 4) if window > 0 and length >= 1 else None,
                "mean_acceptance_length": round(length, 3)}
    return None


def batching(before: dict | None, after: dict | None) -> dict | None:
    """The engine steps of llmopt serve's batching scheduler between two scrapes and their mean batch, or None."""
    if not before or not after:
        return None
    steps = after.get("engine_steps", 0.0) - before.get("engine_steps", 0.0)
    if steps <= 0:
        return None
    sequences = after.get("batch_sequences", 0.0) - before.get("batch_sequences", 0.0)
    return {"source": "llmopt /metrics", "engine_steps": int(steps), "mean_batch_size": round(sequences / steps, 2)}
