"""A replica over several nodes (issue 15, defect 9): Llama-3.1-405B in BF16 and DeepSeek-V3 in FP8 on
2 nodes of 8 H100s plan tensor parallel 8 within a node x pipeline parallel 2 across nodes; each engine
writes its per-node commands; the LeaderWorkerSet manifest is checked against the LWS CRD's OpenAPI schema
(tests/data/lws/) and its pod templates with kubernetes-validate (Kubernetes 1.37.0, strict); a tensor
parallel size over one node is refused with the fix; a single-node recipe's files do not change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from llmopt import memory
from llmopt.catalog.gpus import get_gpu
from llmopt.errors import UsageError
from llmopt.estimates import float_weight_bytes
from llmopt.modelinfo import from_config
from llmopt.recipe.schema import Workload
from test_deploy_configs import DEMO, plan_errors, planned, render

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
