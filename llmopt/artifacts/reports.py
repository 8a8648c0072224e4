"""Reports of a run: report.json, a markdown summary, JUnit XML and the model card.

``report.json`` has a stable schema (``schema_version``, described by
``REPORT_JSON_SCHEMA``); each gate names the per-example score files of its
baseline and candidate (``scores``, relative to report.json), so that ``llmopt
gate`` can judge the same pairs again with other thresholds. ``junit.xml`` holds
one test case per gate so CI systems show each gate; when ``GITHUB_STEP_SUMMARY``
is set the markdown summary is appended to it.
"""

from __future__ import annotations

import os
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

from llmopt.store.cache import write_json
from llmopt.output import human_size

REPORT_SCHEMA = 1
_NUMBER = {"type": ["number", "null"]}
REPORT_JSON_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "llmopt report.json",
    "type": "object",
    "required": ["schema_version", "recipe", "recipe_sha256", "evals", "gates", "passed"],
    "properties": {
        "schema_version": {"const": REPORT_SCHEMA},
        "recipe": {"type": "string"},
        "recipe_sha256": {"type": "string"},
        "passed": {"type": "boolean"},
        "bench": {"type": "object", "required": ["engine", "workload", "slo", "options", "points", "files"],
                  "description": "the bench stage's figures per load point (recipes with [bench] enabled)"},
        "tune": {"type": "object", "required": ["tuned", "engine", "files"],
                 "description": "the tune stage's verdict: default and winner with their figures (recipes with [tune] "
                 "enabled; of several engines, the chosen one's)"},
        "choice": {"type": "object", "required": ["engine", "measured", "objective", "reason", "engines"],
                   "description": "the engine the artifact is served with, why, and every engine's line: measured or "
                   "not (and why), tuned values, score and figures (recipes listing several engines in [serve] "
                   "backend)"},
        "evals": {"type": "object", "additionalProperties": {
            "type": "object", "required": ["metric", "value", "higher_is_better", "n", "scores"],
            "properties": {"metric": {"type": "string"}, "value": {"type": "number"}, "higher_is_better": {"type": "boolean"},
                           "n": {"type": "integer", "minimum": 0}, "scores": {"type": "string"}}}},
        "gates": {"type": "array", "items": {
            "type": "object", "required": ["name", "kind", "metric", "n", "delta", "ci", "verdict", "reason"],
            "properties": {
                "name": {"type": "string"}, "kind": {"type": "string"}, "metric": {"type": "string"},
                "n": {"type": "integer", "minimum": 0}, "baseline": _NUMBER, "candidate": _NUMBER, "delta": _NUMBER,
                "ci": {"type": "array", "items": _NUMBER, "minItems": 2, "maxItems": 2},
                "method": {"enum": ["score", "bootstrap"]}, "confidence": {"type": "number"},
                "gate_on": {"enum": ["interval", "point"]}, "higher_is_better": {"type": "boolean"},
                "verdict": {"enum": ["pass", "fail", "no-gate"]}, "reason": {"type": "string"},
                "undecided": {"type": "boolean"}, "thresholds": {"type": "object"},
                "domain": {"type": ["string", "null"]},
                "scores": {"type": "object", "required": ["baseline", "candidate"],
                           "properties": {"baseline": {"type": "string"}, "candidate": {"type": "string"}}},
            }}},
    },
}


