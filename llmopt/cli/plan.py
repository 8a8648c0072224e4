"""llmopt plan: show the stages, cache keys, checks and estimates of a recipe."""

from __future__ import annotations

import os

from llmopt.cli.app import CacheOpt, FormatOpt, OfflineOpt, OutputOpt, RecipeArg, SetOpt, StrictOpt, app, sink
from llmopt.output import human_size


@app.command()
def plan(recipe: RecipeArg, set_: SetOpt = None, cache_dir: CacheOpt = None, output: OutputOpt = None,
         offline: OfflineOpt = False, strict: StrictOpt = False, format: FormatOpt = "human") -> None:
    """Plan a recipe: ordered stages with cache keys, plan-time checks and resource estimates.

    Reads config.json (or the GGUF header) only, never the weights; for a hub model, one request to
    the hub. Exits 2 when a check fails, or when the hub cannot be reached (--offline plans without it).
    A recipe with [sweep.axes] also has each variant planned: one the recipe's schema refuses is an
    error, one the planner refuses a warning (`llmopt sweep` skips it; an error with --strict).

    Examples:

        llmopt plan recipes/quickstart.toml

        llmopt plan recipes/quickstart.toml --format json

        llmopt plan my.toml --offline
    """
    from llmopt import api
    from llmopt.errors import RecipeError, on_command_line

    if offline:
        os.environ["HF_HUB_OFFLINE"] = "1"  # for every library this process loads, as the variable itself does
    out = sink(format)
    the_plan = api.plan(recipe, set_ or [], cache_dir, output, strict)
    out.result(the_plan.to_dict(), lambda c: _show(c, the_plan))
    if the_plan.errors:
        raise RecipeError(f"{the_plan.recipe.path}: {len(the_plan.errors)} check(s) failed", problems=the_plan.errors,
                          fix="fix the command line's options above" if on_command_line(the_plan.errors)
                          else "fix the recipe and plan again")


def _show(console, the_plan) -> None:
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"plan: {the_plan.recipe.recipe.name}")
    for col in ("stage", "backend", "cache key", "status"):
        table.add_column(col)
    for stage in the_plan.stages:
        cached = the_plan.cache.has(stage.key)
        table.add_row(stage.name, stage.backend, stage.key[:12], "[green]cached[/]" if cached else "to run")
    console.print(table)
    for problem in the_plan.problems:  # model facts unknown: a warning at model.source says why and what did not run
        colour = "red" if problem.severity == "error" else "yellow"
        console.print(f"[{colour}]{problem.severity}[/]: {escape(str(problem))}")
    est = the_plan.estimates
    if the_plan.model is None:
        console.print("[yellow]model facts unknown[/]: no size, memory or KV-cache estimates (see model.source above)")
    if "weight_bytes_before" in est:
        console.print(f"model folder: {human_size(est['model_bytes_before'])} -> {human_size(est['artifact_bytes'])} "
                      f"(weights {human_size(est['weight_bytes_before'])} -> {human_size(est['weight_bytes_after'])}; "
                      f"{est['parameters'] / 1e6:.0f}M parameters)")
    if "draft" in est:
        console.print(f"draft model: {est['draft']['layers']} layers, {est['draft']['parameters'] / 1e6:.0f}M "
                      "parameters")
    if "calibration_memory_bytes" in est:
        console.print(f"calibration memory: ~{human_size(est['calibration_memory_bytes'])}")
    placed = est.get("compress_placement")
    if placed:
        _show_placement(console, placed)
    kv = est.get("kv_cache")
    if kv and not kv.get("fits"):
        console.print(f"KV cache on {the_plan.gpu.name}: does not fit ({kv['reason']})")
    elif kv:
        across = f" over {kv['nodes']} nodes (tp {kv['tensor_parallel_size']} x pp {kv['pipeline_parallel_size']})" \
            if kv.get("nodes", 1) > 1 else ""
        console.print(f"KV cache on {the_plan.gpu.name}{across}: {kv['kv_tokens']:,} tokens "
                      f"({kv['full_length_sequences']} sequences at full length)")
    console.print(f"artifact: {the_plan.output_dir}")


def _show_placement(console, placed: dict) -> None:
    """One line per placement the plan weighed, the chosen one marked (``llmopt.model.placement``)."""
    machine = f"{placed['count']} x {placed['gpu']}"
    console.print(f"compress placement on {machine}: {placed['chosen'] or 'none fits'}")
    for name, fp in placed["placements"].items():
        mark = "*" if name == placed["chosen"] else " "
        why = f" - does not fit: {'; '.join(fp['short'])}" if fp["short"] else ""
        console.print(f"  {mark} {name}: peak GPU ~{human_size(fp['gpu_bytes'])} per GPU, host "
                      f"~{human_size(fp['host_bytes'])}, {fp['time_class']}{why}")
