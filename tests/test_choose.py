"""Several engines in ``[serve] backend``: each deployed and tuned, the engine the artifact is served with chosen
by measurement (``llmopt.tune.choose``).

The recipe tests check the list's rules (each engine once and known, a tune stage to measure them, each [serve]
key an option of a listed engine, a ``[serve.<engine>]`` table for one engine's own values) and the plan: a deploy
and a tune stage per engine, keyed as a recipe of that engine alone keys them, then the choose stage. The choice is
judged on tuning.json records the tune stage's own code writes. The runs serve SGLang through the simulator
(tests/sim_engine.py); vLLM is not installed here, so it is not measured and cannot win. No test asserts a timing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import load_json, run_cli, write_recipe
from test_tune import bench_point, nothing_left, put_sim

from llmopt import api
from llmopt.bench import engine
from llmopt.errors import RecipeError, StageFailed
from llmopt.recipe import load_recipe
from llmopt.recipe.schema import SLO, Workload
from llmopt.tune import choose, stage

TUNE = "enabled = true\nmax_trials = 1\nrepeats = 0\n"


@pytest.fixture(autouse=True)
def no_server_left(isolated_cache):
    yield
    engine.stop_leftovers(isolated_cache)


def engines_recipe(folder: Path, model: Path, backend: str = '["vllm", "sglang"]', serve: str = "",
                   tune: str = TUNE) -> Path:
    """The tiny model served on an H100 by ``backend`` (TOML), with ``serve`` (TOML lines, tables after them) at the
    end of [serve], then [bench] (not enabled) and [tune] with ``tune``'s lines."""
    folder.mkdir(parents=True, exist_ok=True)
    body = (f'schema_version = 1\nname = "tiny"\n\n[model]\nsource = "{model}"\n\n[target]\ngpu = "H100-SXM-80GB"\n\n'
            f"[serve]\nbackend = {backend}\nmax_model_len = 256\n"
            "workload = { input_len = 16, output_len = 4, concurrency = 2 }\nslo = { ttft_p99_ms = 60000 }\n"
            f"{serve}\n[bench]\nrequests = 6\nwarmup = 1\n\n[tune]\n{tune}")
    return write_recipe(folder, body)


def line_of(path: Path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if line.startswith(text))


# --- the recipe and the plan ------------------------------------------------------------------------------------

def test_several_engines_plan_a_deploy_and_a_tune_stage_each_then_the_choice(tmp_path, tiny_model):
    plan = api.plan(engines_recipe(tmp_path, tiny_model))
    assert not plan.errors, plan.errors
    assert [s.name for s in plan.stages] == ["source", "deploy.vllm", "deploy.sglang", "tune.vllm", "tune.sglang",
                                             "choose"]
    assert plan.stage("choose").inputs == {"vllm": "tune.vllm", "sglang": "tune.sglang"}
    assert plan.stage("choose").options.engines == ["vllm", "sglang"]
    assert plan.stage("choose").options.objective == "goodput"  # the recipe sets an SLO
    # each engine's stages are those a recipe of that engine alone plans, under the same keys: one cache
    for name in ("vllm", "sglang"):
        alone = api.plan(engines_recipe(tmp_path / name, tiny_model, backend=f'"{name}"'))
        assert [s.name for s in alone.stages] == ["source", f"deploy.{name}", "tune"]
        assert alone.stage(f"deploy.{name}").key == plan.stage(f"deploy.{name}").key
        assert alone.stage("tune").key == plan.stage(f"tune.{name}").key
    # a list of one engine is that engine
    one = api.plan(engines_recipe(tmp_path / "one", tiny_model, backend='["sglang"]'))
    assert [s.key for s in one.stages] == [s.key for s in alone.stages]
    assert one.recipe.digest == alone.recipe.digest


def test_the_gpu_benchmark_recipe_plans_both_engines_and_the_choice():
    plan = api.plan(Path(__file__).parents[1] / "benchmarks" / "choose-vllm-sglang.toml")
    assert not plan.errors, plan.errors
    assert [s.name for s in plan.stages][-5:] == ["deploy.vllm", "deploy.sglang", "tune.vllm", "tune.sglang", "choose"]


