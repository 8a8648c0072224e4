"""The compress stage's placement, planned from config files alone: which placement a model and machine
get, the refusal of what fits nowhere, and the MoE calibration warning."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from llmopt import api, registry

from llmopt.model import placement
from llmopt.catalog.gpus import find_gpu
from llmopt.model.modelinfo import from_config

from conftest import write_recipe

CONFIGS = Path(__file__).parent / "data" / "configs"
GIB = 2**30
LLAMA_8B = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
            "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "vocab_size": 49152, "tie_word_embeddings": False}


def info_of(name: str):
    config = LLAMA_8B if name == "llama-8b" else json.loads((CONFIGS / f"{name}.json").read_text())
    return from_config(config)


def work(method: str, samples: int = 128, seq_len: int = 512) -> placement.Work:
    calibrates = method != "fp8"
    return placement.Work("bfloat16", calibrates, method == "gptq", samples if calibrates else 0,
                          seq_len if calibrates else 0)


@pytest.mark.parametrize("model, method, gpu, count, host_gib, expected", [
    ("llama-8b", "gptq", "H100", 1, 64, "gpu"),
    ("llama-8b", "gptq", "T4", 1, 64, "onload"),  # 14 GiB of weights and GPTQ's work exceed a T4
    ("qwen3-30b-a3b", "fp8", "H200", 1, 128, "gpu"),
    ("qwen3-30b-a3b", "gptq", "H100", 2, 256, "onload"),
    ("gemma-3-27b-it", "gptq", "H100", 1, 128, "gpu"),
    ("gpt-oss-20b", "fp8", "H100", 1, 256, "onload"),
    ("mixtral-8x7b", "gptq", "H200", 1, 512, "onload"),
    ("mixtral-8x7b", "fp8", "H100", 8, 256, "multi_gpu"),  # too little host memory to onload
    ("mixtral-8x7b", "gptq", "H200", 1, 128, None),  # nothing fits
    ("deepseek-r1", "gptq", "H200", 8, 1024, None),
])
def test_placement_choice(model, method, gpu, count, host_gib, expected):
    machine = placement.Machine(find_gpu(gpu), count, host_gib * GIB, None)
    chosen, tried = placement.choose(info_of(model), work(method), machine)
    assert (chosen.placement if chosen.fits else None) == expected, [(fp.placement, fp.short) for fp in tried]
    assert ("multi_gpu" in [fp.placement for fp in tried]) == (count > 1)


def test_measured_shapes_predictions():
    """The H200 runs of docs/results/suite.md: the 8B shape's peaks as measured there (GiB), within 5%."""
    machine = placement.Machine(find_gpu("H200"), 1, 125 * GIB, None)
    info = info_of("llama-8b")
    measured = {("fp8", "gpu"): 13.88, ("fp8", "onload"): 0.94, ("gptq", "gpu"): 17.25, ("gptq", "onload"): 3.75}
    for (method, where), gib in measured.items():
        fp = placement.footprint(info, work(method, 16, 512), machine, where)
        assert abs(fp.gpu_bytes / GIB / gib - 1) < 0.05, (method, where, fp.gpu_bytes / GIB)


def test_onload_needs_host_memory_for_the_weights():
    machine = placement.Machine(find_gpu("H200"), 1, 8 * GIB, None)
    fp = placement.footprint(info_of("llama-8b"), work("gptq"), machine, "onload")
    assert not fp.fits and "host memory" in fp.short[0]


def plan_for(tmp_path, model: str, compute: str, method: str = "gptq", calibration: str = ""):
    folder = tmp_path / model
    folder.mkdir(parents=True)
    shutil.copy(CONFIGS / f"{model}.json", folder / "config.json")
    body = (f'schema_version = 1\nname = "t"\n[model]\nsource = "{folder}"\n{calibration}\n'
            f'[[compress]]\nmethod = "{method}"\n[compute]\n{compute}\n')
    return api.plan(write_recipe(tmp_path, body))


def test_plan_shows_the_placement(tmp_path):
    plan = plan_for(tmp_path, "qwen3-30b-a3b", 'gpu = "H200"\nhost_ram_gib = 128\ndisk_gib = 500', "fp8")
    entry = plan.estimates["compress_placement"]
    assert entry["chosen"] == "gpu" and set(entry["placements"]) == {"gpu", "onload"}
    assert entry["placements"]["gpu"]["time_class"] and entry["placements"]["gpu"]["gpu_bytes"] > 100 * GIB
    assert not [p for p in plan.problems if p.where.endswith("compute.placement")]


def test_plan_refuses_what_does_not_fit(tmp_path):
    plan = plan_for(tmp_path, "mixtral-8x7b", 'gpu = "H100"\nhost_ram_gib = 64\ndisk_gib = 500')
    [problem] = [p for p in plan.errors if p.where.endswith("compute.placement")]
    assert "does not fit" in problem.message and "onload:" in problem.message and "host memory" in problem.message
    assert "compute.count" in problem.hint and "calibration" in problem.hint
    assert plan.estimates["compress_placement"]["chosen"] is None


def test_plan_refuses_a_forced_placement_that_does_not_fit(tmp_path):
    plan = plan_for(tmp_path, "gemma-3-27b-it", 'gpu = "L4"\nhost_ram_gib = 256\nplacement = "gpu"', "fp8")
    [problem] = [p for p in plan.errors if p.where.endswith("compute.placement")]
    assert "gpu: " in problem.message and "usable of one L4" in problem.message


def test_plan_refuses_a_short_disk(tmp_path):
    plan = plan_for(tmp_path, "gemma-3-27b-it", 'gpu = "H200"\nhost_ram_gib = 256\ndisk_gib = 1', "fp8")
    [problem] = [p for p in plan.errors if p.where.endswith("compute.placement")]
    assert "of disk" in problem.message


def test_unknown_compute_gpu_is_a_recipe_error(tmp_path):
    from llmopt.errors import RecipeError

    with pytest.raises(RecipeError, match="unknown GPU"):
        plan_for(tmp_path, "gemma-3-27b-it", 'gpu = "H300"')


def test_moe_calibration_warning(tmp_path):
    few = plan_for(tmp_path / "a", "mixtral-8x7b", 'gpu = "H200"\nhost_ram_gib = 512',
                   calibration="[calibration]\nsamples = 4\nmax_seq_len = 256")
    [warning] = [p for p in few.problems if p.severity == "warning" and "experts" in p.message]
    assert "8 experts" in warning.message and "56 samples" in warning.hint
    enough = plan_for(tmp_path / "b", "mixtral-8x7b", 'gpu = "H200"\nhost_ram_gib = 512',
                      calibration="[calibration]\nsamples = 64\nmax_seq_len = 256")
    assert not [p for p in enough.problems if "experts" in p.message]


def test_modelopt_moe_warning_counts_routed_tokens():
    info = info_of("mixtral-8x7b")
    w = work("modelopt_fp8", samples=64, seq_len=256)  # 16k tokens: enough through every expert, not routed

    class Loaded:
        @staticmethod
        def where(*keys):
            return ".".join(keys)

    assert not placement.moe_problems(Loaded, info, w, [registry.get("compress", "gptq")])
    [warning] = placement.moe_problems(Loaded, info, w, [registry.get("compress", "modelopt_fp8")])
    assert "routed to each" in warning.message and "4,096" in warning.message
