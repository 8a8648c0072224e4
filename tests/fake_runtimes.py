"""Runtimes without a model, for the worker-process tests: importable by name in a spawned process."""

from __future__ import annotations

import time
from pathlib import Path


class Counting:
    """Generates prompt[-1] + 1, + 2, ... one token every 10 ms; a negative temperature fails the request."""

    name = "counting"

    def __init__(self, model_dir: Path, device: str = "cpu", trust_remote_code: bool = False):
        pass

    def stream(self, prompt_ids, max_new_tokens, stop_ids=None, **options):
        if options.get("temperature", 0) < 0:
            raise ValueError("a negative temperature")
        for i in range(max_new_tokens):
            time.sleep(0.01)
            token = prompt_ids[-1] + 1 + i
            if stop_ids and token in stop_ids:
                return
            yield token


class Broken:
    def __init__(self, model_dir: Path, device: str = "cpu", trust_remote_code: bool = False):
        raise FileNotFoundError(f"{model_dir} has no model")
