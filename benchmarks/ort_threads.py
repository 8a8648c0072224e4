"""Do two onnxruntime-genai generators on two threads of one process compute at once?

Greedy generation of NEW tokens after a 64-token prompt, one generator per thread, all threads over
one og.Model, against the same on one thread; tokens/s of all threads together. Equal figures mean
the generators take turns (the interpreter lock held while a token is computed), which is why
``llmopt serve --parallel`` runs each worker in a process of its own (llmopt/server/workers.py).

    .venv/bin/python benchmarks/ort_threads.py MODEL_DIR --intra-op 1 --threads 1 2

MODEL_DIR: an ONNX Runtime GenAI folder (docs/results/tuning.md used a random Llama of hidden 512, 8 layers,
MLP 1536, exported by onnxruntime_genai.models.builder at int4 for the CPU). genai_config.json's
intra_op_num_threads is set to --intra-op in a copy of the folder.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import threading
import time
from pathlib import Path


def generate(og, model, new: int) -> None:
    import numpy as np

    params = og.GeneratorParams(model)
    params.set_search_options(max_length=64 + new, min_length=64 + new, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(np.arange(1, 65, dtype=np.int32))
    while not generator.is_done():
        generator.generate_next_token()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("--intra-op", type=int, default=1)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--new", type=int, default=128)
    args = parser.parse_args(argv)
    import onnxruntime_genai as og

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        shutil.copytree(args.model_dir, folder)
        config = json.loads((folder / "genai_config.json").read_text())
        config["model"]["decoder"].setdefault("session_options", {})["intra_op_num_threads"] = args.intra_op
        (folder / "genai_config.json").write_text(json.dumps(config))
        model = og.Model(str(folder))
        generate(og, model, 8)  # warm-up
        for count in args.threads:
            start = time.perf_counter()
            threads = [threading.Thread(target=generate, args=(og, model, args.new)) for _ in range(count)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            seconds = time.perf_counter() - start
            print(json.dumps({"threads": count, "intra_op": args.intra_op, "seconds": round(seconds, 3),
                              "tokens_per_s": round(count * args.new / seconds, 1)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
