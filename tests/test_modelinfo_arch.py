"""Model facts and KV-cache sizes of architectures beyond dense GQA, from published config.json files
(tests/data/configs/README.md says where each came from).

KV bytes follow the engines' own sizing. vLLM, v1/kv_cache_interface.py: an attention layer's page is
block_size x num_kv_heads x (head_size + head_size_v) x dtype bytes (FullAttentionSpec); MLA's page is
block_size x 1 x (kv_lora_rank + qk_rope_head_dim) x dtype bytes with no K/V factor (MLAAttentionSpec; the
DeepSeek model passes head_size = kv_lora_rank + qk_rope_head_dim, and every tensor-parallel rank holds
the whole latent); a sliding-window layer keeps the window's tokens of a sequence (SlidingWindowSpec).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmopt.model import memory
from llmopt.catalog.gpus import get_gpu
from llmopt.errors import UsageError
from llmopt.model.estimates import float_weight_bytes
from llmopt.model.modelinfo import from_config
from llmopt.recipe.schema import Workload

CONFIGS = Path(__file__).parent / "data" / "configs"


def info(name: str):
    return from_config(json.loads((CONFIGS / f"{name}.json").read_text()))


@pytest.mark.parametrize("name, published", [
    ("deepseek-r1", 671e9),  # DeepSeek-V3 technical report: 671B total (without the 14B MTP module)
    ("mixtral-8x7b", 46.7e9),  # Mistral AI, "Mixtral of experts": 46.7B total
    ("qwen3-30b-a3b", 30.5e9),  # Qwen3 model card: 30.5B total
    ("gemma-3-27b-it", 27.4e9),  # Gemma 3 report, table 1: 1,416M embedding + 25,600M other + 417M vision
    ("gpt-oss-20b", 20.91e9),  # gpt-oss model card: 20.91B total
])
def test_parameter_counts_within_two_percent_of_published(name, published):
    model = info(name)
    assert model.total_params == pytest.approx(published, rel=0.02)
    assert float_weight_bytes(model, "bfloat16") == 2 * model.total_params


def test_moe_facts_are_read():
    ds = info("deepseek-r1")
    assert (ds.num_experts, ds.experts_per_token, ds.shared_experts, ds.dense_layers) == (256, 8, 1, 3)
    assert (ds.moe_intermediate_size, ds.intermediate_size, ds.moe_layers) == (2048, 18432, 58)
    qwen = info("qwen3-30b-a3b")
    assert (qwen.num_experts, qwen.experts_per_token, qwen.expert_width, qwen.dense_layers) == (128, 8, 768, 0)
    mixtral = info("mixtral-8x7b")
    assert (mixtral.num_experts, mixtral.experts_per_token, mixtral.expert_width) == (8, 2, 14336)
    oss = info("gpt-oss-20b")
    assert (oss.num_experts, oss.experts_per_token) == (32, 4)
    # active parameters: the published 37B (DeepSeek-V3) and 12.9B (Mixtral) include the embeddings
    assert ds.active_linear_params + ds.embedding_params == pytest.approx(37e9, rel=0.02)
    assert mixtral.active_linear_params + mixtral.embedding_params == pytest.approx(12.9e9, rel=0.02)


def test_deepseek_v3_mla_kv_is_the_compressed_latent():
    ds = info("deepseek-r1")
    assert ds.head_dim == 128 + 64  # qk_nope_head_dim + qk_rope_head_dim, not hidden / heads = 56
    assert memory.kv_bytes_per_token_per_gpu(ds, 2) == 61 * (512 + 64) * 2 == 70_272
    assert memory.kv_bytes_per_token_per_gpu(ds, 1) == 35_136  # fp8 KV cache
    assert memory.kv_bytes_per_token_per_gpu(ds, 2, tp=8) == 70_272  # each rank holds the whole latent
    assert memory.kv_bytes_per_token_per_gpu(ds, 2, tp=8, pp=2) == 31 * 576 * 2


def test_dense_gqa_moe_kv_is_per_head():
    assert memory.kv_bytes_per_token_per_gpu(info("mixtral-8x7b"), 2) == 2 * 32 * 8 * 128 * 2 == 131_072
    assert memory.kv_bytes_per_token_per_gpu(info("qwen3-30b-a3b"), 2) == 2 * 48 * 4 * 128 * 2 == 98_304
    assert memory.kv_bytes_per_token_per_gpu(info("qwen3-30b-a3b"), 2, tp=8) == 2 * 48 * 1 * 128 * 2


def test_gemma3_local_layers_keep_their_window():
    gemma = info("gemma-3-27b-it")  # the text_config of the multimodal wrapper
    assert (gemma.num_layers, gemma.sliding_layers, gemma.sliding_window) == (62, 52, 1024)  # 5 local : 1 global
    assert (gemma.vocab_size, gemma.tie_embeddings) == (262208, True)
    per_layer_token = 2 * 16 * 128 * 2  # K and V of 16 KV heads of 128 in bf16: 8,192 bytes
    assert memory.kv_bytes_per_token_per_gpu(gemma, 2) == 62 * per_layer_token  # every layer in full
    at_4k = 10 * 4096 * per_layer_token + 52 * 1024 * per_layer_token
    at_32k = 10 * 32768 * per_layer_token + 52 * 1024 * per_layer_token
    assert memory.kv_bytes_per_sequence(gemma, 2, 4096) == at_4k == 771_751_936
    assert memory.kv_bytes_per_sequence(gemma, 2, 32768) == at_32k == 3_120_562_176  # vs 16.6 GB all global
    assert memory.kv_bytes_per_token_per_gpu(gemma, 2, seq_len=32768) == 95_232
    assert memory.kv_bytes_per_sequence(gemma, 2, 512) == 62 * 512 * per_layer_token  # inside the window


def test_gpt_oss_alternating_layers():
    oss = info("gpt-oss-20b")
    assert (oss.sliding_layers, oss.sliding_window) == (12, 128)
    per_layer_token = 2 * 8 * 64 * 2  # 2,048 bytes
    assert memory.kv_bytes_per_sequence(oss, 2, 4096) == (12 * 4096 + 12 * 128) * per_layer_token == 103_809_024
    assert memory.kv_bytes_per_sequence(oss, 2, 32768) == (12 * 32768 + 12 * 128) * per_layer_token == 808_452_096


def test_plan_of_deepseek_v3_plans_expert_parallel_and_holds_the_latent():
    ds = info("deepseek-r1")
    weights = 671_026_404_352 + 1  # fp8 weights, about one byte per parameter
    plan = memory.plan_memory(ds, get_gpu("H200"), 8, 32768, Workload(input_len=2048, output_len=512,
                              concurrency=32), weight_bytes=weights, kv_bytes=2)
    assert plan.tensor_parallel_size == 8 and plan.expert_parallel_size == 8  # 256 experts over 8 ranks
    assert plan.kv_bytes_per_token_per_gpu == plan.kv_bytes_per_token == 70_272
    assert plan.kv_tokens == plan.kv_budget_bytes_per_gpu // (70_272 * 16) * 16


def test_plan_of_a_sliding_window_model_counts_sequences_at_their_length():
    gemma = info("gemma-3-27b-it")
    work = Workload(input_len=3072, output_len=1024, concurrency=16)
    plan = memory.plan_memory(gemma, get_gpu("H100-SXM-80GB"), 1, 32768, work,
                              weight_bytes=float_weight_bytes(gemma, "bfloat16"), kv_bytes=2)
    per_token_4k = memory.kv_bytes_per_token_per_gpu(gemma, 2, seq_len=4096)
    assert plan.kv_bytes_per_token_per_gpu == per_token_4k == 771_751_936 // 4096
    assert plan.kv_tokens == plan.kv_budget_bytes_per_gpu // (per_token_4k * 16) * 16
    at_32k = memory.kv_bytes_per_sequence(gemma, 2, 32768)
    assert plan.full_length_sequences == plan.kv_budget_bytes_per_gpu // (-(-at_32k // 32768) * 16) * 16 // 32768
    # charged as if every layer were global, the same budget would hold 4k sequences 1.6x fewer
    assert plan.kv_tokens > 1.6 * plan.kv_budget_bytes_per_gpu // (62 * 8192)


def test_an_sglang_plan_of_gemma_3_charges_every_layer_at_every_token():
    """SGLang keeps Gemma 3's sliding layers at the whole context (tests/data/engine_kv/sglang-0.5.23.json): the
    plan's per-token figures, its full-length capacity and the fix it suggests all use SGLang's charge."""
    gemma = info("gemma-3-27b-it")
    work = Workload(input_len=3072, output_len=1024, concurrency=16)
    weights = float_weight_bytes(gemma, "bfloat16")
    plan = memory.plan_memory(gemma, get_gpu("H100-SXM-80GB"), 1, 32768, work, weight_bytes=weights, kv_bytes=2,
                              engine="sglang")
    assert plan.kv_bytes_per_token == plan.kv_bytes_per_token_per_gpu == 507_904
    assert plan.kv_tokens == plan.kv_budget_bytes_per_gpu // (507_904 * 16) * 16
    assert plan.full_length_sequences == plan.kv_tokens // 32768
    l40s = get_gpu("L40S")
    with pytest.raises(UsageError) as refused:  # 131k tokens on one L40S: the fix names the count that holds them
        memory.plan_memory(gemma, l40s, 1, 131072, work, weight_bytes=weights, kv_bytes=2, engine="sglang")
    assert "set [target] count = 4 (tensor parallel 4)" in refused.value.fix
    with pytest.raises(UsageError):  # two, enough at vLLM's charge, are not at SGLang's
        memory.plan_memory(gemma, l40s, 2, 131072, work, weight_bytes=weights, kv_bytes=2, engine="sglang")
    memory.plan_memory(gemma, l40s, 2, 131072, work, weight_bytes=weights, kv_bytes=2, engine="vllm")
    assert memory.plan_memory(gemma, l40s, 4, 131072, work, weight_bytes=weights, kv_bytes=2,
                              engine="sglang").full_length_sequences >= 1


def test_gpt_oss_mxfp4_checkpoint_is_sized_in_mxfp4_where_its_config_says():
    """gpt-oss stores its experts in MXFP4 (4-bit e2m1 codes and an 8-bit e8m0 scale per 32 values: 4.25
    bits a weight) and leaves attention, router, embedding and head in bf16 (modules_to_not_convert)."""
    from llmopt.model.estimates import checkpoint_kinds, checkpoint_weights, float_layout, size

    oss = info("gpt-oss-20b")
    qconfig = oss.quantization
    assert checkpoint_kinds(qconfig) == ("gate_proj", "up_proj", "down_proj")
    layout = float_layout("bfloat16", oss.tie_embeddings).with_linears(checkpoint_weights(qconfig, "bfloat16"),
                                                                       checkpoint_kinds(qconfig))
    experts = 24 * 32 * 3 * 2880 * 2880
    expected = experts * 4.25 / 8 + (oss.total_params - experts) * 2
    assert size(layout, oss)["weight_bytes"] == pytest.approx(expected, rel=0.001)  # 13.75 GB, not 41.8 in bf16
    assert checkpoint_kinds({"ignore": ["lm_head", "re:.*mlp.gate$"]}) == checkpoint_kinds(None)  # MoE router gate
    assert "down_proj" not in checkpoint_kinds({"ignore": ["re:.*mlp.down_proj$"]})
