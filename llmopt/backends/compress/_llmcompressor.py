"""Plain functions the llm-compressor backends share: load, calibrate, oneshot, save, summarise.

``quantize(ctx, build_recipe, ...)`` is the whole stage: load a fresh copy of the
upstream model (``oneshot`` changes it in place), build the calibration rows from
the recipe's [calibration] when the method calibrates, run ``oneshot`` with the
library's logs sent to the run log (never the terminal), and save a
compressed-tensors checkpoint with its tokenizer under ``<stage>/model``.
Needs: llmcompressor, compressed-tensors, torch, transformers (the ``compress`` extra).
"""

from __future__ import annotations

import contextlib
import io
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal

from pydantic import Field

from llmopt.data import calibration

from llmopt.model import estimates
from llmopt.libraries import require
from llmopt.backends.compress import _sensitivity
from llmopt.backends.compress._checks import ignored
from llmopt.backends.compress._common import (TOKENIZER_FILES, copy_tokenizer_files, cpu_threads, folder_bytes,
                                              widen_on_cpu)
from llmopt.errors import StageFailed

REQUIRES = ("llmcompressor", "compressed-tensors", "torch", "transformers")
EXTRA = "compress"

Pipeline = Literal["auto", "basic", "sequential", "datafree"]
PIPELINE_HELP = (
    "Calibration pipeline: auto (sequential for methods that calibrate, as llm-compressor itself chooses; "
    "datafree otherwise), sequential (one decoder layer at a time on the device, the rest in host memory: "
    "each layer calibrates on the already-quantized outputs of the layers before it, which is what GPTQ and "
    "AWQ assume, and models larger than GPU memory fit), basic (one forward pass of the whole model, every "
    "layer calibrated on unquantized inputs: faster, and less accurate for GPTQ and AWQ)."
)
IGNORE_HELP = "Layers left unquantized: module names or `re:` patterns (the default keeps lm_head in full precision)."
KV_HELP = "Quantize the KV cache: fp8 writes static per-tensor FP8 scales for K and V (kv_cache_scheme), none leaves it."


def kv_cache_field():
    return Field("none", description=KV_HELP)


@contextlib.contextmanager
def library_logs(log):
    """llm-compressor's loguru records go to the run log for the duration of the block (its tqdm bars
    write to stderr, which the runner sends to the run log)."""
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
        require("llmcompressor", EXTRA, "llm-compressor backends")  # its import adds a stdout sink and warns
    from loguru import logger

    logger.remove()  # every sink, including the stdout one added at import
    logger.enable("llmcompressor")
    sink = logger.add(lambda message: log.info("llmcompressor: %s", message.record["message"]), level="INFO",
                      format="{message}")
    for line in captured.getvalue().splitlines():
        log.info("llmcompressor: %s", line)
    try:
        yield
    finally:
        logger.remove(sink)


@contextlib.contextmanager
def no_pinned_memory():
    """AWQ pins its cached activations, which raises on a machine without an accelerator;
    pinning is a no-op inside this block when CUDA is absent (and untouched when present)."""
    import torch

    if torch.cuda.is_available():
        yield
        return
    from llmcompressor.pipelines.cache import IntermediatesCache

    original = IntermediatesCache.pin_memory
    IntermediatesCache.pin_memory = lambda self, *args, **kwargs: None
    try:
        yield
    finally:
        IntermediatesCache.pin_memory = original


def load_tokenizer(ctx):
    transformers = require("transformers", "torch", ctx.name)
    return transformers.AutoTokenizer.from_pretrained(ctx.model_dir,
                                                      trust_remote_code=ctx.recipe.recipe.model.trust_remote_code)


