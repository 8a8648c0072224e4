"""Which layers 4-bit rounding hurts most, measured on the calibration data: ``sensitive_layers = N``.

A unit is the set of linears that read one input tensor (q/k/v of an attention, gate/up of an MLP,
each other linear alone): the linears an engine fuses into one GEMM, which must share a precision
(vLLM refuses a fused layer whose parts differ). Each unit's score is the rounding error it would
add to its outputs on the calibration tokens, relative to those outputs, under the step's own
rounding (compressed-tensors' ``calculate_qparams`` and ``fake_quantize`` at its bits, group size and
symmetry, before any GPTQ or AWQ correction):

    score(unit) = sum over its linears of  sum_ij dW_ij^2 * E[x_j^2]  /  sum_ij W_ij^2 * E[x_j^2]

where ``dW`` is the rounded weight minus the weight and ``E[x_j^2]`` the mean square of input channel
``j`` over the calibration tokens: the diagonal of the inputs' second moment (the importance that
llama.cpp's imatrix also keeps), one vector per unit, so the measurement costs one forward pass and
little memory at any model size. The ``N`` units of highest score keep 8-bit symmetric weights in the
same group size; the others get the step's 4 bits. The stage's outputs list the kept units, every
unit's score and the bytes the kept ones add.
Needs: torch, compressed-tensors (the ``compress`` extra).
"""

from __future__ import annotations

from dataclasses import dataclass

KEPT_BITS = 8
HELP = ("Keep the N layer groups whose 4-bit rounding errs most on the calibration data (relative to their "
        "outputs) at 8-bit symmetric weights in the same group size; a group is the linears that read one input "
        "(q/k/v, gate/up, each other linear alone), which engines fuse. 0: every layer at 4 bits. The stage's "
        "outputs list the kept groups, the scores and the bytes they add.")


@dataclass(frozen=True)
class Unit:
    names: tuple[str, ...]  # the linears' module names, in the model's order
    score: float  # relative rounding error of the unit's outputs on the calibration tokens
    parameters: int


def units_and_moments(model, batches: list, skip: set[str]) -> tuple[list[tuple[str, ...]], dict]:
    """The model's units (linears grouped by the input tensor they read, ``skip`` left out) and each unit's
    mean square per input channel over ``batches`` (token id tensors), in float64."""
    import torch

    linears = {name: module for name, module in model.named_modules()
               if isinstance(module, torch.nn.Linear) and name not in skip}
    readers: dict[int, list[str]] = {}
    held = []  # every input stays alive through the pass, so no two inputs can share an address

    def record(name):
        def hook(module, args, output):
            held.append(args[0])
            readers.setdefault(id(args[0]), []).append(name)
        return hook

    handles = [module.register_forward_hook(record(name)) for name, module in linears.items()]
    try:
        with torch.no_grad():
            model(batches[0][:, :16])  # a few tokens: only which linears share an input is read here
    finally:
        for handle in handles:
            handle.remove()
    held.clear()
    units = [tuple(names) for names in readers.values()]
    sums: dict[tuple[str, ...], torch.Tensor] = {}
    counts: dict[tuple[str, ...], int] = {}

    def accumulate(unit):
        def hook(module, args, output):
            x = args[0].detach().reshape(-1, args[0].shape[-1]).to(torch.float64)
            sums[unit] = sums.get(unit, 0) + (x * x).sum(0)
            counts[unit] = counts.get(unit, 0) + x.shape[0]
        return hook

    handles = [linears[unit[0]].register_forward_hook(accumulate(unit)) for unit in units]
    try:
        with torch.no_grad():
            for batch in batches:
                model(batch)
    finally:
        for handle in handles:
            handle.remove()
    return units, {unit: (sums[unit] / counts[unit]).cpu() for unit in units}


