"""Runtime: a ModelOpt unified Hugging Face checkpoint, emulated in PyTorch (CPU or CUDA).

Plain transformers does not understand ``quant_method = "modelopt"``: it would load
the FP8 / INT8 / packed INT4 bytes as if they were bf16 weights. This runtime reads
the exported files themselves: each quantized linear weight is dequantized with
its exported scales (FP8 x weight_scale; INT8 x per-channel scale; W4A16 AWQ
unpacked two per byte x per-block scale; NVFP4 E2M1 x FP8 block scale x global
scale) into a plain checkpoint in a temporary folder, which the transformers
runtime opens; then every linear layer's input goes through the exported AWQ /
SmoothQuant ``pre_quant_scale`` and, where an ``input_scale`` was exported, the
quantization the engine applies: FP8 or INT8 per tensor, or NVFP4 (dynamic E2M1
blocks of 16 with FP8 block scales under the exported global scale). So the scores
come from the artifact's bytes and scales, in plain PyTorch (ModelOpt's own NVFP4
fake quantization needs CUDA; this does not). Not emulated: the KV-cache scales
(``k_scale`` / ``v_scale``, reported by the stage), and the input quantization of
routed experts, which transformers fuses into one module per layer.
Needs: torch, transformers, safetensors (the ``torch`` extra).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from llmopt.libraries import require
from llmopt.errors import StageFailed
from llmopt.runtimes.hf import EXPERT_TENSOR

SCALE_SUFFIXES = ("weight_scale", "weight_scale_2", "input_scale", "pre_quant_scale", "k_scale", "v_scale")
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
E2M1_BOUNDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)  # midpoints between the E2M1 magnitudes
FP4_BLOCK = 16
EMULATED = ("FP8", "W4A16_AWQ", "W8A8_SQ_PER_CHANNEL", "NVFP4", "W4A16_NVFP4")  # hf_quant_config quant_algo


class ModelOptRuntime:
    """The transformers runtime over a dequantized copy, with the exported activation quantization."""

    name = "modelopt"

    def __init__(self, model_dir: Path, device: str = "cpu", trust_remote_code: bool = False):
        from llmopt.runtimes.hf import TransformersRuntime

        model_dir = Path(model_dir)
        self.quant = read_quant_config(model_dir)
        with tempfile.TemporaryDirectory(prefix="llmopt-modelopt-") as tmp:
            inputs = dequantize_folder(model_dir, Path(tmp), self.quant)
            self.inner = TransformersRuntime(Path(tmp), device=device, trust_remote_code=trust_remote_code)
        self.input_hooks = add_input_quantizers(self.inner.model, inputs, self.quant.get("quant_algo"))

    def __getattr__(self, name: str):  # encode, nll, generate, stream, decode, tokenizer, model, ...
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


def read_quant_config(model_dir: Path) -> dict:
    path = model_dir / "hf_quant_config.json"
    if not path.is_file():
        raise StageFailed(f"{model_dir} has no hf_quant_config.json; is it a ModelOpt export?")
    quant = json.loads(path.read_text()).get("quantization", {})
    if quant.get("quant_algo") not in EMULATED:
        raise StageFailed(f"the ModelOpt runtime cannot emulate quant_algo {quant.get('quant_algo')!r}",
                          fix=f"emulated: {', '.join(EMULATED)}; score it through a server (runtime = \"endpoint\")")
    return quant


def dequantize_folder(src: Path, dst: Path, quant: dict) -> dict[str, dict]:
    """Write a plain checkpoint of ``src`` into ``dst``; return each linear's input scales by module name. Routed
    experts (``mlp.experts.3.up_proj``) are fused into one tensor per layer as transformers loads them, so no
    module is left to quantize their inputs: an expert's ``pre_quant_scale`` is folded into its weight, its
    ``input_scale`` is not applied (its scores are those of the quantized weights)."""
    safetensors = require("safetensors.torch", "torch", "the ModelOpt runtime", package="safetensors")
    inputs: dict[str, dict] = {}
    dropped: set[str] = set()
    for shard in sorted(src.glob("*.safetensors")):
        tensors = safetensors.load_file(str(shard))
        out = {}
        for key, tensor in tensors.items():
            module, _, leaf = key.rpartition(".")
            expert = EXPERT_TENSOR.search(key) is not None
            if leaf in SCALE_SUFFIXES:
                if leaf in ("input_scale", "pre_quant_scale") and not expert:
                    inputs.setdefault(module, {})[leaf] = tensor.float()
                dropped.add(key)
            elif leaf == "weight" and f"{module}.weight_scale" in tensors:
                out[key] = dequantize(tensor, tensors, module, quant)
                if expert and f"{module}.pre_quant_scale" in tensors:  # x * s @ W.T == x @ (W * s).T
                    out[key] = out[key] * tensors[f"{module}.pre_quant_scale"].float()
            else:
                out[key] = tensor
        safetensors.save_file(out, str(dst / shard.name), metadata={"format": "pt"})
    copy_side_files(src, dst, dropped)
    return inputs


def dequantize(weight, tensors: dict, module: str, quant: dict):
    """One exported weight back in float32, from its stored bytes and scales."""
    torch = require("torch", "torch", "the ModelOpt runtime")
    algo = quant.get("quant_algo")
    scale = tensors[f"{module}.weight_scale"].float()
    if weight.dtype == torch.float8_e4m3fn:
        return weight.float() * (scale if scale.dim() == 0 else scale.reshape(-1, 1))
    if weight.dtype == torch.int8:
        return weight.float() * scale.reshape(-1, 1)
    if weight.dtype == torch.uint8 and algo == "W4A16_AWQ":
        low = (weight & 0x0F).to(torch.int8)
        high = (weight >> 4).to(torch.int8)
        values = torch.stack([low, high], dim=1).reshape(-1, weight.shape[-1])  # rows 2j, 2j+1
        values = torch.where(values > 7, values - 16, values).float()
        block = values.shape[-1] // scale.shape[-1]
        return values * scale.repeat_interleave(block, dim=-1)
    if weight.dtype == torch.uint8 and algo in ("NVFP4", "W4A16_NVFP4"):
        table = torch.tensor(E2M1)
        codes = torch.stack([weight & 0x0F, weight >> 4], dim=-1).reshape(weight.shape[0], -1).long()
        block = codes.shape[-1] // scale.shape[-1]
        global_scale = tensors[f"{module}.weight_scale_2"].float()
        return table[codes] * scale.repeat_interleave(block, dim=-1) * global_scale
    raise StageFailed(f"{module}: cannot dequantize a {weight.dtype} weight for quant_algo {algo!r}")


def copy_side_files(src: Path, dst: Path, dropped: set[str]) -> None:
    """config.json without quantization_config, the tokenizer files, and the shard index without scales."""
    for path in src.iterdir():
        if path.is_file() and not path.name.endswith(".safetensors") and path.name != "hf_quant_config.json":
            shutil.copy2(path, dst / path.name)
    config = json.loads((src / "config.json").read_text())
    config.pop("quantization_config", None)
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    index = dst / "model.safetensors.index.json"
    if index.is_file():
        data = json.loads(index.read_text())
        data["weight_map"] = {k: v for k, v in data["weight_map"].items() if k not in dropped}
        index.write_text(json.dumps(data, indent=2))


def add_input_quantizers(model, inputs: dict[str, dict], algo: str | None) -> list:
    """Forward pre-hooks that apply each linear's exported pre_quant_scale and input quantization."""
    handles = []
    for name, scales in inputs.items():
        try:
            module = model.get_submodule(name)
        except AttributeError:
            raise StageFailed(f"the checkpoint has input scales for {name}, which the model does not have") from None
        handles.append(module.register_forward_pre_hook(input_hook(scales, algo)))
    return handles


