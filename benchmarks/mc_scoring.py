"""The multiple-choice eval's two ways of scoring a question's choices, side by side on one model.

``shared``: the runtime's ``continuation_nll``, the choices of a question from shared passes over its
context (transformers: the context once, the longer choices continuing its key/value cache; ONNX
Runtime: a choice of one token read from another choice's pass). ``whole``: each context + choice
scored as one sequence by ``nll``, as an endpoint's runtime still scores them. Both through the eval
backend's own ``score_requests``, on the requests the eval builds from ``builtin:mc`` (its default
prompt, all 200 questions), round after round in turn, so that a change of load on a shared machine
falls on both alike. The result: each way's median seconds over the rounds, and how far the two
ways' log-likelihoods and picks differ.

    .venv/bin/python benchmarks/mc_scoring.py hf MODEL_DIR 3 out.json      # a Hugging Face folder, transformers
    .venv/bin/python benchmarks/mc_scoring.py ort MODEL_DIR 3 out.json     # an ONNX Runtime GenAI folder
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path


class Whole:
    """A runtime seen without ``continuation_nll``: the eval then scores each context + choice whole."""

    def __init__(self, model):
        self.nll = model.nll


def requests_of(model) -> list[tuple]:
    """The eval's requests for builtin:mc, as it builds them with its default options."""
    from llmopt import data
    from llmopt.backends.eval.multiple_choice import MultipleChoiceOptions, build_requests

    items = data.load_records("builtin:mc")
    return build_requests(model, MultipleChoiceOptions(), items, items)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runtime", choices=["hf", "ort"])
    parser.add_argument("model", type=Path)
    parser.add_argument("rounds", type=int)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    from llmopt.backends.eval.multiple_choice import score_requests

    if args.runtime == "hf":
        from llmopt.runtimes.hf import TransformersRuntime
        model = TransformersRuntime(args.model)
    else:
        from llmopt.runtimes.onnx import OnnxRuntime
        model = OnnxRuntime(args.model)
    requests = requests_of(model)
    ways = {"shared": model, "whole": Whole(model)}
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    scores: dict[str, dict] = {}
    for _ in range(args.rounds):
        for name, scorer in ways.items():
            started = time.perf_counter()
            scores[name] = score_requests(scorer, requests, 16, lambda _: None)
            seconds[name].append(time.perf_counter() - started)
    questions = sorted({i for i, *_ in requests})
    picks = {name: [max((j for (q, j) in s if q == i), key=lambda j: s[i, j]) for i in questions]
             for name, s in scores.items()}
    result = {
        "runtime": model.name, "model": str(args.model), "questions": len(questions), "sequences": len(requests),
        "threads": os.environ.get("OMP_NUM_THREADS"), "rounds": args.rounds, "seconds": seconds,
        "median_s": {name: statistics.median(v) for name, v in seconds.items()},
        "max_loglik_difference": max(abs(scores["shared"][k] - scores["whole"][k]) for k in scores["whole"]),
        "picks_that_differ": sum(a != b for a, b in zip(picks["shared"], picks["whole"])),
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    json.dump({k: v for k, v in result.items() if k != "seconds"}, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
