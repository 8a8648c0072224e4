"""Text and example sets: the built-in ones shipped here, local files, hub datasets.

Built-ins were written for llmopt: ``builtin:prose`` (calibration prose),
``builtin:prose-eval`` (held-out prose for perplexity), ``builtin:mc`` (multiple
choice), ``builtin:qa`` (short-answer generation).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from llmopt.errors import UsageError

HERE = Path(__file__).parent
BUILTIN = {
    "prose": HERE / "prose_calib.txt",
    "prose-eval": HERE / "prose_eval.txt",
    "mc": HERE / "mc.jsonl",
    "qa": HERE / "qa.jsonl",
}


def resolve(spec: str, base: Path | None = None) -> Path | None:
    """The local file a data spec names, or None for a hub dataset."""
    if spec.startswith("builtin:"):
        name = spec.split(":", 1)[1]
        if name not in BUILTIN:
            raise UsageError(f"unknown built-in data {spec!r}", fix=f"use one of: {', '.join('builtin:' + n for n in BUILTIN)}")
        return BUILTIN[name]
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


def load_texts(spec: str, text_field: str = "text", base: Path | None = None) -> list[str]:
    """Paragraphs of a .txt file (split on blank lines), or a field of each record."""
    return [str(r[text_field]) if isinstance(r, dict) else r for r in load_records(spec, base, text_field)]


def load_records(spec: str, base: Path | None = None, text_field: str = "text") -> list:
    path = resolve(spec, base)
    if path is None:
        return _load_hub(spec)
    if path.suffix == ".txt":
        text = path.read_text(encoding="utf-8")
        return [p.strip() for p in text.split("\n\n") if p.strip()]
    if path.suffix in (".jsonl", ".json"):
        lines = path.read_text(encoding="utf-8").splitlines()
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
