"""The documentation site (mkdocs.yml, `make docs`) builds in strict mode, and a broken link fails it.

mkdocs.yml makes a link to a missing page, a missing heading (anchor) or an absolute path a warning, and strict
mode turns any warning into a failed build. Headings get GitHub's anchors (pymdownx.slugs), so a link that works
on GitHub works on the site. A link into the docs from outside them (a recipe's comment, a docstring) is not
read by the build, so a test here checks that its anchor exists in the built page. A build of the whole site
takes about two seconds.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

# A section named from outside docs/ (a recipe's comment, a docstring): docs/<page>.md#<heading's anchor>
NAMED_SECTION = re.compile(r"\b(docs/[\w/.-]+?\.md)#([\w-]+)")
OUTSIDE_DOCS = ["llmopt", "tests", "benchmarks"]


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """mkdocs build of root/mkdocs.yml into site; its log (warnings included) in stdout. Not --quiet: under it
    mkdocs 1.6 does not count warnings, and strict mode passes whatever they say."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(root / "mkdocs.yml"), "--site-dir", str(site)],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)


def copy_of_the_docs(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    shutil.copytree(ROOT / "docs", root / "docs")
    shutil.copy(ROOT / "mkdocs.yml", root / "mkdocs.yml")
    return root


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The repository's site, built once for this module."""
    folder = tmp_path_factory.mktemp("site")
    done = build(ROOT, folder)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log
    assert "WARNING" not in log, log
    return folder


def test_the_site_builds_strict_with_no_warning(site):
    assert (site / "results" / "index.html").is_file()
    assert (site / "search" / "search_index.json").is_file()


def test_every_section_named_outside_the_docs_exists(site):
    """A link into the docs from code, recipes, tests, benchmarks and the README (docs/<page>.md#<anchor>), which the
    site's build does not read, names a heading (or an anchor) the built page has."""
    files = [ROOT / "README.md", *(f for top in OUTSIDE_DOCS for f in (ROOT / top).rglob("*")
                                   if f.suffix in {".py", ".toml", ".sh", ".md", ".json"} and f.is_file())]
    missing = []
    for f in files:
        for doc, anchor in set(NAMED_SECTION.findall(f.read_text(errors="replace"))):
            page = site / Path(doc).relative_to("docs").with_suffix("") / "index.html"
            if Path(doc).stem == "index":
                page = site / Path(doc).relative_to("docs").with_suffix(".html")
            html = page.read_text() if page.is_file() else ""
            if f'id="{anchor}"' not in html:
                missing.append(f"{f.relative_to(ROOT)}: {doc}#{anchor}")
    assert not missing, "\n".join(missing)


BROKEN = {  # a link the build must refuse -> what its warning names
    "[a page](results/no-such-page.md)": "results/no-such-page.md",
    "[a heading](results/accuracy.md#no-such-heading)": "#no-such-heading",
    "[a heading on this page](#no-such-heading-here)": "#no-such-heading-here",
}


def test_a_broken_link_fails_the_build(tmp_path):
    """One build of a copy of the docs whose home page gains three broken links: it fails, naming each."""
    root = copy_of_the_docs(tmp_path)
    index = root / "docs" / "index.md"
    index.write_text(index.read_text() + "".join(f"\nSee {link}.\n" for link in BROKEN))
    done = build(root, tmp_path / "site")
    log = done.stdout + done.stderr
    assert done.returncode != 0, log
    for says in BROKEN.values():
        assert says in log, (says, log)
