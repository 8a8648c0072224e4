"""Carry a GGUF file's own 4-bit blocks into ONNX MatMulNBits, exactly.

A GGUF source is already quantized. Converting it to float and letting the ONNX
builder quantize again rounds every weight a second time (on the demo model,
+23% perplexity where llama.cpp itself loses nothing). This module takes the
integers and scales from the GGUF file instead:

=========  ===============================  ==========================================
GGUF type  block of 32 input columns        MatMulNBits (block 32)
=========  ===============================  ==========================================
Q4_0       ``w = d * (q - 8)``, q 0..15     codes q, scale d, zero point 8: exact
Q4_1       ``w = d * q + m``, q 0..15       codes q, scale d, integer zero point
                                            z = round(-m / d), and a per-block
                                            residual ``r = m + d * z`` (see below)
Q8_0       ``w = d * q``, q -128..127       8-bit LM head: its own codes (+128) and
                                            scales written over the builder's, which
                                            scale by amax / 128 (``carry_q8_head``)
=========  ===============================  ==========================================

MatMulNBits zero points are integers on the fast CPU path (float zero points run a
dequantize-then-GEMM fallback, about 60x slower per call). Q4_1's minimum ``m`` is a
float, so the integer zero point leaves a residual per block, and the rest is exact
algebra: ``y_n = sum_b sum_k x_k (d (q - z) + r)_nb = MatMulNBits(x)_n + sum_b r_nb * s_b``
with ``s_b`` the sum of the inputs in block ``b``. The export adds that second term as a
small float MatMul over the block sums (``add_block_residuals``), so the ONNX model
computes the GGUF weights themselves. The 4-bit linears go to the builder in the
AutoGPTQ layout (``gptq_layout``); every other tensor (embedding, norms) is the GGUF
value in float32. Supported: the llama architecture (GGUF ``general.architecture``),
linear tensors of type Q4_0 or Q4_1, embedding/LM head of any type gguf dequantizes.
Needs: gguf, numpy, torch, safetensors, onnx.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np

from llmopt.backends.export import gptq_layout

BLOCK = 32
Q4_TYPES = ("Q4_0", "Q4_1")
# GGUF tensor name (in blk.N) -> Hugging Face module (in model.layers.N)
LAYER_LINEARS = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                 "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                 "ffn_down": "mlp.down_proj"}
LAYER_OTHERS = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
          "output.weight": "lm_head.weight"}


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face tensor name of a GGUF tensor of the llama architecture (None: not mapped)."""
    if gguf_name in GLOBAL:
        return GLOBAL[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) != 4 or parts[0] != "blk" or parts[3] != "weight":
        return None
    module = LAYER_LINEARS.get(parts[2]) or LAYER_OTHERS.get(parts[2])
    return f"model.layers.{parts[1]}.{module}.weight" if module else None


def is_layer_linear(gguf_name: str) -> bool:
    parts = gguf_name.split(".")
    return len(parts) == 4 and parts[0] == "blk" and parts[2] in LAYER_LINEARS


def problem(path: Path) -> str | None:
    """Why the 4-bit blocks of this GGUF file cannot be carried into ONNX, or None when they can."""
    import gguf

    from llmopt.model.modelinfo import read_gguf_header

    meta, types = read_gguf_header(path, types=True)
    arch = meta.get("general.architecture", "?")
    if arch != "llama":
        return f"its architecture is {arch!r}; carrying GGUF blocks is supported for llama"
    kinds = {gguf.GGMLQuantizationType(t).name for n, t in types.items() if is_layer_linear(n)}
    if not kinds or not kinds <= set(Q4_TYPES):
        return f"its linear layers are {'/'.join(sorted(kinds)) or 'absent'}, not Q4_0/Q4_1"
    return None


GGML_FLOAT_TYPES = {0: "F32", 1: "F16", 30: "BF16"}
GGML_Q4_1 = 3