def load_model(ctx, device: str, placement: str = "gpu", dtype: str | None = None):
    """A fresh copy of the upstream model in the recipe's dtype, held as the plan placed it
    (``llmopt.model.placement``): gpu moves it whole to the GPU, onload leaves it in host memory for the library
    to onload layer by layer, multi_gpu spreads it over the GPUs with a device map."""
    transformers = require("transformers", "torch", ctx.name)
    kwargs = {"device_map": "auto"} if placement == "multi_gpu" else {}
    model = transformers.AutoModelForCausalLM.from_pretrained(
        ctx.model_dir, dtype=dtype or ctx.recipe.recipe.model.dtype,
        trust_remote_code=ctx.recipe.recipe.model.trust_remote_code,
        **kwargs)
    if device.startswith("cuda") and placement == "gpu":
        model.to(device)
    model.eval()
    keep_expert_names(model)
    return model


# Mixture-of-experts families whose checkpoints name each expert's linears otherwise than llm-compressor does once
# it has split the experts into one module each (gate_proj, up_proj, down_proj): family -> (the renamings, in
# transformers' WeightRenaming terms, from the checkpoint's names to llm-compressor's; the fused tensors they replace)
EXPERT_NAMES = {"mixtral": ([(r"\.experts\.(\d+)\.w1\.", r".experts.\1.gate_proj."),
                             (r"\.experts\.(\d+)\.w2\.", r".experts.\1.down_proj."),
                             (r"\.experts\.(\d+)\.w3\.", r".experts.\1.up_proj.")],
                            [".experts.gate_up_proj", ".experts.down_proj"])}


def keep_expert_names(model) -> None:
    """Save ``model``'s experts under its family's own names (``EXPERT_NAMES``): llm-compressor 0.14 registers the
    split layout for a few families only, and without it a Mixtral checkpoint was saved with
    ``experts.0.gate_proj`` where Mixtral has ``experts.0.w1``, which transformers then skipped as unexpected
    and filled with random experts (+45% perplexity, every method)."""
    family = model.config.model_type
    if family not in EXPERT_NAMES:
        return
    from llmcompressor.modeling.moe.conversion_mappings import (get_linearize_load_mappings, patch_moe_mappings,
                                                                set_save_conversion_mapping)
    from transformers.core_model_loading import WeightRenaming

    renamings, fused = EXPERT_NAMES[family]
    with patch_moe_mappings(family, [WeightRenaming(a, b) for a, b in renamings], remove_targets=fused):
        _, _, save = get_linearize_load_mappings(family)
    set_save_conversion_mapping(model, save)


def stage_placement(ctx, pipeline: str) -> str:
    """gpu | onload | multi_gpu | cpu: the plan's placement on this machine; ``pipeline = "sequential"``
    keeps the weights in host memory as before (onload) unless [compute] placement names another."""
    from llmopt import registry
    from llmopt.model import placement
    if pipeline == "sequential" and ctx.recipe.recipe.compute.placement == "auto":
        return "onload" if ctx.device.startswith("cuda") else "cpu"
    chosen = placement.for_stage(ctx, registry.get("compress", ctx.name.split(".")[-1]))
    if chosen is None:
        return "cpu"
    if not chosen.fits:
        raise StageFailed(f"{ctx.name}: no placement of the model fits this machine ({'; '.join(chosen.short)})",
                          where="compute.placement", fix="run `llmopt plan` with [compute] describing this machine")
    ctx.log.info("placement %s: predicted peak %.1f GiB per GPU, %.1f GiB host", chosen.placement,
                 chosen.gpu_bytes / 2**30, chosen.host_bytes / 2**30)
    return chosen.placement


def resolve_pipeline(pipeline: str, calibrates: bool) -> str | None:
    """llm-compressor's ``pipeline`` argument (None: its own inference, datafree for data-free methods)."""
    if pipeline != "auto":
        return pipeline
    return "sequential" if calibrates else None


