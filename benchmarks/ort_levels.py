"""ONNX accuracy levels side by side: perplexity windows on one model folder, and decode speed round-robin.

``score`` runs the first K windows of llmopt's perplexity eval (256 tokens, stride 256, the same
spans as ``[[eval]] window = 256``) through an ONNX Runtime GenAI folder and writes one JSON row per
window (nll and token count, as the eval stage's scores.jsonl): for a variant whose llmopt run
could not finish, compared window by window with the cached baseline and candidate scores.

``decode`` times greedy decode of each peer in turn (an ONNX folder, or a Hugging Face folder in
transformers as the float baseline), a 128-token prompt of ``builtin:prose-eval`` then 32 steps,
round after round, so that a change of load on a shared machine falls on every peer alike; each
round keeps the median step of its run, the result is the median over rounds.

``compare`` puts two llmopt runs of one recipe at two accuracy levels side by side: for each eval in
both reports, level 4's candidate against level 1's on the same windows or questions, with the gate's
paired statistic and 95% interval (``llmopt.scoring.gate.compare``), level 1 in the baseline's place.

    .venv/bin/python benchmarks/ort_levels.py score MODEL_DIR 12 out.jsonl fiction code
    .venv/bin/python benchmarks/ort_levels.py decode 5 out.json acc4=ort:DIR1 acc1=ort:DIR2 bf16=hf:DIR3:bfloat16
    .venv/bin/python benchmarks/ort_levels.py compare ART_LEVEL1/reports ART_LEVEL4/reports out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PROMPT_LEN, NEW_TOKENS = 128, 32


def score(model_dir: str, k: int, out: str, domains: list[str]) -> None:
    from llmopt import data
    from llmopt.backends.eval.perplexity import windows
    from llmopt.runtimes.onnx import OnnxRuntime

    rt = OnnxRuntime(Path(model_dir))
    with open(out, "a") as f:
        for domain in domains:
            ids = rt.encode("\n\n".join(data.load_texts(f"builtin:{domain}-eval")))
            for n, (begin, end, scored) in enumerate(windows(len(ids), 256, 256, 64)[:k]):
                [nll] = rt.nll([ids[begin:end]], [scored])
                row = {"domain": domain, "id": f"w{n:05d}", "begin": begin, "end": end, "tokens": scored, "nll": nll}
                f.write(json.dumps(row) + "\n")
                f.flush()
            print(domain, "done", time.strftime("%H:%M:%S"), flush=True)


def hf_steps(model, prompt: list[int]) -> list[float]:
    import torch

    with torch.inference_mode():
        out = model(torch.tensor([prompt]), use_cache=True, logits_to_keep=1)
        steps = []
        for _ in range(NEW_TOKENS - 1):
            token = out.logits[0, -1].argmax().view(1, 1)
            t = time.perf_counter()
            out = model(token, past_key_values=out.past_key_values, use_cache=True)
            steps.append((time.perf_counter() - t) * 1000)
    return steps


def open_peer(spec: str):
    kind, path, *dtype = spec.split(":")
    if kind == "ort":
        from llmopt.runtimes.onnx import OnnxRuntime

        return kind, OnnxRuntime(Path(path))
    import torch
    from transformers import AutoModelForCausalLM

    return kind, AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype[0] if dtype else "float32")).eval()


def decode(rounds: int, out: str, specs: list[str]) -> None:
    from llmopt.runtimes.onnx import default_prompt

    peers = {label: open_peer(spec) for label, spec in (s.split("=", 1) for s in specs)}
    prompt = default_prompt(next(obj for kind, obj in peers.values() if kind == "ort"), PROMPT_LEN)
    results: dict[str, list[float]] = {label: [] for label in peers}
    loads = []
    for r in range(rounds):
        for label, (kind, obj) in peers.items():
            if kind == "ort":
                results[label].append(obj.measure(PROMPT_LEN, NEW_TOKENS, 1, prompt_ids=prompt)["decode_ms_p50"])
            else:
                hf_steps(obj, prompt)  # warm-up
                results[label].append(float(np.percentile(hf_steps(obj, prompt), 50)))
        loads.append(os.getloadavg()[0])
        print(r, {k: round(v[-1], 2) for k, v in results.items()}, "load", loads[-1], flush=True)
    summary = {k: {"median_of_p50_ms": statistics.median(v), "rounds": v} for k, v in results.items()}
    Path(out).write_text(json.dumps({"prompt": PROMPT_LEN, "new_tokens": NEW_TOKENS, "rounds": rounds, "load_1m": loads,
                                     "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "results": summary}, indent=1))
    for k, v in summary.items():
        print(f"{k}: {v['median_of_p50_ms']:.2f} ms/token ({1000 / v['median_of_p50_ms']:.1f} tok/s)")


def compare(level1: str, level4: str, out: str) -> None:
    from llmopt.scoring import gate
    reports = [json.loads((Path(d) / "report.json").read_text()) for d in (level1, level4)]
    gates = [{g["name"]: g for g in r["gates"]} for r in reports]
    rows = {}
    for name in (n for n in gates[1] if n in gates[0]):
        files = [Path(d) / g[name]["scores"]["candidate"] for d, g in zip((level1, level4), gates)]
        scores = [gate.read_scores(f) for f in files]
        c = gate.compare(gates[1][name]["metric"], scores[0], scores[1], 0.95)
        rows[name] = {k: c[k] for k in ("metric", "n", "baseline", "candidate", "delta", "ci", "method", "unpaired")}
        print(f"{name}: level 1 {c['baseline']:.4f}, level 4 {c['candidate']:.4f}, n {c['n']}, "
              f"delta {c['delta']:+.5f} [{c['ci'][0]:+.5f}, {c['ci'][1]:+.5f}] ({c['method']})")
    Path(out).write_text(json.dumps({"level1": level1, "level4": level4, "confidence": 0.95,
                                     "level4_against_level1": rows}, indent=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("score", help="perplexity windows of one ONNX folder")
    s.add_argument("model_dir")
    s.add_argument("windows", type=int)
    s.add_argument("out")
    s.add_argument("domains", nargs="+", help="fiction, encyclopedia, dialogue, code, prose (builtin:NAME-eval)")
    d = sub.add_parser("decode", help="decode speed, round-robin over the peers")
    d.add_argument("rounds", type=int)
    d.add_argument("out")
    d.add_argument("peers", nargs="+", help="LABEL=ort:DIR or LABEL=hf:DIR[:DTYPE]")
    c = sub.add_parser("compare", help="level 4's candidate scores against level 1's, eval by eval")
    c.add_argument("level1", help="reports folder of the level-1 run (report.json and its scores files)")
    c.add_argument("level4", help="reports folder of the level-4 run")
    c.add_argument("out")
    args = parser.parse_args(argv)
    if args.command == "score":
        score(args.model_dir, args.windows, args.out, args.domains)
    elif args.command == "compare":
        compare(args.level1, args.level4, args.out)
    else:
        decode(args.rounds, args.out, args.peers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
