"""Export: an ONNX Runtime GenAI model folder, built by onnxruntime-genai's model builder.

The builder converts the upstream Hugging Face folder into ``model.onnx`` (+ external
data), ``genai_config.json`` and the tokenizer files, quantizing to int4/int8
MatMulNBits on the way (``precision``, ``block_size``, ``accuracy_level``,
``algo_config``...). A compressed-tensors W4A16 checkpoint from a GPTQ/AWQ/RTN
step is first repacked, losslessly, into the AutoGPTQ layout the builder reads
(``gptq_layout.py``), so the calibrated integers and scales reach ONNX unchanged
instead of being re-quantized; the config the builder reads is first put in the forms it
reads (``onnx_config.py``: RoPE per layer type, sliding windows, Phi-3's context lengths).
The stage then writes the session tuning into ``genai_config.json``, repairs a
GGUF-converted ``tokenizer.json`` whose decoder makes onnxruntime-genai tokenize like
SentencePiece, and verifies the result with an ONNX Runtime profile on the chosen
execution provider (``verify.json``).
Needs: onnxruntime-genai, onnxruntime, onnx, onnx_ir (the ``ort`` extra), torch.
Produces: ``model/`` (format ``onnx``) and ``verify.json``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from llmopt.model import formats
from llmopt.backends.base import ExportBackend, Options, PlanContext, StageContext
from llmopt.libraries import require
from llmopt.backends.export import (gguf_layout, gptq_layout, onnx_config, onnx_embedding, onnx_last, onnx_size,
                                    onnx_verify)
from llmopt.model.modelinfo import gguf_path, is_gguf
from llmopt.deploy.compat import YES, Rule
from llmopt.errors import Problem, StageFailed
from llmopt.registry import register

BLOCK_SIZES = (16, 32, 64, 128, 256)
QUANTIZED = ("int4", "int8")
# What the model builder takes from the stage before the export (``input_refusal`` is the same judgement on
# the checkpoint itself): W4A16 folders, repacked into the AutoGPTQ layout (``gptq_layout.py``); FP8 / NVFP4
# compressed-tensors on the CUDA EP only (the builder's own route); float weights, which it quantizes itself.
W4A16_ONLY = "use a W4A16 method (gptq, awq, autoround, rtn) before an onnx export"
ACTIVATIONS = Rule("no", "it quantizes activations; the ONNX Runtime GenAI builder reads weight-only int4 checkpoints "
                   "only", fix=W4A16_ONLY)
MODELOPT = Rule("no", "the onnx export reads compressed-tensors and AutoGPTQ / AutoAWQ checkpoints, not ModelOpt's",
                fix="use the llm-compressor method of the same scheme (awq, fp8, nvfp4)")
ACCEPTS: dict[formats.Format, Rule] = {
    formats.DENSE: YES,
    formats.SPARSE_2_4: YES,  # zeros stored in dense weights
    formats.CT_W4A16: YES,
    formats.CT_W4A16_GIDX: Rule("no", "actorder = \"group\" permutes groups (g_idx), which MatMulNBits blocks cannot "
                                "express", fix="use actorder = \"weight\" (same accuracy, no permutation)"),
    formats.CT_W8A16: Rule("no", "8-bit weights are not int4", fix=W4A16_ONLY),
    formats.CT_WNA16: Rule("no", "weights of this width are not int4", fix=W4A16_ONLY),
    formats.CT_INT8: ACTIVATIONS,
    formats.MODELOPT_INT8_SQ: ACTIVATIONS,
    formats.MODELOPT_FP8: MODELOPT, formats.MODELOPT_INT4_AWQ: MODELOPT, formats.MODELOPT_NVFP4: MODELOPT,
    **dict.fromkeys(formats.ONNX, Rule("no", "the onnx export builds from a Hugging Face folder, not an ONNX model")),
}
CUDA_ONLY = {formats.CT_FP8: "FP8", formats.CT_NVFP4: "NVFP4", formats.CT_NVFP4A16: "NVFP4"}
TOKENIZER_FILES = ("special_tokens_map.json", "added_tokens.json", "tokenizer.model", "vocab.json", "merges.txt",
                   "chat_template.jinja", "chat_template.json")
OPT_LEVELS = {"disable_all": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
              "all": "ORT_ENABLE_ALL"}
TYPED_KEYS = {"block_size", "accuracy_level", "is_symmetric", "algo_config", "matmul_mixed_precision",
              "shared_embeddings", "exclude_lm_head", "nodes_to_exclude", "hf_remote", "hf_token", "op_types_to_quantize"}


class OnnxExportOptions(Options):
    precision: Literal["fp32", "fp16", "bf16", "int4", "int8"] = Field(
        "int4", description="Weight precision. int4/int8: MatMulNBits weight-only quantization (a pre-quantized "
        "int4 checkpoint keeps its own integers and scales); fp32/fp16/bf16: no quantization.")
    execution_provider: Literal["cpu", "cuda", "dml", "webgpu", "NvTensorRtRtx"] = Field(
        "cpu", description="ONNX Runtime execution provider the graph is built and tuned for "
        "(NvTensorRtRtx is the TensorRT-RTX EP, the TensorRT EP onnxruntime-genai loads).")
    block_size: Literal[16, 32, 64, 128, 256] = Field(
        32, description="Columns per quantization block when the builder quantizes; must divide every linear "
        "layer's input width.")
    accuracy_level: Literal[0, 1, 2, 3, 4] | None = Field(
        None, description="MatMulNBits compute type: 1 fp32, 2 fp16, 3 bf16, 4 int8 activations; "
        "None: the builder's default (4 on CPU, 0 elsewhere).")
    is_symmetric: bool = Field(True, description="Symmetric (int4) or asymmetric (uint4 with zero points) blocks.")
    algo_config: Literal["default", "rtn", "k_quant"] = Field(
        "default", description="How the builder quantizes: default (ORT's RTN), rtn, or k_quant (asymmetric, slower).")
    gguf_blocks: Literal["auto", "keep", "requantize"] = Field(
        "auto", description="A GGUF source exported to int4 with no compression step: keep carries the file's own "
        "Q4_0/Q4_1 blocks (and a Q8_0 LM head) into MatMulNBits exactly, as llama.cpp computes them; requantize "
        "lets the builder round the dequantized weights again; auto: keep where it applies (llama architecture, "
        "cpu EP, block_size 32).")
    lm_head: Literal["auto", "int4", "int8", "float"] = Field(
        "auto", description="Precision of the output projection. auto: as the body when the builder quantizes, "
        "float when a pre-quantized checkpoint left it unquantized, int8 for kept GGUF blocks (float if the GGUF "
        "head is float); int8 maps to matmul_mixed_precision=last_matmul:int8.")
    mixed_layers: Literal["int4", "int8"] = Field(
        "int4", description="int8: keep the most quantization-sensitive layers (first/last eighth, every third "
        "qkv/v/down projection) at 8 bits (matmul_mixed_precision=mixed_layers:int8).")
    embedding: Literal["auto", "float", "int8", "int4"] = Field(
        "auto", description="Precision of the token embedding table: int8 / int4 store it as GatherBlockQuantized "
        "blocks of block_size columns (int8 symmetric; int4 as is_symmetric says). auto: the LM head's table where the builder shares "
        "it (int4 for a tied int4 head; int8 for a tied int8 head of symmetric blocks under an int4 body), float "
        "otherwise. int4 needs precision = \"int4\" (the builder's own "
        "quantizer, op_types_to_quantize=MatMul/Gather); an embedding of another precision than a tied head keeps "
        "its own table.")
    shared_embeddings: bool | None = Field(
        None, description="Share one table between the embedding and the LM head (tied models only). None: shared "
        "when the model ties them, except around a float LM head of a pre-quantized checkpoint.")
    exclude_lm_head: bool = Field(False, description="Leave the LM head out (the model outputs hidden states; nothing can score it).")
    last_logits_graph: bool = Field(
        True, description="Also write model.last.onnx, the same graph and weights with the LM head on the last "
        "position only, which the onnxruntime runtime (llmopt serve) generates from: a prefill skips the head at "
        "every other prompt position. model.onnx, which genai_config.json names and scoring uses, is unchanged.")
    builder_options: dict[str, str] = Field(
        default_factory=dict, description="Further KEY=VALUE options for the model builder (e.g. fuse_qkv = \"false\").")
    intra_op_threads: int | None = Field(None, ge=0, description="Threads inside one operator (genai_config session_options); None: ORT's default.")
    inter_op_threads: int | None = Field(None, ge=0, description="Threads across operators (genai_config session_options); None: ORT's default.")
    graph_optimization_level: Literal["disable_all", "basic", "extended", "all"] | None = Field(
        None, description="ORT graph optimization level written into genai_config.json; None: ORT's default (all).")
    enable_cuda_graph: bool = Field(False, description="Capture the decode step as a CUDA graph (cuda and NvTensorRtRtx).")
    trt_cache_dir: str | None = Field(
        None, description="NvTensorRtRtx: fixed folder where compiled engines are cached between runs (nv_runtime_cache_path).")
    trt_profile: list[int] | None = Field(
        None, description="NvTensorRtRtx: [min, opt, max] sequence lengths of the optimization profile; "
        "None: onnxruntime-genai derives one from the context length.")
    verify: Literal["fail", "warn", "off"] = Field(
        "fail", description="Profile the exported model on its EP: fail the stage (fail) or only report (warn) when "
        "MatMulNBits does not run or heavy nodes fall back to another EP; off: skip.")

    @field_validator("trt_profile")
    @classmethod
    def _profile(cls, value):
        if value is not None and (len(value) != 3 or not 1 <= value[0] <= value[1] <= value[2]):
            raise ValueError("give [min, opt, max] lengths with 1 <= min <= opt <= max")
        return value


@register("export", "onnx")
class OnnxExport(ExportBackend):
    Options = OnnxExportOptions
    requires = ("onnxruntime-genai", "onnxruntime", "onnx", "onnx-ir", "torch")
    extra = "ort"
    version = 2  # 2: the config adapted for the builder (onnx_config), a tied int8 head's table shared

    def produces(self, options: OnnxExportOptions) -> formats.Format:
        return {"int4": formats.ONNX_INT4, "int8": formats.ONNX_INT8}.get(options.precision, formats.ONNX_FLOAT)

    def accepts(self, options: OnnxExportOptions) -> dict[formats.Format, Rule]:
        """What the builder takes from the stage before the export, on this execution provider and precision:
        ``ACCEPTS``, FP8 / NVFP4 on the CUDA EP only, and pre-quantized weights only into precision int4."""
        ep = options.execution_provider
        rules = dict(ACCEPTS)
        for fmt, kind in CUDA_ONLY.items():
            rules[fmt] = YES if ep == "cuda" else Rule(
                "no", f"{kind} checkpoints reach ONNX Runtime GenAI only on the CUDA EP (not {ep})",
                fix="use a W4A16 method (gptq, awq, autoround, rtn) for CPU, or execution_provider = \"cuda\"")
        if options.precision != "int4":
            kept = Rule("no", f"the export keeps the checkpoint's quantized weights; precision {options.precision!r} "
                        "cannot express them", fix="set precision = \"int4\"")
            rules |= {fmt: kept for fmt in (formats.CT_W4A16, *CUDA_ONLY) if rules[fmt].status == "yes"}
        return rules

    def layout(self, options: OnnxExportOptions, before, ctx: PlanContext):
        """What the builder writes for these options and this input (``onnx_size``)."""
        carry, _ = gguf_carry(options, ctx.recipe)
        carried = gguf_layout.carried_blocks(carry) if carry is not None else None
        quantized = None
        if carried is not None:
            quantized = {"from": "gguf", "lm_head": carried["lm_head"]}
        elif before.quantized:
            quantized = {"lm_head_quantized": bool(before.lm_head and before.lm_head.quantized)}
        head = head_precision(options, quantized) if options.precision in QUANTIZED else "float"
        shared = options.shared_embeddings
        if shared is None:  # as builder_extra asks, else the builder's default: shared when tied
            shared = ctx.model.tie_embeddings and not (options.precision in QUANTIZED and head != options.precision) \
                and options.embedding in ("auto", head)
        shared = shared or (carried is None and shares_int8_head(options, head, ctx.model.tie_embeddings))
        return onnx_size.layout(options, before, ctx.model, carried, head, shared)

    def check(self, options: OnnxExportOptions, ctx: PlanContext) -> list[Problem]:
        problems = [ctx.problem(f"builder_options may not set {key!r}; use the typed option", "builder_options")
                    for key in sorted(set(options.builder_options) & TYPED_KEYS)]
        carry, reason = gguf_carry(options, ctx.recipe)
        if options.gguf_blocks == "keep" and carry is None:
            problems.append(ctx.problem(f"gguf_blocks = \"keep\" cannot apply: {reason}", "gguf_blocks",
                                        hint="remove gguf_blocks (auto), or set it to \"requantize\""))
        info = ctx.model
        if info is None:
            return problems
        quantized = info.quantization or None
        if quantized:
            problems += quantized_input_problems(options, quantized, ctx)
        elif carry is not None:
            pass  # 32-column GGUF blocks; gguf_carry checked block_size
        elif options.precision in QUANTIZED:
            problems += block_problems(options.block_size, info.linear_inputs | {"lm_head": info.hidden_size}, ctx)
        if options.precision in QUANTIZED and not options.is_symmetric and carry is None and \
                shares_embeddings(options, info.tie_embeddings, bool(quantized)):
            problems.append(ctx.problem(
                "asymmetric int4/int8 with shared embeddings builds a model ONNX Runtime cannot load (the shared "
                "table becomes uint8 where the embedding expects float)", "is_symmetric",
                hint="set shared_embeddings = false, or keep is_symmetric = true"))
        head = head_precision(options, {"from": "gguf", "lm_head": "int8"} if carry is not None else
                              {"lm_head_quantized": False} if quantized else None) \
            if options.precision in QUANTIZED else "float"
        default_shared = info.tie_embeddings and options.shared_embeddings is not False and (
            options.precision not in QUANTIZED or head == options.precision) and carry is None \
            or carry is None and shares_int8_head(options, head, info.tie_embeddings)
        problems += onnx_embedding.problems(options, info, head, default_shared, ctx, BLOCK_SIZES)
        if options.shared_embeddings and not info.tie_embeddings:
            problems.append(ctx.problem("shared_embeddings needs a model with tied embeddings (tie_word_embeddings)",
                                        "shared_embeddings", hint="remove shared_embeddings"))
        problems += paged_problems(options, ctx)
        if options.exclude_lm_head and ctx.recipe.recipe.eval:
            problems.append(ctx.problem("exclude_lm_head removes the logits every [[eval]] scores", "exclude_lm_head",
                                        hint="keep the LM head, or remove the evals"))
        return problems + provider_problems(options, ctx)

    def run(self, options: OnnxExportOptions, ctx: StageContext) -> dict:
        require("onnx_ir", "ort", "the onnx export")
        builder = require("onnxruntime_genai.models.builder", "ort", "the onnx export", package="onnxruntime-genai")
        out = ctx.out_dir / "model"
        work = ctx.out_dir / ".work"
        carry, _ = gguf_carry(options, ctx.recipe)
        if carry is not None:
            reader = gguf_layout.open_gguf(carry)
            source, quantized, residuals = prepare_gguf(carry, reader, work, ctx)
        else:
            (source, quantized), residuals = prepare_input(ctx.model_dir, options, work, ctx), None
        tied = ties_embeddings(source)
        extra = builder_extra(options, quantized, tied)
        ctx.progress(f"building ONNX ({options.precision}, {options.execution_provider})")
        os.environ.setdefault("TQDM_DISABLE", "1")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        ctx.log.info("model builder: input %s, precision %s, ep %s, options %s", source, options.precision,
                     options.execution_provider, extra)
        cache = str(work / "builder-cache")
        parsed = builder.parse_extra_options(None, str(source), str(out), options.precision,
                                             options.execution_provider, cache, extra)
        adapted = onnx_config.adapt(parsed["hf_details"]["hf_config"], ctx.name)
        if adapted:
            ctx.log.info("config as the builder reads it: %s", "; ".join(adapted))
        builder.create_model(None, str(source), str(out), options.precision, options.execution_provider, cache, **parsed)
        int8_shared = carry is None and shares_int8_head(options, head_precision(options, quantized), tied)
        if int8_shared:
            onnx_embedding.wire_shared_head(out / "model.onnx", ctx.name)
        elif options.embedding == "int8":  # before the GGUF residuals, whose shape tensors must stay inline
            ctx.progress("quantizing the embedding table to 8 bits (GatherBlockQuantized)")
            onnx_embedding.quantize_int8(out / "model.onnx", options.block_size, work)
        if carry is not None:
            quantized |= finish_gguf(out / "model.onnx", reader, residuals, ctx)
        graphs = onnx_last.write(out / "model.onnx") if options.last_logits_graph and not options.exclude_lm_head else None
        copy_tokenizer_files(ctx.model_dir, out)
        tokenizer_fixed = fix_tokenizer_decoder(out / "tokenizer.json")
        tune_genai_config(out / "genai_config.json", options)
        shutil.rmtree(work, ignore_errors=True)
        outputs = {
            "format": "onnx",
            "model_dir": "model",
            "precision": options.precision,
            "execution_provider": options.execution_provider,
            "builder_options": extra,
            "builder_config": adapted,
            "quantized_input": quantized,
            "embedding": onnx_embedding.describe(out / "model.onnx"),
            "tokenizer_decoder_fixed": tokenizer_fixed,
            "graphs": graphs,
            "onnx_bytes": sum(p.stat().st_size for p in out.glob("*.onnx*")),
        }
        if options.verify != "off":
            outputs["verify"] = verify_stage(out, options, ctx)
        return outputs


def gguf_carry(options: OnnxExportOptions, recipe) -> tuple[Path | None, str | None]:
    """(the GGUF file whose blocks the export keeps, None) or (None, why they are not kept)."""
    if options.gguf_blocks == "requantize":
        return None, "gguf_blocks = \"requantize\""
    source = recipe.recipe.model.source
    if not is_gguf(source):
        return None, "the source is not a GGUF file"
    if recipe.recipe.compress:
        return None, "compression steps change the weights before the export"
    if options.precision != "int4":
        return None, f"precision is {options.precision!r}, not \"int4\""
    if options.execution_provider != "cpu":
        return None, f"blocks are carried for the cpu EP (float32 activations), not {options.execution_provider}"
    if options.block_size != gguf_layout.BLOCK:
        return None, f"GGUF blocks are {gguf_layout.BLOCK} columns, block_size is {options.block_size}"
    try:
        path = gguf_path(source, recipe.path.parent)
        reason = gguf_layout.problem(path) if path.is_file() else f"{path} not found"
    except Exception as exc:  # noqa: BLE001 - an unreadable file is a reason, reported by the source stage too
        return None, f"the GGUF file cannot be read ({exc})"
    return (None, reason) if reason else (path, None)


def prepare_gguf(path: Path, reader, work: Path, ctx: StageContext):
    """The AutoGPTQ folder of the GGUF's own blocks (``reader``: the file, opened once), its summary
    and the Q4_1 residual tables."""
    from llmopt.store.cache import sha256_file

    expected = ctx.input_manifests["model"]["outputs"].get("gguf_sha256")
    if expected and sha256_file(path) != expected:
        raise StageFailed(f"{path} changed since the source stage converted it", where=ctx.name,
                          fix="run again; the source stage converts the new file")
    ctx.progress(f"carrying the 4-bit blocks of {path.name} into MatMulNBits")
    summary, residuals = gguf_layout.write_gptq_folder(reader, ctx.model_dir, work / "gguf")
    head = gguf_layout.head_tensor(reader).tensor_type.name
    summary |= {"from": "gguf", "repacked": True, "gguf_lm_head": head,
                "lm_head": "float" if head in ("F32", "F16", "BF16") else "int8"}
    ctx.log.info("GGUF blocks: %s", summary)
    return work / "gguf", summary, residuals


def finish_gguf(model_file: Path, reader, residuals: dict, ctx: StageContext) -> dict:
    """Add the Q4_1 residual terms and the Q8_0 head to the built graph, then prove the weights exact."""
    added = gguf_layout.add_block_residuals(model_file, residuals) if residuals else {"nodes": 0}
    head = gguf_layout.carry_q8_head(model_file, reader)
    error = gguf_layout.max_weight_error(model_file, reader)
    ctx.log.info("GGUF carry: residual nodes %s, Q8_0 head %s, weight error %s", added, head, error)
    tolerance = 1e-6 * max(error["max_abs_weight"], 1.0)
    if error["max_abs_error"] > tolerance or (head and error["lm_head_max_abs_error"] > tolerance):
        raise StageFailed(f"the ONNX weights differ from the GGUF blocks by up to {error['max_abs_error']:.3g} "
                          f"(LM head {error['lm_head_max_abs_error']})", where=ctx.name,
                          fix="set gguf_blocks = \"requantize\" to let the builder quantize instead")
    return {"residual_nodes": added["nodes"], "lm_head_carried": head, "max_abs_weight_error": error["max_abs_error"],
            "lm_head_max_abs_error": error["lm_head_max_abs_error"]}


def quantized_input_problems(options: OnnxExportOptions, qconfig: dict, ctx: PlanContext) -> list[Problem]:
    """A source model that is already quantized: what the builder can take on this EP."""
    reason = input_refusal(qconfig, options.execution_provider)
    if reason:
        return [ctx.problem(reason, "execution_provider", hint="give a W4A16 (int4 weight-only) checkpoint, or a "
                            "float model that the export quantizes itself")]
    if options.precision != "int4" and qconfig.get("quant_method") != "compressed-tensors":
        return [ctx.problem("the input checkpoint is int4; precision must be \"int4\"", "precision",
                            hint="set precision = \"int4\"")]
    return []


def input_refusal(qconfig: dict, ep: str) -> str | None:
    """Why the builder cannot take this pre-quantized checkpoint on ``ep`` (DESIGN.md table), or None."""
    method = qconfig.get("quant_method")
    if method in ("gptq", "awq"):
        return None if qconfig.get("bits", 4) == 4 else f"{method} with {qconfig.get('bits')}-bit weights is not int4"
    if method != "compressed-tensors":
        return f"checkpoints quantized with {method!r} are not read by the onnx export"
    if online := gptq_layout.online_transforms(qconfig):
        return (f"it carries rotations applied at inference (compressed-tensors transforms {', '.join(online)}, as "
                "QuIP and SpinQuant's R3 and R4 write them), which the ONNX Runtime GenAI builder does not apply")
    problem = gptq_layout.w4a16_problem(qconfig)
    if problem is None:
        group = gptq_layout.scheme_of(qconfig)["group_sizes"][0]
        return None if group in BLOCK_SIZES else f"its group size {group} is not a MatMulNBits block size {BLOCK_SIZES}"
    scheme = gptq_layout.scheme_of(qconfig)
    if ep == "cuda" and scheme["types"] == ["float"]:
        return None  # FP8 / NVFP4: the builder's own compressed-tensors route, CUDA EP only
    return f"this compressed-tensors checkpoint cannot be exported for the {ep} EP: {problem}"


def block_problems(block_size: int, widths: dict[str, int], ctx: PlanContext) -> list[Problem]:
    bad = {name: width for name, width in widths.items() if width % block_size}
    if not bad:
        return []
    fits = [b for b in BLOCK_SIZES if all(w % b == 0 for w in widths.values())]
    listed = ", ".join(f"{n} ({w})" for n, w in bad.items())
    return [ctx.problem(f"block_size {block_size} does not divide the input width of {listed}", "block_size",
                        hint=f"use one of: {', '.join(map(str, fits))}" if fits else "no block size fits every layer")]


def provider_problems(options: OnnxExportOptions, ctx: PlanContext) -> list[Problem]:
    problems = []
    trt = options.execution_provider == "NvTensorRtRtx"
    for key in ("trt_cache_dir", "trt_profile"):
        if getattr(options, key) is not None and not trt:
            problems.append(ctx.problem(f"{key} applies to execution_provider = \"NvTensorRtRtx\" only; ignored",
                                        key, severity="warning"))
    if trt and options.precision not in ("fp16", "int4"):
        problems.append(ctx.problem("TensorRT-RTX builds engines in the graph's own types; fp16 (or int4 with fp16 "
                                    "activations) is what it is fast at", "precision", severity="warning"))
    if options.enable_cuda_graph and options.execution_provider not in ("cuda", "NvTensorRtRtx"):
        problems.append(ctx.problem("enable_cuda_graph applies to the cuda and NvTensorRtRtx EPs only; ignored",
                                    "enable_cuda_graph", severity="warning"))
    return problems


def shares_embeddings(options: OnnxExportOptions, tied: bool, prequantized: bool) -> bool:
    """Whether the builder will share one table between the embedding and the LM head."""
    if options.shared_embeddings is not None:
        return options.shared_embeddings
    if options.precision not in QUANTIZED:
        return tied and options.embedding in ("auto", "float")
    head = head_precision(options, {"lm_head_quantized": False} if prequantized else None)
    return tied and head == options.precision and options.embedding in ("auto", head) or \
        shares_int8_head(options, head, tied)


def shares_int8_head(options: OnnxExportOptions, head: str | None, tied: bool) -> bool:
    """Whether the embedding of an int4 export reads its tied int8 LM head's table (one GatherBlockQuantized over
    the head's 8-bit MatMulNBits codes and scales, ``onnx_embedding.wire_shared_head``) instead of keeping a float
    table of its own: symmetric blocks (the 8-bit table a symmetric head writes has no zero points), the embedding
    left auto or int8, sharing not turned off, the head not left out. A head carried from GGUF blocks keeps its own
    table."""
    return tied and options.precision == "int4" and head == "int8" and options.embedding in ("auto", "int8") \
        and options.shared_embeddings is not False and options.is_symmetric and not options.exclude_lm_head


def head_precision(options: OnnxExportOptions, quantized: dict | None) -> str:
    """The LM head's precision: ``lm_head``, with auto resolved (float when a pre-quantized checkpoint left it so)."""
    if options.lm_head != "auto":
        return options.lm_head
    if quantized and quantized.get("from") == "gguf":
        return quantized["lm_head"]
    return "float" if quantized and not quantized.get("lm_head_quantized") else options.precision


