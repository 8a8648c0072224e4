"""Text and example sets: the built-in ones shipped here, local files, hub datasets.

Each built-in is described in ``BUILTIN`` (file, domain, sources, role); SOURCES.md
beside this file says where each was cut from and under which licence.

Calibration: ``builtin:mix`` (fiction, scripture, reference entries, verse drama, an
essay and Python code; about 46k tokens with the demo model's tokenizer, the default) and
``builtin:prose`` (short science prose written for llmopt; about 7.7k tokens, 30 rows of
256). Evaluation, none of it from a source of ``builtin:mix``: ``builtin:fiction-eval``,
``builtin:encyclopedia-eval``, ``builtin:dialogue-eval``, ``builtin:code-eval``,
``builtin:prose-eval`` (science prose written with ``builtin:prose``, in its style: not held
out from it), and the example sets ``builtin:mc`` (multiple choice) and ``builtin:qa``
(short-answer generation).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from llmopt.errors import UsageError

HERE = Path(__file__).parent


@dataclass(frozen=True)
class Builtin:
    """A data set shipped with llmopt."""

    file: str  # in this folder
    domain: str  # what kind of text it is, as reports name it
    sources: tuple[str, ...]  # the works it was cut from; sets sharing one are not held out from each other
    role: str  # "calibration" or "eval"
    about: str

    @property
    def path(self) -> Path:
        return HERE / self.file


MIX_SOURCES = ("melville-moby-dick", "kjv-bible", "jargon-file", "bierce-devils-dictionary", "milton-comus",
               "milton-areopagitica", "markovify", "attrs")
BUILTIN = {
    "prose": Builtin("prose_calib.txt", "science prose", ("llmopt-prose",), "calibration",
                     "short science and technology explanations written for llmopt"),
    "mix": Builtin("calib_mix.jsonl", "mixed: fiction, scripture, reference, verse drama, essay, Python code",
                   MIX_SOURCES, "calibration", "public-domain and permissively licensed text of six kinds"),
    "prose-eval": Builtin("prose_eval.txt", "science prose", ("llmopt-prose",), "eval",
                          "held-out science prose written for llmopt, in the style of builtin:prose"),
    "fiction-eval": Builtin("fiction_eval.txt", "narrative fiction", ("austen-persuasion",), "eval",
                            "Jane Austen, Persuasion (1818), chapters 1-4"),
    "encyclopedia-eval": Builtin("encyclopedia_eval.txt", "encyclopedic", ("eb1911-shakespeare",), "eval",
                                 "the Encyclopaedia Britannica (1911) article on Shakespeare, its first part"),
    "dialogue-eval": Builtin("dialogue_eval.txt", "dialogue (a play)", ("shakespeare-much-ado",), "eval",
                             "William Shakespeare, Much Ado About Nothing, acts 1-2 and act 3 scene 1"),
    "code-eval": Builtin("code_eval.jsonl", "code (Python)", ("cpython-stdlib",), "eval",
                         "four modules of the CPython 3.11 standard library"),
    "mc": Builtin("mc.jsonl", "multiple-choice questions", ("llmopt-mc",), "eval",
                  "200 multiple-choice questions written for llmopt"),
    "qa": Builtin("qa.jsonl", "short-answer questions", ("llmopt-qa",), "eval",
                  "150 short-answer questions written for llmopt"),
}


def builtin(spec: str) -> Builtin | None:
    """The built-in a ``builtin:<name>`` spec names, None for other specs (unknown names raise)."""
    if not spec.startswith("builtin:"):
        return None
    name = spec.split(":", 1)[1]
    if name not in BUILTIN:
        raise UsageError(f"unknown built-in data {spec!r}", fix=f"use one of: {', '.join('builtin:' + n for n in BUILTIN)}")
    return BUILTIN[name]


def domain(spec: str, base: Path | None = None) -> str | None:
    """The kind of text a data spec holds: a built-in's recorded domain; for a local .jsonl file, the
    ``domain`` field its records give (the first 10,000; several values: "mixed: a, b"); else None."""
    shipped = builtin(spec)
    if shipped is not None:
        return shipped.domain
    path = resolve(spec, base)
    if path is None or path.suffix != ".jsonl" or not path.is_file():
        return None
    seen: list[str] = []
    with open(path, encoding="utf-8", errors="replace") as f:  # only the domain field is read here
        for i, line in enumerate(f):
            if i >= 10_000:
                break
            try:
                value = json.loads(line).get("domain") if line.strip() else None
            except (ValueError, AttributeError):
                return None
            if value and str(value) not in seen:
                seen.append(str(value))
    if not seen:
        return None
    return seen[0] if len(seen) == 1 else "mixed: " + ", ".join(seen)


def resolve(spec: str, base: Path | None = None) -> Path | None:
    """The local file a data spec names, or None for a hub dataset."""
    shipped = builtin(spec)
    if shipped is not None:
        return shipped.path
    if spec.startswith("hf:"):
        return None
    path = Path(spec).expanduser()
    if not path.is_absolute() and base is not None:
        path = base / path
    return path


def check_spec(spec: str, base: Path | None = None) -> str | None:
    """A problem with a data spec, or None."""
    try:
        path = resolve(spec, base)
    except UsageError as exc:
        return f"{exc.what}; {exc.fix}"
    if path is None:
        parts = spec.split(":")
        if len(parts) not in (3, 4) or not all(parts[1:]):
            return f"hub data must be hf:<dataset>[:<config>]:<split> (got {spec!r})"
        return None
    if not path.is_file():
        return f"data file not found: {path}"
    if path.suffix not in (".txt", ".jsonl", ".json", ".parquet"):
        return f"unsupported data file type {path.suffix!r}; use .txt, .jsonl or .parquet"
    return None


def digest(spec: str, base: Path | None = None) -> str:
    """Content hash of local data; the spec itself for hub data."""
    path = resolve(spec, base)
    if path is None or not path.is_file():
        return hashlib.sha256(spec.encode()).hexdigest()
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_text(path: Path) -> str:
    """A local data file's text; a UsageError naming it when it is not UTF-8."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})",
                         fix="save the data as UTF-8") from None


def load_texts(spec: str, text_field: str = "text", base: Path | None = None) -> list[str]:
    """Paragraphs of a .txt file (split on blank lines), or a field of each record."""
    return [str(r[text_field]) if isinstance(r, dict) else r for r in load_records(spec, base, text_field)]


def load_records(spec: str, base: Path | None = None, text_field: str = "text") -> list:
    path = resolve(spec, base)
    if path is None:
        return _load_hub(spec)
    if path.suffix == ".txt":
        text = read_text(path)
        return [p.strip() for p in text.split("\n\n") if p.strip()]
    if path.suffix in (".jsonl", ".json"):
        lines = read_text(path).splitlines()
        return [json.loads(line) for line in lines if line.strip()]
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    raise UsageError(f"unsupported data file type {path.suffix!r}", fix="use .txt, .jsonl or .parquet")


def _load_hub(spec: str) -> list[dict]:
    from llmopt.libraries import require

    datasets = require("datasets", "compress", f"data {spec!r}")
    parts = spec.split(":")[1:]
    name, split = parts[0], parts[-1]
    config = parts[1] if len(parts) == 3 else None
    return list(datasets.load_dataset(name, config, split=split))
