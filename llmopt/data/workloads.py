"""Built-in text workloads for ``llmopt bench --dataset builtin:NAME`` and ``[serve.workload] dataset``.

Each is made here, by code and without randomness, from text llmopt already ships (the eval sets
beside this file; SOURCES.md says where they come from), as the records a user would write in a
JSONL file (docs/bench.md, "Text workloads"), so the same parser reads both:

* ``builtin:continue``: prose continuation. A passage of fiction, encyclopedic or science prose
  (``{"prompt"}``), with the paragraph that follows it in the source as the reference answer
  (``"completion"``): answers that are new text.
* ``builtin:rewrite``: a passage of science or encyclopedic prose with an instruction: correct
  the spelling mistakes put into it, put each sentence on a numbered line, copy out the
  sentences that hold a word, or summarize it in two sentences. The reference answers of the
  first three copy the passage (what n-gram or prompt-lookup speculation feeds on); a summary
  has none and asks for 64 tokens.
* ``builtin:code-edit``: a function of the CPython standard library (builtin:code-eval) with an
  edit to make (rename a parameter, rename the function, drop its docstring and comments) and
  the edited function as the reference answer: code that mostly copies the prompt.
* ``builtin:multiturn``: chat under one long system prompt that every request shares (a reading
  partner for Much Ado About Nothing, with the play's opening), 16 conversations of 4 turns; each
  request holds its conversation so far (``{"messages"}``) and the next speech as the reference
  answer: what prefix caching feeds on.

``records(name)`` gives a workload's records and ``jsonl(name)`` their text, whose sha256 the
results report; ``python -m llmopt.data.workloads NAME`` prints it.
"""

from __future__ import annotations

import ast
import functools
import io
import json
import re
import sys
import tokenize
from dataclasses import dataclass
from typing import Callable

from llmopt.data import BUILTIN

SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")
SPEAKER = re.compile(r"^[A-Z][A-Z' ]+\.$")
SUMMARY_TOKENS = 64


@dataclass(frozen=True)
class BuiltinWorkload:
    build: Callable[[], list[dict]]
    domain: str  # what kind of text, as `llmopt ls data` names it
    about: str


def _paragraphs(name: str, min_words: int = 20) -> list[str]:
    """A shipped text's paragraphs, each on one line, with at least ``min_words`` words."""
    text = BUILTIN[name].path.read_text(encoding="utf-8")
    paragraphs = (" ".join(p.split()) for p in text.split("\n\n"))
    return [p for p in paragraphs if len(p.split()) >= min_words]


def _sentences(text: str) -> list[str]:
    return [s for s in SENTENCE_END.split(text) if s]


def _cut(text: str, max_words: int) -> str:
    """``text`` up to the last whole sentence within ``max_words`` words (a first sentence longer than that: its
    first ``max_words`` words)."""
    out: list[str] = []
    for sentence in _sentences(text):
        if len(" ".join(out + [sentence]).split()) > max_words:
            break
        out.append(sentence)
    return " ".join(out) or " ".join(text.split()[:max_words])


def _interleave(groups: list[list[dict]], limit: int) -> list[dict]:
    """One record of each group in turn, so that the first few requests hold every kind."""
    out = [group[i] for i in range(max(map(len, groups))) for group in groups if i < len(group)]
    return out[:limit]


def continuation() -> list[dict]:
    groups = []
    for name in ("fiction-eval", "encyclopedia-eval", "prose-eval"):
        paragraphs, records, i = [_cut(p, 300) for p in _paragraphs(name)], [], 0
        while i < len(paragraphs) - 1:
            passage = [paragraphs[i]]
            while len(" ".join(passage).split()) < 150 and i + len(passage) < len(paragraphs) - 1:
                passage.append(paragraphs[i + len(passage)])
            i += len(passage)
            records.append({"prompt": "\n\n".join(passage), "completion": _cut(paragraphs[i], 120)})
            i += 1
        groups.append(records)
    return _interleave(groups, 64)


def _typos(text: str) -> str:
    """Every seventh word of five letters or more with its second and third letters swapped."""
    words = text.split(" ")
    for k in range(3, len(words), 7):
        w = words[k]
        if len(w) >= 5 and w[:4].isalpha() and w[1] != w[2]:
            words[k] = w[0] + w[2] + w[1] + w[3:]
    return " ".join(words)


