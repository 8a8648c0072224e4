"""The prefill / decode split: prompt tokens/s and decode tokens/s at several prompt lengths.

At each prompt length, ``split_requests`` requests are sent one at a time (concurrency 1, after
one warm-up request), each asking for ``split_output_len`` tokens (with ``ignore_eos`` where
the server accepts it). With one request in flight the server runs nothing else, so from each
request:

- prefill rate = prompt tokens / TTFT (the prompt's forward pass and the first token);
- decode rate = (output tokens - 1) / (end-to-end - TTFT), one token per decode step.

The figures are the medians over the requests. They are taken by the client through the
endpoint, as every bench figure is, so TTFT also holds the request's HTTP round trip (and the
tokenizer, for a text prompt; token-id prompts skip it).

Default prompt lengths: 128, 512 and 2,048 against ``llmopt serve`` (the embedded runtime,
whose prefill is its weak spot on a CPU), those that fit the served context together with the
output; none against other servers unless asked (``--split`` / ``[bench] split``).
"""

from __future__ import annotations

import statistics

from llmopt.bench import client, workload as wl
from llmopt.bench.metrics import client_costs
from llmopt.bench.options import BenchOptions, Workload

DEFAULT_LENGTHS = (128, 512, 2048)
SPLIT_SERVERS = ("llmopt",)


def lengths(options: BenchOptions, server: str, context: int | None) -> tuple[list[int], list[int]]:
    """The prompt lengths to measure and those left out because prompt + output exceed ``context``."""
    asked = list(DEFAULT_LENGTHS) if options.split is None and server in SPLIT_SERVERS else list(options.split or [])
    if context is None:
        return asked, []
    fits = [n for n in asked if n + options.split_output_len <= context]
    return fits, [n for n in asked if n not in fits]


def served_context(models: dict) -> int | None:
    """The served context length GET /v1/models states (vLLM and llmopt serve: ``max_model_len``)."""
    values = [m.get("max_model_len") for m in models.get("data") or [] if isinstance(m.get("max_model_len"), int)]
    return min(values) if values else None


def measure(ctx: dict, options: BenchOptions, prompt_lengths: list[int], skipped: list[int], say) -> dict | None:
    """The split at each prompt length (``None`` when there is none to measure)."""
    if not prompt_lengths:
        return None
    rows = []
    for index, length in enumerate(prompt_lengths):
        work = Workload(input_len=length, output_len=options.split_output_len, concurrency=1)
        seed = options.seed + 7919 + 1000 * index
        bodies = wl.bodies(work, options, ctx["model"], ctx["server"], ctx["vocab"], options.split_requests, seed)
        warm = wl.bodies(work, options, ctx["model"], ctx["server"], ctx["vocab"], 1, seed + 500)
        say(f"prefill / decode split: {length} prompt tokens, {options.split_requests} requests one at a time")
        got = client.run(ctx["url"], "concurrency", 1.0, bodies, warm, options.request_timeout_s, seed)
        row = figures(length, got["records"])
        row["client"] = client_costs(got["client_cpu_s"], got["client_wall_s"], got["loop_lag_s"])  # as each point's
        rows.append(row)
        origin = min((r.start for r in got["records"]), default=0.0)
        ctx["rows"] += [{"split": length, **r.to_dict(origin)} for r in got["warmup"] + got["records"]]
        if row["prefill_tokens_per_s"] is not None:
            say(f"  prefill {row['prefill_tokens_per_s']:.0f} prompt tok/s (TTFT {row['ttft_ms']:.1f} ms), decode "
                f"{row['decode_tokens_per_s'] or 0:.1f} tok/s")
    return {"requests_per_length": options.split_requests, "output_len": options.split_output_len,
            "lengths": rows, "skipped_lengths": skipped,
            "method": "one request at a time; prefill = prompt tokens / TTFT, decode = (output tokens - 1) / "
                      "(end-to-end - TTFT); medians over the requests, measured by the client"}


def figures(length: int, records: list[client.Record]) -> dict:
    """The medians of one prompt length's requests."""
    ok = [r for r in records if r.ok and r.chunks and r.sent is not None and r.end is not None]
    ttft = [r.chunks[0] - r.sent for r in ok]
    prompt = [r.prompt_tokens or length for r in ok]
    decode = [((r.output_tokens or len(r.chunks)) - 1, r.end - r.chunks[0]) for r in ok]
    decode = [(n, s) for n, s in decode if n > 0 and s > 0]

    def median(values):
        return round(statistics.median(values), 3) if values else None

    return {"input_len": length, "prompt_tokens": median(prompt),
            "requests": {"sent": len(records), "ok": len(ok), "failed": len(records) - len(ok)},
            "errors": {r.error: r.message for r in records if r.error},
            "ttft_ms": median([t * 1e3 for t in ttft]),
            "prefill_tokens_per_s": median([p / t for p, t in zip(prompt, ttft) if t > 0]),
            "tpot_ms": median([s / n * 1e3 for n, s in decode]),
            "decode_tokens_per_s": median([n / s for n, s in decode])}
