"""GGUF 4-bit blocks -> MatMulNBits: the blocks are read as llama.cpp defines them, and the ONNX graph
(MatMulNBits plus the Q4_1 residual term) computes exactly the GGUF weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("torch")

from gguf import GGMLQuantizationType as QT  # noqa: E402

from llmopt.backends.export import gguf_layout as gl  # noqa: E402

HEADS, KV_HEADS, HIDDEN, FFN = 2, 1, 64, 96


def quantized(rows: int, cols: int, kind, seed: int) -> np.ndarray:
    """A weight matrix quantized by the gguf package itself (raw block bytes)."""
    rng = np.random.default_rng(seed)
    weights = rng.standard_normal((rows, cols)).astype(np.float32) * 0.05 + 0.01 * rng.standard_normal((rows, 1))
    return gguf.quants.quantize(weights.astype(np.float32), kind)


@pytest.mark.parametrize("kind", [QT.Q4_0, QT.Q4_1])
def test_q4_blocks_dequantize_exactly_as_the_gguf_package_does(kind):
    raw = quantized(6, 128, kind, seed=1)
    codes, d, m = gl.q4_blocks(kind.name, raw, 6, 128)
    assert codes.shape == (6, 128) and codes.max() <= 15 and d.shape == (6, 4)
    assert (m is None) == (kind == QT.Q4_0)
    assert np.array_equal(gl.dequantize_q4(codes, d, m), gguf.quants.dequantize(raw, kind).reshape(6, 128))


def test_q8_blocks_dequantize_exactly_as_the_gguf_package_does():
    raw = quantized(5, 64, QT.Q8_0, seed=2)
    codes, d = gl.q8_blocks(raw, 5, 64)
    ours = (codes.reshape(5, 2, 32).astype(np.float32) * d[..., None]).reshape(5, 64)
    assert np.array_equal(ours, gguf.quants.dequantize(raw, QT.Q8_0).reshape(5, 64))


def test_integer_zero_points_and_residuals_give_the_same_weights():
    rng = np.random.default_rng(3)
    codes = rng.integers(0, 16, (8, 96)).astype(np.uint8)
    d = (rng.random((8, 3)) * 0.01 + 1e-3).astype(np.float16).astype(np.float32)
    m = (-rng.random((8, 3)) * 0.1 + 0.02).astype(np.float16).astype(np.float32)  # some blocks all positive
    d[0, 0] = 0.0  # an all-equal block
    zeros, residual = gl.integer_form(d, m)
    assert zeros.dtype == np.uint8 and zeros.max() <= 15 and zeros[0, 0] == 8 and residual[0, 0] == m[0, 0]
    again = (codes.reshape(8, 3, 32) - zeros[..., None].astype(np.float32)) * d[..., None] + residual[..., None]
    np.testing.assert_allclose(again.reshape(8, 96), gl.dequantize_q4(codes, d, m), rtol=0, atol=1e-6)
    assert gl.integer_form(d, None)[1] is None and (gl.integer_form(d, None)[0] == 8).all()


def test_rotary_rows_are_unpermuted_as_transformers_does():
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    x = np.arange(24 * 3, dtype=np.float32).reshape(24, 3)
    theirs = LlamaTensorProcessor(config={})._reverse_permute_weights(x, 4, 2)
    assert np.array_equal(gl.unpermute_rows(x, 2), theirs)


def write_gguf(path: Path, linear_kind=QT.Q4_1) -> dict:
    """A one-layer llama GGUF with quantized linears and a Q8_0 embedding; returns the raw tensors."""
    shapes = {"attn_q": (HIDDEN, HIDDEN), "attn_k": (HIDDEN // HEADS * KV_HEADS, HIDDEN),
              "attn_v": (HIDDEN // HEADS * KV_HEADS, HIDDEN), "attn_output": (HIDDEN, HIDDEN),
              "ffn_gate": (FFN, HIDDEN), "ffn_up": (FFN, HIDDEN), "ffn_down": (HIDDEN, FFN)}
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint32("llama.attention.head_count", HEADS)
    writer.add_uint32("llama.attention.head_count_kv", KV_HEADS)
    raw = {}
    for seed, (part, (rows, cols)) in enumerate(shapes.items()):
        raw[part] = quantized(rows, cols, linear_kind, seed)
        writer.add_tensor(f"blk.0.{part}.weight", raw[part], raw_dtype=linear_kind)
    raw["token_embd"] = quantized(128, HIDDEN, QT.Q8_0, 99)
    writer.add_tensor("token_embd.weight", raw["token_embd"], raw_dtype=QT.Q8_0)
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return raw


def test_read_maps_names_and_restores_the_hugging_face_row_order(tmp_path):
    raw = write_gguf(tmp_path / "m.gguf")
    assert gl.problem(tmp_path / "m.gguf") is None
    linears, others, meta = gl.read(gl.open_gguf(tmp_path / "m.gguf"))
    assert meta == {"heads": HEADS, "kv_heads": KV_HEADS}
    assert set(linears) == {f"model.layers.0.{m}.weight" for m in gl.LAYER_LINEARS.values()}
    assert set(others) == {"model.embed_tokens.weight", "model.norm.weight"}
    q = gguf.quants.dequantize(raw["attn_q"], QT.Q4_1).reshape(HIDDEN, HIDDEN)
    k = gguf.quants.dequantize(raw["attn_k"], QT.Q4_1).reshape(-1, HIDDEN)
    down = gguf.quants.dequantize(raw["ffn_down"], QT.Q4_1).reshape(HIDDEN, FFN)
    assert np.array_equal(gl.dequantize_q4(*linears["model.layers.0.self_attn.q_proj.weight"]), gl.unpermute_rows(q, HEADS))
    assert np.array_equal(gl.dequantize_q4(*linears["model.layers.0.self_attn.k_proj.weight"]), gl.unpermute_rows(k, KV_HEADS))
    assert np.array_equal(gl.dequantize_q4(*linears["model.layers.0.mlp.down_proj.weight"]), down)
    assert not np.array_equal(gl.unpermute_rows(q, HEADS), q)  # the permutation is not the identity here


def test_other_architectures_and_types_are_refused_with_the_reason(tmp_path):
    write_gguf(tmp_path / "q8.gguf", QT.Q8_0)
    assert "Q8_0, not Q4_0/Q4_1" in gl.problem(tmp_path / "q8.gguf")
    writer = gguf.GGUFWriter(str(tmp_path / "qwen.gguf"), "qwen2")
    writer.add_tensor("blk.0.attn_q.weight", quantized(32, 32, QT.Q4_0, 0), raw_dtype=QT.Q4_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert "architecture is 'qwen2'" in gl.problem(tmp_path / "qwen.gguf")


def matmulnbits_model(path: Path, codes, d, zeros, name: str) -> None:
    """A graph with one builder-named MatMulNBits node (4-bit, block 32, packed zero points), external data."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    n_out, k = codes.shape
    blocks = k // 32
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8).reshape(n_out, blocks, 16)
    z = np.zeros((n_out, blocks + blocks % 2), np.uint8)
    z[:, :blocks] = zeros
    zp = (z[:, 0::2] | (z[:, 1::2] << 4)).astype(np.uint8).reshape(-1)
    inits = [numpy_helper.from_array(packed, "qweight"), numpy_helper.from_array(d.reshape(-1), "scales"),
             numpy_helper.from_array(zp, "qzeros")]
    node = helper.make_node("MatMulNBits", ["x", "qweight", "scales", "qzeros"], ["y"], name=name, domain="com.microsoft",
                            K=k, N=n_out, bits=4, block_size=32, accuracy_level=1)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "s", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "s", n_out])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    onnx.save_model(model, path, save_as_external_data=True, location=path.name + ".data", size_threshold=0)


