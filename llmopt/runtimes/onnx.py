"""Runtime: ONNX Runtime GenAI (``onnxruntime_genai``) over an exported model folder.

The folder is what the ``onnx`` export writes: ``model.onnx``, ``genai_config.json``
(session and EP tuning) and the tokenizer files. Text is encoded by the folder's transformers
tokenizer where transformers is installed, as ``llmopt serve`` encodes prompts, and by ``og.Tokenizer``
only where it is not: og's tokenizer splits some words otherwise (Gemma 3's SentencePiece BPE, "'st" as
"s" "t"), and baseline and candidate must be scored on the same tokens. The BOS token is added as the
Hugging Face tokenizer config says, so ids match the transformers runtime.
Scoring appends a whole sequence to a fresh ``og.Generator`` and reads the logits of
every position (``get_output("logits")``); generation keeps the KV cache inside the
generator (past and present share one buffer), reading back one token id per step.
Where the export wrote a last-position graph (``graphs.json``, ``onnx_last``), generation
runs that one, whose prefill skips the LM head at every earlier prompt position, and the
full graph is loaded the first time something is scored. On the CPU that scoring session runs on
every core the process may use (``scoring_threads``), whatever thread count the folder's
genai_config.json sets for decoding: scoring is a prefill, bound by compute where decoding is bound
by reading the weights (one 256-token window of the quickstart's int4 model, zero points in groups of 32 and an
8-bit head: 1.1 s on one thread, 0.72 s on two, on a 2-vCPU AMD EPYC VM with AVX2, 2026-12-05; the float32 torch
baseline takes about 0.4 s).
Needs: onnxruntime-genai (the ``ort`` extra), numpy.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import logging
import os
import statistics
import time
from pathlib import Path
from typing import Iterator

import numpy as np

from llmopt.libraries import require
from llmopt.errors import StageFailed
from llmopt.sysinfo import peak_rss_bytes

INDEX = "graphs.json"  # the graphs of an exported folder by use, which the onnx export writes (onnx_last)
GPU_PROVIDERS = ("cuda", "NvTensorRtRtx")  # execution providers of an NVIDIA GPU
log = logging.getLogger("llmopt")


def built_for(genai_config: dict) -> str:
    """The execution provider the graph was built for: the first of its session's provider_options
    (onnxruntime-genai's model builder writes the EP it built for there; none: the CPU)."""
    providers = genai_config.get("model", {}).get("decoder", {}).get("session_options", {}).get("provider_options")
    return next(iter(providers[0]), "cpu") if providers and isinstance(providers[0], dict) else "cpu"


def load_cuda_libraries() -> None:
    """Before a session on the CUDA EP: ``onnxruntime.preload_dlls`` (onnxruntime-gpu) loads CUDA and cuDNN
    from the nvidia-* wheels beside onnxruntime (the ``ort-cuda`` extra installs them there), else by the
    loader's search path, so that the CUDA provider library finds them by name. A process that imported a
    torch built for the same CUDA major has them already. What it prints goes to the log."""
    try:
        import onnxruntime
    except ImportError:
        return
    preload = getattr(onnxruntime, "preload_dlls", None)
    if preload is None:  # a CPU build, or older than 1.21
        return
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        preload()
    if said.getvalue().strip():
        log.warning("onnxruntime.preload_dlls: %s", " ".join(said.getvalue().split()))


def scoring_threads() -> int:
    """Threads for a CPU scoring session: the cores this process may run on, or ``LLMOPT_CPU_THREADS`` (a busy
    machine, where threads that wait for each other at every operation run slower than one)."""
    wanted = os.environ.get("LLMOPT_CPU_THREADS")
    if wanted:
        return max(1, int(wanted))
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def graphs(model_dir: Path) -> dict:
    """``graphs.json`` of an exported folder ({} when the folder has none, or a graph it names is missing)."""
    path = Path(model_dir) / INDEX
    if not path.is_file():
        return {}
    index = json.loads(path.read_text())
    return index if all((Path(model_dir) / name).is_file() for name in index.values()) else {}


class OnnxRuntime:
    """An ONNX Runtime GenAI model in process."""

    name = "onnxruntime"
    processes = True  # llmopt serve --parallel: one process per worker (og keeps the interpreter lock while it computes)

    def __init__(self, model_dir: Path, device: str = "cpu", trust_remote_code: bool = False):
        og = require("onnxruntime_genai", "ort", "the onnxruntime runtime", package="onnxruntime-genai")
        self.og = og
        self.model_dir = Path(model_dir)
        if not (self.model_dir / "genai_config.json").is_file():
            raise StageFailed(f"{self.model_dir} has no genai_config.json; it is not an ONNX Runtime GenAI model",
                              fix="export the model with [export] format = \"onnx\"")
        self.config = json.loads((self.model_dir / "genai_config.json").read_text())["model"]
        self.device = device
        if device.startswith("cuda"):
            load_cuda_libraries()
        self.graphs = graphs(self.model_dir)
        self.model = self._load(self.graphs.get("last_logits"))
        self._scoring = None if self.graphs else self.model
        self.tokenizer = og.Tokenizer(self.model)
        self.bos_id = hf_bos_id(self.model_dir)
        self.special_ids = special_ids(self.model_dir)
        self._added = [int(i) for i in self.tokenizer.encode("")]  # what og's post-processor adds to any text
        # og's tokenizer may leave out a BOS that transformers' adds (Gemma's tokenizer.json template): either says so
        self.adds_bos = self.bos_id is not None and (self._added[:1] == [self.bos_id]
                                                     or files_add_bos(self.model_dir, self.bos_id))
        self.context_length = int(self.config.get("context_length") or 0) or None
        self.window_floor = window_floor(self.config)

    def _load(self, filename: str | None = None, overlay: dict | None = None):
        """An og.Model over the folder; ``filename``: another decoder graph than genai_config.json's;
        ``overlay``: more genai_config.json settings (llmopt/runtimes/onnx_batch.py's engine options)."""
        config = self.og.Config(str(self.model_dir))
        if self.device == "cpu":  # the folder may be tuned for a GPU EP; run it on the CPU EP here
            config.clear_providers()
            if os.environ.get("LLMOPT_CPU_THREADS"):  # a busy machine: this many threads, not the folder's
                config.overlay(json.dumps({"model": {"decoder": {"session_options": {
                    "intra_op_num_threads": scoring_threads()}}}}))
        if filename:
            config.overlay(json.dumps({"model": {"decoder": {"filename": filename}}}))
        if overlay:
            config.overlay(json.dumps(overlay))
        return self.og.Model(config)

    @property
    def scoring_model(self):
        """The graph with logits at every position (genai_config.json's), loaded when first needed; on the
        CPU its session computes on ``scoring_threads()`` threads."""
        if self._scoring is None:
            threads = {"model": {"decoder": {"session_options": {"intra_op_num_threads": scoring_threads()}}}}
            self._scoring = self._load(overlay=threads if self.device == "cpu" else None)
        return self._scoring

    @property
    def batch_kind(self) -> str | None:
        """``dynamic`` or ``static``: how og.Engine batches this model (llmopt/runtimes/onnx_batch.py); None
        where the installed onnxruntime-genai has no Engine."""
        from llmopt.runtimes.onnx_batch import batch_kind

        return batch_kind(self)

    @property
    def batch_refusal(self) -> str | None:
        """Why og.Engine cannot batch this model (llmopt/runtimes/onnx_batch.py's ``static_refusal``), or None."""
        from llmopt.runtimes.onnx_batch import static_refusal

        return static_refusal(json.loads((self.model_dir / "genai_config.json").read_text()))

    def batch_engine(self, max_num_seqs: int, max_length: int | None = None):
        """An og.Engine over this runtime's model, its batch capped at ``max_num_seqs`` and a request at
        ``max_length`` tokens (the model is reloaded with those settings and shared with the runtime's own
        generation and scoring); None without og.Engine."""
        from llmopt.runtimes.onnx_batch import open_batch

        return open_batch(self, max_num_seqs, max_length)

    def encode(self, text: str, bos: bool = True) -> list[int]:
        reference = self.text_tokenizer
        if reference is not None:
            ids = list(reference(text, add_special_tokens=False)["input_ids"])
        else:
            ids = [int(i) for i in self.tokenizer.encode(text)]
            if self._added and ids[: len(self._added)] == self._added:
                ids = ids[len(self._added):]  # a post-processor that adds BOS: add it only when asked
        return ([self.bos_id] if bos and self.bos_id is not None else []) + ids

    @functools.cached_property
    def text_tokenizer(self):
        """The folder's transformers tokenizer (the baseline's, and ``llmopt serve``'s), or None without
        transformers."""
        try:
            from transformers import AutoTokenizer
        except ImportError:
            return None
        return AutoTokenizer.from_pretrained(self.model_dir)

    def decode(self, ids: list[int]) -> str:
        """The text of ``ids`` without special tokens, as the transformers runtime decodes (og's decode
        turns a text of special tokens only into U+FFFD)."""
        ids = [i for i in ids if int(i) not in self.special_ids]
        return self.tokenizer.decode(np.asarray(ids, dtype=np.int32)) if len(ids) else ""

    @property
    def eos_ids(self) -> set[int]:
        eos = self.config.get("eos_token_id")
        return set(eos if isinstance(eos, list) else [eos]) - {None}

    def _generator(self, total_length: int, model=None, **search):
        """A generator of at least ``total_length`` tokens (``window_floor``: at least a sliding window's); its
        callers stop by their own count, not at its max_length."""
        model = model or self.model
        params = self.og.GeneratorParams(model)
        params.set_search_options(max_length=max(total_length, self.window_floor), **search)
        return self.og.Generator(model, params)

    def logits(self, ids: list[int]) -> np.ndarray:
        """float32 logits [len(ids), vocab] of one sequence, every position."""
        generator = self._generator(len(ids) + 1, self.scoring_model)
        generator.append_tokens(np.asarray(ids, dtype=np.int32))
        out = generator.get_output("logits")
        if out.shape[1] != len(ids):
            raise StageFailed(f"the ONNX model returned logits for {out.shape[1]} of {len(ids)} positions",
                              fix="export without prune_lm_head so every position has logits")
        return np.asarray(out[0], dtype=np.float32)

    def nll(self, sequences: list[list[int]], scored: list[int]) -> list[float]:
        """Summed negative log-likelihood of each sequence's last ``scored`` tokens. The log-softmax is
        taken in float32, as the transformers runtime takes it, with the normalising sums and the total in
        float64, rather than on a float64 copy of every window's logits (256 x 49,152 values for a demo window)."""
        result = []
        for seq, count in zip(sequences, scored):
            token_nll = _token_nll(self.logits(seq)[:-1], seq[1:])  # position t predicts token t+1
            result.append(float(token_nll[len(token_nll) - count:].sum(dtype=np.float64)))
        return result

    def continuation_nll(self, groups: list[tuple[list[int], list[list[int]]]]) -> list[list[float]]:
        """``nll`` of each context + continuation, for contexts each shared by several continuations (a
        multiple-choice question's choices), from fewer passes: one prefill of each continuation of more than one
        token with its context, as ``nll`` scores it; a continuation of one token read from its context's last
        position in any of them (or in a prefill of the context alone when every continuation is one token). Not
        the context once and the continuations after it from the key/value cache, as the transformers runtime
        does: a decode step's MatMulNBits kernels round differently from a prefill's (0.17 nats apart on an
        int4 model's two-token choices)."""
        result = []
        for context, continuations in groups:
            start, scores, last = len(context) - 1, [0.0] * len(continuations), None
            for k, tokens in enumerate(continuations):
                if len(tokens) > 1:
                    ids = context + tokens
                    logits = self.logits(ids)[start:-1]  # the context's last position on: each predicts the next
                    scores[k], last = float(_token_nll(logits, ids[start + 1:]).sum(dtype=np.float64)), logits[:1]
            if last is None:
                last = self.logits(context)[start:]
            for k, tokens in enumerate(continuations):
                if len(tokens) == 1:
                    scores[k] = float(_token_nll(last, tokens)[0])
            result.append(scores)
        return result

    def generate(self, prompt_ids: list[int], max_new_tokens: int, stop_ids: set[int] | None = None) -> list[int]:
        return list(self.stream(prompt_ids, max_new_tokens, stop_ids))

    def stream(self, prompt_ids: list[int], max_new_tokens: int, stop_ids: set[int] | None = None,
               temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None, top_k: int = 0,
               repetition_penalty: float = 1.0, min_new_tokens: int = 0) -> Iterator[int]:
        """Yield new token ids one at a time; the KV cache stays inside the og.Generator.

        onnxruntime-genai's own search does the sampling: ``repetition_penalty`` (greedy too), then
        greedy at ``temperature`` 0, else top-k (0: all tokens) and top-p sampling seeded by ``seed``.
        Stops at a stop id (the model's end-of-sequence ids by default), which is not yielded but
        returned (the generator's StopIteration value), or after ``max_new_tokens``. The generator
        itself ends at the model's end-of-sequence token, so its ``min_length`` masks that token for
        the first ``min_new_tokens`` tokens, or for all of them when ``stop_ids`` leaves it out
        (``ignore_eos``): the length is the one asked for, but the token is never generated, where a
        runtime that generates it would go on after it.
        Closing the iterator frees the generator at once."""
        stops = self.eos_ids if stop_ids is None else set(stop_ids)
        if not self.eos_ids <= stops:
            min_new_tokens = max_new_tokens
        search: dict = {"do_sample": False}
        if temperature > 0:
            search = {"do_sample": True, "temperature": temperature, "top_p": top_p,
                      "top_k": top_k if top_k > 0 else int(self.config.get("vocab_size") or 0),
                      "random_seed": -1 if seed is None else seed}
        if repetition_penalty != 1.0:
            search["repetition_penalty"] = repetition_penalty
        if min_new_tokens > 0:
            search["min_length"] = len(prompt_ids) + min(min_new_tokens, max_new_tokens)
        generator = self._generator(len(prompt_ids) + max_new_tokens, **search)
        try:
            generator.append_tokens(np.asarray(prompt_ids, dtype=np.int32))
            for _ in range(max_new_tokens):
                if generator.is_done():
                    return
                generator.generate_next_token()
                token = int(generator.get_next_tokens()[0])
                if token in stops:
                    return token
                yield token
        finally:
            del generator

    def measure(self, prompt_len: int = 128, new_tokens: int = 64, repeats: int = 3, prompt_ids: list[int] | None = None) -> dict:
        """Prefill and decode timings of the embedded generation loop (greedy, no early stop).

        prefill: ``append_tokens`` of the prompt; TTFT: prefill plus the first token; decode: each
        later ``generate_next_token`` (one forward pass). One warm-up run, then ``repeats`` runs."""
        ids = list(prompt_ids) if prompt_ids else default_prompt(self, prompt_len)
        ids = (ids * (prompt_len // max(len(ids), 1) + 1))[:prompt_len]
        runs = [self._timed_run(ids, new_tokens) for _ in range(repeats + 1)][1:]
        decode = [ms for run in runs for ms in run["decode"]]
        return {
            "prompt_len": prompt_len, "new_tokens": new_tokens, "repeats": repeats,
            "prefill_ms": statistics.median(r["prefill"] for r in runs),
            "ttft_ms": statistics.median(r["ttft"] for r in runs),
            "decode_ms_p50": float(np.percentile(decode, 50)), "decode_ms_p95": float(np.percentile(decode, 95)),
            "tokens_per_s": 1000.0 / statistics.mean(decode),
            "peak_rss_bytes": peak_rss_bytes(),
        }

    def _timed_run(self, ids: list[int], new_tokens: int) -> dict:
        total = len(ids) + new_tokens
        generator = self._generator(total, do_sample=False, min_length=total)
        start = time.perf_counter()
        generator.append_tokens(np.asarray(ids, dtype=np.int32))
        prefill = time.perf_counter()
        steps = []
        while not generator.is_done() and len(steps) < new_tokens:
            t = time.perf_counter()
            generator.generate_next_token()
            generator.get_next_tokens()
            steps.append((time.perf_counter() - t) * 1000)
        # the first call samples from the prefill logits; each later one runs the model once
        return {"prefill": (prefill - start) * 1000, "ttft": (prefill - start) * 1000 + steps[0], "decode": steps[1:]}


def window_floor(genai_config: dict) -> int:
    """The fewest tokens a generator of this model may be made for: the sliding window, where genai_config.json
    names sliding-window layers (``sliding_window``), else 0. onnxruntime-genai sizes those layers' KV buffers to
    the window, but to a generator's max_length where that is shorter, and their attention then refuses every
    step (``KV cache capacity must be at least local_window_size``): a text shorter than the window (Gemma 3's
    is 512 to 1,024 tokens) could not be scored or generated from. At most the model's context length."""
    window = genai_config.get("decoder", {}).get("sliding_window") or {}
    if not window.get("layers"):
        return 0
    size = int(window.get("window_size") or 0)
    context = int(genai_config.get("context_length") or 0)
    return min(size, context) if context else size


def default_prompt(runtime: OnnxRuntime, length: int) -> list[int]:
    from llmopt import data

    return runtime.encode("\n\n".join(data.load_texts("builtin:prose-eval")))[:length]


def special_ids(model_dir: Path) -> set[int]:
    """Ids of the special tokens of tokenizer.json (added tokens marked special)."""
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        return set()
    added = json.loads(path.read_text(encoding="utf-8")).get("added_tokens", [])
    return {int(t["id"]) for t in added if t.get("special")}


def hf_bos_id(model_dir: Path) -> int | None:
    """The BOS id the Hugging Face tokenizer adds (tokenizer_config.json's bos_token), or None."""
    bos = None
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = model_dir / name
        if bos is None and path.is_file():
            bos = json.loads(path.read_text()).get("bos_token")
    if isinstance(bos, dict):
        bos = bos.get("content")
    if not bos or not (model_dir / "tokenizer.json").is_file():
        return None
    tok = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    for added in tok.get("added_tokens", []):
        if added.get("content") == bos:
            return int(added["id"])
    vocab = (tok.get("model") or {}).get("vocab")
    return int(vocab[bos]) if isinstance(vocab, dict) and bos in vocab else None


def files_add_bos(model_dir: Path, bos_id: int) -> bool:
    """Whether the Hugging Face tokenizer files put the BOS ``bos_id`` before every text, as transformers reads them:
    tokenizer_config.json's ``add_bos_token`` where it says, else tokenizer.json's post-processor template (alone or
    in a sequence) beginning with that token."""
    config = model_dir / "tokenizer_config.json"
    said = json.loads(config.read_text()).get("add_bos_token") if config.is_file() else None
    if isinstance(said, bool):
        return said
    path = model_dir / "tokenizer.json"
    post = (json.loads(path.read_text(encoding="utf-8")).get("post_processor") or {}) if path.is_file() else {}
    for step in post.get("processors", [post]):
        first = (step.get("single") or [{}])[0] if step.get("type") == "TemplateProcessing" else {}
        name = (first.get("SpecialToken") or {}).get("id")
        if name is not None and bos_id in (post_ids := (step.get("special_tokens") or {}).get(name, {}).get("ids", [])):
            return post_ids[:1] == [bos_id]
    return False


def _token_nll(logits: np.ndarray, targets: list[int]) -> np.ndarray:
    """Each position's negative log-likelihood of its target token: the log-softmax in float32, its normalising
    sums in float64."""
    top = logits.max(axis=-1)
    logsumexp = np.log(np.exp(logits - top[:, None]).sum(axis=-1, dtype=np.float64)) + top
    return logsumexp - logits[np.arange(len(targets)), np.asarray(targets)]