def input_hook(scales: dict, algo: str | None):
    torch = require("torch", "torch", "the ModelOpt runtime")
    pre = scales.get("pre_quant_scale")
    scale = scales.get("input_scale")

    def hook(module, args):
        x = args[0]
        if pre is not None:
            x = x * pre.to(x.device, x.dtype)
        if scale is not None:
            s = scale.to(x.device, torch.float32)
            if algo == "NVFP4":
                q = nvfp4_fake_quant(x.float(), s)
            elif algo == "W8A8_SQ_PER_CHANNEL":
                q = (x.float() / s).round().clamp(-128, 127) * s
            else:
                q = (x.float() / s).clamp(-448, 448).to(torch.float8_e4m3fn).float() * s
            x = q.to(x.dtype)
        return (x, *args[1:])

    return hook


def nvfp4_fake_quant(x, global_scale):
    """NVFP4 quantize-dequantize of activations: blocks of 16 along the last dimension, each with an
    FP8 (E4M3) scale relative to ``global_scale``, values rounded to the nearest E2M1 magnitude."""
    torch = require("torch", "torch", "the ModelOpt runtime")
    blocks = x.reshape(-1, FP4_BLOCK)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    block_scale = (amax / 6.0 / global_scale).clamp(max=448.0).to(torch.float8_e4m3fn).float() * global_scale
    block_scale = torch.where(block_scale == 0, torch.ones_like(block_scale), block_scale)
    scaled = (blocks / block_scale).clamp(-6.0, 6.0)
    levels = torch.tensor(E2M1[:8], device=x.device)
    index = torch.bucketize(scaled.abs(), torch.tensor(E2M1_BOUNDS, device=x.device))
    return (levels[index] * scaled.sign() * block_scale).reshape(x.shape)
