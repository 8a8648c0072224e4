"""llmopt's compress stage against the same llm-compressor call written directly, on a GPU.

A random-weight Llama of a real shape (``8b``: Llama-3-8B's shape with a 49152 vocabulary;
``1b``: 2048 hidden, 16 layers) is saved once as a Hugging Face folder. Each method then runs
two ways on the same folder, options and calibration rows:

* direct: ``AutoModelForCausalLM.from_pretrained`` to the GPU, ``oneshot`` with the modifiers
  llmopt's backend builds, save;
* llmopt: ``llmopt.api.run`` on a recipe with that folder as source and the one compress
  step (source fingerprint, compress stage, artifact with checksums), in a fresh cache.

Printed as JSON lines: wall seconds and peak GPU memory of each, and llmopt's compress stage
time alone. Usage (on a CUDA machine with the ``compress`` extra)::

    python benchmarks/compress_gpu.py --shape 8b --methods fp8,gptq --tokenizer TOKENIZER_DIR
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
METHODS = {"fp8": ("fp8", {}), "gptq": ("gptq", {"scheme": "W4A16", "group_size": 128})}


def make_model(shape: str, tokenizer: Path, folder: Path) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    if (folder / "config.json").exists():
        return
    config = LlamaConfig(**SHAPES[shape])
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tokenizer).save_pretrained(folder)
    del model
    torch.cuda.empty_cache()


def recipe_text(folder: Path, method: str, options: dict, samples: int, seq_len: int) -> str:
    opts = "".join(f"{k} = {json.dumps(v)}\n" for k, v in options.items())
    return (f'schema_version = 1\nname = "bench-{method}"\n[model]\nsource = "{folder}"\n'
            f'[calibration]\ndata = "builtin:prose"\nsamples = {samples}\nmax_seq_len = {seq_len}\n'
            f'[[compress]]\nmethod = "{method}"\n{opts}')


def direct(folder: Path, loaded, out: Path) -> dict:
    """The library call an engineer would write: load, oneshot, save."""
    import torch
    from llmcompressor import oneshot
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llmopt import calibration, registry

    stage = registry.get("compress", loaded.recipe.compress[0].method)
    options = loaded.options_for("compress", 0)
    torch.cuda.reset_peak_memory_stats()
    started = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).to("cuda")
    kwargs = {}
    if stage.calibrates:
        rows = calibration.token_rows(loaded.recipe.calibration, tokenizer)
        kwargs = dict(dataset=calibration.as_dataset(rows), num_calibration_samples=len(rows.rows),
                      max_seq_length=rows.seq_len, shuffle_calibration_samples=False)
    module = __import__(stage.__module__, fromlist=["build"])
    oneshot(model=model, processor=tokenizer, recipe=module.build(options), output_dir=str(out), **kwargs)
    torch.cuda.synchronize()
    seconds = time.monotonic() - started
    del model
    torch.cuda.empty_cache()
    return {"wall_s": round(seconds, 1), "peak_gpu_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1)}


def via_llmopt(recipe: Path, work: Path) -> dict:
    import torch

    from llmopt import api

    torch.cuda.reset_peak_memory_stats()
    started = time.monotonic()
    result = api.run(recipe, cache_dir=work / "cache", output_dir=work / "artifact")
    torch.cuda.synchronize()
    seconds = time.monotonic() - started
    stage = [r for r in result.records if r.name.startswith("compress")][0]
    return {"wall_s": round(seconds, 1), "peak_gpu_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1),
            "compress_stage_s": round(stage.seconds, 1),
            "library_s": stage.outputs.get("compress_seconds"),
            "source_stage_s": round(result.records[0].seconds, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="8b", choices=sorted(SHAPES))
    parser.add_argument("--methods", default="fp8,gptq")
    parser.add_argument("--tokenizer", required=True, help="folder with a small tokenizer (the demo model's)")
    parser.add_argument("--work", default="/tmp/llmopt-bench")
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # "<method>:<path>": one measurement, in this process
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from llmopt.recipe import load_recipe

    work = Path(args.work)
    folder = work / f"random-{args.shape}"
    started = time.monotonic()
    make_model(args.shape, Path(args.tokenizer), folder)
    if not args.one:
        print(json.dumps({"shape": args.shape, "gpu": torch.cuda.get_device_name(0), "model_saved_s": round(time.monotonic() - started, 1)}), flush=True)
    if args.one:
        name, path = args.one.split(":")
        method, options = METHODS[name]
        recipe = work / f"{name}.toml"
        recipe.write_text(recipe_text(folder, method, options, args.samples, args.seq_len))
        target = work / f"{path}-{name}"
        result = direct(folder, load_recipe(recipe), target) if path == "direct" else via_llmopt(recipe, target)
        shutil.rmtree(target, ignore_errors=True)
        print("RESULT " + json.dumps(result), flush=True)
        return
    for name in args.methods.split(","):
        row = {"shape": args.shape, "method": name, "options": METHODS[name][1],
               "calibration": f"{args.samples}x{args.seq_len}" if name != "fp8" else None}
        for repeat in range(args.repeats):
            for path in ("direct", "llmopt"):  # each measurement in its own process: clean GPU peaks
                row.setdefault(path, []).append(measure(args, name, path))
        for path in ("direct", "llmopt"):
            row[f"{path}_median_wall_s"] = statistics.median(r["wall_s"] for r in row[path])
        row["ratio_wall"] = round(row["llmopt_median_wall_s"] / row["direct_median_wall_s"], 3)
        print(json.dumps(row), flush=True)


def measure(args, name: str, path: str) -> dict:
    command = [sys.executable, __file__, "--shape", args.shape, "--tokenizer", args.tokenizer, "--work", args.work,
               "--samples", str(args.samples), "--seq-len", str(args.seq_len), "--one", f"{name}:{path}"]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return json.loads([line for line in out.splitlines() if line.startswith("RESULT ")][-1][7:])


if __name__ == "__main__":
    main()
