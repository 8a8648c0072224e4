"""The sweep's report: one row per variant, the Pareto front, the chosen variant and why.

A row is read from the variant's artifact folder (``manifest.json``: stages with their
timing, gate verdicts with intervals; ``model/``: the files' sizes), so a variant run in
this process, in a worker process, on a Ray worker or in an earlier run of the sweep gives
the same row. Accuracy is the paired change of the accuracy eval against the baseline,
oriented as a loss (how much worse the candidate is: a perplexity increase, an accuracy
drop); the Pareto front minimises loss and the model's size over the variants that ran.
"""

from __future__ import annotations

import json
from pathlib import Path

from llmopt.artifacts.reports import fmt
from llmopt.sweep.variants import SweepPlan, Variant, toml_literal

SCHEMA_VERSION = 1
MIB = 1 << 20


def variant_row(sweep: SweepPlan, variant: Variant, result: dict | None) -> dict:
    """Everything the report says of one variant."""
    row = {"id": variant.id, "index": variant.index, "values": variant.values, "overrides": variant.overrides}
    if not variant.possible:
        return {**row, "status": "impossible", "reason": variant.reason(), "qualifies": False}
    row.update(status=result["status"], resumed=result.get("resumed", False), artifact=str(variant.plan.output_dir),
               seconds=result.get("seconds"), host=result.get("host"), pid=result.get("pid"))
    if result["status"] == "failed":
        error = result.get("error") or {}
        return {**row, "reason": f"{error.get('what', 'failed')}", "error": error, "qualifies": False}
    manifest = json.loads((variant.plan.output_dir / "manifest.json").read_text())
    stages = {s["name"]: s for s in manifest["stages"]}
    row["model_bytes"] = folder_bytes(variant.plan.output_dir / "model")
    row["compress_seconds"] = round(sum(s["timing"].get("seconds", 0.0) for n, s in stages.items()
                                        if n.startswith("compress.")), 2)
    row["bench"] = bench_figures(stages)
    row["speed"] = row["bench"]["output_tokens_per_s"] if row["bench"] else None
    row["gates"] = [{k: g.get(k) for k in ("name", "metric", "baseline", "candidate", "delta", "ci", "n",
                                           "higher_is_better", "verdict", "reason", "thresholds")} for g in manifest["gates"]]
    row["records"] = result["records"]
    return row


def bench_figures(stages: dict) -> dict | None:
    """What the variant's bench stage measured at [serve].workload (its one load point), or None without one."""
    stage = next((st for name, st in stages.items() if name.split(".")[0] == "bench"), None)
    points = ((stage or {}).get("outputs") or {}).get("points") or []
    if not points:
        return None
    point = points[0]

    def p(figure: str, q: str):
        return (point.get(figure) or {}).get(q)

    return {"output_tokens_per_s": point.get("output_throughput"), "ttft_p50_ms": p("ttft_ms", "p50"),
            "ttft_p99_ms": p("ttft_ms", "p99"), "tpot_p50_ms": p("tpot_ms", "p50"), "tpot_p99_ms": p("tpot_ms", "p99"),
            "goodput_requests_per_s": (point.get("goodput") or {}).get("requests_per_s"),
            "errors": sum((point.get("errors") or {}).values())}


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0


def loss(row: dict, eval_name: str | None) -> tuple[float | None, list]:
    """How much worse the candidate is on ``eval_name`` (point, interval), from the paired delta."""
    gate = next((g for g in row.get("gates", []) if g["name"] == eval_name), None)
    if gate is None or gate.get("delta") is None:
        return None, [None, None]
    sign = -1.0 if gate.get("higher_is_better", True) else 1.0
    lo, hi = gate.get("ci") or [None, None]
    bounds = sorted(sign * b for b in (lo, hi)) if lo is not None and hi is not None else [None, None]
    return sign * gate["delta"] + 0.0, bounds


