"""Recipe loading: every problem at once, with file, line and key path."""

from __future__ import annotations

import pytest

from llmopt.errors import RecipeError
from llmopt.recipe import load_recipe
from llmopt.recipe.lines import index_lines, render_path

from conftest import write_recipe

BROKEN = """\
schema_version = 1
name = "broken"

[model]
source = "some/model"
dtype = "bfloat17"

[calibration]
samples = "many"

[[eval]]
name = "prose"
kind = "perplexty"

[[eval]]
name = "prose2"
kind = "perplexity"
windw = 64

[target]
gpu = "H100-SXM-80GB"
cont = 2
"""


def test_all_problems_reported_at_once_with_lines(tmp_path):
    path = write_recipe(tmp_path, BROKEN)
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    text = info.value.render()
    assert f"{path}:6: model.dtype: Input should be 'auto', 'bfloat16', 'float16' or 'float32' (got \"bfloat17\")" in text
    assert "hint: did you mean 'bfloat16'?" in text
    assert f"{path}:9: calibration.samples: Input should be a valid integer, unable to parse string as an integer (got \"many\")" in text
    assert f"{path}:13: eval[0].kind: unknown eval backend 'perplexty'; did you mean 'perplexity'?" in text
    assert f"{path}:18: eval[1].windw: unknown key 'windw'" in text
    assert "did you mean 'window'?" in text
    assert f"{path}:22: target.cont: unknown key 'cont'" in text
    assert "did you mean 'count'?" in text
    assert len(info.value.problems) == 5
    assert info.value.exit_code == 2


def test_toml_syntax_error_has_line_and_column(tmp_path):
    path = write_recipe(tmp_path, 'schema_version = 1\nname = "x"\n[model\nsource = "a/b"\n')
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert info.value.where.startswith(f"{path}:3:")
    assert "TOML syntax error" in info.value.what


def test_missing_required_keys(tmp_path):
    path = write_recipe(tmp_path, 'schema_version = 1\n[model]\ndtype = "bfloat16"\n')
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    text = info.value.render()
    assert f"{path}: name: required key is missing" in text
    assert f"{path}:2: model.source: required key is missing" in text


def test_bad_backend_name_does_not_cascade(tmp_path):
    body = 'schema_version = 1\nname = "x"\n[model]\nsource = "a/b"\n[[compress]]\nmethod = "gptqq"\nbits = 4\nwhatever = 1\n'
    with pytest.raises(RecipeError) as info:
        load_recipe(write_recipe(tmp_path, body))
    assert len(info.value.problems) == 1
    assert "unknown compress backend 'gptqq'" in info.value.render()


def test_overrides_apply_and_are_validated(tmp_path):
    path = write_recipe(tmp_path, 'schema_version = 1\nname = "x"\n[model]\nsource = "a/b"\n[[eval]]\nname = "p"\nkind = "perplexity"\n')
    loaded = load_recipe(path, ["calibration.samples=8", "eval[0].window=32", "model.dtype=float32"])
    assert loaded.recipe.calibration.samples == 8
    assert loaded.options_for("eval", 0).window == 32
    assert loaded.recipe.model.dtype == "float32"
    with pytest.raises(RecipeError) as info:
        load_recipe(path, ["eval.0.window=-3"])
    assert "-s eval.0.window=-3 (command line): Input should be greater than or equal to 8" in info.value.render()


def test_safe_defaults(tmp_path):
    loaded = load_recipe(write_recipe(tmp_path, 'schema_version = 1\nname = "x"\n[model]\nsource = "a/b"\n'))
    assert loaded.recipe.model.trust_remote_code is False
    assert loaded.recipe.model.allow_pickle is False


def test_line_index_handles_arrays_inline_tables_and_comments():
    text = '# c\n[serve]\nbackend = "vllm" # x\nworkload = { input_len = 5, concurrency = 2 }\n[[eval]]\nname = "a"\n[[eval]]\nname = "b"\n'
    index = index_lines(text)
    assert index[("serve", "backend")] == 3
    assert index[("serve", "workload", "concurrency")] == 4
    assert index[("eval", 1, "name")] == 8
    assert render_path(("eval", 1, "name")) == "eval[1].name"


def test_digest_ignores_formatting(tmp_path):
    a = load_recipe(write_recipe(tmp_path, 'schema_version = 1\nname = "x"\n[model]\nsource = "a/b"\n', "a.toml"))
    b = load_recipe(write_recipe(tmp_path, '# comment\nname = "x"\nschema_version=1\n\n[model]\nsource="a/b"\n', "b.toml"))
    assert a.digest == b.digest


