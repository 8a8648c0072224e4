"""The ONNX export's second graph: logits of the last position only, for generation.

The model builder's graph computes the LM head at every prompt position: scoring needs
that (perplexity, prompt log-probabilities), generation does not, and on the CPU the head
is a large part of a prefill (an 8-bit 49152 x 576 head took 23% of a 512-token prefill of
the demo model). ``write`` adds ``model.last.onnx`` beside ``model.onnx``: the same nodes
and the same external data file, with ``Gather(axis=1, index=-1)`` + ``Unsqueeze`` in front
of the head, so its ``logits`` are ``[batch, 1, vocab]`` (what the builder's own
``prune_lm_head`` writes, which onnxruntime-genai reads). ``graphs.json`` names both
graphs; ``genai_config.json`` keeps pointing at the full one, so every other reader of the
folder sees the folder as before. The onnxruntime runtime generates from the last-position
graph and scores with the full one (``llmopt.runtimes.onnx``).

Plain functions, used by the onnx export stage; ``graphs.json``'s reader, ``graphs``, is the
runtime's (``llmopt.runtimes.onnx``). Needs: onnx.
"""

from __future__ import annotations

import json
from pathlib import Path

from llmopt.runtimes.onnx import INDEX, graphs  # noqa: F401 (graphs: the index's reader, beside its runtime)

GRAPH = "model.last.onnx"
HEAD_OPS = ("MatMul", "MatMulNBits")


def write(model_file: Path) -> dict | None:
    """Write the last-position graph of ``model_file`` and ``graphs.json`` beside it; returns the index
    written, or None when the graph has no ``logits`` computed by a MatMul (nothing to prune) or is packed: a
    graph built with PagedAttention for onnxruntime-genai's continuous-batching engine holds every sequence's
    tokens on one axis (logits ``[tokens, vocab]``), and that engine picks each sequence's last position itself."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(model_file, load_external_data=False)
    graph = model.graph
    head = head_node(graph)
    if head is None or packed(graph):
        return None
    index = helper.make_tensor("/lm_head/last/index", TensorProto.INT64, [], [-1])
    axes = helper.make_tensor("/lm_head/last/axes", TensorProto.INT64, [1], [1])
    graph.initializer.extend([index, axes])
    gathered, last = "/lm_head/last/Gather/output_0", "/lm_head/last/Unsqueeze/output_0"
    nodes = [helper.make_node("Gather", [head.input[0], index.name], [gathered], name="/lm_head/last/Gather", axis=1),
             helper.make_node("Unsqueeze", [gathered, axes.name], [last], name="/lm_head/last/Unsqueeze")]
    head.input[0] = last
    at = list(graph.node).index(head)
    for node in reversed(nodes):
        graph.node.insert(at, node)
    logits = next(o for o in graph.output if o.name == "logits")
    dims = logits.type.tensor_type.shape.dim
    if len(dims) == 3:
        dims[1].Clear()
        dims[1].dim_value = 1
    onnx.save(model, model_file.parent / GRAPH)  # external data stays where model_file's points
    written = {"all_logits": model_file.name, "last_logits": GRAPH}
    (model_file.parent / INDEX).write_text(json.dumps(written, indent=2) + "\n")
    return written


def packed(graph) -> bool:
    """Whether the graph's sequences are packed on one axis (PagedAttention, logits of rank 2), not [batch, seq]."""
    logits = next((o for o in graph.output if o.name == "logits"), None)
    rank = len(logits.type.tensor_type.shape.dim) if logits is not None else None
    return rank == 2 or any(node.op_type == "PagedAttention" for node in graph.node)


def head_node(graph):
    """The MatMul (or MatMulNBits) node the ``logits`` output comes from, through single-input ops after it
    (bias, scale, cast), or None."""
    producer = {out: node for node in graph.node for out in node.output}
    node = producer.get("logits")
    while node is not None and node.op_type not in HEAD_OPS:
        node = producer.get(node.input[0]) if node.input else None
    return node
