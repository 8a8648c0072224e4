"""The Python API: what the CLI, the tests and notebooks call."""

from __future__ import annotations

import platform
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from llmopt import registry
from llmopt.libraries import package_version
from llmopt.catalog.gpus import CATALOG
from llmopt.errors import Problem, RecipeError, UsageError
from llmopt.output import Output
from llmopt.plan import Plan, build_plan, unchecked_without_facts
from llmopt.recipe import LoadedRecipe, load_recipe
from llmopt.run.runner import RunResult, run_plan

RECIPES_DIR = Path(__file__).parent / "recipes"
EXTRAS = {
    "compress": ["llmcompressor", "compressed-tensors", "datasets"],
    "modelopt": ["nvidia-modelopt"],
    "ort": ["onnxruntime", "onnxruntime-genai", "onnx"],
    "eval": ["lm-eval"],
    "serve": ["fastapi", "uvicorn"],
    "plots": ["matplotlib"],
    "ray": ["ray"],
}
ENGINES = {"vllm": "vllm", "trtllm": "trtllm-serve", "sglang": "sglang", "llama.cpp": "llama-server"}


@dataclass
class Validation:
    """What `validate` found in a valid recipe."""

    loaded: LoadedRecipe
    warnings: list[Problem]  # of the checks that ran
    unchecked: list[str]  # the checks that need model facts, which `plan` runs


def validation(path: str | Path, overrides=()) -> Validation:
    """Every check that needs no model facts: the recipe's keys, types, catalogue names and backend
    options, each backend's plan-time check and the rules across stages, with the model unread (no
    config.json, weights or hub). Raises RecipeError listing every problem found."""
    from llmopt.sweep.variants import axis_problems

    loaded = load_recipe(path, overrides)
    the_plan = build_plan(loaded, facts=False)
    the_plan.problems += axis_problems(loaded, overrides, facts=False)
    if the_plan.errors:
        count = len(the_plan.errors)
        raise RecipeError(f"{loaded.path}: {count} problem{'s' if count > 1 else ''} in the recipe",
                          problems=the_plan.errors, fix="edit the recipe (`llmopt schema` describes every key)")
    # a check's own "model facts unknown" note repeats what `unchecked` lists
    warnings = [p for p in the_plan.problems if not p.message.startswith("model facts unknown")]
    return Validation(loaded, warnings, unchecked_without_facts(loaded, source=True))


def validate(path: str | Path, overrides=()) -> LoadedRecipe:
    """The recipe, once `validation` found no problem in it."""
    return validation(path, overrides).loaded


def plan(path: str | Path, overrides=(), cache_dir=None, output_dir=None, strict: bool = False) -> Plan:
    """The recipe's plan; a recipe with [sweep.axes] also has each variant's problems (``axis_problems``)."""
    from llmopt.sweep.variants import axis_problems

    loaded = load_recipe(path, overrides)
    the_plan = build_plan(loaded, cache_dir, output_dir, strict=strict)
    the_plan.problems += axis_problems(loaded, overrides, cache_dir, strict=strict)
    return the_plan


def run(path: str | Path, overrides=(), force=None, cache_dir=None, output_dir=None, out: Output | None = None,
        strict: bool = False) -> RunResult:
    # `llmopt run` builds the recipe as written: its [sweep] is `llmopt sweep`'s, and not planned here
    return run_plan(build_plan(load_recipe(path, overrides), cache_dir, output_dir, strict=strict), out, force)


def sweep_plan(path: str | Path, overrides=(), axes=(), cache_dir=None, output_dir=None, strict: bool = False):
    """Every variant of a sweep planned, nothing run (``llmopt sweep --dry-run``): a ``SweepPlan``. Raises
    RecipeError when no variant can run, or with ``strict`` when any cannot."""
    from llmopt.sweep import plan_sweep

    return plan_sweep(Path(path), overrides, axes, cache_dir, output_dir, strict)