def test_an_engine_listed_twice_or_unknown_is_a_recipe_error_at_its_line(tmp_path, tiny_model):
    path = engines_recipe(tmp_path, tiny_model, backend='["vllm", "sglang", "vllm", "vlm"]')
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    found = {p.where: p for p in info.value.problems}
    line = line_of(path, "backend =")
    twice, unknown = found[f"{path}:{line}: serve.backend[2]"], found[f"{path}:{line}: serve.backend[3]"]
    assert "'vllm' is listed twice" in twice.message and twice.hint == "list each engine once"
    assert "did you mean 'vllm'?" in unknown.message and "ort, sglang, trtllm, vllm" in unknown.hint
    res = run_cli("plan", str(path))
    assert res.returncode == 2 and f"{path}:{line}: serve.backend[2]" in res.stderr
    with pytest.raises(RecipeError) as info:
        load_recipe(engines_recipe(tmp_path, tiny_model, backend="[]"))
    assert "lists no engine" in info.value.problems[0].message


def test_several_engines_without_tune_is_a_plan_error(tmp_path, tiny_model):
    path = engines_recipe(tmp_path, tiny_model, tune="enabled = false\n")
    errors = api.plan(path).errors
    assert len(errors) == 1 and errors[0].where == f"{path}:{line_of(path, 'backend =')}: serve.backend"
    assert "lists 2 engines, but [tune] is not enabled" in errors[0].message
    assert "[tune] enabled = true" in errors[0].hint
    res = run_cli("plan", str(path))
    assert res.returncode == 2 and "[tune] is not enabled" in res.stderr


def test_serve_keys_go_to_the_engines_that_have_them_and_an_engine_table_to_that_engine(tmp_path, tiny_model):
    serve = ("enforce_eager = true\ngpu_memory_utilization = 0.85\n\n"
             "[serve.sglang]\ngpu_memory_utilization = 0.8\n")
    plan = api.plan(engines_recipe(tmp_path, tiny_model, serve=serve))
    assert not plan.errors, plan.errors
    vllm, sglang = plan.stage("deploy.vllm").options, plan.stage("deploy.sglang").options
    assert vllm.enforce_eager is True and vllm.gpu_memory_utilization == 0.85
    assert sglang.gpu_memory_utilization == 0.8 and "enforce_eager" not in type(sglang).model_fields
    # the deploy stage of vLLM is keyed as a vLLM-only recipe with the keys vLLM takes is
    alone = api.plan(engines_recipe(tmp_path / "alone", tiny_model, backend='"vllm"', serve=serve.split("\n\n")[0]))
    assert alone.stage("deploy.vllm").key == plan.stage("deploy.vllm").key


def test_a_serve_key_no_listed_engine_takes_is_a_recipe_error(tmp_path, tiny_model):
    serve = ('provider = "cpu"\nkv_cache_dtype = "fp8"\n\n[serve.sglang]\nenforce_eager = true\n\n'
             "[serve.trtllm]\ncuda_graphs = false\n")
    path = engines_recipe(tmp_path, tiny_model, serve=serve)
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    found = {p.where.split(": ", 1)[1]: p for p in info.value.problems}
    assert set(found) == {"serve.provider", "serve.kv_cache_dtype", "serve.sglang.enforce_eager", "serve.trtllm"}
    assert found["serve.provider"].message == "unknown key 'provider'"
    assert "gpu_memory_utilization" in found["serve.provider"].hint
    assert found["serve.kv_cache_dtype"].message.startswith("sglang: ")  # vLLM takes fp8, SGLang does not
    assert "[serve.sglang]" in found["serve.kv_cache_dtype"].hint
    assert found["serve.sglang.enforce_eager"].message == "unknown key 'enforce_eager'"
    assert "trtllm, which backend does not list" in found["serve.trtllm"].message
    assert found["serve.trtllm"].where.startswith(f"{path}:{line_of(path, '[serve.trtllm]')}:")


def test_the_tune_space_goes_to_the_engines_it_names(tmp_path, tiny_model):
    plan = api.plan(engines_recipe(tmp_path, tiny_model, tune=TUNE + "space = { max-num-seqs = [8, 16] }\n"))
    assert not plan.errors, plan.errors
    assert plan.stage("tune.vllm").options.space == {"max-num-seqs": [8, 16]}
    assert plan.stage("tune.sglang").options.space == {}
    errors = api.plan(engines_recipe(tmp_path, tiny_model, tune=TUNE + "space = { max_batch_size = [8] }\n")).errors
    assert len(errors) == 1 and "max_batch_size, which neither vllm nor sglang is tuned on" in errors[0].message


