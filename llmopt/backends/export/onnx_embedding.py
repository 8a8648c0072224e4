"""The ONNX export's token embedding: float ``Gather`` or block-quantized ``GatherBlockQuantized``.

ONNX Runtime's ``GatherBlockQuantized`` (com.microsoft) reads a table quantized in blocks of
``block_size`` columns, 4 or 8 bits a value and a scale per block, and dequantizes only the
rows it gathers. Where the table comes from:

* int4: the model builder's own quantizer. ``op_types_to_quantize = MatMul/Gather`` makes
  onnxruntime's ``MatMulNBitsQuantizer`` turn ``/model/embed_tokens/Gather`` into a 4-bit
  ``GatherBlockQuantized`` with the body's ``block_size`` and symmetry; a tied model whose LM
  head is int4 shares that head's codes instead (``shared_embeddings``);
* int8, tied to an int8 LM head (``lm_head = "int8"`` on an int4 export): the builder, asked to share the
  tables, writes a ``GatherBlockQuantized`` of 8 bits over the head's table but names initializers its
  quantizer does not write (``lm_head.MatMul.weight_Q8G32`` and ``_scale``, where the symmetric 8-bit
  MatMulNBits holds ``weight_Q8`` and ``weight_scales``); ``wire_shared_head`` points it at the head's own, so
  the model keeps one 8-bit table (the kernel's zero point of 128 is the head's too);
* int8 otherwise: the builder refuses 8-bit embeddings and ``MatMulNBitsQuantizer`` quantizes Gather to
  4 bits only, while the kernel reads 8-bit tables (``bits = 8``, uint8 codes, zero point 128
  when none is given). ``quantize_int8`` writes that node after the build: symmetric blocks,
  ``scale = max |w| / 127`` (Q8_0's rule; a GGUF source's Q8_0 table is not carried exactly, as
  its blocks are: it reaches the builder as float and is rounded again), scales in the table's
  own dtype.

Plain functions, used by the onnx export stage. Needs: onnx_ir, numpy.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

EMBED_NODE = "/model/embed_tokens"


def quantize_int8(model_file: Path, block_size: int, work: Path) -> dict:
    """Replace the float embedding ``Gather`` of ``model_file`` (external data beside it) with an 8-bit
    ``GatherBlockQuantized`` and rewrite the model and its data file; returns ``describe``'s summary."""
    import onnx_ir as ir

    model = ir.load(model_file)
    node = next((n for n in model.graph if n.op_type == "Gather" and n.name.startswith(EMBED_NODE)), None)
    table = node.inputs[0] if node is not None else None
    if table is None or table.const_value is None:
        raise ValueError(f"{model_file.name} has no float embedding Gather with a constant table to quantize")
    weights = table.const_value.numpy()
    codes, scales = int8_blocks(weights.astype(np.float32), block_size)
    codes_value = ir.Value(name=f"{table.name}_Q8", const_value=ir.tensor(codes, name=f"{table.name}_Q8"))
    scales_value = ir.Value(name=f"{table.name}_scales",
                            const_value=ir.tensor(scales.astype(weights.dtype), name=f"{table.name}_scales"))
    for value in (codes_value, scales_value):
        model.graph.register_initializer(value)
    gathered = ir.node("GatherBlockQuantized", [codes_value, node.inputs[1], scales_value], domain="com.microsoft",
                       attributes={"bits": 8, "block_size": block_size, "gather_axis": 0, "quantize_axis": 1},
                       name=f"{node.name}_Q8", num_outputs=1)
    ir.convenience.replace_nodes_and_values(model.graph, node, [node], [gathered], node.outputs, gathered.outputs)
    model.graph.initializers.pop(table.name)
    model.opset_imports.setdefault("com.microsoft", 1)
    staged = work / "embedding"
    staged.mkdir(parents=True, exist_ok=True)
    data_name = model_file.name + ".data"
    ir.save(model, staged / model_file.name, external_data=data_name, size_threshold_bytes=0)
    for name in (model_file.name, data_name):
        shutil.move(str(staged / name), str(model_file.parent / name))
    return describe(model_file)