EVAL_RECIPE = ('schema_version = 1\nname = "x"\n[model]\nsource = "a/b"\n'
               '[[eval]]\nname = "p"\nkind = "perplexity"\nwindow = 64\n')


def test_an_error_set_by_an_override_names_the_override_not_the_file_line(tmp_path):
    path = write_recipe(tmp_path, EVAL_RECIPE)
    with pytest.raises(RecipeError) as info:
        load_recipe(path, ["eval[0].window=-3"])
    (problem,) = info.value.problems
    assert problem.where == "-s eval[0].window=-3 (command line)"
    assert f"{path}:8" not in info.value.render()  # line 8 holds the value the override replaced
    with pytest.raises(RecipeError) as info:
        load_recipe(path, ["eval.0.window = -3"])  # the other spelling, with spaces, names itself as typed
    assert info.value.problems[0].where == "-s eval.0.window = -3 (command line)"


def test_an_override_of_a_table_names_itself_and_the_key_inside(tmp_path):
    path = write_recipe(tmp_path, EVAL_RECIPE)
    spec = "eval[0]={name='p', kind='perplexity', window=-3}"
    with pytest.raises(RecipeError) as info:
        load_recipe(path, [spec])
    assert info.value.problems[0].where == f"-s {spec} (command line): eval[0].window"
    # a later override of the whole table replaces an earlier one inside it
    with pytest.raises(RecipeError) as info:
        load_recipe(path, ["eval[0].window=32", spec])
    assert info.value.problems[0].where == f"-s {spec} (command line): eval[0].window"


def test_keys_not_overridden_keep_their_file_line(tmp_path):
    path = write_recipe(tmp_path, EVAL_RECIPE.replace('name = "x"', 'name = "x"\n[calibration]\nsamples = 0'))
    with pytest.raises(RecipeError) as info:
        load_recipe(path, ["eval[0].window=-3"])
    wheres = sorted(p.where for p in info.value.problems)
    assert wheres == ["-s eval[0].window=-3 (command line)", f"{path}:4: calibration.samples"]
    loaded = load_recipe(path, ["calibration.samples=4"])
    assert loaded.where("eval", 0, "window") == f"{path}:10: eval[0].window"
    assert loaded.where("calibration", "samples") == "-s calibration.samples=4 (command line)"


def test_an_unknown_table_made_by_an_override_names_the_override(tmp_path):
    """`-s nokey.x=1` makes a table the recipe has not: the problem is on the command line, not in the file."""
    path = write_recipe(tmp_path, EVAL_RECIPE)
    with pytest.raises(RecipeError) as info:
        load_recipe(path, ["nokey.x=1"])
    (problem,) = info.value.problems
    assert problem.where == "-s nokey.x=1 (command line): nokey" and "unknown key 'nokey'" in problem.message
    assert info.value.fix.startswith("fix the -s overrides above")  # not "edit the recipe"
    with pytest.raises(RecipeError) as info:  # a typo of a key inside a table the file has
        load_recipe(path, ["calibration.sample=8"])
    assert info.value.problems[0].where == "-s calibration.sample=8 (command line)"
    with pytest.raises(RecipeError) as info:  # a table made inside one the file has
        load_recipe(write_recipe(tmp_path, EVAL_RECIPE + "[calibration]\nsamples = 8\n"), ["calibration.extra.x=1"])
    assert info.value.problems[0].where == "-s calibration.extra.x=1 (command line): calibration.extra"
    path = write_recipe(tmp_path, EVAL_RECIPE + "[nokey]\ny = 2\n")
    with pytest.raises(RecipeError) as info:  # an unknown table the file has keeps its line
        load_recipe(path, ["nokey.x=1"])
    assert info.value.problems[0].where == f"{path}:9: nokey"


def test_unknown_gpu_is_a_recipe_error_reported_with_the_others(tmp_path):
    body = EVAL_RECIPE + '[target]\ngpu = "H100-SXM-80GX"\n[calibration]\nsamples = 0\n'
    with pytest.raises(RecipeError) as info:
        load_recipe(write_recipe(tmp_path, body))
    text = info.value.render()
    assert "target.gpu: unknown GPU 'H100-SXM-80GX'" in text and "did you mean 'H100-SXM-80GB'?" in text
    assert "calibration.samples" in text and len(info.value.problems) == 2
    with pytest.raises(RecipeError) as info:
        load_recipe(write_recipe(tmp_path, EVAL_RECIPE), ["target.gpu=H10"])
    assert info.value.problems[0].where == "-s target.gpu=H10 (command line)"
    assert load_recipe(write_recipe(tmp_path, EVAL_RECIPE), ["target.gpu=h100"]).recipe.target.gpu == "h100"
