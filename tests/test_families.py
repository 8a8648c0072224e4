"""The model-family table's claims (llmopt/model/families.toml), each run on a tiny model of the family built from
its transformers config class and trained a few hundred steps on the shipped prose (tests/families.py).

The tests here are parametrized from the table itself: each ✅ the table gives a family names one of them, so a
claim without a run cannot be written. Each ✗ is a plan-time refusal, checked for every refused path.

* ``test_compress[family-method]``: the Hugging Face folder through the method into its checkpoint (compressed-
  tensors), reloaded and scored against the source on the same held-out windows, within the method's bound;
* the quickstart's path (GPTQ W4, int4 ONNX, perplexity, multiple choice, ``llmopt serve``) is
  tests/test_onnx_families.py's ``test_int4_quickstart_path[family]``, and the float export that proves each
  family's graph its ``test_float_export_scores_as_pytorch[family]``;
* ``test_evals[family]``: the source scored in process (perplexity, multiple choice, generation) and through
  ``llmopt serve``, with the same scores.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import ROOT, write_recipe
from families import recipe
from llmopt import api
from llmopt.model import families

CLAIMS = families.claims()
HERE = "tests/test_families.py::"


def claimed(test: str) -> list[str]:
    """The parameters of ``test`` that the table names, in the table's order."""
    found = [re.fullmatch(rf"{HERE}{test}\[(.+)\]", v.test) for v in CLAIMS]
    return list(dict.fromkeys(m.group(1) for m in found if m))


# method -> (the [[compress]] table, the most its perplexity may rise over the source's, in %). The bounds hold on
# the tiny trained models (perplexity 60 to 90 on a 512-token vocabulary), measured 2026-12-07 on 6 windows of
# 128 tokens: 8-bit and 4-bit methods move it by -1% to +4% (the tiny models are easy to quantize), 2:4 sparsity by
# -7% to +10%. A method that reads a family wrong shows far above: SmoothQuant scaling Gemma's post-attention norm
# gave +34% and +38%, Mixtral's experts loaded as random ones +45%, NVFP4 experts read wrong +300%.
METHODS = {
    "gptq": ('method = "gptq"\ngroup_size = 32\nsymmetric = false\n', 20),
    "awq": ('method = "awq"\ngroup_size = 32\n', 20),
    "rtn": ('method = "rtn"\ngroup_size = 32\nsymmetric = false\n', 25),
    "fp8": ('method = "fp8"\n', 3),
    "fp8_static": ('method = "fp8_static"\n', 3),
    "int8_sq": ('method = "int8_sq"\n', 5),
    "nvfp4a16": ('method = "nvfp4a16"\n', 30),
    "nvfp4": ('method = "nvfp4"\n', 30),
    "modelopt_int8_sq": ('method = "modelopt_int8_sq"\n', 5),
    "modelopt_nvfp4": ('method = "modelopt_nvfp4"\n', 30),
    "sparsegpt": ('method = "sparsegpt"\n', 60),
    # a tiny model has 2 or 3 layers: dropping one costs up to 5x its perplexity (measured: +3% granite to +496%
    # gemma2); what is checked is that the cut model reloads consistent (layer_types one a layer) and sane
    "prune_depth": ('method = "prune_depth"\nlayers = 1\nprotect_first = 0\nprotect_last = 1\n', 800),
    "prune_width": ('method = "prune_width"\nfraction = 0.25\nmultiple_of = 32\n', 40),
}



@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """One stage cache for the module: a family's source stage and baselines are computed once."""
    return tmp_path_factory.mktemp("families-cache")


def run(folder: Path, cache: Path, name: str, body: str):
    recipe = write_recipe(folder, body, f"{name}.toml")
    return api.run(recipe, cache_dir=cache, output_dir=folder / name)


def scores(result, name: str = "prose") -> tuple[float, float]:
    return result.evals[f"eval.{name}.baseline"]["value"], result.evals[f"eval.{name}.candidate"]["value"]


@pytest.mark.parametrize("case", claimed("test_compress"))
def test_compress(case, family_model, cache, tmp_path):
    family, method = case.rsplit("-", 1)
    table, bound = METHODS[method]
    model = family_model(family)
    result = run(tmp_path, cache, f"{family}-{method}",
                 recipe(f"{family}-{method}", model, f"[[compress]]\n{table}"))
    baseline, candidate = scores(result)
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    assert baseline < vocab / 4, f"the tiny {family} model is not trained: perplexity {baseline:.1f}"
    assert candidate <= baseline * (1 + bound / 100), f"{family} {method}: {baseline:.2f} -> {candidate:.2f}"
    config = json.loads((result.artifact / "model" / "config.json").read_text())
    assert config["model_type"] == family
    if method.startswith("prune"):
        source = json.loads((model / "config.json").read_text())
        narrowed = "num_hidden_layers" if method == "prune_depth" else "intermediate_size"
        assert config[narrowed] < source[narrowed], (config[narrowed], source[narrowed])
        assert len(config.get("layer_types") or [0] * config["num_hidden_layers"]) == config["num_hidden_layers"]
    else:
        assert config.get("quantization_config") or method == "sparsegpt", config.keys()


