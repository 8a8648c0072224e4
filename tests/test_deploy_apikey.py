"""Only those who hold the key get in, for every engine's deploy files: the API key comes from the
environment (``${LLMOPT_API_KEY}`` in compose and launch.sh, the Secret ``llmopt-api-key`` by reference in
Kubernetes) and reaches each engine the way it reads one (vLLM's VLLM_API_KEY, SGLang's --api-key,
llmopt serve's LLMOPT_API_KEY; TensorRT-LLM checks none and its files say so); no generated file ever
holds a key; compose publishes on 127.0.0.1 and launch.sh listens there unless the recipe says otherwise."""

from __future__ import annotations

import os
import subprocess

import pytest
import yaml

from llmopt import apikey

from test_deploy_configs import onnx_model, plan_errors, render, render_ort

KEY = "sk-deploy-" + "9b1e" * 8
SECRET_REF = {"secretKeyRef": {"name": "llmopt-api-key", "key": "api-key"}}
ENGINES = ["vllm", "sglang", "trtllm", "ort"]


def rendered(tmp_path, engine: str, serve: str = ""):
    tmp_path.mkdir(parents=True, exist_ok=True)
    if engine == "ort":
        return render_ort(tmp_path, onnx_model(tmp_path, []), f'image = "registry.example/llmopt-ort:1"\n{serve}')
    return render(tmp_path, engine, serve)


def files_of(folder):
    compose = yaml.safe_load((folder / "docker-compose.yaml").read_text())
    deployment, _ = yaml.safe_load_all((folder / "kubernetes.yaml").read_text())
    return (next(iter(compose["services"].values())), deployment["spec"]["template"]["spec"]["containers"][0],
            (folder / "launch.sh").read_text())


@pytest.mark.parametrize("engine", ENGINES)
def test_no_generated_file_holds_a_key(tmp_path, engine, monkeypatch):
    for name in (apikey.ENV, "VLLM_API_KEY", "HF_TOKEN"):
        monkeypatch.setenv(name, KEY)
    result, folder = rendered(tmp_path, engine)
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len([p for p in written if p.parent == folder]) >= 3
    assert not [p for p in written if KEY in p.read_text(errors="replace")]
    assert KEY not in repr(result)  # nor the manifest's deploy entry


@pytest.mark.parametrize("engine", ENGINES)
def test_compose_publishes_on_127_0_0_1_and_launch_sh_listens_there_unless_the_recipe_says_otherwise(tmp_path, engine):
    service, _, script = files_of(rendered(tmp_path / "default", engine)[1])
    assert service["ports"] == ["127.0.0.1:8000:8000"]
    assert '--host "${LLMOPT_HOST:-127.0.0.1}"' in script and "0.0.0.0" not in script.split("\nexec ")[-1]
    service, container, script = files_of(rendered(tmp_path / "open", engine, 'publish_host = "0.0.0.0"')[1])
    assert service["ports"] == ["0.0.0.0:8000:8000"] and '--host "${LLMOPT_HOST:-0.0.0.0}"' in script
    assert files_of(rendered(tmp_path / "v6", engine, 'publish_host = "::1"')[1])[0]["ports"] == ["[::1]:8000:8000"]
    # inside the container the engine listens on every interface (ort: launch.sh, told so by LLMOPT_HOST)
    command = " ".join(service.get("command", []))
    assert "--host 0.0.0.0" in command or service["environment"].get("LLMOPT_HOST") == "0.0.0.0"
    assert "--host 0.0.0.0" in " ".join(container["args"]) or {"name": "LLMOPT_HOST", "value": "0.0.0.0"} in container["env"]


def test_a_publish_host_that_is_not_an_address_is_a_recipe_error(tmp_path):
    from llmopt.errors import RecipeError

    with pytest.raises(RecipeError) as error:
        plan_errors(tmp_path, "vllm", 'publish_host = "everywhere"')
    assert error.value.exit_code == 2
    assert "recipe.toml:12: serve.publish_host: Value error, 'everywhere' is not an IP address" in str(error.value)


