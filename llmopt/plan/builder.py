"""``build_plan``: the stages of a scope in order, each backend's ``check`` as they are added, the
cross-stage rules, the cache keys and the estimates."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import llmopt
from llmopt import data as datasets
from llmopt import registry
from llmopt.backends.base import PlanContext
from llmopt.store.cache import Cache, checksums, sha256_file, stage_key
from llmopt.catalog.gpus import GPU, find_gpu
from llmopt.errors import Problem, UsageError
from llmopt.libraries import versions
from llmopt.model.modelinfo import ModelInfo, is_gguf
from llmopt.plan.estimates import compress_placement, growth_problems, plan_estimates
from llmopt.plan.facts import folder_facts, model_facts
from llmopt.plan.rules import cross_stage_rules, family_problems, held_out_problems
from llmopt.plan.types import InPlace, Pinned, Plan, Stage
from llmopt.recipe.load import LoadedRecipe
from llmopt.runtimes.endpoint import served_identity
from llmopt.plan.stages import gate_options


def resolve_cache(cache_dir: str | Path | None, loaded: LoadedRecipe) -> Cache:
    """The stage cache: ``--cache-dir``, else ``$LLMOPT_CACHE``, else the recipe's ``output.cache_dir``,
    else ``~/.cache/llmopt``. Every command resolves it here."""
    return Cache(cache_dir or os.environ.get("LLMOPT_CACHE") or loaded.recipe.output.cache_dir)


def build_plan(loaded: LoadedRecipe, cache_dir: str | Path | None = None, output_dir: str | Path | None = None, *,
               scope: str = "run", baseline: str | Path | None = None, candidate: str | None = None,
               endpoint: str | None = None, facts: bool = True, strict: bool = False,
               only: list[str] | None = None) -> Plan:
    """The plan of ``llmopt run`` (scope "run") or of ``llmopt eval`` (scope "eval": the recipe's source, or
    ``baseline``, scored alone or against ``candidate``, a model or artifact folder or an endpoint URL;
    ``endpoint``: score the source through that server). The model's facts come from its config.json or
    GGUF header (for a hub id: from the hub, or from its local cache when HF_HUB_OFFLINE=1). ``facts=False``
    reads nothing of the model: the source check and every check that needs facts are skipped
    (`llmopt validate`). ``strict``: every warning is an error. ``only``: the names of the evals to plan
    (`llmopt eval --only`); the others, and their gates, are left out."""
    recipe = loaded.recipe
    names = [item.name for item in recipe.eval]
    unknown = [name for name in only or [] if name not in names]
    if unknown:
        raise UsageError(f"--only {', '.join(unknown)}: {loaded.path} has no eval of that name",
                         fix=f"name one or more of: {', '.join(names)}")
    cache = resolve_cache(cache_dir, loaded)
    gpu = find_gpu(recipe.target.gpu) if recipe.target.gpu else None  # the loader checked the name
    problems: list[Problem] = []
    info = model_facts(loaded, problems, facts) if baseline is None else folder_facts(Path(baseline))
    builder = _Builder(loaded, problems, info, gpu, cache, facts, only)
    section = recipe.model if baseline is None else recipe.model.model_copy(update={"source": str(Path(baseline).resolve())})
    pinned = pinned_stage(Path(baseline), cache, "source") if baseline is not None else None
    source = builder.add(pinned) if pinned is not None else builder.source(
        "source", section, None if baseline is None else f"--model {baseline}")
    if scope == "run":
        target = builder.model_stages(source)
        draft = builder.draft(source)
        builder.evals(source, target)
        builder.gate()
        builder.serving(target, draft)
    else:
        target = builder.candidate(candidate, source)
        builder.evals(source, target, endpoint=endpoint if candidate is None else None,
                      served=candidate if is_url(candidate) else None)
        builder.gate()
    stages = builder.stages
    problems += held_out_problems(loaded, stages)
    problems += family_problems(loaded, stages, info)
    placed = None
    if scope == "run":
        problems += cross_stage_rules(loaded, stages, builder.info, gpu)
        placed = compress_placement(loaded, stages, info, builder.info, problems)
    default = Path("artifacts") / recipe.name if scope == "run" else Path("reports") / recipe.name
    out = Path(output_dir or (recipe.output.dir if scope == "run" else None) or default)
    if scope == "run" and foreign(out, "manifest.json"):
        where = (f"-o {output_dir} (command line)" if output_dir else loaded.where("output", "dir") if recipe.output.dir
                 else "the default output")
        problems.append(Problem(f"{out} exists and is not an earlier artifact (no manifest.json): the run "
                                "replaces its output folder whole, and would delete what is there", where,
                                "pass -o a new or empty folder, or an earlier artifact's"))
    if strict:
        for problem in problems:
            problem.severity = "error"
    assign_keys(stages)
    plan = Plan(loaded, stages, problems, builder.info, gpu, {}, cache, out, scope)
    plan.estimates = plan_estimates(plan, builder.info, builder.source_info) if scope == "run" else {}
    for problem in growth_problems(plan) if scope == "run" else []:
        plan.problems.append(dataclasses.replace(problem, severity="error") if strict else problem)
    if placed is not None:
        plan.estimates["compress_placement"] = placed
    if builder.draft_facts is not None:
        plan.estimates["draft"] = builder.draft_facts
    return plan


def build_artifact_plan(folder: str | Path, overrides: list[str] | tuple[str, ...] = (),
                        cache_dir: str | Path | None = None, output_dir: str | Path | None = None, *,
                        scope: str = "tune", bench: dict | None = None) -> Plan:
    """The plan of ``llmopt tune ARTIFACT`` (scope "tune") or ``llmopt bench ARTIFACT`` (scope "bench"): the
    artifact's model and launch config as stages read where they are, and the tune or bench stage over them,
    under the recipe the artifact's manifest records with ``overrides`` (``-s`` specs). The runner runs it as
    any plan: the tune stage is cached under its key, and a killed search resumes from its trial store; the
    bench stage (``bench``: the command's workload, slo and options laid over the recipe's) is volatile, so
    it measures afresh each time."""
    import time

    from llmopt.bench.engine import served_engine
    from llmopt.recipe.load import resolved_recipe

    folder = Path(folder).expanduser().resolve()
    manifest = artifact_manifest(folder)
    loaded = resolved_recipe((manifest.get("recipe") or {}).get("resolved") or {}, folder / "manifest.json",
                             [*(["tune.enabled=true"] if scope == "tune" else []), *overrides])
    if loaded.recipe.serve is not None:  # of several engines, the one the artifact is served with
        loaded = loaded.for_engine(served_engine(manifest) or loaded.recipe.serve.engines[0])
    serve = loaded.recipe.serve
    deploy_dir = folder / "deploy" / serve.backend if serve is not None else None
    launchable = deploy_dir is not None and (deploy_dir / "launch.sh").is_file()
    if scope == "tune" and serve is None:
        raise UsageError(f"{folder}'s recipe has no [serve] section: there is no launch config to tune",
                         fix="tune an artifact built from a recipe with [serve]")
    if scope == "tune" and not launchable:
        raise UsageError(f"{folder} has no deploy/{serve.backend}/launch.sh", where=str(folder),
                         fix="tune an artifact whose recipe has a [serve] section")
    out = Path(output_dir or Path(scope) / f"{folder.name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")
    replaceable(out, "tuning.json" if scope == "tune" else "bench.json")
    cache = resolve_cache(cache_dir, loaded)
    gpu = find_gpu(loaded.recipe.target.gpu) if loaded.recipe.target.gpu else None
    problems: list[Problem] = []
    info = folder_facts(folder / "model")
    builder = _Builder(loaded, problems, info, gpu, cache)
    model = builder.add(in_place_model(folder, manifest))
    deploy = builder.add(in_place_deploy(deploy_dir, serve.backend)) if launchable else None
    draft = builder.add(in_place_draft(folder, manifest)) if (folder / "draft" / "config.json").is_file() else None
    if scope == "tune":
        builder.tune([deploy] if deploy is not None else [], model, draft)
    else:
        from llmopt.bench.stage import artifact_bench_options, dataset_facts

        options = artifact_bench_options(loaded.recipe, bench or {})
        problems += dataset_facts(loaded, options.workload)[0]
        builder.add(Stage("bench", "bench", options.engine, ("bench",), options, served_inputs(model, deploy, draft),
                          volatile=True))
    assign_keys(builder.stages)
    return Plan(loaded, builder.stages, problems, info, gpu, {}, cache, out, scope)


def build_gate_plan(report_path: str | Path, report: dict, specs: list, output_dir: str | Path | None = None,
                    cache_dir: str | Path | None = None) -> Plan:
    """The plan of ``llmopt gate REPORT`` (scope "gate"): each gate's saved baseline and candidate scores as
    stages read in place (the report's folder; keyed on the files' contents), and the gate stage over them
    with ``specs`` (``stages.GateSpec``: the report's thresholds with the command's settings laid over).
    Nothing is scored. The plan's recipe is the report's record of it: its name, the report's path."""
    from llmopt.plan.stages import GateOptions
    from llmopt.recipe.load import validated

    report_path = Path(report_path)
    folder = report_path.parent.resolve()
    loaded = validated({"schema_version": 1, "name": report["recipe"], "model": {"source": str(folder)}}, report_path)
    records = {g["name"]: g for g in report.get("gates", [])}
    stages: list[Stage] = []
    inputs: dict[str, str] = {}
    for spec in specs:
        record = records[spec.name]
        for role in ("baseline", "candidate"):
            name = record["scores"][role]
            outputs = {"metric": record["metric"], "scores": name, "higher_is_better": record.get("higher_is_better", True)}
            stages.append(Stage(f"eval.{spec.name}.{role}", "in_place", "scores", ("eval",),
                                InPlace(folder=str(folder), outputs=outputs),
                                pinned=stage_key({"in_place": "scores", **outputs, "sha256": sha256_file(folder / name)})))
            inputs[f"{spec.name}.{role}"] = stages[-1].name
    stages.append(Stage("gate", "gate", "paired", ("eval",), GateOptions(gates=list(specs)), inputs))
    assign_keys(stages)
    out = Path(output_dir) if output_dir is not None else None
    return Plan(loaded, stages, [], None, None, {}, resolve_cache(cache_dir, loaded), out, "gate")


