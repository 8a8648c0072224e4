"""Compress: width pruning, shrinking every MLP's intermediate size by neuron importance.

A neuron of a decoder layer's MLP is one row of gate_proj and up_proj (of each half
of Phi-3's fused gate_up_proj) and one column of down_proj. Its importance is the mean magnitude of its activation (the
input of down_proj) over the calibration tokens, times the norm of its down_proj
column (how much it can move the output). Every layer keeps its most important
neurons; all layers keep the same number, a multiple of ``multiple_of`` (64 by
default, what GPU kernels and 4-bit group sizes like), so the result is an ordinary
dense checkpoint with a smaller ``intermediate_size``.
Needs: torch, transformers (the core ``torch`` extra); llmopt's own code.
Produces: ``model/`` (safetensors in the recipe's dtype, tokenizer).
"""

from __future__ import annotations

import dataclasses

from pydantic import Field

from llmopt.model import families, formats
from llmopt.backends.base import CompressBackend, Options, PlanContext, StageContext
from llmopt.libraries import require
from llmopt.backends.compress import _checks, _prune
from llmopt.backends.compress._common import folder_bytes
from llmopt.errors import Problem, StageFailed
from llmopt.registry import register


class PruneWidthOptions(Options):
    intermediate_size: int | None = Field(None, ge=1, description="MLP intermediate size to keep (set this or fraction).")
    fraction: float | None = Field(None, gt=0, lt=1, description="Share of MLP neurons to remove (set this or "
                                   "intermediate_size); the kept size is rounded down to multiple_of.")
    multiple_of: int = Field(64, ge=1, description="The kept intermediate size is a multiple of this.")


def new_size(options: PruneWidthOptions, current: int) -> int:
    if options.intermediate_size is not None:
        return options.intermediate_size
    return _checks.round_to(current * (1 - (options.fraction or 0)), options.multiple_of)


@register("compress", "prune_width")
class PruneWidth(CompressBackend):
    Options = PruneWidthOptions
    requires = _prune.REQUIRES
    extra = _prune.EXTRA
    calibrates = True
    cpu_float32 = True  # on a CPU: computes in float32, saves the recipe's dtype
    prunes = True

    def produces(self, options: PruneWidthOptions) -> formats.Format:
        return formats.DENSE

    def check(self, options: PruneWidthOptions, ctx: PlanContext) -> list[Problem]:
        problems = _prune.plan_checks(ctx, "prune_width")
        if (ctx.model is not None and ctx.model.num_experts  # a refusal of the family table says it already
                and families.verdict(ctx.model.model_type, "compress.prune_width").status != "refused"):
            problems.append(ctx.problem("prune_width narrows dense MLPs; a mixture-of-experts model's MLPs are "
                                        "routed experts", "method", hint="prune_depth drops whole layers of it"))
        if (options.intermediate_size is None) == (options.fraction is None):
            return problems + [ctx.problem("set exactly one of intermediate_size and fraction", "intermediate_size",
                                           hint="e.g. fraction = 0.25")]
        if options.intermediate_size is not None and options.intermediate_size % options.multiple_of:
            problems.append(ctx.problem(f"intermediate_size {options.intermediate_size} is not a multiple of "
                                        f"{options.multiple_of}", "intermediate_size",
                                        hint=f"use {_checks.round_to(options.intermediate_size, options.multiple_of)}"))
        if ctx.model is not None and new_size(options, ctx.model.intermediate_size) >= ctx.model.intermediate_size:
            problems.append(ctx.problem(f"the kept size {new_size(options, ctx.model.intermediate_size)} is not "
                                        f"smaller than the model's {ctx.model.intermediate_size}", "intermediate_size"))
        return problems

    def transform_info(self, options: PruneWidthOptions, info):
        return dataclasses.replace(info, intermediate_size=new_size(options, info.intermediate_size))

    def run(self, options: PruneWidthOptions, ctx: StageContext) -> dict:
        tokenizer, model, rows, batches = _prune.load(ctx)
        current = model.config.intermediate_size
        if not isinstance(current, int):
            raise StageFailed(f"{ctx.name}: per-layer intermediate sizes are not supported", where=ctx.name)
        keep = new_size(options, current)
        if not 0 < keep < current:
            raise StageFailed(f"{ctx.name}: cannot keep {keep} of {current} MLP neurons", where=ctx.name)
        ctx.progress("scoring MLP neurons")
        scores = neuron_scores(model, batches, ctx.progress)
        before = _prune.param_count(model)
        for layer, score in zip(model.model.layers, scores):
            shrink_mlp(layer.mlp, score.topk(keep).indices.sort().values)
        model.config.intermediate_size = keep
        ctx.progress(f"intermediate size {current} -> {keep}; saving")
        out = _prune.save(ctx, model, tokenizer)
        return {"format": "hf", "model_dir": "model", "intermediate_size_before": current,
                "intermediate_size": _prune.config_of(out)["intermediate_size"], "parameters_before": before,
                "parameters_after": _prune.param_count(model), "model_bytes": folder_bytes(out),
                "calibration": rows.summary(), "compute_dtype": _prune.compute_dtype(ctx)}


