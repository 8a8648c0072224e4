"""The size model of what a recipe writes, and the calibration memory, from config facts alone.

Every stage that writes a model folder says how it stores each kind of tensor, in its
own backend file: a ``layout(options, before, ctx) -> Layout`` method that takes the
layout of the folder it reads and returns the one it writes (a stage without the
method writes what it reads: pruning changes shapes, which the model facts carry).
``stage_layouts`` walks the recipe's steps through those methods, and ``size`` turns a
layout and the model's shapes into bytes. The plan's size estimates, the artifact's
manifest and card, and the deploy configs' weight bytes all come from here.

A ``Stored`` is how one weight of ``rows x cols`` is written: codes of ``bits`` packed
into words, a scale (and a zero point) per group of input columns or per output row,
and what comes once per tensor or per input column (a shape, a per-tensor scale, a
``g_idx``). Measured constants are the ones below; every estimate states them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from llmopt.model.modelinfo import DTYPE_BYTES, ModelInfo

SAFETENSORS_TENSOR_BYTES = 104  # header entry per tensor (name, dtype, shape, offsets); measured on llm-compressor output
TOKENIZER_BYTES_PER_TOKEN = 72  # tokenizer.json per vocabulary entry (vocab + merges): SmolLM2 3.52 MB / 49152,
#                                 Llama 3 9.1 MB / 128256; used when the tokenizer files cannot be measured
CONFIG_FILES = {"config.json": 900, "generation_config.json": 220, "tokenizer_config.json": 1000}
ONNX_GRAPH_BYTES = 3_000  # model.onnx without its weights: inputs, outputs, constants ...
ONNX_GRAPH_BYTES_PER_LAYER = 8_700  # ... and one decoder layer's nodes (the builder's llama graph: 263 KB for
#                                     SmolLM2's 30 layers, 20 KB for the tests' 2)
GENAI_CONFIG_BYTES = 1_500
ASSUMES = (f"safetensors header {SAFETENSORS_TENSOR_BYTES} B per tensor",
           f"tokenizer.json {TOKENIZER_BYTES_PER_TOKEN} B per vocabulary entry where the source folder is not local",
           f"model.onnx graph {ONNX_GRAPH_BYTES / 1000:.0f} KB + {ONNX_GRAPH_BYTES_PER_LAYER / 1000:.1f} KB per layer")
KEPT_PART = "sensitive layers at 8 bits (at most)"  # the size's part for linears kept at 8 bits beside 4-bit ones
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".onnx", ".onnx.data", ".data")


@dataclass(frozen=True)
class Stored:
    """How one weight tensor of ``rows x cols`` is written (see the module docstring)."""

    bits: float  # per value: 32/16 float, 8 int8/fp8, 4 int4/fp4 (a mean where layers differ)
    group: int | None = None  # input columns per scale; None: one scale per output row
    scale_bytes: float = 0  # per scale (0: no scales)
    zero_bits: float = 0  # per scale (0: symmetric)
    word_bytes: int = 1  # codes are packed into words of this size along a row
    zero_word_bytes: int = 0  # zero points packed down the rows into words of this size (0: along a row, in bytes)
    tensor_bytes: int = 0  # once per weight: its shape, per-tensor scales
    column_bytes: float = 0  # per input column: g_idx, pre-quantization scales
    tensors: int = 1  # tensors written per weight (codes, scales, zero points, shape...)
    what: str = ""

    @property
    def quantized(self) -> bool:
        return self.bits <= 8

    def groups(self, cols: int) -> int:
        if not (self.scale_bytes or self.zero_bits):
            return 0
        return math.ceil(cols / self.group) if self.group else 1

    def nbytes(self, rows: int, cols: int) -> int:
        word_bits = 8 * self.word_bytes
        codes = rows * math.ceil(cols * self.bits / word_bits) * self.word_bytes
        groups = self.groups(cols)
        if self.zero_word_bytes:
            zeros = math.ceil(rows * self.zero_bits / (8 * self.zero_word_bytes)) * self.zero_word_bytes * groups
        else:
            zeros = rows * math.ceil(groups * self.zero_bits / 8)
        return int(codes + rows * groups * self.scale_bytes + zeros + self.tensor_bytes + cols * self.column_bytes)


def float_stored(dtype: str) -> Stored:
    """A plain tensor in ``dtype`` (float32, bfloat16, float16...)."""
    return Stored(bits=8 * DTYPE_BYTES.get(dtype, 2), what=dtype)


@dataclass(frozen=True)
class Layout:
    """How a model folder stores each kind of tensor, and the other files it holds."""

    format: str  # "safetensors" | "onnx" | another container
    dtype: str  # of the float tensors (norms, and whatever is not quantized)
    linears: dict[str, Stored]  # decoder linear kind (q_proj ... down_proj) -> how it is stored
    embedding: Stored
    lm_head: Stored | None  # None: no table of its own (tied and written once with the embedding, or left out)
    extra: dict[str, int] = field(default_factory=dict)  # further tensors: bytes by what they are
    extra_tensors: int = 0  # how many tensors ``extra`` holds
    files: dict[str, int] = field(default_factory=dict)  # files other than the weights: bytes by name
    tensor_bytes: int = 0  # container metadata per stored tensor (safetensors header entries)
    notes: tuple[str, ...] = ()  # what the writing stages assumed
    kept_parameters: int = 0  # decoder weights kept at 8 bits beside 4-bit ones (sensitive_layers), at most

    def with_linears(self, stored: Stored, kinds=LINEARS) -> Layout:
        return replace(self, linears=self.linears | {kind: stored for kind in kinds})

    @property
    def quantized(self) -> bool:
        return any(s.quantized for s in self.linears.values())


def float_layout(dtype: str, tied: bool, files: dict[str, int] | None = None, notes: tuple[str, ...] = ()) -> Layout:
    """A plain safetensors checkpoint in ``dtype``; a tied LM head is written once, as the embedding."""
    stored = float_stored(dtype)
    return Layout("safetensors", dtype, {kind: stored for kind in LINEARS}, stored, None if tied else stored,
                  files=dict(files or {}), tensor_bytes=SAFETENSORS_TENSOR_BYTES, notes=notes)


def pack_quantized(bits: int, group: int | None, symmetric: bool, scale_dtype: str, g_idx: bool = False) -> Stored:
    """compressed-tensors ``pack-quantized`` (integer weights, 16-bit activations): codes packed into int32
    words, a scale per group (or row) in ``scale_dtype``, zero points packed into int32 when asymmetric,
    the int64 shape, and an int32 ``g_idx`` per input column when groups are reordered."""
    what = f"int{bits} packed in int32, {scale_dtype} scale{'' if symmetric else ' + zero point'} per " + \
        (f"{group} columns" if group else "row") + (", g_idx" if g_idx else "")
    return Stored(bits, group, DTYPE_BYTES.get(scale_dtype, 2), 0 if symmetric else bits, word_bytes=4,
                  zero_word_bytes=4, tensor_bytes=16, column_bytes=4 if g_idx else 0, tensors=3 + (not symmetric) + g_idx, what=what)


def checkpoint_weights(qconfig: dict | None, dtype: str) -> Stored | None:
    """How a pre-quantized checkpoint's linears are stored, from its ``quantization_config`` (None: float,
    or a scheme this model does not know, counted as float)."""
    if not qconfig:
        return None
    method = qconfig.get("quant_method")
    if method in ("gptq", "awq"):  # AutoGPTQ / AutoAWQ: int32 qweight and qzeros, fp16 scales, g_idx
        bits, group = int(qconfig.get("bits", 4)), qconfig.get("group_size") or None
        return Stored(bits, group if group and group > 0 else None, 2, bits, word_bytes=4, zero_word_bytes=4,
                      column_bytes=4, tensors=4, what=f"{method} int{bits}, fp16 scale + zero point per {group} columns")
    if method == "mxfp4":  # gpt-oss: OCP MX FP4, e2m1 codes two to a byte, an e8m0 (one byte) scale per 32
        return Stored(4, 32, 1, tensors=2, what="mxfp4: e2m1 codes in uint8 blocks, an e8m0 scale per 32 columns")
    if method == "fp8" and qconfig.get("weight_block_size"):  # DeepSeek-V3's block FP8: an fp32 scale per block
        block_rows, block_cols = qconfig["weight_block_size"]
        return Stored(8, block_cols, 4 / block_rows, tensors=2, what=f"fp8 e4m3, fp32 scale per {block_rows}x"
                      f"{block_cols} block")
    groups = qconfig.get("config_groups") or {}
    weights = next((g.get("weights") for g in groups.values() if g.get("weights")), None)
    if method != "compressed-tensors" or not weights:
        return None
    bits, kind = int(weights.get("num_bits", 8)), weights.get("type", "int")
    if kind == "int" and qconfig.get("format") == "pack-quantized":
        return pack_quantized(bits, weights.get("group_size"), weights.get("symmetric", True), dtype,
                              weights.get("actorder") == "group")
    what = f"{kind}{bits} (compressed-tensors {qconfig.get('format')})"
    if kind == "float" and bits == 4:  # NVFP4: an fp8 scale per 16, fp32 global scales
        return Stored(4, weights.get("group_size") or 16, 1, tensor_bytes=8, tensors=4, what=what)
    return Stored(bits, weights.get("group_size"), DTYPE_BYTES.get(dtype, 2), tensors=2, what=what)


ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


def checkpoint_kinds(qconfig: dict | None) -> tuple[str, ...]:
    """The decoder linears a pre-quantized checkpoint stores quantized: all of them, less those its
    ``modules_to_not_convert`` (transformers' quantizers) or ``ignore`` (compressed-tensors) leave in float,
    where a pattern names the attention block (``model.layers.*.self_attn``), the MLP or one projection."""
    patterns = [str(p).removeprefix("re:") for p in
                (qconfig or {}).get("modules_to_not_convert") or (qconfig or {}).get("ignore") or []]
    kinds = []
    for kind in LINEARS:
        group = "attn" if kind in ATTENTION else "mlp"
        if not any(p.rstrip("$").endswith((kind, group, f"self_{group}")) for p in patterns):
            kinds.append(kind)
    return tuple(kinds)


def linear_shapes(info: ModelInfo) -> list[tuple[str, int, int, int]]:
    """(kind, rows, cols, count in the whole model) of each decoder linear: rows are output features
    (``ModelInfo.linears``: MoE experts and MLA projections included)."""
    return info.linears()


def size(layout: Layout, info: ModelInfo) -> dict[str, Any]:
    """Bytes of the folder a layout describes, for a model of ``info``'s shapes."""
    layers, hidden, vocab = info.num_layers, info.hidden_size, info.vocab_size
    linears = tensors = 0
    for kind, rows, cols, count in linear_shapes(info):
        stored = layout.linears[kind]
        linears += count * stored.nbytes(rows, cols)
        tensors += count * stored.tensors
    parts = {
        "decoder linears": linears,
        "embedding": layout.embedding.nbytes(vocab, hidden),
        "lm_head": layout.lm_head.nbytes(vocab, hidden) if layout.lm_head else 0,
        "norms": (2 * layers + 1) * float_stored(layout.dtype).nbytes(1, hidden)
        + (layers * float_stored(layout.dtype).nbytes(1, info.q_lora_rank + info.kv_lora_rank)
           if info.kv_lora_rank else 0),  # MLA's norms of the compressed query and KV
        "routers": info.moe_layers * float_stored(layout.dtype).nbytes(info.num_experts, hidden)
        if info.moe_layers else 0,
        **layout.extra,
    }
    tensors += layout.embedding.tensors + (layout.lm_head.tensors if layout.lm_head else 0) + 2 * layers + 1
    tensors += info.moe_layers + (2 if info.q_lora_rank else 1 if info.kv_lora_rank else 0) * layers
    parts["container metadata"] = (tensors + layout.extra_tensors) * layout.tensor_bytes
    weights = sum(parts.values())
    files = sum(layout.files.values())
    return {"format": layout.format, "weight_bytes": weights, "file_bytes": files, "bytes": weights + files,
            "parts": {k: v for k, v in parts.items() if v}, "stored": describe(layout), "files": dict(layout.files),
            "assumes": list(layout.notes) + list(ASSUMES)}


def describe(layout: Layout) -> dict[str, str]:
    """What each kind of tensor is stored as, in words."""
    out = {kind: s.what for kind, s in layout.linears.items()}
    out["embedding"] = layout.embedding.what
    out["lm_head"] = layout.lm_head.what if layout.lm_head else "none of its own (tied to the embedding, or left out)"
    out["norms"] = layout.dtype
    return out


def float_weight_bytes(info: ModelInfo, dtype: str) -> int:
    """Bytes of the weights in ``dtype``, a tied LM head once (the tensors only, no container)."""
    layout = replace(float_layout(dtype, info.tie_embeddings), tensor_bytes=0)
    return size(layout, info)["weight_bytes"]


def model_dtype(recipe, info: ModelInfo | None) -> str:
    """The dtype the recipe loads the model in (``auto``: the checkpoint's, else bfloat16)."""
    dtype = recipe.model.dtype
    return dtype if dtype != "auto" else ((info.dtype if info else None) or "bfloat16")


def tokenizer_files(info: ModelInfo) -> dict[str, int]:
    """The tokenizer and config files of a model whose folder cannot be measured (estimated from the vocabulary)."""
    return CONFIG_FILES | {"tokenizer.json": TOKENIZER_BYTES_PER_TOKEN * info.vocab_size}


def measured_files(folder) -> dict[str, int]:
    """The sizes of a folder's files other than weights."""
    from pathlib import Path

    return {p.name: p.stat().st_size for p in sorted(Path(folder).iterdir())
            if p.is_file() and not p.name.endswith(WEIGHT_SUFFIXES) and not p.name.endswith(".index.json")}


def stage_layouts(loaded, info: ModelInfo) -> list[tuple[str, Layout]]:
    """(stage name, layout it writes) for every model-writing stage of the recipe, in order."""
    from llmopt import registry
    from llmopt.recipe.context import PlanContext
    from llmopt.model.modelinfo import is_gguf

    recipe = loaded.recipe

    def ctx(*step) -> PlanContext:
        return PlanContext(recipe=loaded, step=step, model=info)

    source = registry.get("source", "gguf" if is_gguf(recipe.model.source) else "hf")()
    layout = source.layout(recipe.model, ctx("model"))
    out = [("source", layout)]
    for index, step in enumerate(recipe.compress):
        impl = registry.get("compress", step.method)()
        layout = impl.layout(loaded.options_for("compress", index), layout, ctx("compress", index))
        out.append((f"compress.{index}.{step.method}", layout))
    if recipe.export.format != "hf":
        impl = registry.get("export", recipe.export.format)()
        layout = impl.layout(loaded.options_for("export", None), layout, ctx("export"))
        out.append((f"export.{recipe.export.format}", layout))
    return out


def model_size(loaded, info: ModelInfo) -> dict[str, Any]:
    """The size of the folder the recipe's last model-writing stage writes (``info``: that model's shapes)."""
    return size(stage_layouts(loaded, info)[-1][1], info)


def calibration_bytes(info: ModelInfo, dtype: str, samples: int, seq_len: int, layerwise: bool = True) -> int:
    """Peak memory of a calibrating compression pass.

    Assumes the model's weights in ``dtype``, one decoder layer's weights again in
    float32 (Hessians / scales / observers), and the cached activations of every
    calibration sample at one layer boundary in float32 (the sequential pipeline).
    """
    weights = float_weight_bytes(info, dtype)
    layer_fp32 = info.linear_params_per_layer * 4
    hessians = sum(w * w for w in info.linear_inputs.values()) * 4
    activations = samples * seq_len * info.hidden_size * 4 * (2 if layerwise else info.num_layers)
    return int(weights + layer_fp32 + hessians + activations)
