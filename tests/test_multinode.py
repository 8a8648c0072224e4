"""A replica over several nodes (issue 15, defect 9): Llama-3.1-405B in BF16 and DeepSeek-V3 in FP8 on
2 nodes of 8 H100s plan tensor parallel 8 within a node x pipeline parallel 2 across nodes; each engine
writes its per-node commands (TensorRT-LLM: one MPI world under the leader's mpirun); the LeaderWorkerSet
manifest is checked against the LWS CRD's OpenAPI schema (tests/data/lws/) and its pod templates with
kubernetes-validate (Kubernetes 1.37.0, strict); a tensor parallel size over one node is refused with the
fix; every launch.sh parses in bash; a single-node recipe's files do not change."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from test_deploy_configs import DEMO, plan_errors, planned, render

from llmopt.model import memory
from llmopt.catalog.gpus import get_gpu
from llmopt.errors import UsageError
from llmopt.model.estimates import float_weight_bytes
from llmopt.model.modelinfo import from_config
from llmopt.recipe.schema import Workload

DATA = Path(__file__).parent / "data"
# Llama-3.1-405B's config.json facts (meta-llama/Llama-3.1-405B): 126 layers, hidden 16384, 128 heads over
# 8 KV heads of 128, MLP 53248, vocabulary 128256
LLAMA_405B = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 16384, "intermediate_size": 53248,
    "num_hidden_layers": 126, "num_attention_heads": 128, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 128256, "tie_word_embeddings": False, "max_position_embeddings": 131072, "torch_dtype": "bfloat16",
}
DEEPSEEK_V3 = json.loads((DATA / "configs" / "deepseek-r1.json").read_text())  # the DeepSeek-V3 architecture, FP8
H100 = get_gpu("H100-SXM-80GB")
TWO_NODES = 'gpu = "H100-SXM-80GB"\ncount = 8\nnodes = 2'
ONE_NODE = 'gpu = "H100-SXM-80GB"\ncount = 8'
ENGINES = ["vllm", "sglang"]


def plan_of(config: dict, nodes: int, **kw) -> memory.MemoryPlan:
    info = from_config(config)
    weights = float_weight_bytes(info, 2)
    return memory.plan_memory(info, H100, 8, 4096, Workload(input_len=512, output_len=128, concurrency=16),
                              weight_bytes=weights, nodes=nodes, **kw)


def test_405b_bf16_does_not_fit_one_node_and_the_fix_names_two():
    with pytest.raises(UsageError) as err:
        plan_of(LLAMA_405B, 1)
    assert "does not fit on 8 x H100-SXM-80GB" in err.value.what
    assert "set [target] count = 8 and nodes = 2 (tensor parallel 8 within a node x pipeline parallel 2" \
        in err.value.fix


def test_405b_bf16_on_two_nodes_is_tp8_pp2():
    plan = plan_of(LLAMA_405B, 2)
    assert (plan.tensor_parallel_size, plan.pipeline_parallel_size, plan.nodes) == (8, 2, 2)
    assert plan.weight_bytes_per_gpu * 16 >= plan.weight_bytes  # each GPU holds 1/16 of the weights
    assert plan.weight_bytes_per_gpu > 45 * 2**30 and plan.kv_tokens > 16 * 640


def test_tensor_parallel_over_one_node_is_refused_with_the_fix():
    with pytest.raises(UsageError) as err:
        plan_of(LLAMA_405B, 2, tensor_parallel_size=16, pipeline_parallel_size=1)
    assert "tensor_parallel_size 16 spans more than one node of 8 GPUs" in err.value.what
    assert "set tensor_parallel_size to 8 or less; pipeline parallel splits the layers across the nodes" \
        in err.value.fix


def test_deepseek_v3_fp8_checkpoint_is_counted_in_fp8():
    from llmopt.model.estimates import checkpoint_weights
    stored = checkpoint_weights(DEEPSEEK_V3["quantization_config"], "bfloat16")
    assert stored.bits == 8 and stored.nbytes(7168, 2048) == 7168 * 2048 + 56 * 16 * 4  # codes + a scale per block


def deploy(tmp_path: Path, engine: str, config: dict, target: str = TWO_NODES, serve: str = "") -> tuple[dict, Path]:
    """The serve backend's render for a config-only model folder (no weights: the size model's estimate)."""
    return render(tmp_path, engine, serve, weights=False, config=config, target=target)


MODELS = {"llama-405b-bf16": LLAMA_405B,
          # vLLM and SGLang ship DeepseekV3ForCausalLM: the hub's auto_map (remote code) is not needed
          "deepseek-v3-fp8": {k: v for k, v in DEEPSEEK_V3.items() if k != "auto_map"}}


def strict(schema):
    """The schema with unknown keys refused where it lists properties (the API server would prune them)."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if "properties" in out and not out.get("x-kubernetes-preserve-unknown-fields"):
            out.setdefault("additionalProperties", False)
        return out
    return [strict(v) for v in schema] if isinstance(schema, list) else schema


