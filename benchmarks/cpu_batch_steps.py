"""What a batched decode step costs on this CPU, from the kernel up to `llmopt serve`'s batch engine.

Three layers, each timed alone on an int4 ONNX model folder (the quickstart's `artifacts/quickstart/model`):

1. the int4 kernel: one MatMulNBits node of the demo model's shapes (hidden 576, MLP 1,536, vocabulary
   49,152; 4-bit blocks of 32 with zero points) at M = 1, 2, 4, 8 rows, accuracy levels 1 and 4;
2. the whole model, one decode step: onnxruntime-genai's og.Generator at batch 1 and 4 (equal prompts of
   PROMPT tokens), the mean step after the prompt, on 1 and 2 intra-op threads;
3. `llmopt serve --max-num-seqs`'s engine (OnnxRuntime.batch_engine: og.Engine, which batches
   statically on a CPU) given N requests at once: output tokens per second from the first request begun to the
   last token, prompts included, with the engine's context (search.max_length) at PROMPT + OUTPUT + 32 and
   at the folder's own (the quickstart's 8,192).

    .venv/bin/python benchmarks/cpu_batch_steps.py artifacts/quickstart/model

Prints one JSON line per figure. Run it on a quiet machine: every figure is one process's time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROUNDS = 5  # timed rounds of the engine layer, after one untimed; the median is reported


def kernel(K: int, N: int, level: int, rows: int, reps: int = 200) -> float:
    """Microseconds of one MatMulNBits call (4 bits, blocks of 32, zero points) at ``rows`` rows, one thread."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    block = 32
    blocks = K // block
    rng = np.random.default_rng(0)
    weights = rng.integers(0, 255, (N, blocks, block // 2), dtype=np.uint8)
    scales = rng.random(N * blocks, dtype=np.float32) * 0.01
    zeros = rng.integers(0, 255, (N * ((blocks + 1) // 2),), dtype=np.uint8)
    node = helper.make_node("MatMulNBits", ["A", "B", "S", "Z"], ["Y"], domain="com.microsoft", K=K, N=N, bits=4,
                            block_size=block, accuracy_level=level)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", K])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", N])],
        [helper.make_tensor(name, TensorProto.UINT8 if name != "S" else TensorProto.FLOAT, array.shape,
                            array.tobytes(), raw=True) for name, array in (("B", weights), ("S", scales), ("Z", zeros))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    a = rng.random((rows, K), dtype=np.float32)
    for _ in range(5):
        session.run(None, {"A": a})
    start = time.perf_counter()
    for _ in range(reps):
        session.run(None, {"A": a})
    return (time.perf_counter() - start) / reps * 1e6


def load(og, folder: str, threads: int, overlay: dict | None = None):
    config = og.Config(folder)
    config.clear_providers()
    config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": threads}}}}))
    if overlay:
        config.overlay(json.dumps(overlay))
    return og.Model(config)


def prompts(count: int, length: int) -> list[list[int]]:
    return [[(7 * i + 11 + b) % 300 + 20 for i in range(length)] for b in range(count)]


def generator_step(og, folder: str, batch: int, threads: int, prompt: int, steps: int = 32) -> float:
    """Milliseconds of one og.Generator decode step at ``batch`` rows (the best of two runs of ``steps``)."""
    model = load(og, folder, threads)
    ids = np.asarray(prompts(batch, prompt), dtype=np.int32)

    def run(count: int) -> float:
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=prompt + count + 1, batch_size=batch, do_sample=False)
        generator = og.Generator(model, params)
        generator.append_tokens(ids)
        start = time.perf_counter()
        for _ in range(count):
            generator.generate_next_token()
        return (time.perf_counter() - start) / count

    run(4)
    return min(run(steps) for _ in range(2)) * 1e3


def engine_rate(og, folder: str, requests: int, threads: int, prompt: int, output: int, max_length: int | None) -> dict:
    """The engine `llmopt serve --max-num-seqs` opens (OnnxRuntime.batch_engine, on ``threads`` threads as
    LLMOPT_CPU_THREADS sets them), ``requests`` equal requests begun at once: output tok/s, prompts included (the
    median of ROUNDS rounds after one untimed)."""
    from llmopt.runtimes.onnx import OnnxRuntime

    os.environ["LLMOPT_CPU_THREADS"] = str(threads)
    batch = OnnxRuntime(Path(folder)).batch_engine(requests, max_length)
    batch.open()

    def run() -> tuple[int, float]:
        turns = [batch.start(ids, output, min_new_tokens=output) for ids in prompts(requests, prompt)]
        start, tokens = time.perf_counter(), 0
        while any(not turn.finished for turn in turns):
            tokens += sum(1 for _, token, _ in batch.step() if token is not None)
        return tokens, time.perf_counter() - start

    run()
    rounds = sorted((run() for _ in range(ROUNDS)), key=lambda r: r[0] / r[1])
    tokens, seconds = rounds[len(rounds) // 2]  # the median round: one round is a second or two, and moves
    return {"tokens": tokens, "seconds": round(seconds, 3), "output_tok_s": round(tokens / seconds, 1),
            "rounds_tok_s": [round(t / s, 1) for t, s in rounds]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="an int4 ONNX Runtime GenAI folder")
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--output", type=int, default=32)
    args = parser.parse_args()
    import onnxruntime_genai as og

    for K, N in ((576, 1536), (1536, 576), (576, 49152)):
        for level in (1, 4):
            times = {rows: kernel(K, N, level, rows, 200 if N < 10000 else 40) for rows in (1, 2, 4, 8)}
            print(json.dumps({"layer": "kernel", "K": K, "N": N, "accuracy_level": level,
                              "us": {m: round(t, 1) for m, t in times.items()},
                              "vs_one_row": {m: round(t / times[1], 2) for m, t in times.items()}}), flush=True)
    for threads in (1, 2):
        steps = {batch: generator_step(og, args.model, batch, threads, args.prompt) for batch in (1, 4)}
        print(json.dumps({"layer": "og.Generator step", "threads": threads, "ms": {b: round(t, 2) for b, t in steps.items()},
                          "tok_s": {b: round(b * 1e3 / t) for b, t in steps.items()}}), flush=True)
    for threads in (1, 2):
        for requests in (1, 4):
            for max_length in (args.prompt + args.output + 32, None):
                got = engine_rate(og, args.model, requests, threads, args.prompt, args.output, max_length)
                print(json.dumps({"layer": "og.Engine (llmopt serve --max-num-seqs)", "threads": threads,
                                  "requests": requests, "max_length": max_length or "the folder's", **got}), flush=True)


if __name__ == "__main__":
    main()
