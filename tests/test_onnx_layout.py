"""compressed-tensors W4A16 -> AutoGPTQ repack: bit-exact, and read back by the builder's own loader as written."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("compressed_tensors")

from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32  # noqa: E402
from compressed_tensors.quantization import QuantizationArgs  # noqa: E402
from compressed_tensors.quantization.lifecycle.forward import dequantize as ct_dequantize  # noqa: E402

from llmopt.backends.export import gptq_layout as gl  # noqa: E402

OUT, IN, GROUP = 48, 128, 32


def compressed_linear(symmetric: bool, seed: int = 0) -> tuple[dict, torch.Tensor, torch.Tensor | None]:
    """One linear as llm-compressor stores it, packed by compressed-tensors itself; also its signed codes/zeros."""
    g = torch.Generator().manual_seed(seed)
    signed = torch.randint(-8, 8, (OUT, IN), generator=g, dtype=torch.int8)
    scales = (torch.rand(OUT, IN // GROUP, generator=g) * 0.05 + 1e-3).to(torch.bfloat16)
    tensors = {"weight_packed": pack_to_int32(signed, 4), "weight_scale": scales,
               "weight_shape": torch.tensor([OUT, IN])}
    zeros = None
    if not symmetric:
        zeros = torch.randint(-8, 8, (OUT, IN // GROUP), generator=g, dtype=torch.int8)
        tensors["weight_zero_point"] = pack_to_int32(zeros, 4, packed_dim=0)
    return tensors, signed, zeros


def test_nibbles_are_packed_low_first_along_the_given_dim():
    codes = torch.arange(8, dtype=torch.int32).reshape(8, 1)
    assert gl.pack_nibbles(codes, 0).item() == 0x76543210
    assert gl.pack_nibbles(codes.t(), 1).item() == 0x76543210
    high = torch.full((8, 1), 15, dtype=torch.int32)
    assert gl.pack_nibbles(high, 0).item() == -1  # 0xFFFFFFFF as int32
    assert torch.equal(gl.unpack_nibbles(gl.pack_nibbles(high, 0), 0), high)


@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
def test_repack_is_bit_exact_both_ways(symmetric):
    tensors, signed, zeros = compressed_linear(symmetric)
    codes, unsigned_zeros, scales = gl.from_compressed_tensors(**tensors)
    assert torch.equal(codes, signed.to(torch.int32) + 8)  # the same integers, unsigned
    expected_zeros = torch.full((OUT, IN // GROUP), 8) if symmetric else zeros.to(torch.int32) + 8
    assert torch.equal(unsigned_zeros, expected_zeros.to(torch.int32))

    gptq = gl.to_gptq(codes, unsigned_zeros, scales, GROUP)
    assert gptq["qweight"].shape == (IN // 8, OUT) and gptq["qzeros"].shape == (IN // GROUP, OUT // 8)
    assert gptq["scales"].dtype == torch.float16  # bf16 scales of this size are exact in fp16
    assert torch.equal(gptq["g_idx"], torch.arange(IN, dtype=torch.int32) // GROUP)
    back = gl.to_compressed_tensors(*gl.from_gptq(**gptq)[:2], gl.from_gptq(**gptq)[2].to(torch.bfloat16), symmetric)
    assert set(back) == set(tensors)
    for name, value in tensors.items():
        assert torch.equal(back[name], value), name


@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
def test_both_layouts_dequantize_to_the_same_weights(symmetric):
    tensors, signed, zeros = compressed_linear(symmetric, seed=1)
    codes, unsigned_zeros, scales = gl.from_compressed_tensors(**tensors)
    from_ct = gl.dequantize(codes, unsigned_zeros, scales)
    from_gptq = gl.dequantize(*gl.from_gptq(**gl.to_gptq(codes, unsigned_zeros, scales, GROUP)))
    assert torch.equal(from_ct, from_gptq)
    args = QuantizationArgs(num_bits=4, type="int", symmetric=symmetric, strategy="group", group_size=GROUP)
    reference = ct_dequantize(signed, scales, zeros, args)  # compressed-tensors' own, in the scale dtype (bf16)
    assert torch.equal(from_ct.to(torch.bfloat16), reference.to(torch.bfloat16))


def test_scales_stay_float32_when_float16_would_round():
    scales = torch.tensor([[1e-9, 0.5]], dtype=torch.float32)
    assert gl.gptq_scales(scales).dtype == torch.float32
    assert gl.gptq_scales(scales.to(torch.bfloat16)[:, 1:]).dtype == torch.float16


@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
def test_the_builders_gptq_loader_reads_back_the_same_integers(symmetric):
    """Unpack our AutoGPTQ tensors with onnxruntime-genai's own GPTQ loader code."""
    pytest.importorskip("onnxruntime_genai")
    from onnxruntime_genai.models.loaders.base import QuantizedTensorModule
    from onnxruntime_genai.models.loaders.gptq import GPTQModel

    tensors, _, _ = compressed_linear(symmetric, seed=2)
    codes, zeros, scales = gl.from_compressed_tensors(**tensors)
    module = QuantizedTensorModule()
    for name, value in gl.to_gptq(codes, zeros, scales, GROUP).items():
        setattr(module, name, value)
    module.bits, module.group_size = 4, GROUP
    loader = GPTQModel.__new__(GPTQModel)  # only its unpacking methods are used
    loader.set_quantized_tensor_properties(module)
    loader.prepare_quantized_tensor(module)  # GPTQ's "zero - 1" convention
    loader.unpack_qzeros(module)
    loader.unpack_qweight(module)
    assert (module.in_features, module.out_features) == (IN, OUT)
    assert torch.equal(module.qweight.to(torch.int32), codes.t())
    assert torch.equal(module.qzeros.to(torch.int32), zeros.t())


