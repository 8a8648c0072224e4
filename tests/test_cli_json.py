"""``--format json`` prints exactly one JSON document, also when the command fails.

A failed command's document is its result (when it computed one) with an ``error`` object
inside, or ``{"error": {...}}`` alone. CI reads this with one ``json.loads`` of stdout.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from llmopt.cli.main import main

from conftest import tiny_recipe, write_recipe

ERROR_KEYS = {"type", "exit_code", "what", "where", "fix", "problems"}
BAD_RECIPE = 'schema_version = 1\nname = "x"\n[model]\nsource = 3\n'
PRUNE = '[[compress]]\nmethod = "prune_depth"\nlayers = 1\nprotect_first = 0\n'


def json_call(capsys, *args) -> tuple[int, dict, str]:
    """Run the CLI with --format json; stdout must parse as one document (no "Extra data")."""
    code = main([*args, "--format", "json"])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


def error_of(doc: dict, exit_code: int, kind: str) -> dict:
    error = doc["error"]
    assert set(error) == ERROR_KEYS and error["exit_code"] == exit_code and error["type"] == kind
    return error


def perturbed_copy(model: Path, folder: Path, scale: float = 6.0) -> Path:
    """The tiny model with its (tied) embedding matrix scaled up: perplexity several times higher."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(model, folder)
    weights = load_file(folder / "model.safetensors")
    weights["model.embed_tokens.weight"] = weights["model.embed_tokens.weight"] * scale
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.mark.parametrize("command", ["run", "plan", "validate", "eval"])
def test_bad_recipe_is_one_error_document(capsys, tmp_path, command):
    path = write_recipe(tmp_path, BAD_RECIPE)
    code, doc, err = json_call(capsys, command, str(path))
    assert code == 2 and set(doc) == {"error"}
    error = error_of(doc, 2, "RecipeError")
    assert error["problems"][0]["where"] == f"{path}:4: model.source"
    assert "Input should be a valid string" in err  # the human text still goes to stderr


def test_plan_with_a_failing_check_is_the_plan_with_its_error(capsys, tmp_path, tiny_model):
    path = write_recipe(tmp_path, tiny_recipe(tiny_model, extra='data = "missing.txt"\n'))
    code, doc, _ = json_call(capsys, "plan", str(path))
    assert code == 2
    assert [s["name"] for s in doc["stages"]][0] == "source"  # the plan is there...
    assert any("data file not found" in c["message"] for c in doc["checks"])
    error = error_of(doc, 2, "RecipeError")  # ...and the error inside it
    assert "1 check(s) failed" in error["what"] and "data file not found" in error["problems"][0]["message"]


def test_failed_stage_is_one_error_document(capsys, tmp_path, tiny_model):
    empty = tmp_path / "empty.txt"
    empty.write_text("")  # nothing to score: the eval stage fails
    path = write_recipe(tmp_path, tiny_recipe(tiny_model, extra=f'data = "{empty}"\n'))
    code, doc, _ = json_call(capsys, "run", str(path), "-o", str(tmp_path / "art"))
    assert code == 1 and set(doc) == {"error"}
    assert "nothing to score" in error_of(doc, 1, "StageFailed")["what"]
    code, doc, _ = json_call(capsys, "eval", str(path), "-o", str(tmp_path / "r"))
    assert code == 1 and "nothing to score" in error_of(doc, 1, "StageFailed")["what"]


def test_run_with_a_failed_gate_is_the_result_with_its_error(capsys, tmp_path, tiny_model):
    # pruning a layer moves the perplexity a little either way; a 0% limit on the interval fails
    body = tiny_recipe(tiny_model, extra=PRUNE).replace("max_increase_pct = 5", "max_increase_pct = 0")
    code, doc, _ = json_call(capsys, "run", str(write_recipe(tmp_path, body)), "-o", str(tmp_path / "art"))
    assert code == 3
    assert doc["passed"] is False and [g["verdict"] for g in doc["gates"]] == ["fail"]
    assert doc["artifact"] == str(tmp_path / "art") and (tmp_path / "art" / "manifest.json").is_file()
    assert error_of(doc, 3, "GateFailed")["what"] == "accuracy gate failed: prose"