# --- the choice -------------------------------------------------------------------------------------------------

LAUNCH = {"vllm": "#!/bin/sh\nexec vllm serve {model} --config config.yaml\n",
          "sglang": "#!/bin/sh\nexec python3 -m sglang.launch_server --model-path {model} --mem-fraction-static 0.8\n"}


def tuning(tmp_path: Path, monkeypatch, name: str, score: float | None = None, starts: bool = True) -> dict:
    """tuning.json as the tune stage writes it for engine ``name``: searched with a made-up measurement of goodput
    ``score`` (a server that never ``starts``: every trial fails), or, with no ``score``, not installed here."""
    deploy, out = tmp_path / name / "deploy", tmp_path / name / "out"
    deploy.mkdir(parents=True)
    out.mkdir()
    (deploy / "launch.sh").write_text(LAUNCH[name])
    if name == "vllm":
        (deploy / "config.yaml").write_text("max-num-seqs: 4\n")
    options = stage.TuneStageOptions(engine=name, workload=Workload(input_len=16, output_len=4, concurrency=2),
                                     slo=SLO(ttft_p99_ms=500), requests=4, warmup=1, max_trials=2, repeats=0,
                                     space={"mem-fraction-static": [0.8]} if name == "sglang" else {})

    def measure(values: dict, folder: Path) -> dict:
        if not starts:
            raise StageFailed(f"{name} exited with code 1 before answering /health")
        return bench_point(score)

    monkeypatch.setattr(stage, "engine_available", lambda engine_name: score is not None)
    monkeypatch.setattr(stage, "measurer", lambda *args, **kwargs: measure)
    stage.tune(options, tmp_path, deploy, {}, tmp_path, tmp_path / name / "store", out, lambda message: None)
    return json.loads((out / "tuning.json").read_text())


def test_the_measured_engine_wins_over_one_not_installed(tmp_path, monkeypatch):
    found = choose.choice({"vllm": tuning(tmp_path, monkeypatch, "vllm"),
                           "sglang": tuning(tmp_path, monkeypatch, "sglang", 3.0)}, "goodput")
    assert found["engine"] == "sglang" and found["measured"] is True
    vllm, sglang = found["engines"]
    assert vllm["engine"] == "vllm" and vllm["measured"] is False and "not installed" in vllm["reason"]
    assert sglang["measured"] is True and sglang["score"] == 3.0
    assert sglang["figures"]["goodput_requests_per_s"] == 3.0 and sglang["figures"]["output_throughput"] == 3.0
    assert "vllm was not measured" in found["reason"]


def test_the_higher_goodput_wins_and_a_draw_goes_to_the_first_listed(tmp_path, monkeypatch):
    first, second = tuning(tmp_path / "a", monkeypatch, "vllm", 2.0), tuning(tmp_path / "a", monkeypatch, "sglang", 3.0)
    assert choose.choice({"vllm": first, "sglang": second}, "goodput")["engine"] == "sglang"
    assert choose.choice({"sglang": second, "vllm": first}, "goodput")["engine"] == "sglang"
    near = tuning(tmp_path / "b", monkeypatch, "sglang", 2.08)  # within 5%: measurement noise
    found = choose.choice({"vllm": first, "sglang": near}, "goodput")
    assert found["engine"] == "vllm" and "within 5%" in found["reason"]


def test_an_engine_whose_server_never_started_cannot_win(tmp_path, monkeypatch):
    broken = tuning(tmp_path, monkeypatch, "vllm", 9.0, starts=False)
    assert broken["tuned"] is False and "no trial's server started" in broken["reason"]
    found = choose.choice({"vllm": broken, "sglang": tuning(tmp_path, monkeypatch, "sglang", 1.0)}, "goodput")
    assert found["engine"] == "sglang" and found["engines"][0]["reason"] == broken["reason"]


def test_with_no_engine_measured_the_first_listed_stays(tmp_path, monkeypatch):
    found = choose.choice({"vllm": tuning(tmp_path / "a", monkeypatch, "vllm"),
                           "sglang": tuning(tmp_path / "a", monkeypatch, "sglang")}, "goodput")
    assert found["engine"] == "vllm" and found["measured"] is False
    assert "no engine was measured" in found["reason"] and "vllm, the first listed" in found["reason"]
    # measured, but none met the SLO: goodput cannot rank them, the first measured stays
    zero = choose.choice({"vllm": tuning(tmp_path / "b", monkeypatch, "vllm"),
                          "sglang": tuning(tmp_path / "b", monkeypatch, "sglang", 0.0)}, "goodput")
    assert zero["engine"] == "sglang" and "no engine met the SLO" in zero["reason"]


