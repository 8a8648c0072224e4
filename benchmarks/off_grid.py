"""The demo model moved off its 4-bit grid: a twin on which no 4-bit method is favoured by the source's format.

The demo model comes from a Q4_1 GGUF file: in every row, each block of 32 input weights takes at most 16
evenly spaced values (a float scale d and minimum m). Asymmetric 4-bit groups of 32 that line up with those
blocks can hold them almost exactly (only the zero point is rounded to an integer), so a 4-bit method measured
on the demo model may win by the grid rather than by what it does. This writes a twin of a converted model
folder whose decoder linear weights each get Gaussian noise of ``fraction`` x its block's level step (d, read
off the block as (max - min) / 15), and says how many blocks held at most 16 distinct values before and after.
The twin is then a source like any other, scored against itself as the baseline:

    python benchmarks/off_grid.py SOURCE_MODEL_DIR TWIN_DIR [--fraction 0.29] [--seed 0]
    llmopt sweep recipes/quickstart.toml -s model.source=TWIN_DIR --axis 'compress[0]=...'

A fraction of 0.29 is the spread of a uniform error over one step (1/sqrt(12)): every block's values are then
spread across its levels. Needs torch and safetensors (the ``torch`` extra).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

BLOCK = 32  # Q4_1's block of input weights
LEVELS = 16
LINEAR = re.compile(r"model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.weight$")


def on_grid(blocks) -> float:
    """The share of blocks whose weights take at most 16 distinct values."""
    import torch

    ordered = torch.sort(blocks.float(), dim=-1).values
    distinct = 1 + (ordered[..., 1:] != ordered[..., :-1]).sum(-1)
    return float((distinct <= LEVELS).float().mean())


def twin(source: Path, out: Path, fraction: float, seed: int) -> dict:
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, out, ignore=shutil.ignore_patterns("*.safetensors", "*.safetensors.index.json"))
    generator = torch.Generator().manual_seed(seed)
    before, after, moved = [], [], []
    files = sorted(source.glob("*.safetensors"))
    for path in files:
        tensors = load_file(path)
        for name, weight in tensors.items():
            if not LINEAR.search(name) or weight.shape[1] % BLOCK:
                continue
            blocks = weight.float().reshape(weight.shape[0], -1, BLOCK)
            step = (blocks.amax(-1, keepdim=True) - blocks.amin(-1, keepdim=True)) / (LEVELS - 1)
            noise = torch.randn(blocks.shape, generator=generator) * step * fraction
            moved_blocks = (blocks + noise).to(weight.dtype)
            before.append(on_grid(blocks.to(weight.dtype)))
            after.append(on_grid(moved_blocks))
            moved.append(float((noise.abs() / step.clamp_min(1e-12)).mean()))
            tensors[name] = moved_blocks.reshape(weight.shape).contiguous()
        save_file(tensors, out / path.name, metadata={"format": "pt"})
    if (source / "model.safetensors.index.json").is_file():
        shutil.copy2(source / "model.safetensors.index.json", out)
    return {"source": str(source), "twin": str(out), "fraction": fraction, "seed": seed, "linears": len(before),
            "blocks_on_grid_before": sum(before) / len(before), "blocks_on_grid_after": sum(after) / len(after),
            "mean_move_in_steps": sum(moved) / len(moved)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="a converted Hugging Face model folder (the source stage's model/)")
    parser.add_argument("out", type=Path, help="the twin's folder (must not exist)")
    parser.add_argument("--fraction", type=float, default=0.29, help="noise sigma as a fraction of the block's step")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(json.dumps(twin(args.source, args.out, args.fraction, args.seed), indent=1))


if __name__ == "__main__":
    main()
