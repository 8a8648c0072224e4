"""The choose stage: the engine the artifact is served with, picked from the tune stages' measurements.

With several engines in ``[serve] backend`` the plan gets a deploy and a tune stage per engine (``deploy.<engine>``,
``tune.<engine>``), then ``choose``, which reads each tune stage's tuning.json. An engine is measured when its search
ran (some trial's server started); one not installed here, or whose server never started, is not measured, cannot
win, and its reason is kept. Among the measured, in the recipe's order, the objective of each engine's tuned config
decides (goodput under ``[serve].slo`` when the SLO has a bound, else output tokens per second; the median of that
config's trials, as the search compares them): a later engine replaces the best so far only when it beats it by
more than ``search.MIN_GAIN``, so a draw within measurement noise goes to the engine listed first. With no engine
measured, the first listed stays, with its predicted launch config, and the choice says it was not measured.

The stage's folder is the chosen engine's tuned launch config (what a bench stage after it starts); its outputs
are the choice and every engine's line: measured or not (and why), its tuned values, score and figures.
"""

from __future__ import annotations

import json
import shutil
import statistics
from typing import Literal

from pydantic import Field

from llmopt.backends.base import StageContext, StageKind
from llmopt.recipe.schema import Options
from llmopt.registry import register


class ChooseOptions(Options):
    """Which engines the choice is between, and what decides it: from [serve]."""

    engines: list[str] = Field(description="[serve] backend: the engines, in the recipe's order (the first is the "
                               "default).")
    objective: Literal["goodput", "output_throughput"] = Field(
        description="goodput when [serve].slo has a bound, else output_throughput, as the tune stages search.")


def choose_options(recipe) -> ChooseOptions:
    from llmopt.tune.search import judges_goodput

    serve = recipe.serve
    return ChooseOptions(engines=serve.engines,
                         objective="goodput" if judges_goodput(serve.slo) else "output_throughput")


def line(tuning: dict) -> dict:
    """One engine's line of the choice, from its tuning.json: measured or not (and why); when measured, its tuned
    values, its score (the median objective of their trials) and the figures of their first trial."""
    from llmopt.tune import report
    from llmopt.tune.search import eligible

    out = {"engine": tuning["engine"], "measured": bool(tuning.get("tuned"))}
    if not out["measured"]:
        return out | {"reason": tuning.get("reason")}
    winner = tuning["winner"]
    scores = [eligible(t) for t in tuning["trials"] if t["values"] == winner]
    figures = report.outputs(tuning)["winner_figures"] or {}
    good = figures.get("goodput") or {}
    return out | {
        "score": statistics.median(scores) if scores else 0.0, "values": winner, "gain": tuning.get("gain"),
        "simulated": bool(tuning.get("simulated")), "trials": len(tuning["trials"]),
        "figures": {"output_throughput": figures.get("output_throughput"),
                    "goodput_requests_per_s": good.get("requests_per_s"),
                    "ttft_p99_ms": (figures.get("ttft_ms") or {}).get("p99"),
                    "tpot_p99_ms": (figures.get("tpot_ms") or {}).get("p99")}}


def choice(tunings: dict[str, dict], objective: str) -> dict:
    """The engine the artifact is served with, from each engine's tuning.json (``tunings``, in the recipe's order),
    why, and every engine's line."""
    from llmopt.tune.search import MIN_GAIN

    lines = [line(t) for t in tunings.values()]
    measured = [x for x in lines if x["measured"]]
    missing = "; ".join(f"{x['engine']} was not measured ({x['reason']})" for x in lines if not x["measured"])
    if not measured:
        first = lines[0]["engine"]
        reason = f"no engine was measured here ({missing}): {first}, the first listed, keeps its predicted config"
        return {"engine": first, "measured": False, "objective": objective, "reason": reason, "engines": lines}
    best = measured[0]
    for other in measured[1:]:
        if other["score"] > best["score"] * (1 + MIN_GAIN):
            best = other
    others = [x for x in measured if x is not best]
    if not best["score"]:
        reason = (f"no engine met the SLO at this workload ({objective} 0), so none could be ranked: {best['engine']}, "
                  "the first measured, is kept")
    elif others:
        reason = f"{best['engine']}: {objective} {best['score']:.4g} against " + ", ".join(
            f"{x['engine']}'s {x['score']:.4g}" + (f" (within {MIN_GAIN:.0%}: the engine listed first keeps it)"
                                                  if x["score"] * (1 + MIN_GAIN) >= best["score"] else "")
            for x in others)
    else:
        reason = f"{best['engine']} is the only engine measured ({objective} {best['score']:.4g})"
    reason += f"; {missing}" if missing else ""
    return {"engine": best["engine"], "measured": True, "objective": objective, "min_gain": MIN_GAIN,
            "reason": reason, "engines": lines}


def markdown(chosen: dict) -> str:
    """report.md's section: the chosen engine, why, and each engine's figures."""
    from llmopt.tune.report import num

    lines = ["", f"## Engine choice: {chosen['engine']}", "", f"The artifact is served with {chosen['engine']} "
             f"(deploy/{chosen['engine']}/): {chosen['reason']}. Every engine's launch config is in deploy/, its "
             "tuning in reports/tune/<engine>/.", "",
             "| engine | measured | goodput req/s | output tok/s | TTFT p99 ms | TPOT p99 ms | tuned values |",
             "|---|---|---|---|---|---|---|"]
    for x in chosen["engines"]:
        if not x["measured"]:
            lines.append(f"| {x['engine']} | not measured: {x['reason']} | - | - | - | - | - |")
            continue
        fig = x["figures"]
        lines.append(f"| {x['engine']}{' (chosen)' if x['engine'] == chosen['engine'] else ''} | "
                     f"{'simulated' if x['simulated'] else 'yes'}, {x['trials']} trials | "
                     f"{num(fig['goodput_requests_per_s'], '.3f')} | {num(fig['output_throughput'])} | "
                     f"{num(fig['ttft_p99_ms'])} | {num(fig['tpot_p99_ms'])} | "
                     f"{', '.join(f'{k}={v}' for k, v in x['values'].items()) or 'predicted'} |")
    return "\n".join(lines) + "\n"


@register("stage", "choose")
class ChooseStage(StageKind):
    """The choice between the engines the tune stages measured."""

    Options = ChooseOptions

    def run(self, options: ChooseOptions, ctx: StageContext) -> dict:
        tunings = {name: json.loads((ctx.inputs[name] / "tuning.json").read_text()) for name in options.engines}
        chosen = choice(tunings, options.objective)
        ctx.log.info("choose: served with %s: %s", chosen["engine"], chosen["reason"])
        shutil.copytree(ctx.inputs[chosen["engine"]] / "deploy", ctx.out_dir, dirs_exist_ok=True)
        return chosen