def sweep(path: str | Path, overrides=(), axes=(), cache_dir=None, output_dir=None, strict: bool = False,
          jobs: int = 1, executor: str = "local", address: str | None = None, out: Output | None = None):
    """Plan every variant of the recipe's [sweep] (and ``axes``, ``KEY=V1,V2`` strings), run those that can
    run on one shared cache (``executor`` "local": ``jobs`` processes, 1 = this one; "ray": Ray tasks on a
    local cluster or the one at ``address``), write the report and the chosen variant's artifact under
    ``output_dir`` (default sweeps/<name>). Returns a ``SweepResult``; raises GateFailed (exit 3, after
    writing everything) when no variant meets the constraints."""
    import time

    from llmopt.sweep import run_sweep

    started = time.monotonic()
    the_plan = sweep_plan(path, overrides, axes, cache_dir, output_dir, strict)
    return run_sweep(the_plan, out or Output("quiet"), executor, jobs, address, started)


def shipped_recipes() -> list[dict]:
    out = []
    for path in sorted(RECIPES_DIR.glob("*.toml")):
        first = next((line for line in path.read_text().splitlines() if line.startswith("#")), "#")
        out.append({"name": path.stem, "path": str(path), "purpose": first.lstrip("# ").strip()})
    return out


def copy_recipe(name: str, dest: str | Path | None = None) -> Path:
    names = [r["name"] for r in shipped_recipes()]
    if name not in names:
        import difflib

        close = difflib.get_close_matches(name, names, n=1)
        raise UsageError(f"no shipped recipe named {name!r}", fix=(f"did you mean {close[0]!r}? " if close else "") + f"choose one of: {', '.join(names)}")
    target = Path(dest) if dest else Path(f"{name}.toml")
    if target.is_dir():
        target = target / f"{name}.toml"
    return write_new(target, (RECIPES_DIR / f"{name}.toml").read_text(encoding="utf-8"))


def write_new(target: Path, text: str) -> Path:
    """``text`` in a new file ``target``, its folders made; a UsageError where it exists or cannot be written."""
    if target.exists():
        raise UsageError(f"{target} already exists", fix="choose another path or remove the file")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "x", encoding="utf-8") as file:
            file.write(text)
    except OSError as exc:
        raise UsageError(f"cannot write {target}: {exc.strerror or exc}", fix="pass a path you can write") from None
    return target


STARTER = """\
# {name}: a starter recipe written by `llmopt init`; `llmopt schema` lists every key.
schema_version = 1
name = "{name}"

[model]
source = "{source}"      # hub id, local folder, .gguf file, or builtin:smollm2-135m

[calibration]
data = "builtin:mix"     # the text compression calibrates on, kept apart from the eval's (`llmopt ls data`)
samples = 16
max_seq_len = 256

# Uncomment one [[compress]] table (`llmopt ls backends` lists the methods).
# 8-bit weights: about +0.2% prose perplexity on the demo model, inside the gate below.
# [[compress]]
# method = "gptq"
# scheme = "W8A16"
# group_size = 64

# 4-bit weights, the quickstart's settings: +4% to +9% on the demo model, so raise the gate to 20%.
# [[compress]]
# method = "gptq"
# group_size = 32
# symmetric = false
# sensitive_layers = 16

# Perplexity on held-out prose, the compressed model against the source: above +5% the run exits 3.
[[eval]]
name = "prose"
kind = "perplexity"
max_increase_pct = 5
"""


def init(dest: str | Path, name: str = "my-recipe", source: str = "builtin:smollm2-135m") -> Path:
    return write_new(Path(dest), STARTER.format(name=name, source=source))


def json_schema() -> dict:
    """The recipe's JSON Schema (draft 2020-12), with every registered backend's options."""
    from llmopt.recipe.jsonschema import json_schema as recipe_json_schema

    return recipe_json_schema()


