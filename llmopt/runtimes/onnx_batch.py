"""Batched generation through onnxruntime-genai's own ``og.Engine``, for ``llmopt serve --max-num-seqs``.

One ``og.Model`` and one engine step all the requests given to it (``open`` creates the engine on
the thread that will call it, as og.Engine wants): ``start`` begins a request's turn, ``step`` runs
the engine once and returns what each request got, ``cancel`` ends one. The model is the folder's
full graph: the engine fails a last-position one (``graphs.json``, onnx_last). The engine decides
what runs together:

- a model exported with paged attention (``engine.dynamic_batching`` in genai_config.json;
  onnxruntime-genai's builder makes one only for CUDA with fp16/bf16 or WebGPU) batches
  dynamically: a request joins and leaves at any step (continuous batching);
- any other model (the CPU exports among them) batches statically
  (``engine.static_batching``): the requests begun while the engine is idle form a batch,
  and a request begun later waits inside the engine until that whole batch has finished (the
  rows of requests that have ended are computed until then). It takes no per-request seed.

A model whose sliding-window layers keep bounded KV caches (``sliding_window`` in genai_config.json: the
builder's default for Gemma 2 and 3 and Mistral on the CPU) is not batched statically: the engine pads the
prompts of a batch to one length, which those layers' attention refuses (``seqlens_k ... is too small for
sequence_length``), and fails every request of the batch. Such a model generates one request at a time
(``static_refusal`` says why); exported with ``builder_options = { windowed_kv_cache = "false" }`` (full-length
caches for those layers, the window applied in the attention) it batches.

The last token of a turn comes on the event that finishes it (flags TOKEN | TURN_FINISHED);
a turn that ends at the end-of-sequence token reports no token for it (finish ``eos``).
Needs: onnxruntime-genai with ``Engine`` (0.18 has it), numpy.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

EVENTS = 256  # events one engine step may return


def has_engine(og) -> bool:
    return all(hasattr(og, name) for name in ("Engine", "TurnOptions", "EngineEventFlags", "FinishReason"))


def engine_overlay(genai_config: dict, max_num_seqs: int, max_length: int | None = None) -> tuple[dict, bool]:
    """(the genai_config overlay that caps the engine's batch at ``max_num_seqs`` and a request's prompt and
    completion at ``max_length`` tokens, whether it batches dynamically). A static engine holds a KV cache of
    ``search.max_length`` tokens for each request in its batch (the quickstart's 8,192-token context: about
    360 MB of float32 each), so the served context bounds it."""
    engine = genai_config.get("engine") or {}
    kind = "dynamic_batching" if "dynamic_batching" in engine else "static_batching"
    overlay: dict = {"engine": {kind: {"max_batch_size": max_num_seqs}}}
    if max_length:
        overlay["search"] = {"max_length": max_length}
    return overlay, kind == "dynamic_batching"


def static_refusal(genai_config: dict) -> str | None:
    """Why a static engine cannot batch this model (its windowed KV caches), or None."""
    window = genai_config.get("model", {}).get("decoder", {}).get("sliding_window") or {}
    if not window.get("layers") or "dynamic_batching" in (genai_config.get("engine") or {}):
        return None
    return ("its sliding-window layers keep KV caches of the window's size, which onnxruntime-genai's static "
            "engine fails on prompts of different lengths (export with builder_options = { windowed_kv_cache = "
            "\"false\" } to batch it)")


@dataclass(eq=False)
class Turn:
    """One request in the engine: its og.Request and the turn begun on it."""

    request: Any
    turn_id: int
    finished: bool = field(default=False)
    error: str = ""  # the engine's error code, when it failed the turn


class EngineBatch:
    """An og.Engine over one og.Model: requests begun, stepped together, finished or cancelled."""

    def __init__(self, og, model, dynamic: bool):
        self.og = og
        self.model = model
        self.dynamic = dynamic
        self.engine = self._buffer = None
        self.max_batch_size = 0
        self._turns: list[Turn] = []
        flags, reasons = og.EngineEventFlags, og.FinishReason
        self._token, self._finished = int(flags.TOKEN), int(flags.TURN_FINISHED)
        self._reasons = {int(reasons.EOS): "eos", int(reasons.MAX_GENERATED_TOKENS): "length",
                         int(reasons.MAX_SESSION_TOKENS): "length", int(reasons.STOP_STRING): "stop",
                         int(reasons.CANCELLED): "cancelled", int(reasons.FAILED): "failed"}

    def open(self) -> None:
        """Create the engine, on the thread that will use it: og.Engine answers only the thread that made it."""
        self.engine = self.og.Engine(self.model)
        self.max_batch_size = int(self.engine.get_capabilities().configured_max_batch_size)
        self._buffer = self.engine.create_event_buffer(EVENTS)

    @property
    def kind(self) -> str:
        return "dynamic" if self.dynamic else "static"

    def supports(self, seed: int | None) -> bool:
        """Whether the engine can run a request with these options (a static engine takes no seed)."""
        return seed is None or self.dynamic

    def start(self, prompt_ids: list[int], max_new_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
              seed: int | None = None, top_k: int = 0, repetition_penalty: float = 1.0,
              min_new_tokens: int = 0) -> Turn:
        """Begin a request: greedy at ``temperature`` 0, else sampling with top-k (0: all tokens) and top-p;
        the end-of-sequence token masked for the first ``min_new_tokens`` tokens."""
        request = self.engine.create_request()
        options = self.og.TurnOptions(request)
        options.set_max_generated_tokens(max_new_tokens)
        options.set_do_sample(temperature > 0)
        options.set_temperature(temperature if temperature > 0 else 0.0)
        if temperature > 0:
            options.set_top_k(max(top_k, 0))
            options.set_top_p(top_p)
            if seed is not None:
                options.set_seed(seed)
        if repetition_penalty != 1.0:
            options.set_repetition_penalty(repetition_penalty)
        if min_new_tokens > 0:
            options.set_min_generated_tokens(min(min_new_tokens, max_new_tokens))
        turn = Turn(request, int(request.begin_turn(np.asarray(prompt_ids, dtype=np.int32), options)))
        self._turns.append(turn)
        return turn

    @property
    def pending(self) -> bool:
        return self.engine.has_pending_requests()

    def step(self) -> list[tuple[Turn, int | None, str | None]]:
        """Run the engine once: (turn, its new token or None, why it finished or None) per event."""
        out = []
        for event in self.engine.run(self._buffer):
            turn = next((t for t in self._turns if t.request == event.request), None)
            if turn is None:
                continue
            flags = int(event.flags)
            token = int(event.token) if flags & self._token and event.token is not None else None
            finish = None
            if flags & self._finished:
                finish = self._reasons.get(int(event.finish_reason), "failed")
                if finish == "failed":
                    turn.error = str(event.error_code).rpartition(".")[2]
                self._close(turn)
            elif not flags & self._token:  # capacity or a failure, without the turn ending
                continue
            out.append((turn, token, finish))
        if self._turns and not self.engine.has_pending_requests():  # nothing left to report them: over
            for turn in list(self._turns):
                self._close(turn)
                out.append((turn, None, "cancelled"))
        return out

    def cancel(self, turn: Turn) -> None:
        """End a turn now; its request is closed when the engine reports it cancelled."""
        if not turn.finished:
            turn.request.cancel_turn(turn.turn_id)

    def _close(self, turn: Turn) -> None:
        turn.finished = True
        self._turns.remove(turn)
        turn.request.close()


def batch_kind(runtime) -> str | None:
    """How an engine over ``runtime``'s model would batch (``dynamic`` or ``static``), or None where the
    installed onnxruntime-genai has no Engine."""
    if not has_engine(runtime.og):
        return None
    config = json.loads((runtime.model_dir / "genai_config.json").read_text())
    if static_refusal(config):
        return None
    return "dynamic" if engine_overlay(config, 1)[1] else "static"


def open_batch(runtime, max_num_seqs: int, max_length: int | None = None) -> EngineBatch | None:
    """An engine over ``runtime``'s generation model, reloaded with its batch capped at ``max_num_seqs`` and a
    request at ``max_length`` tokens
    (the runtime's generation and scoring use the same og.Model, the folder's full graph, and a last-position
    graph is not loaded: one copy of the weights); None where the installed onnxruntime-genai has no Engine or
    the model cannot be batched statically (``static_refusal``)."""
    og = runtime.og
    if not has_engine(og):
        return None
    config = json.loads((runtime.model_dir / "genai_config.json").read_text())
    if static_refusal(config):
        return None
    overlay, dynamic = engine_overlay(config, max_num_seqs, max_length)
    model = runtime._load(None, overlay)  # the full graph: the engine fails a last-position one (onnx_last)
    runtime.model = runtime._scoring = model
    runtime.tokenizer = og.Tokenizer(model)  # the model loaded first is freed
    return EngineBatch(og, model, dynamic)
