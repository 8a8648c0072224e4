"""GFLOPS of one thread's linear layer (256 tokens x 576 -> 1536, the demo model's MLP shape) in float32 and in
bfloat16 on this CPU: why llmopt's compress stages compute in float32 on a CPU (docs/results/accuracy.md,
"The quickstart with AWQ computed in float32").

    .venv/bin/python benchmarks/cpu_dtype_matmul.py
"""

from __future__ import annotations

import time

import torch


def gflops(dtype: torch.dtype, repeats: int = 50) -> float:
    x, w = torch.randn(256, 576, dtype=dtype), torch.randn(1536, 576, dtype=dtype)
    for _ in range(3):
        torch.nn.functional.linear(x, w)
    started = time.perf_counter()
    for _ in range(repeats):
        torch.nn.functional.linear(x, w)
    return 2 * 256 * 576 * 1536 * repeats / (time.perf_counter() - started) / 1e9


if __name__ == "__main__":
    torch.set_num_threads(1)
    for dtype in (torch.float32, torch.bfloat16):
        print(f"{dtype}: {gflops(dtype):.1f} GFLOPS (one thread)")
