"""`onnx_last`: the last-position graph beside the full one, on a hand-made graph with external weights."""

from __future__ import annotations

import json

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from llmopt.backends.export import onnx_last  # noqa: E402


def head_model(folder, vocab: int = 48, hidden: int = 8):
    """hidden [B, S, H] -> MatMul (lm_head, weights in model.onnx.data) -> Add (bias) -> logits [B, S, V]."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((hidden, vocab)).astype(np.float32), "lm_head.weight")
    bias = numpy_helper.from_array(rng.standard_normal(vocab).astype(np.float32), "lm_head.bias")
    nodes = [helper.make_node("MatMul", ["hidden", "lm_head.weight"], ["/lm_head/MatMul/output_0"], name="/lm_head/MatMul"),
             helper.make_node("Add", ["/lm_head/MatMul/output_0", "lm_head.bias"], ["logits"], name="/lm_head/Add")]
    graph = helper.make_graph(
        nodes, "head", [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch_size", "sequence_length", hidden])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch_size", "sequence_length", vocab])],
        [weight, bias])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = folder / "model.onnx"
    onnx.save(model, path, save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    return path


def run(path, hidden):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["logits"], {"hidden": hidden})[0]


def test_the_last_position_graph_gives_the_full_graphs_last_row(tmp_path):
    path = head_model(tmp_path)
    data = (tmp_path / "model.onnx.data").read_bytes()
    written = onnx_last.write(path)
    assert written == {"all_logits": "model.onnx", "last_logits": "model.last.onnx"}
    assert json.loads((tmp_path / "graphs.json").read_text()) == written
    assert onnx_last.graphs(tmp_path) == written
    assert (tmp_path / "model.onnx.data").read_bytes() == data  # the weights are shared, not copied
    assert not any(p.name.startswith("model.last.onnx.") for p in tmp_path.iterdir())
    hidden = np.random.default_rng(1).standard_normal((2, 5, 8)).astype(np.float32)
    full, last = run(path, hidden), run(tmp_path / "model.last.onnx", hidden)
    assert full.shape == (2, 5, 48) and last.shape == (2, 1, 48)
    np.testing.assert_array_equal(last, full[:, -1:])
    one = hidden[:, -1:]  # a decode step: one position in, the same one out
    np.testing.assert_array_equal(run(tmp_path / "model.last.onnx", one), run(path, one))
    dims = onnx.load(tmp_path / "model.last.onnx", load_external_data=False).graph.output[0].type.tensor_type.shape.dim
    assert [d.dim_param or d.dim_value for d in dims] == ["batch_size", 1, 48]


def test_a_graph_without_a_logits_matmul_is_left_alone(tmp_path):
    graph = helper.make_graph([helper.make_node("Identity", ["hidden"], ["logits"])], "g",
                              [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [1, 2])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 2])])
    onnx.save(helper.make_model(graph), tmp_path / "model.onnx")
    assert onnx_last.write(tmp_path / "model.onnx") is None
    assert onnx_last.graphs(tmp_path) == {} and not (tmp_path / "model.last.onnx").exists()


def test_a_packed_graph_of_the_dynamic_engine_is_left_alone(tmp_path):
    """A graph built with PagedAttention (onnxruntime-genai's continuous-batching engine) packs every sequence's
    tokens into one axis: hidden [tokens, H], logits [tokens, V]. Gathering position -1 of axis 1 there took a
    hidden column, and llmopt serve died loading the graph (MatMul: incompatible dimensions, an H100, 2026-12-06)."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((8, 48)).astype(np.float32), "lm_head.weight")
    nodes = [helper.make_node("PagedAttention", ["x"], ["hidden"], name="/model/layers.0/attn/PagedAttention",
                              domain="com.microsoft"),
             helper.make_node("MatMul", ["hidden", "lm_head.weight"], ["logits"], name="/lm_head/MatMul")]
    graph = helper.make_graph(nodes, "packed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["total_tokens", 8])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["total_tokens", 48])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    onnx.save(model, tmp_path / "model.onnx")
    assert onnx_last.write(tmp_path / "model.onnx") is None
    assert onnx_last.graphs(tmp_path) == {} and not (tmp_path / "model.last.onnx").exists()


def test_an_index_naming_a_missing_graph_is_ignored(tmp_path):
    (tmp_path / "model.onnx").write_bytes(b"")
    (tmp_path / "graphs.json").write_text(json.dumps({"all_logits": "model.onnx", "last_logits": "model.last.onnx"}))
    assert onnx_last.graphs(tmp_path) == {}