def judge(rows: list[dict], sweep: SweepPlan) -> None:
    """Mark each finished row: whether it meets the constraints (and why not), and the Pareto front."""
    limits = sweep.settings.constraints
    for row in rows:
        if row["status"] in ("impossible", "failed"):
            row.setdefault("excluded", [row.get("reason", row["status"])])
            continue
        why = []
        if limits.gates:
            why += [f"gate {g['name']} failed" for g in row["gates"] if g["verdict"] == "fail"]
        if limits.max_model_mib is not None and row["model_bytes"] > limits.max_model_mib * MIB:
            why.append(f"model/ {row['model_bytes'] / MIB:.1f} MiB > max_model_mib {limits.max_model_mib:g}")
        if limits.max_compress_seconds is not None and row["compress_seconds"] > limits.max_compress_seconds:
            why.append(f"compress {row['compress_seconds']:.1f} s > max_compress_seconds "
                       f"{limits.max_compress_seconds:g}")
        why += speed_misses(row, limits)
        row["qualifies"], row["excluded"] = not why, why
    finished = [r for r in rows if "model_bytes" in r]
    front = pareto(finished, sweep.accuracy)
    timed = [r for r in finished if r.get("speed") is not None]
    speed_front = pareto(timed, sweep.accuracy, cost=lambda r: -r["speed"]) if timed else []
    for row in finished:
        row["pareto"] = row["id"] in front
        if timed:
            row["pareto_speed"] = row["id"] in speed_front


def speed_misses(row: dict, limits) -> list[str]:
    """The speed constraints a row misses (measured by its bench stage); all of them when it has no figures."""
    figures, why = row.get("bench") or {}, []
    for key, figure, most in (("max_ttft_p99_ms", "ttft_p99_ms", True), ("max_tpot_p99_ms", "tpot_p99_ms", True),
                              ("min_output_tokens_per_s", "output_tokens_per_s", False)):
        bound, value = getattr(limits, key), figures.get(figure)
        if bound is None:
            continue
        if value is None:
            why.append(f"no measured {figure} for {key}")
        elif (value > bound) if most else (value < bound):
            why.append(f"{figure} {value:.1f} {'>' if most else '<'} {key} {bound:g}")
    return why


def pareto(rows: list[dict], eval_name: str | None, cost=lambda r: r["model_bytes"]) -> list[str]:
    """Ids of the rows no other row beats on both cost (the model's size, or another cost such as minus the
    measured speed) and loss: no worse on one, better on the other."""
    points = {r["id"]: (cost(r), loss(r, eval_name)[0]) for r in rows}
    points = {k: (size, 0.0 if lost is None else lost) for k, (size, lost) in points.items()}

    def beaten(a):
        sa, la = points[a]
        return any(sb <= sa and lb <= la and (sb, lb) != (sa, la) for b, (sb, lb) in points.items() if b != a)

    return [r["id"] for r in rows if not beaten(r["id"])]


def choose(rows: list[dict], sweep: SweepPlan) -> dict | None:
    """The variant the objective picks among those that qualify, with why; None when none qualifies."""
    eval_name = sweep.accuracy
    ok = [r for r in rows if r.get("qualifies")]
    if not ok:
        return None

    def by_size(r):
        return (r["model_bytes"], _loss_key(r, eval_name), r["index"])

    def by_loss(r):
        return (_loss_key(r, eval_name), r["model_bytes"], r["index"])

    def by_speed(r):
        return (-(r.get("speed") or 0.0), _loss_key(r, eval_name), r["model_bytes"], r["index"])

    objective = sweep.settings.objective
    ranked = sorted(ok, key={"smallest": by_size, "most_accurate": by_loss, "fastest": by_speed}[objective])
    best = ranked[0]
    adjective = {"smallest": "smallest", "most_accurate": "most accurate", "fastest": "fastest"}[objective]
    why = [f"{best['id']} is the {adjective} of the {len(ok)} variant(s) that meet the constraints "
           f"({constraint_text(sweep)}): {figures_text(best, eval_name)}"]
    if len(ranked) > 1:
        why.append(f"next: {ranked[1]['id']} ({figures_text(ranked[1], eval_name)})")
    left_out = [r for r in rows if not r.get("qualifies")]
    if left_out:
        why.append("left out: " + "; ".join(f"{r['id']} ({', '.join(r['excluded'])})" for r in left_out))
    command = (f"llmopt run {sweep.loaded.path} " + " ".join(f"-s '{o}'" for o in best["overrides"])).strip()
    return {"id": best["id"], "why": why, "artifact": str(sweep.folder / "chosen"), "command": command,
            "overrides": best["overrides"]}


