"""What a search leaves: tuning.json, the winner's ``deploy/<engine>/``, a plot, and report.md's section.

tuning.json lists every trial (values, figures, verdict against the SLO, whether it came from an
earlier search), the default (the deploy stage's prediction), the winner and its gain over the
default. ``deploy/`` is the deploy stage's folder with the winner's values written in and a comment
saying it was tuned, by how much and how (measured, or simulated); when the engine could not run,
the prediction, with a comment saying it was not tuned. Where speculative decoding was searched, tuning.json's
``speculation`` and report.md's section give its measured effect and the lossless check's verdict. Simulated figures (an engine that says it
simulates, as the test engines do) are labelled simulated wherever they appear.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

SCHEMA_VERSION = 1
PLOT = "tuning.png"


def write(result: dict, options, deploy_dir: Path, out_dir: Path) -> dict:
    from llmopt.tune import spaces

    result = {"schema_version": SCHEMA_VERSION, **result, "workload": options.workload.model_dump(),
              "slo": options.slo.model_dump(), "requests": options.requests, "warmup": options.warmup}
    folder = out_dir / "deploy"
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(deploy_dir, folder, ignore=shutil.ignore_patterns("manifest.json"))
    if result.get("tuned"):
        changed = {k: v for k, v in result["winner"].items() if v != result["default"].get(k)}
        spaces.apply(folder, options.engine, changed, note(result))
    else:
        spaces.apply(folder, options.engine, {}, note(result))
    result["files"] = {"json": "tuning.json", "deploy": "deploy/"}
    if result.get("trials") and plot(result, out_dir / PLOT):
        result["files"]["plot"] = PLOT
    (out_dir / "tuning.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    return result


def how(result: dict) -> str:
    return "simulated (a test engine, not a measurement)" if result.get("simulated") else "measured on the live engine"


def note(result: dict) -> str:
    """The comment the winner's launch files carry."""
    if not result.get("tuned"):
        return f"Not tuned by llmopt: {result.get('reason')}."
    changed = {k: v for k, v in result["winner"].items() if v != result["default"].get(k)}
    if not changed and result.get("no_trial_met_slo"):
        return (f"Tuned by llmopt ({how(result)}): no trial met the SLO (goodput 0 in all "
                f"{len(result.get('trials') or [])}), so the candidates could not be ranked; the prediction is kept. "
                "Loosen [serve].slo or lower the workload's load to tune at it.")
    if not changed:
        return (f"Tuned by llmopt ({how(result)}): no candidate beat the predicted launch config by more than "
                f"{result['min_gain']:.0%} in {result['objective']}; the prediction is kept.")
    values = ", ".join(f"{k} {show(v, k)} (predicted {show(result['default'].get(k), k)})" for k, v in changed.items())
    return (f"Tuned by llmopt ({how(result)}): {values};\n{result['objective']} {times(result['gain'])} the "
            f"predicted config's (medians; tuning.json in the artifact's reports/tune/ lists every trial).")


def times(gain: float | None) -> str:
    """The winner's gain; None when the prediction scored 0 (no request met the SLO)."""
    return "above 0 against 0 for" if gain is None else f"{gain:.2f}x"


def show(value, name: str = "") -> str:
    if name == "num_speculative_tokens" and not value:
        return "0 (speculation off)"
    return "engine default" if value is None else str(value)


def outputs(result: dict) -> dict:
    """The stage's outputs: the verdict, the default and the winner with their figures."""
    trials = result.get("trials") or []

    def best_of(values):
        mine = [t for t in trials if t["values"] == values and t.get("figures")]
        return mine[0]["figures"] if mine else None

    out = {k: result.get(k) for k in ("tuned", "engine", "reason", "objective", "default", "winner", "gain", "simulated",
                                      "stopped", "workload", "slo", "speculation")}
    out |= {"trials": len(trials), "default_figures": best_of(result.get("default")),
            "winner_figures": best_of(result.get("winner")), "files": result["files"]}
    return out


