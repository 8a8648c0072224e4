"""The README's main job on the real demo model: `llmopt run recipes/quickstart.toml`."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_quickstart_runs_end_to_end(tmp_path, quickstart):
    """The run itself is the session fixture `quickstart` (tests/conftest.py), shared with the docs' commands."""
    out, result, cli = quickstart.artifact, quickstart.result, quickstart.cli
    assert result.returncode == 0, result.stderr[-3000:]
    doc = json.loads(result.stdout)
    assert doc["passed"] is True
    manifest = json.loads((out / "manifest.json").read_text())
    stages = {stage["name"]: stage["outputs"] for stage in manifest["stages"]}
    groups = stages["compress.0.gptq"]["quantization"]["config_groups"]
    weights, kept = groups["group_0"]["weights"], groups["group_1"]["weights"]
    assert (weights["num_bits"], weights["group_size"], weights["symmetric"]) == (4, 32, False)
    assert (kept["num_bits"], kept["group_size"], kept["symmetric"]) == (8, 32, True)
    assert len(stages["compress.0.gptq"]["sensitive_layers"]["kept"]) == 16  # layer groups, ranked on the calibration
    export = stages["export.onnx"]
    assert export["precision"] == "int4" and export["quantized_input"]["repacked"] is True
    assert export["verify"]["status"] == "passed"  # MatMulNBits ran on the CPU EP, nothing fell back
    assert (out / "model" / "model.onnx").is_file() and (out / "model" / "genai_config.json").is_file()
    assert (out / "deploy" / "ort" / "launch.sh").is_file()
    written = sum(p.stat().st_size for p in (out / "model").rglob("*") if p.is_file())
    assert manifest["model_bytes"] == written  # about 111 MB: int4 and 8-bit linears, one int8 table (tied head)
    # the plan's size model, which counts the 16 kept layer groups at their most (the 16 largest: 14.6 MB, where
    # the ranked ones wrote 5.4 MB): the folder lies between the estimate without them and the estimate
    estimate, parts = manifest["estimates"]["artifact_bytes"], manifest["estimates"]["model_size"]["parts"]
    assert estimate - parts["sensitive layers at 8 bits (at most)"] <= written <= estimate * 1.01
    gates = {g["name"]: g for g in manifest["gates"]}
    assert 5 < gates["prose"]["baseline"] < 100  # a real language model on English prose
    assert gates["prose"]["candidate"] > gates["prose"]["baseline"]  # 4 bits cost something; never free
    assert gates["mc"]["n"] == 200 and gates["mc"]["baseline"] > 0.4  # well above chance (0.25)
    assert cli("verify", str(out)).returncode == 0
    again = cli("run", str(quickstart.recipe), "-o", str(out), cwd=tmp_path)  # human output
    assert again.returncode == 0, again.stderr[-3000:]
    assert "(0 stage(s) run, 17 cached" in again.stdout + again.stderr
    table = again.stdout + again.stderr
    assert "verdict" in table and "prose" in table and "PASS" in table  # the verdict table
    # the artifact as eval's candidate or alone, by its folder or its model folder: its cached stages, untouched
    recipe = str(quickstart.recipe)
    for n, args in enumerate([("--candidate", str(out)), ("--candidate", str(out / "model")), ("--model", str(out / "model"))]):
        cached = cli("eval", recipe, *args, "-o", str(tmp_path / f"r{n}"), "-f", "json", cwd=tmp_path)
        assert cached.returncode == 0, cached.stderr[-3000:]
        assert {s["status"] for s in json.loads(cached.stdout)["stages"]} == {"cached"}, args
