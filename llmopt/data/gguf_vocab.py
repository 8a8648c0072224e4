"""A GGUF header's tokenizer entries (``gguf_vocabulary``, read without the weights), and the tokenizer a
SentencePiece vocabulary among them defines (``tokenizer.ggml.model = "llama"``).

A SentencePiece vocabulary in a GGUF file (Llama 2, Mistral, Gemma) is tokens, scores and token types
with no merges: llama.cpp tokenizes it by merging, again and again, the adjacent pair whose joined text is
the vocabulary's piece of highest score, and by falling back to ``<0xNN>`` byte tokens for text no piece
covers. That is a BPE whose merges are ranked by the joined piece's score, which is what ``spm_tokenizer``
builds with the ``tokenizers`` library, with:

* spaces written as ``▁``, and one ``▁`` before the text (not after each user-defined token in it) where
  ``tokenizer.ggml.add_space_prefix`` is not false (Gemma's headers say false);
* control and unknown tokens (types 3 and 2) special; user-defined ones (type 4) matched whole in the text,
  or, where they hold a ``▁`` (Gemma's runs of spaces), reached by merges like the others;
* the BOS (and EOS) that ``tokenizer.ggml.add_bos_token`` (``add_eos_token``) ask for, added by the
  tokenizer itself, so every stage that encodes text gets them.

transformers 5.17 reads these vocabularies as a ``Unigram`` model whose piece scores are the BPE ranks (for
Gemma) or as a BPE with merges rebuilt in another order (Llama), and adds no BOS: its token ids are not the
ones the weights were trained on, down to single characters for some vocabularies.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
        "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id",
        "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token",
        "tokenizer.ggml.add_space_prefix", "tokenizer.chat_template")
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPACE = "▁"


def is_sentencepiece(path: str | Path) -> bool:
    """Whether the GGUF file's vocabulary is SentencePiece's ("llama"), from its header."""
    from llmopt.model.modelinfo import read_gguf_header

    meta, _ = read_gguf_header(path)
    return meta.get("tokenizer.ggml.model") == "llama"


def read_vocabulary(path: str | Path) -> dict:
    """The header's tokenizer entries (tokens, scores, types, special ids, flags, chat template)."""
    return gguf_vocabulary(path, KEYS)


_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
WANTED = ("tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type")


def gguf_vocabulary(path: str | Path, keys: tuple[str, ...] = WANTED) -> dict:
    """The tokenizer entries of a GGUF header (by default model, tokens, merges, token types); other keys are
    skipped."""
    out: dict = {}
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        (n_kv,) = struct.unpack_from("<Q", buf, 16)
        pos = 24
        for _ in range(n_kv):
            (n,) = struct.unpack_from("<Q", buf, pos)
            key = buf[pos + 8 : pos + 8 + n].decode("utf-8", "replace")
            (kind,) = struct.unpack_from("<I", buf, pos + 8 + n)
            value, pos = _value(buf, kind, pos + 12 + n, keep=key in keys)
            if key in keys:
                out[key] = value
    return out


def _value(buf, kind: int, pos: int, keep: bool):
    if kind == 8:
        (n,) = struct.unpack_from("<Q", buf, pos)
        return buf[pos + 8 : pos + 8 + n].decode("utf-8", "replace"), pos + 8 + n
    if kind != 9:
        fmt = "<" + _SCALAR[kind]
        return struct.unpack_from(fmt, buf, pos)[0], pos + struct.calcsize(fmt)
    inner, count = struct.unpack_from("<IQ", buf, pos)
    pos += 12
    if inner in _SCALAR:
        size = struct.calcsize("<" + _SCALAR[inner])
        values = list(struct.unpack_from(f"<{count}{_SCALAR[inner]}", buf, pos)) if keep else None
        return values, pos + count * size
    items = []
    for _ in range(count):
        item, pos = _value(buf, inner, pos, keep)
        if keep:
            items.append(item)
    return items, pos


def merges(tokens: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    """Every (left, right) pair of pieces whose join is a normal or user-defined piece, the join of highest
    score first."""
    ids = {t: i for i, t in enumerate(tokens) if types[i] in (NORMAL, USER_DEFINED, BYTE)}
    ranked = []
    for i, piece in enumerate(tokens):
        if types[i] not in (NORMAL, USER_DEFINED) or len(piece) < 2:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in ids and right in ids:
                ranked.append((-scores[i], i, ids[left], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def spm_tokenizer(vocab: dict):
    """A ``tokenizers.Tokenizer`` that encodes and decodes as llama.cpp does with this vocabulary."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokens = vocab["tokenizer.ggml.tokens"]
    types = vocab.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    scores = vocab.get("tokenizer.ggml.scores") or [-float(i) for i in range(len(tokens))]
    unk = vocab.get("tokenizer.ggml.unknown_token_id")
    model = models.BPE({t: i for i, t in enumerate(tokens)}, merges(tokens, scores, types), fuse_unk=True,
                       byte_fallback=True, unk_token=tokens[unk] if isinstance(unk, int) else None)
    tokenizer = Tokenizer(model)
    prefix = vocab.get("tokenizer.ggml.add_space_prefix", True)
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(SPACE, prepend_scheme="first" if prefix else "never",
                                                       split=False)
    tokenizer.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
                                          + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t, kind in zip(tokens, types) if kind in (CONTROL, UNKNOWN)])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False)
                          for t, kind in zip(tokens, types) if kind == USER_DEFINED and SPACE not in t])
    tokenizer.post_processor = post_processor(vocab)
    return tokenizer


def post_processor(vocab: dict):
    """The BOS / EOS the header asks the tokenizer to add, as a template."""
    from tokenizers import processors

    tokens = vocab["tokenizer.ggml.tokens"]
    ends = {}
    for name in ("bos", "eos"):
        token_id = vocab.get(f"tokenizer.ggml.{name}_token_id")
        if vocab.get(f"tokenizer.ggml.add_{name}_token") and isinstance(token_id, int):
            ends[name] = (tokens[token_id], token_id)

    def sequence(piece: str, type_id: int) -> list[str]:
        return [f"{ends[n][0]}:{type_id}" for n in ("bos",) if n in ends] + [f"{piece}:{type_id}"] \
            + [f"{ends[n][0]}:{type_id}" for n in ("eos",) if n in ends]

    return processors.TemplateProcessing(single=sequence("$A", 0), pair=sequence("$A", 0) + sequence("$B", 1),
                                         special_tokens=sorted(set(ends.values())))


def hf_tokenizer(path: str | Path):
    """The transformers tokenizer of a GGUF file's SentencePiece vocabulary, with its special tokens named,
    ready for ``save_pretrained``."""
    from transformers import PreTrainedTokenizerFast

    vocab = read_vocabulary(path)
    tokens = vocab["tokenizer.ggml.tokens"]
    named = {f"{name}_token": tokens[vocab[f"tokenizer.ggml.{key}"]]
             for name, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("unk", "unknown_token_id"),
                               ("pad", "padding_token_id"))
             if isinstance(vocab.get(f"tokenizer.ggml.{key}"), int)}
    extra = {"chat_template": vocab["tokenizer.chat_template"]} if vocab.get("tokenizer.chat_template") else {}
    return PreTrainedTokenizerFast(tokenizer_object=spm_tokenizer(vocab), **named, **extra)
