"""`llmopt schema`: the recipe's JSON Schema carries every backend's options and agrees with the loader."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

import jsonschema
import pytest
from pydantic import Field, create_model

from llmopt import api, registry
from llmopt.backends.base import CompressBackend, Options
from llmopt.cli.main import main
from llmopt.errors import RecipeError
from llmopt.recipe.load import BACKEND_SECTIONS, parse_recipe

from conftest import ROOT

SCHEMA = api.json_schema()
# taplo (Even Better TOML) validates as draft 7: the recipes must mean the same under both
VALIDATORS = [jsonschema.Draft202012Validator(SCHEMA), jsonschema.Draft7Validator(SCHEMA)]

HEAD = 'schema_version = 1\nname = "case"\n\n[model]\nsource = "builtin:smollm2-135m"\n'


def schema_accepts(text: str, schema: dict = SCHEMA) -> bool:
    doc = tomllib.loads(text)
    verdicts = {jsonschema.Draft202012Validator(schema).is_valid(doc), jsonschema.Draft7Validator(schema).is_valid(doc)}
    assert len(verdicts) == 1, "draft 7 and draft 2020-12 disagree"
    return verdicts.pop()


def loader_accepts(text: str) -> bool:
    try:
        parse_recipe(text, Path("case.toml"))
    except RecipeError:
        return False
    return True


def gptq(extra: str) -> str:
    return HEAD + f'\n[[compress]]\nmethod = "gptq"\n{extra}\n'


def test_schema_is_a_valid_draft_2020_12_and_draft_7_schema():
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    jsonschema.Draft7Validator.check_schema(SCHEMA)


@pytest.mark.parametrize("path", sorted((ROOT / "recipes").glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_recipe_validates(path):
    doc = tomllib.loads(path.read_text())
    for validator in VALIDATORS:
        errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]
        assert not errors, errors


def test_gptq_step_takes_its_own_options_only():
    assert schema_accepts(gptq("group_size = 64"))
    assert schema_accepts(gptq('scheme = "W8A16"\nsymmetric = false'))
    assert not schema_accepts(gptq("group_sizee = 64"))
    assert not schema_accepts(gptq("window = 64"))  # a perplexity key
    assert not schema_accepts(gptq("group_size = 4"))  # below its minimum of 8
    assert not schema_accepts(gptq('scheme = "W3A16"'))


def test_unknown_or_missing_method_fails():
    assert not schema_accepts(HEAD + '\n[[compress]]\nmethod = "gptqq"\n')
    assert not schema_accepts(HEAD + "\n[[compress]]\nbits = 4\n")


def test_eval_keys_follow_the_kind():
    perplexity = HEAD + '\n[[eval]]\nname = "p"\nkind = "perplexity"\nwindow = 128\nmax_increase_pct = 5\n'
    choice = HEAD + '\n[[eval]]\nname = "m"\nkind = "multiple_choice"\nwindow = 128\n'
    assert schema_accepts(perplexity)
    assert not schema_accepts(choice)
    assert schema_accepts(choice.replace("window = 128", 'metric = "acc_norm"\nmax_drop = 0.05'))


def test_serve_keys_follow_the_backend():
    serve = HEAD + '\n[serve]\nbackend = "{}"\nmax_model_len = 2048\nenforce_eager = true\n'
    assert schema_accepts(serve.format("vllm"))
    assert not schema_accepts(serve.format("ort"))


def test_each_naming_key_is_an_enum_of_the_registered_backends():
    backends = registry.all_backends()
    defs = SCHEMA["$defs"]
    tables = {"compress": "CompressStep", "draft": "CompressStep", "eval": "EvalItem", "export": "ExportSection", "serve": "ServeSection"}
    for section, key, kind, _ in BACKEND_SECTIONS:
        table = defs[tables[section]]
        named = table["properties"][key]
        several = [] if kind != "serve" else ["#/$defs/ServeEngines"]  # [serve] backend may list several engines
        if several:
            named, listed = named["anyOf"]
            assert listed["type"] == "array" and listed["items"]["enum"] == sorted(backends[kind])
        assert named["enum"] == sorted(backends[kind])
        assert [b["$ref"] for b in table["oneOf"]] == [f"#/$defs/{kind}.{name}" for name in sorted(backends[kind])] + several


def test_options_carry_description_type_enum_and_default():
    from llmopt.backends.compress.gptq import GPTQOptions

    props = SCHEMA["$defs"]["compress.gptq"]["properties"]
    assert props["group_size"]["description"] == GPTQOptions.model_fields["group_size"].description
    assert props["group_size"]["type"] == "integer" and props["group_size"]["minimum"] == 8
    assert props["scheme"]["enum"] == ["W4A16", "W8A16", "W8A8"] and props["scheme"]["default"] == "W4A16"
    serve = SCHEMA["$defs"]["serve.vllm"]["properties"]
    assert {"backend", "max_model_len", "workload", "slo", "max_num_seqs"} <= set(serve)


def test_cli_prints_the_schema(capsys):
    assert main(["schema"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(SCHEMA))


# two backends' nested models that pydantic names alike ("Layer")
LayerA = create_model("Layer", name=(str, Field(description="A layer's name.")))
LayerB = create_model("Layer", count=(int, Field(description="A count.")))


class ToyAOptions(Options):
    layers: list[LayerA] = Field(default_factory=list, description="Layers (a nested model: lands in $defs).")


class ToyBOptions(Options):
    layers: list[LayerB] = Field(default_factory=list, description="Layers of another shape, under the same name.")


def test_third_party_backends_appear_with_their_defs_kept_apart(monkeypatch):
    registry.all_backends()
    monkeypatch.setitem(registry._REGISTRY, "compress", dict(registry._REGISTRY["compress"]))
    for name, options in (("toy_a", ToyAOptions), ("toy_b", ToyBOptions)):
        cls = type(name, (CompressBackend,), {"Options": options, "check": None, "run": None, "produces": None,
                                              "__module__": __name__})
        registry.register("compress", name)(cls)
    schema = api.json_schema()
    assert {"toy_a", "toy_b"} <= set(schema["$defs"]["CompressStep"]["properties"]["method"]["enum"])
    assert {"compress.toy_a.Layer", "compress.toy_b.Layer"} <= set(schema["$defs"])
    assert schema["$defs"]["compress.toy_a"]["description"] == sys.modules[__name__].__doc__.strip()
    toy = HEAD + '\n[[compress]]\nmethod = "toy_{}"\nlayers = [{{ {} }}]\n'
    assert schema_accepts(toy.format("a", 'name = "x"'), schema)
    assert schema_accepts(toy.format("b", "count = 2"), schema)
    assert not schema_accepts(toy.format("a", "count = 2"), schema)
    assert not schema_accepts(toy.format("b", 'name = "x"'), schema)


# Recipes the schema and the loader must judge alike (the loader is the truth).
AGREE = {
    "minimal": HEAD,
    "gptq group_size": gptq("group_size = 64"),
    "gptq typo": gptq("group_sizee = 64"),
    "gptq perplexity key": gptq("window = 64"),
    "gptq below minimum": gptq("group_size = 4"),
    "gptq bad scheme": gptq('scheme = "W3A16"'),
    "W8A8 with group_size (a plan-time check, not a load error)": gptq('scheme = "W8A8"\ngroup_size = 64'),
    "unknown method": HEAD + '\n[[compress]]\nmethod = "gptqq"\n',
    "missing method": HEAD + "\n[[compress]]\nbits = 4\n",
    "prune then gptq": HEAD + '\n[[compress]]\nmethod = "prune_depth"\nfraction = 0.25\n\n'
                       '[[compress]]\nmethod = "gptq"\n',
    "export omitted format": HEAD + "\n[export]\n",
    "export hf with an onnx key": HEAD + '\n[export]\nprecision = "int4"\n',
    "export onnx": HEAD + '\n[export]\nformat = "onnx"\nprecision = "int4"\nexecution_provider = "cpu"\n',
    "export onnx typo": HEAD + '\n[export]\nformat = "onnx"\nprecison = "int4"\n',
    "export unknown format": HEAD + '\n[export]\nformat = "gguf"\n',
    "perplexity window": HEAD + '\n[[eval]]\nname = "p"\nkind = "perplexity"\nwindow = 128\n',
    "multiple_choice window": HEAD + '\n[[eval]]\nname = "m"\nkind = "multiple_choice"\nwindow = 128\n',
    "lm_eval with task": HEAD + '\n[[eval]]\nname = "arc"\nkind = "lm_eval"\ntask = "arc_easy"\nmax_drop = 0.02\n',
    "lm_eval without task": HEAD + '\n[[eval]]\nname = "arc"\nkind = "lm_eval"\n',
    "eval without name": HEAD + '\n[[eval]]\nkind = "perplexity"\n',
    "eval bad name": HEAD + '\n[[eval]]\nname = "two words"\nkind = "perplexity"\n',
    "eval confidence 1": HEAD + '\n[[eval]]\nname = "p"\nkind = "perplexity"\nconfidence = 1.0\n',
    "vllm max_num_seqs": HEAD + '\n[serve]\nbackend = "vllm"\nmax_num_seqs = 32\nworkload = { concurrency = 8 }\n',
    "ort max_num_seqs": HEAD + '\n[serve]\nbackend = "ort"\nmax_num_seqs = 32\n',
    "ort enforce_eager": HEAD + '\n[serve]\nbackend = "ort"\nenforce_eager = true\n',
    "serve workload typo": HEAD + '\n[serve]\nbackend = "vllm"\nworkload = { concurency = 8 }\n',
    "serve without backend": HEAD + "\n[serve]\nmax_model_len = 2048\n",
    "serve two engines": HEAD + '\n[serve]\nbackend = ["vllm", "sglang"]\nenforce_eager = true\n\n'
                         '[serve.sglang]\ngpu_memory_utilization = 0.8\n',
    "serve a list of one engine": HEAD + '\n[serve]\nbackend = ["vllm"]\nenforce_eager = true\n',
    "serve an engine listed twice": HEAD + '\n[serve]\nbackend = ["vllm", "vllm"]\n',
    "serve an unknown engine listed": HEAD + '\n[serve]\nbackend = ["vllm", "vlm"]\n',
    "serve two engines, a key of none": HEAD + '\n[serve]\nbackend = ["vllm", "sglang"]\nwindow = 64\n',
    "serve two engines, a table key of another": HEAD + '\n[serve]\nbackend = ["vllm", "sglang"]\n\n'
                                                 '[serve.sglang]\nenforce_eager = true\n',
    "recipe bad name": HEAD.replace('"case"', '"-case"'),
    "unknown top-level key": HEAD + "\n[extras]\nx = 1\n",
    "missing model": 'schema_version = 1\nname = "case"\n',
}


@pytest.mark.parametrize("text", AGREE.values(), ids=AGREE.keys())
def test_schema_and_loader_agree(text):
    assert schema_accepts(text) == loader_accepts(text)


def test_agreement_cases_cover_both_verdicts():
    verdicts = [loader_accepts(text) for text in AGREE.values()]
    assert 5 <= sum(verdicts) <= len(verdicts) - 5


# Where they differ, and why (see llmopt/recipe/jsonschema.py): the schema is looser where a rule
# is Python code (a validator), and stricter where pydantic's lax mode coerces a value's type.
DIFFER = {
    "onnx trt_profile out of order (a field_validator)": (
        HEAD + '\n[export]\nformat = "onnx"\nexecution_provider = "NvTensorRtRtx"\ntrt_profile = [512, 256, 1]\n',
        False, True),
    "group_size as a string (coerced by pydantic)": (gptq('group_size = "64"'), True, False),
    "a [serve] key only an engine not listed takes (the loader knows which are listed)": (
        HEAD + '\n[serve]\nbackend = ["vllm", "sglang"]\nprovider = "cpu"\n', False, True),
}


@pytest.mark.parametrize("text,loader,schema", DIFFER.values(), ids=DIFFER.keys())
def test_known_differences(text, loader, schema):
    assert (loader_accepts(text), schema_accepts(text)) == (loader, schema)