def markdown(tune: dict) -> str:
    """report.md's section: the verdict and the default against the winner."""
    lines = ["", f"## Launch tuning: {tune.get('engine')}", ""]
    if not tune.get("tuned"):
        return "\n".join(lines + [f"Not tuned: {tune.get('reason')}", ""])
    files = Path((tune.get("files") or {}).get("json") or "tune/tuning.json").parent  # tune/<engine>: one of several
    lines.append(f"{tune['trials']} trials ({how(tune)}), objective {tune['objective']}; stopped: {tune['stopped']}. "
                 f"Winner: {times(tune['gain'])} the predicted config's {tune['objective']}. Files: reports/{files}/.")
    lines += ["", "| config | values | goodput req/s | output tok/s | TTFT p99 ms | TPOT p99 ms |", "|---|---|---|---|---|---|"]
    for name in ("default", "winner"):
        values, fig = tune.get(name) or {}, tune.get(f"{name}_figures") or {}
        good = (fig.get("goodput") or {}).get("requests_per_s")
        lines.append(f"| {name} | {', '.join(f'{k}={show(v)}' for k, v in values.items())} | "
                     f"{'-' if good is None else f'{good:.3f}'} | {fig.get('output_throughput', 0):.1f} | "
                     f"{_p99(fig.get('ttft_ms'))} | {_p99(fig.get('tpot_ms'))} |")
    return "\n".join(lines + speculation_lines(tune.get("speculation"))) + "\n"


def speculation_lines(spec: dict | None) -> list[str]:
    """Speculative decoding's measured effect and the lossless check, for report.md."""
    if not spec:
        return []
    verdict = "kept" if spec["kept"] else "turned off"
    lines = ["", f"Speculative decoding ({spec['parameter']} {spec['configured']} in the recipe): {verdict} at "
             f"concurrency {spec['concurrency']} (it stays only when it beats the same config without it by more "
             "than 5%)."]
    if spec.get("with") and spec.get("without"):
        lines += ["", "| speculation | output tok/s | TPOT p50 ms | TPOT p99 ms | acceptance rate | tokens per step |",
                  "|---|---|---|---|---|---|"]
        for label, side in (("with", spec["with"]), ("without", spec["without"])):
            tpot = side.get("tpot_ms") or {}
            lines.append(f"| {label} ({spec['parameter']} {side['values'].get(spec['parameter'])}) | "
                         f"{side.get('output_throughput') or 0:.1f} | {num(tpot.get('p50'))} | {num(tpot.get('p99'))} | "
                         f"{num(side.get('acceptance_rate'), '.2f')} | {num(side.get('mean_acceptance_length'), '.2f')} |")
    check = spec.get("lossless")
    if check:
        lines += ["", f"Lossless check: {check['identical']} of {check['prompts']} greedy answers identical with and "
                  f"without speculation ({'passed' if check['passed'] else 'failed'}; at least "
                  f"{check['min_identical']:.0%} needed)."]
        lines += [f"- prompt {d['prompt']}: parts at character {d['at_char']} of {d['of_chars']}: {d['with']!r} with, "
                  f"{d['without']!r} without" for d in check["diverged"][:5]]
    return lines


def num(value, spec: str = ".1f") -> str:
    """``value`` as ``spec`` formats it; "-" when there is none."""
    return "-" if value is None else format(value, spec)


def _p99(stat) -> str:
    return "-" if not stat else f"{stat['p99']:.1f}"


def plot(result: dict, path: Path) -> bool:
    """The trials' objective in order, the default's as a line; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    trials = result["trials"]
    colours = {"meets SLO": "tab:green", "misses SLO": "tab:orange", "measured": "tab:blue", "errors": "tab:red",
               "failed": "tab:gray"}
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(trials) + 2), 4))
    ax.bar(range(1, len(trials) + 1), [t["score"] for t in trials], color=[colours.get(t["verdict"], "k")
                                                                           for t in trials])
    defaults = [t["score"] for t in trials if t["values"] == result["default"]]
    if defaults:
        ax.axhline(sorted(defaults)[len(defaults) // 2], color="k", linestyle="--", label="default (median)")
    ax.set_xticks(range(1, len(trials) + 1))
    ax.set_xticklabels(["\n".join("default" if v is None else str(v) for v in t["values"].values()) for t in trials],
                       fontsize=7)
    ax.set_xlabel("trial (values of " + ", ".join(result["space"]) + ")")
    ax.set_ylabel(result["objective"] + (" (SIMULATED)" if result.get("simulated") else ""))
    ax.set_title(f"{result['engine']} launch tuning: {how(result)}")
    from matplotlib.patches import Patch

    handles = [Patch(color=c, label=v) for v, c in colours.items() if any(t["verdict"] == v for t in trials)]
    ax.legend(handles=ax.get_legend_handles_labels()[0] + handles, fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
