"""`llmopt validate`: every check that needs no model facts, and nothing that reads the model or the hub."""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager

import pytest

from llmopt import api
from llmopt.cli.main import main
from llmopt.errors import RecipeError

from conftest import write_recipe

# Python's audit events see every file opened and every socket connected, whoever does it.
_opened: list | None = None


def _audit(event: str, args: tuple) -> None:
    if _opened is not None and event in ("open", "socket.connect", "socket.getaddrinfo"):
        _opened.append((event, str(args[0]) if args else ""))


sys.addaudithook(_audit)  # stays installed for the session; records only inside `recording()`


@contextmanager
def recording():
    global _opened
    _opened = []
    try:
        yield _opened
    finally:
        _opened = None


def model_reads(events: list) -> list:
    """Opened model files (config.json, weights, GGUF) and network use among the recorded events."""
    suffixes = ("config.json", ".safetensors", ".bin", ".gguf")
    return [(e, a) for e, a in events if e != "open" or a.endswith(suffixes)]


def config_only_model(tmp_path, **config):
    folder = tmp_path / "model"
    folder.mkdir()
    facts = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
             "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}
    (folder / "config.json").write_text(json.dumps(facts | config))
    (folder / "model.safetensors").write_bytes(b"not really weights")
    return folder


def test_validate_rejects_a_gpu_that_is_not_in_the_catalogue(tmp_path, capsys):
    path = write_recipe(tmp_path, 'schema_version = 1\nname = "x"\n[model]\nsource = "org/model"\n'
                                  '[target]\ngpu = "H100-SXM-80GX"\n')
    with pytest.raises(RecipeError) as info:
        api.validate(path)
    (problem,) = info.value.problems
    assert problem.where == f"{path}:6: target.gpu"
    assert "unknown GPU 'H100-SXM-80GX'" in problem.message and "did you mean 'H100-SXM-80GB'?" in problem.hint
    assert main(["validate", str(path)]) == 2
    out, err = capsys.readouterr()
    assert "valid" not in out and "unknown GPU 'H100-SXM-80GX'" in err


PROBLEMS = """\
schema_version = 1
name = "many"
[model]
source = "{model}"
[[compress]]
method = "gptq"
group_size = 100          # does not divide 4096: a check that needs the model's layer widths
[[compress]]
method = "awq"            # a second quantization: a rule across stages
[target]
gpu = "H100"
[serve]
backend = "vllm"
max_model_len = 4096
enable_chunked_prefill = false
max_num_batched_tokens = 1024   # a backend's own plan-time check
extra_args = {{ no_such_flag = 1 }}
"""


def test_validate_reports_every_problem_that_needs_no_model_facts_at_once(tmp_path):
    path = write_recipe(tmp_path, PROBLEMS.format(model=config_only_model(tmp_path)))
    with recording() as events, pytest.raises(RecipeError) as info:
        api.validate(path)
    assert model_reads(events) == []
    wheres = sorted(p.where.split(": ", 1)[1] for p in info.value.problems)
    assert wheres == ["compress[1].method", "serve.extra_args", "serve.max_num_batched_tokens"]
    assert info.value.exit_code == 2
    # the group size is judged by `plan`, which reads config.json
    assert any("group_size 100" in p.message for p in api.plan(path).errors)


def test_validate_skips_checks_that_need_facts_and_names_them(tmp_path, capsys):
    body = PROBLEMS.split('[[compress]]\nmethod = "awq"')[0]  # gptq with group_size 100, no other problem
    body += '[[eval]]\nname = "p"\nkind = "perplexity"\nwindow = 100000\n'  # longer than the model's 8192
    path = write_recipe(tmp_path, body.format(model=config_only_model(tmp_path)))
    with recording() as events:
        result = api.validation(path)
    assert model_reads(events) == []
    errors = " ".join(p.message for p in api.plan(path).errors)  # what `plan` judges with the facts
    assert "group_size 100" in errors and "window 100000 exceeds the model's context of 8192" in errors
    assert any(line.startswith("compress[0] (gptq)") for line in result.unchecked)
    assert any(line.startswith("eval[0] (perplexity)") for line in result.unchecked)
    assert any(line.startswith("the model source") for line in result.unchecked)
    assert main(["validate", str(path), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["valid"] is True and doc["unchecked"] == result.unchecked
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "valid" in out and "not checked without model facts" in out and "compress[0] (gptq)" in out


def test_validate_does_not_touch_the_hub(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    path = write_recipe(tmp_path, 'schema_version = 1\nname = "x"\n[model]\nsource = "org/model"\n'
                                  '[[compress]]\nmethod = "gptq"\n')
    with recording() as events:
        result = api.validation(path)
    assert model_reads(events) == [] and result.loaded.recipe.name == "x"


def test_every_shipped_recipe_validates_without_reading_its_model():
    for item in api.shipped_recipes():
        with recording() as events:
            api.validate(item["path"])
        # the ONNX export's gguf_blocks = "keep" reads the GGUF header (no weights) to judge the carry
        carried = item["name"] == "gguf-onnx-cpu"
        reads = [(e, a) for e, a in model_reads(events) if not (carried and a.endswith(".gguf"))]
        assert reads == [], item["name"]


BROKEN_AXES = """schema_version = 1
name = "broken-axes"
[model]
source = "org/model"
[calibration]
samples = 4
[[compress]]
method = "gptq"
[[eval]]
name = "prose"
kind = "perplexity"
data = "builtin:prose-eval"
max_increase_pct = 30
[sweep.axes]
"compress[0]" = [{ method = "gptq" }, { method = "gptqq" }, { method = "awq", n_gird = 10 }, { method = "rtn", bits = "four" }]
"""


def test_validate_and_plan_check_every_variant_of_a_sweep(tmp_path, capsys):
    """Issue 37: `llmopt validate` answered "valid" for a sweep whose axes held an unknown method, an unknown
    key and a wrong type; only `llmopt sweep --dry-run` found them. Both now exit 2 naming variant and key."""
    path = write_recipe(tmp_path, BROKEN_AXES)
    assert main(["validate", str(path), "-f", "json"]) == 2
    error = json.loads(capsys.readouterr().out)["error"]
    found = [(p["where"], p["message"]) for p in error["problems"]]
    assert [where.split(":")[0] for where, _ in found] == ["variant gptqq", "variant awq", "variant rtn"]
    assert 'variant gptqq: sweep axis compress[0]={method = "gptqq"}: compress[0].method' == found[0][0]
    assert "unknown compress backend 'gptqq'; did you mean 'gptq'?" in found[0][1]
    assert found[1][0].endswith("compress[0].n_gird") and "unknown key 'n_gird'" in found[1][1]
    assert found[2][0].endswith("compress[0].bits") and "valid integer" in found[2][1]
    assert "variant gptqq" in error["what"] or "3 problems" in error["what"]
    assert main(["plan", str(path), "--offline", "-f", "json"]) == 2
    assert [p["where"].split(":")[0] for p in json.loads(capsys.readouterr().out)["error"]["problems"]
            if p["severity"] == "error"] == ["variant gptqq", "variant awq", "variant rtn"]
    # the same recipe with its axes mended is valid
    mended = BROKEN_AXES.replace('"gptqq"', '"gptq", group_size = 32').replace("n_gird", "n_grid").replace('"four"', "4")
    assert main(["validate", str(write_recipe(tmp_path, mended, "mended.toml")), "-f", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["valid"] is True
