"""Decode speed of ONNX model folders that differ in their embedding / LM head tables, on a shared CPU.

Each model folder (an artifact's ``model/``, or any ONNX Runtime GenAI folder) is measured in its
own process, one intra-op thread (a copy of ``genai_config.json`` says so; the weights are linked),
a fixed prompt of ``--prompt`` tokens and ``--new`` greedy steps, three timed runs after a warm-up.
Rounds alternate the order of the variants (forward, then backward), so a load change on the
machine falls on every variant alike; the 1-minute load average (``/proc/loadavg``) is recorded
beside every measurement. Printed: per variant the median over rounds of the per-round decode
p50, the min-max over rounds, and the folder's size.

    .venv/bin/python benchmarks/embed_tables.py NAME=artifacts/x/model ... --rounds 5 --out embed.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worker(model: str, prompt: int, new: int) -> dict:
    sys.path.insert(0, str(ROOT))
    from llmopt.runtimes.onnx import OnnxRuntime

    rt = OnnxRuntime(Path(model))
    ids = rt.encode("The history of astronomy begins with careful records of the sky kept by early farmers and "
                    "priests, who watched the sun, the moon and the planets move against the fixed stars.")
    return rt.measure(prompt, new, repeats=3, prompt_ids=ids)


def one_thread_copy(model: Path, work: Path) -> Path:
    """The folder with every file linked and genai_config.json copied with intra_op_num_threads = 1."""
    out = work / model.parent.name
    out.mkdir(parents=True, exist_ok=True)
    for f in model.iterdir():
        if f.name != "genai_config.json" and not (out / f.name).exists():
            os.symlink(f.resolve(), out / f.name)
    config = json.loads((model / "genai_config.json").read_text())
    config["model"]["decoder"].setdefault("session_options", {})["intra_op_num_threads"] = 1
    (out / "genai_config.json").write_text(json.dumps(config, indent=2))
    return out


def load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", help="NAME=PATH of a model folder")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker[0], int(args.worker[1]), int(args.worker[2]))))
        return 0
    models = dict(m.split("=", 1) for m in args.models)
    rows: dict[str, list] = {name: [] for name in models}
    with tempfile.TemporaryDirectory() as tmp:
        copies = {name: one_thread_copy(Path(p), Path(tmp) / name) for name, p in models.items()}
        for r in range(args.rounds):
            order = list(models) if r % 2 == 0 else list(reversed(models))
            for name in order:
                before = load()
                out = subprocess.run([sys.executable, __file__, "--worker", str(copies[name]), str(args.prompt),
                                      str(args.new)], capture_output=True, text=True, check=True)
                figures = json.loads(out.stdout.strip().splitlines()[-1])
                rows[name].append({"round": r, "load_before": before, "load_after": load(), **figures})
                print(f"round {r} {name}: decode p50 {figures['decode_ms_p50']:.2f} ms, load {before:.2f}",
                      file=sys.stderr)
    summary = {}
    for name, runs in rows.items():
        p50 = [x["decode_ms_p50"] for x in runs]
        size = sum(f.stat().st_size for f in Path(models[name]).iterdir() if f.is_file())
        summary[name] = {"decode_ms_median": statistics.median(p50), "decode_ms_min": min(p50),
                         "decode_ms_max": max(p50), "prefill_ms_median": statistics.median(x["prefill_ms"] for x in runs),
                         "load_min": min(x["load_before"] for x in runs), "load_max": max(x["load_after"] for x in runs),
                         "folder_bytes": size}
        s = summary[name]
        print(f"| {name} | {size / 1e6:.1f} | {s['decode_ms_median']:.2f} | {s['decode_ms_min']:.2f}-"
              f"{s['decode_ms_max']:.2f} | {s['prefill_ms_median']:.1f} | {s['load_min']:.1f}-{s['load_max']:.1f} |")
    if args.out:
        args.out.write_text(json.dumps({"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                        "prompt": args.prompt, "new": args.new, "rounds": args.rounds,
                                        "summary": summary, "runs": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