@pytest.mark.parametrize("family", claimed("test_evals"))
def test_evals(family, family_model, capsys, tmp_path):
    from llmopt.cli.main import main
    from llmopt.server import load_model
    from test_server import running

    model = family_model(family)
    body = f"""\
schema_version = 1
name = "{family}-evals"

[model]
source = "{model}"

[[eval]]
name = "prose"
kind = "perplexity"
data = "builtin:prose-eval"
window = 128
max_windows = 3

[[eval]]
name = "mc"
kind = "multiple_choice"
data = "builtin:mc"
limit = 12

[[eval]]
name = "qa"
kind = "generation"
data = "builtin:qa"
limit = 4
max_new_tokens = 6
"""
    recipe = write_recipe(tmp_path, body)
    with running(load_model(model, name=f"{family}-served")) as base:
        code = main(["eval", str(recipe), "--candidate", f"{base}/v1", "-o", str(tmp_path / "r"), "-f", "json"])
    out, err = capsys.readouterr()
    gates = {g["name"]: g for g in json.loads(out)["gates"]}
    assert code == 0, (err[-600:], {n: (g["baseline"], g["candidate"], g["verdict"], g.get("reason")) for n, g in
                                    gates.items()})
    assert abs(gates["prose"]["delta"]) < 1e-3, gates["prose"]  # the same model, in process and served
    assert gates["mc"]["delta"] == 0 and gates["qa"]["delta"] == 0


def test_every_test_the_table_names_exists():
    """A ✅ names a test: a parametrized run (here, or tests/test_onnx_families.py's, parametrized from the table too)
    or a test function."""
    import importlib

    for claim in CLAIMS:
        file, _, name = claim.test.partition("::")
        assert (ROOT / file).is_file(), claim
        test, _, param = name.partition("[")
        if param:
            marks = getattr(getattr(importlib.import_module(Path(file).stem), test), "pytestmark", [])
            params = [str(p) for m in marks if m.name == "parametrize" for p in m.args[1]]
            assert param[:-1] in params, claim
        elif name:
            assert re.search(rf"^def {re.escape(name)}\(", (ROOT / file).read_text(), re.M), claim


REFUSAL_RECIPES = {  # path -> the recipe tables that take it, beside [model]
    "export.onnx": '[[compress]]\nmethod = "gptq"\ngroup_size = 32\n\n[export]\nformat = "onnx"\nprecision = "int4"\n',
    "deploy.ort": '[serve]\nbackend = "ort"\n',
    "compress.modelopt_int4_awq": '[[compress]]\nmethod = "modelopt_int4_awq"\n',
    "compress.prune_width": '[[compress]]\nmethod = "prune_width"\nintermediate_size = 64\n',
}
REFUSALS = [(v.family, path) for family in families.families() for path in families.paths()
            if (v := families.verdict(family, path)).status == "refused" and path in REFUSAL_RECIPES]


@pytest.mark.parametrize("family, path", REFUSALS)
def test_a_refused_path_is_a_plan_error_naming_the_family_the_reason_and_what_works(family, path, family_model,
                                                                                    tmp_path):
    recipe = write_recipe(tmp_path, f'schema_version = 1\nname = "r"\n\n[model]\nsource = "{family_model(family)}"\n\n'
                          + REFUSAL_RECIPES[path])
    plan = api.plan(recipe)
    verdict = families.verdict(family, path)
    errors = [p for p in plan.errors if f"({family})" in p.message]
    assert errors, [str(p) for p in plan.problems]
    assert verdict.why in errors[0].message and verdict.instead in errors[0].hint


