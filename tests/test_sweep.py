"""llmopt sweep: variants planned first, one shared cache, resume after kill -9, the report and the choice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from llmopt import api
from llmopt.errors import RecipeError, UsageError
from llmopt.recipe.load import apply_override
from llmopt.recipe.schema import SweepSection
from llmopt.sweep import report as reporting
from llmopt.sweep.variants import parse_axis, toml_literal, variant_ids

from conftest import make_tiny_llama, serving_tables, tiny_recipe, wait_for, write_recipe

PRUNE = """
[calibration]
samples = 4
max_seq_len = 64

[[compress]]
method = "prune_depth"
layers = 1
protect_first = 0
protect_last = 0
"""


@pytest.fixture(scope="module")
def four_layers(tmp_path_factory) -> Path:
    """A tiny Llama with 4 decoder layers: dropping 1 or 2 works, dropping 5 cannot."""
    return make_tiny_llama(tmp_path_factory.mktemp("tiny4") / "tiny-llama-4", layers=4)


def sweep_recipe(folder: Path, model: Path, axes: str, extra: str = PRUNE, windows: int = 4) -> Path:
    body = tiny_recipe(model, windows=windows).replace("max_increase_pct = 5", "max_increase_pct = 50")
    return write_recipe(folder, body + extra + "\n[sweep]\nobjective = \"smallest\"\n\n[sweep.axes]\n" + axes)


# --- axes and values ---------------------------------------------------------------------------------------------

def test_an_axis_on_the_command_line_reads_each_value_as_toml():
    assert parse_axis("compress[0].method=gptq,awq") == ("compress[0].method", ["gptq", "awq"])
    assert parse_axis("compress[0].group_size = 32,64") == ("compress[0].group_size", [32, 64])
    assert parse_axis('export.lm_head="int8",false') == ("export.lm_head", ["int8", False])


def test_an_axis_value_may_hold_commas_inside_a_table_an_array_or_quotes():
    """A comma separates values only outside braces, brackets and quotes: an inline table of several keys is one
    value (it was cut at each comma, and every variant failed with "Input should be a valid dictionary")."""
    spec = 'compress[0]={ method = "gptq", group_size = 32, symmetric = false },{ method = "rtn" }'
    assert parse_axis(spec) == ("compress[0]", [{"method": "gptq", "group_size": 32, "symmetric": False},
                                                {"method": "rtn"}])
    assert parse_axis('calibration.data="a,b",[1, 2],x') == ("calibration.data", ["a,b", [1, 2], "x"])
    assert parse_axis("k='it, too',{ a = [1, { b = 2 }] }") == ("k", ["it, too", {"a": [1, {"b": 2}]}])


def test_an_axis_that_is_not_key_equals_values_is_a_usage_error():
    for bad in ("compress[0].method", "=1,2", "key="):
        with pytest.raises(UsageError, match="is not KEY=V1,V2"):
            parse_axis(bad)


@pytest.mark.parametrize("value", [1, 0.5, True, "a b", '"quoted"', [32, 64], {"method": "rtn", "group_size": 64},
                                   {"odd key": "x"}])
def test_axis_values_are_written_so_that_an_override_reads_them_back(value):
    data: dict = {}
    apply_override(data, f"section.key={toml_literal(value)}")
    assert data == {"section": {"key": value}}


def test_variant_ids_name_folders_uniquely():
    combos = [{"compress[0]": {"method": "gptq"}, "compress[0].group_size": 32, "export.lm_head": "int8"},
              {"compress[0]": {"method": "gptq"}, "compress[0].group_size": 32, "export.lm_head": "in/t8"},
              {"compress[0]": {"method": "gptq"}, "compress[0].group_size": 32, "export.lm_head": "in t8"}]
    assert variant_ids(combos) == ["gptq-group_size32-int8", "gptq-group_size32-in_t8", "gptq-group_size32-in_t8-3"]
    # whole tables of one method are told apart by the keys whose values differ between them
    tables = [{"method": "gptq", "group_size": 64, "actorder": "weight"},
              {"method": "gptq", "group_size": 32, "symmetric": False, "actorder": "weight"},
              {"method": "awq", "group_size": 32}, {"method": "rtn", "group_size": 32, "symmetric": False}]
    assert variant_ids([{"compress[0]": t} for t in tables]) == [
        "gptq-group_size64", "gptq-group_size32-symmetricfalse", "awq", "rtn"]


def test_the_sweep_table_is_checked_like_every_other():
    with pytest.raises(ValueError, match="at least one value"):
        SweepSection(axes={"compress[0].group_size": []})
    with pytest.raises(ValueError, match="Extra inputs are not permitted"):
        SweepSection(objectiv="smallest")


# --- judging and choosing ----------------------------------------------------------------------------------------

def _row(vid, index, mib, delta, verdict="pass", higher=False):
    gate = {"name": "prose", "metric": "perplexity", "delta": delta, "ci": [delta - 0.01, delta + 0.01],
            "higher_is_better": higher, "verdict": verdict}
    return {"id": vid, "index": index, "status": "passed" if verdict == "pass" else "gate_failed",
            "model_bytes": int(mib * reporting.MIB), "compress_seconds": 10.0, "gates": [gate],
            "overrides": [f"x={index}"]}


def _sweep(objective="smallest", **constraints):
    settings = SweepSection(objective=objective, constraints=constraints)
    return SimpleNamespace(settings=settings, accuracy="prose", loaded=SimpleNamespace(path=Path("r.toml")),
                           folder=Path("sweeps/r"))


def test_the_front_and_the_choice_follow_the_objective_among_passing_variants():
    rows = [_row("big-good", 1, 100, 0.01), _row("small-bad", 2, 40, 0.30, verdict="fail"),
            _row("mid", 3, 60, 0.05), _row("mid-worse", 4, 60, 0.08), _row("big-worse", 5, 100, 0.02)]
    sweep = _sweep()
    reporting.judge(rows, sweep)
    assert [r["id"] for r in rows if r["pareto"]] == ["big-good", "small-bad", "mid"]
    assert [r["qualifies"] for r in rows] == [True, False, True, True, True]
    chosen = reporting.choose(rows, sweep)
    assert chosen["id"] == "mid"  # the smallest that passes; small-bad failed its gate
    assert "small-bad (gate prose failed)" in chosen["why"][-1] and chosen["why"][1].startswith("next: mid-worse")
    assert chosen["command"] == "llmopt run r.toml -s 'x=3'"
    assert reporting.choose(rows, _sweep("most_accurate"))["id"] == "big-good"
    bounded = _sweep(max_model_mib=50)
    reporting.judge(rows, bounded)
    assert reporting.choose(rows, bounded) is None
    assert rows[2]["excluded"] == ["model/ 60.0 MiB > max_model_mib 50"]
    reporting.judge(rows, _sweep(gates=False, max_model_mib=50))
    assert reporting.choose(rows, _sweep(gates=False, max_model_mib=50))["id"] == "small-bad"


def _timed(row, tok_s, ttft=100.0, tpot=20.0):
    row["bench"] = {"output_tokens_per_s": tok_s, "ttft_p99_ms": ttft, "tpot_p99_ms": tpot}
    row["speed"] = tok_s
    return row


def test_the_fastest_objective_and_speed_constraints_judge_what_the_bench_stage_measured():
    rows = [_timed(_row("fast-bad", 1, 100, 0.30, verdict="fail"), 90.0),
            _timed(_row("fast", 2, 100, 0.05), 80.0, tpot=45.0),
            _timed(_row("slow-small", 3, 40, 0.02), 30.0),
            _timed(_row("slow-worse", 4, 60, 0.04), 30.0)]
    sweep = _sweep("fastest")
    reporting.judge(rows, sweep)
    assert [r["id"] for r in rows if r["pareto_speed"]] == ["fast-bad", "fast", "slow-small"]
    chosen = reporting.choose(rows, sweep)
    assert chosen["id"] == "fast"  # fast-bad is faster but failed its gate
    assert "80.0 output tok/s" in chosen["why"][0] and chosen["why"][1].startswith("next: slow-small")
    bounded = _sweep("fastest", max_tpot_p99_ms=40, min_output_tokens_per_s=25)
    reporting.judge(rows, bounded)
    assert rows[1]["excluded"] == ["tpot_p99_ms 45.0 > max_tpot_p99_ms 40"]
    assert reporting.choose(rows, bounded)["id"] == "slow-small"  # equal speeds: the more accurate
    assert "TPOT p99 <= 40 ms, output >= 25 tok/s" in reporting.choose(rows, bounded)["why"][0]
    unmeasured = _row("unmeasured", 5, 10, 0.0)
    reporting.judge([unmeasured], bounded)
    assert unmeasured["excluded"] == ["no measured tpot_p99_ms for max_tpot_p99_ms",
                                      "no measured output_tokens_per_s for min_output_tokens_per_s"]


def test_bench_figures_are_the_bench_stage_s_point_at_the_workload():
    point = {"output_throughput": 41.5, "ttft_ms": {"p50": 80.0, "p99": 120.0}, "tpot_ms": {"p50": 20.0, "p99": 31.0},
             "goodput": {"requests_per_s": 1.5, "fraction": 0.75}, "errors": {"http_500": 2}}
    stages = {"compress.0.rtn": {"outputs": {}}, "bench": {"outputs": {"points": [point]}}}
    assert reporting.bench_figures(stages) == {
        "output_tokens_per_s": 41.5, "ttft_p50_ms": 80.0, "ttft_p99_ms": 120.0, "tpot_p50_ms": 20.0,
        "tpot_p99_ms": 31.0, "goodput_requests_per_s": 1.5, "errors": 2}
    assert reporting.bench_figures({"compress.0.rtn": {"outputs": {}}}) is None


def test_loss_is_oriented_so_that_larger_is_worse():
    acc = _row("a", 1, 1, -0.05, higher=True)  # accuracy fell by 0.05
    assert reporting.loss(acc, "prose") == (pytest.approx(0.05), [pytest.approx(0.04), pytest.approx(0.06)])
    ppl = _row("p", 1, 1, 0.05)  # perplexity rose by 5 %
    assert reporting.loss(ppl, "prose")[0] == pytest.approx(0.05)


def test_without_matplotlib_the_report_has_no_plots_and_says_why(tmp_path, monkeypatch):
    from llmopt.sweep.plots import write_plots

    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # `import matplotlib.figure` fails
    row = _row("a", 1, 1, 0.01)
    assert write_plots({"variants": [row], "recipe": {"name": "r"}}, tmp_path) == (
        [], "matplotlib is not installed: no plots (pip install 'llmopt[plots]')")
    monkeypatch.undo()
    assert write_plots({"variants": [row], "recipe": {"name": "r"}}, tmp_path) == (["accuracy_vs_size-prose.png"], None)
    assert write_plots({"variants": [_timed(row, 12.0)], "recipe": {"name": "r"}}, tmp_path) == (
        ["accuracy_vs_size-prose.png", "accuracy_vs_speed-prose.png"], None)


# --- planning ----------------------------------------------------------------------------------------------------

def test_an_impossible_variant_is_reported_with_the_planners_reason_and_skipped(four_layers, tmp_path, capsys):
    from llmopt.cli.main import main

    recipe = sweep_recipe(tmp_path, four_layers, '"compress[0].layers" = [1, 5]\n')
    the_plan = api.sweep_plan(recipe, output_dir=tmp_path / "sw")
    assert [v.id for v in the_plan.runnable] == ["layers1"]
    [impossible] = the_plan.impossible
    [problem] = impossible.problems
    assert problem.where == "sweep axis compress[0].layers=5"
    assert problem.message == "cannot drop 5 of 4 layers with 0 first and 0 last protected (4 can go)"
    assert main(["sweep", str(recipe), "--dry-run", "-f", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [v["possible"] for v in doc["variants"]] == [True, False] and "cannot drop 5" in doc["variants"][1]["reason"]
    assert main(["sweep", str(recipe), "--dry-run", "--strict", "-f", "json"]) == 2
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["type"] == "RecipeError" and "1 of 2 variants cannot run (--strict)" in error["what"]
    assert error["problems"][0]["where"] == "variant layers5"
    with pytest.raises(RecipeError, match="no variant of the sweep can run"):
        api.sweep_plan(recipe, axes=["compress[0].layers=5,6"])
    with pytest.raises(RecipeError, match="no variant of the sweep can run") as err:
        api.sweep_plan(recipe, axes=["compress[3].layers=1"])  # a key the recipe does not have
    assert "index 3 is out of range" in err.value.problems[0].message
    with pytest.raises(UsageError, match="varies the sweep itself"):
        api.sweep_plan(recipe, axes=["sweep.objective=smallest"])


def test_a_speed_objective_or_constraint_without_a_bench_stage_is_refused_at_plan_time(four_layers, tmp_path):
    recipe = sweep_recipe(tmp_path, four_layers, '"compress[0].layers" = [1, 2]\n')
    with pytest.raises(RecipeError, match=r"sweep.objective judges measured serving speed, and 2 variant\(s\) have "
                       r"no bench stage \(layers1, layers2\)") as err:
        api.sweep_plan(recipe, overrides=["sweep.objective=fastest"])
    assert err.value.where == "-s sweep.objective=fastest (command line)" and "[bench] enabled = true" in err.value.fix
    with pytest.raises(RecipeError, match=r"sweep.constraints.max_tpot_p99_ms judges"):
        api.sweep_plan(recipe, overrides=["sweep.constraints.max_tpot_p99_ms=50"])


# --- running -----------------------------------------------------------------------------------------------------

def test_a_benchmarked_sweep_reports_speed_and_picks_the_fastest(four_layers, tmp_path, monkeypatch):
    from test_bench_engine import put_fake_vllm
    from test_bench_stage import BENCH

    from llmopt.bench import engine

    put_fake_vllm(tmp_path, monkeypatch)
    bench = serving_tables(BENCH.format(requests=4))
    recipe = sweep_recipe(tmp_path, four_layers, '"compress[0].layers" = [1, 2]\n', extra=PRUNE + bench)
    try:
        result = api.sweep(recipe, overrides=["sweep.objective=fastest"], output_dir=tmp_path / "sw")
    finally:
        engine.stop_leftovers(api.sweep_plan(recipe).cache.root)
    doc = json.loads((tmp_path / "sw" / "report.json").read_text())
    speeds = {r["id"]: r["speed"] for r in doc["variants"]}
    assert all(s > 0 for s in speeds.values()) and doc["variants"][0]["bench"]["ttft_p99_ms"] > 0
    assert doc["chosen"]["id"] == max(speeds, key=speeds.get) == result.chosen["id"]
    assert doc["pareto_speed"] and set(doc["pareto_speed"]) <= set(speeds)
    assert {"accuracy_vs_size-prose.png", "accuracy_vs_speed-prose.png"} <= set(doc["plots"])
    report_md = (tmp_path / "sw" / "report.md").read_text()
    assert "| out tok/s |" in report_md and "Pareto front (measured output tok/s and prose)" in report_md


def test_a_sweep_shares_stages_reports_and_builds_the_chosen_variant(four_layers, tmp_path, capsys, monkeypatch):
    from llmopt.cli.main import main
    from llmopt.store.verify import verify_artifact

    recipe = sweep_recipe(tmp_path, four_layers, '"compress[0].layers" = [1, 2, 5]\n')
    folder = tmp_path / "sw"
    summary = tmp_path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result = api.sweep(recipe, output_dir=folder)
    assert summary.read_text().count("# llmopt sweep: tiny") == 1  # the sweep's report, not each variant's gates
    assert "## llmopt accuracy gates" not in summary.read_text()
    report = result.report
    rows = {r["id"]: r for r in report["variants"]}
    assert [r["status"] for r in rows.values()] == ["passed", "passed", "impossible"]
    assert "cannot drop 5 of 4 layers" in rows["layers5"]["reason"]
    reuse = {vid: {r["name"]: r["reuse"] for r in rows[vid]["records"]} for vid in ("layers1", "layers2")}
    assert reuse["layers1"] == dict.fromkeys(["source", "compress.0.prune_depth", "eval.prose.baseline",
                                              "eval.prose.candidate", "gate"], "ran")
    assert reuse["layers2"]["source"] == reuse["layers2"]["eval.prose.baseline"] == "shared"
    assert reuse["layers2"]["compress.0.prune_depth"] == "ran"
    assert report["sharing"] == {"stage_runs": 10, "unique_stages": 8, "ran": 8, "shared": 2, "cached": 0, "same": 0}
    assert rows["layers2"]["model_bytes"] < rows["layers1"]["model_bytes"]
    assert report["chosen"]["id"] == "layers2" and report["pareto"][0] == "layers2"
    assert report["schema_version"] == 1 and report["timing"]["overhead_pct"] > 0
    saved = json.loads((folder / "report.json").read_text())
    assert saved["chosen"] == report["chosen"] and saved["timing"] == report["timing"]
    markdown = (folder / "report.md").read_text()
    assert "**Chosen: layers2**" in markdown and "| layers5 | 5 | - | impossible |" in markdown
    assert (folder / "accuracy_vs_size-prose.png").read_bytes()[:4] == b"\x89PNG"
    assert verify_artifact(folder / "chosen")["ok"]
    assert json.loads((folder / "chosen" / "manifest.json").read_text())["stages"][1]["key"] == \
        json.loads((folder / "variants" / "layers2" / "manifest.json").read_text())["stages"][1]["key"]

    # the same sweep with a bound nothing meets: every variant from its artifact, nothing run, exit 3
    code = main(["sweep", str(recipe), "-o", str(folder), "-s", "sweep.constraints.max_model_mib=0.001", "-f", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 3 and doc["error"]["type"] == "GateFailed" and doc["chosen"] is None
    assert all(r["resumed"] for r in doc["variants"][:2]) and doc["sharing"]["ran"] == 0
    assert "max_model_mib 0.001" in doc["variants"][0]["excluded"][0]
    assert not (folder / "chosen").exists()  # the earlier choice is not this one's


def test_when_every_variant_fails_the_sweep_exits_with_their_code_after_its_report(tiny_model, tmp_path):
    from llmopt.sweep import VariantsFailed

    empty = tmp_path / "empty.txt"
    empty.write_text("")  # nothing to score: the eval stage fails (exit 1), after the plan accepted the file
    recipe = sweep_recipe(tmp_path, tiny_model, '"eval[0].max_windows" = [4, 8]\n', extra=f'data = "{empty}"\n')
    with pytest.raises(VariantsFailed, match="every variant failed; the first: .*nothing to score") as err:
        api.sweep(recipe, output_dir=tmp_path / "sw")
    assert err.value.exit_code == 1
    report = json.loads((tmp_path / "sw" / "report.json").read_text())
    assert [r["status"] for r in report["variants"]] == ["failed", "failed"] and report["chosen"] is None
    assert "nothing to score" in report["variants"][0]["reason"]


def test_a_sweep_folder_that_cannot_be_written_is_refused_before_any_variant_runs(tiny_model, tmp_path,
                                                                                   isolated_cache):
    """`llmopt sweep ... -o /proc/sw` ran every variant, then failed to write the report: an internal error."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    recipe = sweep_recipe(tmp_path, tiny_model, '"eval[0].max_windows" = [4, 8]\n')
    with pytest.raises(UsageError, match=f"cannot write the sweep folder, {blocker / 'sw'}"):
        api.sweep(recipe, output_dir=blocker / "sw")
    assert not (isolated_cache / "stages").exists() or not any((isolated_cache / "stages").iterdir())


