"""The bench stage of ``llmopt run``: the artifact's own server, measured under the recipe's workload.

With ``[bench] enabled = true`` the plan gets a ``bench`` stage after the deploy stage. It lays out
the final model and the deploy stage's launch config as an artifact would hold them (``model/`` and
``deploy/<engine>/`` in a scratch folder of the stage), and ``run_bench`` starts that launch config
(ort through ``llmopt serve``; vLLM, SGLang and TensorRT-LLM through ``launch.sh``), waits for
``/health``, sends ``[serve].workload`` at its concurrency with ``[bench]`` requests, warm-up and
repeats (random token ids, or the prompts of ``[serve.workload] dataset``, ``llmopt.bench.dataset``),
judges ``[serve].slo``, and always stops the server. bench.json, bench.md, requests.jsonl,
engine.log and the plots stay in the stage folder; the figures are the stage's outputs, which the
artifact's manifest and reports carry.

The key hashes the deploy stage's key, the model stage's key and these options, so a finished bench
is cached; one that was killed left no entry and runs again.

``llmopt bench ARTIFACT`` is a plan of this stage too (``llmopt.plan.build_artifact_plan``, scope
"bench"): the artifact's ``model/`` and ``deploy/<engine>/`` read where they are, the recipe its
manifest records, and the command's own load (points, rates, a sweep, the endpoint...) in ``load``.
That stage is volatile: a benchmark measures afresh each time it is asked for.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Annotated, Union

from pydantic import BaseModel, ConfigDict, Field

from llmopt.backends.base import StageContext, StageKind
from llmopt.bench.options import BenchOptions
from llmopt.errors import Problem
from llmopt.recipe.schema import SLO, Workload
from llmopt.registry import register

LAUNCHED_BY_SCRIPT = ("vllm", "sglang", "trtllm")  # started through launch.sh: only where the engine is installed
FIGURES = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")


class ServedLoad(BaseModel):
    """What a stage that measures the live engine sends it, and judges: from [serve] and [bench]."""

    model_config = ConfigDict(extra="forbid")
    engine: str = Field(description="The engine the deploy stage's launch config starts ([serve] backend; auto "
                        "after a choose stage: the engine it picked).")
    workload: Workload = Field(description="[serve].workload: prompt and output tokens, and the concurrency sent.")
    slo: SLO = Field(description="[serve].slo: the bounds goodput counts requests within.")
    requests: int = Field(ge=1, description="Measured requests ([bench] requests; [tune] requests for a trial).")
    warmup: int = Field(ge=0, description="[bench] warmup: requests sent first and left out.")


class BenchStageOptions(ServedLoad):
    """What the bench stage measures: from [serve] (engine, workload, SLO) and [bench]."""

    requests: Union[Annotated[int, Field(ge=1)], list[Annotated[int, Field(ge=1)]]] = Field(
        description="Measured requests per point ([bench] requests), or one count per load point (`llmopt bench "
        "ARTIFACT -c 1,8 -n 16,128`).")
    repeats: int = Field(ge=1, description="[bench] repeats: runs of the point; figures are the medians.")
    split: list[int] | None = Field(None, description="[bench] split: prompt lengths of the prefill / decode split "
                                    "(None: the default lengths for llmopt serve).")
    load: BenchOptions | None = Field(None, description="`llmopt bench ARTIFACT`'s own options (load points, rates, "
                                      "sweep, endpoint, timeouts); None in `llmopt run`: one point at the "
                                      "workload's concurrency, on the deploy stage's engine.")

    def bench(self) -> BenchOptions:
        """What ``run_bench`` is given: the load options with [bench]'s requests, warm-up, repeats and split."""
        return (self.load or BenchOptions(engine=self.engine)).model_copy(update={
            "requests": self.requests, "warmup": self.warmup, "repeats": self.repeats, "split": self.split})


def bench_options(recipe) -> BenchStageOptions:
    """The bench stage of ``llmopt run``; with several engines in [serve] backend, engine "auto": the one the choose
    stage picked, whose launch config it reads."""
    serve, bench = recipe.serve, recipe.bench
    engine = serve.backend if isinstance(serve.backend, str) else "auto"
    return BenchStageOptions(engine=engine, workload=serve.workload, slo=serve.slo, requests=bench.requests,
                             warmup=bench.warmup, repeats=bench.repeats, split=bench.split)


