"""The tune stage of ``llmopt run``, and the trial runner ``llmopt tune ARTIFACT`` shares with it.

With ``[tune] enabled = true`` the plan gets a ``tune`` stage after the deploy stage (and after the
bench stage, when there is one). Each trial lays out the final model and a copy of the deploy stage's
``deploy/<engine>/`` with the trial's values written in (``spaces.apply``), starts it as the bench stage
starts the artifact's server (``llmopt.bench.runner.run_bench``: the server is always stopped), sends
``[serve].workload`` with ``[bench]`` requests and warm-up, and scores it (``search``). The stage writes
tuning.json, the winner's ``deploy/`` folder (which the artifact carries instead of the prediction) and
a plot of the trials.

The key hashes the deploy stage's key, the model stage's key, the tune options, the workload, the SLO
and whether the engine is installed here. Trials are kept in ``<cache>/tune/<key>/`` (not in the
stage's temporary folder, which a killed run loses), so a killed search resumes. An engine that is not
installed here leaves the prediction in place, and tuning.json says why.

Where ``[serve.speculative]`` is configured (vLLM, SGLang, TensorRT-LLM), speculation is a parameter of the search
that must earn its place, and after the search the lossless check compares greedy answers with and without it
(``llmopt.tune.speculation``): answers that differ beyond engine numerics fail the stage.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from pydantic import Field

from llmopt.backends.base import StageContext, StageKind
from llmopt.bench.stage import ServedLoad
from llmopt.errors import Problem
from llmopt.registry import register


class TuneStageOptions(ServedLoad):
    """What the tune stage searches and how it measures: from [serve], [bench] and [tune]."""

    max_trials: int = Field(ge=1, description="[tune] max_trials.")
    max_minutes: float | None = Field(None, description="[tune] max_minutes.")
    repeats: int = Field(ge=0, description="[tune] repeats: confirmation rounds of default and winner.")
    space: dict[str, list[Any]] = Field(default_factory=dict, description="[tune] space: candidates per parameter.")
    startup_timeout_s: float = Field(1200.0, gt=0, description="[tune] startup_timeout_s.")
    lossless_prompts: int = Field(16, ge=0, description="[tune] lossless_prompts.")


def tune_options(recipe, engine: str | None = None) -> TuneStageOptions:
    """The tune stage of ``engine`` (default: [serve] backend's only one), searching the [tune] space's parameters
    that engine has."""
    from llmopt.tune import spaces

    serve, bench, tune = recipe.serve, recipe.bench, recipe.tune
    engine = engine or serve.backend
    names = {p.name for p in spaces.space(engine)}
    return TuneStageOptions(engine=engine, workload=serve.workload, slo=serve.slo,
                            requests=tune.requests or bench.requests, warmup=bench.warmup,
                            max_trials=tune.max_trials, max_minutes=tune.max_minutes, repeats=tune.repeats,
                            space={k: v for k, v in tune.space.items() if k in names},
                            startup_timeout_s=tune.startup_timeout_s, lossless_prompts=tune.lossless_prompts)


def engine_available(engine: str) -> bool:
    from llmopt.bench import engine as engines

    return engine not in engines.INSTALLED_BY or engines.engine_installed(engine)


def plan_problems(loaded) -> list[Problem]:
    """No [serve] section (an error), a [tune] space naming parameters no engine of [serve] backend has (an error),
    or an engine that is not installed here (a warning: its prediction stays, and it is not measured)."""
    from llmopt.tune import spaces

    recipe, where = loaded.recipe, loaded.where("tune", "enabled")
    if recipe.serve is None:
        return [Problem("[tune] enabled = true, but the recipe has no [serve] section: there is no launch config "
                        "to tune", where, "add a [serve] section (backend, workload, slo), or set [tune] enabled = "
                        "false")]
    engines = recipe.serve.engines
    wrong = spaces.check_overrides(engines, recipe.tune.space)
    if wrong:
        return [Problem(wrong, loaded.where("tune", "space"), "name only the engine's parameters (docs/tune.md)")]
    if spaces.SPECULATIVE in recipe.tune.space and recipe.serve.speculative is None:
        return [Problem(f"[tune] space names {spaces.SPECULATIVE}, but [serve] has no speculative decoding to tune",
                        loaded.where("tune", "space"), "add [serve.speculative] (method, num_tokens), or leave "
                        f"{spaces.SPECULATIVE} out of the space")]
    found = []
    for name in engines:
        if recipe.serve.speculative is not None and spaces.SPECULATIVE not in [p.name for p in spaces.space(name)]:
            found.append(Problem(f"[tune] does not search {name}'s speculative decoding: [serve.speculative] stays as "
                                 "the recipe says, neither measured against no speculation nor checked for lossless "
                                 "answers", loaded.where("serve", "speculative"), "measure it with llmopt bench "
                                 "(acceptance per load point), or serve with vllm, sglang or trtllm to tune it",
                                 severity="warning"))
        if not engine_available(name):
            found.append(Problem(f"[tune] cannot start {name} on this machine (not installed): the launch config "
                                 "stays the prediction, and tuning.json says so", where,
                                 f"run where {name} is installed, or `llmopt tune ARTIFACT` there", severity="warning"))
    return found


def measurer(options: TuneStageOptions, model_dir: Path, deploy_dir: Path, manifest: dict, cache_root: Path,
             scratch: Path, say, draft_dir: Path | None = None):
    """measure(values, out_dir): one trial on the live engine, its server always stopped."""
    from llmopt.bench.options import BenchOptions
    from llmopt.bench.runner import run_bench
    from llmopt.tune import spaces

    bench = BenchOptions(requests=options.requests, warmup=options.warmup, repeats=1, engine=options.engine,
                         plots=False, startup_timeout_s=options.startup_timeout_s)

    def measure(values: dict, out_dir: Path) -> dict:
        target = spaces.trial_target(scratch / "target", model_dir, deploy_dir, options.engine, manifest, values,
                                     draft_dir)
        if out_dir.exists():
            shutil.rmtree(out_dir)  # a trial killed half-way: measured again
        try:
            return run_bench(target, options.workload, options.slo, bench, out_dir, cache_dir=cache_root, say=say)
        finally:
            shutil.rmtree(target, ignore_errors=True)

    return measure


def tune(options: TuneStageOptions, model_dir: Path, deploy_dir: Path, manifest: dict, cache_root: Path,
         store_root: Path, out_dir: Path, say, draft_dir: Path | None = None) -> dict:
    """The search for ``deploy_dir``'s engine, then tuning.json, the winner's ``deploy/`` and the plot in
    ``out_dir``; returns tuning.json's content. ``draft_dir``: the draft the launch config names ([[draft]])."""
    from llmopt.tune import report, spaces
    from llmopt.tune.search import Budget, Search, TrialStore, judges_goodput

    spaces.require_space(options.engine)
    if not engine_available(options.engine):
        result = {"tuned": False, "engine": options.engine, "reason": f"{options.engine} is not installed on this "
                  "machine: the launch config is the prediction, not measured", "trials": []}
        return report.write(result, options, deploy_dir, out_dir)
    grid = spaces.grid(options.engine, deploy_dir, options.workload.concurrency, options.space)
    store = TrialStore(store_root)
    measure = measurer(options, model_dir, deploy_dir, manifest, cache_root, store.root, say, draft_dir)
    budget = Budget(options.max_trials, options.max_minutes, options.repeats)
    search = Search(grid, measure, store, budget, goodput=judges_goodput(options.slo), say=say,
                    follow=spaces.follow(options.engine, grid), earn={spaces.SPECULATIVE: 0})
    result = search.execute() | {"tuned": True, "engine": options.engine, "store": str(store.root)}
    if not any(t["verdict"] != "failed" for t in result["trials"]):
        result |= {"tuned": False, "reason": "no trial's server started: the launch config stays the prediction"}
    elif spaces.SPECULATIVE in grid:
        result["speculation"] = speculated(options, result, model_dir, deploy_dir, manifest, cache_root, store, say,
                                           draft_dir)
    return report.write(result, options, deploy_dir, out_dir)


def speculated(options: TuneStageOptions, result: dict, model_dir: Path, deploy_dir: Path, manifest: dict,
               cache_root: Path, store, say, draft_dir: Path | None = None) -> dict:
    """Speculation's measured effect, and the lossless check (which raises StageFailed when it fails)."""
    from llmopt.tune import spaces, speculation

    name = spaces.SPECULATIVE
    out = speculation.effect(result, name, options.workload.concurrency)
    if options.lossless_prompts:
        def run_answers(values: dict, folder: Path) -> list[str]:
            return speculation.answers(options, values, model_dir, deploy_dir, manifest, cache_root, folder, say,
                                       draft_dir)

        out["lossless"] = speculation.check(options, result["winner"], name, out["configured"], run_answers, store,
                                            say)
    return out


@register("stage", "tune")
class TuneStage(StageKind):
    """The search over the deploy stage's launch config and the final model."""

    Options = TuneStageOptions

    def run(self, options: TuneStageOptions, ctx: StageContext) -> dict:
        from llmopt.bench.stage import located
        from llmopt.tune import report

        options = options.model_copy(update={"workload": located(options.workload, ctx)})
        recipe = ctx.recipe.for_engine(options.engine).recipe  # one of several engines: the recipe as its own

        model = ctx.input_manifests["model"]
        manifest = {"recipe": {"name": recipe.name, "resolved": recipe.model_dump(mode="json")},
                    "stages": [{"name": model.get("stage"), "outputs": model.get("outputs") or {}}]}
        store = Path(ctx.cache_root) / "tune" / ctx.out_dir.name.split(".")[0]
        draft = ctx.input_model_dir("draft") if "draft" in ctx.inputs else None
        result = tune(options, Path(ctx.model_dir), Path(ctx.inputs["deploy"]), manifest, Path(ctx.cache_root), store,
                      ctx.out_dir, ctx.progress, draft)
        return report.outputs(result)