def write_all(folder: Path, plan, manifests: dict, gates: list[dict]) -> dict:
    """Copy each eval stage's per-example scores next to the reports, then write them."""
    folder.mkdir(parents=True, exist_ok=True)
    evals = {}
    for stage in [s for s in plan.stages if s.kind == "eval"]:
        outputs = manifests[stage.name]["outputs"]
        if outputs.get("scores"):  # report.json names the copy, not the file in the stage's cache folder
            shutil.copy2(plan.cache.path(stage.key) / outputs["scores"], folder / f"{stage.name}.scores.jsonl")
            outputs = outputs | {"scores": f"{stage.name}.scores.jsonl"}
        evals[stage.name] = outputs
    bench = copy_bench(folder, plan, manifests)
    tunes = copy_tune(folder, plan, manifests)
    choice = chosen(plan, manifests, tunes)
    tune = tunes[choice["engine"]] if choice else next(iter(tunes.values()), None)
    training = copy_training(folder, plan, manifests)
    return write_reports(folder, plan.recipe.recipe.name, plan.recipe.digest, evals, with_score_files(folder, gates),
                         bench, tune, training, choice)


def copy_stage_files(folder: Path, plan, stage, names, subdir: str, prefix: str = "") -> dict[str, str]:
    """The files ``names`` (relative to the stage's cache folder; None skipped) that exist, copied to
    ``folder/subdir`` as ``prefix`` + their file name; returns {name: the copy's path relative to ``folder``}."""
    (folder / subdir).mkdir(parents=True, exist_ok=True)
    copied = {}
    for name in names:
        source = plan.cache.path(stage.key) / name if name else None
        if source is not None and source.is_file():
            copied[name] = f"{subdir}/{prefix}{source.name}"
            shutil.copy2(source, folder / copied[name])
    return copied


TRAINING_DIR = "training"  # training stages' loss histories and curves, under reports/


def copy_training(folder: Path, plan, manifests: dict) -> dict:
    """Each training stage's (distill) loss history and curve copied to ``folder/training`` as
    ``<stage>.loss.json`` / ``<stage>.loss.png``; returns its figures by stage name for the reports."""
    out = {}
    for stage in plan.stages:
        training = (manifests.get(stage.name, {}).get("outputs") or {}).get("training")
        if stage.kind != "compress" or not training:
            continue
        named = {what: training.get(what) for what in ("history", "plot")}
        copied = copy_stage_files(folder, plan, stage, named.values(), TRAINING_DIR, prefix=f"{stage.name}.")
        out[stage.name] = {k: v for k, v in training.items() if k not in named} | {
            what: copied[name] for what, name in named.items() if name in copied}
    return out


def training_markdown(training: dict) -> str:
    """The training stages' section of report.md: loss at the first and last step, and the curve."""
    lines = ["", "## Training", ""]
    for name, t in training.items():
        lines.append(f"- **{name}**: loss {fmt(t.get('loss_first'))} -> {fmt(t.get('loss_last'))} over {t.get('steps')} "
                     f"steps ({t.get('seconds')} s" + (f", resumed from step {t['resumed_from']}" if t.get("resumed_from")
                                                       else "") + ")")
        lines.append(f"  ![loss of {name}]({t['plot']})" if t.get("plot") else f"  {t.get('plot_note', 'no loss curve')}")
    return "\n".join(lines) + "\n"


BENCH_DIR = "bench"  # the bench stage's files, under reports/


def bench_files(files: dict) -> dict:
    """The bench stage's file names as the artifact's reports hold them (relative to reports/)."""
    return {k: ([f"{BENCH_DIR}/{p}" for p in v] if isinstance(v, list) else f"{BENCH_DIR}/{v}")
            for k, v in files.items()}


def copy_bench(folder: Path, plan, manifests: dict) -> dict | None:
    """The bench stage's bench.json, bench.md, requests, server log and plots copied to ``folder/bench``;
    returns its figures for report.json, or None without a bench stage."""
    stage = next((s for s in plan.stages if s.kind == "bench"), None)
    if stage is None:
        return None
    outputs = manifests[stage.name]["outputs"]
    files = outputs.get("files", {})
    copy_stage_files(folder, plan, stage, [v for v in files.values() if isinstance(v, str)] + files.get("plots", []),
                     BENCH_DIR)
    return {k: v for k, v in outputs.items() if k != "files"} | {"stage": stage.key, "files": bench_files(files)}