def wire_shared_head(model_file: Path, where: str) -> dict:
    """Point the embedding's ``GatherBlockQuantized`` (and the ``Reshape`` of its table) at the initializers of
    the LM head's MatMulNBits, whose table it shares; rewrites the graph only (the weights are unchanged) and
    returns ``describe``'s summary. Raises StageFailed where the graph has no such pair."""
    import onnx

    from llmopt.errors import StageFailed

    model = onnx.load(model_file, load_external_data=False)
    nodes = {n.name: n for n in model.graph.node}
    gather = next((n for n in model.graph.node
                   if n.op_type == "GatherBlockQuantized" and n.name.startswith(EMBED_NODE)), None)
    head = next((n for n in model.graph.node if n.op_type == "MatMulNBits" and n.name.startswith("/lm_head/")), None)
    reshape = nodes.get(f"{EMBED_NODE}/Reshape")
    if gather is None or head is None or reshape is None or gather.input[0] != reshape.output[0]:
        raise StageFailed(f"{model_file.name} has no embedding GatherBlockQuantized over a Reshape of the LM head's "
                          "table and no 8-bit LM head to share", where=where,
                          fix="set shared_embeddings = false (the embedding keeps a float table of its own)")
    reshape.input[0] = head.input[1]
    del gather.input[2:]
    gather.input.extend(head.input[2:4])  # scales, and zero points where the head has them
    model.graph.ClearField("value_info")  # shapes the builder inferred around the misnamed inputs
    onnx.save(model, model_file)
    return describe(model_file)


def int8_blocks(table: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 codes offset by 128, float32 scales) of a [rows, cols] table in blocks along its columns."""
    rows, cols = table.shape
    blocks = table.reshape(rows, cols // block_size, block_size)
    scales = np.abs(blocks).max(axis=-1) / 127
    safe = np.where(scales == 0, 1, scales)
    codes = np.clip(np.rint(blocks / safe[..., None]), -127, 127).astype(np.int16) + 128
    return codes.astype(np.uint8).reshape(rows, cols), scales.astype(np.float32)


def describe(model_file: Path) -> dict:
    """How the graph gathers its token embeddings: op, bits, block size, and whether the table is the LM head's."""
    import onnx

    model = onnx.load(model_file, load_external_data=False)
    node = next((n for n in model.graph.node if n.name.startswith(EMBED_NODE) and "Gather" in n.op_type), None)
    if node is None:
        return {"op": None}
    if node.op_type == "Gather":
        return {"op": "Gather", "bits": None, "shared_with_lm_head": "lm_head" in " ".join(
            i for n in model.graph.node if n.output and node.input[0] in n.output for i in n.input)}
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    return {"op": node.op_type, "bits": int(attrs.get("bits", 4)), "block_size": int(attrs["block_size"]),
            "shared_with_lm_head": not node.input[0].startswith("model.embed_tokens")}


def problems(options, info, head: str, default_shared: bool, ctx, block_sizes: tuple[int, ...]) -> list:
    """Plan-time problems of ``embedding`` for this model (``head``: the LM head's precision; ``default_shared``:
    whether the table would be the head's under ``embedding = "auto"``)."""
    wanted = options.embedding
    if wanted == "auto":
        return []
    out = []
    if wanted == "int4" and options.precision != "int4":
        out.append(ctx.problem(f"embedding = \"int4\" is quantized by the builder's int4 quantizer, which precision "
                               f"{options.precision!r} does not run", "embedding",
                               hint="set precision = \"int4\", or embedding = \"int8\""))
    if options.shared_embeddings and wanted != head:
        out.append(ctx.problem(f"shared_embeddings = true makes the embedding read the LM head's {head} table, "
                               f"not an {wanted} one", "embedding",
                               hint=f"remove shared_embeddings (the embedding keeps its own table), or set "
                               f"embedding = \"{head}\""))
    elif default_shared and wanted != head and info.tie_embeddings:
        out.append(ctx.problem(f"embedding = \"{wanted}\" gives the tied {head} LM head's table a second copy: the "
                               "embedding is written as its own table", "embedding", severity="warning",
                               hint=f"remove embedding (auto) to keep one {head} table"))
    if wanted in ("int4", "int8") and info.hidden_size % options.block_size:
        fits = [b for b in block_sizes if info.hidden_size % b == 0]
        out.append(ctx.problem(f"block_size {options.block_size} does not divide the embedding width "
                               f"{info.hidden_size}", "block_size",
                               hint=f"use one of: {', '.join(map(str, fits))}" if fits else "keep embedding float"))
    return out
