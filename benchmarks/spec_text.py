"""Speculative decoding on text workloads: one engine start per artifact, then each text workload at
each concurrency through `llmopt bench`, the engine's speculation counters read around every point,
and greedy answers kept for the lossless check.

    python3 benchmarks/spec_text.py OUT NAME=ARTIFACT [NAME=ARTIFACT ...]
        [--datasets builtin:rewrite,builtin:continue] [--concurrency 1,8,32] [--requests 24,64,128]
        [--answers 16] [--slo ttft_p99_ms=200,tpot_p99_ms=10]

Each artifact's server starts from its own deploy config (deploy/<engine>/launch.sh, as `llmopt bench
ARTIFACT` starts it) and is stopped after its points. Per point, OUT/NAME/<dataset>-c<N>/ holds the
bench's bench.json, and OUT/NAME/points.jsonl one line with the point's figures and, where the engine
counts speculation (vLLM's Prometheus counters vllm:spec_decode_*), the drafted and accepted tokens
over the point (warm-up included): acceptance rate = accepted / drafted, mean acceptance length = 1 +
accepted / drafts (tokens each target forward pass yields). OUT/NAME/answers-<dataset>.jsonl holds
the greedy answers (temperature 0, no ignore_eos, one request at a time) to the first --answers
prompts; `summarize OUT` compares them across the artifacts of one model (names NAME-off and
NAME-<anything>) and writes OUT/summary.json.

    python3 benchmarks/spec_text.py summarize OUT
"""

from __future__ import annotations

import json
import re
import sys
import time
import urllib.request
from pathlib import Path

COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
            "vllm:spec_decode_num_accepted_tokens")


def scrape(url: str) -> dict[str, float]:
    """The speculation counters on the server's /metrics (summed over labels); {} when it has none."""
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
            text = response.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(r"^([a-zA-Z_:]+?)(?:_total)?(?:\{[^}]*\})?\s+([0-9.eE+-]+)$", line)
        if match and match.group(1) in COUNTERS:
            out[match.group(1)] = out.get(match.group(1), 0.0) + float(match.group(2))
    return out


def speculation(before: dict, after: dict) -> dict | None:
    if not after:
        return None
    delta = {k.split(":")[1]: after.get(k, 0.0) - before.get(k, 0.0) for k in COUNTERS}
    drafts, drafted, accepted = (delta["spec_decode_num_drafts"], delta["spec_decode_num_draft_tokens"],
                                 delta["spec_decode_num_accepted_tokens"])
    return {"drafts": drafts, "draft_tokens": drafted, "accepted_tokens": accepted,
            "acceptance_rate": accepted / drafted if drafted else None,
            "mean_acceptance_length": 1 + accepted / drafts if drafts else None}


def answers(url: str, model: str, records: list, n: int) -> list[dict]:
    """Greedy answers to the first ``n`` requests, one at a time, each to its natural end or max_tokens."""
    out = []
    for request in records[:n]:
        body = {"model": model, "temperature": 0.0, "max_tokens": request.max_tokens, "stream": False}
        body.update({"messages": request.messages} if request.messages is not None else {"prompt": request.prompt})
        path = "/v1/chat/completions" if request.messages is not None else "/v1/completions"
        req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as response:
            choice = json.loads(response.read())["choices"][0]
        out.append({"text": (choice.get("message") or {}).get("content") or choice.get("text") or "",
                    "finish_reason": choice.get("finish_reason")})
    return out


