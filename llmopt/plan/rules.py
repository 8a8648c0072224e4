"""Rules that no single backend can judge alone: eval data held out from what a step trains or
calibrates on, each step's format handed to the export and the engine, one quantization step after any
pruning, and the GPUs of one node."""

from __future__ import annotations

from llmopt import data as datasets
from llmopt import registry
from llmopt.catalog.gpus import GPU
from llmopt.errors import Problem
from llmopt.model.modelinfo import ModelInfo
from llmopt.plan.types import Stage
from llmopt.recipe.load import LoadedRecipe


def held_out_problems(loaded: LoadedRecipe, stages: list[Stage]) -> list[Problem]:
    """Each eval's data against the calibration data, when a step calibrates on it, and against a step's own
    training text (distill's ``data``): an error when the eval set overlaps that text (its scores would not be
    held out), a warning when both come from one source. Hub data is not read at plan time."""
    recipe = loaded.recipe
    if not any(s.impl.calibrates for s in stages if s.kind == "compress"):
        return []
    problems = []
    trained = [(recipe.calibration.data, recipe.calibration.text_field)]  # and a step's own training text
    trained += [(s.options.data, s.options.text_field) for s in stages
                if s.kind == "compress" and isinstance(getattr(s.options, "data", None), str)
                and not datasets.check_spec(s.options.data, loaded.path.parent)]
    for index, item in enumerate(recipe.eval):
        for spec, text_field in dict.fromkeys(trained):  # each text once
            problems += _held_out(loaded, index, item, spec, text_field)
    return problems


def _held_out(loaded: LoadedRecipe, index: int, item, training: str, training_field: str) -> list[Problem]:
    """The problem of eval ``index`` against one training text (calibration or a step's own data), if any."""
    from llmopt.data import overlap

    options = loaded.options_for("eval", index)
    spec = getattr(options, "data", None)
    if not isinstance(spec, str) or datasets.check_spec(spec, loaded.path.parent):
        return []  # no data of its own (lm_eval tasks), or a problem its own check reports
    found = overlap.check(spec, training, loaded.path.parent, eval_field=getattr(options, "text_field", None),
                          calibration_field=training_field)
    if found is None or found.verdict == "clean":
        return []
    if found.contaminated:
        return [Problem(f"eval {item.name!r} is not held out: {found.summary()}", loaded.where("eval", index, "data"),
                        "score on data the calibration never saw (`llmopt ls data` lists the built-in sets "
                        "and their domains), or calibrate on other data")]
    return [Problem(f"eval {item.name!r} comes from the calibration data's source ({found.same_source}):"
                    " its scores are in-domain for the compression and may flatter it",
                    loaded.where("eval", index, "data"), "add an eval on another domain", severity="warning")]


def cross_stage_rules(loaded: LoadedRecipe, stages: list[Stage], info: ModelInfo | None, gpu: GPU | None) -> list[Problem]:
    """Rules that no single backend can judge alone."""
    problems: list[Problem] = node_problems(loaded, gpu)
    quantizers = [s for s in stages if s.kind == "compress" and s.impl.quantizes]
    for later in quantizers[1:]:
        problems.append(Problem(
            f"a second quantization step ({later.backend}) after {quantizers[0].backend}: quantized weights "
            "cannot be quantized again", loaded.where(*later.step, "method"),
            "keep one quantization step; prune steps may come before it"))
    for stage in stages:
        if stage.kind == "compress" and stage.impl.prunes:
            earlier = [q for q in quantizers if stages.index(q) < stages.index(stage)]
            if earlier:
                problems.append(Problem(
                    f"{stage.backend} comes after {earlier[0].backend}: pruning needs unquantized weights",
                    loaded.where(*stage.step, "method"), "move the prune step before the quantization step"))
    # what each stage declares it produces, judged by what its consumers declare they accept
    produced = [s for s in stages if s.kind in ("compress", "export")]
    export = next((s for s in produced if s.kind == "export"), None)
    rules = export.impl.accepts(export.options) if export is not None else None
    if rules is not None:  # an export that converts only some formats
        for stage in produced[:produced.index(export)]:
            problems += _handed_over(loaded, stage, rules, f"exported to {export.backend}", gpu)
    for engine in loaded.recipe.serve.engines if loaded.recipe.serve is not None else []:  # each engine listed
        options = loaded.for_engine(engine).options_for("serve", None)
        rules = registry.get("serve", engine)().accepts(options)
        # the layers' shapes as served: the model after the compress steps (pruning), at the recipe's tensor
        # parallel size (1 where the planner chooses it)
        tp = getattr(options, "tensor_parallel_size", None) or 1
        for stage in produced:  # the artifact carries every step's format (2:4 zeros under int4 weights)
            problems += _handed_over(loaded, stage, rules, f"served by {engine}", gpu, info, tp)
    return problems