def _key_word(sentences: list[str]) -> str | None:
    """The word of five letters or more found in the most sentences (at least two; the first such in the text)."""
    seen: dict[str, int] = {}
    for sentence in sentences:
        for word in dict.fromkeys(re.findall(r"[a-z]{5,}", sentence.lower())):
            seen[word] = seen.get(word, 0) + 1
    best = max(seen.items(), key=lambda kv: kv[1], default=(None, 0))
    return best[0] if best[1] >= 2 else None


def rewrite_task(k: int, passage: str) -> dict:
    sentences = _sentences(passage)
    word = _key_word(sentences)
    if k % 4 == 0:
        return {"prompt": "Correct the spelling mistakes in the passage below. Answer with the corrected passage "
                          f"only, changing nothing else.\n\nPassage:\n{_typos(passage)}", "completion": passage}
    if k % 4 == 1 or (k % 4 == 2 and word is None):
        return {"prompt": "Rewrite the passage below with each sentence on a line of its own, numbered 1., 2., 3. and "
                          f"so on, changing nothing else.\n\nPassage:\n{passage}",
                "completion": "\n".join(f"{n}. {s}" for n, s in enumerate(sentences, 1))}
    if k % 4 == 2:
        return {"prompt": f'Copy out every sentence of the passage below that contains the word "{word}", one per '
                          f"line, exactly as written.\n\nPassage:\n{passage}",
                "completion": "\n".join(s for s in sentences if word in s.lower())}
    return {"prompt": f"Summarize the passage below in two sentences.\n\nPassage:\n{passage}",
            "output_tokens": SUMMARY_TOKENS}


def rewrite() -> list[dict]:
    prose = _paragraphs("prose-eval")
    encyclopedia = [_cut(p, 160) for p in _paragraphs("encyclopedia-eval", 60)]
    passages = _interleave([[{"p": p} for p in prose], [{"p": p} for p in encyclopedia]], 64)
    return [rewrite_task(k, item["p"]) for k, item in enumerate(passages)]


def _functions(source: str) -> list[tuple[str, ast.FunctionDef]]:
    """(source text, node) of each top-level function and method, dedented, of 5 to 80 lines."""
    import textwrap

    lines, out = source.splitlines(), []
    tree = ast.parse(source)
    for node in tree.body:
        for fn in ([node] if isinstance(node, ast.FunctionDef) else
                   [n for n in node.body if isinstance(n, ast.FunctionDef)] if isinstance(node, ast.ClassDef) else []):
            first = min([fn.lineno] + [d.lineno for d in fn.decorator_list])
            if 5 <= fn.end_lineno - first + 1 <= 80:
                text = textwrap.dedent("\n".join(lines[first - 1 : fn.end_lineno]))
                out.append((text, ast.parse(text).body[0]))
    return out


def _tokens(text: str) -> list[tokenize.TokenInfo]:
    return list(tokenize.generate_tokens(io.StringIO(text + "\n").readline))


def _renamed(text: str, old: str, new: str) -> str:
    """``text`` with the name ``old`` made ``new``: not attributes (``x.old``) nor keyword arguments of calls."""
    tokens, spots, depth, header = _tokens(text), [], 0, True
    for i, tok in enumerate(tokens):
        if tok.type == tokenize.OP:
            depth += tok.string in "([{"
            depth -= tok.string in ")]}"
            header = header and not (tok.string == ":" and depth == 0)
        if tok.type != tokenize.NAME or tok.string != old:
            continue
        before, after = tokens[i - 1].string if i else "", tokens[i + 1].string
        if before != "." and not (after == "=" and depth > 0 and not header):
            spots.append(tok.start)
    lines = text.split("\n")
    for row, col in sorted(spots, reverse=True):
        line = lines[row - 1]
        lines[row - 1] = line[:col] + new + line[col + len(old):]
    return "\n".join(lines)


def _stripped(text: str, fn: ast.FunctionDef) -> str:
    """``text`` without its docstring, comment lines and trailing comments."""
    drop: set[int] = set()
    doc = fn.body[0]
    if isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str):
        drop |= set(range(doc.lineno, doc.end_lineno + 1))
    lines = text.split("\n")
    for tok in _tokens(text):
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            lines[row - 1] = lines[row - 1][:col].rstrip()
            if not lines[row - 1].strip():
                drop.add(row)
    return "\n".join(line for row, line in enumerate(lines, 1) if row not in drop)