def run_oneshot(ctx, model, tokenizer, recipe, rows, pipeline: str | None, out: Path | None, seed: int,
                wrap: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext) -> float:
    """``oneshot`` on ``model`` in place, saving the compressed checkpoint to ``out`` (None: not saved; the
    model's ``save_pretrained`` then writes it compressed); returns seconds."""
    torch = require("torch", "torch", ctx.name)
    from llmcompressor import oneshot

    kwargs = {"model": model, "processor": tokenizer, "recipe": recipe}
    if out is not None:
        kwargs["output_dir"] = str(out)
    if pipeline is not None:
        kwargs["pipeline"] = pipeline
    if rows is not None:
        kwargs.update(dataset=calibration.as_dataset(rows), num_calibration_samples=len(rows.rows),
                      max_seq_length=rows.seq_len, shuffle_calibration_samples=False,
                      moe_calibrate_all_experts=True)  # every expert sees every calibration token (its default)
    torch.manual_seed(seed)
    started = time.monotonic()
    with wrap():
        oneshot(**kwargs)
    return time.monotonic() - started


def architectures(ctx) -> list[str]:
    """The ``architectures`` of the stage's input model (its config.json)."""
    return list(json.loads((ctx.model_dir / "config.json").read_text()).get("architectures") or [])


# AWQ: architectures llm-compressor 0.14's registry (AWQ_MAPPING_REGISTRY) lacks -> the registered one laid out the
# same way. OLMo 2 normalizes after attention and the MLP, not before (as OLMo 3 does), so no norm feeds q/k/v or
# gate/up and the default mappings fail ("no matches found for keys: {'re:.*input_layernorm$'}"); only v_proj ->
# o_proj and up_proj -> down_proj are smoothed
AWQ_SAME_AS = {"Olmo2ForCausalLM": "Olmo3ForCausalLM"}


def awq_mappings(names: list[str]) -> list | None:
    """AWQModifier's ``mappings`` for these architectures (None: llm-compressor picks its own)."""
    from llmcompressor.modifiers.transform.awq.mappings import AWQ_MAPPING_REGISTRY

    same = [AWQ_SAME_AS[name] for name in names if name in AWQ_SAME_AS]
    return AWQ_MAPPING_REGISTRY[same[0]] if same else None


# SmoothQuant: llm-compressor 0.14 gives Gemma 2 and 3 the Llama mappings, which fold the MLP's scales into
# post_attention_layernorm; in Gemma that norm scales the attention's output on its way into the residual, and the
# MLP reads pre_feedforward_layernorm, so the model changed (measured: +34% and +38% perplexity on tiny models)
GEMMA_SMOOTHQUANT = [[["re:.*q_proj$", "re:.*k_proj$", "re:.*v_proj$"], "re:.*input_layernorm$"],
                     [["re:.*gate_proj$", "re:.*up_proj$"], "re:.*pre_feedforward_layernorm$"]]
# OLMo 2 has no norm before q/k/v or gate/up (llm-compressor: "Error resolving mappings"): only down_proj's input
# is smoothed, into up_proj's rows (the MLP's product is linear in them), the scales chosen from up_proj's output
# range (llm-compressor measures the smoothing layer's output), which stands in for down_proj's input
OLMO2_SMOOTHQUANT = [[["re:.*down_proj$"], "re:.*up_proj$"]]
SMOOTHQUANT_MAPPINGS = {"Gemma2ForCausalLM": GEMMA_SMOOTHQUANT, "Gemma3ForCausalLM": GEMMA_SMOOTHQUANT,
                        "Olmo2ForCausalLM": OLMO2_SMOOTHQUANT}


def smoothquant_mappings(names: list[str]) -> list | None:
    """SmoothQuantModifier's ``mappings`` for these architectures (None: llm-compressor picks its own)."""
    return next((SMOOTHQUANT_MAPPINGS[name] for name in names if name in SMOOTHQUANT_MAPPINGS), None)


@dataclass(frozen=True)
class Keep:
    """``sensitive_layers``: how many units to keep at 8 bits, ranked under the step's own rounding."""
    count: int
    bits: int
    group_size: int | None
    symmetric: bool
    ignore: tuple[str, ...]