def prepare_input(model_dir: Path, options: OnnxExportOptions, work: Path, ctx: StageContext) -> tuple[Path, dict | None]:
    """The folder the builder reads, and what pre-quantized form it came in (None: float weights)."""
    config = json.loads((model_dir / "config.json").read_text())
    qconfig = config.get("quantization_config")
    if not qconfig:
        return model_dir, None
    reason = input_refusal(qconfig, options.execution_provider)
    if reason:
        raise StageFailed(reason, where=ctx.name, fix="export a W4A16 (int4 weight-only) checkpoint or a float model")
    if qconfig.get("quant_method") != "compressed-tensors" or gptq_layout.w4a16_problem(qconfig) is not None:
        return model_dir, {"from": qconfig.get("quant_method"), "repacked": False}
    ctx.progress("repacking compressed-tensors W4A16 into the AutoGPTQ layout")
    summary = gptq_layout.repack_checkpoint(model_dir, work / "gptq")
    ctx.log.info("repacked %d linears: %s", summary["linears"], summary)
    return work / "gptq", {"from": "compressed-tensors", "repacked": True, **summary}


def builder_extra(options: OnnxExportOptions, quantized: dict | None, tied: bool = False) -> list[str]:
    """KEY=VALUE options for the model builder (``tied``: the model ties its embedding and LM head)."""
    kv = {"hf_token": "false", "hf_remote": "false"}
    head = head_precision(options, quantized) if options.precision in QUANTIZED else None
    if not (quantized and quantized.get("from") == "gguf") and shares_int8_head(options, head, tied):
        # the builder shares a quantized table only where it quantizes Gather too; the embedding is the head's
        kv |= {"shared_embeddings": True, "op_types_to_quantize": "MatMul/Gather"}
    if head is not None:
        # kept GGUF blocks carry their own zero points; a Q8_0 head is symmetric
        symmetric = True if quantized and quantized.get("from") == "gguf" else options.is_symmetric
        kv |= {"block_size": options.block_size, "is_symmetric": symmetric, "algo_config": options.algo_config}
        if options.accuracy_level is not None:
            kv["accuracy_level"] = options.accuracy_level
        mixed = (["last_matmul:int8"] if head == "int8" else []) + (["mixed_layers:int8"] if options.mixed_layers == "int8" else [])
        if mixed:
            kv["matmul_mixed_precision"] = ",".join(mixed)
        if head == "float":
            kv["nodes_to_exclude"] = "/lm_head/MatMul"
    shared = kv.get("shared_embeddings", options.shared_embeddings)
    if shared is None and head is not None and head != options.precision:
        shared = False  # an LM head of another precision (float, int8 not shared above) keeps its own table
    if shared is None and options.embedding not in ("auto", head or "float"):
        shared = False  # an embedding of another precision than the head keeps its own table
    if options.embedding == "int4":
        kv["op_types_to_quantize"] = "MatMul/Gather"
    if shared is not None:
        kv["shared_embeddings"] = shared
    if options.exclude_lm_head:
        kv["exclude_lm_head"] = True
    kv |= options.builder_options
    return [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in kv.items()]


