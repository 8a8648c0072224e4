"""vLLM's own parser (EngineArgs + create_engine_config, on CPU) accepts the configs llmopt writes
for the tiny model and the demo model, and refuses a wrong one.

Slow: the session fixture ``vllm_python`` (tests/conftest.py) builds .test-envs/vllm with `make vllm-env`
when it is missing (the vLLM 0.33.0 wheel without its CUDA dependencies, plus the small packages its
config code imports); the tests are skipped only when that environment cannot be built.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmopt import api

from llmopt.deploy import validate_engine
from llmopt.deploy import flags
from llmopt.errors import UsageError

from conftest import link_tree, make_tiny_llama, tiny_recipe, write_recipe
from test_deploy_configs import render

pytestmark = pytest.mark.slow
VALIDATED = "vllm 0.33.0 EngineArgs"


@pytest.fixture(scope="module")
def demo_artifact(request, tmp_path_factory, vllm_python) -> Path:
    """The demo model converted from its GGUF file (the session's demo_seed holds the conversion), with a vLLM
    config validated by vLLM itself."""
    folder = tmp_path_factory.mktemp("demo")
    link_tree(request.getfixturevalue("demo_seed"), folder / "cache")
    recipe = write_recipe(folder, 'schema_version = 1\nname = "demo-vllm"\n[model]\nsource = "builtin:smollm2-135m"\n'
                                  '[target]\ngpu = "H100"\ncount = 4\n[serve]\nbackend = "vllm"\nmax_model_len = 8192\n'
                                  f'engine_python = "{vllm_python}"\n')
    api.run(recipe, cache_dir=folder / "cache", output_dir=folder / "art")
    return folder / "art"


def test_tiny_model_config_passes_vllms_parser(tiny_model, tmp_path, vllm_python, monkeypatch):
    monkeypatch.setenv(validate_engine.ENV_VAR, vllm_python)
    recipe = write_recipe(tmp_path, tiny_recipe(tiny_model, windows=1) + '[target]\ngpu = "H100"\n'
                          '[serve]\nbackend = "vllm"\nmax_model_len = 512\nkv_cache_dtype = "fp8"\n')
    api.run(recipe, output_dir=tmp_path / "art")
    deploy = json.loads((tmp_path / "art" / "manifest.json").read_text())["deploy"]
    assert deploy["validated_by"] == VALIDATED
    assert deploy["args"]["kv-cache-dtype"] == "fp8" and deploy["memory"]["kv_dtype_bytes"] == 1


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_speculative_configs_pass_vllms_parser(method, tiny_model, tmp_path, vllm_python, monkeypatch):
    """vLLM's own SpeculativeConfig (built by create_engine_config) accepts the speculative-config llmopt writes:
    prompt lookup, and a draft model (a smaller random Llama of the tiny model's tokenizer) from its folder."""
    monkeypatch.setenv(validate_engine.ENV_VAR, vllm_python)
    draft = make_tiny_llama(tmp_path / "draft", hidden=32, layers=1, intermediate=64) if method == "draft_model" \
        else None
    spec = f'[serve.speculative]\nmethod = "{method}"\nnum_tokens = 4\n' + (f'model = "{draft}"\n' if draft else "")
    recipe = write_recipe(tmp_path, tiny_recipe(tiny_model, windows=1) + '[target]\ngpu = "H100"\n'
                          '[serve]\nbackend = "vllm"\nmax_model_len = 512\n' + spec)
    api.run(recipe, output_dir=tmp_path / "art")
    deploy = json.loads((tmp_path / "art" / "manifest.json").read_text())["deploy"]
    assert deploy["validated_by"] == VALIDATED
    assert deploy["args"]["speculative-config"]["method"] == method
    assert ("draft" in deploy["memory"]) == (method == "draft_model")


def test_demo_model_config_passes_vllms_parser(demo_artifact, vllm_python):
    deploy = json.loads((demo_artifact / "manifest.json").read_text())["deploy"]
    assert deploy["validated_by"] == VALIDATED
    assert deploy["args"]["tensor-parallel-size"] == 1  # 135M parameters fit one H100
    assert deploy["memory"]["weight_source"] == "safetensors"
    again = validate_engine.validate_vllm(demo_artifact / "deploy" / "vllm" / "config.yaml", demo_artifact / "model",
                                          vllm_python)
    assert again["ok"] and again["validated_by"] == VALIDATED
    assert again["engine"]["max_model_len"] == 8192 and again["engine"]["tensor_parallel_size"] == 1


def test_vllm_refuses_tensor_parallel_2_for_nine_heads(demo_artifact, vllm_python, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text((demo_artifact / "deploy" / "vllm" / "config.yaml").read_text()
                      .replace("tensor-parallel-size: 1", "tensor-parallel-size: 2"))
    result = validate_engine.validate_vllm(config, demo_artifact / "model", vllm_python)
    assert not result["ok"] and result["validated_by"] == VALIDATED
    assert "divisible by tensor parallel size (2)" in result["errors"][0]
    table = validate_engine.vllm_table_check({"tensor-parallel-size": 2}, demo_artifact / "model")
    assert table["validated_by"] == "flag table vllm 0.33.0" and not table["ok"]
    assert "must be divisible by tensor parallel size (2)" in table["errors"][0]


def test_an_option_the_installed_vllm_lacks_is_a_plan_error_naming_it(tmp_path, vllm_python, monkeypatch):
    """Where llmopt has no table of the installed release, vLLM's own parser decides: with 0.33.0's table set
    aside, the parser of the installed 0.33.0 refuses --max-num-partial-prefills (an option of 0.26.0 that 0.33.0
    dropped) before any model is read, and the deploy stage stops with a plan error (exit 2)."""
    monkeypatch.setattr(flags, "VLLM_TABLES", {"0.26.0": flags.VLLM_TABLES["0.26.0"]})
    serve = f'engine_python = "{vllm_python}"\nextra_args = {{ max-num-partial-prefills = 2 }}'
    with pytest.raises(UsageError) as info:
        render(tmp_path, "vllm", serve)
    assert info.value.exit_code == 2 and info.value.where == "serve.extra_args"
    assert f"vLLM 0.33.0 has no option --max-num-partial-prefills (checked by {VALIDATED})" in str(info.value)
