"""Every shipped recipe plans the same stages under the same cache keys as recorded in tests/data/shipped_plans.json.

A comment edit must not move a key: a user's cache, and every measurement made with a shipped recipe, stay valid.
A key also moves when a backend's ``version`` or a pinned library changes; then regenerate the file with
``.venv/bin/python tests/test_shipped_recipes.py --write`` and let its diff show which stages moved.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXPECTED = Path(__file__).parent / "data" / "shipped_plans.json"
LINK = re.compile(r"\b(docs/[\w/.-]+\.md)(?:#([\w-]+))?")


def shipped_plans() -> dict[str, dict[str, str]]:
    """Each shipped recipe's stages, in plan order: stage name -> cache key."""
    from llmopt import api

    return {item["name"]: {s.name: s.key for s in api.plan(item["path"]).stages} for item in api.shipped_recipes()}


def test_every_shipped_recipe_plans_the_recorded_stages_and_keys():
    expected = json.loads(EXPECTED.read_text())
    plans = shipped_plans()
    assert sorted(plans) == sorted(expected), "a recipe added or removed: regenerate with --write (see the top)"
    moved = {name: {"recorded": expected[name], "planned": plans[name]}
             for name in expected if list(plans[name].items()) != list(expected[name].items())}
    assert not moved, ("stages or keys moved (a backend version or a pin changed? then regenerate: "
                       "`.venv/bin/python tests/test_shipped_recipes.py --write`): " + json.dumps(moved, indent=1))



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


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    EXPECTED.write_text(json.dumps(shipped_plans(), indent=1) + "\n")
    print(f"wrote {EXPECTED}")
