"""What a stage hands on and what the next one accepts, judged from the backends' own declarations.

The cases users met: a ModelOpt INT8 SmoothQuant checkpoint planned with exit 0 where the
engine cannot take it (its method was missing from a hand-kept table), while the same recipe
with llm-compressor's int8_sq exited 2. Both methods get a verdict now, from what they declare
they produce and what the consumer declares it accepts.
"""

from __future__ import annotations

import json

import pytest

from llmopt.cli.main import main

from conftest import tiny_recipe, write_recipe

ONNX_CPU = '\n[export]\nformat = "onnx"\nprecision = "int4"\nexecution_provider = "cpu"\n'
VLLM_H100 = '\n[target]\ngpu = "H100"\n\n[serve]\nbackend = "vllm"\nmax_model_len = 512\n'


def plan_checks(tmp_path, tiny_model, capsys, body: str) -> tuple[int, list[dict]]:
    """(exit code of `llmopt plan --format json`, its checks)."""
    recipe = write_recipe(tmp_path, tiny_recipe(tiny_model) + body)
    capsys.readouterr()
    code = main(["plan", str(recipe), "--format", "json", "--cache-dir", str(tmp_path / "cache")])
    plan, _ = json.JSONDecoder().raw_decode(capsys.readouterr().out)  # an error document may follow it
    return code, plan["checks"]


def errors(checks: list[dict]) -> list[str]:
    return [c["message"] for c in checks if c["severity"] == "error"]


@pytest.mark.parametrize("method", ["int8_sq", "modelopt_int8_sq"])
def test_int8_smoothquant_into_onnx_int4_on_the_cpu_is_refused(tmp_path, tiny_model, capsys, method):
    code, checks = plan_checks(tmp_path, tiny_model, capsys, f'\n[[compress]]\nmethod = "{method}"\n' + ONNX_CPU)
    assert code == 2
    refused = [c for c in checks if c["severity"] == "error" and "quantizes activations" in c["message"]]
    assert len(refused) == 1, checks
    assert refused[0]["where"].endswith("compress[0].method") and method in refused[0]["message"]


def test_int8_smoothquant_into_vllm_on_an_h100(tmp_path, tiny_model, capsys):
    """vLLM 0.33 runs compressed-tensors INT8 W8A8 from CC 7.5; its ModelOpt loader takes FP8, NVFP4, MXFP8
    and mixed-precision checkpoints, not INT8 SmoothQuant (quant_algo W8A8_SQ_PER_CHANNEL)."""
    code, checks = plan_checks(tmp_path, tiny_model, capsys, '\n[[compress]]\nmethod = "int8_sq"\n' + VLLM_H100)
    assert code == 0 and not errors(checks), checks
    code, checks = plan_checks(tmp_path, tiny_model, capsys,
                               '\n[[compress]]\nmethod = "modelopt_int8_sq"\n' + VLLM_H100)
    assert code == 2
    [message] = errors(checks)
    assert "modelopt_int8_sq" in message and "served by vllm" in message and "INT8 SmoothQuant" in message


def test_modelopt_int8_sq_gets_a_verdict_from_every_engine(tmp_path, tiny_model, capsys):
    """No engine skips the method: TensorRT-LLM's PyTorch backend runs INT8 SmoothQuant only on its legacy
    engine path, SGLang's ModelOpt loader takes FP8 and NVFP4 only."""
    for engine, severity in (("trtllm", "error"), ("sglang", "error")):
        body = f'\n[[compress]]\nmethod = "modelopt_int8_sq"\n\n[target]\ngpu = "H100"\n\n[serve]\nbackend = ' \
               f'"{engine}"\nmax_model_len = 512\n'
        code, checks = plan_checks(tmp_path, tiny_model, capsys, body)
        said = [c for c in checks if f"served by {engine}" in c["message"]]
        assert [c["severity"] for c in said] == [severity], (engine, checks)


def test_every_shipped_recipe_hands_on_what_its_consumers_accept():
    from llmopt import api

    for item in api.shipped_recipes():
        problems = api.plan(item["path"]).problems
        said = [str(p) for p in problems if " served by " in p.message or " exported to " in p.message]
        assert said == [], item["name"]
