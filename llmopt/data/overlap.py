"""Is an eval set held out? Its overlap with the calibration text, and whether both share a source.

Both sets are read as documents (``llmopt.data.load_records``: the paragraphs of a .txt file,
the records of a .jsonl / .parquet file) and each document is cut into passages at blank
lines. Three signals, cheap enough for the planner (milliseconds on the built-ins):

* exact duplicates: eval documents, and passages of at least ``MIN_PASSAGE_WORDS`` words,
  that appear verbatim (whitespace aside) as a calibration document or passage;
* near duplicates: the word n-grams (lower-cased ``\\w+`` words, ``n`` = 8 by default, as a
  set of hashes) of each eval passage that occur anywhere in the calibration text. A passage
  is flagged when at least ``PASSAGE_THRESHOLD`` of its n-grams are there (a copied passage,
  lightly edited) or when it holds a run of ``MIN_SPAN_WORDS`` words that the calibration
  text also holds (a passage copied into a longer paragraph); ``fraction`` is the share over
  the whole set;
* same source: both specs name the same file or identical content, built-ins cut from a
  common work (``llmopt.data.BUILTIN``'s ``sources``), or .jsonl records whose ``source``
  fields share a value. Not contamination by itself, but such an eval is not held out.

The verdict is "contaminated" when any exact duplicate or flagged passage is found or
``fraction`` reaches ``threshold`` (default 1%: unrelated English texts share well under
0.1% of their 8-grams), else "same source" when that signal holds, else "clean".
Hub data (``hf:``) is not read here: ``check`` returns None for it.
"""

from __future__ import annotations

import functools
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from llmopt import data as datasets

N = 8
THRESHOLD = 0.01
PASSAGE_THRESHOLD = 0.5
MIN_PASSAGE_WORDS = 12  # shorter passages (a speaker's name, "return None") repeat by chance
MIN_SPAN_WORDS = 20  # a run of this many words found in the calibration text is a copy, not chance
_WORD = re.compile(r"\w+")
_BLANK = re.compile(r"\n\s*\n")


@dataclass
class Overlap:
    """How much of one eval set is in one calibration set."""

    eval: str
    calibration: str
    n: int
    threshold: float
    documents: int  # eval documents read
    passages: int  # eval passages with at least n words (the ones n-grams are counted in)
    ngrams: int  # eval n-grams in all
    fraction: float  # share of the eval's n-grams found in the calibration text
    exact_documents: int
    exact_passages: int
    flagged_passages: int  # passages with at least PASSAGE_THRESHOLD of their n-grams in calibration
    worst_passage: float  # the highest share of any one passage
    longest_span: int = 0  # words in the longest run of the eval also found in the calibration text (0: < n)
    same_source: str | None = None  # why both come from one source, or None
    examples: list[str] = field(default_factory=list)  # the first few duplicated passages, shortened

    @property
    def contaminated(self) -> bool:
        return bool(self.exact_documents or self.exact_passages or self.flagged_passages) or self.fraction >= self.threshold

    @property
    def verdict(self) -> str:
        if self.contaminated:
            return "contaminated"
        return "same source" if self.same_source else "clean"

    def summary(self) -> str:
        text = (f"{self.eval} against {self.calibration}: {self.verdict}; {self.fraction:.2%} of {self.ngrams:,} "
                f"{self.n}-grams, {self.exact_passages} verbatim and {self.flagged_passages} near-duplicate passages")
        return text + (f"; same source ({self.same_source})" if self.same_source else "")

    def to_dict(self) -> dict:
        return asdict(self) | {"verdict": self.verdict, "contaminated": self.contaminated}


def record_text(record, text_field: str | None = "text") -> str:
    """The text of one record: its ``text_field``, else every string in it (question, choices...)."""
    if isinstance(record, str):
        return record
    if text_field and text_field in record:
        return str(record[text_field])
    parts: list[str] = []
    for value in record.values():
        if isinstance(value, str):
            parts.append(value)
        elif isinstance(value, list):
            parts += [str(v) for v in value if isinstance(v, (str, int, float))]
    return "\n\n".join(parts)


def normal(text: str) -> str:
    return " ".join(text.split())


def grams(words: list[str], n: int) -> set[int]:
    return {hash(g) for g in zip(*(words[i:] for i in range(n)))}


@dataclass
class _Side:
    documents: list[str]
    sources: set[str]


@functools.lru_cache(maxsize=16)
def _read(path: str, mtime: float, spec: str, text_field: str | None) -> _Side:
    records = datasets.load_records(spec, None, text_field or "text")
    sources = {str(r["source"]) for r in records if isinstance(r, dict) and r.get("source")}
    return _Side([record_text(r, text_field) for r in records], sources)


