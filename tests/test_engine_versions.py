"""Engine versions (issue 26, item 3): the deploy stage knows which engine release it writes for; where the engine
is installed it reads its version (in the engine's own Python, not imported) and checks the flags against that
release's parser, else against llmopt's flag table of the release, and says which; the image tag follows the
release; a flag the release lacks is a plan error naming it.

The installed vLLM here is a stand-in Python (``fake_vllm_python``): it answers the version read and the
validation script the way a Python with vLLM does, so no test needs vLLM (the real parser's check is in
tests/test_serve_vllm_engine.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from llmopt import api
from llmopt.backends.serve import sglang
from llmopt.deploy import validate_engine
from llmopt.deploy import versions
from llmopt.errors import RecipeError, StageFailed, UsageError

from conftest import run_cli, write_recipe
from test_deploy_configs import RECIPE, plan_errors, planned, render

FAKE_VLLM = """#!{python}
# stands in for a Python with vLLM {version} installed
import json, sys
if "importlib.metadata" in sys.argv[2]:
    print("{version}")
else:  # the parser worker (validate_engine.SERVE): an answer a request, for as long as requests come
    for _ in sys.stdin:
        if {no_parser!r}:  # a CUDA build of vLLM on a machine without a GPU
            answer = {{"ok": False, "errors": ["RuntimeError: Failed to infer device type"], "version": "{version}",
                      "stage": "parser"}}
        else:
            unknown = {unknown!r}
            answer = {{"ok": not unknown, "errors": ["unknown option(s)"] if unknown else [], "version": "{version}",
                      "unknown": unknown, "stage": "config"}}
        print("LLMOPT_RESULT " + json.dumps(answer), flush=True)
"""


def fake_vllm_python(folder: Path, version: str, unknown: tuple[str, ...] = (), no_parser: bool = False) -> Path:
    """An executable that answers as a Python with vLLM ``version`` whose parser lacks ``unknown`` (or, with
    ``no_parser``, cannot be built here)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "python"
    path.write_text(FAKE_VLLM.format(python=sys.executable, version=version, unknown=list(unknown),
                                     no_parser=no_parser))
    path.chmod(0o755)
    versions.read_version.cache_clear()
    return path


@pytest.fixture(autouse=True)
def no_installed_vllm(monkeypatch):
    """No vLLM or SGLang here unless a test names one: $LLMOPT_VLLM_PYTHON and $LLMOPT_SGLANG_PYTHON unset, and no
    `vllm` on PATH."""
    monkeypatch.delenv(validate_engine.ENV_VAR, raising=False)
    monkeypatch.delenv(validate_engine.SGLANG_ENV_VAR, raising=False)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    versions.read_version.cache_clear()


# "A flag the installed version lacks is a plan error naming it."

def test_a_flag_the_stated_version_lacks_is_a_plan_error_naming_it(tmp_path):
    # --max-num-queued-reqs is an option of vLLM 0.33.0, not of 0.26.0
    errors = plan_errors(tmp_path, "vllm", 'engine_version = "0.26.0"\nextra_args = { max-num-queued-reqs = 64 }')
    assert errors == ["vLLM 0.26.0 has no option --max-num-queued-reqs (checked against llmopt's flag table of vLLM "
                      "0.26.0; the version from serve.engine_version) | remove it from extra_args, or write for a "
                      "vLLM that has it (engine_version = \"0.33.0\")"]
    assert plan_errors(tmp_path / "033", "vllm", "extra_args = { max-num-queued-reqs = 64 }") == []
    recipe = write_recipe(tmp_path, RECIPE.format(source=tmp_path / "model", target='gpu = "H100"', engine="vllm",
                                                  max_model_len=4096, serve='engine_version = "0.26.0"\n'
                                                  'extra_args = { max-num-partial-prefills = 2, '
                                                  'max-num-queued-reqs = 64 }'))
    done = run_cli("plan", str(recipe), env={validate_engine.ENV_VAR: ""})
    assert done.returncode == 2, done.stderr
    assert "serve.extra_args" in done.stderr and "vLLM 0.26.0 has no option --max-num-queued-reqs" in done.stderr
    assert "max-num-partial-prefills" not in done.stderr  # an option of 0.26.0 that 0.33.0 dropped