def code_edit_task(k: int, text: str, fn: ast.FunctionDef) -> dict | None:
    """The ``k``-th kind of edit on the function, or the next kind that applies to it."""
    names = [a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs if a.arg not in ("self", "cls")]
    counts = {n: sum(t.string == n for t in _tokens(text) if t.type == tokenize.NAME) for n in names}
    plain = not re.search(r"\b[fF][rR]?[\"']", text)  # names inside f-strings tokenize differently across Pythons
    for kind in [(k + j) % 3 for j in range(3)]:
        if kind == 0 and plain and counts and max(counts.values()) >= 3:
            old = max(names, key=lambda n: counts[n])
            instruction, edited = f"Rename the parameter `{old}` to `{old}_value`.", _renamed(text, old, f"{old}_value")
        elif kind == 1 and plain:
            new = f"{fn.name.strip('_')}_v2"
            instruction = f"Rename the function `{fn.name}` to `{new}`, and any call to it inside it."
            edited = _renamed(text, fn.name, new)
        elif kind == 2 and _stripped(text, fn) != text:
            instruction, edited = "Remove the docstring and every comment.", _stripped(text, fn)
        else:
            continue
        return {"prompt": f"Edit this Python function: {instruction} Answer with the whole edited function only."
                          f"\n\n```python\n{text}\n```", "completion": f"```python\n{edited}\n```"}
    return None


def code_edit() -> list[dict]:
    out = []
    for line in BUILTIN["code-eval"].path.read_text(encoding="utf-8").splitlines():
        for text, fn in _functions(json.loads(line)["text"]):
            task = code_edit_task(len(out), text, fn)
            if task is not None:
                out.append(task)
    return out[:64]


def _speeches() -> list[str]:
    """The play's speeches in order, each as ``NAME: words`` on one line, stage directions left out."""
    text = BUILTIN["dialogue-eval"].path.read_text(encoding="utf-8")
    out = []
    for paragraph in text.split("\n\n"):
        head, _, rest = paragraph.strip().partition("\n")
        words = " ".join(re.sub(r"\[[^\]]*\]", " ", rest).split())
        if SPEAKER.match(head) and words:
            out.append(f"{head[:-1]}: {words}")
    return out


def multiturn() -> list[dict]:
    speeches = _speeches()
    opening, n = [], 0
    while len(" ".join(opening).split()) < 600:
        opening.append(speeches[n])
        n += 1
    system = ("You are a reading partner in a rehearsal of William Shakespeare's Much Ado About Nothing. The user "
              "reads one part; you answer with the next speech, in the play's own words, beginning with the "
              "speaker's name.\n\nThe play opens:\n\n" + "\n".join(opening))
    out = []
    for c in range(16):
        talk = speeches[n + 8 * c : n + 8 * c + 8]
        turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": s} for i, s in enumerate(talk)]
        for t in range(4):
            out.append({"messages": [{"role": "system", "content": system}, *turns[: 2 * t + 2]]})
    return out


WORKLOADS = {
    "continue": BuiltinWorkload(continuation, "fiction, encyclopedic and science prose", "prose continuation: a passage of fiction, encyclopedic or science "
                                "prose; its next paragraph as the reference answer"),
    "rewrite": BuiltinWorkload(rewrite, "science and encyclopedic prose, with instructions", "correct, renumber, extract from or summarize a given passage: answers "
                               "that copy their prompt (summaries excepted)"),
    "code-edit": BuiltinWorkload(code_edit, "code (Python), with instructions", "edits of CPython standard-library functions (rename, drop comments): "
                                 "answers that copy their prompt"),
    "multiturn": BuiltinWorkload(multiturn, "chat: dialogue (a play)", "16 conversations of 4 turns under one long shared system prompt: "
                                 "what prefix caching feeds on"),
}


def names() -> list[str]:
    return [f"builtin:{name}" for name in WORKLOADS]


@functools.lru_cache(maxsize=None)
def jsonl(name: str) -> str:
    """The workload's records as JSONL text (one compact record a line), what its sha256 is taken of."""
    return "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in WORKLOADS[name].build())


def records(name: str) -> list[dict]:
    return [json.loads(line) for line in jsonl(name).splitlines()]


if __name__ == "__main__":
    sys.stdout.write(jsonl(sys.argv[1].removeprefix("builtin:")))
