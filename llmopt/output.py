"""One output sink: results on stdout, logs and progress on stderr.

Modes: ``human`` (tables and text), ``json`` (one JSON document on stdout),
``quiet`` (results only, no progress).

In json mode the result is held until the command ends, so that a command that fails
after computing it (a failed gate, a failed plan check) still prints one document: the
result with the error inside it (``document``; the CLI entry point writes it).
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import contextmanager
from typing import Any, Callable

from rich.console import Console
from rich.markup import escape

MODES = ("human", "json", "quiet")


def terminal(stream):
    """``stream`` on a descriptor of its own when it is the process's standard error: while a stage
    runs, the runner points descriptor 2 at the run log (native libraries write there), and progress
    must still reach the terminal."""
    try:
        if stream.fileno() == 2:
            stream.flush()
            return os.fdopen(os.dup(2), "w", encoding=getattr(stream, "encoding", None) or "utf-8",
                             errors="replace", buffering=1)
    except (AttributeError, OSError, ValueError):  # a captured or closed stream: use it as it is
        pass
    return stream


class Output:
    def __init__(self, mode: str = "human"):
        self.mode = mode
        self.out = Console(file=sys.stdout, highlight=False, soft_wrap=True)
        self.err = Console(file=terminal(sys.stderr), highlight=False, soft_wrap=True)
        self.held: Any = None  # json mode: the result, written when the command ends (or at ``flush``)
        self.written = False  # json mode: the document is on stdout; nothing more goes there

    @property
    def chatty(self) -> bool:
        return self.mode == "human"

    def result(self, data: Any, human: Callable[[Console], None] | None = None) -> None:
        """The command's result: held for the one JSON document in json mode, else printed now."""
        if self.mode == "json":
            self.held = data
        elif human is not None:
            human(self.out)
        else:
            self.out.print(data if isinstance(data, str) else json.dumps(data, indent=2, default=str))

    def flush(self) -> None:
        """Write the held JSON document now, for a command that goes on working after its result
        (``llmopt serve``); an error after this goes to stderr only."""
        if self.mode == "json" and not self.written and self.held is not None:
            write_json(self.held)
            self.written = True

    def finish(self, error: dict | None = None) -> None:
        """Write the command's one JSON document, with ``error`` inside when it failed (json mode only)."""
        if self.mode == "json" and not self.written and (self.held is not None or error is not None):
            write_json(document(self.held, error))
            self.written = True

    def info(self, message: str) -> None:
        if self.mode != "quiet":
            self.err.print(message)

    def warn(self, message: str) -> None:
        """A warning in plain text: a recipe's table names in it (`[tune]`) are words, not Rich markup."""
        self.err.print(f"[yellow]warning:[/] {escape(message)}")

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


def document(result: Any, error: dict | None) -> Any:
    """The JSON document of a command: its result; when it failed, the result's keys and
    ``"error"`` (``{"error": ...}`` alone when there is no result)."""
    if error is None:
        return result
    if result is None:
        return {"error": error}
    if isinstance(result, dict):
        return {**result, "error": error}
    return {"result": result, "error": error}


def write_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()


def human_size(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)