def check_leader_worker_set(doc: dict) -> None:
    import jsonschema
    import kubernetes_validate
    schema = json.loads((DATA / "lws" / "leaderworkerset-v1.schema.json").read_text())["schema"]
    jsonschema.validate(doc, strict(schema))
    for role in ("leaderTemplate", "workerTemplate"):
        template = doc["spec"]["leaderWorkerTemplate"][role]
        pod = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"x-{role.lower()}"},
               "template": template}
        kubernetes_validate.validate(pod, "1.37.0", strict=True)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("model", MODELS)
def test_two_nodes_plan_tp8_pp2_and_write_a_valid_leader_worker_set(tmp_path, engine, model):
    result, folder = deploy(tmp_path, engine, MODELS[model])
    assert (result["memory"]["tensor_parallel_size"], result["memory"]["pipeline_parallel_size"]) == (8, 2)
    assert result["gpus"] == 16 and result["nodes"] == 2
    lws, service = yaml.safe_load_all((folder / "kubernetes.yaml").read_text())
    assert lws["kind"] == "LeaderWorkerSet" and lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    check_leader_worker_set(lws)
    import kubernetes_validate
    kubernetes_validate.validate(service, "1.37.0", strict=True)
    assert service["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
    for role in ("leaderTemplate", "workerTemplate"):
        [container] = lws["spec"]["leaderWorkerTemplate"][role]["spec"]["containers"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 8  # GPUs of one node per pod
        assert container["command"] == ["/bin/bash", "-c"]
    assert "&id" not in (folder / "kubernetes.yaml").read_text()


def node_args(folder: Path) -> tuple[str, str]:
    lws = next(yaml.safe_load_all((folder / "kubernetes.yaml").read_text()))
    return tuple(lws["spec"]["leaderWorkerTemplate"][r]["spec"]["containers"][0]["args"][0]
                 for r in ("leaderTemplate", "workerTemplate"))


def test_vllm_runs_a_ray_cluster_over_the_nodes(tmp_path):
    _, folder = deploy(tmp_path, "vllm", LLAMA_405B)
    config = yaml.safe_load((folder / "config.yaml").read_text())
    assert config["distributed-executor-backend"] == "ray"
    assert (config["tensor-parallel-size"], config["pipeline-parallel-size"]) == (8, 2)
    leader, worker = node_args(folder)
    assert leader == ("ray start --head --port=6379 && exec vllm serve /artifact/model --config "
                      "/artifact/deploy/vllm/config.yaml --host 0.0.0.0 --port 8000")
    assert worker == "exec ray start --block --address=$(LWS_LEADER_ADDRESS):6379"
    script = (folder / "launch.sh").read_text()
    assert 'exec ray start --block --address="$LEADER_ADDRESS":6379' in script
    assert "ray start --head --port=6379 && exec vllm serve ./model --config ./deploy/vllm/config.yaml" in script
    compose = yaml.safe_load((folder / "docker-compose.yaml").read_text())["services"]
    assert set(compose) == {"leader", "worker"} and compose["worker"]["network_mode"] == "host"
    assert compose["worker"]["command"] == ["exec ray start --block --address=${LEADER_ADDRESS:?}:6379"]
    assert compose["leader"]["deploy"]["resources"]["reservations"]["devices"][0]["count"] == 8


def test_sglang_gives_every_node_its_rank_and_the_leaders_address(tmp_path):
    _, folder = deploy(tmp_path, "sglang", MODELS["deepseek-v3-fp8"])
    leader, worker = node_args(folder)
    assert leader == worker
    assert "--tp-size 8 --pp-size 2" in leader
    # the API key, from the Secret the pod's environment holds, is passed by the shell that runs the command
    assert leader.endswith("--nnodes $(LWS_GROUP_SIZE) --node-rank $(LWS_WORKER_INDEX) "
                           '--dist-init-addr $(LWS_LEADER_ADDRESS):20000 ${LLMOPT_API_KEY:+--api-key "$LLMOPT_API_KEY"}')
    compose = yaml.safe_load((folder / "docker-compose.yaml").read_text())["services"]
    assert "--node-rank 0 --dist-init-addr ${LEADER_ADDRESS:?}:20000" in compose["leader"]["command"][0]
    assert "--node-rank ${NODE_RANK:?}" in compose["worker"]["command"][0]
    assert compose["leader"]["command"][0].endswith('$${LLMOPT_API_KEY:+--api-key "$$LLMOPT_API_KEY"}')
    assert compose["leader"]["environment"]["LLMOPT_API_KEY"] == "${LLMOPT_API_KEY:-}"
    # host networking: the leader listens on the recipe's publish_host of its machine, 127.0.0.1 by default
    assert "--host 127.0.0.1 " in compose["leader"]["command"][0] and "0.0.0.0" not in compose["leader"]["command"][0]
    assert '--host "${LLMOPT_HOST:-127.0.0.1}"' in (folder / "launch.sh").read_text()


def test_a_single_node_recipe_writes_a_deployment_as_before(tmp_path):
    result, folder = deploy(tmp_path, "vllm", DEMO, target='gpu = "H100-SXM-80GB"\ncount = 4')
    deployment, _ = yaml.safe_load_all((folder / "kubernetes.yaml").read_text())
    assert deployment["kind"] == "Deployment" and result["nodes"] == 1
    assert "distributed-executor-backend" not in yaml.safe_load((folder / "config.yaml").read_text())
    assert "NODE_RANK" not in (folder / "launch.sh").read_text()


@pytest.mark.parametrize("engine", ["vllm", "trtllm"])
def test_a_recipe_tensor_parallel_over_one_node_is_refused(tmp_path, engine):
    errors = plan_errors(tmp_path, engine, "tensor_parallel_size = 16\npipeline_parallel_size = 1",
                         config=LLAMA_405B, target=TWO_NODES)
    assert any("tensor_parallel_size 16 spans more than one node of 8 GPUs" in e and
               "set tensor_parallel_size to 8 or less" in e for e in errors), errors


def test_trtllm_runs_one_mpi_world_of_tp8_pp2_over_the_nodes(tmp_path):
    """TensorRT-LLM: config.yaml plans TP 8 x PP 2 and passes the TorchLlmArgs field table; every launch file
    starts one MPI world of 16 ranks under the leader's mpirun, through trtllm-llmapi-launch."""
    from llmopt.deploy import validate_engine
    from llmopt.deploy import flags

    result, folder = deploy(tmp_path, "trtllm", LLAMA_405B)
    assert (result["memory"]["tensor_parallel_size"], result["memory"]["pipeline_parallel_size"]) == (8, 2)
    assert result["gpus"] == 16 and result["nodes"] == 2 and result["validated_by"] == "flag table trtllm 1.2.1"
    config = yaml.safe_load((folder / "config.yaml").read_text())
    assert (config["tensor_parallel_size"], config["pipeline_parallel_size"]) == (8, 2)
    table = validate_engine.validate_table("trtllm", config, flags.TRTLLM_TYPES, flags.TRTLLM_FIELDS,
                                           flags.TRTLLM_VERSION, flags.TRTLLM_NESTED_FIELDS)
    assert table["errors"] == [] and table["warnings"] == []
    mpirun = "--hostfile /tmp/llmopt-hostfile -np 16 "
    serve = "trtllm-llmapi-launch trtllm-serve /models/demo --backend pytorch --config"

    script = (folder / "launch.sh").read_text()
    assert mpirun in script and "trtllm-llmapi-launch trtllm-serve /tmp/llmopt-served/demo" in script
    assert "printf '%s slots=8\\n' \"$LEADER_ADDRESS\" ${WORKER_ADDRESSES:?}" in script
    assert "exec /usr/sbin/sshd -D -e -p 2222" in script

    compose = yaml.safe_load((folder / "docker-compose.yaml").read_text())["services"]
    for role in ("leader", "worker"):  # NVIDIA's docker run limits, on both machines
        assert compose[role]["ulimits"] == {"memlock": -1, "stack": 67108864}
        assert compose[role]["network_mode"] == "host" and "entrypoint" not in compose[role]  # NGC's entrypoint
    leader = compose["leader"]["command"]
    assert leader[:2] == ["/bin/bash", "-c"] and mpirun in leader[2] and serve in leader[2]
    assert "/dev/tcp/$$host/2222" in leader[2]  # a shell $ is $$ in compose, which interpolates $VAR itself

    lws = next(yaml.safe_load_all((folder / "kubernetes.yaml").read_text()))
    check_leader_worker_set(lws)
    pods = {role: lws["spec"]["leaderWorkerTemplate"][role]["spec"]["containers"][0]
            for role in ("leaderTemplate", "workerTemplate")}
    leader, worker = (pods[role]["args"] for role in ("leaderTemplate", "workerTemplate"))
    assert all("command" not in pod and pod["resources"]["limits"]["nvidia.com/gpu"] == 8 for pod in pods.values())
    assert leader[:2] == ["/bin/bash", "-c"] and mpirun in leader[2] and serve in leader[2]
    assert "$(LWS_LEADER_ADDRESS) \"${LWS_LEADER_ADDRESS%%.*}-1.${LWS_LEADER_ADDRESS#*.}\" > " in leader[2]
    assert worker[2] == "mkdir -p /run/sshd && ssh-keygen -A && exec /usr/sbin/sshd -D -e -p 2222"


def test_trtllm_refuses_a_model_the_nodes_cannot_hold(tmp_path):
    errors = plan_errors(tmp_path, "trtllm", config=LLAMA_405B, target='gpu = "H100-SXM-80GB"\ncount = 4\nnodes = 2')
    assert any("does not fit on" in e for e in errors), errors


def test_trtllm_over_several_nodes_warns_that_the_ngc_image_runs_no_ssh_server(tmp_path):
    plan, _ = planned(tmp_path, "trtllm", config=LLAMA_405B, target=TWO_NODES)
    assert not plan.errors, [p.message for p in plan.errors]
    assert any("not documented to run an SSH server" in p.message and "openssh-server" in p.hint
               for p in plan.problems if p.severity == "warning"), plan.problems
    plan, _ = planned(tmp_path / "own", "trtllm", 'image = "registry.example/trtllm-sshd"', config=LLAMA_405B,
                      target=TWO_NODES)
    assert not [p for p in plan.problems if "SSH server" in p.message]


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_every_launch_script_is_valid_bash(tmp_path, engine):
    _, folder = deploy(tmp_path, engine, LLAMA_405B)
    run = subprocess.run(["bash", "-n", str(folder / "launch.sh")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_vllms_own_parser_builds_the_engine_config_of_the_two_node_replica(tmp_path, model, vllm_python):
    """vLLM 0.33's EngineArgs + create_engine_config (on the CPU, nothing loaded) over the config.yaml written
    for two nodes: Ray as the executor, TP 8 within a node, PP 2 across."""
    from llmopt.deploy import validate_engine
    _, folder = deploy(tmp_path, "vllm", MODELS[model])
    result = validate_engine.validate_vllm(folder / "config.yaml", tmp_path / "model", vllm_python)
    assert result["ok"], result["errors"]
    assert result["validated_by"] == "vllm 0.33.0 EngineArgs"
    engine = result["engine"]
    assert (engine["tensor_parallel_size"], engine["pipeline_parallel_size"]) == (8, 2)
    assert engine["max_model_len"] == 4096


def test_count_above_the_catalogues_gpus_per_node_is_a_plan_error_with_the_nodes_fix(tmp_path):
    """[target] count = 16 of H100-SXM-80GB planned tensor parallel 16 on one node; an HGX node holds 8."""
    assert H100.gpus_per_node == 8
    errors = plan_errors(tmp_path, "vllm", config=LLAMA_405B, target='gpu = "H100-SXM-80GB"\ncount = 16')
    assert any("count = 16 GPUs of one node, but a H100-SXM-80GB node holds at most 8" in e
               and "set count = 8 and nodes = 2" in e for e in errors), errors
