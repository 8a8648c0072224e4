"""The plan's estimates: the size model's bytes before and after (``llmopt.model.estimates``), the compress
stage's placement (``llmopt.model.placement``) and the KV cache of the serving memory model."""

from __future__ import annotations

from typing import Any

from llmopt.model import estimates
from llmopt.errors import Problem
from llmopt.model.modelinfo import ModelInfo
from llmopt.plan.types import Plan, Stage
from llmopt.recipe.load import LoadedRecipe


def compress_placement(loaded: LoadedRecipe, stages: list[Stage], source: ModelInfo | None, final: ModelInfo | None,
                       problems: list[Problem]) -> dict | None:
    """How the compress stage holds the model on the compute machine (``llmopt.model.placement``); its refusal
    when nothing fits, and the MoE calibration warning, join ``problems``."""
    from llmopt.model import placement
    steps = [s.impl for s in stages if s.kind == "compress"]
    if source is None or not steps:
        return None
    try:
        out = estimates.model_size(loaded, final or source)
    except Exception:  # a layout a backend cannot describe: the disk need is then the download alone
        out = None
    entry, found = placement.plan_placement(loaded, source, steps, out)
    problems += found
    return entry


def plan_estimates(plan: Plan, info: ModelInfo | None, source_info: ModelInfo | None) -> dict:
    """Sizes from the size model (``estimates``): the source folder, the final model folder as its last
    stage writes it, and the KV cache from the serving memory model (``memory``) when a GPU is named (for the
    first engine [serve] backend lists). ``info``:
    the final model's config facts (after pruning), ``source_info``: the source's."""
    if info is None:
        return {"note": "model facts unknown; no estimates"}
    from llmopt.deploy import inputs
    from llmopt.errors import UsageError

    recipe = plan.recipe.recipe
    source_info = source_info or info
    layouts = estimates.stage_layouts(plan.recipe, info)
    before = estimates.size(layouts[0][1], source_info)
    after = estimates.size(layouts[-1][1], info)
    out: dict[str, Any] = {
        "parameters": info.total_params,
        "weight_bytes_before": before["weight_bytes"],
        "weight_bytes_after": after["weight_bytes"],
        "model_bytes_before": before["bytes"],
        "artifact_bytes": after["bytes"],
        "compression_ratio": round(before["bytes"] / after["bytes"], 2) if after["bytes"] else None,
        "model_size": after,
    }
    if any(s.impl.calibrates for s in plan.stages if s.kind == "compress"):
        cal = recipe.calibration
        dtype = estimates.model_dtype(recipe, source_info)
        out["calibration_memory_bytes"] = estimates.calibration_bytes(source_info, dtype, cal.samples, cal.max_seq_len)
    if plan.gpu is not None:
        try:
            default = plan.recipe.for_engine(recipe.serve.engines[0]) if recipe.serve is not None else plan.recipe
            planned = inputs.estimated_memory(default, info, plan.gpu, after["weight_bytes"]).to_dict()
            out["kv_cache"] = {k: v for k, v in planned.items() if k != "tried"} | {"fits": True}
        except UsageError as exc:
            out["kv_cache"] = {"fits": False, "reason": exc.what, "fix": exc.fix}
    return out


def growth_problems(plan: Plan) -> list[Problem]:
    """A warning when a plan that quantizes writes a model larger than its source, naming the parts that weigh
    most and how they are stored (a float embedding table beside 4-bit layers, say), so that the cost is read
    before the run rather than found in the artifact."""
    est = plan.estimates
    before, after = est.get("model_bytes_before"), est.get("artifact_bytes")
    quantizes = any(s.kind == "compress" and s.impl.quantizes for s in plan.stages) or \
        getattr(next((s.options for s in plan.stages if s.kind == "export"), None), "precision", "") in ("int4", "int8")
    if not before or not after or after <= before or not quantizes:
        return []
    size = est["model_size"]
    parts = sorted(size.get("parts", {}).items(), key=lambda kv: -kv[1])[:2]
    stored = size.get("stored", {})
    heaviest = ", ".join(f"{name} {value / 2**20:.2f} MiB" + (f" ({stored[name].split(',')[0]})" if name in stored
                                                               else "") for name, value in parts)
    where = plan.recipe.where("export", "format") if plan.recipe.recipe.export.format != "hf" \
        else plan.recipe.where("compress", 0, "method")
    hint = ("an int8 or int4 table for the embedding (export embedding = \"int8\") shrinks it"
            if stored.get("embedding", "").startswith("float") else "see the plan's estimates (--format json)")
    return [Problem(f"the compressed model is estimated at {after / 2**20:.2f} MiB, larger than the source's "
                    f"{before / 2**20:.2f} MiB; the heaviest parts: {heaviest}", where, hint, severity="warning")]