def test_vllm_reads_the_key_from_vllm_api_key(tmp_path):
    service, container, script = files_of(render(tmp_path, "vllm")[1])
    assert service["environment"]["VLLM_API_KEY"] == "${LLMOPT_API_KEY:-}"
    assert {"name": "VLLM_API_KEY", "valueFrom": SECRET_REF} in container["env"]  # required: no Secret, no pod
    assert "--api-key" not in service["command"] + container["args"]  # never on a command line
    assert 'export VLLM_API_KEY="$LLMOPT_API_KEY"' in script


def test_sglang_gets_the_key_as_its_api_key_option(tmp_path):
    service, container, script = files_of(render(tmp_path, "sglang")[1])
    assert service["command"][-2:] == ["--api-key", "${LLMOPT_API_KEY:-}"]
    assert container["args"][-2:] == ["--api-key", "$(LLMOPT_API_KEY)"]  # expanded by Kubernetes from the Secret
    assert {"name": "LLMOPT_API_KEY", "valueFrom": SECRET_REF} in container["env"]
    assert '${LLMOPT_API_KEY:+--api-key "$LLMOPT_API_KEY"} "$@"' in script


def test_ort_serves_through_llmopt_serve_which_reads_llmopt_api_key(tmp_path):
    service, container, script = files_of(rendered(tmp_path, "ort")[1])
    assert service["environment"]["LLMOPT_API_KEY"] == "${LLMOPT_API_KEY:-}"
    assert {"name": "LLMOPT_API_KEY", "valueFrom": SECRET_REF} in container["env"]
    assert "--api-key" not in script


def test_trtllm_checks_no_key_and_its_files_say_what_protects_it(tmp_path):
    folder = render(tmp_path, "trtllm")[1]
    service, container, script = files_of(folder)
    assert not [k for k in service["environment"] if "API_KEY" in k]
    assert not [e for e in container["env"] if "API_KEY" in e["name"]]
    for name in ("docker-compose.yaml", "kubernetes.yaml", "launch.sh"):
        assert "trtllm checks no API key: keep it on 127.0.0.1 or behind an authenticating proxy" in \
            (folder / name).read_text()


def run_launch(script, tmp_path, engine_program: str, env: dict) -> list[str]:
    """Run launch.sh with a stand-in for the engine's program that prints its argv and key variables."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / engine_program
    fake.write_text('#!/usr/bin/env bash\necho "VLLM_API_KEY=${VLLM_API_KEY-unset}"\nprintf "%s\\n" "$@"\n')
    fake.chmod(0o755)
    clean = {k: v for k, v in os.environ.items() if k not in (apikey.ENV, "VLLM_API_KEY", "LLMOPT_HOST")}
    out = subprocess.run(["bash", str(script)], env={**clean, "PATH": f"{bin_dir}:{clean['PATH']}", **env},
                         capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def test_launch_sh_hands_the_shells_key_to_the_engine_and_listens_on_localhost(tmp_path):
    folder = render(tmp_path, "vllm")[1]
    lines = run_launch(folder / "launch.sh", tmp_path, "vllm", {apikey.ENV: KEY})
    assert lines[0] == f"VLLM_API_KEY={KEY}" and KEY not in lines[1:]  # in the environment, not the argv
    assert lines[lines.index("--host") + 1] == "127.0.0.1"
    lines = run_launch(folder / "launch.sh", tmp_path, "vllm", {"LLMOPT_HOST": "10.0.0.5"})
    assert lines[0] == "VLLM_API_KEY=unset" and lines[lines.index("--host") + 1] == "10.0.0.5"

    folder = render(tmp_path / "sglang", "sglang")[1]
    lines = run_launch(folder / "launch.sh", tmp_path, "python3", {apikey.ENV: KEY})
    assert lines[-2:] == ["--api-key", KEY]
    assert "--api-key" not in run_launch(folder / "launch.sh", tmp_path, "python3", {})
