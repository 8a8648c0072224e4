"""Log-probabilities of /v1/completions, in the shape of OpenAI's legacy API and vLLM's.

``echo=true, max_tokens=0, logprobs=N`` scores a prompt without generating (what
log-likelihood evals send: llmopt's endpoint runtime, lm-eval's ``local-completions``):
the choice's ``logprobs`` has one entry per prompt token, the first with
``token_logprobs`` and ``top_logprobs`` None, since nothing predicts it. With generated
tokens, their entries follow (or come alone without ``echo``). Each entry holds the
token's text (``tokens``), where that text starts in the choice's ``text``
(``text_offset``), its log-probability under the model's raw distribution (before
temperature and penalties, as vLLM returns them) and a dict of the N most likely tokens
at that position, the token itself added when it is not among them (so up to N + 1).

The values come from one forward pass over the whole sequence (the runtime's
``logits``): the log-softmax is taken on the float32 logits with its normalising sums
in float64, as the runtimes' ``nll`` takes it, so they are the numbers it sums. With
``logprobs=1`` (what log-likelihood evals ask for) the most likely token is an argmax,
not a partial sort of the vocabulary.
"""

from __future__ import annotations

import numpy as np

WINDOW = 6  # tokens of context decoded before a token, so that its text keeps a leading space
ROWS = 256  # positions normalised at once (ROWS x vocab float32 values)


def choice_parts(runtime, prompt_ids: list[int], prompt_text: str | None, generated: list[int], text: str,
                 echo: bool, top: int | None) -> tuple[str, dict | None]:
    """The choice's ``text`` and ``logprobs`` (None without ``top``) for a prompt and what was
    generated from it (``generated`` token ids, ``text`` as sent)."""
    if echo and prompt_text is None:
        prompt_text = runtime.decode(prompt_ids)
    full = (prompt_text + text) if echo else text
    if top is None:
        return full, None
    ids = prompt_ids + generated
    token_lp, top_lp = sequence_logprobs(runtime, ids, top)
    first = 0 if echo else len(prompt_ids)
    pieces = token_pieces(runtime.decode, ids, first)
    offsets = text_offsets(pieces[: len(prompt_ids) - first], 0)
    offsets += text_offsets(pieces[len(prompt_ids) - first :], len(prompt_text) if echo else 0)
    tops = [None if entry is None else named(runtime.decode, ids, t, entry) for t, entry in enumerate(top_lp)]
    return full, {"tokens": pieces, "text_offset": offsets, "token_logprobs": token_lp[first:], "top_logprobs": tops[first:]}


def sequence_logprobs(runtime, ids: list[int], top: int) -> tuple[list, list]:
    """Per position: the token's log-probability given the ones before it, and the ``top`` most likely
    (token id, log-probability) pairs there with the token's own added; both None at position 0."""
    logits = np.asarray(runtime.logits(ids), dtype=np.float32)
    if logits.shape[0] != len(ids):
        raise ValueError(f"the runtime returned logits for {logits.shape[0]} of {len(ids)} positions")
    token_lp: list = [None]
    top_lp: list = [None]
    for start in range(0, len(ids) - 1, ROWS):
        rows = logits[start : min(start + ROWS, len(ids) - 1)]
        peak = rows.max(axis=-1)
        logsumexp = np.log(np.exp(rows - peak[:, None]).sum(axis=-1, dtype=np.float64)) + peak
        for offset, row in enumerate(rows):
            target = ids[start + offset + 1]
            best = most_likely(row, top)
            if target not in best:
                best.append(target)
            norm = logsumexp[offset]
            token_lp.append(float(row[target]) - norm)
            top_lp.append([(i, float(row[i]) - norm) for i in best])
    return token_lp, top_lp


def most_likely(row: np.ndarray, top: int) -> list[int]:
    """The ids of the ``top`` largest values of ``row``, largest first."""
    if top == 1:
        return [int(row.argmax())]
    best = np.argpartition(-row, top)[:top] if 0 < top < row.shape[0] else np.arange(row.shape[0])[:top]
    return sorted(best.tolist(), key=lambda i: -row[i])


def token_pieces(decode, ids: list[int], first: int = 0) -> list[str]:
    """The text each token adds, for ids[first:], decoded after a few tokens of context."""
    return [piece(decode, ids[max(0, t - WINDOW) : t], ids[t]) for t in range(first, len(ids))]


def piece(decode, context: list[int], token: int) -> str:
    before = decode(context) if context else ""
    after = decode(context + [token])
    return after[len(before):] if after.startswith(before) else decode([token])


def text_offsets(pieces: list[str], start: int) -> list[int]:
    offsets, at = [], start
    for text in pieces:
        offsets.append(at)
        at += len(text)
    return offsets


def named(decode, ids: list[int], position: int, entry: list[tuple[int, float]]) -> dict[str, float]:
    """{token text: log-probability} of one position; two ids of the same text keep the larger value."""
    context = ids[max(0, position - WINDOW) : position]
    out: dict[str, float] = {}
    for token, value in sorted(entry, key=lambda pair: -pair[1]):
        out.setdefault(piece(decode, context, token), value)
    return out


def chat_logprobs(runtime, prompt_ids: list[int], generated: list[int], top: int) -> dict:
    """Chat's ``logprobs``: {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}
    for each generated token, OpenAI's shape; ``top`` most likely tokens at each position."""
    if not generated:
        return {"content": []}
    ids = prompt_ids + generated
    token_lp, top_lp = sequence_logprobs(runtime, ids, max(top, 1))
    content = []
    for t in range(len(prompt_ids), len(ids)):
        text = piece(runtime.decode, ids[max(0, t - WINDOW) : t], ids[t])
        alternatives = [(piece(runtime.decode, ids[max(0, t - WINDOW) : t], i), v) for i, v in top_lp[t][:top]]
        content.append({"token": text, "logprob": token_lp[t], "bytes": list(text.encode("utf-8")),
                        "top_logprobs": [{"token": a, "logprob": v, "bytes": list(a.encode("utf-8"))}
                                         for a, v in alternatives]})
    return {"content": content}
