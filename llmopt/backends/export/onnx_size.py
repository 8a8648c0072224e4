"""What the ONNX export writes, tensor by tensor, for the size model (``llmopt.model.estimates``).

Measured on the model builder of onnxruntime-genai 0.18 (the tiny llama of the tests and
SmolLM2-135M):

* every float tensor (embedding, float LM head, norms, rotary cos/sin caches: two pairs for Gemma 3, whose
  full and sliding layers have RoPE bases of their own) is in the
  builder's io dtype: float32 for fp32 and for int4/int8 on the CPU EP, bfloat16 for bf16,
  float16 otherwise;
* MatMulNBits: codes of 4 or 8 bits per block of ``block_size`` columns, a scale per block
  in the io dtype, a zero point (the same bits, two 4-bit ones to a byte) per block when
  asymmetric or with ``k_quant``; a pre-quantized checkpoint keeps its own group size and
  always writes its zero points (``qzeros``); carried GGUF blocks are asymmetric 32-column
  blocks, and each Q4_1 linear adds a float32 residual per block;
* the embedding shares one table with a tied LM head when both are float, both int4, or the head is int8 in an
  int4 export (GatherBlockQuantized over the head's codes, ``onnx_embedding.wire_shared_head``); otherwise the
  embedding is its own table: float (49152 x 576 float32: 113 MB of the quickstart with its table kept apart,
  ``shared_embeddings = false``) or, with ``embedding``, GatherBlockQuantized
  codes of 4 or 8 bits per ``block_size`` columns with a scale per block in the io dtype
  (and a 4-bit zero point per block for asymmetric int4);
* linears a checkpoint kept at 8 bits (``sensitive_layers``) are 8-bit MatMulNBits in the same groups, each
  with an 8-bit zero point;
* ``model.onnx`` holds the graph; the weights are in ``model.onnx.data``, next to
  ``genai_config.json`` and the tokenizer files.
"""

from __future__ import annotations

from llmopt.model import estimates
QUANTIZED = ("int4", "int8")
IO_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
RESIDUAL_GRAPH_BYTES_PER_LAYER = 4_250  # the Q4_1 residual nodes of one layer (SmolLM2: a 391 KB graph, not 263 KB)
GRAPHS_INDEX_BYTES = 70  # graphs.json (onnx_last)
ROTARY_CACHES = {"gemma3_text": 2, "gemma3": 2}  # cos/sin caches of the full layers and of the sliding ones
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json")


def io_dtype(options) -> str:
    """The dtype of the graph's float tensors, as the builder chooses it."""
    if options.precision in QUANTIZED and options.execution_provider == "cpu":
        return "float32"
    return IO_DTYPES.get(options.precision, "float16")


def nbits(options, precision: str, io: str, zero_points: bool | None = None) -> estimates.Stored:
    """A MatMulNBits weight the builder quantizes itself (``precision`` int4 or int8)."""
    bits = 4 if precision == "int4" else 8
    if zero_points is None:
        zero_points = not options.is_symmetric or options.algo_config == "k_quant"
    what = f"{precision} MatMulNBits, {io} scale{' + zero point' if zero_points else ''} per {options.block_size} columns"
    return estimates.Stored(bits, options.block_size, estimates.DTYPE_BYTES[io], bits if zero_points else 0,
                            tensors=3 if zero_points else 2, what=what)


def mixed_share(layers: int) -> float:
    """The share of layers whose qkv and down projections ``mixed_layers = "int8"`` keeps at 8 bits
    (the builder's rule, after llama.cpp: the first and last eighth, and every third one between)."""
    upgraded = [i for i in range(layers) if i < layers / 8 or i >= 7 * layers / 8 or (i - round(layers / 8)) % 3 == 2]
    return len(upgraded) / layers if layers else 0.0


def with_int8_share(stored: estimates.Stored, share: float) -> estimates.Stored:
    """A 4-bit MatMulNBits of which ``share`` of the layers are 8-bit: the mean of both per weight."""
    from dataclasses import replace

    zero = stored.zero_bits + (8 - stored.zero_bits) * share if stored.zero_bits else 0
    return replace(stored, bits=4 + 4 * share, zero_bits=zero, what=f"{stored.what}; {share:.0%} of layers int8")


