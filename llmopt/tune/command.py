"""``llmopt tune ARTIFACT``: the tune stage's search over a finished artifact's own launch config.

The artifact's manifest gives the engine, ``[serve].workload`` and ``.slo``, ``[bench]`` requests and
warm-up and the ``[tune]`` budget; arguments override them. Trials are kept in
``<cache>/tune/artifact-<hash>/`` (the hash of the artifact's deploy files, its model's digests and the
options), so a killed ``llmopt tune`` resumes. The results (tuning.json, the winner's ``deploy/``,
tuning.png) go to the output folder; the artifact itself is not changed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from llmopt.errors import UsageError


def tune_artifact(folder: str | Path, overrides: dict | None = None, out_dir: str | Path | None = None,
                  cache_dir: str | Path | None = None, say=None) -> dict:
    from llmopt.bench.engine import stop_leftovers
    from llmopt.store.cache import default_root
    from llmopt.tune.stage import TuneStageOptions, store_for, tune

    folder = Path(folder).expanduser().resolve()
    manifest_path = folder / "manifest.json"
    if not manifest_path.is_file() or not (folder / "model").is_dir():
        raise UsageError(f"{folder} is not an artifact (no manifest.json and model/)",
                         fix="pass the folder `llmopt run` wrote (artifacts/<name>)")
    manifest = json.loads(manifest_path.read_text())
    options = options_of(manifest, overrides or {}, folder)
    deploy = folder / "deploy" / options["engine"]
    if not (deploy / "launch.sh").is_file():
        raise UsageError(f"{folder} has no deploy/{options['engine']}/launch.sh", where=str(folder),
                         fix="tune an artifact whose recipe has a [serve] section")
    options = TuneStageOptions(**options)
    root = Path(cache_dir).expanduser() if cache_dir else default_root()
    say = say or (lambda message: None)
    for info in stop_leftovers(root):
        say(f"stopped a server left by an earlier llmopt run, bench or tune (pid {info['pid']})")
    material = {"deploy": {p.name: p.read_text() for p in sorted(deploy.iterdir()) if p.is_file()},
                "model": {k: v for k, v in (manifest.get("files") or {}).items() if k.startswith("model/")},
                "options": options.model_dump(mode="json")}
    out = Path(out_dir or Path("tune") / f"{folder.name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")
    out.mkdir(parents=True, exist_ok=True)
    result = tune(options, folder / "model", deploy, manifest, root, store_for(root, material), out, say)
    return result | {"out_dir": str(out)}


def options_of(manifest: dict, overrides: dict, folder: Path) -> dict:
    """The tune options the artifact's recipe records, with ``overrides`` (None values left out) laid over."""
    recipe = (manifest.get("recipe") or {}).get("resolved") or {}
    serve, bench, section = recipe.get("serve"), recipe.get("bench") or {}, recipe.get("tune") or {}
    if not serve:
        raise UsageError(f"{folder}'s recipe has no [serve] section: there is no launch config to tune",
                         fix="tune an artifact built from a recipe with [serve]")
    options = {"engine": serve["backend"], "workload": serve.get("workload") or {}, "slo": serve.get("slo") or {},
               "requests": section.get("requests") or bench.get("requests", 64), "warmup": bench.get("warmup", 4),
               "max_trials": section.get("max_trials", 8), "max_minutes": section.get("max_minutes"),
               "repeats": section.get("repeats", 1), "space": section.get("space") or {},
               "startup_timeout_s": section.get("startup_timeout_s", 1200.0)}
    for key, value in overrides.items():
        if value is None:
            continue
        options[key] = {**options[key], **value} if key in ("slo", "workload", "space") else value
    return options
