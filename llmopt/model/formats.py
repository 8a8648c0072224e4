"""The checkpoint formats stages hand to each other: a small shared vocabulary.

Each compression and export backend declares, in its own file, the format it produces
(``produces(options) -> Format``; options such as gptq's ``scheme`` change it). Each
consumer of a format, every serving engine and the onnx export, declares in its own file
what it accepts of each format (``accepts(options) -> {Format: Rule}``, ``llmopt.deploy.compat``).
The planner's cross-stage rules read both; nothing keeps a table keyed on method names.

A new format is a new entry here plus one rule in each consumer's declaration (the
contract test names the consumers that lack it); a new method that writes a known format
is only its own file.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Format:
    """A checkpoint format: ``name`` is its key, ``label`` how messages name it."""

    name: str
    label: str

    def __str__(self) -> str:
        return self.label


DENSE = Format("dense", "dense 16-bit weights")
SPARSE_2_4 = Format("sparse-2:4", "2:4 sparse weights (stored dense)")
CT_W4A16 = Format("ct-w4a16", "compressed-tensors W4A16")
CT_W4A16_GIDX = Format("ct-w4a16-gidx", "compressed-tensors W4A16 with group activation order (g_idx)")
CT_W8A16 = Format("ct-w8a16", "compressed-tensors W8A16")
CT_WNA16 = Format("ct-wna16", "compressed-tensors integer weights of 2, 3, 5, 6 or 7 bits")
CT_INT8 = Format("ct-int8-w8a8", "compressed-tensors INT8 W8A8")
CT_FP8 = Format("ct-fp8", "compressed-tensors FP8 W8A8")
CT_NVFP4 = Format("ct-nvfp4", "compressed-tensors NVFP4 (W4A4)")
CT_NVFP4A16 = Format("ct-nvfp4a16", "compressed-tensors NVFP4 weights (W4A16)")
MODELOPT_FP8 = Format("modelopt-fp8", "ModelOpt FP8")
MODELOPT_INT8_SQ = Format("modelopt-int8-sq", "ModelOpt INT8 SmoothQuant")
MODELOPT_INT4_AWQ = Format("modelopt-int4-awq", "ModelOpt INT4 AWQ")
MODELOPT_NVFP4 = Format("modelopt-nvfp4", "ModelOpt NVFP4")
ONNX_INT4 = Format("onnx-int4", "ONNX int4 (MatMulNBits)")
ONNX_INT8 = Format("onnx-int8", "ONNX int8 (MatMulNBits)")
ONNX_FLOAT = Format("onnx-float", "ONNX float (fp32 / fp16 / bf16)")
# an export that writes its input's format again (the hf export): consumers judge the input's format
AS_INPUT = Format("as-input", "the input's format, unchanged")

# every format a consumer must say something about (AS_INPUT is never judged itself)
ALL: tuple[Format, ...] = (
    DENSE, SPARSE_2_4, CT_W4A16, CT_W4A16_GIDX, CT_W8A16, CT_WNA16, CT_INT8, CT_FP8, CT_NVFP4, CT_NVFP4A16,
    MODELOPT_FP8, MODELOPT_INT8_SQ, MODELOPT_INT4_AWQ, MODELOPT_NVFP4, ONNX_INT4, ONNX_INT8, ONNX_FLOAT,
)
ONNX = (ONNX_INT4, ONNX_INT8, ONNX_FLOAT)