def linears(options, before: estimates.Layout, info, io: str, carried: dict | None) -> dict[str, estimates.Stored]:
    """How each decoder linear is written: carried GGUF blocks, a pre-quantized checkpoint's own groups,
    the builder's blocks, or float."""
    scale = estimates.DTYPE_BYTES[io]
    if carried is not None:
        return {kind: estimates.Stored(4, 32, scale + 4 * carried["residual"].get(kind, 0.0), 4, tensors=3,
                                       what=f"int4 MatMulNBits (GGUF blocks), {io} scale + zero point per 32 columns"
                                       + (", float32 Q4_1 residual per block" if carried["residual"].get(kind) else ""))
                for kind in estimates.LINEARS}
    if before.quantized:
        return {kind: estimates.Stored(4, stored.group, scale, 4, tensors=3,
                                       what=f"int4 MatMulNBits (the checkpoint's), {io} scale + zero point per "
                                       f"{stored.group} columns") if stored.bits == 4 else stored
                for kind, stored in before.linears.items()}
    if options.precision not in QUANTIZED:
        return {kind: estimates.float_stored(io) for kind in estimates.LINEARS}
    stored = nbits(options, options.precision, io)
    out = {kind: stored for kind in estimates.LINEARS}
    if options.mixed_layers == "int8" and options.precision == "int4":
        share = mixed_share(info.num_layers)
        out |= {kind: with_int8_share(stored, share) for kind in ("q_proj", "k_proj", "v_proj", "down_proj")}
    return out


def head_and_embedding(options, info, io: str, head: str, shared: bool, gguf: bool):
    """(embedding, LM head or None) as written: one table when shared and both float, or quantized in an int4
    export."""
    plain = estimates.float_stored(io)
    if options.exclude_lm_head:
        return embedding_table(options, io), None
    if head == "float":
        lm_head = plain
    else:  # GGUF heads and the heads of symmetric exports have no zero points
        lm_head = nbits(options, head, io, zero_points=False if gguf else None)
    both_float = head == "float" and options.precision not in QUANTIZED
    quantized = head in QUANTIZED and options.precision == "int4"  # 4-bit tables, and an 8-bit head's (wired)
    one_table = shared and info.tie_embeddings and (both_float or quantized)
    if one_table and quantized:
        from dataclasses import replace

        lm_head = replace(lm_head, what=f"{lm_head.what}: the LM head's, which the embedding's "
                          "GatherBlockQuantized reads")
    return (lm_head, None) if one_table else (embedding_table(options, io), lm_head)


def embedding_table(options, io: str) -> estimates.Stored:
    """An embedding table of its own: float, or GatherBlockQuantized blocks (``embedding``)."""
    if options.embedding not in QUANTIZED:
        return estimates.float_stored(io)
    bits = 4 if options.embedding == "int4" else 8
    zero = bits if bits == 4 and not options.is_symmetric else 0  # the int8 table is symmetric (zero point 128)
    return estimates.Stored(bits, options.block_size, estimates.DTYPE_BYTES[io], zero, tensors=3 if zero else 2,
                            what=f"{options.embedding} GatherBlockQuantized, {io} scale per {options.block_size} columns")


def layout(options, before: estimates.Layout, info, carried: dict | None, head: str, shared: bool) -> estimates.Layout:
    """The folder the export writes (``carried``: the GGUF blocks kept, with the share of Q4_1 linears per kind;
    ``head``: the LM head's precision; ``shared``: whether the builder is asked to share the tables)."""
    io = io_dtype(options)
    embedding, lm_head = head_and_embedding(options, info, io, head, shared, carried is not None)
    rotary = 2 * (info.max_position or 4096) * (info.head_dim // 2) * estimates.DTYPE_BYTES[io]
    rotary *= ROTARY_CACHES.get(info.model_type, 1)
    layers = info.num_layers
    files = {name: n for name, n in before.files.items() if name in TOKENIZER_FILES}
    graph = estimates.ONNX_GRAPH_BYTES + layers * estimates.ONNX_GRAPH_BYTES_PER_LAYER
    if carried is not None:
        residual = carried["residual"]
        graph += int(layers * RESIDUAL_GRAPH_BYTES_PER_LAYER * sum(residual.values()) / max(1, len(residual)))
    files |= {"genai_config.json": estimates.GENAI_CONFIG_BYTES, "model.onnx": graph}
    if options.last_logits_graph and not options.exclude_lm_head:  # onnx_last: the same nodes, two more
        files |= {"model.last.onnx": graph, "graphs.json": GRAPHS_INDEX_BYTES}
    notes = before.notes + (f"ONNX Runtime GenAI builder: float tensors in {io}",)
    extra = {"rotary cos/sin caches": rotary}
    if before.kept_parameters and carried is None:
        extra[estimates.KEPT_PART] = kept_bytes(before)
    return estimates.Layout("onnx", io, linears(options, before, info, io, carried), embedding, lm_head,
                            extra, 2, files, 0, notes)


def kept_bytes(before: estimates.Layout) -> int:
    """What a checkpoint's linears kept at 8 bits (``sensitive_layers``) add to its int4 MatMulNBits: four more bits a
    weight, and a zero point of 8 bits instead of 4 per group (the repack writes a zero point for every group)."""
    group = next((s.group for s in before.linears.values() if s.bits == 4 and s.group), None)
    zeros = before.kept_parameters // group // 2 if group else 0
    return before.kept_parameters // 2 + zeros