def test_eval_and_gate_with_a_failed_gate_are_the_result_with_its_error(capsys, tmp_path, tiny_model):
    damaged = perturbed_copy(tiny_model, tmp_path / "damaged")
    path = write_recipe(tmp_path, tiny_recipe(tiny_model))
    code, doc, _ = json_call(capsys, "eval", str(path), "--candidate", str(damaged), "-o", str(tmp_path / "r"))
    assert code == 3 and doc["passed"] is False and doc["gates"][0]["verdict"] == "fail"
    assert error_of(doc, 3, "GateFailed")["what"] == "accuracy gate failed: prose"

    code, doc, _ = json_call(capsys, "gate", str(tmp_path / "r" / "report.json"), "-s", "prose.max_increase_pct=50")
    assert code == 3 and doc["gates"][0]["verdict"] == "fail"
    assert error_of(doc, 3, "GateFailed")["where"] == str(tmp_path / "r" / "report.json")

    code, doc, _ = json_call(capsys, "gate", str(tmp_path / "r" / "report.json"), "-s", "prose.max_increase_pct=none")
    assert code == 0 and "error" not in doc and doc["gates"][0]["verdict"] == "no-gate"


def test_missing_extra_is_one_error_document(capsys, tmp_path, tiny_model, monkeypatch):
    monkeypatch.setitem(sys.modules, "llmcompressor", None)  # `import llmcompressor` fails as if not installed
    rtn = '[[compress]]\nmethod = "rtn"\nbits = 4\ngroup_size = 32\n'
    code, doc, err = json_call(capsys, "run", str(write_recipe(tmp_path, tiny_recipe(tiny_model, extra=rtn))))
    assert code == 4 and set(doc) == {"error"}
    error = error_of(doc, 4, "MissingExtra")
    assert "'llmcompressor', which is not installed" in error["what"]
    assert error["fix"] == "pip install 'llmopt[compress]'"
    assert "Traceback" not in err


def test_verify_failure_is_the_report_with_its_error(capsys, tmp_path, tiny_model):
    from llmopt import api

    out = tmp_path / "art"
    api.run(write_recipe(tmp_path, tiny_recipe(tiny_model)), output_dir=out)
    (out / "notes.txt").write_text("added later")
    code, doc, _ = json_call(capsys, "verify", str(out))
    assert code == 1 and doc["ok"] is False and doc["extra"] == ["notes.txt"]
    assert "1 extra" in error_of(doc, 1, "VerifyFailed")["what"]


def test_command_line_error_is_one_error_document(capsys):
    code, doc, _ = json_call(capsys, "ls", "--bogus")
    assert code == 2 and set(doc) == {"error"}
    assert "--bogus" in error_of(doc, 2, "UsageError")["what"]
    code, doc, _ = json_call(capsys, "ls", "nothing")
    assert code == 2 and "cannot list 'nothing'" in error_of(doc, 2, "UsageError")["what"]


def test_success_documents_have_no_error(capsys):
    code, doc, _ = json_call(capsys, "ls", "gpus")
    assert code == 0 and set(doc) == {"gpus"}


def test_internal_error_exits_70_with_one_error_document(capsys, monkeypatch):
    from llmopt import api

    def broken():
        raise KeyError("gpus")  # a bug, not a user's mistake

    monkeypatch.setattr(api, "gpus", broken)
    code, doc, err = json_call(capsys, "ls", "gpus")
    assert code == 70 and set(doc) == {"error"}
    assert error_of(doc, 70, "InternalError")["what"] == "internal error: KeyError: 'gpus'"
    assert "error: internal error: KeyError: 'gpus'" in err and "LLMOPT_DEBUG=1" in err and "Traceback" not in err
    assert main(["ls", "gpus"]) == 70  # human mode: the same code


def test_an_exception_inside_a_stage_is_a_failed_stage(capsys, tmp_path, tiny_model, monkeypatch):
    from llmopt import registry

    def broken(self, options, ctx):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(registry.all_backends()["eval"]["perplexity"], "run", broken)
    code, doc, _ = json_call(capsys, "run", str(write_recipe(tmp_path, tiny_recipe(tiny_model))))
    assert code == 1
    assert "stage eval.prose.baseline failed: ZeroDivisionError" in error_of(doc, 1, "StageFailed")["what"]


def test_ctrl_c_exits_130_with_one_error_document(capsys, monkeypatch):
    from llmopt import api

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "gpus", interrupted)
    code, doc, _ = json_call(capsys, "ls", "gpus")
    assert code == 130 and error_of(doc, 130, "Interrupted")["what"] == "interrupted"


def test_a_document_written_early_is_the_only_one(capsys):
    """`llmopt serve` writes its document when it starts listening; a later error goes to stderr only."""
    from llmopt.output import Output

    out = Output("json")
    out.result({"url": "http://127.0.0.1:8000/v1"})
    assert capsys.readouterr().out == ""  # held until the command ends...
    out.flush()  # ...or until the command says so
    out.finish({"type": "StageFailed", "exit_code": 1})
    assert json.loads(capsys.readouterr().out) == {"url": "http://127.0.0.1:8000/v1"}
