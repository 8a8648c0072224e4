"""Every shipped recipe plans the same stages under the same cache keys as the same recipe did before its comments
were rewritten as a template (the recipes at commit ``BEFORE``, read from git), and every docs link in a recipe names
a page and a heading that exist.

A comment edit must not move a key: a user's cache, and every measurement made with a shipped recipe, stay valid.
Both versions are planned here, with the same code and libraries: a source's key holds its file's size and time
(the demo GGUF's time is when pip installed it), so keys recorded on one machine do not hold on another.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from conftest import write_recipe

ROOT = Path(__file__).resolve().parents[1]
BEFORE = "144c41a"  # the shipped recipes before their comments were shortened (4ad6157) and relinked (f5281c8)
LINK = re.compile(r"\b(docs/[\w/.-]+\.md)(?:#([\w-]+))?")


def recipe_before(name: str) -> str | None:
    """The recipe ``name`` as it was at ``BEFORE``, or None where it did not exist then (or git has no history)."""
    done = subprocess.run(["git", "show", f"{BEFORE}:llmopt/recipes/{name}.toml"], cwd=ROOT, capture_output=True,
                          text=True)
    return done.stdout if done.returncode == 0 else None


def plan_keys(path: Path) -> list[tuple[str, str]]:
    from llmopt import api

    return [(s.name, s.key) for s in api.plan(path).stages]


def test_every_shipped_recipe_plans_the_stages_and_keys_it_planned_before_its_comments_changed(tmp_path):
    from llmopt import api

    if subprocess.run(["git", "cat-file", "-e", BEFORE], cwd=ROOT, capture_output=True).returncode:
        pytest.skip(f"this checkout has no commit {BEFORE} (a shallow clone)")
    compared, moved = [], {}
    for item in api.shipped_recipes():
        old = recipe_before(item["name"])
        if old is None:
            continue  # shipped later: nothing to compare
        before = plan_keys(write_recipe(tmp_path, old, f"{item['name']}.toml"))
        now = plan_keys(Path(item["path"]))
        compared.append(item["name"])
        if before != now:
            moved[item["name"]] = {"before": before, "now": now}
    assert len(compared) >= 15 and "quickstart" in compared, compared
    assert not moved, moved


def anchors(page: Path) -> set[str]:
    """The page's headings as GitHub (and the docs site, pymdownx.slugs) anchor them."""
    heads = [line.lstrip("#").strip() for line in page.read_text().splitlines() if re.match(r"#+ ", line)]
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


def test_every_link_in_a_shipped_recipe_names_a_page_and_heading_that_exist():
    from llmopt import api

    broken = []
    for item in api.shipped_recipes():
        for page, anchor in LINK.findall(Path(item["path"]).read_text()):
            if not (ROOT / page).is_file() or (anchor and anchor not in anchors(ROOT / page)):
                broken.append(f"{item['name']}: {page}#{anchor}")
    assert not broken, broken