def test_a_sweep_killed_mid_way_resumes_without_repeating_finished_variants(tiny_model, tmp_path, isolated_cache):
    recipe = sweep_recipe(tmp_path, tiny_model, '"eval[0].max_windows" = [4, 100]\n', extra="")
    folder = tmp_path / "sw"
    the_plan = api.sweep_plan(recipe, output_dir=folder)
    first, second = the_plan.variants
    slow_eval = second.plan.stage("eval.prose.baseline").key
    proc = subprocess.Popen([sys.executable, "-m", "llmopt", "sweep", str(recipe), "-o", str(folder), "-f", "quiet"],
                            env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    tmp_root = isolated_cache / "tmp"
    wait_for(lambda: tmp_root.is_dir() and any(p.name.startswith(slow_eval) for p in tmp_root.iterdir()),
             timeout=300, proc=proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (folder / "variants" / first.id / "manifest.json").is_file()  # the first variant finished
    assert not (folder / "variants" / second.id).exists() and not (folder / "report.json").exists()

    result = api.sweep(recipe, output_dir=folder)
    rows = {r["id"]: r for r in result.report["variants"]}
    assert rows[first.id]["resumed"] and {r["status"] for r in rows[first.id]["records"]} == {"cached"}
    assert not rows[second.id]["resumed"]
    statuses = {r["name"]: (r["status"], r["reuse"]) for r in rows[second.id]["records"]}
    assert statuses["source"] == ("cached", "cached")  # built before the kill
    assert statuses["eval.prose.baseline"] == ("ran", "ran")  # the stage the kill interrupted
    assert result.report["chosen"] is not None and (folder / "report.json").is_file()


@pytest.mark.slow  # starts a local Ray cluster: about a minute on two cores
def test_the_ray_executor_gives_the_table_of_the_local_one(four_layers, tmp_path):
    pytest.importorskip("ray")
    recipe = sweep_recipe(tmp_path, four_layers, '"compress[0].layers" = [1, 2]\n"eval[0].max_windows" = [4, 6]\n')
    local = api.sweep(recipe, output_dir=tmp_path / "local").report
    on_ray = api.sweep(recipe, cache_dir=tmp_path / "ray-cache", output_dir=tmp_path / "ray", executor="ray").report
    in_two = api.sweep(recipe, cache_dir=tmp_path / "jobs-cache", output_dir=tmp_path / "jobs", jobs=2).report
    assert reporting.table(in_two, timing=False) == reporting.table(local, timing=False)
    assert in_two["sharing"] == local["sharing"]
    assert on_ray["sharing"] == local["sharing"]  # a fresh cache each: the same work, shared alike
    assert on_ray["sharing"]["ran"] == on_ray["sharing"]["unique_stages"] == 13
    assert {r["pid"] for r in local["variants"]} == {os.getpid()}  # the default runs in this process
    assert os.getpid() not in {r["pid"] for r in on_ray["variants"]}  # Ray workers ran them
    assert reporting.table(on_ray, timing=False) == reporting.table(local, timing=False)
    assert on_ray["chosen"]["id"] == local["chosen"]["id"]
