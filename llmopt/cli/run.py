"""llmopt run: run a recipe's stages with the cache and write the artifact."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

import os

from llmopt.cli.app import CacheOpt, FormatOpt, OfflineOpt, OutputOpt, RecipeArg, SetOpt, StrictOpt, app, sink


@app.command()
def run(
    recipe: RecipeArg,
    set_: SetOpt = None,
    force: Annotated[Optional[list[str]], typer.Option("--force", help="Re-run a stage (and what follows it) even when cached: a stage name or prefix (source, compress, eval), or 'all'.")] = None,
    cache_dir: CacheOpt = None,
    output: OutputOpt = None,
    offline: OfflineOpt = False,
    strict: StrictOpt = False,
    format: FormatOpt = "human",
) -> None:
    """Run a recipe: source, compression, export, evaluation, gates, deploy configs, benchmark, artifact.

    The benchmark runs with `[bench] enabled = true`: the artifact's server is started from its
    deploy config, measured under `[serve].workload` and `[serve].slo`, and stopped.

    Finished stages come from the cache; an interrupted run resumes at the first unfinished
    stage. Exits 3 when an accuracy gate fails (after writing the artifact and reports).

    Examples:

        llmopt run recipes/quickstart.toml

        llmopt run recipes/quickstart.toml --force deploy --format json

        llmopt run recipes/quickstart.toml -s serve.max_model_len=1024 -o out/
    """
    from llmopt import api
    from llmopt.errors import GateFailed

    if offline:
        os.environ["HF_HUB_OFFLINE"] = "1"  # for every library the run loads, as the variable itself does
    out = sink(format)
    try:
        result = api.run(recipe, set_ or [], force, cache_dir, output, out, strict)
    except GateFailed as err:
        result = getattr(err, "result", None)
        if result is not None:
            out.result(result.to_dict(), lambda c: _show(c, result))
        raise
    out.result(result.to_dict(), lambda c: _show(c, result))


def _show(console, result) -> None:
    from llmopt.cli.eval import print_gates

    if result.gates:
        print_gates(console, result.gates)
    ran = sum(r.status == "ran" for r in result.records)
    console.print(f"artifact: {result.artifact}  ({ran} stage(s) run, {len(result.records) - ran} cached; log {result.log_path})")
