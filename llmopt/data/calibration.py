"""Calibration data: the recipe's ``[calibration]`` turned into token rows.

The texts named by ``calibration.data`` (``builtin:prose``, a local .txt/.jsonl/
.parquet file, or ``hf:<dataset>[:<config>]:<split>``) are loaded with
``llmopt.data.load_texts``, put in an order fixed by ``calibration.seed``,
optionally wrapped in the tokenizer's chat template, tokenized, joined with the
end-of-sequence token between documents and cut into rows of exactly
``max_seq_len`` tokens; the first ``samples`` rows are kept. The same recipe and
data therefore give the same rows on every machine, which is what the stage cache
key (it holds the data's SHA-256) promises.

At plan time ``plan_yield`` counts how many rows the data fills, with the model's own
tokenizer where one is on this machine (``llmopt.data.counting``), else estimated from
characters, so that a shortfall is said before the run.

Consumers: llm-compressor wants a ``datasets.Dataset`` with ``input_ids`` and
``attention_mask`` (``as_dataset``); ModelOpt forward loops and the pruning
backends want tensors (``as_batches``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from llmopt import data as datasets
from llmopt.data import counting
from llmopt.errors import Problem, StageFailed

PLAN_READ_LIMIT = 64 << 20  # bytes: larger calibration files are not read at plan time


@dataclass
class CalibrationRows:
    """Token rows of equal length, with what produced them."""

    rows: list[list[int]]
    seq_len: int
    documents: int
    tokens_available: int

    def summary(self) -> dict:
        return {"samples": len(self.rows), "seq_len": self.seq_len, "documents": self.documents,
                "tokens_available": self.tokens_available}


def check(calibration, base: Path, where: str) -> list[Problem]:
    """Plan-time problems of the [calibration] section (the data spec only; no tokenizing)."""
    problem = datasets.check_spec(calibration.data, base)
    return [Problem(problem, where)] if problem else []


@dataclass
class Yield:
    """How many rows of ``max_seq_len`` tokens the calibration data fills, as the planner counts it."""

    rows: int
    tokens: int
    characters: int
    documents: int
    counted: bool  # with the model's tokenizer; False: estimated from characters
    complete: bool  # every document counted (counting stops once ``samples`` rows are filled)

    @property
    def basis(self) -> str:
        if self.counted:
            return "counted with the model's tokenizer"
        return f"estimated at {counting.CHARS_PER_TOKEN:g} characters a token: no tokenizer of the model on this machine"


def plan_yield(calibration, model, base: Path | None = None, tokenizer=False) -> Yield | None:
    """The rows ``calibration`` fills for ``model`` (the recipe's [model] section), without weights.

    None when the data cannot be read here (hub data, a missing file, a file over
    ``PLAN_READ_LIMIT``). Text of at least ``MAX_CHARS_PER_TOKEN`` characters per token asked for
    is taken as enough without tokenizing. ``tokenizer``: a ``tokenizers.Tokenizer`` to count
    with, None to estimate, or False (default) to find the model's own."""
    path = datasets.resolve(calibration.data, base)
    if path is None or not path.is_file() or path.stat().st_size > PLAN_READ_LIMIT:
        return None
    try:
        texts = [t for t in datasets.load_texts(calibration.data, calibration.text_field, base) if t and t.strip()]
    except Exception:  # noqa: BLE001 - unreadable data is the run's error to report, with its own message
        return None
    need = calibration.samples * calibration.max_seq_len
    chars = sum(len(t) for t in texts)
    plenty = chars >= need * counting.MAX_CHARS_PER_TOKEN
    if tokenizer is False and not plenty:
        tokenizer = counting.model_tokenizer(model.source, base, getattr(model, "revision", None))
    if plenty or tokenizer in (None, False):
        tokens = int(chars / counting.CHARS_PER_TOKEN) + len(texts)
        return Yield(tokens // calibration.max_seq_len, tokens, chars, len(texts), False, True)
    tokens, complete = counting.count_tokens(texts, tokenizer, stop_at=need)
    return Yield(tokens // calibration.max_seq_len, tokens, chars, len(texts), True, complete)


def ordered_texts(texts: list[str], seed: int) -> list[str]:
    """The documents in an order fixed by ``seed`` (empty ones dropped)."""
    kept = [t for t in texts if t and t.strip()]
    random.Random(seed).shuffle(kept)
    return kept


def separator_ids(kind: str, tokenizer) -> list[int]:
    """The token ids put between two documents (``calibration.separator``)."""
    if kind == "eos":
        return [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    return tokenizer("\n\n", add_special_tokens=False)["input_ids"] if kind == "newline" else []


def wrap_chat(tokenizer, text: str) -> str:
    """One document as a user turn in the tokenizer's chat template."""
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False)


def token_rows(calibration, tokenizer, base: Path | None = None, where: str = "calibration") -> CalibrationRows:
    """Concatenate the seeded documents and cut them into ``samples`` rows of ``max_seq_len`` tokens."""
    texts = ordered_texts(datasets.load_texts(calibration.data, calibration.text_field, base), calibration.seed)
    if calibration.chat_template:
        if not getattr(tokenizer, "chat_template", None):
            raise StageFailed("calibration.chat_template is set but the tokenizer has no chat template",
                              where=where, fix="set chat_template = false, or use a model that ships one")
        texts = [wrap_chat(tokenizer, t) for t in texts]
    separator = separator_ids(calibration.separator, tokenizer)
    stream: list[int] = []
    need = calibration.samples * calibration.max_seq_len
    for text in texts:
        stream += tokenizer(text, add_special_tokens=False)["input_ids"] + separator
        if len(stream) >= need:
            break
    seq = calibration.max_seq_len
    rows = [stream[i : i + seq] for i in range(0, len(stream) - seq + 1, seq)][: calibration.samples]
    if not rows:
        raise StageFailed(f"calibration data {calibration.data!r} has {len(stream)} tokens, fewer than one row of "
                          f"max_seq_len = {seq}", where=where, fix="give more text, or lower calibration.max_seq_len")
    return CalibrationRows(rows, seq, len(texts), len(stream))


def as_dataset(rows: CalibrationRows):
    """A ``datasets.Dataset`` with ``input_ids`` and ``attention_mask`` (what llm-compressor's oneshot takes)."""
    from llmopt.libraries import require

    hf_datasets = require("datasets", "compress", "calibration data")
    return hf_datasets.Dataset.from_dict(
        {"input_ids": rows.rows, "attention_mask": [[1] * len(r) for r in rows.rows]}
    )


def as_batches(rows: CalibrationRows, batch_size: int = 1, device: str = "cpu") -> list:
    """``[batch, seq_len]`` LongTensors for hand-written forward loops."""
    import torch

    out = []
    for start in range(0, len(rows.rows), batch_size):
        out.append(torch.tensor(rows.rows[start : start + batch_size], dtype=torch.long, device=device))
    return out


def load(ctx, tokenizer) -> CalibrationRows:
    """The calibration rows of a compress stage's recipe, logged to the run log."""
    calibration = ctx.recipe.recipe.calibration
    rows = token_rows(calibration, tokenizer, ctx.recipe.path.parent, where=ctx.name)
    if len(rows.rows) < calibration.samples:
        ctx.log.warning("calibration: %s gives %d rows of %d tokens, fewer than the %d asked for",
                        calibration.data, len(rows.rows), rows.seq_len, calibration.samples)
    ctx.log.info("calibration: %s", rows.summary())
    return rows
