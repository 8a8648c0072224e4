"""The serving memory model against hand-computed cases and published KV-cache figures."""

from __future__ import annotations

import pytest

from llmopt.model import memory
from llmopt.catalog.gpus import get_gpu
from llmopt.errors import UsageError
from llmopt.model import estimates
from llmopt.backends.compress import _llmcompressor as lc
from llmopt.model.estimates import float_weight_bytes as weight_bytes
from llmopt.model.modelinfo import from_config
from llmopt.recipe.schema import Workload

LLAMA_8B = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
    "tie_word_embeddings": False, "max_position_embeddings": 131072, "torch_dtype": "bfloat16",
}
LLAMA_70B = dict(LLAMA_8B, hidden_size=8192, num_hidden_layers=80, num_attention_heads=64, intermediate_size=28672)
MIXTRAL = dict(LLAMA_8B, vocab_size=32000, num_local_experts=8, max_position_embeddings=32768)
DEMO = dict(LLAMA_8B, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
            num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True, max_position_embeddings=8192)

H100 = get_gpu("H100-SXM-80GB")
GIB, MIB = 2**30, 2**20
H100_BYTES = int(79.2 * GIB)  # 85,040,352,460: the driver-reported total of the catalogue
BUDGET = int(H100_BYTES * 0.90)  # 76,536,317,214 at the default utilization
FIXED_1GPU = 512 * MIB + 512 * MIB + 1 * GIB  # non-torch + workspace + CUDA graphs (no NCCL on one GPU)
FIXED_NGPU = FIXED_1GPU + 256 * MIB  # + NCCL buffers when tensor parallel


def test_llama_8b_fp8_on_one_h100_at_8k():
    info = from_config(LLAMA_8B)
    # FP8 W8A8: the 6,979,321,856 decoder-linear weights at 1 byte; embeddings, lm_head and norms
    # (1,050,939,392 parameters) stay bf16. Published FP8 checkpoints of this model are 9.08 GB.
    weights = 6_979_321_856 * 1 + 1_050_939_392 * 2
    assert weights == 9_081_200_640
    # the size model of that checkpoint adds a bf16 scale per output row and the safetensors header
    fp8 = estimates.float_layout("bfloat16", tied=False).with_linears(lc.fp8_weights("bfloat16", per_row=True))
    written = estimates.size(fp8, info)
    assert written["weight_bytes"] == weights + 32 * 43008 * 2 + (2 + 32 * (2 * 7 + 2) + 1) * 104
    assert memory.kv_bytes_per_token_per_gpu(info, 2) == 2 * 32 * 8 * 128 * 2 == 131072
    assert memory.kv_bytes_per_token_per_gpu(info, 1) == 65536
    # limits set by hand (64 sequences, a step of 2048 tokens) at 90% of the GPU:
    # activations 2048 x 2 B x (2 x 4096 + 3 x 14336) + logits 64 x 128256 x 4 B
    overhead = FIXED_1GPU + 2048 * 2 * (2 * 4096 + 3 * 14336) + 64 * 128256 * 4
    assert overhead == 2_390_032_384
    kv_budget = BUDGET - weights - overhead
    assert kv_budget == 65_065_084_190  # 60.6 GiB
    work = Workload(input_len=1024, output_len=256, concurrency=64)
    hand = {"utilization": 0.90, "max_num_seqs": 64, "max_num_batched_tokens": 2048}
    bf16 = memory.plan_memory(info, H100, 1, 8192, work, weight_bytes=weights, kv_bytes=2, **hand)
    assert (bf16.tensor_parallel_size, bf16.max_num_seqs, bf16.max_num_batched_tokens) == (1, 64, 2048)
    assert bf16.kv_budget_bytes_per_gpu == kv_budget
    assert bf16.kv_tokens == kv_budget // (131072 * 16) * 16 == 496_400
    assert bf16.full_length_sequences == 60  # 496,400 // 8192
    fp8 = memory.plan_memory(info, H100, 1, 8192, work, weight_bytes=weights, kv_bytes=1, **hand)
    assert fp8.kv_bytes_per_token == 65536
    assert fp8.kv_tokens == kv_budget // (65536 * 16) * 16 == 992_800
    assert fp8.full_length_sequences == 121
    assert fp8.workload_sequences == 992_800 // 1280 == 775