def artifact_bench_options(recipe, given: dict) -> BenchStageOptions:
    """The bench stage of ``llmopt bench ARTIFACT``: what the artifact's recipe records ([serve].workload and
    .slo, [bench] requests, warmup, repeats and split) with the command's ``given`` settings laid over it
    (``workload``, ``slo``: fields of those tables; ``options``: BenchOptions' fields). An artifact without
    [serve] is served by ``llmopt serve`` under the default workload. A bad value is a usage error naming it,
    as ``run_bench`` says it."""
    from llmopt.bench.runner import checked

    serve, section = recipe.serve, recipe.bench
    options = dict(given.get("options") or {})
    fields = {"requests": section.requests, "warmup": section.warmup, "repeats": section.repeats,
              "split": section.split}
    fields.update({key: options.pop(key) for key in list(fields) if key in options})
    workload = (serve.workload if serve else Workload()).model_dump() | (given.get("workload") or {})
    slo = (serve.slo if serve else SLO()).model_dump() | (given.get("slo") or {})
    stage = checked(BenchStageOptions, {
        "engine": serve.backend if serve else "llmopt", "workload": checked(Workload, workload, "workload"),
        "slo": checked(SLO, slo, "slo"), "load": checked(BenchOptions, options, "options"), **fields}, "options")
    stage.bench().point_requests(stage.workload)  # a count per point that does not fit the points: exit 2 now
    return stage


def dataset_facts(loaded, workload: Workload) -> tuple[list[Problem], dict]:
    """The data set ``workload`` names (relative to the recipe's folder): a problem when it cannot be read or a
    record is malformed, else its sha256 for the key of the stage that sends it (none without one)."""
    if not workload.dataset:
        return [], {}
    from llmopt.bench import dataset
    from llmopt.errors import UsageError

    try:
        found = dataset.load(workload.dataset, loaded.path.parent)
    except UsageError as exc:
        return [Problem(f"{exc.where}: {exc.what}" if exc.where else exc.what,
                        loaded.where("serve", "workload", "dataset"), exc.fix)], {}
    return [], {"dataset_sha256": found.sha256}


def located(workload: Workload, ctx: StageContext) -> Workload:
    """``workload`` with its data set file as an absolute path (a relative one is the recipe's folder's)."""
    from llmopt.bench import dataset

    path = dataset.resolve(workload.dataset, Path(ctx.recipe.path).parent) if workload.dataset else None
    return workload if path is None else workload.model_copy(update={"dataset": str(path)})


def plan_problems(loaded) -> list[Problem]:
    """A bench without a [serve] section, or whose engine is not installed on this machine (of several engines in
    [serve] backend, none)."""
    from llmopt.bench import engine

    recipe = loaded.recipe
    where = loaded.where("bench", "enabled")
    if recipe.serve is None:
        return [Problem("[bench] enabled = true, but the recipe has no [serve] section: there is no server to "
                        "benchmark", where, "add a [serve] section (backend, workload, slo), or set [bench] "
                        "enabled = false")]
    names = recipe.serve.engines
    missing = [name for name in names if name in LAUNCHED_BY_SCRIPT and not engine.engine_installed(name)]
    if len(missing) < len(names):
        return []
    if len(names) > 1:
        return [Problem(f"[bench] starts the chosen engine's server, but none of {', '.join(names)} is installed on "
                        "this machine", where, "run where one of them is installed, or set [bench] enabled = false "
                        "(then `llmopt bench ARTIFACT` where the chosen engine is installed)")]
    name = names[0]
    what, pin = engine.INSTALLED_BY[name]
    found = f"no `{what}` on PATH" if what else "python3 cannot import sglang"
    return [Problem(f"[bench] starts the artifact's {name} server, but {name} is not installed on this machine "
                    f"({found})", where, f"install {name} ({pin}) and run there, or set [bench] enabled = false "
                    f"(then `llmopt bench ARTIFACT` where {name} is installed)")]