TUNE_DIR = "tune"  # the tune stage's files, under reports/


def copy_tune(folder: Path, plan, manifests: dict) -> dict[str, dict]:
    """The tune stage's tuning.json and plot copied to ``folder/tune`` (with several engines, each tune stage's to
    ``folder/tune/<engine>``); each one's outputs by engine ({} without one)."""
    stages = plan.kind("tune")
    out = {}
    for stage in stages:
        subdir = TUNE_DIR if len(stages) == 1 else f"{TUNE_DIR}/{stage.backend}"
        outputs = manifests[stage.name]["outputs"]
        files = outputs.get("files", {})
        copy_stage_files(folder, plan, stage, [files.get("json"), files.get("plot")], subdir)
        out[stage.backend] = {k: v for k, v in outputs.items() if k != "files"} | {
            "stage": stage.key, "files": {k: f"{subdir}/{v}" for k, v in files.items() if k != "deploy"}}
    return out


def chosen(plan, manifests: dict, tunes: dict[str, dict]) -> dict | None:
    """The choose stage's outputs (several engines: the one served, why, every engine's line with its tuning files
    from ``tunes``), or None without one."""
    stage = next(iter(plan.kind("choose")), None)
    if stage is None:
        return None
    outputs = manifests[stage.name]["outputs"]
    lines = [x | {"files": tunes[x["engine"]]["files"]} for x in outputs["engines"]]
    return outputs | {"engines": lines, "stage": stage.key}


def with_score_files(folder: Path, gates: list[dict]) -> list[dict]:
    """Gate records naming their per-example score files (relative to ``folder``), which
    ``llmopt gate`` reads to judge the same pairs again with other thresholds."""
    out = []
    for g in gates:
        files = {role: f"eval.{g['name']}.{role}.scores.jsonl" for role in ("baseline", "candidate")}
        out.append(dict(g, scores=files) if all((folder / f).is_file() for f in files.values()) else dict(g))
    return out


def named_files(report: dict) -> list[str]:
    """Every file a report.json names, relative to its folder: the evals' and gates' per-example scores, the bench and
    tune stages' files and plots, the training stages' loss histories and curves."""
    names = [e["scores"] for e in report.get("evals", {}).values() if isinstance(e.get("scores"), str)]
    names += [name for g in report.get("gates", []) for name in g.get("scores", {}).values()]
    for section in ("bench", "tune"):
        for value in (report.get(section) or {}).get("files", {}).values():
            names += value if isinstance(value, list) else [value]
    names += [name for x in (report.get("choice") or {}).get("engines", []) for name in x.get("files", {}).values()]
    names += [t[k] for t in (report.get("training") or {}).values() for k in ("history", "plot") if t.get(k)]
    return names