def ties_embeddings(model_dir: Path) -> bool:
    """Whether the model the builder reads ties its embedding and LM head (its config class's default included)."""
    from transformers import AutoConfig

    return bool(getattr(AutoConfig.from_pretrained(model_dir), "tie_word_embeddings", False))


def copy_tokenizer_files(src: Path, out: Path) -> None:
    """Tokenizer files the builder does not copy (chat template, special tokens map...)."""
    for name in TOKENIZER_FILES:
        if (src / name).is_file() and not (out / name).exists():
            shutil.copy2(src / name, out / name)


def has_spm_decoder_on_byte_level(tok: dict) -> bool:
    """A byte-level BPE whose decoder also has the SentencePiece ``Replace("▁", " ")`` step (GGUF conversions).

    onnxruntime-genai takes that step as the sign of a SentencePiece vocabulary and encodes
    spaces as ``▁``, which a byte-level vocabulary does not have (ids of -1)."""
    decoder = tok.get("decoder") or {}
    steps = decoder.get("decoders") or [] if decoder.get("type") == "Sequence" else []
    replace = any(s.get("type") == "Replace" and (s.get("pattern") or {}).get("String") == "\u2581" for s in steps)
    byte_level = any(s.get("type") == "ByteLevel" for s in steps)
    return replace and byte_level and (tok.get("pre_tokenizer") or {}).get("type") == "ByteLevel"


