"""The README's main job on the real demo model: `llmopt run recipes/quickstart.toml`."""

from __future__ import annotations

import json

import pytest

from conftest import ROOT, run_cli


@pytest.mark.slow
def test_quickstart_runs_end_to_end(tmp_path):
    out = tmp_path / "quickstart"
    result = run_cli("run", str(ROOT / "recipes" / "quickstart.toml"), "-o", str(out), "--format", "json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    doc = json.loads(result.stdout)
    assert doc["passed"] is True
    manifest = json.loads((out / "manifest.json").read_text())
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["hidden_size"] == 576 and "quantization_config" not in json.dumps(manifest["stages"][0]["outputs"])
    perplexity = [g for g in manifest["gates"] if g["metric"] == "perplexity"][0]
    assert 5 < perplexity["baseline"] < 100  # a real language model on English prose
    again = run_cli("run", str(ROOT / "recipes" / "quickstart.toml"), "-o", str(out), "--format", "json", cwd=tmp_path)
    assert again.returncode == 0
    assert all(stage["status"] == "cached" for stage in json.loads(again.stdout)["stages"])
