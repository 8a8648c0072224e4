"""What a batched decode step costs on this CPU, from the kernel up to `llmopt serve`'s batch engine.

Four layers, each timed alone on an int4 ONNX model folder (the quickstart's `artifacts/quickstart/model`):

1. the int4 kernel: one MatMulNBits node of the demo model's shapes (hidden 576, MLP 1,536, vocabulary
   49,152; 4-bit blocks of 32 with zero points) at M = 1, 2, 4, 8 rows, accuracy levels 1 and 4;
2. the whole model, one decode step: onnxruntime-genai's og.Generator at batch 1 and 4 (equal prompts of
   PROMPT tokens), the mean step after the prompt, on 1 and 2 intra-op threads;
3. `llmopt serve --max-num-seqs`'s engine (OnnxRuntime.batch_engine: og.Engine, which batches
   statically on a CPU) given N requests at once: output tokens per second from the first request begun to the
   last token, prompts included, with the engine's context (search.max_length) at PROMPT + OUTPUT + 32 and
   at the folder's own (the quickstart's 8,192);
4. four requests on the machine's two cores, split three ways, each process timed at once with the others
   (engine-level upper bounds of the server modes, no HTTP): two processes of one thread generating one
   request at a time (`--parallel 2`), two processes of one thread each batching two (`--parallel 2` with
   batches of 2, which `llmopt serve` does not offer), one process of two threads batching four
   (`--max-num-seqs 4`); at the 64/32-token requests above and at the quickstart's workload (256 prompt, 128
   output tokens), the engine's context at the quickstart's served 2,048.

    .venv/bin/python benchmarks/cpu_batch_steps.py artifacts/quickstart/model
    .venv/bin/python benchmarks/cpu_batch_steps.py artifacts/quickstart/model --layers split   # layer 4 alone

Prints one JSON line per figure. Run it on a quiet machine: every figure but layer 4's is one process's time.
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


def load(og, folder: str, threads: int):
    config = og.Config(folder)
    config.clear_providers()
    config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": threads}}}}))
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


def batch_round(batch, ids: list[list[int]], output: int) -> tuple[int, float]:
    """The requests ``ids`` begun at once in ``batch`` (an EngineBatch), each ``output`` tokens: (tokens, seconds)
    until the last one ends."""
    turns = [batch.start(row, output, min_new_tokens=output) for row in ids]
    start, tokens = time.perf_counter(), 0
    while any(not turn.finished for turn in turns):
        tokens += sum(1 for _, token, _ in batch.step() if token is not None)
    return tokens, time.perf_counter() - start


def engine_rate(folder: str, requests: int, threads: int, prompt: int, output: int, max_length: int | None) -> dict:
    """The engine `llmopt serve --max-num-seqs` opens (OnnxRuntime.batch_engine, on ``threads`` threads as
    LLMOPT_CPU_THREADS sets them), ``requests`` equal requests begun at once: output tok/s, prompts included (the
    median of ROUNDS rounds after one untimed)."""
    from llmopt.runtimes.onnx import OnnxRuntime

    os.environ["LLMOPT_CPU_THREADS"] = str(threads)
    batch = OnnxRuntime(Path(folder)).batch_engine(requests, max_length)
    batch.open()
    ids = prompts(requests, prompt)

    batch_round(batch, ids, output)
    rounds = sorted((batch_round(batch, ids, output) for _ in range(ROUNDS)), key=lambda r: r[0] / r[1])
    tokens, seconds = rounds[len(rounds) // 2]  # the median round: one round is a second or two, and moves
    return {"tokens": tokens, "seconds": round(seconds, 3), "output_tok_s": round(tokens / seconds, 1),
            "rounds_tok_s": [round(t / s, 1) for t, s in rounds]}


SPLITS = ((2, 1, 1), (2, 2, 1), (1, 4, 2))  # (processes, requests each, threads each): four in flight on two cores


def split_worker(folder: str, requests: int, threads: int, prompt: int, output: int, max_length: int, barrier,
                 results) -> None:
    """One process of ``split_rate``: ``requests`` requests one at a time (1: the runtime's own generation, as a
    `--parallel` worker's) or batched (more: the engine), ROUNDS timed rounds begun with the other processes."""
    os.environ["LLMOPT_CPU_THREADS"] = str(threads)
    from llmopt.runtimes.onnx import OnnxRuntime

    runtime = OnnxRuntime(Path(folder))
    ids = prompts(requests, prompt)
    if requests == 1:
        def run() -> float:
            start = time.perf_counter()
            tokens = sum(1 for _ in runtime.stream(ids[0], output, min_new_tokens=output))
            return tokens / (time.perf_counter() - start)
    else:
        batch = runtime.batch_engine(requests, max_length)
        batch.open()

        def run() -> float:
            tokens, seconds = batch_round(batch, ids, output)
            return tokens / seconds
    run()
    barrier.wait()
    results.put([run() for _ in range(ROUNDS)])


def split_rate(folder: str, processes: int, requests: int, threads: int, prompt: int, output: int,
               max_length: int) -> dict:
    """Output tok/s of ``processes`` processes at once, each of ``threads`` threads with ``requests`` requests:
    the sum over the processes, round by round, and its median."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(processes), context.Queue()
    procs = [context.Process(target=split_worker, args=(folder, requests, threads, prompt, output, max_length,
                                                         barrier, results)) for _ in range(processes)]
    for proc in procs:
        proc.start()
    rounds = [results.get() for _ in procs]
    for proc in procs:
        proc.join()
    totals = sorted(round(sum(r[k] for r in rounds), 1) for k in range(ROUNDS))
    return {"rounds_tok_s": totals, "output_tok_s": totals[len(totals) // 2]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="an int4 ONNX Runtime GenAI folder")
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--output", type=int, default=32)
    parser.add_argument("--layers", default="kernel,step,engine,split", help="which layers to time (comma-separated)")
    args = parser.parse_args()
    layers = set(args.layers.split(","))
    import onnxruntime_genai as og

    for K, N in ((576, 1536), (1536, 576), (576, 49152)) if "kernel" in layers else ():
        for level in (1, 4):
            times = {rows: kernel(K, N, level, rows, 200 if N < 10000 else 40) for rows in (1, 2, 4, 8)}
            print(json.dumps({"layer": "kernel", "K": K, "N": N, "accuracy_level": level,
                              "us": {m: round(t, 1) for m, t in times.items()},
                              "vs_one_row": {m: round(t / times[1], 2) for m, t in times.items()}}), flush=True)
    for threads in (1, 2) if "step" in layers else ():
        steps = {batch: generator_step(og, args.model, batch, threads, args.prompt) for batch in (1, 4)}
        print(json.dumps({"layer": "og.Generator step", "threads": threads, "ms": {b: round(t, 2) for b, t in steps.items()},
                          "tok_s": {b: round(b * 1e3 / t) for b, t in steps.items()}}), flush=True)
    for threads in (1, 2) if "engine" in layers else ():
        for requests in (1, 4):
            for max_length in (args.prompt + args.output + 32, None):
                got = engine_rate(args.model, requests, threads, args.prompt, args.output, max_length)
                print(json.dumps({"layer": "og.Engine (llmopt serve --max-num-seqs)", "threads": threads,
                                  "requests": requests, "max_length": max_length or "the folder's", **got}), flush=True)
    for prompt, output in ((args.prompt, args.output), (256, 128)) if "split" in layers else ():
        for processes, requests, threads in SPLITS:
            got = split_rate(args.model, processes, requests, threads, prompt, output, 2048)
            print(json.dumps({"layer": "four in flight, split", "processes": processes, "requests_each": requests,
                              "threads_each": threads, "prompt": prompt, "output": output, "max_length": 2048,
                              **got}), flush=True)


if __name__ == "__main__":
    main()