def fix_tokenizer_decoder(path: Path) -> bool:
    """Give such a tokenizer.json its plain ByteLevel decoder (decoding is unchanged for a byte-level
    vocabulary); returns whether it was changed."""
    if not path.is_file():
        return False
    tok = json.loads(path.read_text(encoding="utf-8"))
    if not has_spm_decoder_on_byte_level(tok):
        return False
    level = next(s for s in tok["decoder"]["decoders"] if s.get("type") == "ByteLevel")
    tok["decoder"] = level
    path.write_text(json.dumps(tok, ensure_ascii=False, indent=2), encoding="utf-8")
    return True


def tune_genai_config(path: Path, options: OnnxExportOptions) -> dict:
    """Write the session and EP tuning into genai_config.json; returns the decoder's session_options."""
    config = json.loads(path.read_text())
    session = config["model"]["decoder"].setdefault("session_options", {})
    if options.intra_op_threads is not None:
        session["intra_op_num_threads"] = options.intra_op_threads
    if options.inter_op_threads is not None:
        session["inter_op_num_threads"] = options.inter_op_threads
    if options.graph_optimization_level is not None:
        session["graph_optimization_level"] = OPT_LEVELS[options.graph_optimization_level]
    ep_options = provider_options(options)
    if options.execution_provider == "NvTensorRtRtx" and options.trt_profile:
        session.update(trt_profile_entries(config["model"], options.trt_profile))
    if ep_options:
        providers = session.setdefault("provider_options", [])
        entry = next((p for p in providers if options.execution_provider in p), None)
        if entry is None:
            providers.append({options.execution_provider: ep_options})
        else:
            entry[options.execution_provider].update(ep_options)
    path.write_text(json.dumps(config, indent=4) + "\n")
    return session


