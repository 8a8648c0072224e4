"""llmopt's compress stage against the same llm-compressor call written directly, on a GPU, for each placement.

A random-weight model of a real shape is saved once as a Hugging Face folder (``SHAPES``:
Llama-3-8B's shape with a 49152 vocabulary; Qwen2.5-32B's and Mixtral-8x7B's layer shapes with
fewer layers, named by their layer count). Each method then runs for each placement
(``gpu``: the whole model moved to the GPU; ``onload``: left in host memory, the library's
sequential / datafree pipeline onloads one layer at a time) and each side, each run in its own
process:

* direct: ``AutoModelForCausalLM.from_pretrained``, ``.to("cuda")`` for the gpu placement,
  ``oneshot`` with the modifiers llmopt's backend builds, save;
* llmopt: ``llmopt.api.run`` on a recipe with that folder as source, the one compress step and
  ``[compute] placement`` (source fingerprint, compress stage, artifact), in a fresh cache.

Each run records wall seconds, peak GPU memory per device (``torch.cuda.max_memory_allocated``
and, sampled every 50 ms, NVML's used memory, which adds the CUDA context), peak host memory
(VmHWM: resident anonymous and mapped-file pages) and what ``llmopt.model.placement`` predicted for
that placement. JSON lines on stdout and in ``--out``. Usage (on a CUDA machine with the
``compress`` extra)::

    python benchmarks/compress_gpu.py --shapes 8b --methods fp8,gptq --placements gpu,onload \\
        --tokenizer TOKENIZER_DIR --out results.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

LLAMA_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                num_key_value_heads=8, vocab_size=49152, tie_word_embeddings=False,
                max_position_embeddings=8192)
QWEN25_32B = dict(hidden_size=5120, intermediate_size=27648, num_attention_heads=40, num_key_value_heads=8,
                  vocab_size=152064, tie_word_embeddings=False, max_window_layers=64)
MIXTRAL_8X7B = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                    vocab_size=32000, num_local_experts=8, num_experts_per_tok=2, tie_word_embeddings=False)
SHAPES = {  # name -> (architecture, config)
    "8b": ("llama", LLAMA_8B),
    "1b": ("llama", dict(LLAMA_8B, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16)),
    "qwen32b-16l": ("qwen2", dict(QWEN25_32B, num_hidden_layers=16)),  # 16 of Qwen2.5-32B's 64 layers
    "qwen32b-32l": ("qwen2", dict(QWEN25_32B, num_hidden_layers=32)),
    "mixtral-4l": ("mixtral", dict(MIXTRAL_8X7B, num_hidden_layers=4)),  # 4 of Mixtral-8x7B's 32 layers
    "mixtral-8l": ("mixtral", dict(MIXTRAL_8X7B, num_hidden_layers=8)),
    "tiny": ("llama", dict(LLAMA_8B, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, vocab_size=512)),
    "tiny-moe": ("mixtral", dict(MIXTRAL_8X7B, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, vocab_size=512)),
}
METHODS = {"fp8": ("fp8", {}), "gptq": ("gptq", {"scheme": "W4A16", "group_size": 128})}


def make_model(shape: str, tokenizer: Path, folder: Path) -> float:
    """The random-weight model saved as a folder (built on the GPU when there is one); seconds taken."""
    import torch
    import transformers
    from transformers import AutoTokenizer

    if (folder / "config.json").exists():
        return 0.0
    started = time.monotonic()
    arch, config = SHAPES[shape]
    classes = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
               "mixtral": ("MixtralConfig", "MixtralForCausalLM")}[arch]
    cfg = getattr(transformers, classes[0])(**config)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = getattr(transformers, classes[1])(cfg).to(torch.bfloat16)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tokenizer).save_pretrained(folder)
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return time.monotonic() - started


def recipe_text(folder: Path, method: str, options: dict, samples: int, seq_len: int, placement: str) -> str:
    opts = "".join(f"{k} = {json.dumps(v)}\n" for k, v in options.items())
    return (f'schema_version = 1\nname = "bench-{method}"\n[model]\nsource = "{folder}"\n'
            f'[calibration]\ndata = "builtin:prose"\nsamples = {samples}\nmax_seq_len = {seq_len}\n'
            f'[[compress]]\nmethod = "{method}"\n{opts}[compute]\ngpu = "H200"\nhost_ram_gib = 125\n'
            f'placement = "{placement}"\n')


def direct(folder: Path, loaded, out: Path, placement: str) -> dict:
    """The library call an engineer would write: load, (move to the GPU), oneshot, save."""
    import torch
    from llmcompressor import oneshot
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llmopt import registry

    from llmopt.data import calibration
    stage = registry.get("compress", loaded.recipe.compress[0].method)
    options = loaded.options_for("compress", 0)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    if placement == "gpu" and torch.cuda.is_available():
        model.to("cuda")
    kwargs = {}
    if stage.calibrates:
        rows = calibration.token_rows(loaded.recipe.calibration, tokenizer)
        kwargs = dict(dataset=calibration.as_dataset(rows), num_calibration_samples=len(rows.rows),
                      max_seq_length=rows.seq_len, shuffle_calibration_samples=False)
    module = __import__(stage.__module__, fromlist=["build"])
    oneshot(model=model, processor=tokenizer, recipe=module.build(options), output_dir=str(out), **kwargs)
    return {}


def via_llmopt(recipe: Path, work: Path) -> dict:
    from llmopt import api

    result = api.run(recipe, cache_dir=work / "cache", output_dir=work / "artifact")
    stage = [r for r in result.records if r.name.startswith("compress")][0]
    return {"compress_stage_s": round(stage.seconds, 1), "library_s": stage.outputs.get("compress_seconds"),
            "placement_used": stage.outputs.get("placement")}


class NvmlPeaks:
    """NVML's used memory of every GPU, sampled every 50 ms on a thread; the peak of each."""

    def __init__(self):
        self.peaks: list[int] = []
        try:
            import pynvml

            pynvml.nvmlInit()
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self.read = lambda h: pynvml.nvmlDeviceGetMemoryInfo(h).used
        except Exception:  # no NVML here (a CPU machine): no samples
            self.handles = []
        self.peaks = [0] * len(self.handles)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True)
        self.thread.start()

    def sample(self) -> None:
        while not self.stop.wait(0.05):
            for i, handle in enumerate(self.handles):
                self.peaks[i] = max(self.peaks[i], self.read(handle))

    def done(self) -> list[float]:
        self.stop.set()
        self.thread.join()
        return [round(p / 2**30, 2) for p in self.peaks]


