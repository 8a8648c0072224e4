"""Engine configs as the engines read them: user extras merged into what the planner computed (deep, refused
where they contradict it unless the recipe says which wins, parallel sizes carried into every file that
reserves GPUs), unknown keys refused for every engine whose config refuses them, SGLang's MoE and
quantization flags as SGLang 0.5.23 defines them, ONNX Runtime configs that keep the export's execution
provider, and the served model name. Each test is one defect of issue 15 ("Deploy configs a platform
engineer would ship"); configs are rendered from config.json-only models (the planner never reads weights)."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
import yaml

from llmopt import api, registry
from llmopt.backends.base import StageContext
from llmopt.errors import StageFailed

from conftest import write_recipe

# 9 heads over 3 KV heads: tensor parallel 1 and 3 split it, 2 does not
DEMO = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 576, "intermediate_size": 1536,
    "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
    "tie_word_embeddings": True, "max_position_embeddings": 8192, "torch_dtype": "bfloat16",
}
# a small Mixtral-shaped MoE: 8 experts, 2 per token
MOE = {
    "model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "hidden_size": 1024, "intermediate_size": 3584,
    "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 8, "num_local_experts": 8,
    "num_experts_per_tok": 2, "vocab_size": 32000, "max_position_embeddings": 32768, "torch_dtype": "bfloat16",
}
RECIPE = """schema_version = 1
name = "demo"
[model]
source = "{source}"
[target]
{target}
[serve]
backend = "{engine}"
max_model_len = {max_model_len}
workload = {{ input_len = 512, output_len = 128, concurrency = 16 }}
{serve}
"""
H100x4 = 'gpu = "H100-SXM-80GB"\ncount = 4'


def model_folder(tmp_path: Path, config: dict, quant: dict | None = None) -> Path:
    folder = tmp_path / "model"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config | ({"quantization_config": quant} if quant else {})))
    (folder / "model.safetensors").write_bytes(b"not really weights")  # the planner never reads weights
    return folder


def planned(tmp_path: Path, engine: str, serve: str = "", config: dict = DEMO, target: str = H100x4,
            quant: dict | None = None, max_model_len: int = 4096):
    source = model_folder(tmp_path, config, quant)
    recipe = write_recipe(tmp_path, RECIPE.format(source=source, target=target, engine=engine, serve=serve,
                                                  max_model_len=max_model_len))
    return api.plan(recipe), source


def plan_errors(tmp_path: Path, engine: str, serve: str = "", **kw) -> list[str]:
    return [f"{p.message} | {p.hint}" for p in planned(tmp_path, engine, serve, **kw)[0].errors]


def render(tmp_path: Path, engine: str, serve: str = "", weights: bool = True, **kw) -> tuple[dict, Path]:
    """The serve backend's render on the config-only model; the plan must be clean. ``weights=False``: the
    placeholder weights file is removed after planning, so the render sizes the model from its config."""
    plan, source = planned(tmp_path, engine, serve, **kw)
    assert not plan.errors, [p.message for p in plan.errors]
    if not weights:
        (source / "model.safetensors").unlink()
    out = tmp_path / "deploy"
    out.mkdir()
    ctx = StageContext(name=f"deploy.{engine}", out_dir=out, inputs={"model": source},
                       input_manifests={"model": {"outputs": {"model_dir": str(source)}}}, recipe=plan.recipe,
                       log=logging.getLogger("llmopt.test"), model=plan.model, gpu=plan.gpu)
    return registry.get("serve", engine)().render(plan.recipe.options_for("serve", None), ctx), out


def reserved_gpus(folder: Path) -> tuple[int, int]:
    """GPUs docker-compose.yaml and kubernetes.yaml reserve for one replica."""
    compose = yaml.safe_load((folder / "docker-compose.yaml").read_text())
    service = next(iter(compose["services"].values()))
    count = service["deploy"]["resources"]["reservations"]["devices"][0]["count"]
    deployment = next(yaml.safe_load_all((folder / "kubernetes.yaml").read_text()))
    limits = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    return count, limits["nvidia.com/gpu"]


# 1. `config | extra` is a shallow merge that drops what the planner computed

def test_trtllm_nested_extra_keeps_the_planned_kv_cache_config(tmp_path):
    _, folder = render(tmp_path, "trtllm", 'extra = { kv_cache_config = { dtype = "fp8" } }')
    kv = yaml.safe_load((folder / "config.yaml").read_text())["kv_cache_config"]
    assert kv["dtype"] == "fp8"
    assert 0.05 <= kv["free_gpu_memory_fraction"] <= 0.95 and kv["enable_block_reuse"] is True


def test_an_extra_that_contradicts_a_planned_value_is_refused(tmp_path):
    [error] = plan_errors(tmp_path, "vllm", 'extra_args = { "tensor-parallel-size" = 3 }')
    assert "tensor-parallel-size = 3 contradicts the planned 1" in error
    assert 'override = ["tensor-parallel-size"]' in error and "tensor_parallel_size" in error
    [error] = plan_errors(tmp_path, "trtllm", "extra = { kv_cache_config = { free_gpu_memory_fraction = 0.5 } }")
    assert "kv_cache_config.free_gpu_memory_fraction = 0.5 contradicts the planned" in error


def test_an_extra_equal_to_the_planned_value_needs_no_override(tmp_path):
    deploy, _ = render(tmp_path, "vllm", 'extra_args = { "tensor-parallel-size" = 1, "block-size" = 32 }')
    assert deploy["args"]["tensor-parallel-size"] == 1 and deploy["args"]["block-size"] == 32


def test_override_carries_parallel_sizes_into_every_file_that_reserves_gpus(tmp_path):
    deploy, folder = render(tmp_path, "vllm", 'extra_args = { "tensor-parallel-size" = 3 }\n'
                                              'override = ["tensor-parallel-size"]')
    assert yaml.safe_load((folder / "config.yaml").read_text())["tensor-parallel-size"] == 3
    assert deploy["memory"]["tensor_parallel_size"] == 3  # the memory model planned with the size that wins
    assert reserved_gpus(folder) == (3, 3)


@pytest.mark.parametrize("engine, serve, gpus", [
    ("sglang", 'extra_args = { "tensor-parallel-size" = 3 }\noverride = ["tp-size"]', 3),  # an alias of --tp-size
    ("trtllm", 'extra = { tensor_parallel_size = 3 }\noverride = ["tensor_parallel_size"]', 3),
    ("trtllm", "extra = { context_parallel_size = 2 }", 2),  # not planned: no override, but it takes GPUs
    ("vllm", 'extra_args = { "data_parallel_size" = 2 }\noverride = ["data-parallel-size"]', 2),
])
def test_parallel_extras_reserve_their_gpus(tmp_path, engine, serve, gpus):
    deploy, folder = render(tmp_path, engine, serve)
    assert reserved_gpus(folder) == (gpus, gpus) and deploy["gpus"] == gpus
    if engine == "sglang":
        assert deploy["args"]["tp-size"] == 3 and "tensor-parallel-size" not in deploy["args"]


def test_extras_that_take_more_gpus_than_the_target_has_are_refused(tmp_path):
    errors = plan_errors(tmp_path, "trtllm", "extra = { context_parallel_size = 8 }")
    assert any("8 GPUs" in e and "[target] count is 4" in e for e in errors), errors


def test_override_of_a_key_the_extras_do_not_set_is_refused(tmp_path):
    [error] = plan_errors(tmp_path, "vllm", 'override = ["tensor-parallel-sise"]')
    assert "override names 'tensor-parallel-sise'" in error and "extra_args" in error


def test_trtllm_override_of_a_nested_value(tmp_path):
    _, folder = render(tmp_path, "trtllm", "extra = { kv_cache_config = { free_gpu_memory_fraction = 0.5 } }\n"
                                           'override = ["kv_cache_config.free_gpu_memory_fraction"]')
    kv = yaml.safe_load((folder / "config.yaml").read_text())["kv_cache_config"]
    assert kv == {"free_gpu_memory_fraction": 0.5, "enable_block_reuse": True}


def test_vllm_negated_flags_meet_the_planned_one(tmp_path):
    [error] = plan_errors(tmp_path, "vllm", 'extra_args = { "no-enable-prefix-caching" = true }')
    assert "enable-prefix-caching = false contradicts the planned true" in error
    deploy, _ = render(tmp_path, "vllm", 'extra_args = { "no-enable-prefix-caching" = true }\n'
                                         'override = ["enable-prefix-caching"]')
    assert deploy["args"]["enable-prefix-caching"] is False and "no-enable-prefix-caching" not in deploy["args"]
    deploy, _ = render(tmp_path / "other", "vllm", 'extra_args = { "disable-custom-all-reduce" = true }')
    assert deploy["args"]["disable-custom-all-reduce"] is True  # not planned: written as given (it has no --no- form)


# 2. TensorRT-LLM: an unknown key in the YAML is only a warning; BaseLlmArgs forbids extra keys

@pytest.mark.parametrize("extra, key", [
    ("max_batch_sise = 8", "max_batch_sise"),
    ("kv_cache_config = { free_gpu_memory_fractio = 0.5 }", "kv_cache_config.free_gpu_memory_fractio"),
])
def test_trtllm_unknown_keys_are_plan_errors(tmp_path, extra, key):
    errors = plan_errors(tmp_path, "trtllm", f"extra = {{ {extra} }}")
    assert any(f"unknown option {key!r}" in e for e in errors), errors


def test_trtllm_known_keys_outside_what_llmopt_writes_pass(tmp_path):
    serve = ('extra = { enable_iter_perf_stats = true, scheduler_config = '
             '{ capacity_scheduler_policy = "MAX_UTILIZATION" } }')
    plan, _ = planned(tmp_path, "trtllm", serve)
    assert not [p for p in plan.problems if p.where.endswith("extra")], plan.problems
    deploy, _ = render(tmp_path / "again", "trtllm", serve)
    assert deploy["validated_by"] == "flag table trtllm 1.2.1" and deploy["warnings"] == []


# 3. SGLang, MoE with data parallelism: --ep-size is set to tp x dp

def test_sglang_expert_parallelism_stays_inside_the_tensor_parallel_group(tmp_path):
    deploy, _ = render(tmp_path, "sglang", "data_parallel_size = 2", config=MOE, target='gpu = "H100"\ncount = 2')
    args = deploy["args"]
    assert args["tp-size"] == 1 and args["dp-size"] == 2 and "ep-size" not in args
    deploy, _ = render(tmp_path / "tp", "sglang", "tensor_parallel_size = 2", config=MOE,
                       target='gpu = "H100"\ncount = 2')
    assert deploy["args"]["tp-size"] == 2 and deploy["args"]["ep-size"] == 2


# 4. SGLang: every ModelOpt algorithm without "FP4" in its name gets --quantization modelopt_fp8

@pytest.mark.parametrize("algo, method", [
    ("FP8", "modelopt_fp8"), ("NVFP4", "modelopt_fp4"), ("W4A16_NVFP4", "modelopt_fp4"), ("MXFP8", "mxfp8"),
])
def test_sglang_quantization_flag_per_modelopt_algorithm(tmp_path, algo, method):
    quant = {"quant_method": "modelopt", "quant_algo": algo}
    deploy, _ = render(tmp_path, "sglang", quant=quant, target='gpu = "B200"')
    assert deploy["args"]["quantization"] == method


def test_sglang_mixed_precision_follows_its_layers(tmp_path):
    quant = {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
             "quantized_layers": {"model.layers.0.mlp": {"quant_algo": "NVFP4"}}}
    deploy, _ = render(tmp_path, "sglang", quant=quant, target='gpu = "B200"')
    assert deploy["args"]["quantization"] == "modelopt_mixed"


@pytest.mark.parametrize("algo", ["W4A16_AWQ", "W4A8_AWQ", "W8A8_SQ_PER_CHANNEL", "FP8_PB_WO"])
def test_sglang_refuses_modelopt_algorithms_it_cannot_load(tmp_path, algo):
    quant = {"quant_method": "modelopt", "quant_algo": algo}
    errors = plan_errors(tmp_path, "sglang", quant=quant)
    assert any(f"quant_algo {algo}" in e and "SGLang 0.5.23" in e for e in errors), errors


# 6. ONNX Runtime: the overlay replaces the export's provider_options; the EP comes from [target]

def onnx_model(tmp_path: Path, providers: list) -> Path:
    folder = tmp_path / "onnx"
    folder.mkdir()
    config = {"model": {"context_length": 2048, "decoder": {"session_options": {"provider_options": providers},
                                                             "filename": "model.onnx", "num_hidden_layers": 2}},
              "search": {"max_length": 2048}}
    (folder / "genai_config.json").write_text(json.dumps(config))
    return folder


def render_ort(tmp_path: Path, model: Path, serve: str = "", target: str = 'gpu = "L4"', recipe: str = RECIPE):
    recipe = write_recipe(tmp_path, recipe.format(source=model, target=target, engine="ort", serve=serve,
                                                  max_model_len=4096))
    plan = api.plan(recipe)  # its own check says ort needs [export] format = "onnx"; render is what is tested
    out = tmp_path / "deploy"
    out.mkdir()
    ctx = StageContext(name="deploy.ort", out_dir=out, inputs={"model": model},
                       input_manifests={"model": {"outputs": {"model_dir": str(model), "format": "onnx"}}},
                       recipe=plan.recipe, log=logging.getLogger("llmopt.test"), model=plan.model, gpu=plan.gpu)
    return registry.get("serve", "ort")().render(plan.recipe.options_for("serve", None), ctx), out


def test_ort_keeps_the_exports_provider_options(tmp_path):
    model = onnx_model(tmp_path, [{"cuda": {"enable_cuda_graph": "1"}}])
    deploy, folder = render_ort(tmp_path, model, "intra_op_num_threads = 2")
    session = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]["session_options"]
    assert session["provider_options"] == [{"cuda": {"enable_cuda_graph": "1"}}]
    assert session["intra_op_num_threads"] == 2 and deploy["provider"] == "cuda"


def test_ort_serves_a_cpu_graph_on_the_cpu_even_with_a_gpu_target(tmp_path):
    deploy, folder = render_ort(tmp_path, onnx_model(tmp_path, []))
    assert deploy["provider"] == "cpu"
    session = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]["session_options"]
    assert session["provider_options"] == []
    assert "--device" not in (folder / "launch.sh").read_text()


def test_a_cuda_graph_is_served_on_the_gpu_by_its_launch_script_and_by_default(tmp_path):
    """llmopt serve opened every ONNX model on the CPU EP unless told otherwise (``--device cpu`` cleared the
    graph's providers), so the launch script of a graph built for the CUDA EP served it on the CPU."""
    from llmopt.server.model import serving_device

    model = onnx_model(tmp_path, [{"cuda": {}}])
    _, folder = render_ort(tmp_path, model)
    assert (folder / "launch.sh").read_text().splitlines()[-1].count("--device cuda") == 1
    assert serving_device("auto", model, "onnx") == "cuda"
    assert serving_device("cpu", model, "onnx") == "cpu"  # asked for: the CPU EP
    cpu = tmp_path / "cpu"
    cpu.mkdir()
    assert serving_device("auto", onnx_model(cpu, []), "onnx") == "cpu"


def test_ort_refuses_a_provider_the_graph_was_not_built_for(tmp_path):
    with pytest.raises(StageFailed, match="built for the cpu execution provider"):
        render_ort(tmp_path, onnx_model(tmp_path, []), 'provider = "cuda"')
    body = RECIPE.format(source=tmp_path, target='gpu = "L4"', engine="ort", serve='provider = "cuda"',
                         max_model_len=4096)
    recipe = write_recipe(tmp_path, body.replace("[target]", '[export]\nformat = "onnx"\n[target]'))
    messages = [p.message for p in api.plan(recipe).errors]
    assert any('provider "cuda"' in m and 'execution_provider = "cpu"' in m for m in messages), messages


def launch_flag(folder: Path, flag: str) -> int:
    """The value launch.sh's command gives ``flag`` (the last one wins, as in llmopt serve)."""
    return int(re.findall(rf"{flag} (\d+)", (folder / "launch.sh").read_text().splitlines()[-1])[-1])


def test_ort_launch_script_holds_a_load_generators_sweep(tmp_path):
    """GuideLLM's default sweep keeps up to 512 requests in flight: launch.sh's queue (it was 16) plus the
    requests it generates at once must hold them, or the sweep records 429s as errors. The rule is llmopt
    serve's own (--max-queue when not given): 512, or the workload's concurrency when more."""
    from llmopt.catalog.engines import SWEEP_QUEUE, queue_for

    deploy, folder = render_ort(tmp_path, onnx_model(tmp_path, []))  # [serve] workload concurrency 16
    in_flight = launch_flag(folder, "--max-queue") + launch_flag(folder, "--parallel")
    assert SWEEP_QUEUE == 512 and in_flight >= 512 and launch_flag(folder, "--max-queue") == queue_for(16) == 512
    assert "--max-queue 512" in deploy["command"]
    big = tmp_path / "big"
    big.mkdir()
    recipe = RECIPE.replace("concurrency = 16", "concurrency = 1000")
    deploy, folder = render_ort(big, onnx_model(big, []), recipe=recipe)
    assert launch_flag(folder, "--max-queue") == queue_for(1000) == 1000
    mine = tmp_path / "mine"
    mine.mkdir()
    _, folder = render_ort(mine, onnx_model(mine, []), "max_queue = 4")  # the recipe's own value stays
    assert launch_flag(folder, "--max-queue") == 4


def test_ort_batching_is_off_unless_the_recipe_sets_it_and_never_beside_workers(tmp_path):
    """llmopt serve --max-num-seqs: absent from launch.sh by default (on a CPU the engine batches statically,
    which loses with mixed lengths), written when the recipe sets max_num_seqs; with parallel > 1 a plan error."""
    _, folder = render_ort(tmp_path, onnx_model(tmp_path, []))
    assert "--max-num-seqs" not in (folder / "launch.sh").read_text()
    mine = tmp_path / "mine"
    mine.mkdir()
    deploy, folder = render_ort(mine, onnx_model(mine, []), "max_num_seqs = 4")
    assert launch_flag(folder, "--max-num-seqs") == 4 and "--max-num-seqs 4" in deploy["command"]
    body = RECIPE.format(source=tmp_path, target='gpu = "L4"', engine="ort", serve="max_num_seqs = 4\nparallel = 2",
                         max_model_len=4096)
    recipe = write_recipe(tmp_path, body.replace("[target]", '[export]\nformat = "onnx"\n[target]'))
    problems = [(p.message, p.where) for p in api.plan(recipe).errors]
    assert any("batches requests in one copy" in m and "max_num_seqs" in w for m, w in problems), problems


# 7. trtllm-serve gets no served model name: clients must send model="/artifact/model"

@pytest.mark.parametrize("engine", ["vllm", "trtllm", "sglang"])
def test_every_engine_serves_the_recipe_name(tmp_path, engine):
    deploy, folder = render(tmp_path, engine)
    assert deploy["served_model_name"] == "demo"
    compose = yaml.safe_load((folder / "docker-compose.yaml").read_text())
    service = compose["services"]["demo"]
    if engine == "trtllm":  # trtllm-serve 1.2.1 names a local model folder by its basename
        assert "../../model:/models/demo:ro" in service["volumes"]
        assert service["command"][:2] == ["trtllm-serve", "/models/demo"]
        deployment = next(yaml.safe_load_all((folder / "kubernetes.yaml").read_text()))
        mounts = deployment["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
        assert {"name": "artifact", "mountPath": "/models/demo", "subPath": "model", "readOnly": True} in mounts
        assert "ln -s" in (folder / "launch.sh").read_text() and "/demo" in (folder / "launch.sh").read_text()


# issue 14, item 1: limits no worse than the engines' own defaults, each other value with its reason

LLAMA_8B = dict(DEMO, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False, max_position_embeddings=131072)


def comments(path: Path) -> dict[str, str]:
    """The comment line above each key of a config file (``# key: why``)."""
    return {line[2:].split(":", 1)[0]: line[2:] for line in path.read_text().splitlines() if line.startswith("# ")
            and ":" in line and " " not in line[2:].split(":", 1)[0]}


def test_demo_model_on_an_h200_is_configured_at_the_engine_defaults(tmp_path):
    target = 'gpu = "H200"'
    vllm = render(tmp_path / "v", "vllm", target=target)[1] / "config.yaml"
    config, notes = yaml.safe_load(vllm.read_text()), comments(vllm)
    assert (config["max-num-seqs"], config["max-num-batched-tokens"], config["gpu-memory-utilization"]) == \
        (1024, 8192, 0.92)
    assert notes["max-num-seqs"] == "max-num-seqs: vLLM 0.33.0's own default on H200"
    assert notes["gpu-memory-utilization"] == "gpu-memory-utilization: vLLM 0.33.0's own default on H200"
    trt = render(tmp_path / "t", "trtllm", target=target)[1] / "config.yaml"
    config, notes = yaml.safe_load(trt.read_text()), comments(trt)
    assert (config["max_batch_size"], config["max_num_tokens"]) == (2048, 8192)
    assert config["cuda_graph_config"]["max_batch_size"] == 128  # TensorRT-LLM's own graph limit
    assert notes["max_num_tokens"] == "max_num_tokens: TensorRT-LLM 1.2.1's own default on H200"
    assert config["kv_cache_config"]["free_gpu_memory_fraction"] == 0.9
    assert notes["kv_cache_config.free_gpu_memory_fraction"] == \
        "kv_cache_config.free_gpu_memory_fraction: TensorRT-LLM 1.2.1's own default"
    result, folder = render(tmp_path / "s", "sglang", target=target)
    assert (result["args"]["max-running-requests"], result["args"]["chunked-prefill-size"]) == (4096, 8192)
    script = (folder / "launch.sh").read_text()
    assert "# max-running-requests: SGLang 0.5.23's own default on H200 with a KV pool of" in script
    # SGLang's own on an H200 (143,155 MiB): a reserve of 512 + 8192 x 1.5 + 256 x 2 + 128 = 13,440 MiB
    assert result["args"]["mem-fraction-static"] == round(1 - 13440 / (139.8 * 1024), 3) == 0.906
    assert "# mem-fraction-static: SGLang 0.5.23's own default on H200" in script


@pytest.mark.parametrize("engine, seqs, batched, where", [
    ("vllm", "max-num-seqs", "max-num-batched-tokens", "config.yaml"),
    ("trtllm", "max_batch_size", "max_num_tokens", "config.yaml"),
    ("sglang", "max-running-requests", "chunked-prefill-size", "launch.sh")])
def test_llama_8b_at_8k_on_an_h100_lowers_only_what_the_kv_cache_or_the_slo_asks(tmp_path, engine, seqs, batched,
                                                                                 where):
    result, folder = render(tmp_path, engine, config=LLAMA_8B, target='gpu = "H100-SXM-80GB"', max_model_len=8192,
                            serve="slo = { tpot_p99_ms = 50 }")
    assert result["memory"]["max_model_len"] == 8192
    text = (folder / where).read_text()
    args = result["args"]
    assert args[batched] < 8192  # the engines' 8192 would make a decode step take ~0.2 s
    assert f"# {batched}: serve.slo.tpot_p99_ms = 50: a step with a prefill chunk of 8,192 tokens" in text
    assert args[seqs] == result["memory"]["engine_defaults"]["max_num_seqs"] or f"# {seqs}: " in text


def test_the_card_of_an_ort_artifact_launches_with_its_script(tmp_path):
    """`llmopt serve .` alone reads model/genai_config.json, not deploy/ort/genai_config.json with the recipe's (or
    the tuner's) session options, which launch.sh applies: the artifact's card leads with the script."""
    from llmopt.artifacts.reports import launch_markdown

    deploy, folder = render_ort(tmp_path, onnx_model(tmp_path, []), "intra_op_num_threads = 2")
    session = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]["session_options"]
    assert session["intra_op_num_threads"] == 2 and "intra_op" not in deploy["command"]
    text = "\n".join(launch_markdown(deploy))
    assert text.index("```sh\ndeploy/ort/launch.sh\n```") < text.index(deploy["command"])
    vllm = {"command": "vllm serve ./model --config ./deploy/vllm/config.yaml", "served_model_name": "demo"}
    assert launch_markdown(vllm)[:5] == ["## Launch", "", "```sh", vllm["command"], "```"]  # the command is whole
