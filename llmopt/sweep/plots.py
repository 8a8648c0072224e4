"""PNG plots of a sweep: each gated eval's change against the model's size and measured speed, intervals drawn.

One plot per eval and x axis: x is the size of the artifact's model/ folder, or the output tokens/s
the variant's bench stage measured (only where variants were benchmarked); y the paired change of
the eval against the baseline (a perplexity change in %, other metrics in their units),
with the gate's confidence interval as an error bar. Variants that meet the constraints
are filled, the others hollow; the Pareto front is a line, the chosen variant a star.

Needs: matplotlib (the ``plots`` extra). Without it the report is written without plots.
"""

from __future__ import annotations

from pathlib import Path

from llmopt.sweep.report import MIB


def write_plots(report: dict, folder: Path) -> tuple[list[str], str | None]:
    """The plots' file names (relative to ``folder``), and why there are none when matplotlib is missing."""
    try:
        from matplotlib.figure import Figure  # not pyplot: no GUI backend, and a second faster to import
    except ImportError:
        return [], "matplotlib is not installed: no plots (pip install 'llmopt[plots]')"
    rows = [r for r in report["variants"] if "model_bytes" in r]
    timed = [r for r in rows if r.get("speed") is not None]
    names = sorted({g["name"] for r in rows for g in r["gates"]})
    written = []
    for name in names:
        for axis, axis_rows in (("size", rows), ("speed", timed)):
            if not axis_rows:
                continue
            path = folder / f"accuracy_vs_{axis}-{name}.png"
            _plot(Figure, report, axis_rows, name, path, AXES[axis])
            written.append(path.name)
    return written, None


# per x axis: the label, the value of a row, and the row key that marks its Pareto front
AXES = {
    "size": ("model/ size (MiB)", lambda row: row["model_bytes"] / MIB, "pareto"),
    "speed": ("measured output tokens/s (bench stage)", lambda row: row["speed"], "pareto_speed"),
}


def _point(row: dict, name: str):
    gate = next((g for g in row["gates"] if g["name"] == name), None)
    if gate is None or gate.get("delta") is None:
        return None
    scale = 100.0 if gate.get("metric") == "perplexity" else 1.0
    lo, hi = gate["ci"]
    return gate["delta"] * scale, lo * scale, hi * scale, gate.get("metric")


def _limit(rows: list[dict], name: str) -> float | None:
    """The gate's threshold on the plot's scale, where one threshold maps onto it: a perplexity's
    max_increase_pct, or a higher-is-better metric's max_drop (the same for every variant, else None)."""
    limits = set()
    for row in rows:
        gate = next((g for g in row["gates"] if g["name"] == name), None) or {}
        thresholds = gate.get("thresholds") or {}
        if gate.get("metric") == "perplexity" and "max_increase_pct" in thresholds:
            limits.add(thresholds["max_increase_pct"])
        elif gate.get("higher_is_better") and "max_drop" in thresholds:
            limits.add(-thresholds["max_drop"])
    return limits.pop() if len(limits) == 1 else None


def _plot(figure, report: dict, rows: list[dict], name: str, path: Path, axis: tuple) -> None:
    label, x_of, front_key = axis
    fig = figure(figsize=(7, 4.5), dpi=110)
    ax = fig.subplots()
    chosen = (report.get("chosen") or {}).get("id")
    metric = None
    front = []
    for row in rows:
        point = _point(row, name)
        if point is None:
            continue
        y, lo, hi, metric = point
        x = x_of(row)
        colour = "tab:green" if row.get("qualifies") else "tab:red"
        ax.errorbar([x], [y], yerr=[[y - lo], [hi - y]], fmt="o", color=colour, capsize=3,
                    markerfacecolor=colour if row.get("qualifies") else "white")
        ax.annotate(row["id"], (x, y), textcoords="offset points", xytext=(5, 4), fontsize=7)
        if row["id"] == chosen:
            ax.plot([x], [y], marker="*", markersize=16, color="gold", markeredgecolor="black", zorder=5)
        if row.get(front_key):
            front.append((x, y))
    if len(front) > 1:
        xs, ys = zip(*sorted(front))
        ax.plot(xs, ys, "--", color="grey", linewidth=1, label="Pareto front")
    ax.axhline(0.0, color="black", linewidth=0.6)
    limit = _limit(rows, name)
    if limit is not None:
        ax.axhline(limit, color="tab:red", linestyle=":", linewidth=1, label="gate threshold")
    if len(front) > 1 or limit is not None:
        ax.legend(loc="best", fontsize=8)
    unit = "%" if metric == "perplexity" else ""
    ax.set_xlabel(label)
    ax.set_ylabel(f"{name}: {metric or 'metric'} change vs baseline{f' ({unit})' if unit else ''}")
    what = label.split(" (")[0]
    ax.set_title(f"{report['recipe']['name']}: {name} against {what} (filled: meets the constraints)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