def carried_blocks(path: Path) -> dict:
    """What carrying this file's blocks writes, from its header: per Hugging Face linear kind the share
    of layers stored as Q4_1 (each adds a residual table), and the LM head's precision (int8 unless the
    head, or the tied embedding it computes with, is a float tensor)."""
    from llmopt.model.modelinfo import read_gguf_header

    _, types = read_gguf_header(path, types=True)
    counts: dict[str, list[int]] = {}
    for name, kind in types.items():
        if is_layer_linear(name):
            linear = LAYER_LINEARS[name.split(".")[2]].split(".")[-1]
            counts.setdefault(linear, []).append(kind == GGML_Q4_1)
    head = types.get("output.weight", types.get("token_embd.weight"))
    return {"residual": {kind: sum(flags) / len(flags) for kind, flags in counts.items()},
            "lm_head": "float" if head in GGML_FLOAT_TYPES else "int8"}


def q4_blocks(kind: str, raw: np.ndarray, rows: int, cols: int):
    """(codes uint8 [rows, cols], d float32 [rows, cols/32], m float32 [rows, cols/32] or None) of a
    Q4_0 / Q4_1 tensor. A block is fp16 d (and fp16 m for Q4_1), then 16 bytes: byte j holds
    element j in its low nibble and element j + 16 in its high nibble."""
    head = 2 if kind == "Q4_0" else 4
    blocks = np.ascontiguousarray(raw).reshape(rows, cols // BLOCK, head + BLOCK // 2)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32) if kind == "Q4_1" else None
    qs = blocks[..., head:]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(rows, cols)
    return codes, d, m


def dequantize_q4(codes: np.ndarray, d: np.ndarray, m: np.ndarray | None) -> np.ndarray:
    """float32 [rows, cols] weights of Q4_0 (m None) or Q4_1 blocks, as gguf/llama.cpp compute them."""
    rows, cols = codes.shape
    q = codes.reshape(rows, cols // BLOCK, BLOCK).astype(np.float32)
    w = d[..., None] * (q - 8) if m is None else d[..., None] * q + m[..., None]
    return w.reshape(rows, cols)


def integer_form(d: np.ndarray, m: np.ndarray | None):
    """(zero points uint8 0..15, residual float32 or None): ``d * q + m == d * (q - z) + r`` per block."""
    if m is None:
        return np.full(d.shape, 8, np.uint8), None
    ratio = np.divide(-m, d, out=np.full_like(m, 8.0), where=d != 0)
    zeros = np.clip(np.rint(ratio), 0, 15).astype(np.uint8)
    return zeros, (m + d * zeros.astype(np.float32)).astype(np.float32)


def unpermute_rows(x: np.ndarray, heads: int) -> np.ndarray:
    """Undo the rotary row interleaving llama.cpp's converter applies to attn_q / attn_k rows
    (the inverse transformers applies on load), for any per-row array."""
    dim = x.shape[0] // heads // 2
    return x.reshape(heads, dim, 2, *x.shape[1:]).swapaxes(2, 1).reshape(x.shape)


def open_gguf(path: Path):
    """The file's ``gguf.GGUFReader`` (memory-mapped). Parsing its header takes seconds for a
    large vocabulary, so one export opens it once and hands the reader to every step below."""
    import gguf

    return gguf.GGUFReader(path)


def read(reader) -> tuple[dict, dict, dict]:
    """(linears, others, meta) of a llama GGUF file (its reader). linears: HF weight name ->
    (codes, d, m) with rows in the Hugging Face order; others: HF name -> float32 array; meta:
    head counts."""
    import gguf


    def field(key, default=None):
        f = reader.fields.get(key)
        return default if f is None else int(f.parts[-1][0])

    heads = field("llama.attention.head_count")
    kv_heads = field("llama.attention.head_count_kv", heads)
    linears, others = {}, {}
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        if name is None:
            continue
        kind = tensor.tensor_type.name
        cols, rows = (int(v) for v in tensor.shape[:2]) if len(tensor.shape) == 2 else (int(tensor.shape[0]), 1)
        part = tensor.name.split(".")[-2]
        if is_layer_linear(tensor.name) and kind in Q4_TYPES:
            arrays = list(q4_blocks(kind, tensor.data, rows, cols))
            if part in ("attn_q", "attn_k"):
                n = heads if part == "attn_q" else kv_heads
                arrays = [a if a is None else unpermute_rows(a, n) for a in arrays]
            linears[name] = tuple(arrays)
        else:
            value = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
            value = value.reshape(rows, cols) if len(tensor.shape) == 2 else value.reshape(cols)
            if part in ("attn_q", "attn_k"):
                value = unpermute_rows(value, heads if part == "attn_q" else kv_heads)
            others[name] = value
    return linears, others, {"heads": heads, "kv_heads": kv_heads}


def write_gptq_folder(reader, hf_dir: Path, dst: Path) -> tuple[dict, dict]:
    """An AutoGPTQ folder (group 32, asymmetric) for the builder, from the GGUF blocks and the
    converted Hugging Face folder's config and tokenizer; returns (summary, residuals: linear
    name -> float32 [out, in/32], for Q4_1 linears).

    Every 4-bit weight is checked against the Hugging Face folder the source stage converted
    (same values, up to that folder's dtype), so a wrong name or row order cannot pass."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    linears, others, _ = read(reader)
    hf_tensors = {}
    for shard in sorted(hf_dir.glob("*.safetensors")):
        with safe_open(shard, "pt") as f:
            hf_tensors |= {key: (shard, key) for key in f.keys()}

    def hf_value(name):
        shard, key = hf_tensors[name]
        with safe_open(shard, "pt") as f:
            return f.get_tensor(key)

    missing = sorted(set(linears) - set(hf_tensors))
    if missing:
        raise ValueError(f"the converted model has no {missing[0]} (and {len(missing) - 1} more)")
    dst.mkdir(parents=True, exist_ok=True)
    out, residuals, largest = {}, {}, 0.0
    for name, (codes, d, m) in sorted(linears.items()):
        reference = hf_value(name)
        ours = torch.from_numpy(dequantize_q4(codes, d, m))
        if not torch.equal(ours.to(reference.dtype), reference):
            raise ValueError(f"{name}: the GGUF blocks do not dequantize to the converted weights")
        zeros, residual = integer_form(d, m)
        base = name.removesuffix(".weight")
        out |= {f"{base}.{k}": v for k, v in gptq_layout.to_gptq(
            torch.from_numpy(codes.astype(np.int32)), torch.from_numpy(zeros.astype(np.int32)),
            torch.from_numpy(d), BLOCK).items()}
        if residual is not None:
            residuals[base] = residual
            largest = max(largest, float(np.abs(residual).max()))
    for name in hf_tensors:
        if name in linears:
            continue
        value = others.get(name)
        out[name] = torch.from_numpy(value) if value is not None else hf_value(name).to(torch.float32)
    save_file(out, dst / "model.safetensors", metadata={"format": "pt"})
    for path in hf_dir.iterdir():
        if path.is_file() and path.suffix != ".safetensors" and not path.name.endswith(".index.json") \
                and path.name != "config.json":
            shutil.copy2(path, dst / path.name)
    config = json.loads((hf_dir / "config.json").read_text())
    config["torch_dtype"] = config["dtype"] = "float32"
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": BLOCK, "desc_act": False,
                                     "sym": False, "checkpoint_format": "gptq"}
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    summary = {"linears": len(linears), "with_residual": len(residuals), "largest_residual": largest,
               "lm_head_quantized": False, "group_size": BLOCK}
    return summary, residuals


NODE = re.compile(r"^/model/layers\.(\d+)/(attn|mlp)/(\w+?)_proj/MatMulNBits$")
PARTS = {"qkv": ("q", "k", "v"), "gate_up": ("gate", "up")}


def node_linears(node_name: str) -> list[str] | None:
    """The Hugging Face linears (in output order) behind a builder MatMulNBits node, or None."""
    match = NODE.match(node_name)
    if not match:
        return None
    layer, block, proj = match.groups()
    module = "self_attn" if block == "attn" else "mlp"
    return [f"model.layers.{layer}.{module}.{p}_proj" for p in PARTS.get(proj, (proj,))]


def add_block_residuals(model_file: Path, residuals: dict) -> dict:
    """Add ``MatMul(blocksum(x), residual^T)`` to every MatMulNBits whose linears have a residual.

    The block sums of one input are computed once and shared by the nodes reading it (q/k/v,
    gate/up). The residual tables are appended to the model's external data file."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(model_file, load_external_data=False)
    graph = model.graph
    attrs = lambda node: {a.name: helper.get_attribute_value(a) for a in node.attribute}  # noqa: E731
    data_file = next((e.value for i in graph.initializer for e in i.external_data if e.key == "location"), None)
    block_sums: dict[str, str] = {}
    new_nodes: list[tuple[int, list]] = []
    used: set[str] = set()
    for index, node in enumerate(graph.node):
        names = node_linears(node.name) if node.op_type == "MatMulNBits" else None
        if not names or not all(n in residuals for n in names):
            continue
        a = attrs(node)
        table = np.concatenate([residuals[n] for n in names], axis=0)
        if a.get("block_size") != BLOCK or table.shape != (a["N"], a["K"] // BLOCK):
            raise ValueError(f"{node.name}: residual {table.shape} does not fit N={a['N']}, K={a['K']}, "
                             f"block {a.get('block_size')}")
        used.update(names)
        nodes = []
        x = node.input[0]
        if x not in block_sums:
            stem = f"/gguf_residual/{len(block_sums)}"
            graph.initializer.append(numpy_helper.from_array(np.array([0, 0, -1, BLOCK], np.int64), f"{stem}/shape"))
            graph.initializer.append(numpy_helper.from_array(np.array([-1], np.int64), f"{stem}/axes"))
            nodes += [helper.make_node("Reshape", [x, f"{stem}/shape"], [f"{stem}/blocks"], name=f"{stem}/Reshape"),
                      helper.make_node("ReduceSum", [f"{stem}/blocks", f"{stem}/axes"], [f"{stem}/sums"],
                                       name=f"{stem}/ReduceSum", keepdims=0)]
            block_sums[x] = f"{stem}/sums"
        stem = node.name.rsplit("/", 1)[0] + "/gguf_residual"
        weight = numpy_helper.from_array(np.ascontiguousarray(table.T, dtype=np.float32), f"{stem}.weight")
        graph.initializer.append(weight)
        raw = node.output[0] + "/int4"
        final = node.output[0]
        node.output[0] = raw
        nodes += [helper.make_node("MatMul", [block_sums[x], weight.name], [f"{stem}/output_0"], name=f"{stem}/MatMul"),
                  helper.make_node("Add", [raw, f"{stem}/output_0"], [final], name=f"{stem}/Add")]
        new_nodes.append((index, nodes))
    built_layers = {n.split(".")[2] for n in used}
    left = sorted(n for n in set(residuals) - used if n.split(".")[2] in built_layers)
    if left:  # a layer the builder left out (num_hidden_layers) has no node to correct; a built one must
        raise ValueError(f"no MatMulNBits node found for {left[0]} (and {len(left) - 1} more)")
    for index, nodes in reversed(new_nodes):
        for offset, extra in enumerate(nodes):
            graph.node.insert(index + 1 + offset, extra)
    onnx.save_model(model, model_file, save_as_external_data=bool(data_file), location=data_file or None)
    return {"nodes": len(new_nodes), "block_sums": len(block_sums)}


def q8_blocks(raw: np.ndarray, rows: int, cols: int):
    """(codes int8 [rows, cols], d float32 [rows, cols/32]) of a Q8_0 tensor: fp16 d, then 32 int8."""
    blocks = np.ascontiguousarray(raw).reshape(rows, cols // BLOCK, 2 + BLOCK)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    return blocks[..., 2:].copy().view(np.int8).reshape(rows, cols), d


def head_tensor(reader):
    """The GGUF tensor the LM head computes with: ``output.weight``, or the tied ``token_embd.weight``."""
    tensors = {t.name: t for t in reader.tensors}
    return tensors.get("output.weight") or tensors["token_embd.weight"]


def carry_q8_head(model_file: Path, reader) -> bool:
    """Write a Q8_0 LM head's own codes and scales over the builder's 8-bit ones (which use
    ``amax / 128`` where Q8_0 has ``amax / 127``). Same shapes, rewritten in place in the external
    data file; returns whether the head was carried."""
    import onnx
    from onnx import helper

    tensor = head_tensor(reader)
    if tensor.tensor_type.name != "Q8_0":
        return False
    model = onnx.load(model_file, load_external_data=False)
    node = next((n for n in model.graph.node if n.op_type == "MatMulNBits" and n.name.startswith("/lm_head/")), None)
    if node is None:
        return False
    a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
    cols, rows = (int(v) for v in tensor.shape[:2])
    if (a.get("bits"), a.get("block_size"), a["N"], a["K"]) != (8, BLOCK, rows, cols) or \
            (len(node.input) > 3 and node.input[3]):
        return False
    codes, d = q8_blocks(tensor.data, rows, cols)
    inits = {i.name: i for i in model.graph.initializer}
    for name, value in ((node.input[1], (codes.astype(np.int16) + 128).astype(np.uint8)), (node.input[2], d)):
        write_external(inits[name], model_file.parent, value)
    return True


def write_external(tensor, base: Path, value: np.ndarray) -> None:
    """Overwrite an externally stored initializer's bytes in place (same type and size)."""
    from onnx import helper

    info = {e.key: e.value for e in tensor.external_data}
    if "location" not in info:
        raise ValueError(f"{tensor.name} is not stored externally")
    want = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type))
    data = np.ascontiguousarray(value, dtype=want).tobytes()
    if int(info.get("length", len(data))) != len(data):
        raise ValueError(f"{tensor.name}: {len(data)} bytes do not replace {info.get('length')}")
    with open(base / info["location"], "r+b") as f:
        f.seek(int(info.get("offset", 0)))
        f.write(data)


def unpack_low_first(packed: np.ndarray, count: int) -> np.ndarray:
    """uint8 bytes of two 4-bit values each (low nibble first) -> the first ``count`` values per row."""
    values = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(packed.shape[0], -1)
    return values[:, :count]


def node_weights(node, array) -> np.ndarray:
    """float32 [N, K] weights a MatMulNBits node computes with: (code - zero) * scale per block."""
    from onnx import helper

    a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
    n_out, k, bits = a["N"], a["K"], a.get("bits", 4)
    blocks = -(-k // a["block_size"])
    raw = array(node.input[1]).reshape(n_out, -1)
    codes = (unpack_low_first(raw, k) if bits == 4 else raw[:, :k]).astype(np.float32)
    scales = array(node.input[2]).astype(np.float32).reshape(n_out, blocks)
    if len(node.input) > 3 and node.input[3]:
        zp = array(node.input[3]).reshape(n_out, -1)
        zeros = (unpack_low_first(zp, blocks) if bits == 4 else zp[:, :blocks]).astype(np.float32)
    else:
        zeros = np.full((n_out, blocks), 2 ** (bits - 1), np.float32)
    return ((codes.reshape(n_out, blocks, -1) - zeros[..., None]) * scales[..., None]).reshape(n_out, k)


def max_weight_error(model_file: Path, reader) -> dict:
    """Largest |W_onnx - W_gguf| over the 4-bit linears (each MatMulNBits node plus its residual) and
    over a quantized LM head, against the GGUF tensors dequantized as llama.cpp does. Zero up to
    float32 rounding when the carry is exact."""
    import onnx
    from onnx import numpy_helper

    linears, others, _ = read(reader)
    model = onnx.load(model_file, load_external_data=False)
    base = str(model_file.parent)
    inits = {i.name: i for i in model.graph.initializer}
    array = lambda name: numpy_helper.to_array(inits[name], base)  # noqa: E731
    out = {"nodes": 0, "max_abs_error": 0.0, "max_abs_weight": 0.0, "lm_head_max_abs_error": None}
    for node in model.graph.node:
        if node.op_type != "MatMulNBits":
            continue
        if node.name.startswith("/lm_head/"):
            head = others.get("lm_head.weight", others.get("model.embed_tokens.weight"))
            out["lm_head_max_abs_error"] = float(np.abs(node_weights(node, array) - head).max())
            continue
        names = node_linears(node.name)
        if not names or not all(n + ".weight" in linears for n in names):
            continue
        ours = node_weights(node, array)
        stem = node.name.rsplit("/", 1)[0] + "/gguf_residual"
        if f"{stem}.weight" in inits:
            ours = (ours.reshape(ours.shape[0], -1, BLOCK) + array(f"{stem}.weight").T[..., None]).reshape(ours.shape)
        target = np.concatenate([dequantize_q4(*linears[n + ".weight"]) for n in names])
        out["max_abs_error"] = max(out["max_abs_error"], float(np.abs(ours - target).max()))
        out["max_abs_weight"] = max(out["max_abs_weight"], float(np.abs(target).max()))
        out["nodes"] += 1
    return out
