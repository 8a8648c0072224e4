"""Contracts every backend, shipped recipe and doc must keep."""

from __future__ import annotations

import sys

import pytest

from llmopt import docgen, registry
from llmopt.backends.base import PlanContext

from conftest import ROOT

BACKENDS = [(kind, name, cls) for kind, items in registry.all_backends().items() for name, cls in items.items()]


@pytest.mark.parametrize("kind,name,cls", BACKENDS, ids=[f"{k}:{n}" for k, n, _ in BACKENDS])
def test_backend_contract(kind, name, cls):
    module = sys.modules[cls.__module__]
    assert module.__doc__ and "Needs" in module.__doc__, f"{cls.__module__} needs a top docstring saying what it needs"
    assert cls.Options.model_config.get("extra") == "forbid"
    for field_name, field in cls.Options.model_fields.items():
        assert field.description, f"{kind}:{name} option {field_name!r} has no description"
    for attr in registry.REQUIRED[kind]:
        assert hasattr(cls, attr)
    assert isinstance(cls.requires, tuple)


def test_duplicate_registration_raises():
    cls = registry.get("eval", "perplexity")
    with pytest.raises(ValueError, match="registered twice"):
        registry.register("eval", "perplexity")(type("Other", (), {"Options": cls.Options, "check": 1, "run": 1}))


def test_unknown_backend_suggests():
    from llmopt.errors import UsageError

    with pytest.raises(UsageError, match="did you mean 'perplexity'"):
        registry.get("eval", "perplexty")


def test_generated_docs_are_current():
    stale = [str(p) for p, text in docgen.generated().items() if not p.is_file() or p.read_text() != text]
    assert not stale, f"run `python -m llmopt.docgen` to refresh: {stale}"


def test_readme_names_the_two_commands_and_they_exist():
    readme = (ROOT / "README.md").read_text()
    makefile = (ROOT / "Makefile").read_text()
    assert "make demo" in readme and "make test" in readme
    assert "\ndemo:" in makefile and "\ntest:" in makefile
    assert "llmopt run recipes/quickstart.toml" in makefile
    assert (ROOT / ".ci" / "run").read_text().strip().endswith("make test")
    assert "torch==2.13.0" in makefile  # the CPU build; an unpinned torch pulls CUDA wheels


def test_plan_context_where_points_into_the_recipe(tmp_path):
    from llmopt.recipe import load_recipe

    path = tmp_path / "r.toml"
    path.write_text('schema_version = 1\nname = "x"\n[model]\nsource = "a/b"\n[[eval]]\nname = "p"\nkind = "perplexity"\nwindow = 64\n')
    ctx = PlanContext(recipe=load_recipe(path), step=("eval", 0))
    assert ctx.where("window") == f"{path}:8: eval[0].window"


def test_require_pauses_the_collector_while_importing(tmp_path, monkeypatch):
    import gc

    from llmopt.libraries import require
    from llmopt.errors import MissingExtra

    (tmp_path / "llmopt_probe_module.py").write_text("import gc\nCOLLECTING = gc.isenabled()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "llmopt_probe_module", raising=False)
    assert gc.isenabled()
    assert require("llmopt_probe_module", "compress", "a test").COLLECTING is False
    assert gc.isenabled()  # resumed after the import
    with pytest.raises(MissingExtra):
        require("llmopt_no_such_module", "compress", "a test")
    assert gc.isenabled()  # and after a failed one
    gc.disable()
    try:
        require("json", "core", "a test")
        assert not gc.isenabled()  # a collector the caller paused stays paused
    finally:
        gc.enable()
