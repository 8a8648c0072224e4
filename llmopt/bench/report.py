"""Benchmark results as files: bench.json, bench.md (a table), requests.jsonl and PNG plots.

Plots (matplotlib, the ``bench`` extra; skipped with a note when it is missing):
``latency.png``, TTFT / TPOT / ITL / end-to-end p50 and p99 against the concurrency, and
``throughput.png``, output tokens/s, requests/s and goodput against the concurrency
(``latency-rate.png`` and ``throughput-rate.png`` for Poisson-rate points), and ``split.png``,
prefill and decode tokens/s against the prompt length (the prefill / decode split).
"""

from __future__ import annotations

import json
from pathlib import Path

LATENCIES = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2e_ms", "end-to-end"))


def load_label(point: dict) -> str:
    load = point["load"]
    return f"c={load['value']:g}" if load["kind"] == "concurrency" else f"{load['value']:g} req/s"


def _ms(stat: dict | None, key: str) -> str:
    return "-" if not stat else f"{stat[key]:.1f}"


def requests_line(requests: int | list[int]) -> str:
    """How many requests each point measured: one count for all, or one per point (``-n 16,128``)."""
    if isinstance(requests, int):
        return f"{requests} requests per point"
    return f"{', '.join(str(n) for n in requests)} requests at the load points in order"