def neuron_scores(model, batches, progress=None) -> list:
    """Per layer, a score per MLP neuron: mean |activation| x norm of its down_proj column."""
    torch = require("torch", _prune.EXTRA, "prune_width")
    layers = model.model.layers
    sums = [None] * len(layers)
    counts = [0] * len(layers)

    def capture(index):
        def hook(module, args):
            x = args[0].detach().float().abs().reshape(-1, args[0].shape[-1])
            sums[index] = x.sum(0) if sums[index] is None else sums[index] + x.sum(0)
            counts[index] += x.shape[0]
        return hook

    handles = []
    for index, layer in enumerate(layers):
        mlp = getattr(layer, "mlp", None)
        if mlp is None or not gated(mlp):
            raise StageFailed(f"layer {index} has no gate/up/down MLP; prune_width handles Llama-style MLPs only "
                              "(gate_proj and up_proj, or Phi-3's fused gate_up_proj)")
        handles.append(mlp.down_proj.register_forward_pre_hook(capture(index)))
    with _prune.hooks(handles):
        _prune.forward_all(model, batches, progress)
    with torch.no_grad():
        return [(s / c) * layer.mlp.down_proj.weight.float().norm(dim=0) for s, c, layer in zip(sums, counts, layers)]


def gated(mlp) -> bool:
    """Whether ``mlp`` is a gated MLP this backend narrows: gate_proj, up_proj and down_proj, or Phi-3's
    gate_up_proj (the gate's rows, then the up projection's) and down_proj."""
    parts = ("gate_up_proj",) if hasattr(mlp, "gate_up_proj") else ("gate_proj", "up_proj")
    return all(hasattr(mlp, name) for name in (*parts, "down_proj"))


def shrink_mlp(mlp, keep) -> None:
    """Keep the neurons ``keep`` (sorted indices) of a gate/up/down MLP, in place; of a fused gate_up_proj, the
    rows ``keep`` of its gate half and of its up half."""
    torch = require("torch", _prune.EXTRA, "prune_width")
    if hasattr(mlp, "gate_up_proj"):
        width = mlp.down_proj.in_features
        rows = {"gate_up_proj": torch.cat([keep, keep + width])}
    else:
        rows = {"gate_proj": keep, "up_proj": keep}
    with torch.no_grad():
        for name, kept in rows.items():
            linear = getattr(mlp, name)
            linear.weight = torch.nn.Parameter(linear.weight[kept].clone())
            if linear.bias is not None:
                linear.bias = torch.nn.Parameter(linear.bias[kept].clone())
            linear.out_features = len(kept)
        down = mlp.down_proj
        down.weight = torch.nn.Parameter(down.weight[:, keep].clone())
        down.in_features = len(keep)
    if hasattr(mlp, "intermediate_size"):
        mlp.intermediate_size = len(keep)