@functools.lru_cache(maxsize=8)
def _index(path: str, mtime: float, spec: str, text_field: str | None, n: int) -> tuple[set[int], set[str], set[str]]:
    """The calibration side: n-gram hashes, normalized documents, normalized passages."""
    side = _read(path, mtime, spec, text_field)
    hashes: set[int] = set()
    documents, passages = set(), set()
    for doc in side.documents:
        documents.add(normal(doc))
        hashes |= grams(_WORD.findall(doc.lower()), n)
        passages.update(normal(p) for p in _BLANK.split(doc) if len(p.split()) >= MIN_PASSAGE_WORDS)
    return hashes, documents, passages


def same_source(eval_spec: str, calibration_spec: str, eval_path: Path, calibration_path: Path,
                eval_sources: set[str], calibration_sources: set[str]) -> str | None:
    """Why two sets come from one source, or None."""
    if eval_path.resolve() == calibration_path.resolve():
        return "the same file"
    a, b = datasets.builtin(eval_spec), datasets.builtin(calibration_spec)
    if a is not None and b is not None and set(a.sources) & set(b.sources):
        return "both cut from " + ", ".join(sorted(set(a.sources) & set(b.sources)))
    if datasets.digest(str(eval_path)) == datasets.digest(str(calibration_path)):
        return "identical content"
    shared = eval_sources & calibration_sources
    return "records from " + ", ".join(sorted(shared)[:3]) if shared else None


def check(eval_spec: str, calibration_spec: str, base: Path | None = None, *, eval_field: str | None = "text",
          calibration_field: str | None = "text", n: int = N, threshold: float = THRESHOLD) -> Overlap | None:
    """Compare an eval set with a calibration set; None when either is hub data (not read at plan time).

    ``eval_field`` / ``calibration_field``: the record field holding the text (None, or a field
    the records lack: all their strings, so multiple-choice questions are compared with their choices)."""
    eval_path, cal_path = datasets.resolve(eval_spec, base), datasets.resolve(calibration_spec, base)
    if eval_path is None or cal_path is None:
        return None
    found = _compare(eval_spec, calibration_spec, eval_path, eval_path.stat().st_mtime, cal_path,
                     cal_path.stat().st_mtime, eval_field, calibration_field, n, threshold)
    return replace(found, examples=list(found.examples))  # a copy: the caller may change it, the cached one stays


@functools.lru_cache(maxsize=32)  # a plan compares every eval with the calibration: the same pairs each time
def _compare(eval_spec: str, calibration_spec: str, eval_path: Path, eval_mtime: float, cal_path: Path,
             cal_mtime: float, eval_field: str | None, calibration_field: str | None, n: int, threshold: float) -> Overlap:
    ev = _read(str(eval_path), eval_mtime, str(eval_path), eval_field)
    cal = _read(str(cal_path), cal_mtime, str(cal_path), calibration_field)
    hashes, cal_documents, cal_passages = _index(str(cal_path), cal_mtime, str(cal_path),
                                                 calibration_field, n)
    result = Overlap(eval_spec, calibration_spec, n, threshold, len(ev.documents), 0, 0, 0.0, 0, 0, 0, 0.0,
                     same_source=same_source(eval_spec, calibration_spec, eval_path, cal_path, ev.sources, cal.sources))
    found = 0
    for doc in ev.documents:
        if normal(doc) in cal_documents and len(doc.split()) >= MIN_PASSAGE_WORDS:
            result.exact_documents += 1
        for passage in _BLANK.split(doc):
            found += _passage(result, passage, hashes, cal_passages)
    result.fraction = found / result.ngrams if result.ngrams else 0.0
    return result


def _passage(result: Overlap, passage: str, hashes: set[int], cal_passages: set[str]) -> int:
    """Score one eval passage into ``result``; returns how many of its n-grams the calibration holds."""
    words = _WORD.findall(passage.lower())
    mine = [hash(g) for g in zip(*(words[i:] for i in range(result.n)))]
    hits, run, span = 0, 0, 0
    for h in mine:
        run = run + 1 if h in hashes else 0
        hits += run > 0
        span = max(span, run + result.n - 1 if run else 0)
    long = len(passage.split()) >= MIN_PASSAGE_WORDS
    exact = long and normal(passage) in cal_passages
    share = hits / len(mine) if mine else 0.0
    if mine:
        result.passages += 1
        result.ngrams += len(mine)
        result.worst_passage = max(result.worst_passage, share)
        result.longest_span = max(result.longest_span, span)
    result.exact_passages += exact
    flagged = long and (share >= PASSAGE_THRESHOLD or span >= MIN_SPAN_WORDS) and not exact
    result.flagged_passages += flagged
    if (exact or flagged) and len(result.examples) < 3:
        result.examples.append(normal(passage)[:160])
    return hits
