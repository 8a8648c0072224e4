"""The planner: stages, cache keys, checks from config facts only, estimates."""

from __future__ import annotations

import json

import pytest

from llmopt import api
from llmopt.catalog.gpus import CATALOG, find_gpu, get_gpu
from llmopt.model import memory
from llmopt.errors import RecipeError, UsageError
from llmopt.model.estimates import float_weight_bytes
from llmopt.model.modelinfo import from_config
from llmopt.recipe.schema import Workload

from conftest import tiny_recipe, write_recipe

LLAMA_8B = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
    "tie_word_embeddings": False, "max_position_embeddings": 131072, "torch_dtype": "bfloat16",
}


def test_llama_8b_facts_and_estimates():
    info = from_config(LLAMA_8B)
    assert info.total_params == 8_030_261_248  # Llama-3.1-8B's published parameter count
    assert memory.kv_bytes_per_token_per_gpu(info, 2) == 2 * 32 * 8 * 128 * 2 == 131072
    assert float_weight_bytes(info, "bfloat16") == 2 * info.total_params


def test_plan_reads_config_only(tmp_path):
    folder = tmp_path / "config-only"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA_8B))
    (folder / "model.safetensors").write_bytes(b"not really weights")  # never read by the planner
    recipe = write_recipe(tmp_path, f'schema_version = 1\nname = "big"\n[model]\nsource = "{folder}"\n'
                                    '[target]\ngpu = "H100"\n')
    plan = api.plan(recipe)
    assert plan.model.hidden_size == 4096
    assert plan.estimates["parameters"] == 8_030_261_248
    kv = plan.estimates["kv_cache"]
    assert kv["kv_bytes_per_token"] == 131072 and kv["fits"]
    # the plan's KV budget is the serving memory model's, for the weights the size model estimates
    weights = plan.estimates["weight_bytes_after"]
    assert weights == float_weight_bytes(plan.model, "bfloat16") + (2 + 32 * 9 + 1) * 104  # + safetensors header
    expected = memory.plan_memory(plan.model, get_gpu("H100"), 1, 4096, Workload(), weight_bytes=weights)
    assert kv["kv_tokens"] == expected.kv_tokens and kv["full_length_sequences"] == expected.kv_tokens // 4096


def test_cache_keys_are_stable_and_track_inputs(tiny_model, tmp_path):
    recipe = write_recipe(tmp_path, tiny_recipe(tiny_model))
    a = api.plan(recipe)
    b = api.plan(recipe)
    assert [s.key for s in a.stages] == [s.key for s in b.stages]
    c = api.plan(recipe, ["eval[0].window=32"])
    assert c.stage("source").key == a.stage("source").key
    assert c.stage("eval.prose.baseline").key != a.stage("eval.prose.baseline").key
    d = api.plan(recipe, ["model.dtype=float32"])
    assert d.stage("source").key != a.stage("source").key
    assert d.stage("eval.prose.baseline").key != a.stage("eval.prose.baseline").key


def test_unknown_gpu_is_a_recipe_error_with_hint(tiny_model, tmp_path):
    recipe = write_recipe(tmp_path, tiny_recipe(tiny_model) + '\n[target]\ngpu = "H10"\n')
    with pytest.raises(RecipeError) as info:
        api.plan(recipe)
    (problem,) = info.value.problems
    assert "unknown GPU 'H10'" in problem.message and "did you mean" in problem.hint
    assert problem.where == f"{recipe}:15: target.gpu"


def test_a_plan_check_on_an_overridden_key_names_the_override(tmp_path):
    folder = tmp_path / "config-only"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA_8B))
    (folder / "model.safetensors").write_bytes(b"not really weights")
    recipe = write_recipe(tmp_path, f'schema_version = 1\nname = "q"\n[model]\nsource = "{folder}"\n'
                                    '[[compress]]\nmethod = "gptq"\ngroup_size = 128\n')
    assert not api.plan(recipe).errors
    errors = api.plan(recipe, ["compress[0].group_size=100"]).errors
    (problem,) = [p for p in errors if "group_size 100" in p.message]
    assert problem.where == "-s compress[0].group_size=100 (command line)"


def test_missing_model_folder_is_a_plan_error(tmp_path):
    recipe = write_recipe(tmp_path, f'schema_version = 1\nname = "x"\n[model]\nsource = "{tmp_path}/nope"\n')
    plan = api.plan(recipe)
    assert "model folder not found" in plan.errors[0].message


def test_pickle_and_remote_code_are_refused_by_default(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(dict(LLAMA_8B, auto_map={"AutoModel": "x.Y"})))
    (folder / "pytorch_model.bin").write_bytes(b"")
    recipe = write_recipe(tmp_path, f'schema_version = 1\nname = "x"\n[model]\nsource = "{folder}"\n')
    messages = " ".join(p.message for p in api.plan(recipe).errors)
    assert "trust_remote_code" in messages and "pickled weights" in messages
    allowed = api.plan(recipe, ["model.trust_remote_code=true", "model.allow_pickle=true"])
    assert not allowed.errors


def test_gpu_catalogue():
    names = {g.name for g in CATALOG}
    assert {"A10G", "L4", "L40S", "A100-40GB", "A100-80GB", "H100-SXM-80GB", "H100-PCIe-80GB", "H200", "B200", "RTX-4090"} <= names
    assert find_gpu("h100").name == "H100-SXM-80GB"
    assert get_gpu("B200").cc == (10, 0)
    with pytest.raises(UsageError):
        get_gpu("TPU")


def test_every_shipped_recipe_validates_and_plans():
    recipes = api.shipped_recipes()
    assert recipes
    for item in recipes:
        plan = api.plan(item["path"])
        assert not plan.errors, (item["name"], [str(p) for p in plan.errors])
        assert item["purpose"], f"{item['name']} needs a purpose comment on its first line"
        assert item["purpose"].endswith("."), f"{item['name']}: `llmopt ls recipes` shows the first line, a whole sentence"


def test_strict_makes_every_warning_an_error(tiny_model, tmp_path):
    from llmopt import api
    from llmopt.cli.main import main

    recipe = write_recipe(tmp_path, tiny_recipe(tiny_model, 'runtime = "transformers"\nendpoint = "http://127.0.0.1:1/v1"\n'))
    warned = api.plan(recipe)
    assert not warned.errors and any("the URL is ignored" in p.message for p in warned.problems)
    strict = api.plan(recipe, strict=True)
    assert [p.message for p in strict.errors] == [p.message for p in warned.problems]
    assert main(["plan", str(recipe), "-f", "quiet"]) == 0
    assert main(["plan", str(recipe), "--strict", "-f", "quiet"]) == 2