def figures_text(row: dict, eval_name: str | None) -> str:
    """A variant's size, accuracy and measured speed, as the choice's reasons quote them."""
    text = f"model/ {row['model_bytes'] / MIB:.2f} MiB"
    text += f", {accuracy_text(row, eval_name)}" if eval_name else ""
    return text + (f", {row['speed']:.1f} output tok/s" if row.get("speed") is not None else "")


def _loss_key(row: dict, eval_name: str | None) -> float:
    point = loss(row, eval_name)[0]
    return float("inf") if point is None and eval_name else (point or 0.0)


def constraint_text(sweep: SweepPlan) -> str:
    limits = sweep.settings.constraints
    parts = ["every gate passes"] if limits.gates else []
    if limits.max_model_mib is not None:
        parts.append(f"model/ <= {limits.max_model_mib:g} MiB")
    if limits.max_compress_seconds is not None:
        parts.append(f"compress <= {limits.max_compress_seconds:g} s")
    for key, text in (("max_ttft_p99_ms", "TTFT p99 <= {:g} ms"), ("max_tpot_p99_ms", "TPOT p99 <= {:g} ms"),
                      ("min_output_tokens_per_s", "output >= {:g} tok/s")):
        if getattr(limits, key) is not None:
            parts.append(text.format(getattr(limits, key)))
    return ", ".join(parts) or "none"


def accuracy_text(row: dict, eval_name: str | None) -> str:
    gate = next((g for g in row.get("gates", []) if g["name"] == eval_name), None)
    return f"{eval_name} {change(gate)}" if gate else f"{eval_name} not scored"


def change(gate: dict | None) -> str:
    """A gate's delta with its interval: a perplexity change in %, others in the metric's units."""
    if not gate or gate.get("delta") is None:
        return "-"
    lo, hi = gate.get("ci") or [None, None]
    if gate.get("metric") == "perplexity":
        return f"{gate['delta'] * 100:+.2f}% [{lo * 100:+.2f}, {hi * 100:+.2f}]"
    return f"{gate['delta']:+.4f} [{lo:+.4f}, {hi:+.4f}]"


def table(report: dict, timing: bool = True) -> tuple[list[str], list[list[str]]]:
    """The report's one table of all variants: a header and a row of text per variant. ``timing=False``
    leaves out what differs between two runs of the same variants (seconds, how stages were reused)."""
    axes = list(report["axes"])
    evals = sorted({g["name"] for r in report["variants"] for g in r.get("gates", [])})
    speed = any(r.get("speed") is not None for r in report["variants"])
    header = ["variant", *[short(a, axes) for a in axes], *[f"{e} change [interval]" for e in evals], "gates",
              "model/ MiB"]
    header += (["compress s"] if timing else []) + (["out tok/s"] if speed else [])
    header += (["stages ran / shared / cached"] if timing else []) + ["front"] + (["speed front"] if speed else [])
    header += ["chosen"]
    chosen = (report.get("chosen") or {}).get("id")
    rows = []
    for r in report["variants"]:
        gates = {g["name"]: g for g in r.get("gates", [])}
        line = [r["id"], *[cell(r["values"][a]) for a in axes], *[change(gates.get(e)) for e in evals],
                verdict(r), f"{r['model_bytes'] / MIB:.2f}" if "model_bytes" in r else "-"]
        line += ([fmt(r.get("compress_seconds"))] if timing else []) + ([fmt(r.get("speed"))] if speed else [])
        if timing:
            s = r.get("sharing") or {}
            line.append(f"{s.get('ran', 0)} / {s.get('shared', 0)} / {s.get('cached', 0)}" if s else "-")
        line += ["yes" if r.get("pareto") else ""] + (["yes" if r.get("pareto_speed") else ""] if speed else [])
        line += ["**yes**" if r["id"] == chosen else ""]
        rows.append(line)
    return header, rows


