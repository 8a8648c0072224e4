"""Turn a recipe into a plan: ordered stages with cache keys, checks and estimates.

The plan reads config.json (or a GGUF header), never weights, so it is cheap and
runs before any GPU time is spent. Every backend's ``check`` runs here, and the
rules that span stages live in ``cross_stage_rules``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

import llmopt
from llmopt import data as datasets
from llmopt import estimates, registry
from llmopt.backends.base import PlanContext
from llmopt.libraries import versions
from llmopt.backends.source.gguf import gguf_path, is_gguf
from llmopt.backends.source.hf import is_hub_id, local_folder
from llmopt.cache import Cache, stage_key
from llmopt.catalog.gpus import GPU, find_gpu
from llmopt.errors import Problem
from llmopt.modelinfo import ModelInfo, from_folder, from_gguf
from llmopt.recipe.load import LoadedRecipe


@dataclass
class Stage:
    name: str
    kind: str  # source | compress | export | eval
    backend: str
    step: tuple  # where it is in the recipe: ("compress", 0)
    options: BaseModel
    inputs: dict[str, str] = field(default_factory=dict)  # role -> stage name
    material: dict = field(default_factory=dict)  # what its cache key hashes
    key: str = ""
    role: str = ""  # eval stages: baseline | candidate

    @property
    def impl(self) -> Any:
        return registry.get(self.kind, self.backend)()

    def to_dict(self, cache: Cache) -> dict:
        return {
            "name": self.name,
            "kind": self.kind,
            "backend": self.backend,
            "key": self.key,
            "inputs": self.inputs,
            "cached": cache.has(self.key),
            "options": self.options.model_dump(mode="json"),
        }


@dataclass
class Plan:
    recipe: LoadedRecipe
    stages: list[Stage]
    problems: list[Problem]
    model: ModelInfo | None
    gpu: GPU | None
    estimates: dict
    cache: Cache
    output_dir: Path

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)

    @property
    def final_model_stage(self) -> Stage:
        return [s for s in self.stages if s.kind in ("source", "compress", "export")][-1]

    def to_dict(self) -> dict:
        return {
            "recipe": {"name": self.recipe.recipe.name, "path": str(self.recipe.path), "sha256": self.recipe.digest},
            "stages": [s.to_dict(self.cache) for s in self.stages],
            "checks": [p.to_dict() for p in self.problems],
            "estimates": self.estimates,
            "model": self.model.to_dict() if self.model else None,
            "target": self.gpu.to_dict() if self.gpu else {"device": "cpu"},
            "cache_dir": str(self.cache.root),
            "output_dir": str(self.output_dir),
        }


def build_plan(loaded: LoadedRecipe, cache_dir: str | Path | None = None, output_dir: str | Path | None = None) -> Plan:
    recipe = loaded.recipe
    base = loaded.path.parent
    cache = Cache(cache_dir or os.environ.get("LLMOPT_CACHE") or recipe.output.cache_dir)
    gpu = find_gpu(recipe.target.gpu) if recipe.target.gpu else None
    problems: list[Problem] = []
    if recipe.target.gpu and gpu is None:
        from llmopt.catalog.gpus import get_gpu

        try:
            get_gpu(recipe.target.gpu)
        except Exception as exc:  # UsageError naming the catalogue
            problems.append(Problem(exc.what, loaded.where("target", "gpu"), exc.fix))
    info = model_facts(loaded, problems)
    stages: list[Stage] = []
    ctx = lambda step, **kw: PlanContext(recipe=loaded, step=step, model=info, gpu=gpu, **kw)  # noqa: E731

    source = Stage("source", "source", "gguf" if is_gguf(recipe.model.source) else "hf", ("model",), recipe.model)
    problems += source.impl.check(recipe.model, ctx(("model",)))
    source.material = {"source": source.impl.fingerprint(recipe.model, base)}
    stages.append(source)

    model_stage = source
    upstream: list[str] = []
    for index, step in enumerate(recipe.compress):
        options = loaded.options_for("compress", index)
        stage = Stage(f"compress.{index}.{step.method}", "compress", step.method, ("compress", index), options,
                      {"model": model_stage.name})
        impl = stage.impl
        problems += impl.check(options, ctx(("compress", index), upstream=list(upstream)))
        if getattr(impl, "calibrates", False):
            stage.material["calibration"] = recipe.calibration.model_dump(mode="json")
            stage.material["calibration_sha256"] = datasets.digest(recipe.calibration.data, base)
        if info is not None and hasattr(impl, "transform_info"):
            info = impl.transform_info(options, info)
        stages.append(stage)
        upstream.append(step.method)
        model_stage = stage

    if recipe.export.format != "hf":
        options = loaded.options_for("export", None)
        stage = Stage(f"export.{recipe.export.format}", "export", recipe.export.format, ("export",), options,
                      {"model": model_stage.name})
        problems += stage.impl.check(options, ctx(("export",), upstream=list(upstream)))
        stages.append(stage)
        model_stage = stage

    for index, item in enumerate(recipe.eval):
        options = loaded.options_for("eval", index)
        impl = registry.get("eval", item.kind)()
        problems += impl.check(options, ctx(("eval", index), upstream=list(upstream)))
        data_spec = getattr(options, "data", None)
        digest = datasets.digest(data_spec, base) if isinstance(data_spec, str) else None
        for role, target in (("baseline", source), ("candidate", model_stage)):
            stage = Stage(f"eval.{item.name}.{role}", "eval", item.kind, ("eval", index), options,
                          {"model": target.name}, {"data_sha256": digest}, role=role)
            stages.append(stage)

    if recipe.serve is not None:
        options = loaded.options_for("serve", None)
        problems += registry.get("serve", recipe.serve.backend)().check(options, ctx(("serve",), upstream=list(upstream)))

    problems += cross_stage_rules(loaded, stages, info, gpu)
    assign_keys(stages)
    out = Path(output_dir or recipe.output.dir or Path("artifacts") / recipe.name)
    plan = Plan(loaded, stages, problems, info, gpu, {}, cache, out)
    plan.estimates = plan_estimates(plan, info)
    return plan


def assign_keys(stages: list[Stage]) -> None:
    keys: dict[str, str] = {}
    for stage in stages:
        impl = stage.impl
        material = {
            "kind": stage.kind,
            "backend": stage.backend,
            "backend_version": getattr(impl, "version", 1),
            "options": stage.options.model_dump(mode="json"),
            "inputs": {role: keys[name] for role, name in stage.inputs.items()},
            "versions": versions(impl.requires),
            "llmopt": llmopt.STAGE_FORMAT,
            **stage.material,
        }
        stage.material = material
        stage.key = keys[stage.name] = stage_key(material)


def model_facts(loaded: LoadedRecipe, problems: list[Problem]) -> ModelInfo | None:
    """Config facts of the source model, or None (with a warning) when they cannot be read."""
    source = loaded.recipe.model.source
    base = loaded.path.parent
    try:
        if is_gguf(source):
            path = gguf_path(source, base)
            return from_gguf(path) if path.is_file() else None
        if is_hub_id(source):
            return _hub_facts(loaded)
        folder = local_folder(source, base)
        return from_folder(folder) if (folder / "config.json").is_file() else None
    except Exception as exc:  # a malformed config or header: checks that need facts are skipped
        problems.append(Problem(f"could not read model facts ({exc}); checks that need them are skipped",
                                loaded.where("model", "source"), severity="warning"))
        return None


def _hub_facts(loaded: LoadedRecipe) -> ModelInfo | None:
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        return None
    try:
        from huggingface_hub import hf_hub_download

        path = hf_hub_download(loaded.recipe.model.source, "config.json", revision=loaded.recipe.model.revision)
        return from_folder(Path(path).parent)
    except Exception:
        return None


def cross_stage_rules(loaded: LoadedRecipe, stages: list[Stage], info: ModelInfo | None, gpu: GPU | None) -> list[Problem]:
    """Rules that no single backend can judge alone."""
    problems: list[Problem] = []
    quantizers = [s for s in stages if s.kind == "compress" and getattr(s.impl, "quantizes", False)]
    for later in quantizers[1:]:
        problems.append(Problem(
            f"a second quantization step ({later.backend}) after {quantizers[0].backend}: quantized weights "
            "cannot be quantized again", loaded.where(*later.step, "method"),
            "keep one quantization step; prune steps may come before it"))
    for stage in stages:
        if stage.kind == "compress" and getattr(stage.impl, "prunes", False):
            earlier = [q for q in quantizers if stages.index(q) < stages.index(stage)]
            if earlier:
                problems.append(Problem(
                    f"{stage.backend} comes after {earlier[0].backend}: pruning needs unquantized weights",
                    loaded.where(*stage.step, "method"), "move the prune step before the quantization step"))
    recipe = loaded.recipe
    if recipe.serve is not None:
        serve = registry.get("serve", recipe.serve.backend)
        produced = [s for s in stages if s.kind in ("compress", "export")]
        accepts = getattr(serve, "accepts", None)
        if accepts is not None:
            problems += accepts(recipe, produced, gpu, loaded)
    return problems


def plan_estimates(plan: Plan, info: ModelInfo | None) -> dict:
    """Sizes from the size model (``estimates``): the source folder, the final model folder as its last
    stage writes it, and the KV cache from the serving memory model (``memory``) when a GPU is named."""
    if info is None:
        return {"note": "model facts unknown; no estimates"}
    from llmopt.deploy import inputs
    from llmopt.errors import UsageError

    recipe = plan.recipe.recipe
    pruned = any(hasattr(s.impl, "transform_info") for s in plan.stages if s.kind == "compress")
    source_info = (model_facts(plan.recipe, []) or info) if pruned else info
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
    if any(getattr(s.impl, "calibrates", False) for s in plan.stages):
        cal = recipe.calibration
        dtype = estimates.model_dtype(recipe, source_info)
        out["calibration_memory_bytes"] = estimates.calibration_bytes(source_info, dtype, cal.samples, cal.max_seq_len)
    if plan.gpu is not None:
        try:
            planned = inputs.estimated_memory(plan.recipe, info, plan.gpu, after["weight_bytes"]).to_dict()
            out["kv_cache"] = {k: v for k, v in planned.items() if k != "tried"} | {"fits": True}
        except UsageError as exc:
            out["kv_cache"] = {"fits": False, "reason": exc.what, "fix": exc.fix}
    return out


def plan_json(plan: Plan) -> str:
    return json.dumps(plan.to_dict(), indent=2, default=str)