def test_a_flag_the_installed_parser_lacks_is_a_plan_error_at_the_deploy_stage(tmp_path):
    # vLLM 0.30.0: no table of llmopt's; its own parser (here a stand-in) finds the option it lacks
    python = fake_vllm_python(tmp_path / "env", "0.30.0", unknown=("made-up-option",))
    assert plan_errors(tmp_path, "vllm", f'engine_python = "{python}"\nextra_args = {{ made-up-option = 1 }}') == []
    with pytest.raises(UsageError) as info:
        render(tmp_path / "r", "vllm", f'engine_python = "{python}"\nextra_args = {{ made-up-option = 1 }}')
    assert info.value.exit_code == 2 and info.value.where == "serve.extra_args"
    assert "vLLM 0.30.0 has no option --made-up-option (checked by vllm 0.30.0 EngineArgs)" in str(info.value)


def test_a_version_llmopt_has_no_table_of_and_is_not_installed_is_a_plan_error(tmp_path):
    errors = plan_errors(tmp_path, "vllm", 'engine_version = "0.20.0"')
    assert errors == ["llmopt has no flag table of vLLM 0.20.0, and vLLM 0.20.0 is not installed here | name a "
                      "Python with vLLM 0.20.0 installed (engine_python), or set engine_version to one llmopt knows: "
                      "0.26.0, 0.33.0"]
    assert "no flag table of SGLang 0.5.20" in plan_errors(tmp_path / "s", "sglang", 'engine_version = "0.5.20"')[0]
    with pytest.raises(RecipeError) as info:
        planned(tmp_path / "bad", "vllm", 'engine_version = "latest"')
    assert "serve.engine_version" in str(info.value)


# "the docker image tag follows the version"; the config and the manifest say the version and the check

def test_the_image_tag_and_the_config_follow_the_stated_version(tmp_path):
    record, folder = render(tmp_path, "vllm", 'engine_version = "v0.26.0"\nenable_prefix_caching = false')
    assert record["image"] == "vllm/vllm-openai:v0.26.0"
    compose = yaml.safe_load((folder / "docker-compose.yaml").read_text())
    assert next(iter(compose["services"].values()))["image"] == "vllm/vllm-openai:v0.26.0"
    assert record["engine_version"] == "0.26.0" and record["engine_version_from"] == "serve.engine_version"
    assert record["validated_by"] == "flag table vllm 0.26.0"
    text = (folder / "config.yaml").read_text()
    assert text.startswith("# vLLM 0.26.0 engine arguments for demo") and \
        "flags checked by llmopt's flag table of vLLM 0.26.0" in text.replace("\n# ", " ")
    # vLLM 0.26.0's config loader drops a false: the negation is written as its --no- option
    config = yaml.safe_load(text)
    assert config["no-enable-prefix-caching"] is True and "enable-prefix-caching" not in config
    default, folder = render(tmp_path / "default", "vllm", "enable_prefix_caching = false")
    assert default["image"] == "vllm/vllm-openai:v0.33.0" and default["engine_version"] == "0.33.0"
    assert default["engine_version_from"] == "llmopt's flag table"
    assert yaml.safe_load((folder / "config.yaml").read_text())["enable-prefix-caching"] is False
    tagged, _ = render(tmp_path / "tagged", "vllm", 'engine_version = "0.26.0"\ntag = "v0.26.0-cu130"')
    assert tagged["image"] == "vllm/vllm-openai:v0.26.0-cu130"


def test_sglang_and_trtllm_image_tags_follow_their_version(tmp_path):
    sglang, _ = render(tmp_path / "s", "sglang", 'engine_version = "0.5.23"')
    assert sglang["image"] == "lmsysorg/sglang:v0.5.23" and sglang["engine_version"] == "0.5.23"
    trtllm, _ = render(tmp_path / "t", "trtllm")
    assert trtllm["image"] == "nvcr.io/nvidia/tensorrt-llm/release:1.2.1" and trtllm["engine_version"] == "1.2.1"


# "where the engine is installed it reads its version and checks the flags against that version's parser"

