"""Token counts at plan time, with the model's own tokenizer and without transformers or weights.

The planner reads no weights, but how many calibration rows a text fills depends on the
model's tokenizer. It is found here without loading the model:

* a local model folder, or a hub model already in the local Hugging Face cache: its
  ``tokenizer.json``, read with the ``tokenizers`` library (no network);
* a GGUF file (``builtin:smollm2-135m``): the vocabulary and merges in its header, built into
  the byte-level BPE tokenizer that transformers makes from them when it converts the file
  (``tokenizer.ggml.model = "gpt2"``), or a SentencePiece vocabulary (``"llama"``) built as the
  source stage builds it (``llmopt.data.gguf_vocab``);
* otherwise (a hub model not downloaded yet) None, and callers estimate from characters.

On the built-in sets, the GGUF-built tokenizer gives exactly the counts of the tokenizer the
source stage writes (tests/test_data.py checks this on the real file when it is installed).
"""

from __future__ import annotations

import functools
from pathlib import Path

CHARS_PER_TOKEN = 4.0  # an estimate where no tokenizer is at hand: English prose 4-4.6, code and verse 3.3-3.9
MAX_CHARS_PER_TOKEN = 8.0  # no real text averages more, so len(text) / 8 tokens is a safe lower bound


@functools.lru_cache(maxsize=4)
def _from_gguf(path: str, mtime: float):
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    from llmopt.data import gguf_vocab

    vocab = gguf_vocab.gguf_vocabulary(path, gguf_vocab.WANTED + gguf_vocab.KEYS)
    if vocab.get("tokenizer.ggml.model") == "llama":
        return gguf_vocab.spm_tokenizer(vocab)
    if vocab.get("tokenizer.ggml.model") != "gpt2" or not vocab.get("tokenizer.ggml.merges"):
        return None
    tokens = vocab["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in vocab["tokenizer.ggml.merges"]]
    tokenizer = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    control = [t for t, kind in zip(tokens, vocab.get("tokenizer.ggml.token_type") or []) if kind == 3]
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in control])
    return tokenizer


@functools.lru_cache(maxsize=4)
def _from_file(path: str, mtime: float):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(path)


def model_tokenizer(source: str, base: Path | None = None, revision: str | None = None):
    """A ``tokenizers.Tokenizer`` for a recipe's ``model.source``, or None when none is on this machine."""
    from llmopt.model.modelinfo import gguf_path, is_gguf

    try:
        if is_gguf(source):
            path = gguf_path(source, base)
            return _from_gguf(str(path), path.stat().st_mtime) if path.is_file() else None
        folder = Path(source).expanduser()
        if not folder.is_absolute() and base is not None and (base / folder).is_dir():
            folder = base / folder
        file = folder / "tokenizer.json" if folder.is_dir() else _hub_cached(source, revision)
        return _from_file(str(file), file.stat().st_mtime) if file is not None and file.is_file() else None
    except Exception:  # noqa: BLE001 - a count we cannot make is an estimate, never a failed plan
        return None


def _hub_cached(repo_id: str, revision: str | None) -> Path | None:
    """tokenizer.json of a hub model when it is already in the local cache (no network)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    found = try_to_load_from_cache(repo_id, "tokenizer.json", revision=revision)
    return Path(found) if isinstance(found, str) else None


def count_tokens(texts: list[str], tokenizer, separator: int = 1, stop_at: int | None = None) -> tuple[int, bool]:
    """Tokens of the documents, each tokenized alone without special tokens, plus ``separator`` per
    document (the end-of-sequence token calibration puts between them); stops once ``stop_at`` is
    reached. Returns (tokens, whether every document was counted)."""
    total = 0
    for start in range(0, len(texts), 32):
        batch = texts[start : start + 32]
        total += sum(len(e.ids) + separator for e in tokenizer.encode_batch(batch, add_special_tokens=False))
        if stop_at is not None and total >= stop_at:
            return total, start + len(batch) >= len(texts)
    return total, True