def test_llama_70b_bf16_needs_tp4_on_h100():
    info = from_config(LLAMA_70B)
    assert info.total_params == 70_553_706_496  # Llama-3.1-70B's published parameter count
    weights = weight_bytes(info, "bfloat16")
    assert weights == 141_107_412_992  # 131.4 GiB: more than one H100 holds
    work = Workload(input_len=1024, output_len=256, concurrency=16)
    hand = {"utilization": 0.90, "max_num_seqs": 16, "max_num_batched_tokens": 2048}
    plan = memory.plan_memory(info, H100, 8, 8192, work, weight_bytes=weights, **hand)
    tried = {t["tensor_parallel_size"]: t for t in plan.tried}
    assert sorted(tried) == [1, 2, 4, 8]
    assert tried[1]["kv_tokens"] == 0
    # TP 2: 65.7 GiB of weights per GPU leave 3.3 GiB of KV at 2 x 80 x 4 x 128 x 2 = 163,840 B per token
    overhead_tp2 = FIXED_NGPU + 2048 * 2 * (2 * 8192 + 3 * 14336) + 16 * 128256 * 4
    budget_tp2 = BUDGET - weights // 2 - overhead_tp2
    assert tried[2]["kv_tokens"] == budget_tp2 // (163840 * 16) * 16 == 20_224
    assert not tried[2]["fits_workload"]  # 16 x 1280 tokens x 1.1 headroom = 22,528 > 20,224
    overhead_tp4 = FIXED_NGPU + 2048 * 2 * (2 * 8192 + 3 * 7168) + 16 * 128256 * 4
    budget_tp4 = BUDGET - weights // 4 - overhead_tp4
    assert plan.tensor_parallel_size == 4
    assert plan.kv_tokens == budget_tp4 // (81920 * 16) * 16 == 472_160
    assert plan.full_length_sequences == 57
    assert plan.gpus == 4 and plan.max_num_seqs == 16


def test_70b_on_two_h100s_runs_with_fewer_sequences_and_says_so():
    info = from_config(LLAMA_70B)
    work = Workload(input_len=1024, output_len=256, concurrency=64)
    plan = memory.plan_memory(info, H100, 2, 8192, work, weight_bytes=weight_bytes(info, "bfloat16"))
    assert plan.tensor_parallel_size == 2 and plan.kv_tokens == 26_144
    # vLLM's own 1024 sequences do not fit: what the KV cache holds of the workload's 1280-token sequences
    assert plan.max_num_seqs == 26_144 // 1280 == 20
    assert plan.reasons["max_num_seqs"] == ("the KV cache holds 26,144 tokens: 20 sequences of the workload's "
                                            "1,280, fewer than vLLM 0.33.0's default 1,024")
    assert "queue" in plan.warnings[0] and "hold 26,144" in plan.warnings[0]


def test_what_cannot_fit_is_refused_with_the_reason_and_a_fix():
    info = from_config(LLAMA_70B)
    with pytest.raises(UsageError) as err:
        memory.plan_memory(info, H100, 1, 8192, Workload(), weight_bytes=weight_bytes(info, "bfloat16"))
    assert "does not fit on 1 x H100-SXM-80GB" in err.value.what
    assert "131.4 GiB per GPU" in err.value.what
    assert "set [target] count = 2" in err.value.fix
    with pytest.raises(UsageError, match="does not split 64 attention heads"):
        memory.plan_memory(info, H100, 8, 8192, Workload(), weight_bytes=1, tensor_parallel_size=3)


def test_published_kv_cache_sizes():
    # Hugging Face, "Llama 3.1 - 405B, 70B & 8B with multilinguality and long context" (July 2024),
    # section "Inference Memory Requirements": KV cache in FP16 for 1k / 16k / 128k tokens:
    # 8B 0.125 / 1.95 / 15.62 GB, 70B 0.313 / 4.88 / 39.06 GB (GiB, with 16k = 16,000 and 128k = 128,000).
    for config, published in ((LLAMA_8B, (0.125, 1.95, 15.62)), (LLAMA_70B, (0.313, 4.88, 39.06))):
        per_token = memory.kv_bytes_per_token_per_gpu(from_config(config), 2)
        ours = [per_token * n / GIB for n in (1024, 16_000, 128_000)]
        assert ours == pytest.approx(published, abs=0.01)


def test_tensor_parallel_sizes_follow_the_heads():
    assert memory.valid_tp_sizes(from_config(LLAMA_70B), 8) == [1, 2, 4, 8]
    assert memory.valid_tp_sizes(from_config(DEMO), 8) == [1, 3]  # 9 heads, 3 KV heads
    demo = from_config(DEMO)
    assert memory.kv_bytes_per_token_per_gpu(demo, 2, 3) == 2 * 30 * 1 * 64 * 2


def test_moe_gets_expert_parallel_and_data_parallel_fills_the_gpus():
    info = from_config(MIXTRAL)
    weights = weight_bytes(info, "bfloat16")
    assert weights / GIB == pytest.approx(86.99, abs=0.01)  # 46.7B parameters
    plan = memory.plan_memory(info, H100, 8, 8192, Workload(concurrency=64), weight_bytes=weights,
                              data_parallel_size="auto")
    assert plan.tensor_parallel_size == 2 and plan.data_parallel_size == 4
    assert plan.expert_parallel_size == 8  # 8 experts over tp x dp = 8 ranks


def test_kv_dtype_from_option_or_checkpoint():
    info = from_config(dict(LLAMA_8B, quantization_config={
        "quant_method": "compressed-tensors", "kv_cache_scheme": {"type": "float", "num_bits": 8}}))
    assert memory.kv_dtype_bytes("auto", info) == 1
    assert memory.kv_dtype_bytes("auto", from_config(LLAMA_8B)) == 2
    assert memory.kv_dtype_bytes("fp8_e5m2", from_config(LLAMA_8B)) == 1