def provider_options(options: OnnxExportOptions) -> dict[str, str]:
    out = {}
    if options.enable_cuda_graph and options.execution_provider in ("cuda", "NvTensorRtRtx"):
        out["enable_cuda_graph"] = "1"
    if options.execution_provider == "NvTensorRtRtx" and options.trt_cache_dir:
        out["nv_runtime_cache_path"] = str(Path(options.trt_cache_dir).expanduser())
    return out


def trt_profile_entries(model: dict, lengths: list[int]) -> dict[str, str]:
    """Explicit TensorRT-RTX optimization profile (batch 1): prefill up to ``max`` tokens, decode with
    ``opt`` tokens of context. onnxruntime-genai passes these session entries to the EP as they are."""
    dec = model["decoder"]
    names = dec["inputs"]
    kv, head = dec["num_key_value_heads"], dec["head_size"]

    def shapes(query: int, past: int, mask: int) -> str:
        parts = [f"{names['input_ids']}:1x{query}", f"{names['attention_mask']}:1x{mask}"]
        for layer in range(dec["num_hidden_layers"]):
            for pattern in (names["past_key_names"], names["past_value_names"]):
                parts.append(f"{pattern % layer}:1x{kv}x{past}x{head}")
        return ",".join(parts)

    low, opt, high = lengths
    prefix = "ep.nvtensorrtrtxexecutionprovider.nv_profile_"
    return {prefix + "min_shapes": shapes(1, 0, 1), prefix + "opt_shapes": shapes(1, opt, opt + 1),
            prefix + "max_shapes": shapes(high, high, high)}