def quantize(ctx, build_recipe: Callable[..., list], calibrates: bool, pipeline: str = "auto",
             wrap: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
             keep: Keep | None = None, cpu_float32: bool = False) -> dict:
    """The whole llm-compressor stage; ``build_recipe`` returns the modifiers (built after the import). With
    ``keep``, the units 4-bit rounding hurts most are measured first (``_sensitivity``) and ``build_recipe`` is
    called with the module names to keep at 8 bits. ``cpu_float32``: on a CPU, a 16-bit model is loaded and
    compressed in float32 and cast back to the recipe's dtype to be saved (``CompressBackend.cpu_float32``)."""
    if ctx.model_format != "hf":
        raise StageFailed(f"{ctx.name} needs a Hugging Face model folder, got format {ctx.model_format!r}",
                          where=ctx.name, fix="put the compression steps before the export step")
    with library_logs(ctx.log), cpu_threads(ctx.device):
        tokenizer = load_tokenizer(ctx)
        rows = calibration.load(ctx, tokenizer) if calibrates else None
        placed = stage_placement(ctx, pipeline)
        ctx.progress(f"loading the model ({placed})")
        saved = ctx.recipe.recipe.model.dtype
        widened = cpu_float32 and widen_on_cpu(ctx)
        model = load_model(ctx, ctx.device, placed, "float32" if widened else None)
        out = ctx.out_dir / "model"
        ctx.progress("calibrating and compressing" if calibrates else "compressing")
        chosen = resolve_pipeline(pipeline, calibrates)
        measured = None
        if keep is not None and keep.count:
            recipe, measured = keep_sensitive(ctx, model, rows, keep, build_recipe)
        else:
            recipe = build_recipe()
        seconds = run_oneshot(ctx, model, tokenizer, recipe, rows, chosen, None if widened else out,
                              ctx.recipe.recipe.calibration.seed, wrap)
        if widened:  # the quantization parameters follow the weights' dtype, as a 16-bit run makes them
            model.to(getattr(require("torch", "torch", ctx.name), saved))
            model.save_pretrained(str(out), save_compressed=True)
            tokenizer.save_pretrained(str(out))
    del model
    copy_tokenizer_files(ctx.model_dir, out)
    outputs = {"format": "hf", "model_dir": "model", "quantization": summary(out), "device": ctx.device,
               "pipeline": chosen or "datafree", "placement": placed, "compress_seconds": round(seconds, 2),
               "model_bytes": folder_bytes(out), "compute_dtype": "float32" if widened else saved}
    if rows is not None:
        outputs["calibration"] = rows.summary()
    if measured is not None:
        outputs["sensitive_layers"] = measured
    return outputs


def keep_sensitive(ctx, model, rows, keep: Keep, build_recipe: Callable[..., list]) -> tuple[list, dict]:
    """The modifiers with the ``keep.count`` most sensitive units at 8 bits, and the measurement's record."""
    from llmopt.backends.compress._checks import module_ignored

    if rows is None:
        raise StageFailed(f"{ctx.name}: sensitive_layers needs calibration data", where=f"{ctx.name}.sensitive_layers")
    ctx.progress("measuring each layer group's 4-bit rounding error on the calibration data")
    device = next(model.parameters()).device
    skip = {name for name, _ in model.named_modules() if module_ignored(name, list(keep.ignore))}
    started = time.monotonic()
    ranked = _sensitivity.rank(model, calibration.as_batches(rows, 1, str(device)), keep.bits, keep.group_size,
                               keep.symmetric, skip)
    kept = ranked[: keep.count]
    record = _sensitivity.outputs(ranked, kept, keep.bits, keep.group_size, keep.symmetric)
    record["seconds"] = round(time.monotonic() - started, 2)
    ctx.log.info("sensitive layers kept at %d bits: %s (%.1f MiB more)", _sensitivity.KEPT_BITS,
                 ", ".join(u.names[0] for u in kept), record["added_bytes"] / 2**20)
    return build_recipe([name for unit in kept for name in unit.names]), record


