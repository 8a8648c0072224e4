"""The model-family table: which of llmopt's paths run for which family, as data (``families.toml`` beside this
file). The planner refuses a path a family cannot take, before any stage runs (``llmopt.plan.rules``), and
docs/models.md is generated from the same table (``llmopt.docgen``).

A family is a transformers ``model_type``: the one the converted checkpoint has. A GGUF file names its
architecture in its own words ("gemma3" for what transformers loads as "gemma3_text"), so a family lists the GGUF
names that convert to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

TABLE = Path(__file__).with_name("families.toml")
Status = Literal["works", "refused", "untested", "unknown"]


@dataclass(frozen=True)
class Verdict:
    """What the table says of one path for one family."""

    family: str
    path: str
    status: Status
    why: str = ""  # refused: the reason
    instead: str = ""  # refused: the nearest path that works
    test: str = ""  # works: the test that shows it

    @property
    def label(self) -> str:
        """The family's name as users know it, with its model_type."""
        entry = _table()["families"].get(self.family)
        return f"{entry['label']} ({self.family})" if entry else repr(self.family)


@lru_cache(maxsize=1)
def _table() -> dict:
    return tomllib.loads(TABLE.read_text())


def paths() -> dict[str, str]:
    """Every path id with what it means, in the table's order."""
    return dict(_table()["paths"])


def families() -> dict[str, dict]:
    """Every family the table names: model_type -> its entry."""
    return dict(_table()["families"])


def model_type_of_gguf(architecture: str, experts: int = 0) -> str:
    """The model_type a GGUF file of ``architecture`` converts to ("gemma3" -> "gemma3_text"). A Mixtral file names
    its architecture llama, with experts."""
    if architecture == "llama" and experts:
        return "mixtral"
    for family, entry in families().items():
        if architecture in entry.get("gguf", []):
            return family
    return {"qwen2moe": "qwen2_moe"}.get(architecture, architecture)


def verdict(family: str, path: str) -> Verdict:
    """The table's status of ``path`` for ``family``."""
    table = _table()
    entry = table["families"].get(family)
    if path not in table["paths"]:  # a backend the table does not know (a plugin's, a test's): no test of it
        return Verdict(family, path, "untested" if entry else "unknown")
    if entry is None:
        return Verdict(family, path, "unknown")
    refused = entry.get("refuse", {}).get(path)
    if refused is not None:
        why = table["refusals"].get(refused["why"], refused["why"])
        return Verdict(family, path, "refused", why=why, instead=refused.get("instead", ""))
    test = entry.get("tests", {}).get(path)
    untested = entry.get("untested", table["defaults"]["untested"])
    if test is None and path in untested:
        return Verdict(family, path, "untested")
    test = test or table["tests"].get(path, "")
    if not test:
        return Verdict(family, path, "untested")
    return Verdict(family, path, "works", test=test.format(family=family))


def works_with(path_prefix: str, family: str) -> list[str]:
    """The paths under ``path_prefix`` ("compress.", "export.") that work for ``family``: the nearest alternatives."""
    return [p for p in paths() if p.startswith(path_prefix) and verdict(family, p).status == "works"]


def claims() -> list[Verdict]:
    """Every (family, path) the table says works, with its test."""
    return [v for family in families() for path in paths() if (v := verdict(family, path)).status == "works"]