def rounded(weight, bits: int, group_size: int | None, symmetric: bool):
    """``weight`` after compressed-tensors' round-to-nearest at ``bits`` in groups (per output row without)."""
    import torch
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.utils import calculate_qparams

    w = weight.detach().to(torch.float32)
    args = QuantizationArgs(num_bits=bits, type="int", symmetric=symmetric,
                            strategy="group" if group_size else "channel", group_size=group_size)
    grouped = w.reshape(w.shape[0], -1, group_size) if group_size else w.unsqueeze(1)
    scale, zero = calculate_qparams(grouped.amin(-1), grouped.amax(-1), args)
    if not group_size:
        scale, zero = scale.reshape(-1, 1), zero.reshape(-1, 1)
    return fake_quantize(w, scale, zero, args)


def rank(model, batches: list, bits: int, group_size: int | None, symmetric: bool, skip: set[str]) -> list[Unit]:
    """Every unit of ``model`` with its score, highest first."""
    import torch

    units, moments = units_and_moments(model, batches, skip)
    modules = dict(model.named_modules())
    ranked = []
    for unit in units:
        error = reference = 0.0
        for name in unit:
            weight = modules[name].weight.detach().to(torch.float32).cpu()
            moment = moments[unit].to(torch.float32)
            error += float(((rounded(weight, bits, group_size, symmetric) - weight) ** 2 @ moment).sum())
            reference += float((weight ** 2 @ moment).sum())
        ranked.append(Unit(unit, error / reference if reference else 0.0,
                           sum(modules[name].weight.numel() for name in unit)))
    return sorted(ranked, key=lambda u: -u.score)


def added_bytes(units: list[Unit], bits: int, group_size: int | None, symmetric: bool) -> int:
    """What keeping ``units`` at 8-bit symmetric weights adds to a ``bits``-bit checkpoint: the codes' extra bits,
    less the zero points an asymmetric layout stores per group (8-bit symmetric stores none)."""
    parameters = sum(u.parameters for u in units)
    codes = parameters * (KEPT_BITS - bits) // 8
    zeros = 0 if symmetric or not group_size else parameters // group_size * bits // 8
    return codes - zeros


def outputs(ranked: list[Unit], kept: list[Unit], bits: int, group_size: int | None, symmetric: bool) -> dict:
    """The stage outputs' record of the measurement."""
    return {"kept_bits": KEPT_BITS, "kept": [list(u.names) for u in kept],
            "kept_parameters": sum(u.parameters for u in kept),
            "added_bytes": added_bytes(kept, bits, group_size, symmetric),
            "scores": {u.names[0]: round(u.score, 6) for u in ranked}}


def planned_parameters(info, count: int) -> int:
    """At most the weights ``count`` kept units hold, before they are measured: those of the model's ``count``
    largest units (``info.linears()``: a layer's q/k/v together, gate/up together, each other linear alone)."""
    if not count or info is None:
        return 0
    entries = info.linears()
    units: list[tuple[int, int]] = []  # (weights of one unit, how many such units)
    attention = [(rows * cols, n) for kind, rows, cols, n in entries if kind in ("q_proj", "k_proj", "v_proj")]
    if attention:
        layers = max(n for _, n in attention)
        units.append((sum(w * n for w, n in attention) // layers, layers))
    gates = [(rows * cols, n) for kind, rows, cols, n in entries if kind == "gate_proj"]
    ups = [rows * cols for kind, rows, cols, n in entries if kind == "up_proj"]
    units += [(gate + up, n) for (gate, n), up in zip(gates, ups)]
    units += [(rows * cols, n) for kind, rows, cols, n in entries if kind in ("o_proj", "down_proj")]
    total = 0
    for weights, n in sorted(units, reverse=True):
        take = min(n, count)
        total, count = total + take * weights, count - take
        if not count:
            break
    return total


def planned_bytes(parameters: int, bits: int, group_size: int | None, symmetric: bool) -> int:
    """What keeping ``parameters`` weights (``planned_parameters``) at 8 bits adds to a ``bits``-bit checkpoint."""
    return added_bytes([Unit(("planned",), 0.0, parameters)], bits, group_size, symmetric)
