"""Built-in data sets: shipped with their sources, sized, and each one's domain."""

from __future__ import annotations

import pytest

from conftest import DATA
from llmopt import data as datasets
from llmopt.errors import UsageError

EVALS = [name for name, b in datasets.BUILTIN.items() if b.role == "eval"]


def test_every_builtin_is_shipped_described_and_sourced():
    sources = (DATA / "SOURCES.md").read_text()
    for name, item in datasets.BUILTIN.items():
        assert item.path.is_file() and item.path.stat().st_size > 10_000, name
        assert item.role in ("calibration", "eval") and item.domain and item.sources, name
        assert f"`builtin:{name}`" in sources and item.file in sources, name
        assert datasets.load_texts(f"builtin:{name}", "question" if name == "mc" else "prompt" if name == "qa" else "text")
    assert sum(p.stat().st_size for p in DATA.iterdir() if p.is_file()) < 1.5e6


def test_new_eval_sets_span_domains_and_are_held_out_by_source():
    domains = {datasets.domain(f"builtin:{n}") for n in ("fiction-eval", "encyclopedia-eval", "dialogue-eval", "code-eval")}
    assert len(domains) == 4 and all(domains)
    calibration_sources = {s for b in datasets.BUILTIN.values() if b.role == "calibration" for s in b.sources}
    for name in EVALS:
        shared = set(datasets.BUILTIN[name].sources) & calibration_sources
        assert shared == ({"llmopt-prose"} if name == "prose-eval" else set()), name


def test_code_eval_keeps_indentation():
    (module, *_), source = datasets.load_texts("builtin:code-eval"), (DATA / "code_eval.jsonl").read_text()
    assert "\n    def " in module and '"source": "CPython 3.11.2 Lib/textwrap.py"' in source


def test_domain_of_user_files(tmp_path):
    assert datasets.domain("builtin:mix").startswith("mixed: ")
    (tmp_path / "a.txt").write_text("some text\n\nmore")
    assert datasets.domain("a.txt", tmp_path) is None
    (tmp_path / "b.jsonl").write_text('{"text": "x", "domain": "legal"}\n{"text": "y", "domain": "legal"}\n')
    assert datasets.domain("b.jsonl", tmp_path) == "legal"
    (tmp_path / "c.jsonl").write_text('{"text": "x", "domain": "legal"}\n{"text": "y", "domain": "chat"}\n')
    assert datasets.domain("c.jsonl", tmp_path) == "mixed: legal, chat"
    (tmp_path / "d.jsonl").write_text('{"text": "x"}\n')
    assert datasets.domain("d.jsonl", tmp_path) is None
    assert datasets.domain("hf:wikitext:wikitext-2-raw-v1:test") is None
    with pytest.raises(UsageError, match="builtin:mix"):
        datasets.domain("builtin:nope")


def test_a_data_file_that_is_not_utf8_is_a_usage_error_naming_it(tmp_path):
    """Calibration or eval data, or a bench data set, in another encoding was an internal error
    (UnicodeDecodeError) at plan time, in a stage, or in `llmopt bench --dataset`."""
    from llmopt.bench.dataset import read_file

    for name in ("latin1.txt", "latin1.jsonl"):
        path = tmp_path / name
        path.write_bytes('{"prompt": "caf\u00e9"}\n'.encode("latin-1"))
        with pytest.raises(UsageError, match=f"{path} is not UTF-8 text"):
            datasets.load_texts(str(path))
    with pytest.raises(UsageError, match="is not UTF-8 text"):
        read_file(tmp_path / "latin1.jsonl")
    assert datasets.domain(str(tmp_path / "latin1.jsonl")) is None  # the domain lookup reads what it can
