"""[[draft]]: a draft model made from the source for speculative decoding, its acceptance measured, carried by the
artifact and named by the launch configs."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest
import yaml

from conftest import calibrated_head, make_tiny_llama, run_cli, write_recipe
from llmopt import api
from llmopt.bench.acceptance import figures, walk
from llmopt.errors import RecipeError


def test_a_walk_accepts_drafts_up_to_the_first_miss_and_then_takes_the_target_s_token():
    # answer tokens 0..9; the draft guesses 0, 1, 2 and 5, 6, 7, 8 (not 3, 4 or 9); 3 drafts a step
    matches = [True, True, True, False, False, True, True, True, True, False]
    out = walk(matches, 3)
    # step 1: accepts 0, 1, 2 (3 of 3) and the target's own 3; step 2 at 4: misses, takes 4;
    # step 3 at 5: accepts 5, 6, 7, takes 8; step 4 at 9: misses, takes 9
    assert out == {"steps": 4, "drafted": 12, "accepted": 6, "per_position": [2, 2, 2]}
    total = figures([out, walk([True] * 8, 3)], 3)
    # the all-guessed answer of 8: steps at 0 and 4 accept 3 each, the step at 8 ends it... 0-2 +3, 4-6 +7
    assert walk([True] * 8, 3) == {"steps": 2, "drafted": 6, "accepted": 6, "per_position": [2, 2, 2]}
    assert total["acceptance_rate"] == round(12 / 18, 4)
    assert total["mean_acceptance_length"] == round(1 + 12 / 6, 3)
    assert total["per_position"] == [round(4 / 6, 4)] * 3
    assert walk([False] * 5, 4) == {"steps": 5, "drafted": 20, "accepted": 0, "per_position": [0, 0, 0, 0]}


@pytest.fixture(scope="module")
def four_layer_model(tmp_path_factory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("draft") / "four", layers=4)


def draft_recipe(model: Path, serve: str, draft: str = "") -> str:
    return calibrated_head("tiny-draft", model) + f"""\
[target]
gpu = "H100-SXM-80GB"

[serve]
{serve}
max_model_len = 512
workload = {{ input_len = 64, output_len = 32, concurrency = 1 }}
{draft}"""


DRAFT = """
[serve.speculative]
method = "draft_model"
num_tokens = 3

[[draft]]
method = "prune_depth"
layers = 2

