"""``llmopt tune ARTIFACT``: the tune stage over a finished artifact's own launch config, as a plan.

The plan (``llmopt.plan.build_artifact_plan``) reads the recipe the artifact's manifest records, with
[tune] enabled and the command's arguments laid over it as ``-s`` overrides; its stages are the
artifact's ``model/`` and ``deploy/<engine>/`` read where they are, and the tune stage, which the one
runner runs as ``llmopt run`` runs it: cached under its key (what it depends on: the model's
checksums, the launch files, the options), its trials kept in ``<cache>/tune/<key>/`` so a killed
search resumes. The results (tuning.json, the winner's ``deploy/``, tuning.png, run.log) go to the
output folder; the artifact itself is not changed.
"""

from __future__ import annotations

import json
from pathlib import Path

from llmopt.output import Output

# a command's argument -> the recipe key it overrides
KEYS = {"max_trials": "tune.max_trials", "max_minutes": "tune.max_minutes", "repeats": "tune.repeats",
        "requests": "tune.requests", "warmup": "bench.warmup", "slo": "serve.slo", "workload": "serve.workload",
        "space": "tune.space"}


def tune_artifact(folder: str | Path, overrides: dict | None = None, out_dir: str | Path | None = None,
                  cache_dir: str | Path | None = None, out: Output | None = None) -> dict:
    from llmopt.plan import build_artifact_plan
    from llmopt.run.runner import run_plan

    plan = build_artifact_plan(folder, override_specs(overrides or {}), cache_dir, out_dir)
    result = run_plan(plan, out)
    return result.report["tune"] | {"out_dir": str(plan.output_dir)}


def override_specs(overrides: dict) -> list[str]:
    """``-s`` specs of the arguments given (None: not given); a table's keys one by one, so that the
    recipe's other keys of it stay."""
    specs = []
    for name, value in overrides.items():
        if value is None:
            continue
        if isinstance(value, dict):
            specs += [f"{KEYS[name]}.{key}={json.dumps(item)}" for key, item in value.items()]
        else:
            specs.append(f"{KEYS[name]}={json.dumps(value)}")
    return specs
