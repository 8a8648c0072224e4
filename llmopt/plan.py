"""Turn a recipe into a plan: ordered stages with cache keys, checks and estimates.

One planner for every command: ``llmopt run`` plans the whole pipeline (source,
compress, export, evals, gate, deploy), ``llmopt eval`` a scope of it (the source, or
another baseline, scored alone or against a candidate, and the gate). The plan reads
config.json (or a GGUF header), never weights, so it is cheap and runs before any GPU
time is spent. Every backend's ``check`` runs here, and the rules that span stages
live in ``cross_stage_rules``.
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
from llmopt.hub import hub_config, hub_offline, is_hub_id, local_folder
from llmopt.cache import Cache, stage_key
from llmopt.catalog.gpus import GPU, find_gpu
from llmopt.errors import Problem, UsageError
from llmopt.modelinfo import ModelInfo, from_folder, from_gguf, gguf_path, is_gguf
from llmopt.recipe.load import LoadedRecipe
from llmopt.runtimes.endpoint import served_identity
from llmopt.stages import gate_options


@dataclass
class Stage:
    name: str
    kind: str  # source | compress | export | eval | gate | deploy | bench | tune
    backend: str
    step: tuple  # where it is in the recipe: ("compress", 0)
    options: BaseModel
    inputs: dict[str, str] = field(default_factory=dict)  # role -> stage name
    material: dict = field(default_factory=dict)  # what its cache key hashes
    key: str = ""
    role: str = ""  # eval stages: baseline | candidate
    volatile: bool = False  # runs even when cached: scores through an endpoint, or reads such a stage
    pinned: str = ""  # the key of a finished cache entry this stage stands for (an artifact's model)
    unkeyed: tuple[str, ...] = ()  # options left out of the key (an endpoint's URL, when the server names its model)

    @property
    def impl(self) -> Any:
        """The backend that runs this stage: a recipe step's, or the stage kind's (``registry.stage_kind``)."""
        if self.kind in registry.KINDS:
            return registry.get(self.kind, self.backend)()
        return registry.stage_kind(self.kind, self.backend)

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
    output_dir: Path  # the artifact (scope "run") or the reports folder (scope "eval")
    scope: str = "run"  # run: every stage and the artifact; eval: sources, evals and the gate, then reports

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)

    def kind(self, kind: str) -> list[Stage]:
        return [s for s in self.stages if s.kind == kind]

    @property
    def final_model_stage(self) -> Stage:
        return [s for s in self.stages if s.kind in ("source", "compress", "export")][-1]

    def to_dict(self) -> dict:
        return {
            "recipe": {"name": self.recipe.recipe.name, "path": str(self.recipe.path), "sha256": self.recipe.digest},
            "scope": self.scope,
            "stages": [s.to_dict(self.cache) for s in self.stages],
            "checks": [p.to_dict() for p in self.problems],
            "estimates": self.estimates,
            "model": self.model.to_dict() if self.model else None,
            "target": self.gpu.to_dict() if self.gpu else {"device": "cpu"},
            "cache_dir": str(self.cache.root),
            "output_dir": str(self.output_dir),
        }


def resolve_cache(cache_dir: str | Path | None, loaded: LoadedRecipe) -> Cache:
    """The stage cache: ``--cache-dir``, else ``$LLMOPT_CACHE``, else the recipe's ``output.cache_dir``,
    else ``~/.cache/llmopt``. Every command resolves it here."""
    return Cache(cache_dir or os.environ.get("LLMOPT_CACHE") or loaded.recipe.output.cache_dir)


def build_plan(loaded: LoadedRecipe, cache_dir: str | Path | None = None, output_dir: str | Path | None = None, *,
               scope: str = "run", baseline: str | Path | None = None, candidate: str | None = None,
               endpoint: str | None = None, facts: bool = True, strict: bool = False) -> Plan:
    """The plan of ``llmopt run`` (scope "run") or of ``llmopt eval`` (scope "eval": the recipe's source, or
    ``baseline``, scored alone or against ``candidate``, a model or artifact folder or an endpoint URL;
    ``endpoint``: score the source through that server). The model's facts come from its config.json or
    GGUF header (for a hub id: from the hub, or from its local cache when HF_HUB_OFFLINE=1). ``facts=False``
    reads nothing of the model: the source check and every check that needs facts are skipped
    (`llmopt validate`). ``strict``: every warning is an error."""
    recipe = loaded.recipe
    cache = resolve_cache(cache_dir, loaded)
    gpu = find_gpu(recipe.target.gpu) if recipe.target.gpu else None  # the loader checked the name
    problems: list[Problem] = []
    info = model_facts(loaded, problems, facts) if baseline is None else folder_facts(Path(baseline))
    builder = _Builder(loaded, problems, info, gpu, cache, facts)
    section = recipe.model if baseline is None else recipe.model.model_copy(update={"source": str(Path(baseline).resolve())})
    pinned = pinned_stage(Path(baseline), cache, "source") if baseline is not None else None
    source = builder.add(pinned) if pinned is not None else builder.source("source", section)
    if scope == "run":
        target = builder.model_stages(source)
        builder.evals(source, target)
        builder.gate()
        deploy = builder.deploy(target)
        builder.bench(deploy, target)
        builder.tune(deploy, target)
    else:
        target = builder.candidate(candidate, source)
        builder.evals(source, target, endpoint=endpoint if candidate is None else None,
                      served=candidate if is_url(candidate) else None)
        builder.gate()
    stages = builder.stages
    problems += held_out_problems(loaded, stages)
    placed = None
    if scope == "run":
        problems += cross_stage_rules(loaded, stages, builder.info, gpu)
        placed = compress_placement(loaded, stages, info, builder.info, problems)
    if strict:
        for problem in problems:
            problem.severity = "error"
    assign_keys(stages)
    default = Path("artifacts") / recipe.name if scope == "run" else Path("reports") / recipe.name
    out = Path(output_dir or (recipe.output.dir if scope == "run" else None) or default)
    plan = Plan(loaded, stages, problems, builder.info, gpu, {}, cache, out, scope)
    plan.estimates = plan_estimates(plan, builder.info, builder.source_info) if scope == "run" else {}
    if placed is not None:
        plan.estimates["compress_placement"] = placed
    return plan


def is_url(text: str | None) -> bool:
    return bool(text) and str(text).startswith(("http://", "https://"))


class _Builder:
    """Appends the stages of a plan in order, running each backend's ``check`` as it goes."""

    def __init__(self, loaded: LoadedRecipe, problems: list[Problem], info: ModelInfo | None, gpu: GPU | None,
                 cache: Cache, facts: bool = True):
        self.loaded, self.problems, self.info, self.gpu, self.cache = loaded, problems, info, gpu, cache
        self.source_info = info  # self.info follows the compress steps (pruning); this stays the source's
        self.facts = facts  # False: nothing of the model is read, so the source check is skipped
        self.stages: list[Stage] = []
        self.upstream: list[str] = []  # the compress methods so far
        self.identities: dict[str, dict | None] = {}  # endpoint URL -> what its server says it serves

    def ctx(self, step: tuple, **kw) -> PlanContext:
        return PlanContext(recipe=self.loaded, step=step, model=self.info, gpu=self.gpu, upstream=list(self.upstream),
                           source=self.source_info, **kw)

    def add(self, stage: Stage) -> Stage:
        self.stages.append(stage)
        return stage

    def source(self, name: str, section) -> Stage:
        stage = Stage(name, "source", "gguf" if is_gguf(section.source) else "hf", ("model",), section)
        if self.facts:
            self.problems += stage.impl.check(section, self.ctx(("model",)))
        stage.material = {"source": stage.impl.fingerprint(section, self.loaded.path.parent)}
        return self.add(stage)

    def model_stages(self, source: Stage) -> Stage:
        """The compress steps and the export, in recipe order; returns the last model stage."""
        recipe, loaded, model_stage = self.loaded.recipe, self.loaded, source
        for index, step in enumerate(recipe.compress):
            options = loaded.options_for("compress", index)
            stage = Stage(f"compress.{index}.{step.method}", "compress", step.method, ("compress", index), options,
                          {"model": model_stage.name})
            impl = stage.impl
            if impl.teacher:  # distillation: the source model teaches the student
                stage.inputs["teacher"] = source.name
            data = getattr(options, "data", None)
            if isinstance(data, str):  # a step's own training text, hashed like calibration data
                stage.material["data_sha256"] = datasets.digest(data, loaded.path.parent)
            self.problems += impl.check(options, self.ctx(("compress", index)))
            if impl.calibrates:
                stage.material["calibration"] = recipe.calibration.model_dump(mode="json")
                stage.material["calibration_sha256"] = datasets.digest(recipe.calibration.data, loaded.path.parent)
            if self.info is not None:
                self.info = impl.transform_info(options, self.info)
            self.upstream.append(step.method)
            model_stage = self.add(stage)
        if recipe.export.format != "hf":
            options = loaded.options_for("export", None)
            stage = Stage(f"export.{recipe.export.format}", "export", recipe.export.format, ("export",), options,
                          {"model": model_stage.name})
            self.problems += stage.impl.check(options, self.ctx(("export",)))
            model_stage = self.add(stage)
        return model_stage

    def candidate(self, candidate: str | None, source: Stage) -> Stage | None:
        """What ``llmopt eval --candidate`` scores: a finished artifact's model stage from the cache, a
        model or artifact folder read in place, or (an endpoint URL) the source's tokenizer."""
        if candidate is None:
            return None
        if is_url(candidate):
            return source
        pinned = pinned_stage(Path(candidate), self.cache)
        if pinned is not None:
            return self.add(pinned)
        folder = model_folder(Path(candidate))
        return self.source("candidate", self.loaded.recipe.model.model_copy(update={"source": str(folder)}))

    def evals(self, source: Stage, target: Stage | None, endpoint: str | None = None, served: str | None = None):
        """Each [[eval]] on the baseline and the candidate (``target``), or on the source alone."""
        loaded = self.loaded
        for index, item in enumerate(loaded.recipe.eval):
            options = loaded.options_for("eval", index)
            spec = getattr(options, "data", None)
            digest = datasets.digest(spec, loaded.path.parent) if isinstance(spec, str) else None
            if target is None:
                roles = [(f"eval.{item.name}", "", source, endpoint)]
            else:
                roles = [(f"eval.{item.name}.baseline", "baseline", source, None),
                         (f"eval.{item.name}.candidate", "candidate", target, served)]
            checked = set()  # each variant of the options is checked once, whatever the roles
            for name, role, model_stage, url in roles:
                opts = options if url is None else served_options(options, url, item)
                if url not in checked:
                    self.problems += registry.get("eval", item.kind)().check(opts, self.ctx(("eval", index)))
                    checked.add(url)
                stage = Stage(name, "eval", item.kind, ("eval", index), opts, {"model": model_stage.name},
                              {"data_sha256": digest}, role=role)
                address = url or (getattr(opts, "endpoint", None) if getattr(opts, "runtime", "") == "endpoint" else None)
                if address:
                    self.served(stage, address, getattr(opts, "endpoint_model", None))
                self.add(stage)

    def served(self, stage: Stage, url: str, served_model: str | None) -> None:
        """An eval through an endpoint runs every time, unless the server names what it serves (``llmopt
        serve`` does: model digest, runtime, library versions): then that, not the URL, is in the key."""
        if url not in self.identities:
            self.identities[url] = served_identity(url, served_model) if self.facts else None
        found = self.identities[url]
        if found is None:
            stage.volatile = True
        else:
            stage.material["served"] = found
            stage.unkeyed = ("endpoint",)

    def gate(self) -> None:
        """One gate stage over every eval's baseline and candidate, when there is a candidate."""
        evals = [s for s in self.stages if s.kind == "eval" and s.role]
        if not evals:
            return
        inputs = {f"{s.name.split('.', 1)[1]}": s.name for s in evals}  # "<eval>.<role>" -> stage
        self.add(Stage("gate", "gate", "paired", ("eval",), gate_options(self.loaded), inputs,
                       volatile=any(s.volatile for s in evals)))

    def deploy(self, model_stage: Stage) -> Stage | None:
        """The serve backend's launch configs for the final model; its plan-time checks and what it accepts."""
        serve = self.loaded.recipe.serve
        if serve is None:
            return None
        options = self.loaded.options_for("serve", None)
        self.problems += registry.get("serve", serve.backend)().check(options, self.ctx(("serve",)))
        recipe = self.loaded.recipe
        facts = {"name": recipe.name, "model": recipe.model.model_dump(mode="json"),
                 "serve": serve.model_dump(mode="json"), "target": recipe.target.model_dump(mode="json")}
        return self.add(Stage(f"deploy.{serve.backend}", "deploy", serve.backend, ("serve",), options,
                              {"model": model_stage.name}, {"recipe": facts}))

    def bench(self, deploy: Stage | None, model_stage: Stage) -> None:
        """With [bench] enabled: the artifact's server started from the deploy stage's launch config and
        measured (``llmopt.bench.stage``); no [serve] section, or an engine not installed here, is an error."""
        if not self.loaded.recipe.bench.enabled:
            return
        from llmopt.bench.stage import bench_options, plan_problems

        found = plan_problems(self.loaded)
        self.problems += found
        if deploy is None or found:
            return
        self.add(Stage("bench", "bench", deploy.backend, ("bench",), bench_options(self.loaded.recipe),
                       {"model": model_stage.name, "deploy": deploy.name}))

    def tune(self, deploy: Stage | None, model_stage: Stage) -> None:
        """With [tune] enabled: the launch parameters searched against the live engine (``llmopt.tune.stage``),
        after the bench stage; keyed on whether the engine can start here, since without it the prediction stays."""
        if not self.loaded.recipe.tune.enabled:
            return
        from llmopt.tune.stage import engine_available, plan_problems, tune_options

        found = plan_problems(self.loaded)
        self.problems += found
        if deploy is None or any(p.severity == "error" for p in found):
            return
        options = tune_options(self.loaded.recipe)
        self.add(Stage("tune", "tune", deploy.backend, ("tune",), options,
                       {"model": model_stage.name, "deploy": deploy.name},
                       {"engine_available": engine_available(options.engine)}))


