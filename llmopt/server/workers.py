"""Generation in worker processes, for ``llmopt serve --parallel N``.

onnxruntime-genai keeps Python's interpreter lock while it computes a token, so two
generators on two threads of one process take turns instead of running at once
(measured: two one-thread generators on two threads made 231 tokens/s where one made
226; docs/results/tuning.md, "Launch tuning on this CPU"). Each worker here is a process of
its own (started with ``spawn``: forking a process whose ONNX Runtime threads already
run is unsafe) that opens the same model folder and generates one request at a time;
the server's scheduler gives each of its worker threads one ``GenerationProcess`` and
relays the tokens. Tokenizing and scoring stay in the server's own process. Each
process holds its own copy of the model and its KV cache: N + 1 copies in memory.

Messages on the pipe: to the worker ``("generate", prompt_ids, max_new_tokens, stop_ids,
options)``, ``("cancel",)`` and ``None`` (exit); from it ``("ready", pid)`` or
``("failed", text)`` once at start, then per request ``("token", id)`` ... and one
``("end", stop id or None)`` or ``("error", text)``.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Iterator

START_TIMEOUT_S = 300.0


class GenerationProcess:
    """A runtime's ``stream`` served by a child process with its own copy of the model."""

    def __init__(self, runtime: str, model_dir: Path, device: str = "cpu"):
        """Start a worker over ``model_dir`` with ``runtime`` (a name of ``llmopt.runtimes.RUNTIMES`` or
        ``module:Class``) and wait until it has loaded the model."""
        self.name = runtime
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=work, args=(child, runtime, str(model_dir), device),
                                        name="llmopt-generate-worker", daemon=True)
        self._process.start()
        child.close()
        if not self._conn.poll(START_TIMEOUT_S):
            self.close()
            raise RuntimeError(f"the generation worker did not load the model within {START_TIMEOUT_S:.0f} s")
        kind, detail = self._recv()
        if kind != "ready":
            self.close()
            raise RuntimeError(f"the generation worker could not load the model: {detail}")
        self.pid = detail

    def stream(self, prompt_ids: list[int], max_new_tokens: int, stop_ids: set[int] | None = None,
               **options) -> Iterator[int]:
        """The child's tokens as they come; closing the iterator cancels the request there."""
        self._conn.send(("generate", list(prompt_ids), max_new_tokens,
                         None if stop_ids is None else sorted(stop_ids), options))
        ended = False
        try:
            while True:
                kind, value = self._recv()
                if kind == "token":
                    yield value
                    continue
                ended = True
                if kind == "error":
                    raise RuntimeError(value)
                return value  # the stop id that ended the generation, or None
        finally:
            if not ended and self.alive:  # the consumer stopped early: cancel, then read up to the end of this request
                try:
                    self._conn.send(("cancel",))
                    while self._recv()[0] not in ("end", "error"):
                        pass
                except (OSError, RuntimeError):  # the worker died meanwhile: nothing left to cancel
                    pass

    def _recv(self) -> tuple:
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            self._process.join(5)  # its end of the pipe closed: reap it, so that alive says so
            raise RuntimeError(f"the generation worker process exited (code {self._process.exitcode})") from None

    @property
    def alive(self) -> bool:
        return self._process.is_alive()

    def close(self, timeout: float = 10.0) -> None:
        try:
            self._conn.send(None)
        except (OSError, ValueError):
            pass
        self._process.join(timeout)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(timeout)
        self._conn.close()


def start(runtime: str, model_dir: Path, count: int, device: str = "cpu") -> list[GenerationProcess]:
    """``count`` worker processes over ``model_dir``; all stopped again if one fails to start."""
    started: list[GenerationProcess] = []
    try:
        for _ in range(count):
            started.append(GenerationProcess(runtime, model_dir, device))
    except BaseException:
        for worker in started:
            worker.close()
        raise
    return started


def runtime_of(spec: str):
    """A runtime class by its name in ``llmopt.runtimes.RUNTIMES``, or by ``module:Class``."""
    if ":" in spec:
        import importlib

        module, _, name = spec.partition(":")
        return getattr(importlib.import_module(module), name)
    from llmopt.runtimes import runtime_class

    return runtime_class(spec)


def work(conn, runtime: str, model_dir: str, device: str) -> None:
    """The child: open the model, then generate each request it is sent, watching for a cancel between tokens."""
    import os

    try:
        model = runtime_of(runtime)(Path(model_dir), device=device)
    except Exception as exc:  # said to the parent, which refuses to start
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        if message[0] != "generate":
            continue  # a cancel that came after its request ended
        _, prompt_ids, max_new_tokens, stop_ids, options = message
        reply, leave = generate(conn, model, prompt_ids, max_new_tokens, stop_ids, options)
        conn.send(reply)
        if leave:
            return


def generate(conn, model, prompt_ids, max_new_tokens, stop_ids, options) -> tuple[tuple, bool]:
    """Send each token of one request: (the closing message, whether the parent asked the worker to exit)."""
    tokens = iter(model.stream(prompt_ids, max_new_tokens, None if stop_ids is None else set(stop_ids), **options))
    leave, stop = False, None
    try:
        while True:
            try:
                token = next(tokens)
            except StopIteration as end:  # its value: the stop id that ended the generation, or None
                stop = None if end.value is None else int(end.value)
                break
            conn.send(("token", int(token)))
            if conn.poll():
                leave = conn.recv() is None  # a cancel, or the parent closing
                break
    except Exception as exc:  # this request fails, the worker goes on
        return ("error", f"{type(exc).__name__}: {exc}"), leave
    finally:
        if hasattr(tokens, "close"):
            tokens.close()
    return ("end", stop), leave
