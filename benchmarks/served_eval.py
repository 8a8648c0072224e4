"""A recipe's evals on artifacts as an engine serves them: each artifact's server starts from its own deploy
config (deploy/<engine>/launch.sh, as `llmopt bench ARTIFACT` starts it), `llmopt eval RECIPE --candidate URL`
scores it against the recipe's source on the same examples, and the server stops.

    python benchmarks/served_eval.py RECIPE OUT NAME=ARTIFACT [NAME=ARTIFACT ...] [-- MORE llmopt eval ARGS]

OUT/NAME/ holds the eval's report (report.json, report.md, the per-example scores) and engine.log; OUT/NAME.json
the command's JSON result. benchmarks/gpu_vllm.sh runs it after its variants (GV_SERVED_EVAL), with
recipes/quickstart.toml as RECIPE unless GV_EVAL_RECIPE names another: the quickstart's six evals through vLLM.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path


def evaluate(recipe: Path, out: Path, name: str, artifact: Path, more: list[str]) -> dict:
    from llmopt.bench import engine
    from llmopt.store.cache import default_root

    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    port = engine.free_port()
    launch = engine.plan_launch(artifact, "auto", port)
    with engine.running(launch, port, default_root(), folder / "engine.log", 1200, print) as (url, _pid):
        started = time.time()
        done = subprocess.run([sys.executable, "-m", "llmopt", "eval", str(recipe), "--candidate", f"{url}/v1",
                               "-o", str(folder / "report"), "--format", "json", *more], capture_output=True, text=True)
    result = {"name": name, "artifact": str(artifact), "exit": done.returncode, "seconds": round(time.time() - started, 1),
              "stderr": done.stderr[-3000:]}
    try:
        result["result"] = json.loads(done.stdout)
    except json.JSONDecodeError:
        result["stdout"] = done.stdout[-3000:]
    (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def main(argv: list[str]) -> int:
    more = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    if len(argv) < 3 or any("=" not in a for a in argv[2:]):
        print(__doc__, file=sys.stderr)
        return 2
    recipe, out = Path(argv[0]), Path(argv[1])
    for pair in argv[2:]:
        name, _, artifact = pair.partition("=")
        result = evaluate(recipe, out, name, Path(artifact), more)
        print(name, "exit", result["exit"], "in", result["seconds"], "s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