# --- runs against the simulated engine --------------------------------------------------------------------------

def test_the_artifact_is_served_by_the_measured_engine(tmp_path, tiny_model, monkeypatch, isolated_cache):
    """vLLM listed first but not installed; SGLang simulated: the artifact carries both launch configs and is served
    by SGLang; vLLM's line says it was not measured. llmopt tune and bench of the artifact act on SGLang's."""
    assert not engine.engine_installed("vllm")
    children = put_sim(tmp_path, monkeypatch, "sglang")
    art = tmp_path / "art"
    res = run_cli("run", str(engines_recipe(tmp_path, tiny_model)), "-o", str(art), "--format", "json")
    assert res.returncode == 0, res.stderr
    assert "cannot start vllm on this machine" in res.stderr
    manifest = json.loads((art / "manifest.json").read_text())
    assert manifest["deploy"]["engine"] == "sglang" and manifest["choice"]["engine"] == "sglang"
    lines = {e["engine"]: e for e in manifest["choice"]["engines"]}
    assert lines["vllm"]["measured"] is False and "not installed" in lines["vllm"]["reason"]
    assert lines["sglang"]["measured"] is True and lines["sglang"]["simulated"] is True
    assert lines["sglang"]["figures"]["output_throughput"] > 0
    assert "# Not tuned by llmopt: vllm is not installed" in (art / "deploy" / "vllm" / "launch.sh").read_text()
    assert "simulated" in (art / "deploy" / "sglang" / "launch.sh").read_text().splitlines()[1]
    report = json.loads((art / "reports" / "report.json").read_text())
    assert report["choice"]["engine"] == "sglang" and report["tune"]["engine"] == "sglang"
    assert report["tune"]["files"]["json"] == "tune/sglang/tuning.json"
    assert report["choice"]["engines"][0]["files"]["json"] == "tune/vllm/tuning.json"
    assert all((art / "reports" / e["files"]["json"]).is_file() for e in report["choice"]["engines"])
    summary = (art / "reports" / "report.md").read_text()
    assert "## Engine choice: sglang" in summary and "| vllm | not measured: vllm is not installed" in summary
    assert "deploy/sglang" in (art / "README.md").read_text()
    # what starts the artifact's server: SGLang's launch config
    assert engine.plan_launch(art, "auto", 8000).engine == "sglang"
    out = tmp_path / "tuned"
    res = run_cli("tune", str(art), "--max-trials", "1", "--repeats", "0", "-o", str(out), "--format", "json")
    assert res.returncode == 0, res.stderr
    assert load_json(res.stdout)["engine"] == "sglang" and (out / "deploy" / "launch.sh").is_file()
    assert nothing_left(children, isolated_cache)


def test_of_two_engines_measured_the_faster_serves_the_artifact(tmp_path, tiny_model, monkeypatch, isolated_cache):
    """vLLM and SGLang both simulated, vLLM's memory fraction two steps from the simulator's best (a quarter of the
    speed): SGLang is chosen by measurement, though vLLM is listed first; both lines carry figures."""
    put_sim(tmp_path, monkeypatch, "vllm")
    children = put_sim(tmp_path, monkeypatch, "sglang", best={"gpu-memory-utilization": 0.84})
    art = tmp_path / "art"
    recipe = engines_recipe(tmp_path, tiny_model, serve="\n[serve.vllm]\ngpu_memory_utilization = 0.9\n")
    result = api.run(recipe, output_dir=art)
    chosen = result.report["choice"]
    assert chosen["engine"] == "sglang" and "sglang: goodput" in chosen["reason"] and "against vllm's" in chosen["reason"]
    vllm, sglang = chosen["engines"]
    assert vllm["measured"] and sglang["measured"] and sglang["score"] > vllm["score"] * 2
    assert vllm["figures"]["goodput_requests_per_s"] and vllm["values"]["gpu-memory-utilization"] == 0.9
    assert json.loads((art / "manifest.json").read_text())["deploy"]["engine"] == "sglang"
    assert "tuned by llmopt" in (art / "deploy" / "vllm" / "launch.sh").read_text().lower()
    assert nothing_left(children, isolated_cache)