def paged_problems(options: OnnxExportOptions, ctx: PlanContext) -> list[Problem]:
    """A PagedAttention export (``use_paged_attention``, for onnxruntime-genai's continuous-batching engine) takes
    the sequences of a step packed on one axis with their KV-cache block tables, which only that engine feeds. The
    export's check runs one plain session and the evals og.Generator: neither can run such a graph."""
    if str(options.builder_options.get("use_paged_attention", "")).lower() not in ("true", "1"):
        return []
    problems = []
    why = ("a use_paged_attention graph takes packed sequences and block tables, which only onnxruntime-genai's "
           "engine (llmopt serve --max-num-seqs) feeds")
    if options.verify != "off":
        problems.append(ctx.problem(f"the export's check cannot run it: {why}", "verify",
                                    hint='set verify = "off"; the same recipe without use_paged_attention checks '
                                    "the same weights"))
    if ctx.recipe.recipe.eval:
        problems.append(ctx.problem(f"no [[eval]] can score it: {why}", "builder_options",
                                    hint="remove the evals here and gate the same recipe without use_paged_attention "
                                    "(its compression is the same cached stage: the same weights)"))
    return problems


def verify_stage(model_dir: Path, options: OnnxExportOptions, ctx: StageContext) -> dict:
    """Profile the model, write verify.json, fail or warn on problems; returns the summary for the manifest."""
    ctx.progress("verifying: ORT profile of prefill and decode")
    report = onnx_verify.profile(model_dir, options.execution_provider, options.precision in QUANTIZED,
                                 intra_op_threads=options.intra_op_threads,
                                 graph_optimization_level=OPT_LEVELS.get(options.graph_optimization_level or "all"),
                                 work_dir=ctx.out_dir)
    (ctx.out_dir / "verify.json").write_text(json.dumps(report, indent=2) + "\n")
    summary = onnx_verify.summary(report)
    if report["status"] == "failed":
        message = "; ".join(report["problems"])
        if options.verify == "fail":
            raise StageFailed(f"the exported model failed verification on {report['execution_provider']}: {message}",
                              where=ctx.name, fix="set verify = \"warn\" to keep the model anyway (verify.json then "
                              "lists every node and its EP)")
        ctx.log.warning("verification problems: %s", message)
    return summary