def served_options(options, url: str, item):
    """The eval's options scoring through the endpoint at ``url``."""
    if "endpoint" not in type(options).model_fields:
        raise UsageError(f"eval {item.name!r} ({item.kind}) cannot score a model through an endpoint",
                         fix="drop --endpoint, or evaluate the model folder instead")
    return options.model_copy(update={"runtime": "endpoint", "endpoint": url})


def model_folder(path: Path) -> Path:
    """The model folder of an artifact folder (its ``model/``), or the folder itself."""
    path = path.expanduser().resolve()
    if (path / "manifest.json").is_file() and (path / "model").is_dir():
        return path / "model"
    return path


class Pinned(BaseModel):
    artifact: str


def pinned_stage(path: Path, cache: Cache, name: str = "candidate") -> Stage | None:
    """The final model stage of the artifact at ``path`` (the artifact folder or its ``model/``) as a cache
    entry, when the cache holds it whole and the artifact's model files still match its manifest; None
    otherwise (the folder is then read in place). Its evals then have the keys of the run that made it."""
    from llmopt.verify import verify_artifact

    path = path.expanduser().resolve()
    if path.name == "model" and not (path / "manifest.json").is_file():
        path = path.parent
    if not (path / "manifest.json").is_file():
        return None
    try:
        manifest = json.loads((path / "manifest.json").read_text())
        stages = [s for s in manifest["stages"] if (s.get("outputs") or {}).get("format")]
        last = stages[-1]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    if not cache.has(last["key"]):
        return None
    report = verify_artifact(path)
    if any(p.startswith("model/") for p in report["changed"] + report["missing"] + report["extra"]):
        return None
    return Stage(name, "pinned", last.get("backend", ""), ("model",), Pinned(artifact=str(path)), pinned=last["key"])


