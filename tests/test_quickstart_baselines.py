"""The quickstart's baseline scores, made by `llmopt eval` on the recipe alone, are the stages `llmopt run` reuses."""

from __future__ import annotations

import pytest

from conftest import ROOT
from llmopt import api
from llmopt.run import evaluate

pytestmark = pytest.mark.slow


def test_the_quickstart_s_baselines_scored_by_eval_are_the_run_s(quickstart_cache, tmp_path):
    """`llmopt eval recipes/quickstart.toml` (no candidate: the source alone) writes each eval's baseline under the
    key `llmopt run` of the same recipe plans for it, so that a user who scored the baseline first (or a CI job that
    keeps its cache) does not score it again. Made in the shared run's cache (``quickstart_cache``): under
    ``make test`` the other worker takes this module early, while the first worker's run compresses, and the run
    finds the five baselines done (tests/conftest.py, ``pytest_collection_modifyitems``)."""
    recipe = ROOT / "recipes" / "quickstart.toml"
    result = evaluate.evaluate(recipe, cache_dir=quickstart_cache, output=tmp_path / "reports")
    scored = {r.name: r.key for r in result.records if r.name.startswith("eval.")}  # eval.prose, ...
    planned = {s.name.removesuffix(".baseline"): s.key for s in api.plan(recipe, cache_dir=quickstart_cache).stages
               if s.name.endswith(".baseline")}  # eval.prose.baseline, ...
    assert set(planned) == {f"eval.{e.name}" for e in result.plan.recipe.recipe.eval}
    assert scored == planned
    prose = next(r for r in result.records if r.name == "eval.prose").outputs
    assert 5 < prose["value"] < 100 and prose["n"] > 10  # a real model's perplexity, over its windows of 256 tokens