def markdown(result: dict) -> str:
    """One row per load point."""
    slo = {k: v for k, v in (result.get("slo") or {}).items() if v is not None}
    lines = [f"# llmopt bench: {result['target']['model']} at {result['target']['url']}", "",
             f"Workload: {workload_line(result)}; "
             f"SLO: {', '.join(f'{k} <= {v:g}' for k, v in slo.items()) or 'none'}; "
             f"{requests_line(result['options']['requests'])} after {result['options']['warmup']} warm-up.", "",
             "| load | ok / sent | req/s | output tok/s | total tok/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms "
             "| ITL p50 / p99 ms | E2E p50 / p99 ms | goodput req/s | errors | client CPU |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    speculated = any(p.get("speculation") for p in result["points"])
    if speculated:  # only when the server reports speculative decoding's counters
        lines[-2] += " accepted | tokens / step |"
        lines[-1] += "---|---|"
    for p in result["points"]:
        good, cpu = p.get("goodput"), (p.get("client") or {}).get("cpu_share_of_one_core")
        cells = [load_label(p), f"{p['requests']['ok']} / {p['requests']['sent']}", f"{p['request_throughput']:.2f}",
                 f"{p['output_throughput']:.1f}", f"{p['total_token_throughput']:.1f}",
                 *(f"{_ms(p[key], 'p50')} / {_ms(p[key], 'p99')}" for key, _ in LATENCIES),
                 f"{good['requests_per_s']:.2f} ({good['fraction']:.0%})" if good else "-",
                 ", ".join(f"{k} {v['count']}" for k, v in p["errors"].items()) or "-",
                 "-" if cpu is None else f"{cpu:.0%}", *(acceptance_cells(p) if speculated else [])]
        lines.append("| " + " | ".join(cells) + " |")
    if result.get("saturation"):
        s = result["saturation"]
        lines += ["", f"Saturation: {s['reason']}; highest request throughput at concurrency {s['best_concurrency']:g}."]
    lines += split_table(result.get("split"))
    return "\n".join(lines) + "\n"


def acceptance_cells(point: dict) -> list[str]:
    """Speculative decoding at the point: the share of drafted tokens accepted, and the mean tokens a step
    produced (accepted drafts plus the target's own token)."""
    spec = point.get("speculation") or {}
    rate, length = spec.get("acceptance_rate"), spec.get("mean_acceptance_length")
    return ["-" if rate is None else f"{rate:.0%}", "-" if length is None else f"{length:.2f}"]


def workload_line(result: dict) -> str:
    """The workload in words: the random prompts' lengths, or the dataset's name, hash and lengths."""
    w, data = result["workload"], result.get("dataset")
    if not data:
        return f"{w['input_len']} input tokens, {w['output_len']} output tokens"
    spread = data["input_tokens"]
    prompts = (f"prompts of {spread['mean']:g} tokens on average ({spread['min']} to {spread['max']})" if spread
               else "prompt lengths from the server")
    outputs = data["output_tokens"]
    source = "from the data" if data["output_len_from"] == "data" else "fixed"
    return (f"{data['name']} (sha256 {data['sha256'][:12]}, {data['used']} of {data['records']} records), {prompts}, "
            f"outputs of {outputs['mean']:g} tokens on average ({source})")


def split_table(split: dict | None) -> list[str]:
    """The prefill / decode split as markdown lines ([] without one)."""
    if not split:
        return []

    def num(value, form):
        return "-" if value is None else format(value, form)

    lines = ["", f"Prefill / decode split: {split['requests_per_length']} requests at each prompt length, one at a "
             f"time, {split['output_len']} output tokens each; medians.", "",
             "| prompt tokens | ok / sent | TTFT ms | prefill tok/s | TPOT ms | decode tok/s |", "|---|---|---|---|---|---|"]
    for row in split["lengths"]:
        lines.append(f"| {row['input_len']} | {row['requests']['ok']} / {row['requests']['sent']} | "
                     f"{num(row['ttft_ms'], '.1f')} | {num(row['prefill_tokens_per_s'], '.0f')} | "
                     f"{num(row['tpot_ms'], '.1f')} | {num(row['decode_tokens_per_s'], '.1f')} |")
    if split.get("skipped_lengths"):
        lines += ["", "Left out (prompt and output longer than the served context): "
                  + ", ".join(str(n) for n in split["skipped_lengths"]) + " tokens."]
    return lines


def plots(result: dict, out_dir: Path) -> tuple[list[str], str | None]:
    """The PNG files written (latency.png and throughput.png for the concurrency points, latency-rate.png and
    throughput-rate.png for the Poisson ones), and why none were when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return [], "matplotlib is not installed (pip install 'llmopt[bench]')"
    written = []
    for kind, suffix in (("concurrency", ""), ("rate", "-rate")):
        same = sorted((p for p in result["points"] if p["load"]["kind"] == kind), key=lambda p: p["load"]["value"])
        if same:
            latency_plot(plt, result, same, kind, out_dir / f"latency{suffix}.png")
            throughput_plot(plt, result, same, kind, out_dir / f"throughput{suffix}.png")
            written += [f"latency{suffix}.png", f"throughput{suffix}.png"]
    if (result.get("split") or {}).get("lengths"):
        split_plot(plt, result, out_dir / "split.png")
        written.append("split.png")
    return written, None if written else "no points"


def split_plot(plt, result: dict, path: Path) -> None:
    """Prefill and decode tokens/s against the prompt length."""
    rows = result["split"]["lengths"]
    x = [row["input_len"] for row in rows]
    nan = float("nan")
    fig, ax = plt.subplots(figsize=(7, 4.5), constrained_layout=True)
    ax.plot(x, [row["prefill_tokens_per_s"] or nan for row in rows], "o-", label="prefill (prompt tokens/s)")
    ax.set(xlabel="prompt tokens", ylabel="prompt tokens/s", title=f"Prefill / decode: {result['target']['model']}")
    if len(x) > 1:
        ax.set_xscale("log", base=2)
    ax.set_xticks(x, [str(n) for n in x])
    ax.minorticks_off()
    ax.set_ylim(bottom=0)
    right = ax.twinx()
    right.plot(x, [row["decode_tokens_per_s"] or nan for row in rows], "s--", color="tab:orange",
               label="decode (output tokens/s, one request)")
    right.set_ylabel("output tokens/s")
    right.set_ylim(bottom=0)
    handles = [h for a in (ax, right) for h in a.get_legend_handles_labels()[0]]
    ax.legend(handles, [h.get_label() for h in handles], loc="best")
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _xlabel(kind: str) -> str:
    return "concurrency (requests in flight)" if kind == "concurrency" else "offered rate (requests/s, Poisson)"


def latency_plot(plt, result: dict, points: list[dict], kind: str, path: Path) -> None:
    x = [p["load"]["value"] for p in points]
    bounds = {"ttft_ms": "ttft_p99_ms", "tpot_ms": "tpot_p99_ms", "e2e_ms": "e2e_p99_ms"}
    fig, axes = plt.subplots(2, 2, figsize=(10, 7), constrained_layout=True)
    for ax, (key, title) in zip(axes.flat, LATENCIES):
        for q, style in (("p50", "o-"), ("p99", "s--")):
            ax.plot(x, [p[key][q] if p[key] else float("nan") for p in points], style, label=q)
        bound = (result.get("slo") or {}).get(bounds.get(key, ""))
        if bound:
            ax.axhline(bound, color="red", linewidth=1, label="SLO (p99)")
        ax.set(title=f"{title} (ms)", xlabel=_xlabel(kind))
        _log_x(ax, kind, x)
        ax.legend()
    fig.suptitle(f"Latency against load: {result['target']['model']}")
    fig.savefig(path, dpi=100)
    plt.close(fig)


def throughput_plot(plt, result: dict, points: list[dict], kind: str, path: Path) -> None:
    x = [p["load"]["value"] for p in points]
    fig, ax = plt.subplots(figsize=(7, 4.5), constrained_layout=True)
    ax.plot(x, [p["output_throughput"] for p in points], "o-", label="output tokens/s")
    ax.set(xlabel=_xlabel(kind), ylabel="output tokens/s", title=f"Throughput: {result['target']['model']}")
    _log_x(ax, kind, x)
    right = ax.twinx()
    right.plot(x, [p["request_throughput"] for p in points], "s--", color="tab:green", label="requests/s")
    if any(p.get("goodput") for p in points):
        right.plot(x, [(p.get("goodput") or {}).get("requests_per_s", float("nan")) for p in points], "^:",
                   color="tab:red", label="goodput (requests/s within the SLO)")
    right.set_ylabel("requests/s")
    handles = [h for a in (ax, right) for h in a.get_legend_handles_labels()[0]]
    ax.legend(handles, [h.get_label() for h in handles], loc="upper left")
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _log_x(ax, kind: str, x: list[float]) -> None:
    if kind == "concurrency" and len(x) > 2 and max(x) / max(min(x), 1) >= 8:
        from matplotlib.ticker import ScalarFormatter

        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(ScalarFormatter())


def write_all(result: dict, records: list[dict], out_dir: Path, with_plots: bool = True) -> dict:
    """Write the files; returns their names (relative to ``out_dir``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"json": "bench.json", "markdown": "bench.md", "requests": "requests.jsonl", "plots": []}
    if with_plots:
        files["plots"], why = plots(result, out_dir)
        if why:
            files["plots_skipped"] = why
    result["files"] = files
    (out_dir / "bench.md").write_text(markdown(result))
    with open(out_dir / "requests.jsonl", "w") as fh:
        for row in records:
            fh.write(json.dumps(row) + "\n")
    (out_dir / "bench.json").write_text(json.dumps(result, indent=2) + "\n")
    return files