# The engines' fused linears of a transformer layer (vLLM's packed_modules_mapping for Llama-shaped models): one
# module that reads the same input as its parts and holds their weights side by side.
FUSED_LINEARS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def fused_names(names: list[str]) -> list[str]:
    """The fused modules (``FUSED_LINEARS``) whose every part is in ``names``: ``a.self_attn.qkv_proj`` for
    ``a.self_attn.q_proj``, ``.k_proj`` and ``.v_proj``."""
    present, fused = set(names), []
    for name in names:
        prefix, leaf = name.rsplit(".", 1) if "." in name else ("", name)
        for whole, parts in FUSED_LINEARS.items():
            if leaf == parts[0] and all(f"{prefix}.{part}" in present for part in parts):
                fused.append(f"{prefix}.{whole}")
    return fused


def kept_group(names: list[str], group_size: int | None) -> dict:
    """The ``config_groups`` entry for the kept units: 8-bit symmetric integer weights in ``group_size``, targeted
    by exact module names, which compressed-tensors matches before the 4-bit group's class target ``Linear``.
    The targets also name the fused module of each kept q/k/v or gate/up unit (``fused_names``), which no
    Hugging Face model has: vLLM loads q, k and v into one ``QKVParallelLinear`` and picks its scheme by that
    module's name first, then by its class name, where the 4-bit group's ``Linear`` matches as a substring, and
    only then by its parts' names. Without the fused name a kept unit got the 4-bit scheme there, and vLLM 0.26
    failed to load the 8-bit weights into it (``assert param_data.shape == loaded_weight.shape``)."""
    from compressed_tensors.quantization import QuantizationScheme

    weights = scheme_args(_sensitivity.KEPT_BITS, "int", "group" if group_size else "channel", group_size, True)
    return {"group_1": QuantizationScheme(targets=[*names, *fused_names(list(names))], weights=weights)}


def _brief(args: dict | None) -> dict | None:
    if not args:
        return None
    keys = ("num_bits", "type", "strategy", "group_size", "symmetric", "dynamic", "actorder")
    return {k: args[k] for k in keys if args.get(k) is not None}


def summary(model_dir: Path) -> dict:
    """The checkpoint's quantization metadata in brief (from config.json)."""
    config = json.loads((model_dir / "config.json").read_text())
    q = config.get("quantization_config") or {}
    groups = {name: {"targets": g.get("targets"), "weights": _brief(g.get("weights")),
                     "input_activations": _brief(g.get("input_activations"))}
              for name, g in (q.get("config_groups") or {}).items()}
    return {"quant_method": q.get("quant_method"), "format": q.get("format"), "ignore": q.get("ignore"),
            "kv_cache_scheme": _brief(q.get("kv_cache_scheme")), "config_groups": groups,
            "sparsity_config": q.get("sparsity_config")}


def scheme_args(bits: int, kind: str = "int", strategy: str = "group", group_size: int | None = None,
                symmetric: bool = True, actorder: str | None = None, dynamic: bool = False):
    """compressed-tensors QuantizationArgs for weights or activations."""
    from compressed_tensors.quantization import QuantizationArgs

    return QuantizationArgs(num_bits=bits, type=kind, strategy=strategy, group_size=group_size,
                            symmetric=symmetric, actorder=actorder, dynamic=dynamic)


def weight_scheme(bits: int, group_size: int | None, symmetric: bool, actorder: str | None = None,
                  activations=None) -> dict:
    """``config_groups`` for integer weights per group (or per channel when group_size is None)."""
    from compressed_tensors.quantization import QuantizationScheme

    weights = scheme_args(bits, "int", "group" if group_size else "channel", group_size, symmetric, actorder)
    return {"group_0": QuantizationScheme(targets=["Linear"], weights=weights, input_activations=activations)}