def assign_keys(stages: list[Stage]) -> None:
    keys: dict[str, str] = {}
    for stage in stages:
        if stage.pinned:
            stage.key = keys[stage.name] = stage.pinned
            continue
        impl = stage.impl
        # options a backend added later, left out of the key at the value that behaves as before they existed
        neutral = {k for k, v in impl.keyless_defaults.items() if getattr(stage.options, k) == v}
        material = {
            "kind": stage.kind,
            "backend": stage.backend,
            "backend_version": impl.version,
            "options": stage.options.model_dump(mode="json", exclude=set(stage.unkeyed) | neutral),
            "inputs": {role: keys[name] for role, name in stage.inputs.items()},
            "versions": versions(impl.requires),
            "llmopt": llmopt.STAGE_FORMAT,
            **stage.material,
        }
        stage.material = material
        stage.key = keys[stage.name] = stage_key(material)


def folder_facts(path: Path) -> ModelInfo | None:
    """Config facts of a model folder or GGUF file given on the command line, or None."""
    try:
        if is_gguf(str(path)):
            return from_gguf(path) if path.is_file() else None
        return from_folder(path) if (path / "config.json").is_file() else None
    except Exception:  # facts only sharpen checks; the stages report real problems
        return None


def model_facts(loaded: LoadedRecipe, problems: list[Problem], facts: bool = True) -> ModelInfo | None:
    """Config facts of the source model, or None with a warning that says why and names the checks that
    then do not run (none without ``facts``: `validate` lists them itself)."""
    if not facts:
        return None
    source = loaded.recipe.model.source
    base = loaded.path.parent
    try:
        if is_gguf(source):
            path = gguf_path(source, base)
            if path.is_file():
                return from_gguf(path)
            why = f"{path} not found"
        elif is_hub_id(source):
            return _hub_facts(loaded, problems, offline=hub_offline())
        else:
            folder = local_folder(source, base)
            if (folder / "config.json").is_file():
                return from_folder(folder)
            why = f"{folder / 'config.json'} not found"
    except Exception as exc:  # a malformed config or header, a missing extra: checks that need facts are skipped
        why = f"could not read them ({exc})"
    problems.append(facts_unknown(loaded, why))
    return None


