"""The CLI: exit codes, JSON output for every command, help with examples, no tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from llmopt.cli.main import main

from conftest import ROOT, run_cli, write_recipe

QUICKSTART = str(ROOT / "recipes" / "quickstart.toml")


def call(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "args",
    [
        ("validate", QUICKSTART),
        ("plan", QUICKSTART),
        ("ls",),
        ("ls", "recipes"),
        ("ls", "gpus"),
        ("doctor",),
    ],
)
def test_json_output_parses(capsys, args):
    code, out, _ = call(capsys, *args, "--format", "json")
    assert code == 0
    json.loads(out)


def test_schema_is_json_schema(capsys):
    code, out, _ = call(capsys, "schema")
    assert code == 0
    doc = json.loads(out)
    assert doc["title"] == "Recipe"
    assert "model" in doc["properties"]


def test_init_and_cp_write_recipes_that_validate(capsys, tmp_path):
    code, out, _ = call(capsys, "init", str(tmp_path / "new.toml"), "--format", "json")
    assert code == 0 and json.loads(out)["written"].endswith("new.toml")
    assert call(capsys, "validate", str(tmp_path / "new.toml"))[0] == 0
    code, out, _ = call(capsys, "cp", "quickstart", str(tmp_path), "--format", "json")
    assert code == 0
    assert call(capsys, "validate", json.loads(out)["written"])[0] == 0
    code, _, err = call(capsys, "cp", "quickstart", str(tmp_path))
    assert code == 2 and "already exists" in err


def test_init_and_cp_make_missing_folders_and_say_when_they_cannot_write(capsys, tmp_path):
    """`llmopt cp quickstart recipes/mine.toml` (cp's own example) was an internal error where recipes/ did not
    exist; so were init and cp into a place that cannot be written."""
    assert call(capsys, "init", str(tmp_path / "new" / "a.toml"))[0] == 0
    assert call(capsys, "cp", "quickstart", str(tmp_path / "recipes" / "mine.toml"))[0] == 0
    assert (tmp_path / "recipes" / "mine.toml").read_text() == (ROOT / "recipes" / "quickstart.toml").read_text()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for args in (("init", str(blocker / "a.toml")), ("cp", "quickstart", str(blocker / "b.toml"))):
        code, _, err = call(capsys, *args)
        assert code == 2 and f"cannot write {blocker / args[-1].rsplit('/', 1)[-1]}" in err, err
        assert "internal error" not in err


def test_a_recipe_that_is_not_utf8_text_is_a_recipe_error(capsys, tmp_path):
    path = tmp_path / "binary.toml"
    path.write_bytes(b"\xff\xfe[model]\n")
    code, _, err = call(capsys, "validate", str(path))
    assert code == 2 and f"{path} is not UTF-8 text" in err and "internal error" not in err


def test_each_compress_table_of_the_starter_uncommented_validates(capsys, tmp_path):
    """`llmopt init` offers [[compress]] tables in comments, to uncomment one: each must be a recipe, and the one
    said to be the quickstart's must be the quickstart's."""
    import re
    import tomllib

    from llmopt import api

    text = api.STARTER.format(name="x", source="builtin:smollm2-135m")
    blocks = re.findall(r"^# \[\[compress\]\]\n(?:# \w+ = .*\n)+", text, flags=re.M)
    assert len(blocks) == 2, blocks
    for index, block in enumerate(blocks):
        body = text.replace(block, re.sub(r"^# ", "", block, flags=re.M))
        path = tmp_path / f"{index}.toml"
        path.write_text(body)
        assert call(capsys, "validate", str(path))[0] == 0, capsys.readouterr()
        steps = tomllib.loads(body)["compress"]
        assert len(steps) == 1
    quickstart = tomllib.loads((ROOT / "recipes" / "quickstart.toml").read_text())["compress"]
    assert steps == quickstart  # the last block


def test_invalid_recipe_exits_2_without_traceback(tmp_path):
    path = write_recipe(tmp_path, 'schema_version = 1\nname = "x"\n[model]\nsource = 3\n')
    result = run_cli("run", str(path), cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert f"{path}:4: model.source: Input should be a valid string (got 3)" in result.stderr
    assert result.stdout == ""
    assert not (tmp_path / "artifacts").exists()


def test_invalid_recipe_json_error_document(capsys, tmp_path):
    path = write_recipe(tmp_path, 'schema_version = 2\nname = "x"\n[model]\nsource = "a/b"\n')
    code, out, _ = call(capsys, "validate", str(path), "--format", "json")
    assert code == 2
    error = json.loads(out)["error"]
    assert error["exit_code"] == 2 and error["problems"][0]["where"].endswith(":1: schema_version")


def test_unknown_command_and_option_exit_2(capsys):
    assert call(capsys, "frobnicate")[0] == 2
    assert call(capsys, "plan", QUICKSTART, "--bogus")[0] == 2


def test_debug_variable_shows_traceback(tmp_path):
    path = write_recipe(tmp_path, 'name = "x"\n')
    result = run_cli("validate", str(path), env={"LLMOPT_DEBUG": "1"})
    assert result.returncode != 0 and "Traceback" in result.stderr


@pytest.mark.parametrize("command", ["run", "plan", "validate", "init", "cp", "ls", "doctor", "schema"])
def test_help_has_examples(capsys, command):
    code, out, _ = call(capsys, command, "--help")
    assert code == 0
    assert "Examples:" in out and f"llmopt {command}" in out


def _commands():
    import typer.main

    from llmopt.cli.app import app

    return typer.main.get_command(app).commands


@pytest.mark.parametrize("command", sorted(_commands()))
def test_help_keeps_the_recipe_s_table_names(capsys, monkeypatch, command):
    """`[sweep.axes]`, `[serve].workload`, `[[eval]]` in a help text are words, not Rich markup to drop."""
    import re

    texts = [_commands()[command].help or ""] + [getattr(p, "help", "") or "" for p in _commands()[command].params]
    names = sorted({m for text in texts for m in re.findall(r"\[+[a-z_.]+\]+", text)})
    monkeypatch.setenv("COLUMNS", "400")
    code, out, _ = call(capsys, command, "--help")
    assert code == 0
    assert [name for name in names if name not in out] == []
    assert "\\[" not in out  # nor escaped twice


def test_help_shows_table_names_as_written(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    out = call(capsys, "validate", "--help")[1]
    assert "A recipe with [sweep.axes] is checked whole" in out
    out = call(capsys, "bench", "--help")[1]
    assert "the artifact's [serve].workload, else 1024" in out
    out = call(capsys, "eval", "--help")[1]
    assert "default: every [[eval]]." in out
    out = call(capsys, "sweep", "--help")[1]
    assert "every combination of its [sweep] axes" in out


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version(capsys, flag):
    import llmopt

    assert call(capsys, flag) == (0, f"llmopt {llmopt.__version__}\n", "")


def test_top_level_help(capsys):
    code, out, _ = call(capsys, "--help")
    assert code == 0 and "llmopt run" in out


def test_ls_shows_each_backends_whole_summary(capsys, monkeypatch):
    code, out, _ = call(capsys, "ls", "backends", "--format", "json")
    backends = json.loads(out)["backends"]
    hf = next(b for b in backends["export"] if b["name"] == "hf")
    assert hf["summary"] == ("Export: the Hugging Face folder as the last stage wrote it (plain safetensors, or "
                             "compressed-tensors / ModelOpt checkpoints from a quantization step).")
    summaries = [b["summary"] for items in backends.values() for b in items]
    assert all(s.endswith(".") and "\n" not in s and ". " not in s for s in summaries), summaries  # one sentence
    monkeypatch.setenv("COLUMNS", "400")  # the table, wide enough not to wrap
    code, out, _ = call(capsys, "ls", "backends")
    assert code == 0 and "checkpoints from a quantization step)." in out


@pytest.mark.parametrize("args", [("ls", "--format", "json"), ("ls",), ("plan", QUICKSTART), ("--help",)])
def test_closed_stdout_ends_quietly_with_141(args):
    """`llmopt ls --format json | head -1`: the reader is gone before llmopt writes."""
    proc = subprocess.Popen([sys.executable, "-m", "llmopt", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141 and err == ""


def test_a_warning_keeps_the_recipe_s_table_names(capsys):
    """Warnings are plain text: "[tune] cannot start vllm" is not a Rich style tag."""
    from llmopt.output import Output
    from llmopt.sweep.execute import VariantOutput

    Output("human").warn("[tune] cannot start vllm on this machine (not installed)")
    VariantOutput("human", "g[32]").warn("[serve.speculative] stays as the recipe says")
    err = capsys.readouterr().err
    assert "warning: [tune] cannot start vllm" in err
    assert "warning: g[32]: [serve.speculative] stays" in err


@pytest.mark.parametrize("command", [("serve", str(ROOT / "recipes")), ("bench", "http://127.0.0.1:9")])
def test_a_port_out_of_range_is_a_usage_error(capsys, command):
    """`llmopt serve ARTIFACT --port 99999` was an internal error (bind(): port must be 0-65535)."""
    code, _, err = call(capsys, *command, "--port", "99999")
    assert code == 2 and "65535" in err and "--port" in err and "internal error" not in err
