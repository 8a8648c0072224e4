"""The next-token logits of one chat prompt: llama.cpp against the ONNX variants of ``ort_cpu.py``.

A close look at how faithfully an ONNX model follows llama.cpp on the same GGUF file: the
five best next tokens after the prompt, with their logits, from llama.cpp and from each
ONNX model folder given (built by ``benchmarks/ort_cpu.py`` under its ``--work`` folder).

    .venv/bin/python benchmarks/next_token.py \\
        .llmopt-cache/bench-ort-cpu/artifacts/{ort-fp32,ort-int4-gguf-acc4,ort-int4-gguf-acc1}/model

llama.cpp runs in its own environment (``--llama-python``), as in ``ort_cpu.py``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "What is the capital of France?"


def top(logits: np.ndarray, decode, k: int = 5) -> list:
    return [(decode(int(t)), round(float(logits[t]), 3)) for t in np.argsort(-logits)[:k]]


def llamacpp_worker(gguf: str, ids: list[int]) -> None:
    from llama_cpp import Llama

    llm = Llama(model_path=gguf, n_ctx=256, n_threads=1, logits_all=True, verbose=False)
    llm.eval(ids)
    scores = np.array(llm.scores[len(ids) - 1])
    print(json.dumps(top(scores, lambda t: llm.detokenize([t]).decode(errors="replace"))))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="*", help="ONNX model folders")
    parser.add_argument("--llama-python", default=str(ROOT / ".bench-envs" / "llamacpp" / "bin" / "python"))
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        llamacpp_worker(args.worker[0], json.loads(args.worker[1]))
        return 0
    sys.path.insert(0, str(ROOT))
    from transformers import AutoTokenizer

    from llmopt.model.modelinfo import gguf_path
    from llmopt.runtimes.onnx import OnnxRuntime

    models = [Path(m) for m in args.models]
    tok = AutoTokenizer.from_pretrained(models[0]) if models else None
    if tok is None:
        parser.error("give at least one ONNX model folder (its tokenizer encodes the prompt)")
    ids = tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    done = subprocess.run([args.llama_python, __file__, "--worker", str(gguf_path("builtin:smollm2-135m")),
                           json.dumps(ids)], capture_output=True, text=True, check=False)
    print(f"prompt: {PROMPT!r} ({len(ids)} tokens with the chat template)")
    print("llama.cpp (GGUF Q4_1):", done.stdout.strip() or done.stderr.strip()[-500:])
    for model in models:
        logits = OnnxRuntime(model).logits(ids)[-1]
        print(f"{model.parent.name}:", json.dumps(top(logits, lambda t: tok.decode([t]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