def said_by(problems: list[Problem], flag: str | None) -> list[Problem]:
    """Problems of a model or an endpoint that a command-line option (``flag``, with its value) named: they are
    that option's, not the recipe's model.source or eval line."""
    for problem in problems if flag else []:
        problem.where = f"{flag} (command line)"
    return problems


def foreign(out: Path, marker: str) -> bool:
    """``out`` is a file, or a folder of files that are not an earlier run's results (``marker`` in it):
    results, which replace their output folder whole, would wipe them."""
    if not out.exists():
        return False
    return not out.is_dir() or (any(out.iterdir()) and not (out / marker).is_file())


def replaceable(out: Path, marker: str) -> None:
    """Refuse an output folder of other files than an earlier run's results (``foreign``), so that ``-o``
    cannot wipe it."""
    if foreign(out, marker):
        raise UsageError(f"{out} exists and holds other files than results ({marker}): they would be replaced",
                         where=str(out), fix="pass -o a new folder, or an earlier result's")


def is_artifact(target: str | Path) -> bool:
    """``target`` is a folder `llmopt run` wrote (manifest.json and model/), not a URL or a bare model folder."""
    if is_url(str(target)):
        return False
    folder = Path(target).expanduser()
    return (folder / "manifest.json").is_file() and (folder / "model").is_dir()