def node_problems(loaded: LoadedRecipe, gpu: GPU | None) -> list[Problem]:
    """``[target] count`` is the GPUs of one node: more than the catalogue's node holds is an error whose
    fix spreads them over ``nodes``."""
    target = loaded.recipe.target
    if gpu is None or target.count <= gpu.gpus_per_node:
        return []
    per_node = gpu.gpus_per_node
    nodes = -(-target.count // per_node) * target.nodes
    return [Problem(f"[target] count = {target.count} GPUs of one node, but a {gpu.name} node holds at most "
                    f"{per_node}", loaded.where("target", "count"),
                    f"set count = {per_node} and nodes = {nodes}: tensor parallel stays within a node and "
                    "pipeline parallel spans the nodes")]


def _handed_over(loaded: LoadedRecipe, stage: Stage, rules: dict, to: str, gpu: GPU | None,
                 info: ModelInfo | None = None, tp: int = 1) -> list[Problem]:
    """Problems of handing the format ``stage`` declares it produces to a consumer that declares ``rules``
    (``info``: the model served, whose layer shapes a rule may check at tensor parallel ``tp``)."""
    from llmopt.deploy import compat

    fmt = stage.impl.produces(stage.options)
    where = loaded.where(*stage.step, "format" if stage.kind == "export" else "method")
    return compat.judge(rules, fmt, f"{stage.backend} output ({fmt.label}) {to}", where, gpu, info, tp)


def family_problems(loaded: LoadedRecipe, stages: list[Stage], info: ModelInfo | None) -> list[Problem]:
    """Each path the plan takes, judged by the model-family table (``llmopt.model.families``) for the source's
    family: an error where the family cannot take it, naming why and what works instead; a warning where llmopt
    has no test of it. For a family the table does not name, a path that rewrites the weights (a GGUF conversion,
    a compress step, a draft, an export) is an error unless ``model.allow_untested``; reading the folder, scoring
    it and writing an engine's launch config are a warning (the engine's own model registry decides)."""
    from llmopt.model import families

    if info is None or not info.model_type:
        return []
    taken = _paths_taken(loaded, stages)
    if info.model_type not in families.families():
        return _unknown_family(loaded, info.model_type, taken)
    problems = []
    for path, where in taken:
        verdict = families.verdict(info.model_type, path)
        what = families.paths().get(path, path)
        if verdict.status == "refused":
            problems.append(Problem(f"{what} is not available for {verdict.label}: {verdict.why}", where,
                                    f"use {verdict.instead}" if verdict.instead else ""))
        elif verdict.status == "untested":
            problems.append(Problem(f"llmopt has no test of {what} for {verdict.label} (docs/models.md); it may "
                                    "fail after the stages before it have run", where, severity="warning"))
    return problems


REWRITES = ("source.gguf", "compress.", "draft", "export.")  # paths whose code turns the weights into others


def _unknown_family(loaded: LoadedRecipe, model_type: str, taken: list[tuple[str, str]]) -> list[Problem]:
    """The problem of a family the table does not name: one, at the first path that rewrites the weights (an error
    unless model.allow_untested) or else at the source (a warning)."""
    from llmopt.model import families

    rewrites = [(path, where) for path, where in taken if path.startswith(REWRITES)]
    allowed = loaded.recipe.model.allow_untested
    known = ", ".join(families.families())
    if not rewrites:
        return [Problem(f"llmopt has no test of model family {model_type!r} (docs/models.md): its scores and launch "
                        "configs are written as for the families it has tested", loaded.where("model", "source"),
                        f"the families it has tested are {known}", severity="warning")]
    path, where = rewrites[0]
    what = families.paths().get(path, path)
    return [Problem(f"llmopt has no test of model family {model_type!r} for {what}: the stage may fail after hours "
                    "of work, or write a model it converted wrongly", where,
                    f"the families it has tested are {known} (docs/models.md); to run anyway, set "
                    "model.allow_untested = true", severity="warning" if allowed else "error")]


def _paths_taken(loaded: LoadedRecipe, stages: list[Stage]) -> list[tuple[str, str]]:
    """(path id of the family table, where in the recipe) for each path the plan takes, each path once."""
    recipe = loaded.recipe
    taken: dict[str, str] = {}
    for stage in stages:
        if stage.kind == "source" and stage.name == "source":
            taken.setdefault(f"source.{stage.backend}", loaded.where("model", "source"))
        elif stage.kind == "compress":
            path = "draft" if stage.step[0] == "draft" else f"compress.{stage.backend}"
            taken.setdefault(path, loaded.where(*stage.step, "method"))
        elif stage.kind == "export":
            taken.setdefault(f"export.{stage.backend}", loaded.where("export", "format"))
        elif stage.kind == "eval":
            taken.setdefault(f"eval.{stage.backend}", loaded.where(*stage.step, "kind"))
            if stage.volatile or "served" in stage.material:
                taken.setdefault("eval.served", loaded.where(*stage.step, "kind"))
    if recipe.compress and recipe.export.format == "hf" and any(s.kind == "compress" for s in stages):
        taken.setdefault("export.hf", loaded.where("export", "format"))
    for engine in recipe.serve.engines if recipe.serve is not None else []:
        taken.setdefault(f"deploy.{engine}", loaded.where("serve", "backend"))
    return list(taken.items())
