"""Map TOML key paths to the line they are written on, for error messages.

``tomllib`` gives values but not positions, so this reads the text once more with
a small line scanner: table headers, arrays of tables, ``key = value`` lines and
the keys of inline tables. It only needs to be right for the recipes people write;
when a key is not found, the nearest enclosing table's line is used.
"""

from __future__ import annotations

import re

Path = tuple  # ("compress", 0, "bits")

_KEY = re.compile(r"""^\s*((?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*'))*)\s*=""")
_INLINE_KEY = re.compile(r"""[{,]\s*([A-Za-z0-9_-]+|"[^"]*")\s*=""")


def _split_dotted(text: str) -> list[str]:
    parts = re.findall(r"""[A-Za-z0-9_-]+|"[^"]*"|'[^']*'""", text)
    return [p[1:-1] if p[:1] in "\"'" else p for p in parts]


def _strip_comment(line: str) -> str:
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            return line[:i]
    return line


def index_lines(text: str) -> dict[Path, int]:
    index: dict[Path, int] = {}
    arrays: dict[Path, int] = {}
    current: Path = ()
    closing = ""
    for lineno, raw in enumerate(text.splitlines(), 1):
        if closing:
            if closing in raw:
                closing = ""
            continue
        line = _strip_comment(raw).strip()
        if not line:
            continue
        if line.startswith("[["):
            parts = _split_dotted(line[2 : line.find("]]")])
            parent = _resolve(parts[:-1], arrays)
            key = parent + (parts[-1],)
            arrays[key] = arrays.get(key, 0) + 1
            current = key + (arrays[key] - 1,)
            index.setdefault(key, lineno)
            index[current] = lineno
            continue
        if line.startswith("["):
            current = _resolve(_split_dotted(line[1 : line.find("]")]), arrays)
            index[current] = lineno
            continue
        match = _KEY.match(line)
        if not match:
            continue
        path = current + tuple(_split_dotted(match.group(1)))
        index[path] = lineno
        value = line[match.end() :].strip()
        if value.startswith("{"):
            for sub in _INLINE_KEY.findall(value):
                index[path + (sub.strip('"'),)] = lineno
        for delim in ('"""', "'''"):
            if value.count(delim) % 2 == 1:
                closing = delim
    return index


def _resolve(parts: list[str], arrays: dict[Path, int]) -> Path:
    out: Path = ()
    for part in parts:
        out = out + (part,)
        if out in arrays:
            out = out + (arrays[out] - 1,)
    return out


def line_of(index: dict[Path, int], path: Path) -> int | None:
    """Line of ``path``, or of the closest enclosing key that has one."""
    path = tuple(path)
    while path:
        if path in index:
            return index[path]
        path = path[:-1]
    return None


def render_path(path: Path) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"