def test_the_installed_vllm_is_written_for_and_its_parser_checks(tmp_path, monkeypatch):
    python = fake_vllm_python(tmp_path / "env", "0.26.0+cu130")
    monkeypatch.setenv(validate_engine.ENV_VAR, str(python))
    record, folder = render(tmp_path, "vllm", "enable_chunked_prefill = false")
    assert record["engine_version"] == "0.26.0" and record["image"] == "vllm/vllm-openai:v0.26.0"
    assert record["engine_version_from"] == "installed here ($LLMOPT_VLLM_PYTHON)"
    assert record["validated_by"] == "vllm 0.26.0+cu130 EngineArgs"  # as the installed vLLM reports itself
    assert f"flags checked by vLLM 0.26.0's own parser ({python})" in \
        (folder / "config.yaml").read_text().replace("\n# ", " ")
    assert yaml.safe_load((folder / "config.yaml").read_text())["no-enable-chunked-prefill"] is True


def test_a_stated_version_other_than_the_installed_one_is_checked_by_its_table_with_a_warning(tmp_path):
    python = fake_vllm_python(tmp_path / "env", "0.33.0")
    plan, _ = planned(tmp_path, "vllm", f'engine_python = "{python}"\nengine_version = "0.26.0"')
    assert not plan.errors
    assert any("vLLM 0.33.0 is installed here (serve.engine_python) but the config is written for 0.26.0" in p.message
               for p in plan.problems if p.severity == "warning")
    record, _ = render(tmp_path / "r", "vllm", f'engine_python = "{python}"\nengine_version = "0.26.0"')
    assert record["validated_by"] == "flag table vllm 0.26.0" and record["image"] == "vllm/vllm-openai:v0.26.0"
    # the installed release is written for when none is stated; at plan time its table checks, at the deploy stage
    # its parser
    errors = plan_errors(tmp_path / "p", "vllm", f'engine_python = "{python}"\n'
                         'extra_args = { max-num-partial-prefills = 2 }')
    assert errors[0].startswith("vLLM 0.33.0 has no option --max-num-partial-prefills (checked against llmopt's flag "
                                "table of vLLM 0.33.0; the version from installed here (serve.engine_python))")
    missing = plan_errors(tmp_path / "none", "vllm", f'engine_python = "{tmp_path / "env" / "nothing"}"')
    assert missing[0].startswith(f"the Python '{tmp_path / 'env' / 'nothing'}' has no vLLM installed")