def measure_artifact(out: Path, name: str, artifact: Path, datasets: list[str], points: list[tuple[int, int]],
                     n_answers: int, slo: dict) -> None:
    from llmopt.bench import dataset, engine
    from llmopt.bench.runner import run_bench
    from llmopt.server.model import locate
    from llmopt.store.cache import default_root

    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    model_dir = locate(artifact)[0]
    port = engine.free_port()
    launch = engine.plan_launch(artifact, "auto", port)
    with engine.running(launch, port, default_root(), folder / "engine.log", 1200, print) as (url, _pid):
        with urllib.request.urlopen(f"{url}/v1/models", timeout=30) as response:
            model = json.loads(response.read())["data"][0]["id"]
        for spec in datasets:
            texts = dataset.prepare(dataset.load(spec), "chat", 256, "data", model_dir, None)
            got = answers(url, model, texts.requests, n_answers)
            (folder / f"answers-{spec.split(':')[-1]}.jsonl").write_text("".join(json.dumps(a) + "\n" for a in got))
            for concurrency, requests in points:
                before = scrape(url)
                started = time.time()
                result = run_bench(url, {"dataset": spec}, slo,
                                   {"concurrency": [concurrency], "requests": requests, "endpoint": "chat",
                                    "tokenizer": str(model_dir), "split": [], "plots": False},
                                   folder / f"{spec.split(':')[-1]}-c{concurrency}")
                row = {"artifact": name, "dataset": spec, "concurrency": concurrency, "requests": requests,
                       "seconds": round(time.time() - started, 1), "point": result["points"][0],
                       "speculation": speculation(before, scrape(url))}
                with (folder / "points.jsonl").open("a") as sink:
                    sink.write(json.dumps(row) + "\n")
                print(name, spec, concurrency, json.dumps(row["speculation"]), flush=True)


def summarize(out: Path) -> dict:
    rows = []
    for points in sorted(out.glob("*/points.jsonl")):
        for line in points.read_text().splitlines():
            row = json.loads(line)
            p = row["point"]
            rows.append({"artifact": row["artifact"], "dataset": row["dataset"], "concurrency": row["concurrency"],
                         "output_tok_s": p.get("output_throughput"), "tpot_p50_ms": (p.get("tpot_ms") or {}).get("p50"),
                         "tpot_p99_ms": (p.get("tpot_ms") or {}).get("p99"), "itl_p50_ms": (p.get("itl_ms") or {}).get("p50"),
                         "itl_p99_ms": (p.get("itl_ms") or {}).get("p99"), "ttft_p50_ms": (p.get("ttft_ms") or {}).get("p50"),
                         "goodput": p.get("goodput"), **(row["speculation"] or {})})
    same = {}
    for folder in sorted(out.glob("*-off")):
        model = folder.name[: -len("-off")]
        for other in sorted(out.glob(f"{model}-*")):
            if other == folder:
                continue
            for mine in sorted(folder.glob("answers-*.jsonl")):
                theirs = other / mine.name
                if not theirs.is_file():
                    continue
                a = [json.loads(x)["text"] for x in mine.read_text().splitlines()]
                b = [json.loads(x)["text"] for x in theirs.read_text().splitlines()]
                same[f"{other.name} vs {folder.name} {mine.stem[len('answers-'):]}"] = {
                    "answers": len(a), "identical": sum(x == y for x, y in zip(a, b))}
    summary = {"points": rows, "lossless": same}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def main(argv: list[str]) -> None:
    if argv[:1] == ["summarize"]:
        print(json.dumps(summarize(Path(argv[1])), indent=1))
        return
    out, rest = Path(argv[0]), argv[1:]
    options = {"--datasets": "builtin:rewrite,builtin:continue", "--concurrency": "1,8,32",
               "--requests": "24,64,128", "--answers": "16", "--slo": "ttft_p99_ms=200,tpot_p99_ms=10"}
    targets = []
    while rest:
        word = rest.pop(0)
        if word in options:
            options[word] = rest.pop(0)
        else:
            name, _, path = word.partition("=")
            targets.append((name, Path(path)))
    points = list(zip(map(int, options["--concurrency"].split(",")), map(int, options["--requests"].split(","))))
    slo = {k: float(v) for k, _, v in (b.partition("=") for b in options["--slo"].split(",") if b)}
    for name, artifact in targets:
        measure_artifact(out, name, artifact, options["--datasets"].split(","), points, int(options["--answers"]), slo)
    print(json.dumps(summarize(out), indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
