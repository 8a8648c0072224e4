"""Repack a compressed-tensors W4A16 checkpoint into the AutoGPTQ layout, exactly.

llm-compressor writes 4-bit weights as compressed-tensors ``pack-quantized``; the
onnxruntime-genai model builder reads pre-quantized int4 weights from AutoGPTQ
(or AutoAWQ) folders only (its compressed-tensors route is FP8/NVFP4 on CUDA).
Both layouts hold the same numbers: 4-bit codes, one scale and one zero point per
group of ``group_size`` input columns, ``W = (code - zero) * scale``. Only the
packing differs, so the conversion here is lossless (tests check the round trip
bit for bit and that both layouts dequantize to the same weights):

=====================  ==================================  ==================================
tensor                 compressed-tensors (per linear)      AutoGPTQ (per linear)
=====================  ==================================  ==================================
codes                  ``weight_packed`` int32 [out, in/8]  ``qweight`` int32 [in/8, out]
                       8 codes along *in*, low nibble       8 codes along *in*, low nibble
                       first, stored as signed code + 8     first, unsigned code
zero points            ``weight_zero_point`` int32          ``qzeros`` int32 [in/g, out/8]
                       [out/8, in/g] (asymmetric only),     8 along *out*, stored as
                       signed zero + 8; symmetric: 0        zero - 1 (mod 16)
scales                 ``weight_scale`` [out, in/g]         ``scales`` [in/g, out] fp16
group of column k      k // g                               ``g_idx`` int32 [in] = k // g
=====================  ==================================  ==================================

In unsigned terms both store ``u = q + 8``, and a symmetric zero point is 8. Scales
become float16 when every value is exactly representable (the usual case: bf16
scales of a normal magnitude are), else stay float32 so that nothing is rounded.
Needs: torch, safetensors (the ``torch`` extra).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

BITS = (4, 8)  # code widths the repack carries: 4-bit layers, and 8-bit ones kept by sensitive_layers
SUFFIXES = ("weight_packed", "weight_scale", "weight_shape", "weight_zero_point", "weight_g_idx")


def pack_nibbles(codes, dim: int, bits: int = 4):
    """Pack ``bits``-bit codes (0..2^bits-1) 32 // bits to an int32 along ``dim``: code k sits in bits
    bits*(k % per) of word k // per, the lowest first (4-bit codes: nibbles, 8 to a word)."""
    import numpy as np
    import torch

    per = 32 // bits
    x = np.moveaxis(codes.numpy().astype(np.uint32), dim, 0)
    if x.shape[0] % per:
        raise ValueError(f"cannot pack {x.shape[0]} codes: not a multiple of {per}")
    x = (x & (2**bits - 1)).reshape(x.shape[0] // per, per, *x.shape[1:])
    shifts = (bits * np.arange(per, dtype=np.uint32)).reshape(1, per, *([1] * (x.ndim - 2)))
    words = np.bitwise_or.reduce(x << shifts, axis=1)  # the codes do not overlap
    return torch.from_numpy(np.ascontiguousarray(np.moveaxis(words, 0, dim)).view(np.int32))


def unpack_nibbles(words, dim: int, length: int | None = None, bits: int = 4):
    """Inverse of ``pack_nibbles``: int32 words -> codes (int32), the first ``length`` along ``dim``."""
    import numpy as np
    import torch

    per = 32 // bits
    w = np.moveaxis(words.numpy().view(np.uint32), dim, 0)
    shifts = (bits * np.arange(per, dtype=np.uint32)).reshape(1, per, *([1] * (w.ndim - 1)))
    codes = ((w[:, None] >> shifts) & (2**bits - 1)).reshape(w.shape[0] * per, *w.shape[1:])
    if length is not None:
        codes = codes[:length]
    return torch.from_numpy(np.ascontiguousarray(np.moveaxis(codes, 0, dim)).astype(np.int32))


def packed_bits(weight_packed, weight_shape) -> int:
    """The code width of a compressed-tensors ``weight_packed`` (4 or 8): 32 x its words per row / input width."""
    in_features = int(weight_shape[1])
    bits = 32 * int(weight_packed.shape[1]) // in_features
    if bits not in BITS or in_features * bits != 32 * int(weight_packed.shape[1]):
        raise ValueError(f"weight_packed {tuple(weight_packed.shape)} for {in_features} inputs holds neither 4- nor "
                         "8-bit codes")
    return bits


def from_compressed_tensors(weight_packed, weight_scale, weight_shape, weight_zero_point=None):
    """(codes [out, in], zeros [out, in/g], scales [out, in/g]) of one compressed-tensors linear, unsigned
    (a symmetric layout's zero point is the middle code, 2^(bits-1))."""
    import torch

    out_features, in_features = (int(v) for v in weight_shape)
    bits = packed_bits(weight_packed, weight_shape)
    codes = unpack_nibbles(weight_packed, 1, in_features, bits)[:out_features]
    groups = weight_scale.shape[1]
    if weight_zero_point is None:
        zeros = torch.full((out_features, groups), 2 ** (bits - 1), dtype=torch.int32)
    else:
        zeros = unpack_nibbles(weight_zero_point, 0, out_features, bits)
    return codes, zeros, weight_scale


def to_compressed_tensors(codes, zeros, scales, symmetric: bool, bits: int = 4) -> dict:
    """The compressed-tensors tensors of one linear (inverse of ``from_compressed_tensors``)."""
    import torch

    out = {"weight_packed": pack_nibbles(codes, 1, bits), "weight_scale": scales,
           "weight_shape": torch.tensor(list(codes.shape), dtype=torch.int64)}
    if not symmetric:
        out["weight_zero_point"] = pack_nibbles(zeros, 0, bits)
    elif not bool((zeros == 2 ** (bits - 1)).all()):
        raise ValueError(f"a symmetric layout needs every zero point to be {2 ** (bits - 1)}")
    return out


def gptq_scales(scales):
    """Scales as AutoGPTQ stores them: float16 when that is exact, else float32 (never rounded)."""
    import torch

    half = scales.to(torch.float16)
    exact = bool(torch.equal(half.to(torch.float32), scales.to(torch.float32)))
    return half if exact else scales.to(torch.float32)


def to_gptq(codes, zeros, scales, group_size: int, bits: int = 4) -> dict:
    """AutoGPTQ tensors of one linear from unsigned codes [out, in], zeros and scales [out, in/g]."""
    import torch

    in_features = codes.shape[1]
    if in_features % group_size:
        raise ValueError(f"input width {in_features} is not a multiple of group size {group_size}")
    return {
        "qweight": pack_nibbles(codes.t(), 0, bits),
        "qzeros": pack_nibbles(((zeros - 1) & (2**bits - 1)).t(), 1, bits),
        "scales": gptq_scales(scales).t().contiguous(),
        "g_idx": torch.arange(in_features, dtype=torch.int32) // group_size,
    }


def from_gptq(qweight, qzeros, scales, g_idx, bits: int = 4):
    """(codes [out, in], zeros [out, in/g], scales [out, in/g]) of one AutoGPTQ linear (inverse of ``to_gptq``)."""
    in_features, out_features = int(g_idx.shape[0]), int(qweight.shape[1])
    codes = unpack_nibbles(qweight, 0, in_features, bits).t().contiguous()
    zeros = ((unpack_nibbles(qzeros, 1, out_features, bits) + 1) & (2**bits - 1)).t().contiguous()
    return codes, zeros, scales.t().contiguous()


def dequantize(codes, zeros, scales):
    """float32 weights [out, in]: (code - zero) * scale, groups of in / scales.shape[1] columns."""
    import torch

    group_size = codes.shape[1] // scales.shape[1]
    zero = zeros.repeat_interleave(group_size, dim=1).to(torch.float32)
    scale = scales.to(torch.float32).repeat_interleave(group_size, dim=1)
    return (codes.to(torch.float32) - zero) * scale


def scheme_of(qconfig: dict) -> dict:
    """What a compressed-tensors quantization_config holds: weight bits/type/strategy/group, activations."""
    groups = list((qconfig.get("config_groups") or {}).values())
    weights = [g.get("weights") or {} for g in groups]
    return {
        "format": qconfig.get("format") or next((g.get("format") for g in groups if g.get("format")), None),
        "bits": sorted({w.get("num_bits") for w in weights}),
        "types": sorted({str(w.get("type")) for w in weights}),
        "strategies": sorted({str(w.get("strategy")) for w in weights}),
        "group_sizes": sorted({w.get("group_size") for w in weights if w.get("group_size")}),
        "symmetric": sorted({bool(w.get("symmetric", True)) for w in weights}),
        "actorder": sorted({str(w.get("actorder")) for w in weights}),
        "activations": any(g.get("input_activations") for g in groups),
        "sparse": bool(qconfig.get("sparsity_config")),
        "kv_cache": bool(qconfig.get("kv_cache_scheme")),
    }


def online_transforms(qconfig: dict) -> list[str]:
    """The transforms of a compressed-tensors config that act on activations at inference (QuIP's, SpinQuant's R3
    and R4), by scheme name; those folded into the weights (location weight_input / weight_output, as SpinQuant's
    R1 and R2) are not listed: the weights already hold them."""
    schemes = (qconfig.get("transform_config") or {}).get("config_groups") or {}
    return sorted(name for name, scheme in schemes.items()
                  if any(not str(apply.get("location", "")).startswith("weight") for apply in scheme.get("apply") or []))


def w4a16_problem(qconfig: dict) -> str | None:
    """Why a compressed-tensors config cannot be repacked into AutoGPTQ int4, or None when it can."""
    s = scheme_of(qconfig)
    if qconfig.get("quant_method") != "compressed-tensors":
        return f"quant_method is {qconfig.get('quant_method')!r}, not compressed-tensors"
    if 4 not in s["bits"] or not set(s["bits"]) <= set(BITS) or s["types"] != ["int"]:
        return (f"its weights are {'/'.join(map(str, s['bits']))}-bit {'/'.join(s['types'])}, not 4-bit int (W4A16, "
                "some layers at 8 bits allowed)")
    if s["activations"]:
        return "it also quantizes activations (W4A4/W4A8); only weight-only W4A16 can be repacked"
    if s["format"] != "pack-quantized":
        return f"its format is {s['format']!r}, not pack-quantized"
    if s["strategies"] != ["group"] or len(s["group_sizes"]) != 1:
        return f"its weights use strategy {'/'.join(s['strategies'])} with group sizes {s['group_sizes']}; one group size is needed"
    if "group" in s["actorder"]:
        return "it uses activation-ordered groups (actorder = \"group\", a g_idx permutation), which MatMulNBits blocks cannot express"
    if s["sparse"] or s["kv_cache"]:
        return "it also carries sparsity or KV-cache quantization, which the repack does not convert"
    return None


def gptq_config(qconfig: dict, bits: dict[str, int] | None = None) -> dict:
    """AutoGPTQ's quantization_config; ``bits``: each converted linear's code width, those of 8 bits named in
    ``dynamic`` (GPTQModel's per-module overrides, which the ONNX Runtime GenAI builder reads: a pattern
    matched at the start of each tensor name)."""
    s = scheme_of(qconfig)
    config = {"quant_method": "gptq", "bits": 4, "group_size": s["group_sizes"][0], "desc_act": False,
              "sym": s["symmetric"] == [True], "checkpoint_format": "gptq"}
    wide = sorted(name for name, width in (bits or {}).items() if width != 4)
    if wide:
        config["dynamic"] = {f"+:{re.escape(name)}\\.": {"bits": bits[name]} for name in wide}
    return config


def convert_shard(tensors: dict) -> tuple[dict, dict[str, int]]:
    """One safetensors shard: every packed linear in AutoGPTQ layout, other tensors untouched;
    returns the new tensors and the converted linears' code widths by name."""
    out = {}
    bases = {k.rsplit(".", 1)[0] for k in tensors if k.endswith(".weight_packed")}
    for key, value in tensors.items():
        base, _, suffix = key.rpartition(".")
        if base not in bases:
            out[key] = value
        elif suffix == "weight_g_idx":
            raise ValueError(f"{key}: activation-ordered groups cannot be repacked")
    widths = {}
    for base in sorted(bases):
        packed, shape = tensors[f"{base}.weight_packed"], tensors[f"{base}.weight_shape"]
        widths[base] = packed_bits(packed, shape)
        codes, zeros, scales = from_compressed_tensors(packed, tensors[f"{base}.weight_scale"], shape,
                                                       tensors.get(f"{base}.weight_zero_point"))
        group_size = codes.shape[1] // scales.shape[1]
        out.update({f"{base}.{name}": t for name, t in to_gptq(codes, zeros, scales, group_size, widths[base]).items()})
    return out, widths


def repack_checkpoint(src: Path, dst: Path) -> dict:
    """Write the AutoGPTQ form of the compressed-tensors W4A16 folder ``src`` into ``dst``."""
    from safetensors.torch import load_file, save_file

    config = json.loads((src / "config.json").read_text())
    qconfig = config.get("quantization_config") or {}
    problem = w4a16_problem(qconfig)
    if problem:
        raise ValueError(f"{src} cannot be repacked: {problem}")
    dst.mkdir(parents=True, exist_ok=True)
    widths: dict[str, int] = {}
    for path in sorted(src.iterdir()):
        if path.suffix == ".safetensors":
            tensors, converted = convert_shard(load_file(path))
            save_file(tensors, dst / path.name, metadata={"format": "pt"})
            widths |= converted
        elif path.is_file() and path.name != "config.json" and not path.name.endswith(".index.json"):
            shutil.copy2(path, dst / path.name)
    config["quantization_config"] = gptq_config(qconfig, widths)
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return {"linears": len(widths), "lm_head_quantized": any(n.endswith("lm_head") for n in widths),
            "linears_8bit": sum(1 for w in widths.values() if w == 8), **config["quantization_config"]}