def test_the_residual_term_makes_matmulnbits_compute_the_q4_1_weights(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    raw = quantized(HIDDEN, FFN, QT.Q4_1, seed=5)
    codes, d, m = gl.q4_blocks("Q4_1", raw, HIDDEN, FFN)
    zeros, residual = gl.integer_form(d, m)
    weights = gl.dequantize_q4(codes, d, m)
    path = tmp_path / "model.onnx"
    matmulnbits_model(path, codes, d, zeros, "/model/layers.0/mlp/down_proj/MatMulNBits")
    x = np.random.default_rng(6).standard_normal((1, 3, FFN)).astype(np.float32)

    def run():
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return session.run(None, {"x": x})[0]

    reference = x @ weights.T.astype(np.float64)
    assert np.abs(run() - reference).max() > 1e-2  # integer zero points alone are not the GGUF weights
    added = gl.add_block_residuals(path, {"model.layers.0.mlp.down_proj": residual})
    assert added == {"nodes": 1, "block_sums": 1}
    np.testing.assert_allclose(run(), reference, rtol=0, atol=1e-5)
    assert (tmp_path / "model.onnx.data").stat().st_size > codes.size // 2  # appended, not inlined


def test_a_residual_for_a_built_layer_without_its_node_is_an_error(tmp_path):
    pytest.importorskip("onnx")
    raw = quantized(HIDDEN, FFN, QT.Q4_1, seed=5)
    codes, d, m = gl.q4_blocks("Q4_1", raw, HIDDEN, FFN)
    zeros, residual = gl.integer_form(d, m)
    path = tmp_path / "model.onnx"
    matmulnbits_model(path, codes, d, zeros, "/model/layers.0/mlp/down_proj/MatMulNBits")
    with pytest.raises(ValueError, match="no MatMulNBits node found for model.layers.0.mlp.up_proj"):
        gl.add_block_residuals(path, {"model.layers.0.mlp.down_proj": residual,
                                      "model.layers.0.mlp.up_proj": residual})


def test_builder_node_names_map_to_their_linears_in_output_order():
    assert gl.node_linears("/model/layers.3/attn/qkv_proj/MatMulNBits") == [
        "model.layers.3.self_attn.q_proj", "model.layers.3.self_attn.k_proj", "model.layers.3.self_attn.v_proj"]
    assert gl.node_linears("/model/layers.0/mlp/gate_up_proj/MatMulNBits") == [
        "model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj"]
    assert gl.node_linears("/model/layers.0/attn/o_proj/MatMulNBits") == ["model.layers.0.self_attn.o_proj"]
    assert gl.node_linears("/lm_head/MatMul_Q8") is None