def vllm_on_path(tmp_path: Path, monkeypatch, python: Path) -> Path:
    """A `vllm` console script of ``python`` on PATH; returns its folder."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "vllm").write_text(f"#!{python}\nimport sys\nfrom vllm.entrypoints.cli.main import main\n")
    (bin_dir / "vllm").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return bin_dir


def test_vllm_on_path_is_read_through_the_interpreter_of_its_script(tmp_path, monkeypatch):
    python = fake_vllm_python(tmp_path / "env", "0.26.0")
    bin_dir = vllm_on_path(tmp_path, monkeypatch, python)
    installed, bad = versions.installed_vllm(None, validate_engine.ENV_VAR)
    assert bad is None and installed == versions.Installed("0.26.0", str(python), f"`vllm` on PATH ({bin_dir}/vllm)")
    # pip's preamble for a long interpreter path; a shell wrapper (as the simulated engines are) is not read
    (bin_dir / "vllm").write_text(f"#!/bin/sh\n'''exec' \"{python}\" \"$0\" \"$@\"\n' '''\nimport sys\n")
    assert versions.script_python(str(bin_dir / "vllm")) == str(python)
    (bin_dir / "vllm").write_text(f"#!/bin/sh\nexec {python} serve \"$@\"\n")
    assert versions.script_python(str(bin_dir / "vllm")) is None
    assert versions.installed_vllm(None, validate_engine.ENV_VAR) == (None, None)



def test_a_vllm_on_path_that_cannot_build_its_parser_here_leaves_the_check_to_the_table(tmp_path, monkeypatch):
    bin_dir = vllm_on_path(tmp_path, monkeypatch, fake_vllm_python(tmp_path / "env", "0.26.0", no_parser=True))
    record, folder = render(tmp_path / "r", "vllm")
    assert record["engine_version"] == "0.26.0" and record["image"] == "vllm/vllm-openai:v0.26.0"
    assert record["engine_version_from"] == f"installed here (`vllm` on PATH ({bin_dir}/vllm))"
    assert record["validated_by"] == "flag table vllm 0.26.0"
    assert any("cannot build its parser here (RuntimeError: Failed to infer device type)" in w
               for w in record["warnings"])
    assert "flags checked by llmopt's flag table of vLLM 0.26.0" in (folder / "config.yaml").read_text().replace(
        "\n# ", " ")
    # a Python named for the check must be able to check: there the failure stops the stage
    with pytest.raises(StageFailed, match="Failed to infer device type"):
        render(tmp_path / "named", "vllm", f'engine_python = "{tmp_path / "env" / "python"}"')


def test_the_deploy_stage_key_follows_the_installed_release(tmp_path, monkeypatch):
    """A deploy stage cached before vLLM was installed (or before it changed) is not reused: the release the
    config is written for, and whether its parser checked it, are in the stage's key."""
    def deploy_key(folder: Path) -> str:
        # the model folder and recipe are written once: a source's plan-time key includes its files' mtimes (to
        # the second), so writing them again on a slow machine gave another key and failed this test by chance
        plan = api.plan(folder / "recipe.toml") if (folder / "recipe.toml").is_file() else planned(folder, "vllm")[0]
        assert not plan.errors, [p.message for p in plan.errors]
        return plan.stage("deploy.vllm").key

    none = deploy_key(tmp_path / "none")
    monkeypatch.setenv(validate_engine.ENV_VAR, str(fake_vllm_python(tmp_path / "v033", "0.33.0")))
    installed = deploy_key(tmp_path / "none")
    monkeypatch.setenv(validate_engine.ENV_VAR, str(fake_vllm_python(tmp_path / "v026", "0.26.0")))
    older = deploy_key(tmp_path / "none")
    assert len({none, installed, older}) == 3
    monkeypatch.delenv(validate_engine.ENV_VAR)
    assert deploy_key(tmp_path / "none") == none


# SGLang: the installed release's own ServerArgs parser where a Python with it is named, else the flag table
# (the real parser's check is in tests/test_serve_sglang_engine.py; the stand-in answers its script the same way)

def test_sglang_without_an_installed_sglang_is_checked_by_its_flag_table(tmp_path):
    deploy, _ = render(tmp_path, "sglang")
    assert deploy["validated_by"] == "flag table sglang 0.5.23"
    assert (deploy["engine_version"], deploy["engine_version_from"]) == ("0.5.23", "llmopt's flag table")


def test_an_installed_sglang_without_a_table_is_written_for_and_its_parser_decides(tmp_path, monkeypatch):
    python = fake_vllm_python(tmp_path / "sglang", "0.5.24", unknown=("schedule-policy",))
    monkeypatch.setenv(validate_engine.SGLANG_ENV_VAR, str(python))
    with pytest.raises(UsageError) as info:
        render(tmp_path, "sglang", 'extra_args = { schedule-policy = "lpm" }')
    assert info.value.exit_code == 2 and info.value.where == "serve.extra_args"
    assert "SGLang 0.5.24 has no option --schedule-policy (checked by sglang 0.5.24 ServerArgs" in str(info.value)
    deploy, _ = render(tmp_path / "ok", "sglang", f'engine_python = "{fake_vllm_python(tmp_path / "ok", "0.5.24")}"')
    assert deploy["validated_by"] == "sglang 0.5.24 ServerArgs" and deploy["engine_version"] == "0.5.24"
    assert deploy["engine_version_from"] == "installed here (serve.engine_python)"
    backend = sglang.SglangServe()  # the release and the parser join the deploy stage's cache key
    assert backend.key_material(sglang.SglangOptions()) == {"engine_version": "0.5.24", "parser": True}
    monkeypatch.delenv(validate_engine.SGLANG_ENV_VAR)
    assert backend.key_material(sglang.SglangOptions()) == {"engine_version": "0.5.23", "parser": False}


def test_a_python_without_sglang_is_a_plan_error(tmp_path):
    errors = plan_errors(tmp_path, "sglang", f'engine_python = "{sys.executable}"')
    assert any(f"the Python {sys.executable!r} has no SGLang installed" in e and "make sglang-env" in e
               for e in errors)