def artifact_manifest(folder: Path) -> dict:
    """An artifact folder's manifest.json, or a UsageError saying the folder is not an artifact."""
    if not is_artifact(folder):
        raise UsageError(f"{folder} is not an artifact (no manifest.json and model/)",
                         fix="pass the folder `llmopt run` wrote (artifacts/<name>)")
    try:
        return json.loads((folder / "manifest.json").read_text())
    except ValueError as exc:
        raise UsageError(f"{folder}/manifest.json is not JSON: {exc}", fix="run `llmopt run` again") from None


def in_place_model(folder: Path, manifest: dict) -> Stage:
    """The artifact's ``model/`` as a stage read in place: the outputs of the stage that made it (its format),
    keyed on the checksums the manifest records for its files."""
    made = [s for s in manifest.get("stages") or [] if (s.get("outputs") or {}).get("format")]
    outputs = dict((made[-1].get("outputs") or {}) if made else {}, model_dir=str(folder / "model"))
    files = {k: v for k, v in (manifest.get("files") or {}).items() if k.startswith("model/")}
    options = InPlace(folder=str(folder / "model"), outputs=outputs)
    return Stage("model", "in_place", outputs.get("format", "hf"), ("model",), options,
                 pinned=stage_key({"in_place": "model", "files": files}))


def in_place_draft(folder: Path, manifest: dict) -> Stage:
    """The artifact's ``draft/`` (the draft model [[draft]] made, which its launch config names) as a stage read
    in place, keyed on the checksums the manifest records for its files."""
    files = {k: v for k, v in (manifest.get("files") or {}).items() if k.startswith("draft/")}
    options = InPlace(folder=str(folder / "draft"), outputs={"format": "hf", "model_dir": str(folder / "draft")})
    return Stage("draft", "in_place", "hf", ("draft",), options, pinned=stage_key({"in_place": "draft", "files": files}))