def _hub_facts(loaded: LoadedRecipe, problems: list[Problem], offline: bool) -> ModelInfo | None:
    """Facts from a hub model's config.json; an unreachable hub or a missing model is an error."""
    model = loaded.recipe.model
    try:
        path = hub_config(model.source, model.revision, offline)
    except UsageError as exc:
        problems.append(Problem(exc.what, loaded.where("model", "source"), exc.fix))
        return None
    if path is None:
        problems.append(facts_unknown(
            loaded, f"offline, and {model.source}'s config.json is not in the local hub cache",
            "plan once with the network (without --offline and HF_HUB_OFFLINE) to cache config.json"))
        return None
    return from_folder(path.parent)


def facts_unknown(loaded: LoadedRecipe, why: str, hint: str = "") -> Problem:
    """The warning of a plan without model facts: why, and which checks did not run."""
    skipped = "; ".join(unchecked_without_facts(loaded))
    return Problem(f"model facts unknown: {why}; these checks did not run: {skipped}",
                   loaded.where("model", "source"), hint, severity="warning")


def unchecked_without_facts(loaded: LoadedRecipe, source: bool = False) -> list[str]:
    """The plan-time checks of this recipe that need model facts (``source``: the source check too),
    as the backends' checks are written: what a plan without facts does not judge."""
    recipe = loaded.recipe
    out = ["the model source: that it exists, and its config.json, weight files or GGUF file"] if source else []
    out += [f"compress[{i}] ({step.method}): the model's architecture, existing quantization and layer shapes"
            for i, step in enumerate(recipe.compress)]
    if recipe.export.format != "hf":
        out.append(f"export ({recipe.export.format}): block size and embeddings against the model's layers")
    out += [f"eval[{i}] ({item.kind}): the window against the model's context" for i, item in enumerate(recipe.eval)
            if hasattr(loaded.options.get(("eval", i)), "window")]
    if recipe.serve is not None and recipe.serve.backend != "ort" and recipe.target.gpu:
        out.append(f"serve ({recipe.serve.backend}): max_model_len against the model's context, and the memory model")
    out.append("estimates of the weights, the artifact, calibration memory and the KV cache")
    return out


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
    serve = loaded.recipe.serve
    if serve is not None:
        rules = registry.get("serve", serve.backend)().accepts(loaded.options_for("serve", None))
        for stage in produced:  # the artifact carries every step's format (2:4 zeros under int4 weights)
            problems += _handed_over(loaded, stage, rules, f"served by {serve.backend}", gpu)
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


