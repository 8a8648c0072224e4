"""A draft's acceptance by the served model, by the acceptance stage's own method, over longer answers and more
prompts than the stage scores, and as an engine asked with ``ignore_eos`` generates them.

    python3 benchmarks/draft_acceptance.py ARTIFACT DATASET PROMPTS [--output-len 256]
    python3 benchmarks/draft_acceptance.py ARTIFACT DATASET PROMPTS --ignore-eos

ARTIFACT is an artifact of a recipe with [[draft]] (its model/ and draft/ folders). Without --ignore-eos each
prompt's greedy answer runs to its end of sequence or --output-len tokens, and the figures are given for the
answers' first 128 tokens, for the rest, and for the whole. With --ignore-eos each answer runs to its record's
own length (``max_tokens`` as `llmopt bench` sends it), the end-of-sequence token generated and passed as vLLM
does with ignore_eos, and the figures are given to the answer's own end, past it, and for the whole. Figures:
``llmopt.bench.acceptance.figures`` (vLLM's acceptance rate, mean acceptance length, per draft position).
docs/results/speculative.md, "Served by vLLM: the draft's acceptance and speed on an H100", has what this gave.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from llmopt.bench import dataset as datasets
from llmopt.bench.acceptance import figures, prompt_ids, walk
from llmopt.runtimes.hf import TransformersRuntime

NUM_TOKENS = 3  # the draft recipe's num_tokens
FIRST = 128  # the stage's answer length (llmopt.bench.acceptance.acceptance_options)


def past_eos(target: TransformersRuntime, ids: list[int], length: int) -> list[int]:
    """Greedy tokens to ``length``, an end-of-sequence token generated and passed (vLLM's ignore_eos)."""
    with torch.no_grad():
        out = target.model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                    max_new_tokens=length, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(ids):].tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("dataset")
    parser.add_argument("prompts", type=int)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--ignore-eos", action="store_true")
    args = parser.parse_args()
    model_dir, draft_dir = args.artifact / "model", args.artifact / "draft"
    target, draft = TransformersRuntime(model_dir, "cpu"), TransformersRuntime(draft_dir, "cpu")
    data = datasets.load(args.dataset, Path("."))
    items = data.items[: args.prompts]
    requests = datasets.prepare(data, "chat", 256, "data", model_dir, None).requests
    parts: dict[str, list[dict]] = {}
    for index, (item, request) in enumerate(zip(items, requests)):
        ids = prompt_ids(target, model_dir, item)
        own = target.generate(ids, request.max_tokens if args.ignore_eos else args.output_len, target.eos_ids)
        answer = past_eos(target, ids, request.max_tokens) if args.ignore_eos else own
        guesses = draft.logits(ids + answer)[len(ids) - 1: len(ids) - 1 + len(answer)].argmax(-1).tolist()
        matches = [g == t for g, t in zip(guesses, answer)]
        cut = len(own) if args.ignore_eos else FIRST
        names = ("to the end", "past the end") if args.ignore_eos else (f"first {FIRST}", f"after {FIRST}")
        for name, part in (("whole", matches), (names[0], matches[:cut]), (names[1], matches[cut:])):
            if part:
                parts.setdefault(name, []).append(walk(part, NUM_TOKENS))
        print(json.dumps({"prompt": index, "prompt_tokens": len(ids), "answer_tokens": len(answer),
                          "own_end": len(own), "agreement": round(sum(matches) / len(matches), 4)}), flush=True)
    for name, walks in parts.items():
        print(name, json.dumps(figures(walks, NUM_TOKENS)))


if __name__ == "__main__":
    main()