def gguf_header(path: Path, architecture: str, experts: int = 0) -> Path:
    """A GGUF file of ``architecture`` with a header and one small tensor: enough for the plan, which reads only
    the header."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(128)
    writer.add_block_count(2)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_context_length(512)
    if experts:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(2)
    writer.add_tensor("token_embd.weight", np.zeros((512, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("family, architecture, experts", [("granite", "granite", 0), ("olmo2", "olmo2", 0),
                                                           ("mixtral", "llama", 8)])
def test_a_gguf_of_a_family_transformers_cannot_convert_is_refused_at_plan_time(family, architecture, experts,
                                                                               tmp_path):
    model = gguf_header(tmp_path / f"{family}.gguf", architecture, experts)
    plan = api.plan(write_recipe(tmp_path, f'schema_version = 1\nname = "g"\n\n[model]\nsource = "{model}"\n'))
    verdict = families.verdict(family, "source.gguf")
    assert plan.model.model_type == family
    assert [p.message for p in plan.errors] == [f"{families.paths()['source.gguf']} is not available for "
                                               f"{verdict.label}: {verdict.why}"]
    assert "Hugging Face folder" in plan.errors[0].hint


def test_a_family_the_table_does_not_name_is_refused_where_its_weights_are_rewritten_unless_allowed(tmp_path,
                                                                                                  tiny_model):
    import shutil

    model = tmp_path / "other"
    shutil.copytree(tiny_model, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(config | {"model_type": "smollm9"}))
    source = f'schema_version = 1\nname = "r"\n\n[model]\nsource = "{model}"\n'
    recipe = write_recipe(tmp_path, source + '\n[[compress]]\nmethod = "fp8"\n')
    errors = api.plan(recipe).errors
    assert len(errors) == 1 and "model family 'smollm9'" in errors[0].message, [str(p) for p in errors]
    assert "compress[0].method" in errors[0].where
    assert "allow_untested" in errors[0].hint and "gemma3_text" in errors[0].hint
    allowed = api.plan(recipe, ["model.allow_untested=true"])
    assert not allowed.errors and any("smollm9" in p.message for p in allowed.problems)
    # scoring the folder as it is, or writing an engine's launch config for it, rewrites nothing: a warning
    scored = api.plan(write_recipe(tmp_path, source + '\n[[eval]]\nname = "p"\nkind = "perplexity"\n', "s.toml"))
    assert not scored.errors and any("smollm9" in p.message for p in scored.problems)


def test_a_gguf_architecture_is_judged_as_the_family_it_converts_to():
    assert families.model_type_of_gguf("gemma3") == "gemma3_text"
    assert families.model_type_of_gguf("qwen3moe") == "qwen3_moe"
    assert families.model_type_of_gguf("llama", experts=8) == "mixtral"
    assert families.verdict("mixtral", "source.gguf").status == "refused"


def test_a_working_path_plans_without_a_family_warning(family_model, tmp_path):
    body = recipe("q", family_model("qwen3"), '[[compress]]\nmethod = "fp8"\n')
    plan = api.plan(write_recipe(tmp_path, body))
    assert not [p for p in plan.problems if "qwen3" in p.message], [str(p) for p in plan.problems]


def test_a_plan_whose_compressed_model_outgrows_its_source_says_what_weighs(family_model, tmp_path):
    """An untied tiny model's float32 embedding outweighs its 4-bit layers: the plan says so and how to shrink it;
    with an 8-bit embedding table the same export plans smaller than the source, without the warning."""
    steps = ('[[compress]]\nmethod = "gptq"\ngroup_size = 32\nsymmetric = false\n\n'
             '[export]\nformat = "onnx"\nprecision = "int4"\nlm_head = "int8"\n')
    body = recipe("grown", family_model("qwen3"), steps)
    plan = api.plan(write_recipe(tmp_path, body))
    grown = [p for p in plan.problems if "larger than the source" in p.message]
    assert len(grown) == 1 and "embedding" in grown[0].message and "float32" in grown[0].message, grown
    assert 'embedding = "int8"' in grown[0].hint and grown[0].severity == "warning"
    smaller = api.plan(write_recipe(tmp_path, body + 'embedding = "int8"\n', "int8.toml"))
    assert not [p for p in smaller.problems if "larger than the source" in p.message]
    assert smaller.estimates["artifact_bytes"] < smaller.estimates["model_bytes_before"]


def test_a_checkpoint_missing_weights_the_model_class_reads_is_an_error_not_random_weights(tiny_model, tmp_path):
    """transformers fills a weight the checkpoint names otherwise with random values and goes on (a Mixtral
    checkpoint's experts, saved under other names, scored +45%): llmopt's runtime refuses it, naming the weights."""
    import shutil

    from safetensors.torch import load_file, save_file

    from llmopt.errors import StageFailed
    from llmopt.runtimes.hf import TransformersRuntime

    model = tmp_path / "renamed"
    shutil.copytree(tiny_model, model)
    tensors = load_file(model / "model.safetensors")
    tensors["model.layers.0.mlp.w3.weight"] = tensors.pop("model.layers.0.mlp.up_proj.weight")
    save_file(tensors, model / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(StageFailed, match=r"lacks 1 of the weights of LlamaForCausalLM \(e\.g\. model\.layers\.0\.mlp"
                                          r"\.up_proj\.weight\).*holds 1 that the class does not read"):
        TransformersRuntime(model)
    TransformersRuntime(tiny_model)  # the checkpoint as saved loads