def verdict(row: dict) -> str:
    if row["status"] == "impossible":
        return "impossible"
    if row["status"] == "failed":
        return "stage failed"
    return "fail" if any(g["verdict"] == "fail" for g in row["gates"]) else "pass"


def cell(value) -> str:
    """An axis value in the table: a string bare, a table as key=value pairs, anything else as TOML."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return " ".join(f"{k}={cell(v)}" for k, v in value.items())
    return toml_literal(value)


def short(key: str, keys: list[str]) -> str:
    """An axis's column name: the last name in its key path (``group_size``), or the whole key when it ends
    in an index (``compress[0]``) or two axes end alike."""
    if key.endswith("]"):
        return key
    last = _last(key)
    return last if sum(_last(k) == last for k in keys) == 1 else key


def _last(key: str) -> str:
    return key.replace("]", "").split(".")[-1].split("[")[-1]


def markdown(report: dict) -> str:
    """report.md: the chosen variant and why, the table, the front, what was skipped, sharing and overhead."""
    name, chosen = report["recipe"]["name"], report.get("chosen")
    lines = [f"# llmopt sweep: {name}", "", f"{len(report['variants'])} variants of `{report['recipe']['path']}` "
             f"over {', '.join(f'`{a}`' for a in report['axes']) or 'no axis'}; objective: "
             f"{report['objective']}; accuracy: {report.get('accuracy') or 'none'}.", ""]
    if chosen:
        lines += [f"**Chosen: {chosen['id']}**", "", *[f"- {w}" for w in chosen["why"]], "",
                  f"Its artifact: `{chosen['artifact']}`; the same from the recipe: `{chosen['command']}`", ""]
    else:
        lines += ["**No variant meets the constraints.**", ""]
    header, rows = table(report)
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in rows]
    lines += ["", f"Pareto front (size and {report.get('accuracy') or 'no accuracy eval'}): "
              f"{', '.join(report['pareto']) or 'none'}.", ""]
    if report.get("pareto_speed") is not None:
        lines += [f"Pareto front (measured output tok/s and {report.get('accuracy') or 'no accuracy eval'}): "
                  f"{', '.join(report['pareto_speed']) or 'none'}.", ""]
    skipped = [r for r in report["variants"] if r["status"] in ("impossible", "failed")]
    if skipped:
        lines += ["## Not run or failed", "", *[f"- **{r['id']}** ({r['status']}): {r['reason']}" for r in skipped], ""]
    s, t = report["sharing"], report["timing"]
    lines += ["## Shared work", "", f"{s['stage_runs']} stages over all variants, {s['unique_stages']} distinct: "
              f"{s['ran']} ran, {s['shared']} came from another variant of this sweep, {s['cached']} were in the "
              f"cache before it, {s['same']} repeated another stage of the same variant.", "",
              "## Time", "", f"Wall {t['wall_s']:.1f} s; the sweep's own work (planning {t['plan_s']:.2f} s, "
              f"scheduling {t['schedule_s']:.2f} s, workers planning again {t['worker_plan_s']:.2f} s, report "
              f"{t['report_s']:.2f} s) {t['overhead_s']:.2f} s = {t['overhead_pct']:.2f}% of the wall time.", ""]
    lines += [f"![{p}]({p})" for p in report.get("plots", [])]
    return "\n".join(lines).rstrip() + "\n"


def write(folder: Path, report: dict) -> None:
    """report.json and report.md in the sweep's folder (each written whole, then renamed)."""
    from llmopt.store.cache import write_json

    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / "report.json", report)
    tmp = folder / ".report.md.tmp"
    tmp.write_text(markdown(report))
    tmp.replace(folder / "report.md")