def in_place_deploy(deploy_dir: Path, engine: str) -> Stage:
    """The artifact's ``deploy/<engine>/`` as a stage read in place, keyed on its files' contents."""
    return Stage("deploy", "in_place", engine, ("serve",), InPlace(folder=str(deploy_dir)),
                 pinned=stage_key({"in_place": "deploy", "files": checksums(deploy_dir)}))


def is_url(text: str | None) -> bool:
    return bool(text) and str(text).startswith(("http://", "https://"))


class _Builder:
    """Appends the stages of a plan in order, running each backend's ``check`` as it goes."""

    def __init__(self, loaded: LoadedRecipe, problems: list[Problem], info: ModelInfo | None, gpu: GPU | None,
                 cache: Cache, facts: bool = True, only: list[str] | None = None):
        self.loaded, self.problems, self.info, self.gpu, self.cache = loaded, problems, info, gpu, cache
        self.only = set(only) if only else None  # the evals to plan (None: every one)
        self.source_info = info  # self.info follows the compress steps (pruning); this stays the source's
        self.facts = facts  # False: nothing of the model is read, so the source check is skipped
        self.stages: list[Stage] = []
        self.upstream: list[str] = []  # the compress methods so far
        self.identities: dict[str, dict | None] = {}  # endpoint URL -> what its server says it serves
        self.engine_model: Stage | None = None  # the model an engine loads (model_stages)
        self.draft_facts: dict | None = None  # the layers and parameters of the draft [[draft]] makes

    def ctx(self, step: tuple, recipe: LoadedRecipe | None = None, **kw) -> PlanContext:
        return PlanContext(recipe=recipe or self.loaded, step=step, model=self.info, gpu=self.gpu,
                           upstream=list(self.upstream), source=self.source_info, **kw)

    def add(self, stage: Stage) -> Stage:
        self.stages.append(stage)
        return stage

    def source(self, name: str, section, flag: str | None = None) -> Stage:
        """The stage that reads a model; ``flag``: the command-line option that named it instead of the recipe."""
        stage = Stage(name, "source", "gguf" if is_gguf(section.source) else "hf", ("model",), section)
        if self.facts:
            self.problems += said_by(stage.impl.check(section, self.ctx(("model",))), flag)
        stage.material = {"source": stage.impl.fingerprint(section, self.loaded.path.parent)}
        return self.add(stage)

    def model_stages(self, source: Stage) -> Stage:
        """The compress steps and the export, in recipe order; returns the last model stage."""
        recipe, loaded, model_stage = self.loaded.recipe, self.loaded, source
        for index, step in enumerate(recipe.compress):
            model_stage = self.step("compress", index, step.method, model_stage, source)
        self.engine_model = model_stage  # what an engine loads: the last compress step's model, before an export
        if recipe.export.format != "hf":
            options = loaded.options_for("export", None)
            stage = Stage(f"export.{recipe.export.format}", "export", recipe.export.format, ("export",), options,
                          {"model": model_stage.name})
            self.problems += stage.impl.check(options, self.ctx(("export",)))
            model_stage = self.add(stage)
        return model_stage

    def step(self, section: str, index: int, method: str, model_stage: Stage, source: Stage) -> Stage:
        """One compress step (of [[compress]] or [[draft]]) on ``model_stage``'s model; a distill step's teacher is
        the source."""
        recipe, loaded = self.loaded.recipe, self.loaded
        options = loaded.options_for(section, index)
        stage = Stage(f"{section}.{index}.{method}", section, method, (section, index), options,
                      {"model": model_stage.name})
        impl = stage.impl
        if impl.teacher:  # distillation: the source model teaches the student
            stage.inputs["teacher"] = source.name
        data = getattr(options, "data", None)
        if isinstance(data, str):  # a step's own training text, hashed like calibration data
            stage.material["data_sha256"] = datasets.digest(data, loaded.path.parent)
        self.problems += impl.check(options, self.ctx((section, index)))
        if impl.cpu_float32:  # what it computes in on a CPU, which the stage's numbers follow
            stage.material["cpu_compute_dtype"] = "float32"
        if impl.calibrates:
            stage.material["calibration"] = recipe.calibration.model_dump(mode="json")
            stage.material["calibration_sha256"] = datasets.digest(recipe.calibration.data, loaded.path.parent)
        if self.info is not None:
            self.info = impl.transform_info(options, self.info)
        self.upstream.append(method)
        return self.add(stage)

    def draft(self, source: Stage) -> Stage | None:
        """[[draft]]: the steps that make the draft model from the source, in order, and the stage that measures
        how many of its tokens the served model accepts (``llmopt.bench.acceptance``); returns the draft's stage."""
        recipe = self.loaded.recipe
        if not recipe.draft:
            return None
        from llmopt.bench import dataset as bench_data
        from llmopt.bench.acceptance import acceptance_options

        info, upstream = self.info, self.upstream
        self.info, self.upstream = self.source_info, []  # the draft's steps see the source, not the target
        model_stage = source
        for index, step in enumerate(recipe.draft):
            model_stage = self.step("draft", index, step.method, model_stage, source)
        drafted, self.info, self.upstream = self.info, info, upstream  # the draft's facts; the target's again
        if drafted is not None:
            self.draft_facts = {"layers": drafted.num_layers, "parameters": drafted.total_params}
        where = self.loaded.where("draft")
        if recipe.serve is None:
            self.problems.append(Problem("[[draft]] makes a draft model, but the recipe has no [serve] to speculate in",
                                         where, '[serve.speculative] method = "draft_model" serves it'))
        if drafted is not None and self.info is not None and drafted.total_params >= self.info.total_params:
            self.problems.append(Problem(
                f"the draft [[draft]] makes ({drafted.total_params / 1e6:,.0f}M parameters) is not smaller than "
                f"the served model ({self.info.total_params / 1e6:,.0f}M): drafting would cost more than it saves",
                where, "cut it with prune_depth or prune_width (a quantized copy has as many parameters)"))
        options = acceptance_options(self.loaded)
        stage = Stage("draft.acceptance", "acceptance", "greedy", ("draft",), options,
                      {"draft": model_stage.name, "target": self.engine_model.name})
        try:  # the prompts' text keys the stage, as a workload's keys the bench
            stage.material["dataset_sha256"] = bench_data.load(options.dataset, self.loaded.path.parent).sha256
        except UsageError as exc:
            self.problems.append(Problem(exc.what, self.loaded.where("serve", "workload", "dataset"), exc.fix))
        self.add(stage)
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
        return self.source("candidate", self.loaded.recipe.model.model_copy(update={"source": str(folder)}),
                           f"--candidate {candidate}")

    def evals(self, source: Stage, target: Stage | None, endpoint: str | None = None, served: str | None = None):
        """Each [[eval]] on the baseline and the candidate (``target``), or on the source alone."""
        loaded = self.loaded
        for index, item in enumerate(loaded.recipe.eval):
            if self.only is not None and item.name not in self.only:
                continue
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
                    flag = None if url is None else f"{'--endpoint' if target is None else '--candidate'} {url}"
                    self.problems += said_by(registry.get("eval", item.kind)().check(opts, self.ctx(("eval", index))),
                                             flag)
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
        options = gate_options(self.loaded)
        if self.only is not None:
            options = options.model_copy(update={"gates": [g for g in options.gates if g.name in self.only]})
        self.add(Stage("gate", "gate", "paired", ("eval",), options, inputs,
                       volatile=any(s.volatile for s in evals)))

    def serving(self, model_stage: Stage, draft: Stage | None) -> None:
        """[serve]: the deploy stage, then [bench] and [tune]. With several engines in [serve] backend: a deploy and
        a tune stage each, the choice between them (``llmopt.tune.choose``), then the bench of the chosen engine."""
        serve = self.loaded.recipe.serve
        if serve is None or len(serve.engines) == 1:
            deploy = self.deploy(model_stage, draft)
            self.bench(deploy, model_stage, draft)
            self.tune([deploy] if deploy is not None else [], model_stage, draft)
            return
        deploys = [self.deploy(model_stage, draft, engine) for engine in serve.engines]
        if not self.loaded.recipe.tune.enabled:
            self.problems.append(Problem(
                f"[serve] backend lists {len(deploys)} engines, but [tune] is not enabled: the engine is chosen by "
                "measuring each", self.loaded.where("serve", "backend"), "set [tune] enabled = true (max_trials = 1 "
                "measures each engine's predicted config alone), or name one engine"))
            return
        tunes = self.tune(deploys, model_stage, draft)
        if tunes:
            from llmopt.tune.choose import choose_options

            options = choose_options(self.loaded.recipe)
            chosen = self.add(Stage("choose", "choose", options.objective, ("serve",), options,
                                    {stage.backend: stage.name for stage in tunes}))
            self.bench(chosen, model_stage, draft)

    def deploy(self, model_stage: Stage, draft: Stage | None = None, engine: str | None = None) -> Stage | None:
        """The serve backend's launch configs for the final model; its plan-time checks and what it accepts.
        ``engine``: one of several [serve] backend lists, whose problems name it."""
        if self.loaded.recipe.serve is None:
            return None
        loaded = self.loaded.for_engine(engine) if engine else self.loaded  # as a recipe of that engine alone
        recipe, serve = loaded.recipe, loaded.recipe.serve
        options = loaded.options_for("serve", None)
        backend = registry.get("serve", serve.backend)()
        found = backend.check(options, self.ctx(("serve",), loaded))
        self.problems += [dataclasses.replace(p, message=f"{engine}: {p.message}") for p in found] if engine else found
        facts = {"name": recipe.name, "model": recipe.model.model_dump(mode="json"),
                 "serve": serve.model_dump(mode="json"), "target": recipe.target.model_dump(mode="json")}
        material = {"recipe": facts}
        engine_release = backend.key_material(options)  # the engine release found here, for one
        if engine_release:
            material["engine"] = engine_release
        inputs = {"model": model_stage.name, **({"draft": draft.name} if draft is not None else {})}
        return self.add(Stage(f"deploy.{serve.backend}", "deploy", serve.backend, ("serve",), options, inputs,
                              material))

    def bench(self, deploy: Stage | None, model_stage: Stage, draft: Stage | None = None) -> None:
        """With [bench] enabled: the artifact's server started from the deploy stage's launch config (the chosen
        engine's, after a choose stage) and measured (``llmopt.bench.stage``); no [serve] section, or no engine
        installed here, is an error."""
        if not self.loaded.recipe.bench.enabled:
            return
        from llmopt.bench.stage import bench_options, dataset_facts, plan_problems

        found = plan_problems(self.loaded)
        self.problems += found
        if deploy is None or found:
            return
        options = bench_options(self.loaded.recipe)
        found, material = dataset_facts(self.loaded, options.workload)
        self.problems += found
        self.add(Stage("bench", "bench", options.engine, ("bench",), options,
                       served_inputs(model_stage, deploy, draft), material))

    def tune(self, deploys: list[Stage], model_stage: Stage, draft: Stage | None = None) -> list[Stage]:
        """With [tune] enabled: the launch parameters searched against the live engine (``llmopt.tune.stage``), a
        stage per deploy stage (``tune``; ``tune.<engine>`` with several engines), after the bench stage; keyed on
        whether the engine can start here, since without it the prediction stays."""
        if not self.loaded.recipe.tune.enabled:
            return []
        from llmopt.tune.stage import engine_available, plan_problems, tune_options

        found = plan_problems(self.loaded)
        self.problems += found
        if not deploys or any(p.severity == "error" for p in found):
            return []
        from llmopt.bench.stage import dataset_facts

        found, material = dataset_facts(self.loaded, self.loaded.recipe.serve.workload)
        self.problems += found
        stages = []
        for deploy in deploys:
            options = tune_options(self.loaded.recipe, deploy.backend)
            stages.append(self.add(Stage("tune" if len(deploys) == 1 else f"tune.{deploy.backend}", "tune",
                                         deploy.backend, ("tune",), options, served_inputs(model_stage, deploy, draft),
                                         {"engine_available": engine_available(options.engine), **material})))
        return stages


def served_inputs(model: Stage, deploy: Stage | None, draft: Stage | None) -> dict[str, str]:
    """The inputs of a stage that starts the engine: the model, the launch config and the draft the launch
    config names (a recipe's own, [[draft]])."""
    return {"model": model.name, **({"deploy": deploy.name} if deploy is not None else {}),
            **({"draft": draft.name} if draft is not None else {})}


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


def pinned_stage(path: Path, cache: Cache, name: str = "candidate") -> Stage | None:
    """The final model stage of the artifact at ``path`` (the artifact folder or its ``model/``) as a cache
    entry, when the cache holds it whole and the artifact's model files still match its manifest; None
    otherwise (the folder is then read in place). Its evals then have the keys of the run that made it."""
    from llmopt.store.verify import verify_artifact

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
