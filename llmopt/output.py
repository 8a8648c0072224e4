"""One output sink: results on stdout, logs and progress on stderr.

Modes: ``human`` (tables and text), ``json`` (one JSON document on stdout),
``quiet`` (results only, no progress).
"""

from __future__ import annotations

import json
import sys
import time
from contextlib import contextmanager
from typing import Any, Callable

from rich.console import Console

MODES = ("human", "json", "quiet")


class Output:
    def __init__(self, mode: str = "human"):
        self.mode = mode
        self.out = Console(file=sys.stdout, highlight=False, soft_wrap=True)
        self.err = Console(file=sys.stderr, highlight=False, soft_wrap=True)

    @property
    def chatty(self) -> bool:
        return self.mode == "human"

    def result(self, data: Any, human: Callable[[Console], None] | None = None) -> None:
        """Print the command's result: JSON in json mode, else the human rendering."""
        if self.mode == "json":
            sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
            sys.stdout.flush()
        elif human is not None:
            human(self.out)
        else:
            self.out.print(data if isinstance(data, str) else json.dumps(data, indent=2, default=str))

    def info(self, message: str) -> None:
        if self.mode != "quiet":
            self.err.print(message)

    def warn(self, message: str) -> None:
        self.err.print(f"[yellow]warning:[/] {message}")

    @contextmanager
    def status(self, message: str):
        """A spinner on stderr while a step works; ``update(text)`` changes its text."""
        start = time.monotonic()
        if self.mode == "quiet" or not self.err.is_terminal:
            self.info(message)
            yield lambda text: None
            return
        with self.err.status(message) as status:
            yield lambda text: status.update(f"{message} [dim]{text} ({time.monotonic() - start:.0f}s)[/]")


def human_size(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)
