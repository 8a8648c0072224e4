"""Gather what ``benchmarks/gpu_vllm.sh`` brought back into one JSON record and a Markdown table.

``vllm-h200.tgz`` (unpacked into DIR) holds, for each variant, the ``llmopt run`` report
(``runs/<v>.report.json``), the launch script, and ``llmopt bench``'s ``bench.json``; this keeps the
gates (accuracy delta with its interval) and the bench points side by side, with the machine's
versions and the progress log, and leaves out ``requests.jsonl`` (megabytes a variant)::

    python3 benchmarks/gpu_vllm.py summarize DIR --out docs/runs/vllm-h200-serving.json
    python3 benchmarks/gpu_vllm.py merge docs/runs/vllm-h200-serving.json DIR   # a later run's variants
    python3 benchmarks/gpu_vllm.py merge --beside docs/runs/vllm-h200-serving.json DIR   # more points
    python3 benchmarks/gpu_vllm.py table docs/runs/vllm-h200-serving.json

``merge`` adds the variants of a later run (one with a report) to a record, replacing those of the same
name (or, with ``--beside``, beside them), and keeps that run's machine and progress log under
``later_runs``; a variant the later run did not measure never replaces one that was.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path


def _read(path: Path):
    try:
        return json.loads(path.read_text()) if path.stat().st_size else None
    except (OSError, ValueError):
        return None


def summarize(folder: Path) -> dict:
    progress = (folder / "progress.log").read_text().splitlines() if (folder / "progress.log").is_file() else []
    variants = []
    names = {p.name.split(".")[0] for p in (folder / "runs").glob("*.report.json")}
    order = [m.group(1) for line in progress  # the variant `tune` is recorded apart (docs/results/tuning.md)
             if (m := re.match(r"\S+ (\w+): llmopt run", line)) and m.group(1) != "tune"]
    for name in dict.fromkeys(order + sorted(names)):
        report = _read(folder / "runs" / f"{name}.report.json") or {}
        bench = _read(folder / "bench" / name / "bench.json")
        exits = {m.group(1): int(m.group(2)) for line in progress
                 if (m := re.search(rf" {re.escape(name)}: (run|bench) exit (\d+) in", line))}
        seconds = {m.group(1): int(m.group(2)) for line in progress
                   if (m := re.search(rf" {re.escape(name)}: (run|bench) exit \d+ in (\d+) s", line))}
        launch = folder / "runs" / f"{name}.launch.sh"
        variants.append({
            "variant": name,
            "recipe": report.get("recipe"),
            "run_exit": exits.get("run"), "run_s": seconds.get("run"),
            "gates": [{k: g.get(k) for k in ("name", "metric", "n", "baseline", "candidate", "delta", "ci", "verdict",
                                             "thresholds", "reason")} for g in report.get("gates", [])],
            "passed": report.get("passed"),
            "launch_sh": launch.read_text() if launch.is_file() else None,
            "bench_exit": exits.get("bench"), "bench_s": seconds.get("bench"),
            # the engine's start: what the bench command took beyond its measured load points
            "engine_start_s": round(seconds["bench"] - bench["duration_s"], 1) if bench and "bench" in seconds else None,
            "bench": bench,
        })
    return {"env": _read(folder / "env.json"), "progress": progress, "variants": variants}


def merge(record: dict, folder: Path, beside: bool = False) -> dict:
    """``record`` with the variants of the run unpacked in ``folder`` (those ``llmopt run`` reported on).

    A later variant replaces the earlier one of its name, unless it has no bench (a run cut short): then the
    measured one stays. With ``beside``, a later variant is kept beside the earlier one of its name
    instead, marked with its run (``later_run``: 1 for the first of ``later_runs``), as for more points
    measured on another machine.
    """
    later = summarize(folder)
    kept = {v["variant"] for v in record["variants"]}
    new = [v for v in later["variants"] if v["recipe"] and (v["bench"] or v["variant"] not in kept)]
    run = len(record.get("later_runs", [])) + 1
    names = {v["variant"] for v in new}
    if beside:
        variants = record["variants"] + [v | {"later_run": run} for v in new]
    else:
        variants = [v for v in record["variants"] if v["variant"] not in names] + new
    runs = record.get("later_runs", []) + [{"env": later["env"], "progress": later["progress"],
                                            "variants": sorted(names)}]
    return record | {"variants": variants, "later_runs": runs}


def _pct(delta, ci) -> str:
    if delta is None:
        return "-"
    return f"{delta * 100:+.1f}% [{ci[0] * 100:+.1f}, {ci[1] * 100:+.1f}]" if ci else f"{delta * 100:+.1f}%"


def table(record: dict) -> str:
    rows = [("| artifact | prose ppl delta (95% CI), gate | c | req/s | output tok/s | TTFT p50 / p99 ms "
             "| TPOT p50 / p99 ms | ITL p50 / p99 ms | goodput req/s (share) | repeats |"),
            "|---|---|---|---|---|---|---|---|---|---|"]
    for v in record["variants"]:
        name = f"{v['variant']} (later run {v['later_run']})" if v.get("later_run") else v["variant"]
        gate = v["gates"][0] if v["gates"] else {}
        accuracy = f"{_pct(gate.get('delta'), gate.get('ci'))}, {gate.get('verdict', '-')}"
        bench = v["bench"]
        if not bench:
            rows.append(f"| {name} | {accuracy} | not measured | | | | | | | |")
            continue
        for point in bench["points"]:
            def pair(key, point=point):
                d = point.get(key) or {}
                return f"{d.get('p50', 0):.1f} / {d.get('p99', 0):.1f}"
            good = point["goodput"]
            rows.append(f"| {name} | {accuracy} | {point['load']['value']:g} | {point['request_throughput']:.2f} "
                        f"| {point['output_throughput']:.0f} | {pair('ttft_ms')} | {pair('tpot_ms')} | {pair('itl_ms')} "
                        f"| {good['requests_per_s']:.2f} ({good['fraction']:.0%}) | {bench['options']['repeats']} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("summarize")
    s.add_argument("folder", type=Path)
    s.add_argument("--out", type=Path)
    m = sub.add_parser("merge")
    m.add_argument("record", type=Path)
    m.add_argument("folder", type=Path)
    m.add_argument("--beside", action="store_true", help="keep a later variant beside the earlier one of its name")
    t = sub.add_parser("table")
    t.add_argument("record", type=Path)
    args = parser.parse_args()
    if args.command == "summarize":
        text = json.dumps(summarize(args.folder), indent=1)
        if args.out:
            args.out.write_text(text + "\n")
        else:
            print(text)
    elif args.command == "merge":
        args.record.write_text(json.dumps(merge(json.loads(args.record.read_text()), args.folder, args.beside), indent=1) + "\n")
    else:
        print(table(json.loads(args.record.read_text())))


if __name__ == "__main__":
    main()