def test_what_cannot_be_repacked_says_why():
    base = {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "int", "strategy": "group",
                                                      "group_size": 64, "symmetric": True, "actorder": "weight"}}}}
    assert gl.w4a16_problem(base) is None
    group = base["config_groups"]["group_0"]
    assert "actorder" in gl.w4a16_problem({**base, "config_groups": {"g": {"weights": {**group["weights"], "actorder": "group"}}}})
    fp8 = {"num_bits": 8, "type": "float", "strategy": "channel"}
    assert "8-bit float" in gl.w4a16_problem({**base, "format": "float-quantized", "config_groups": {"g": {"weights": fp8}}})
    w4a8 = {"weights": group["weights"], "input_activations": {"num_bits": 8, "type": "int"}}
    assert "activations" in gl.w4a16_problem({**base, "config_groups": {"g": w4a8}})


def test_8_bit_layers_kept_by_sensitive_layers_repack_with_their_width():
    """A W4A16 checkpoint whose sensitive layers are 8-bit symmetric (``sensitive_layers``): each linear repacks
    at its own width, bit-exact, and the 8-bit ones are named in GPTQ's ``dynamic`` as the builder matches them."""
    import re

    g = torch.Generator().manual_seed(3)
    signed = torch.randint(-128, 128, (OUT, IN), generator=g, dtype=torch.int8)
    scales = (torch.rand(OUT, IN // GROUP, generator=g) * 0.01 + 1e-4).to(torch.bfloat16)
    wide = {"weight_packed": pack_to_int32(signed, 8), "weight_scale": scales, "weight_shape": torch.tensor([OUT, IN])}
    assert gl.packed_bits(wide["weight_packed"], wide["weight_shape"]) == 8
    codes, zeros, _ = gl.from_compressed_tensors(**wide)
    assert torch.equal(codes, signed.to(torch.int32) + 128) and bool((zeros == 128).all())
    gptq = gl.to_gptq(codes, zeros, scales, GROUP, bits=8)
    assert gptq["qweight"].shape == (IN // 4, OUT) and gptq["qzeros"].shape == (IN // GROUP, OUT // 4)
    back = gl.from_gptq(**gptq, bits=8)
    assert torch.equal(back[0], codes) and torch.equal(back[1], zeros)
    narrow, _, _ = compressed_linear(True)
    shard = {f"model.layers.1.mlp.down_proj.{k}": v for k, v in wide.items()}
    shard |= {f"model.layers.10.mlp.down_proj.{k}": v for k, v in narrow.items()}
    _, widths = gl.convert_shard(shard)
    assert widths == {"model.layers.1.mlp.down_proj": 8, "model.layers.10.mlp.down_proj": 4}
    qconfig = {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {
        "group_0": {"weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": GROUP, "symmetric": False}},
        "group_1": {"weights": {"num_bits": 8, "type": "int", "strategy": "group", "group_size": GROUP, "symmetric": True}}}}
    assert gl.w4a16_problem(qconfig) is None
    [(pattern, override)] = gl.gptq_config(qconfig, widths)["dynamic"].items()
    assert override == {"bits": 8}
    matches = [re.match(pattern.removeprefix("+:"), f"model.layers.{i}.mlp.down_proj.qweight") for i in (1, 10)]
    assert matches[0] and not matches[1]
