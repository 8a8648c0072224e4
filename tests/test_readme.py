"""The README stays short and true: its recipe plans, its gate table is the quickstart record's as `llmopt run` prints
it, and every figure of its results table is the one in the record its row links (docs/runs/)."""

from __future__ import annotations

import json
import re

from conftest import ROOT
from test_shipped_recipes import anchors

README = (ROOT / "README.md").read_text()
RUNS = ROOT / "docs" / "runs"
MAX_WORDS = 850  # "about 800", code blocks and tables included (wc -w)


def record(name: str) -> dict:
    return json.loads((RUNS / name).read_text())


def deltas(report: dict, kind: str = "perplexity") -> list[float]:
    return [g["delta"] for g in report["gates"] if g["kind"] == kind]


def pct_range(values: list[float]) -> str:
    return f"+{min(values) * 100:.1f}% to +{max(values) * 100:.1f}%"


def mc(report: dict) -> dict:
    return next(g for g in report["gates"] if g["kind"] == "multiple_choice")


def serving_8b() -> list[str]:
    """Output tok/s at 64 in flight: FP8 and BF16 (the run without an SLO, as every other variant)."""
    def at_64(variant: str) -> float:
        found = [p for v in record("vllm-h200-serving-8b.json")["variants"] if v["variant"] == variant
                 for p in v["bench"]["points"] if p["load"]["value"] == 64]
        return found[0]["output_throughput"]
    return [f"FP8 {at_64('fp8-8b'):,.0f} against BF16 {at_64('bf16-8b-noslo'):,.0f} output tok/s"]


def ngram() -> list[str]:
    points = {(p["artifact"], p["dataset"]): p for p in record("h200-spec-bf16-fp8-draft.json")["points"]
              if p["concurrency"] == 1}
    off, on = points["bf16-off", "builtin:rewrite"], points["bf16-ngram4", "builtin:rewrite"]
    return [f"TPOT p50 {off['tpot_p50_ms']:.2f} -> {on['tpot_p50_ms']:.2f} ms",
            f"{on['acceptance_rate'] * 100:.0f}% of drafts accepted"]


def sweep() -> list[str]:
    timing = record("sweep-onnx-cpu-cpu-report.json")["timing"]
    return [f"{len(record('sweep-onnx-cpu-cpu-report.json')['variants'])} variants",
            f"{timing['wall_s'] / 60:.0f} minutes", f"{timing['overhead_pct']:.2f}% of it llmopt's own"]


def quality(name: str) -> list[str]:
    """The perplexity range over the domains, and the questions' change, of a report's gates."""
    report = record(name)
    found = [f"perplexity {pct_range(deltas(report))}"]
    if any(g["kind"] == "multiple_choice" for g in report["gates"]):
        gate = mc(report)
        found.append(f"questions {gate['baseline']:.3f} -> {gate['candidate']:.3f}" if name.startswith("quickstart")
                     else f"questions {gate['delta']:+.3f}")
    return found


# the record each row links -> the figures its row must show, computed from the record
FIGURES = {
    "quickstart-cpu-avx2-gptq-sens16-seed0-report.json": lambda: quality("quickstart-cpu-avx2-gptq-sens16-seed0-report.json"),
    "quickstart-gemma3-270m-cpu-report.json": lambda: quality("quickstart-gemma3-270m-cpu-report.json"),
    "levels-gguf-acc4-report.json": lambda: quality("levels-gguf-acc4-report.json"),
    "nvfp4a16-cpu-report.json": lambda: quality("nvfp4a16-cpu-report.json"),
    "prune-distill-onnx-cpu-h200-report.json": lambda: quality("prune-distill-onnx-cpu-h200-report.json"),
    "vllm-h200-serving-8b.json": serving_8b,
    "h200-spec-bf16-fp8-draft.json": ngram,
    "sweep-onnx-cpu-cpu-report.json": sweep,
}


def results_rows() -> list[str]:
    section = README.split("## Results", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ") and "docs/runs/" in line]


def test_the_readme_is_short():
    assert len(README.split()) <= MAX_WORDS


def test_the_readme_recipe_plans_cleanly(tmp_path):
    from llmopt import api

    path = tmp_path / "readme.toml"
    path.write_text(re.search(r"```toml\n(.*?)```", README, re.S).group(1))
    plan = api.plan(path)
    assert not plan.problems, [str(p) for p in plan.problems]


def test_the_gate_table_is_the_quickstart_record_as_llmopt_run_prints_it():
    import io

    from rich.console import Console

    from llmopt.cli.eval import print_gates

    out = io.StringIO()
    print_gates(Console(file=out, width=200, no_color=True), record("quickstart-cpu-avx2-gptq-sens16-seed0-report.json")["gates"])
    printed = [line.rstrip() for line in out.getvalue().splitlines()]
    rows = [line for line in printed if re.match(r" (eval|\w+ +(perplexity|acc) )", line)]
    shown = README.split("## What a run gives back", 1)[1]
    assert len(rows) == 7 and all(row in shown for row in rows), rows


def test_every_results_row_shows_the_figures_of_the_record_it_links():
    rows = results_rows()
    assert 1 <= len(rows) <= 8
    for row in rows:
        (name,) = re.findall(r"\(docs/runs/([\w.-]+)\)", row)
        assert name in FIGURES, f"a results row links {name}: add how to read its figures to FIGURES"
        for figure in FIGURES[name]():
            assert figure in row, f"{name}: {figure!r} not in the row: {row}"
        assert re.search(r"\| 20\d\d-\d\d-\d\d, ", row), f"a row says its date and machine: {row}"


def test_every_docs_link_of_the_readme_names_a_page_and_heading_that_exist():
    broken = []
    for page, anchor in re.findall(r"\]\((docs/[\w/.-]+)(?:#([\w-]+))?\)", README):
        target = ROOT / page
        if not target.exists() or (anchor and anchor not in anchors(target)):
            broken.append(f"{page}#{anchor}")
    assert not broken, broken
