"""Generated token ids to text deltas, with stop strings.

Each new token re-decodes the whole completion and sends what is new. Two things
are held back until the next token settles them: a trailing U+FFFD (a character
whose UTF-8 bytes are split across tokens) and a tail that could be the start of a
stop string. When a stop string appears, the text ends just before it. Before
``min_tokens`` tokens (vLLM's ``min_tokens``) stop strings are not looked for: the
text so far is sent, and a stop string is searched for only in text after it.
"""

from __future__ import annotations

from typing import Callable

REPLACEMENT = "\ufffd"


class TextStream:
    def __init__(self, decode: Callable[[list[int]], str], stops: list[str] | None = None, min_tokens: int = 0):
        self.decode = decode
        self.stops = [s for s in stops or [] if s]
        self.min_tokens = min_tokens
        self.ids: list[int] = []
        self.sent = 0  # characters of the decoded text already handed out
        self.stopped = False

    def add(self, token: int) -> tuple[str, bool]:
        """Add one token: (the text that may be sent now, whether a stop string ended the text)."""
        self.ids.append(token)
        text = self.decode(self.ids)
        if len(self.ids) < self.min_tokens:  # stop strings do not count yet
            safe = len(text) - held_back(text, [])
            delta, self.sent = (text[self.sent : safe], safe) if safe > self.sent else ("", self.sent)
            return delta, False
        cut = first_stop(text, self.stops, self.sent)
        if cut is not None:
            delta, self.sent, self.stopped = text[self.sent : cut], cut, True
            return delta, True
        safe = len(text) - held_back(text, self.stops)
        delta = text[self.sent : safe] if safe > self.sent else ""
        self.sent = max(self.sent, safe)
        return delta, False

    def flush(self) -> str:
        """What is still held back, once generation has ended without a stop string."""
        if self.stopped or not self.ids:
            return ""
        text = self.decode(self.ids)
        delta, self.sent = text[self.sent :], len(text)
        return delta


def first_stop(text: str, stops: list[str], start: int) -> int | None:
    """Where the earliest stop string begins at or after ``start``, or None."""
    found = [i for i in (text.find(s, start) for s in stops) if i >= 0]
    return min(found) if found else None


def held_back(text: str, stops: list[str]) -> int:
    """How many trailing characters may still change or turn into a stop string."""
    partial = len(text) - len(text.rstrip(REPLACEMENT))
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), partial, -1):
            if text.endswith(stop[:k]):
                partial = k
                break
    return partial