[[draft]]
method = "distill"
steps = 4
batch_size = 2
seq_len = 64
"""


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    monkeypatch.setenv("LLMOPT_CPU_THREADS", "1")


def test_the_draft_is_made_measured_carried_and_named_by_vllm_s_launch(four_layer_model, tmp_path):
    path = write_recipe(tmp_path, draft_recipe(four_layer_model, 'backend = "vllm"', DRAFT))
    plan = api.plan(path, output_dir=tmp_path / "art")
    names = [s.name for s in plan.stages]
    assert names[:4] == ["source", "draft.0.prune_depth", "draft.1.distill", "draft.acceptance"]
    assert plan.stage("draft.1.distill").inputs == {"model": "draft.0.prune_depth", "teacher": "source"}
    assert plan.stage("draft.acceptance").inputs == {"draft": "draft.1.distill", "target": "source"}
    assert plan.stage("deploy.vllm").inputs == {"model": "source", "draft": "draft.1.distill"}
    assert plan.final_model_stage.name == "source"  # the draft is not the artifact's model
    assert plan.estimates["draft"]["layers"] == 2
    assert 0 < plan.estimates["draft"]["parameters"] < plan.estimates["parameters"]
    api.run(path, output_dir=tmp_path / "art")
    art = tmp_path / "art"
    assert json.loads((art / "draft" / "config.json").read_text())["num_hidden_layers"] == 2
    assert json.loads((art / "model" / "config.json").read_text())["num_hidden_layers"] == 4
    manifest = json.loads((art / "manifest.json").read_text())
    drafted = manifest["draft"]
    assert drafted["prompts"] == 8 and drafted["num_tokens"] == 3 and drafted["dataset"] == "builtin:continue"
    assert 0 <= drafted["acceptance_rate"] <= 1
    assert drafted["mean_acceptance_length"] == pytest.approx(1 + 3 * drafted["acceptance_rate"], abs=2e-3)
    assert drafted["draft_parameters"] < drafted["target_parameters"]
    assert any(name.startswith("draft/") for name in manifest["files"])
    card = (art / "README.md").read_text()
    assert f"acceptance rate {drafted['acceptance_rate']:.1%}" in card and "prune_depth, distill" in card
    config = (art / "deploy" / "vllm" / "config.yaml").read_text()
    assert "speculative-config" not in config  # its folder is known where the command runs
    launch = (art / "deploy" / "vllm" / "launch.sh").read_text()
    line = next(line for line in launch.splitlines() if line.startswith("exec "))
    argv = shlex.split(line.replace('"$@"', ""))
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {"method": "draft_model", "num_speculative_tokens": 3, "model": "./draft"}
    compose = (art / "deploy" / "vllm" / "docker-compose.yaml").read_text()
    assert '/draft' in compose and "{draft}" not in compose
    assert "{draft}" not in (art / "deploy" / "vllm" / "kubernetes.yaml").read_text()


def test_the_tune_stage_searches_num_tokens_of_the_artifact_s_own_draft(four_layer_model, tmp_path, monkeypatch,
                                                                        isolated_cache):
    """vLLM's speculative config of a draft the artifact carries is on the command line: the bench and tune stages
    start the engine with the draft beside the model (the simulated engine exits when it is not a folder), the
    search sets num_tokens there, and off removes it from launch.sh and the container manifests."""
    from test_tune import nothing_left, put_sim

    from llmopt.bench import engine
    from llmopt.tune import spaces

    children = put_sim(tmp_path, monkeypatch, ttft_ms=5, itl_ms=20)
    tuned = DRAFT + ("\n[bench]\nenabled = true\nrequests = 4\nwarmup = 1\n\n"
                     "[tune]\nenabled = true\nmax_trials = 3\nrepeats = 0\nlossless_prompts = 4\n")
    path = write_recipe(tmp_path, draft_recipe(four_layer_model, 'backend = "vllm"\nslo = { ttft_p99_ms = 60000 }',
                                               tuned))
    art = tmp_path / "art"
    try:
        plan = api.plan(path, output_dir=art)
        assert plan.stage("bench").inputs["draft"] == plan.stage("tune").inputs["draft"] == "draft.1.distill"
        result = api.run(path, output_dir=art)
        assert result.report["bench"]["points"][0]["requests"]["failed"] == 0  # started with its draft
        tuning = json.loads((art / "reports" / "tune" / "tuning.json").read_text())
        assert tuning["space"][spaces.SPECULATIVE] == [3, 0, 2, 4]
        spec = tuning["speculation"]
        assert spec["kept"] is True and spec["with"]["acceptance_rate"] == pytest.approx(0.75, abs=0.01)
        assert spec["lossless"]["passed"]
        kept = tuning["winner"][spaces.SPECULATIVE]
        deploy = art / "deploy" / "vllm"
        assert spaces.command_spec(deploy) == {"method": "draft_model", "num_speculative_tokens": kept,
                                               "model": "./draft"}
        assert "speculative-config" not in (deploy / "config.yaml").read_text()
        for name in ("docker-compose.yaml", "kubernetes.yaml"):
            assert f'"num_speculative_tokens": {kept}, "model": "/' in (deploy / name).read_text()
        # an artifact's own tuning (llmopt tune ARTIFACT) reads its draft in place
        res = run_cli("tune", str(art), "--max-trials", "2", "--repeats", "0", "-o", str(tmp_path / "again"))
        assert res.returncode == 0, res.stderr
        again = json.loads((tmp_path / "again" / "tuning.json").read_text())
        assert all(t["verdict"] != "failed" for t in again["trials"])
    finally:
        engine.stop_leftovers(isolated_cache)
    assert nothing_left(children, isolated_cache)
    off = tmp_path / "off"
    shutil.copytree(deploy, off)
    assert spaces.read(off, next(p for p in spaces.space("vllm") if p.name == spaces.SPECULATIVE)) == kept
    spaces.apply(off, "vllm", {spaces.SPECULATIVE: 0})
    assert spaces.command_spec(off) is None
    for name in ("launch.sh", "docker-compose.yaml", "kubernetes.yaml"):
        text = (off / name).read_text()
        assert "speculative-config" not in text and "\n\n    ports" not in text
    assert yaml.safe_load((off / "kubernetes.yaml").read_text().split("---")[0]) is not None


def test_sglang_s_launch_names_the_artifact_s_draft(four_layer_model, tmp_path):
    from llmopt.backends.serve.sglang import argv
    from llmopt.deploy import files, speculative

    path = write_recipe(tmp_path, draft_recipe(four_layer_model, 'backend = "sglang"', DRAFT))
    plan = api.plan(path, output_dir=tmp_path / "art")
    assert not plan.errors, plan.errors
    args = speculative.sglang_args(speculative.spec_of(plan.recipe.recipe))
    assert args["speculative-algorithm"] == "STANDALONE" and args["speculative-num-steps"] == 3
    command = files.Launch("sglang", "tiny-draft", None, ["python3", "-m", "sglang.launch_server"],
                           ["--model-path", "{model}", *argv(args)], 30000, 1).argv("/models/tiny")
    assert command[command.index("--speculative-draft-model-path") + 1] == "/models/tiny/draft"


@pytest.mark.parametrize("serve, draft, message", [
    ('backend = "vllm"', DRAFT.replace('method = "draft_model"', 'method = "ngram"'),
     "[[draft]] makes a draft model, but the recipe serves none (method = 'ngram')"),
    ('backend = "vllm"', DRAFT.replace("num_tokens = 3", 'num_tokens = 3\nmodel = "/abs/other"'),
     "[[draft]] makes a draft model, but the recipe serves none (model = '/abs/other')"),
    ('backend = "vllm"', DRAFT.split("[[draft]]", 1)[0],
     "speculative method 'draft_model' needs a draft model"),
    ('backend = "trtllm"', DRAFT, "TensorRT-LLM's launch config cannot name the draft [[draft]] makes yet"),
])
def test_a_draft_nothing_serves_or_a_draft_that_cannot_be_named_is_a_plan_error(four_layer_model, tmp_path, serve,
                                                                                 draft, message):
    path = write_recipe(tmp_path, draft_recipe(four_layer_model, serve, draft))
    plan = api.plan(path, output_dir=tmp_path / "art")
    found = [p for p in plan.errors if message in p.message]
    assert found, [p.message for p in plan.problems]
    if "needs a draft model" in message:
        assert "[[draft]]" in found[0].hint


def test_a_draft_that_is_not_smaller_or_that_nothing_serves_is_a_plan_error(four_layer_model, tmp_path):
    quantized = DRAFT.split("[[draft]]", 1)[0] + '[[draft]]\nmethod = "fp8"\n'
    path = write_recipe(tmp_path, draft_recipe(four_layer_model, 'backend = "vllm"', quantized))
    assert any("is not smaller than the served model" in p.message for p in api.plan(path).errors)
    unserved = draft_recipe(four_layer_model, 'backend = "vllm"', DRAFT).split("[target]", 1)[0] + \
        "[[draft]]" + DRAFT.split("[[draft]]", 1)[1]
    path = write_recipe(tmp_path, unserved, "unserved.toml")
    assert any("has no [serve] to speculate in" in p.message for p in api.plan(path).errors)


def test_an_unknown_draft_method_is_a_recipe_error_naming_its_key(four_layer_model, tmp_path):
    path = write_recipe(tmp_path, draft_recipe(four_layer_model, 'backend = "vllm"',
                                               DRAFT.replace('"prune_depth"', '"prune_dept"')))
    with pytest.raises(RecipeError) as err:
        api.plan(path)
    assert any("draft[0].method" in p.where and "prune_depth" in p.message for p in err.value.problems)