def _handed_over(loaded: LoadedRecipe, stage: Stage, rules: dict, to: str, gpu: GPU | None) -> list[Problem]:
    """Problems of handing the format ``stage`` declares it produces to a consumer that declares ``rules``."""
    from llmopt.deploy import compat

    fmt = stage.impl.produces(stage.options)
    where = loaded.where(*stage.step, "format" if stage.kind == "export" else "method")
    return compat.judge(rules, fmt, f"{stage.backend} output ({fmt.label}) {to}", where, gpu)


def compress_placement(loaded: LoadedRecipe, stages: list[Stage], source: ModelInfo | None, final: ModelInfo | None,
                       problems: list[Problem]) -> dict | None:
    """How the compress stage holds the model on the compute machine (``llmopt.placement``); its refusal
    when nothing fits, and the MoE calibration warning, join ``problems``."""
    from llmopt import placement

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
    stage writes it, and the KV cache from the serving memory model (``memory``) when a GPU is named. ``info``:
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
            planned = inputs.estimated_memory(plan.recipe, info, plan.gpu, after["weight_bytes"]).to_dict()
            out["kv_cache"] = {k: v for k, v in planned.items() if k != "tried"} | {"fits": True}
        except UsageError as exc:
            out["kv_cache"] = {"fits": False, "reason": exc.what, "fix": exc.fix}
    return out

