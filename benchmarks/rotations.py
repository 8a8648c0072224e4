"""SpinQuant's foldable rotations (R1, R2) before 4-bit rounding, against the same rounding without them.

llm-compressor's ``SpinQuantModifier`` rotates the residual stream (R1) and each head's values (R2) and
folds the rotations into the weights, so the model computes the same function with other weights; then
``QuantizationModifier`` rounds every decoder linear layer to 4 bits (no data). Each rounding is scored with
and without the rotation, as perplexity on 16 windows of 256 tokens of this repository's README.md and
docs/deploy.md (text no method saw), and printed as one JSON line per case:

    python benchmarks/rotations.py SOURCE_MODEL_DIR [--transform random-hadamard] [--block 0]

SOURCE_MODEL_DIR is a converted model folder (the source stage's model/, or benchmarks/off_grid.py's twin).
Needs llmcompressor, compressed-tensors, torch and transformers (the ``compress`` extra); runs on the CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROUNDINGS = {  # name -> the 4-bit weight arguments of a compressed-tensors scheme (None: no rounding)
    "none": None,
    "symmetric per channel": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "channel"},
    "symmetric groups of 64": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                               "group_size": 64},
    "zero points groups of 32": {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group",
                                 "group_size": 32},
}


def perplexity(model, tokenizer, windows: int = 16, width: int = 256) -> float:
    import torch
    text = (ROOT / "README.md").read_text() + (ROOT / "docs" / "deploy.md").read_text()
    ids = tokenizer(text, return_tensors="pt").input_ids[0][: windows * width]
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(ids) - width + 1, width):
            window = ids[start:start + width][None]
            total += model(window, labels=window).loss.item() * (width - 1)
            count += width - 1
    return math.exp(total / count)


def case(source: Path, rotate: bool, weights: dict | None, transform: str, block: int | None) -> dict:
    import torch
    import transformers
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from llmcompressor.modifiers.transform import SpinQuantModifier

    tokenizer = transformers.AutoTokenizer.from_pretrained(source)
    model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    recipe = []
    if rotate:
        recipe.append(SpinQuantModifier(rotations=["R1", "R2"], transform_type=transform, transform_block_size=block))
    if weights is not None:
        recipe.append(QuantizationModifier(targets="Linear", ignore=["lm_head"],
                                           config_groups={"group_0": {"targets": ["Linear"], "weights": weights}}))
    started = time.monotonic()
    if recipe:
        oneshot(model=model, recipe=recipe, pipeline="datafree")
    return {"seconds": round(time.monotonic() - started, 1), "perplexity": round(perplexity(model, tokenizer), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("--transform", default="random-hadamard", choices=("hadamard", "random-hadamard", "random-matrix"))
    parser.add_argument("--block", type=int, default=0, help="rotation block size (0: the whole dimension)")
    args = parser.parse_args()
    for name, weights in ROUNDINGS.items():
        for rotate in (False, True):
            out = case(args.source, rotate, weights, args.transform, args.block or None)
            print(json.dumps({"source": str(args.source), "rounding": name, "rotation": "R1+R2" if rotate else None,
                              "transform": args.transform if rotate else None, **out}), flush=True)


if __name__ == "__main__":
    main()