def copy_named_files(report: dict, source: Path, folder: Path) -> None:
    """The files ``report`` names (score files, plots, bench / tune / training files) copied from ``source`` to
    ``folder``, so that the links of a report re-judged into another folder resolve. A name that leaves the
    report's folder is not followed; one the original folder lacks stays missing, as it was there."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in named_files(report):
        src, dst = source / name, folder / name
        if Path(name).is_absolute() or ".." in Path(name).parts or not src.is_file() or src.resolve() == dst.resolve():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)


def write_reports(folder: Path, name: str, recipe_sha256: str, evals: dict, gates: list[dict],
                  bench: dict | None = None, tune: dict | None = None, training: dict | None = None,
                  choice: dict | None = None) -> dict:
    """report.json, report.md and junit.xml in ``folder``; the summary also goes to GITHUB_STEP_SUMMARY.
    ``bench``: the bench stage's figures, ``training``: the training stages' losses, ``choice``: the engine chosen
    of several, sections of both reports."""
    folder.mkdir(parents=True, exist_ok=True)
    report = {
        "schema_version": REPORT_SCHEMA,
        "recipe": name,
        "recipe_sha256": recipe_sha256,
        "evals": evals,
        "gates": gates,
        "passed": all(g["verdict"] != "fail" for g in gates),
    }
    if bench is not None:
        report["bench"] = bench
    if tune is not None:
        report["tune"] = tune
    if choice is not None:
        report["choice"] = choice
    if training:
        report["training"] = training
    write_json(folder / "report.json", report)
    summary = markdown(name, gates, evals) + (bench_markdown(bench) if bench else "")
    summary += (choice_markdown(choice) if choice else "") + (tune_markdown(tune) if tune else "")
    summary += training_markdown(training) if training else ""
    (folder / "report.md").write_text(summary)
    (folder / "junit.xml").write_text(junit(name, gates))
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        with open(step_summary, "a", encoding="utf-8") as f:
            f.write(summary + "\n")
    return report


def fmt(value, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def gate_rows(gates: list[dict]) -> list[list[str]]:
    rows = []
    for g in gates:
        lo, hi = g.get("ci") or [None, None]
        delta = g.get("delta")
        if g.get("metric") == "perplexity" and delta is not None:
            shown = f"{delta * 100:+.2f}%"
            ci = f"[{lo * 100:+.2f}%, {hi * 100:+.2f}%]"
        else:
            shown = f"{delta:+.4f}" if delta is not None else "-"
            ci = f"[{lo:+.4f}, {hi:+.4f}]" if lo is not None else "-"
        rows.append([g["name"], g.get("metric", "-"), fmt(g.get("baseline")), fmt(g.get("candidate")), shown, ci,
                     str(g.get("n", 0)), g["verdict"].upper()])
    return rows


HEADER = ["eval", "metric", "baseline", "candidate", "delta", "interval", "n", "verdict"]


def relative_change(g: dict) -> float | None:
    """The candidate's change relative to the baseline: perplexity's delta is relative already."""
    delta, base = g.get("delta"), g.get("baseline")
    if delta is None:
        return None
    if g.get("metric") == "perplexity":
        return delta
    return delta / abs(base) if base else None


def across_domains(gates: list[dict]) -> str | None:
    """One line with the relative change of each metric across the evals' domains, when there are several:
    "+24% here, +47% there" without reading the table."""
    lines = []
    for metric in dict.fromkeys(g.get("metric") for g in gates):
        rows = [(relative_change(g), g.get("domain") or g["name"]) for g in gates if g.get("metric") == metric]
        rows = sorted((r for r in rows if r[0] is not None), key=lambda r: r[0])
        if len(rows) < 2 or len({d for _, d in rows}) < 2:
            continue
        spread = (rows[-1][0] - rows[0][0]) * 100
        shown = ", ".join(f"{r * 100:+.1f}% {d}" for r, d in rows)
        lines.append(f"{metric} across {len(rows)} domains: {shown} (spread {spread:.1f} points)")
    return "; ".join(lines) or None


def markdown(name: str, gates: list[dict], evals: dict | None = None) -> str:
    lines = [f"## llmopt accuracy gates: {name}", ""]
    if not gates:
        if not evals:
            return "\n".join(lines + ["No evals in this recipe.", ""])
        lines += ["No gates: the model was scored alone.", "", "| eval | metric | value | n |", "|---|---|---|---|"]
        lines += [f"| {stage} | {o.get('metric', '-')} | {fmt(o.get('value'))} | {o.get('n', '-')} |" for stage, o in evals.items()]
        return "\n".join(lines) + "\n"
    lines.append("| " + " | ".join(HEADER) + " |")
    lines.append("|" + "---|" * len(HEADER))
    lines += ["| " + " | ".join(row) + " |" for row in gate_rows(gates)]
    lines.append("")
    spread = across_domains(gates)
    if spread:
        lines += [f"Relative change by domain: {spread}.", ""]
    lines += [f"- **{g['name']}**" + (f" ({g['domain']})" if g.get("domain") else "") + f": {g.get('reason', '')}"
              for g in gates]
    return "\n".join(lines) + "\n"


BENCH_HEADER = ["load", "ok / sent", "req/s", "output tok/s", "TTFT p50 / p99 ms", "TPOT p50 / p99 ms",
                "ITL p50 / p99 ms", "goodput req/s", "errors"]


def bench_markdown(bench: dict) -> str:
    """The serving benchmark's section of report.md: one row per load point."""
    from llmopt.bench.report import requests_line, split_table, workload_line

    slo = {k: v for k, v in (bench.get("slo") or {}).items() if v is not None}
    lines = ["", f"## Serving benchmark: {bench.get('engine')}", "",
             f"Workload: {workload_line(bench)}; SLO: "
             f"{', '.join(f'{k} <= {v:g}' for k, v in slo.items()) or 'none'}; "
             f"{requests_line(bench['options']['requests'])} after {bench['options']['warmup']} warm-up, "
             f"{bench['options']['repeats']} repeat(s) "
             f"(medians). Files: reports/{BENCH_DIR}/.", "",
             "| " + " | ".join(BENCH_HEADER) + " |", "|" + "---|" * len(BENCH_HEADER)]

    def ms(stat):
        return "-" if not stat else f"{stat['p50']:.1f} / {stat['p99']:.1f}"

    for p in bench["points"]:
        load = p["load"]
        good = p.get("goodput")
        cells = [f"c={load['value']:g}" if load["kind"] == "concurrency" else f"{load['value']:g} req/s",
                 f"{p['requests']['ok']} / {p['requests']['sent']}", f"{p['request_throughput']:.2f}",
                 f"{p['output_throughput']:.1f}", ms(p["ttft_ms"]), ms(p["tpot_ms"]), ms(p["itl_ms"]),
                 f"{good['requests_per_s']:.2f} ({good['fraction']:.0%})" if good else "-",
                 ", ".join(f"{k} {n}" for k, n in p["errors"].items()) or "-"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += split_table(bench.get("split"))
    return "\n".join(lines) + "\n"


def tune_markdown(tune: dict) -> str:
    from llmopt.tune.report import markdown

    return markdown(tune)


def choice_markdown(choice: dict) -> str:
    from llmopt.tune.choose import markdown

    return markdown(choice)


def junit(name: str, gates: list[dict]) -> str:
    failures = sum(g["verdict"] == "fail" for g in gates)
    suite = ET.Element("testsuite", name=f"llmopt.{name}", tests=str(len(gates)), failures=str(failures))
    for g in gates:
        case = ET.SubElement(suite, "testcase", classname=f"llmopt.{name}", name=g["name"])
        if g["verdict"] == "fail":
            failure = ET.SubElement(case, "failure", message=g.get("reason", "gate failed"))
            failure.text = f"delta={g.get('delta')} ci={g.get('ci')} n={g.get('n')}"
        elif g["verdict"] == "no-gate":
            ET.SubElement(case, "skipped", message="no threshold set")
    return ET.tostring(ET.ElementTree(suite).getroot(), encoding="unicode", xml_declaration=True)


def tables_note(manifest: dict) -> str:
    """How an ONNX export gathers its token embeddings (``onnx_embedding.describe``), for the card."""
    embed = next((s["outputs"].get("embedding") for s in manifest.get("stages", [])
                  if s.get("outputs", {}).get("embedding")), None)
    if not embed or not embed.get("op"):
        return ""
    shared = ", the LM head's" if embed.get("shared_with_lm_head") else ""
    if embed["op"] == "Gather":
        return f"; embedding table float{shared}"
    return f"; embedding table int{embed['bits']} GatherBlockQuantized, blocks of {embed['block_size']}{shared}"


def draft_markdown(draft: dict, methods: list[str]) -> str:
    """The card's section on the draft [[draft]] made and its acceptance (``llmopt.bench.acceptance``)."""
    positions = ", ".join(f"{p:.0%}" for p in draft.get("per_position") or [])
    return "\n".join([
        "## Draft model for speculative decoding", "",
        f"- made from the source by {', '.join(methods)}, in `draft/`: {draft['draft_parameters'] / 1e6:,.0f}M "
        f"parameters against the served model's {draft['target_parameters'] / 1e6:,.0f}M",
        f"- accepted by the served model, greedy, {draft['num_tokens']} tokens drafted a step ({draft['prompts']} "
        f"prompts of {draft['dataset']}, {draft['answer_tokens']:,} answer tokens): acceptance rate "
        f"{draft['acceptance_rate']:.1%}, mean acceptance length {draft['mean_acceptance_length']:.2f} (by draft "
        f"position: {positions})", ""])


def launch_markdown(deploy: dict) -> list[str]:
    """The card's Launch section: the engine's command; where that command alone does not read every file of
    deploy/<engine>/ (ort: its genai_config.json, with the session options), the launch script first."""
    if not deploy.get("command"):
        return []
    lines = ["## Launch", ""]
    launch = deploy.get("launch")
    if launch and launch != deploy["command"]:
        lines += ["```sh", launch, "```", "",
                  f"The script serves with the files of `{launch.rsplit('/', 1)[0]}/`, which the command below "
                  "does not read by itself; its header says where it listens and how it takes an API key "
                  "(docs/deploy.md). The command:", ""]
    lines += ["```sh", deploy["command"], "```", ""]
    if deploy.get("served_model_name"):
        lines += [f"The server answers to `model=\"{deploy['served_model_name']}\"`.", ""]
    return lines


def card(plan, manifest: dict, gates: list[dict]) -> str:
    recipe = plan.recipe.recipe
    steps = ", ".join(f"{s.method}" for s in recipe.compress) or "none"
    est = plan.estimates
    lines = [
        f"# {recipe.name}",
        "",
        recipe.description or "",
        "",
        "## Compression card",
        "",
        f"- source: `{recipe.model.source}` (fingerprint `{(manifest['source']['fingerprint'] or '')[:16]}`)",
        f"- compression: {steps}",
        f"- export format: {recipe.export.format}" + tables_note(manifest),
        f"- calibration: {recipe.calibration.data}, {recipe.calibration.samples} x {recipe.calibration.max_seq_len} tokens"
        + (f" (sha256 `{manifest['calibration_sha256'][:16]}`)" if manifest.get("calibration_sha256") else ""),
        f"- model folder: {human_size(est.get('model_bytes_before'))} -> {human_size(est.get('artifact_bytes'))} estimated"
        + (f", {human_size(manifest['model_bytes'])} written" if manifest.get("model_bytes") is not None else ""),
        f"- target: {plan.gpu.name if plan.gpu else 'CPU'}",
        f"- recipe sha256: `{plan.recipe.digest[:16]}`",
        "",
        "## Accuracy",
        "",
        markdown(recipe.name, gates),
    ]
    if manifest.get("draft"):
        lines.append(draft_markdown(manifest["draft"], [s.method for s in recipe.draft]))
    if manifest.get("bench"):
        lines.append(bench_markdown(manifest["bench"]).lstrip("\n"))
    if manifest.get("choice"):
        lines.append(choice_markdown(manifest["choice"]).lstrip("\n"))
    if manifest.get("tune"):
        lines.append(tune_markdown(manifest["tune"]).lstrip("\n"))
    lines += launch_markdown(manifest.get("deploy") or {})
    digest = {"blake3": "BLAKE3 (what `b3sum` prints)", "sha256": "SHA-256 (what `sha256sum` prints)"}[recipe.output.checksum]
    lines += [f"Every file's {digest} is in `manifest.json`; `llmopt verify <this folder>` checks them.", ""]
    return "\n".join(lines)
