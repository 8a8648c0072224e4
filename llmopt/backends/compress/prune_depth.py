"""Compress: depth pruning, dropping the decoder layers that change the hidden state least.

Each decoder layer's importance is the angular distance between its input and output
hidden states, arccos(cosine similarity) / pi, averaged over the calibration tokens
(the first position of each row, an attention sink, is left out). The layers with the
smallest distance do the least and are removed; the first and last layers can be
protected. The result is a smaller dense checkpoint: ``num_hidden_layers`` and any
per-layer config lists are updated and the remaining layers renumbered, so every
later stage and engine sees an ordinary model of the new depth.
Needs: torch, transformers (the core ``torch`` extra); llmopt's own code.
Produces: ``model/`` (safetensors in the recipe's dtype, tokenizer); outputs list
the dropped layers and every layer's score.
"""

from __future__ import annotations

import dataclasses
import math

from pydantic import Field

from llmopt.model import formats
from llmopt.backends.base import CompressBackend, Options, PlanContext, StageContext
from llmopt.libraries import require
from llmopt.backends.compress import _prune
from llmopt.backends.compress._common import folder_bytes
from llmopt.errors import Problem, StageFailed
from llmopt.registry import register


class PruneDepthOptions(Options):
    layers: int | None = Field(None, ge=1, description="Number of decoder layers to drop (set this or fraction).")
    fraction: float | None = Field(None, gt=0, lt=1, description="Share of decoder layers to drop, rounded to the "
                                   "nearest whole layer (set this or layers).")
    protect_first: int = Field(1, ge=0, description="The first N layers are never dropped.")
    protect_last: int = Field(1, ge=0, description="The last N layers are never dropped.")


def to_drop(options: PruneDepthOptions, num_layers: int) -> int:
    if options.layers is not None:
        return options.layers
    return max(1, round((options.fraction or 0) * num_layers))


@register("compress", "prune_depth")
class PruneDepth(CompressBackend):
    Options = PruneDepthOptions
    requires = _prune.REQUIRES
    extra = _prune.EXTRA
    calibrates = True
    cpu_float32 = True  # on a CPU: computes in float32, saves the recipe's dtype
    prunes = True

    def produces(self, options: PruneDepthOptions) -> formats.Format:
        return formats.DENSE

    def check(self, options: PruneDepthOptions, ctx: PlanContext) -> list[Problem]:
        problems = _prune.plan_checks(ctx, "prune_depth")
        if (options.layers is None) == (options.fraction is None):
            problems.append(ctx.problem("set exactly one of layers and fraction", "layers",
                                        hint="e.g. layers = 4, or fraction = 0.1"))
        elif ctx.model is not None:
            n, total = to_drop(options, ctx.model.num_layers), ctx.model.num_layers
            candidates = total - options.protect_first - options.protect_last
            if n > candidates:
                problems.append(ctx.problem(
                    f"cannot drop {n} of {total} layers with {options.protect_first} first and "
                    f"{options.protect_last} last protected ({max(candidates, 0)} can go)", "layers",
                    hint="drop fewer layers or protect fewer"))
        return problems

    def transform_info(self, options: PruneDepthOptions, info):
        return dataclasses.replace(info, num_layers=info.num_layers - to_drop(options, info.num_layers))

    def run(self, options: PruneDepthOptions, ctx: StageContext) -> dict:
        tokenizer, model, rows, batches = _prune.load(ctx)
        layers = model.model.layers
        total = len(layers)
        n = to_drop(options, total)
        candidates = list(range(options.protect_first, total - options.protect_last))
        if n > len(candidates):
            raise StageFailed(f"cannot drop {n} of {total} layers with the protected ones kept", where=ctx.name)
        ctx.progress("scoring layers")
        scores = angular_distances(model, batches, ctx.progress)
        dropped = sorted(sorted(candidates, key=lambda i: scores[i])[:n])
        before = _prune.param_count(model)
        drop_layers(model, dropped)
        ctx.progress(f"dropped layers {dropped}; saving")
        out = _prune.save(ctx, model, tokenizer)
        return {"format": "hf", "model_dir": "model", "dropped_layers": dropped,
                "num_hidden_layers": _prune.config_of(out)["num_hidden_layers"],
                "layer_scores": [round(s, 6) for s in scores], "parameters_before": before,
                "parameters_after": _prune.param_count(model), "model_bytes": folder_bytes(out),
                "calibration": rows.summary(), "compute_dtype": _prune.compute_dtype(ctx)}


def angular_distances(model, batches, progress=None) -> list[float]:
    """Mean angular distance (0..1) between each decoder layer's input and output hidden states."""
    torch = require("torch", _prune.EXTRA, "prune_depth")
    layers = model.model.layers
    sums = [0.0] * len(layers)
    counts = [0] * len(layers)
    inputs: dict[int, object] = {}

    def before(index):
        def hook(module, args, kwargs):
            inputs[index] = _prune.layer_input(args, kwargs)
        return hook

    def after(index):
        def hook(module, args, kwargs, output):
            x = inputs.pop(index)[:, 1:].float()
            y = _prune.layer_output(output)[:, 1:].float()
            cos = torch.nn.functional.cosine_similarity(x, y, dim=-1).clamp(-1, 1)
            sums[index] += float(torch.arccos(cos).sum()) / math.pi
            counts[index] += cos.numel()
        return hook

    handles = [layer.register_forward_pre_hook(before(i), with_kwargs=True) for i, layer in enumerate(layers)]
    handles += [layer.register_forward_hook(after(i), with_kwargs=True) for i, layer in enumerate(layers)]
    with _prune.hooks(handles):
        _prune.forward_all(model, batches, progress)
    return [s / c for s, c in zip(sums, counts)]


def drop_layers(model, dropped: list[int]) -> None:
    """Remove decoder layers in place, renumber the rest and update the config."""
    torch = require("torch", _prune.EXTRA, "prune_depth")
    kept = [layer for i, layer in enumerate(model.model.layers) if i not in set(dropped)]
    for new_index, layer in enumerate(kept):
        for module in layer.modules():
            if hasattr(module, "layer_idx"):
                module.layer_idx = new_index
    model.model.layers = torch.nn.ModuleList(kept)
    config = model.config
    old = config.num_hidden_layers
    dense = dense_layers(config)
    config.num_hidden_layers = len(kept)
    for key, value in list(vars(config).items()):  # per-layer lists (layer_types, ...)
        if isinstance(value, list) and len(value) == old and key != "architectures" and key != "mlp_only_layers":
            setattr(config, key, [v for i, v in enumerate(value) if i not in set(dropped)])
    if dense is not None:  # the kept dense layers by their new numbers; every other layer routed
        remaining = [i for i in range(old) if i not in set(dropped)]
        config.mlp_only_layers = [new for new, i in enumerate(remaining) if i in dense]
        config.decoder_sparse_step = 1


def dense_layers(config) -> set[int] | None:
    """Of a Qwen mixture-of-experts config, the layers with a dense MLP: those ``mlp_only_layers`` names, and
    those ``decoder_sparse_step`` skips (a layer is routed where (index + 1) % step == 0). Both count layers by
    index, so dropping layers renumbers them. None for other configs."""
    if getattr(config, "mlp_only_layers", None) is None:
        return None
    step = getattr(config, "decoder_sparse_step", 1) or 1
    experts = getattr(config, "num_experts", 0) or 0
    return {i for i in range(config.num_hidden_layers)
            if i in config.mlp_only_layers or not (experts > 0 and (i + 1) % step == 0)}
