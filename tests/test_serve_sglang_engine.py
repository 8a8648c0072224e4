"""SGLang's own parser (``prepare_server_args`` of SGLang 0.5.23, on the CPU) accepts the launch arguments llmopt
writes for the tiny model, the demo model, and the demo model's config.json with every speculative method, and an
option the installed SGLang lacks is a plan error naming it.

Slow: the session fixture ``sglang_python`` (tests/conftest.py) builds .test-envs/sglang with `make sglang-env`
when it is missing (the SGLang 0.5.23 wheel without its CUDA dependencies, next to the CPU torch, triton and the
small packages ``sglang.srt.server_args`` imports); the tests are skipped only when that environment cannot be
built. The parser stops before ``ServerArgs.resolve_once`` (the launcher's step that reads the model and the
platform), so what these tests show is that every option and value llmopt writes is one SGLang 0.5.23 takes.
"""

from __future__ import annotations

import json

import pytest

from llmopt import api
from llmopt.deploy import flags, validate_engine
from llmopt.errors import StageFailed, UsageError

from conftest import link_tree, tiny_recipe, write_recipe
from test_deploy_configs import MOE, render
from test_speculative import draft_folder, section

pytestmark = pytest.mark.slow
VALIDATED = "sglang 0.5.23 ServerArgs"


def test_tiny_model_config_passes_sglangs_parser(tiny_model, tmp_path, sglang_python, monkeypatch):
    monkeypatch.setenv(validate_engine.SGLANG_ENV_VAR, sglang_python)
    recipe = write_recipe(tmp_path, tiny_recipe(tiny_model, windows=1) + '[target]\ngpu = "H100"\n'
                          '[serve]\nbackend = "sglang"\nmax_model_len = 512\nkv_cache_dtype = "fp8_e4m3"\n'
                          'enable_chunked_prefill = false\nenable_prefix_caching = false\n')
    api.run(recipe, output_dir=tmp_path / "art")
    deploy = json.loads((tmp_path / "art" / "manifest.json").read_text())["deploy"]
    assert deploy["validated_by"] == VALIDATED
    assert deploy["engine_version_from"] == "installed here ($LLMOPT_SGLANG_PYTHON)"
    args = deploy["args"]
    assert args["kv-cache-dtype"] == "fp8_e4m3" and args["chunked-prefill-size"] == -1
    assert args["disable-radix-cache"] is True


def test_demo_model_config_passes_sglangs_parser(demo_seed, sglang_python, tmp_path):
    """The demo model converted from its GGUF file (the session's demo_seed holds the conversion) with prompt-lookup
    speculation, over four H100s: the launch arguments of its artifact pass SGLang's parser."""
    link_tree(demo_seed, tmp_path / "cache")
    recipe = write_recipe(tmp_path, 'schema_version = 1\nname = "demo-sglang"\n[model]\nsource = "builtin:smollm2-135m"\n'
                                    '[target]\ngpu = "H100"\ncount = 4\n[serve]\nbackend = "sglang"\nmax_model_len = 8192\n'
                                    f'engine_python = "{sglang_python}"\n'
                                    '[serve.speculative]\nmethod = "ngram"\nnum_tokens = 4\n')
    api.run(recipe, cache_dir=tmp_path / "cache", output_dir=tmp_path / "art")
    deploy = json.loads((tmp_path / "art" / "manifest.json").read_text())["deploy"]
    assert deploy["validated_by"] == VALIDATED
    assert deploy["args"]["tp-size"] == 1 and deploy["args"]["speculative-algorithm"] == "NGRAM"  # 135M fit one GPU
    assert deploy["memory"]["weight_source"] == "safetensors"


@pytest.mark.parametrize("method", ["ngram", "draft_model", "eagle", "eagle3", "mtp"])
def test_speculative_options_pass_sglangs_parser(method, tmp_path, sglang_python):
    """Every [serve.speculative] method as llmopt spells it for SGLang (--speculative-algorithm and its steps, top-k,
    draft tokens and draft path) on the demo model's config.json over four H100s."""
    draft = draft_folder(tmp_path) if method in ("draft_model", "eagle", "eagle3") else None
    deploy, _ = render(tmp_path, "sglang", f'engine_python = "{sglang_python}"\n' + section(method, draft))
    assert deploy["validated_by"] == VALIDATED
    assert deploy["args"]["speculative-algorithm"] in ("NGRAM", "STANDALONE", "EAGLE", "EAGLE3", "NEXTN")


def test_a_moe_config_over_four_gpus_passes_sglangs_parser(tmp_path, sglang_python):
    """Tensor and expert parallel sizes, a ModelOpt FP8 --quantization and extra_args through SGLang's parser."""
    serve = (f'engine_python = "{sglang_python}"\ntensor_parallel_size = 4\n'
             'extra_args = { schedule-policy = "lpm", enable-metrics = true }')
    deploy, _ = render(tmp_path, "sglang", serve, config=MOE, quant={"quant_method": "modelopt", "quant_algo": "FP8"})
    assert deploy["validated_by"] == VALIDATED
    assert deploy["args"]["tp-size"] == 4 and deploy["args"]["quantization"] == "modelopt_fp8"


def test_an_option_the_installed_sglang_lacks_is_a_plan_error_naming_it(tmp_path, sglang_python, monkeypatch):
    """Where llmopt has no table of the installed release, SGLang's own parser decides: with 0.5.23's table set
    aside, the installed 0.5.23 refuses --fp8-gemm-runner-backend (a name llmopt's table once listed; 0.5.23 calls
    it --fp8-gemm-backend) and the deploy stage stops with a plan error (exit 2) naming the option, the version and
    the recipe key."""
    monkeypatch.setattr(flags, "SGLANG_TABLES", {})
    serve = f'engine_python = "{sglang_python}"\nextra_args = {{ fp8-gemm-runner-backend = "auto" }}'
    with pytest.raises(UsageError) as info:
        render(tmp_path, "sglang", serve)
    assert info.value.exit_code == 2 and info.value.where == "serve.extra_args"
    assert f"SGLang 0.5.23 has no option --fp8-gemm-runner-backend (checked by {VALIDATED}" in str(info.value)
    assert "remove it from extra_args" in info.value.fix


def test_a_value_sglang_refuses_fails_the_stage(tmp_path, sglang_python):
    """A value of a known option that SGLang's argparse refuses (a type or a choice) fails the deploy stage with
    its own message."""
    serve = f'engine_python = "{sglang_python}"\nextra_args = {{ schedule-policy = 3 }}'
    with pytest.raises(StageFailed) as info:
        render(tmp_path, "sglang", serve)
    assert f"fail {VALIDATED}: sglang serve: error: argument --schedule-policy: invalid choice: '3'" in str(info.value)