@register("stage", "bench")
class BenchStage(StageKind):
    """``run_bench`` over the deploy stage's launch config and the final model."""

    Options = BenchStageOptions
    requires = ("aiohttp",)  # the streaming client

    def run(self, options: BenchStageOptions, ctx: StageContext) -> dict:
        from llmopt.bench.runner import run_bench

        if options.engine == "auto":  # after a choose stage: the engine it picked, as a recipe of it alone
            options = options.model_copy(update={"engine": ctx.input_manifests["deploy"]["outputs"]["engine"]})
            ctx = dataclasses.replace(ctx, recipe=ctx.recipe.for_engine(options.engine))
        target = ctx.out_dir / "target"
        lay_out(target, ctx, options.engine)
        try:
            result = run_bench(target, located(options.workload, ctx), options.slo, options.bench(), ctx.out_dir,
                               cache_dir=ctx.cache_root, say=ctx.progress)
        finally:
            shutil.rmtree(target, ignore_errors=True)
        result["out_dir"] = "."  # not the temporary folder: the stage folder moves into the cache when complete
        (ctx.out_dir / "bench.json").write_text(json.dumps(result, indent=2) + "\n")
        return outputs(result)


def lay_out(target: Path, ctx: StageContext, engine: str) -> None:
    """``target`` as an artifact: ``model/`` (a link to the final model), ``draft/`` (a link to the draft
    [[draft]] made, which the launch config names), ``deploy/<engine>/`` (a copy of the deploy stage's files,
    where launch.sh looks for them; none for an artifact without a launch config, which ``llmopt serve``
    serves) and a manifest.json naming the recipe and the model's format (what ``llmopt serve`` reads)."""
    from llmopt.store.cache import write_json

    target.mkdir(parents=True)
    (target / "model").symlink_to(Path(ctx.model_dir).resolve(), target_is_directory=True)
    if "draft" in ctx.inputs:
        (target / "draft").symlink_to(ctx.input_model_dir("draft").resolve(), target_is_directory=True)
    if "deploy" in ctx.inputs:
        shutil.copytree(ctx.inputs["deploy"], target / "deploy" / engine, ignore=shutil.ignore_patterns("manifest.json"))
    model = ctx.input_manifests["model"]
    write_json(target / "manifest.json", {
        "recipe": {"name": ctx.recipe.recipe.name, "resolved": ctx.recipe.recipe.model_dump(mode="json")},
        "stages": [{"name": model.get("stage"), "outputs": model.get("outputs") or {}}]})


def outputs(result: dict) -> dict:
    """The stage's outputs: where its files are, and the figures of each load point."""
    started = result["target"].get("started") or {}
    return {
        "engine": started.get("engine"), "model": result["target"]["model"], "server": result["target"]["server"],
        "workload": result["workload"], **({"dataset": result["dataset"]} if result.get("dataset") else {}),
        "slo": result["slo"],
        "options": {k: result["options"][k] for k in ("requests", "warmup", "repeats")},
        "points": [point_figures(p) for p in result["points"]],
        "split": result.get("split"),
        "files": {"json": "bench.json", "markdown": "bench.md", "requests": "requests.jsonl", "log": "engine.log",
                  "plots": result["files"].get("plots", [])},
        "duration_s": result["duration_s"],
    }


def point_figures(point: dict) -> dict:
    """TTFT / TPOT / ITL / end-to-end p50 and p99, throughput, goodput and errors of one load point, and speculative
    decoding's acceptance where the server reports it."""
    good = point.get("goodput")
    return {
        "load": point["load"], "requests": point["requests"],
        **{key: ({q: point[key][q] for q in ("p50", "p99")} if point[key] else None) for key in FIGURES},
        "request_throughput": point["request_throughput"], "output_throughput": point["output_throughput"],
        "total_token_throughput": point["total_token_throughput"],
        "goodput": {k: good[k] for k in ("requests_per_s", "fraction")} if good else None,
        "errors": {kind: e["count"] for kind, e in point["errors"].items()},
        **({"speculation": {k: point["speculation"].get(k) for k in ("acceptance_rate", "mean_acceptance_length")}}
           if point.get("speculation") else {}),
    }
