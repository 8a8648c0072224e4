"""Plain functions the NVIDIA ModelOpt backends share: config, calibrate, quantize, export.

``quantize(ctx, config_name, adjust, kv_cache)`` is the whole stage: load the
upstream model in bfloat16, take a copy of one of ModelOpt's preset configs
(``mtq.FP8_DEFAULT_CFG``...), adjust it (block size, KV cache), run
``mtq.quantize`` with a forward loop over the recipe's calibration rows, and
export the unified Hugging Face checkpoint (``export_hf_checkpoint``: safetensors
with quantized weights and scales, ``hf_quant_config.json``, and config.json's
``quantization_config`` with quant_method "modelopt") plus the tokenizer files,
which the export does not write. ModelOpt's prints go to the run log.

Plain transformers does not read these checkpoints (it loads the quantized bytes
as if they were bf16 weights), so the stage's format is ``modelopt``, which eval
stages score with llmopt's ModelOpt runtime (``llmopt.runtimes.modelopt``): it
dequantizes the exported weights and applies the exported activation scales.
Needs: nvidia-modelopt, torch, transformers (``pip install 'llmopt[modelopt]'``).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import logging
import shutil
import time
import warnings
from pathlib import Path
from typing import Callable

from llmopt.data import calibration
from llmopt.libraries import require
from llmopt.backends.compress._common import TOKENIZER_FILES, copy_tokenizer_files, cpu_threads, folder_bytes
from llmopt.errors import StageFailed

REQUIRES = ("nvidia-modelopt", "torch", "transformers")
EXTRA = "modelopt"
FORMAT = "modelopt"
KV_HELP = "Quantize the KV cache: fp8 adds ModelOpt's FP8 K/V quantizers (k_scale / v_scale in the export), none leaves it."


class LogWriter(io.TextIOBase):
    """A text stream that sends each line to a logger."""

    def __init__(self, log: logging.Logger, prefix: str = "modelopt: "):
        self.log, self.prefix, self.buffer_ = log, prefix, ""

    def write(self, text: str) -> int:
        self.buffer_ += text
        *lines, self.buffer_ = self.buffer_.split("\n")
        for line in lines:
            if line.strip():
                self.log.info("%s%s", self.prefix, line.rstrip())
        return len(text)


@contextlib.contextmanager
def library_output(log):
    """ModelOpt's prints and warnings go to the run log."""
    stream = LogWriter(log)
    with contextlib.redirect_stdout(stream), contextlib.redirect_stderr(stream), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def import_modelopt(needed_by: str):
    mtq = require("modelopt.torch.quantization", EXTRA, needed_by, package="nvidia-modelopt")
    export = require("modelopt.torch.export", EXTRA, needed_by, package="nvidia-modelopt")
    return mtq, export


def set_rule(config: dict, quantizer: str, **values) -> dict:
    """Update the ``cfg`` of the rule for ``quantizer`` in a ModelOpt config (a list of rules; later ones win)."""
    for rule in config["quant_cfg"]:
        if rule.get("quantizer_name") == quantizer and "cfg" in rule:
            rule["cfg"].update(values)
            return config
    raise KeyError(f"no rule for {quantizer!r} in the ModelOpt config")


def build_config(mtq, name: str, adjust: Callable[[dict], None] | None, kv_cache: str) -> dict:
    config = copy.deepcopy(getattr(mtq, name))
    if adjust is not None:
        adjust(config)
    if kv_cache == "fp8":
        config = mtq.update_quant_cfg_with_kv_cache_quant(config, mtq.FP8_KV_CFG["quant_cfg"])
    return config


def load(ctx):
    """Tokenizer and the upstream model in bfloat16 (float32 on a CPU: ``CompressBackend.cpu_float32``), held as
    the plan placed it (``llmopt.model.placement``):
    whole on the GPU; onload: accelerate's device map with the weights in host memory and each module
    onloaded for its forward pass (ModelOpt's hf_ptq way for models larger than the GPU); multi_gpu: a
    device map over the GPUs."""
    from llmopt import registry
    from llmopt.model import placement
    torch = require("torch", "torch", ctx.name)
    transformers = require("transformers", "torch", ctx.name)
    if ctx.model_format != "hf":
        raise StageFailed(f"{ctx.name} needs a Hugging Face model folder, got format {ctx.model_format!r}",
                          where=ctx.name, fix="put the compression steps before the export step")
    trust = ctx.recipe.recipe.model.trust_remote_code
    tokenizer = transformers.AutoTokenizer.from_pretrained(ctx.model_dir, trust_remote_code=trust)
    chosen = placement.for_stage(ctx, registry.get("compress", ctx.name.split(".")[-1]))
    where = chosen.placement if chosen is not None else "cpu"
    kwargs = {}
    if where == "onload":  # one layer's room on the GPU, the rest in host memory
        kwargs = {"device_map": "auto", "max_memory": {0: chosen.gpu_bytes, "cpu": chosen.host_bytes}}
    elif where == "multi_gpu":
        kwargs = {"device_map": "auto"}
    dtype = torch.float32 if ctx.device == "cpu" else torch.bfloat16  # exported in bfloat16 either way
    model = transformers.AutoModelForCausalLM.from_pretrained(ctx.model_dir, dtype=dtype, trust_remote_code=trust,
                                                              **kwargs)
    ctx.log.info("placement %s", where)
    return tokenizer, (model.to(ctx.device) if where in ("gpu", "cpu") else model).eval()