def backends() -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for kind, by_name in registry.all_backends().items():
        out[kind] = [
            {"name": name, "extra": cls.extra, "summary": summary(sys.modules[cls.__module__].__doc__)}
            for name, cls in by_name.items()
        ]
    return out


def summary(doc: str | None) -> str:
    """The first sentence of a docstring, however many lines it spans."""
    paragraph = " ".join((doc or "").strip().split("\n\n")[0].split())
    match = re.match(r"(.+?[.!?])(\s|$)", paragraph)
    return match.group(1) if match else paragraph


def gpus() -> list[dict]:
    return [g.to_dict() for g in CATALOG]


def builtin_data() -> list[dict]:
    """The data sets shipped with llmopt: name, role (calibration, eval, or workload: a text workload for
    [serve.workload] dataset and `llmopt bench --dataset`), domain, what it holds."""
    from llmopt import data
    from llmopt.data import workloads

    return [{"name": f"builtin:{name}", "role": b.role, "domain": b.domain, "about": b.about}
            for name, b in data.BUILTIN.items()] + [
        {"name": f"builtin:{name}", "role": "workload", "domain": w.domain, "about": w.about}
        for name, w in workloads.WORKLOADS.items()]


def doctor() -> dict:
    report: dict = {"python": platform.python_version(), "platform": platform.platform(), "torch": None, "cuda": None, "gpus": []}
    try:
        import torch

        report["torch"] = torch.__version__
        report["cuda"] = torch.version.cuda if torch.cuda.is_available() else None
        report["gpus"] = [
            {"name": torch.cuda.get_device_name(i), "cc": ".".join(map(str, torch.cuda.get_device_capability(i))),
             "memory_gib": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1)}
            for i in range(torch.cuda.device_count())
        ]
    except ImportError:
        pass
    report["extras"] = {
        extra: {dist: package_version(dist) for dist in dists} for extra, dists in EXTRAS.items()
    }
    report["engines"] = {name: shutil.which(exe) for name, exe in ENGINES.items()}
    return report


def bench(target: str | Path, workload: dict | None = None, slo: dict | None = None, options: dict | None = None,
          out_dir: str | Path | None = None, cache_dir: str | Path | None = None, out: Output | None = None) -> dict:
    """Benchmark a server's URL, or an artifact or model folder (its server started and always stopped).

    ``workload`` (input_len, output_len, concurrency), ``slo`` (ttft_p99_ms, tpot_p99_ms, e2e_p99_ms) and
    ``options`` (llmopt.bench.BenchOptions' fields) override what an artifact's manifest records
    ([serve].workload, [serve].slo, [bench] requests / warmup / repeats / split). An artifact is benched as
    a plan of the bench stage (``llmopt.run.bench``); a URL or a model folder directly. Returns bench.json's
    content."""
    from llmopt.bench.runner import default_out_dir, run_bench
    from llmopt.plan import is_artifact

    if is_artifact(target):
        from llmopt.run.bench import bench_artifact

        return bench_artifact(target, {"workload": workload, "slo": slo, "options": options}, out_dir, cache_dir, out)
    return run_bench(target, workload, slo, options, out_dir or default_out_dir(target), cache_dir=cache_dir,
                     say=out.info if out else None)



def tune(artifact: str | Path, overrides: dict | None = None, out_dir: str | Path | None = None,
         cache_dir: str | Path | None = None, out: Output | None = None) -> dict:
    """Search the launch parameters of an artifact's engine against the live server (``llmopt tune``).

    ``overrides``: the tune stage's option fields (max_trials, max_minutes, repeats, requests, warmup, slo,
    workload, space) laid over what the artifact's recipe records. Writes tuning.json, the winner's
    ``deploy/`` and tuning.png to ``out_dir``; returns tuning.json's content."""
    from llmopt.run.tune import tune_artifact

    return tune_artifact(artifact, overrides, out_dir, cache_dir, out)
