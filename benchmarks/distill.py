"""How much of what pruning costs the demo model distillation wins back, in how many steps and minutes.

Two ``llmopt run``s (``llmopt.api.run``) on one stage cache, built from the steps of
``recipes/prune-distill-onnx-cpu.toml`` without its export (the candidate is scored in process,
so the figures are the pruning's and the distillation's alone):

* pruned: SmolLM2-135M-Instruct with 6 of its 30 layers dropped (``--prune depth``, prune_depth,
  the recipe's step), or every MLP cut from 1536 to ``--intermediate-size`` neurons (``--prune
  width``, prune_width; 1152 removes about as many parameters as the six layers: 19.9M against
  21.2M of 134.5M);
* distilled: the same pruned stage (from the cache), then ``distill`` for ``--steps`` steps.

Both are scored against the source on the held-out perplexity sets (``--windows`` windows of
256 tokens each) and, with ``--mc``, the 200 built-in multiple-choice questions; the gates give
each paired difference with its 95% interval. Printed as JSON: the variant, the parameters
before and after pruning, the device the stages ran on, per eval the source's, the pruned and
the distilled value with the intervals, the share of the pruning's perplexity loss won back
(``recovered``), the distill stage's steps, seconds and loss, every stage's status and seconds,
and ``uptime`` before and after (this machine is shared: the load average says how loaded it was).

    python benchmarks/distill.py --steps 200 --windows 32 --mc --checkpoint-every 50   # 42 min on a quiet 2-core CPU
    python benchmarks/distill.py --steps 200 --windows 32 --mc --cache /tmp/c                # 100 s on one H200
    python benchmarks/distill.py --prune width --steps 200 --windows 32 --mc --cache /tmp/c  # 76 s more there
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

from llmopt import api

DOMAINS = {"prose": "prose-eval", "fiction": "fiction-eval", "encyclopedia": "encyclopedia-eval", "code": "code-eval"}

HEAD = """\
schema_version = 1
name = "{name}"

[model]
source = "builtin:smollm2-135m"
dtype = "bfloat16"

[calibration]
data = "builtin:mix"
samples = 32
max_seq_len = 256
"""

PRUNE = {
    "depth": """
[[compress]]
method = "prune_depth"
layers = 6
protect_first = 2
protect_last = 1
""",
    "width": """
[[compress]]
method = "prune_width"
intermediate_size = {intermediate_size}
""",
}

DISTILL = """
[[compress]]
method = "distill"
steps = {steps}
batch_size = {batch}
seq_len = {seq_len}
learning_rate = {lr}
warmup_steps = {warmup}
temperature = 1.0
checkpoint_every = {every}
"""


def evals(windows: int, mc: bool, domains: list[str]) -> str:
    out = "".join(f'\n[[eval]]\nname = "{name}"\nkind = "perplexity"\ndata = "builtin:{DOMAINS[name]}"\nwindow = 256\n'
                  f"max_windows = {windows}\nmax_increase_pct = 1000\n" for name in domains)
    if mc:
        out += '\n[[eval]]\nname = "mc"\nkind = "multiple_choice"\ndata = "builtin:mc"\nmetric = "acc"\nmax_drop = 1.0\n'
    return out


def gates(result) -> dict:
    return {g["name"]: {k: g.get(k) for k in ("baseline", "candidate", "delta", "ci", "n")} for g in result.gates}


def device() -> str:
    """The GPU the stages ran on (llmopt picks CUDA when torch sees one), or "cpu"."""
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prune", choices=sorted(PRUNE), default="depth", help="what to prune: 6 of 30 layers "
                        "(the recipe's step) or every MLP's width")
    parser.add_argument("--intermediate-size", type=int, default=1152, help="MLP neurons kept by --prune width "
                        "(of 1536; a multiple of 64)")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--windows", type=int, default=16, help="perplexity windows of 256 tokens per domain")
    parser.add_argument("--domains", default=",".join(DOMAINS), help="perplexity sets, of " + ", ".join(DOMAINS))
    parser.add_argument("--checkpoint-every", type=int, default=25, help="distill's checkpoint_every (in its cache key)")
    parser.add_argument("--mc", action="store_true", help="also the 200 multiple-choice questions")
    parser.add_argument("--cache", default=None, help="stage cache (default: a temporary folder)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="llmopt-distill-"))
    cache = args.cache or str(work / "cache")
    before = uptime()
    tail = evals(args.windows, args.mc, args.domains.split(","))
    head = HEAD + PRUNE[args.prune].format(intermediate_size=args.intermediate_size)
    (work / "pruned.toml").write_text(head.format(name="pruned") + tail)
    distill = DISTILL.format(steps=args.steps, batch=args.batch, seq_len=args.seq_len, lr=args.lr,
                             warmup=max(1, args.steps // 20), every=args.checkpoint_every)
    (work / "distilled.toml").write_text(head.format(name="distilled") + distill + tail)
    pruned = api.run(work / "pruned.toml", cache_dir=cache, output_dir=work / "art-pruned")
    distilled = api.run(work / "distilled.toml", cache_dir=cache, output_dir=work / "art-distilled")
    stage = next(r for r in distilled.records if r.name == "compress.1.distill")
    p, d = gates(pruned), gates(distilled)
    table = {}
    for name in p:
        base, cut, back = p[name]["baseline"], p[name]["candidate"], d[name]["candidate"]
        lost = cut - base if base is not None and cut is not None else None
        table[name] = {"source": base, "pruned": cut, "pruned_delta_ci": p[name]["ci"], "distilled": back,
                       "distilled_delta_ci": d[name]["ci"], "n": p[name]["n"],
                       "recovered": round((cut - back) / lost, 3) if lost else None}
    training = stage.outputs.get("training", {})
    cut = next(r for r in pruned.records if r.name.startswith("compress.0."))
    print(json.dumps({"prune": args.prune, "parameters": [cut.outputs.get("parameters_before"),
                                                           cut.outputs.get("parameters_after")],
                      "device": device(), "steps": training.get("steps"), "batch": args.batch,
                      "seq_len": args.seq_len, "lr": args.lr,
                      "distill_seconds": round(stage.seconds, 1), "distill_status": stage.status,
                      "seconds_per_step": round(training.get("seconds", 0) / max(1, args.steps), 2),
                      "loss_first": training.get("loss_first"), "loss_last": training.get("loss_last"),
                      "evals": table,
                      "stages": {run: {r.name: [r.status, round(r.seconds, 1)] for r in result.records}
                                 for run, result in (("pruned", pruned), ("distilled", distilled))},
                      "uptime_before": before, "uptime_after": uptime(), "work": str(work)}, indent=1))


if __name__ == "__main__":
    main()
