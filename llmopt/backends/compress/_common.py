"""Plain functions every compression backend's run uses: threads, compute dtype, tokenizer files, sizes.

Needs: torch (``cpu_threads`` only).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path


@contextlib.contextmanager
def cpu_threads(device: str):
    """On CPU, ``LLMOPT_CPU_THREADS`` (when set) caps torch's intra-op threads for the block.

    GPTQ and AWQ run many small operations; on a busy machine, threads that wait for each
    other at every operation can make them several times slower than one thread."""
    import torch

    wanted = os.environ.get("LLMOPT_CPU_THREADS")
    if device != "cpu" or not wanted:
        yield
        return
    saved = torch.get_num_threads()
    torch.set_num_threads(max(1, int(wanted)))
    try:
        yield
    finally:
        torch.set_num_threads(saved)


WIDENED_ON_CPU = ("bfloat16", "float16")  # the recipe dtypes a cpu_float32 method computes in float32 on a CPU


def widen_on_cpu(ctx) -> bool:
    """Whether the stage loads a 16-bit recipe's model in float32 (``CompressBackend.cpu_float32``): on a CPU,
    where bfloat16 matrix products ran about 8x slower than float32 on an AVX2-only machine. The stage saves in
    the recipe's dtype, so the checkpoint is what a 16-bit run writes."""
    return ctx.device == "cpu" and ctx.recipe.recipe.model.dtype in WIDENED_ON_CPU


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "chat_template.jinja", "vocab.json", "merges.txt", "generation_config.json")


def copy_tokenizer_files(src: Path, dst: Path) -> list[str]:
    """Copy tokenizer / generation files the save did not write (a library save may skip some)."""
    copied = []
    for name in TOKENIZER_FILES:
        if (src / name).is_file() and not (dst / name).exists():
            shutil.copy2(src / name, dst / name)
            copied.append(name)
    return copied


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())