def forward_loop(batches: list, progress) -> Callable:
    def loop(model) -> None:
        import torch

        with torch.no_grad():
            for index, batch in enumerate(batches):
                progress(f"calibration batch {index + 1}/{len(batches)}")
                model(input_ids=batch, use_cache=False)

    return loop


def quantize(ctx, config_name: str, adjust: Callable[[dict], None] | None = None, kv_cache: str = "none") -> dict:
    """The whole ModelOpt stage: calibrate, quantize, export, copy the tokenizer."""
    torch = require("torch", "torch", ctx.name)
    with library_output(ctx.log), cpu_threads(ctx.device):
        mtq, export = import_modelopt(ctx.name)
        tokenizer, model = load(ctx)
        dtype = next(model.parameters()).dtype
        rows = calibration.load(ctx, tokenizer)
        config = build_config(mtq, config_name, adjust, kv_cache)
        torch.manual_seed(ctx.recipe.recipe.calibration.seed)
        started = time.monotonic()
        ctx.progress("calibrating and quantizing")
        model = mtq.quantize(model, config, forward_loop(calibration.as_batches(rows, 1, ctx.device), ctx.progress))
        seconds = time.monotonic() - started
        out = ctx.out_dir / "model"
        ctx.progress("exporting the unified Hugging Face checkpoint")
        if dtype != torch.bfloat16:  # calibrated in float32 on a CPU: the unquantized tensors as a bfloat16 run has them
            model.to(torch.bfloat16)
        export.export_hf_checkpoint(model, dtype=torch.bfloat16, export_dir=out)
    del model
    tokenizer.save_pretrained(out)
    copy_tokenizer_files(ctx.model_dir, out)
    return {"format": FORMAT, "model_dir": "model", "quantization": summary(out), "device": ctx.device,
            "compress_seconds": round(seconds, 2), "model_bytes": folder_bytes(out), "calibration": rows.summary(),
            "compute_dtype": str(dtype).removeprefix("torch.")}


def summary(model_dir: Path) -> dict:
    """quant_algo, KV-cache algorithm and excluded modules from hf_quant_config.json."""
    path = model_dir / "hf_quant_config.json"
    if not path.is_file():
        raise StageFailed(f"the ModelOpt export wrote no {path.name}", where=str(model_dir))
    quant = json.loads(path.read_text()).get("quantization", {})
    config = json.loads((model_dir / "config.json").read_text()).get("quantization_config", {})
    return {"quant_method": config.get("quant_method"), "quant_algo": quant.get("quant_algo"),
            "kv_cache_quant_algo": quant.get("kv_cache_quant_algo"), "group_size": quant.get("group_size"),
            "exclude_modules": quant.get("exclude_modules")}


def cuda_present() -> bool:
    """Whether this machine has an NVIDIA driver (a plan-time probe, without importing torch)."""
    return Path("/proc/driver/nvidia/version").exists() or shutil.which("nvidia-smi") is not None


# what the unified export adds beside the weights: config.json's quantization_config, hf_quant_config.json
QUANT_CONFIG_BYTES = 1000


def layout(before, weights, ctx, kv_cache: str = "none"):
    """The unified Hugging Face checkpoint: the decoder linears as ``weights``, the LM head (excluded from
    quantization), embedding and norms in bfloat16, FP32 K/V scales per layer with an FP8 KV cache."""
    from llmopt.model import estimates
    plain = estimates.float_stored("bfloat16")
    head = None if ctx.model.tie_embeddings else plain
    files = {name: n for name, n in before.files.items() if name in TOKENIZER_FILES + ("config.json",)}
    files["config.json"] = files.get("config.json", 0) + QUANT_CONFIG_BYTES
    files["hf_quant_config.json"] = QUANT_CONFIG_BYTES
    layers = ctx.model.num_layers
    extra = {"kv cache scales": 2 * layers * 4} if kv_cache != "none" else {}
    return estimates.Layout("safetensors", "bfloat16", {kind: weights for kind in estimates.LINEARS}, plain, head,
                            extra, 2 * layers if extra else 0, files, estimates.SAFETENSORS_TENSOR_BYTES, before.notes)


def stored(bits: int, group: int | None, scale_bytes: float, per_tensor: int, per_column: float, tensors: int,
           what: str):
    """One quantized linear of the unified checkpoint (codes of ``bits`` two to a byte for 4 bits)."""
    from llmopt.model import estimates
    return estimates.Stored(bits, group, scale_bytes, tensor_bytes=per_tensor, column_bytes=per_column,
                            tensors=tensors, what=what)