def one(args, name: str, side: str, placement: str) -> None:
    """One measurement, in this process; prints ``RESULT {...}``."""
    nvml = NvmlPeaks()
    started = time.monotonic()
    import torch

    from llmopt.recipe import load_recipe
    from llmopt.sysinfo import peak_rss_bytes

    work, folder = Path(args.work), Path(args.work) / f"random-{args.shape}"
    method, options = METHODS[name]
    recipe = work / f"{name}-{placement}.toml"
    recipe.write_text(recipe_text(folder, method, options, args.samples, args.seq_len, placement))
    target = work / f"{side}-{name}-{placement}"
    imported = time.monotonic()
    extra = direct(folder, load_recipe(recipe), target, placement) if side == "direct" else via_llmopt(recipe, target)
    shutil.rmtree(target, ignore_errors=True)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
    allocated = [round(torch.cuda.max_memory_allocated(i) / 2**30, 2) for i in range(torch.cuda.device_count())] \
        if cuda else []
    print("RESULT " + json.dumps({"work_s": round(time.monotonic() - imported, 1), "import_s": round(imported - started, 1),
                                  "peak_gpu_gib": allocated, "peak_nvml_gib": nvml.done(),
                                  "peak_host_gib": round(peak_rss_bytes() / 2**30, 2), **extra}), flush=True)


def predicted(recipe: Path, placement: str) -> dict:
    """What ``llmopt plan`` predicts for this run (the recipe's [compute]: one H200, the H200 host's memory)."""
    from llmopt.plan import build_plan
    from llmopt.recipe import load_recipe

    plan = build_plan(load_recipe(recipe), cache_dir=recipe.parent / "plan-cache")
    fp = plan.estimates["compress_placement"]["placements"][placement]
    return {"params_b": round(plan.model.total_params / 1e9, 2), "pred_gpu_gib": round(fp["gpu_bytes"] / 2**30, 2),
            "pred_host_gib": round(fp["host_bytes"] / 2**30, 2), "pred_s": fp["seconds"],
            "pred_time_class": fp["time_class"]}


def measure(args, name: str, side: str, placement: str) -> dict:
    command = [sys.executable, __file__, "--shapes", args.shape, "--tokenizer", args.tokenizer, "--work", args.work,
               "--samples", str(args.samples), "--seq-len", str(args.seq_len), "--one", f"{name}:{side}:{placement}"]
    started = time.monotonic()
    proc = subprocess.run(command, capture_output=True, text=True)
    wall = round(time.monotonic() - started, 1)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        return {"wall_s": wall, "error": (proc.stderr or proc.stdout)[-1500:]}
    return {"wall_s": wall, **json.loads(lines[-1][7:])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="8b", help=f"comma-separated: {', '.join(SHAPES)}")
    parser.add_argument("--methods", default="fp8,gptq")
    parser.add_argument("--placements", default="gpu,onload")
    parser.add_argument("--sides", default="direct,llmopt")
    parser.add_argument("--tokenizer", required=True, help="folder with a small tokenizer (the demo model's)")
    parser.add_argument("--work", default="/tmp/llmopt-bench")
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--out", help="append each result line to this file too")
    parser.add_argument("--keep", action="store_true", help="keep each shape's model folder afterwards")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # "<method>:<side>:<placement>": one run, in this process
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.one:
        args.shape = args.shapes
        one(args, *args.one.split(":"))
        return
    for shape in args.shapes.split(","):
        args.shape = shape
        folder = Path(args.work) / f"random-{shape}"
        built = make_model(shape, Path(args.tokenizer), folder)
        emit(args, {"shape": shape, "model_saved_s": round(built, 1)})
        for name in args.methods.split(","):
            for placement in args.placements.split(","):
                method, options = METHODS[name]
                recipe = Path(args.work) / f"{name}-{placement}.toml"
                recipe.write_text(recipe_text(folder, method, options, args.samples, args.seq_len, placement))
                row = {"shape": shape, "method": name, "placement": placement, **predicted(recipe, placement)}
                for side in args.sides.split(","):
                    emit(args, row | {"side": side, **measure(args, name, side, placement)})
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)


def emit(args, row: dict) -> None:
    line = json.dumps(row)
    print(line, flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