def kv_cache_scheme(kind: str):
    """FP8 per-tensor static K/V scales, or None."""
    if kind == "none":
        return None
    return scheme_args(8, "float", "tensor", None, True)


# what a save adds to the folder: config.json's quantization_config, and llm-compressor's recipe.yaml
QUANTIZATION_CONFIG_BYTES = 1000
RECIPE_YAML_BYTES = 750


def load_dtype(before: estimates.Layout, ctx) -> str:
    """The dtype unquantized tensors are saved in: the recipe's, or for auto the incoming folder's."""
    dtype = ctx.recipe.recipe.model.dtype
    return dtype if dtype != "auto" else before.dtype


def ignores_lm_head(ignore: list[str]) -> bool:
    return any(entry == "lm_head" or entry.endswith(".lm_head") or (entry.startswith("re:") and "lm_head" in entry)
               for entry in ignore)


def layout(before: estimates.Layout, weights: estimates.Stored, ignore: list[str], ctx,
           kv_cache: str = "none", kept_parameters: int = 0) -> estimates.Layout:
    """The compressed-tensors checkpoint ``oneshot`` saves: the linears ``ignore`` does not name as ``weights``,
    every other tensor in the load dtype (a tied head once, unless it is quantized), FP8 K/V scales per layer,
    and what sensitive layers kept at 8 bits beside 4-bit ``weights`` may add (``kept_parameters`` weights, at
    most: ``_sensitivity.planned_parameters``)."""
    dtype = load_dtype(before, ctx)
    plain = estimates.float_stored(dtype)
    linears = {kind: plain if ignored(kind, ignore) else weights for kind in estimates.LINEARS}
    head = None if ctx.model.tie_embeddings else plain
    if not ignores_lm_head(ignore):
        head = weights
    files = {name: n for name, n in before.files.items() if name in TOKENIZER_FILES + ("config.json",)}
    files["config.json"] = files.get("config.json", 0) + QUANTIZATION_CONFIG_BYTES
    files["recipe.yaml"] = RECIPE_YAML_BYTES
    layers = ctx.model.num_layers
    extra = {"kv cache scales": 2 * layers * plain.nbytes(1, 1)} if kv_cache != "none" else {}
    if kept_parameters:
        extra[estimates.KEPT_PART] = _sensitivity.planned_bytes(kept_parameters, 4, weights.group, not weights.zero_bits)
    return estimates.Layout("safetensors", dtype, linears, plain, head, extra, 2 * layers if kv_cache != "none" else 0, files,
                            estimates.SAFETENSORS_TENSOR_BYTES, before.notes, kept_parameters)


def int8_weights(dtype: str) -> estimates.Stored:
    """compressed-tensors ``int-quantized`` (W8A8): int8 codes and a scale per output row."""
    return estimates.Stored(8, None, estimates.DTYPE_BYTES.get(dtype, 2), tensors=2,
                            what=f"int8, {dtype} scale per row")


def fp8_weights(dtype: str, per_row: bool) -> estimates.Stored:
    """compressed-tensors ``float-quantized``: FP8 codes and a scale per output row (dynamic activations)
    or one weight scale and one input scale per tensor (static activations)."""
    scale = estimates.DTYPE_BYTES.get(dtype, 2)
    if per_row:
        return estimates.Stored(8, None, scale, tensors=2, what=f"fp8, {dtype} scale per row")
    return estimates.Stored(8, tensor_bytes=2 * scale, tensors=3, what=f"fp8, {dtype} weight and input scale per tensor")


def nvfp4_weights(activations: bool) -> estimates.Stored:
    """compressed-tensors ``nvfp4-pack-quantized``: E2M1 codes two to a byte, an FP8 scale per 16 columns, an
    FP32 global scale per tensor (and the activations' global scale when they are quantized too)."""
    return estimates.Stored(4, 16, 1, tensor_bytes=8 if activations else 4, tensors=4 if activations else 3,
                            what="fp4 (E2M1), fp8 scale per 16 columns, fp32 global scale")
