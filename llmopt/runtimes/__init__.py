"""Runtimes: where a model is scored, generated from and served.

Every runtime offers the same small interface, so eval backends, the benchmark and
``llmopt serve`` do not care whether the model runs in PyTorch, ONNX Runtime or
behind an HTTP endpoint:

* ``name``: the runtime's name;
* ``encode(text, bos=True) -> list[int]`` and ``decode(ids) -> str``;
* ``adds_bos``: whether the model's tokenizer, encoding text its own way, puts the BOS
  token first (SmolLM2's and GPT-2's do not, Llama's do): the eval backends follow it
  unless told otherwise, as lm-eval and vLLM do;
* ``nll(sequences, scored) -> list[float]``: summed negative log-likelihood of the
  last ``scored[i]`` tokens of each token sequence;
* ``generate(prompt_ids, max_new_tokens, stop_ids=None) -> list[int]``: greedy.
* ``stream(prompt_ids, max_new_tokens, stop_ids=None, temperature=0.0, top_p=1.0,
  seed=None, top_k=0, repetition_penalty=1.0, min_new_tokens=0) -> Iterator[int]``:
  the new token ids one at a time, as each is generated (the prompt is processed
  once; later steps reuse the KV cache). The repetition penalty (vLLM's: a logit of
  a token already in the prompt or the output divided by it when positive,
  multiplied when negative) applies first, greedy or not; then greedy at
  temperature 0, else sampled from the top-k tokens (0: all) and the top-p nucleus
  with a generator seeded by ``seed`` (the same seed gives the same tokens). Ends
  at a stop id (the model's end-of-sequence ids when ``stop_ids`` is None; an empty
  set never stops early), which is not yielded but returned (the value of the
  iterator's StopIteration: ``llmopt serve`` counts and scores it, as vLLM does), or
  after ``max_new_tokens``; stop
  ids are masked out for the first ``min_new_tokens``. The caller may stop early:
  closing the iterator (or dropping it) must free the work in progress.
  ``llmopt serve`` makes every runtime call from one worker thread and runs one
  stream at a time; it may call ``encode`` / ``decode`` between two steps of a stream.
* ``logits(ids) -> numpy.ndarray``: float32 logits [len(ids), vocab] of one
  sequence at every position (``llmopt serve``'s prompt log-probabilities).
* optionally, ``continuation_nll(groups) -> list[list[float]]``: for (context, continuations)
  groups, ``nll`` of each context + continuation from fewer passes over the shared context
  (transformers, onnxruntime: the multiple-choice eval's choices).

``RUNTIMES`` maps a runtime name to ``module:Class``; modules are imported only
when used. ``FORMAT_RUNTIME`` picks the default runtime for a model format.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from llmopt.errors import StageFailed

RUNTIMES = {
    "transformers": "llmopt.runtimes.hf:TransformersRuntime",
    "endpoint": "llmopt.runtimes.endpoint:EndpointRuntime",
    "onnxruntime": "llmopt.runtimes.onnx:OnnxRuntime",
    "modelopt": "llmopt.runtimes.modelopt:ModelOptRuntime",
}
FORMAT_RUNTIME = {"hf": "transformers", "onnx": "onnxruntime", "modelopt": "modelopt"}


def hf_adds_bos(tokenizer) -> bool:
    """Whether a Hugging Face tokenizer's own encoding of a text (special tokens added) starts with its BOS."""
    bos = tokenizer.bos_token_id
    return bos is not None and tokenizer("a")["input_ids"][:1] == [bos]


def runtime_class(name: str):
    if name not in RUNTIMES:
        raise StageFailed(f"unknown runtime {name!r}", fix=f"use one of: {', '.join(RUNTIMES)}")
    module, _, cls = RUNTIMES[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def open_runtime(model_dir: Path, fmt: str = "hf", runtime: str = "auto", device: str = "cpu",
                 trust_remote_code: bool = False):
    """A runtime over the model folder ``model_dir`` in format ``fmt``."""
    name = FORMAT_RUNTIME.get(fmt, "transformers") if runtime == "auto" else runtime
    if name not in RUNTIMES:
        raise StageFailed(f"no {name} runtime is available for models in {fmt} format",
                          fix=f"available runtimes: {', '.join(RUNTIMES)}")
    return runtime_class(name)(Path(model_dir), device=device, trust_remote_code=trust_remote_code)


def load(ctx, runtime: str = "auto"):
    """The runtime for the model entering an eval stage."""
    ctx.progress(f"loading the model ({runtime})")
    return open_runtime(ctx.model_dir, ctx.model_format, runtime, ctx.device, ctx.recipe.recipe.model.trust_remote_code)
