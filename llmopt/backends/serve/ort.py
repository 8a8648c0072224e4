"""ONNX Runtime GenAI launch configs: session options for the target and ``llmopt serve``.

The artifact's ONNX model (``[export] format = "onnx"``) carries a ``genai_config.json`` whose
session options name the execution provider the graph was built for, with its options (e.g.
``enable_cuda_graph``). This backend serves the graph on that provider and keeps its options;
a ``provider`` the graph was not built for is refused (the export chooses it). The overlay adds
the thread count and ``search.max_length`` (``serve.max_model_len``, at most the model's
context). The overlay is checked with
onnxruntime-genai's own ``Config.overlay`` when it is installed, and ``launch.sh`` serves
the model with it through ``llmopt serve`` (an OpenAI-compatible server).
Needs: pyyaml (the ``deploy`` extra); onnxruntime-genai to validate (the ``ort`` extra).
Produces: ``deploy/ort/genai_config.overlay.json``, ``genai_config.json`` (the model's
config with the overlay applied) and ``launch.sh``; with an ``image`` option also
``docker-compose.yaml`` and ``kubernetes.yaml``.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Literal

from pydantic import Field

from llmopt import apikey
from llmopt.model import formats
from llmopt.backends.base import PlanContext, ServeBackend, StageContext
from llmopt.catalog.engines import queue_for
from llmopt.libraries import package_version
from llmopt.deploy import files, speculative
from llmopt.deploy.compat import YES, Rule
from llmopt.errors import Problem, StageFailed
from llmopt.registry import register
from llmopt.runtimes.onnx import GPU_PROVIDERS, built_for

# What ONNX Runtime GenAI runs, by the checkpoint its model was built from (DESIGN.md, "What serves what";
# onnxruntime-genai's model builder 0.18): AutoAWQ / AutoGPTQ int4 folders (compressed-tensors W4A16 repacked
# into that layout), compressed-tensors FP8 / NVFP4 on the CUDA execution provider only, ORT INT8, and the
# ONNX models it builds. The onnx export declares what its builder takes, option by option.
CUDA_FP8 = Rule("yes", "FP8 ONNX models run only on the CUDA execution provider", needs_gpu=True)
CUDA_NVFP4 = Rule("yes", "NVFP4 ONNX models run only on the CUDA execution provider", needs_gpu=True)
ACCEPTS: dict[formats.Format, Rule] = {
    formats.DENSE: YES, formats.ONNX_INT4: YES, formats.ONNX_INT8: YES, formats.ONNX_FLOAT: YES,
    formats.CT_W4A16: YES, formats.CT_W4A16_GIDX: YES, formats.CT_INT8: YES,
    formats.CT_FP8: CUDA_FP8, formats.MODELOPT_FP8: CUDA_FP8,
    formats.CT_NVFP4: CUDA_NVFP4, formats.CT_NVFP4A16: CUDA_NVFP4,
    formats.CT_W8A16: Rule("no", "the ONNX Runtime GenAI builder reads FP8 / NVFP4 compressed-tensors and AutoGPTQ / "
                           "AutoAWQ int4 folders, not W8A16", fix="use 4-bit weights (W4A16)"),
    formats.CT_WNA16: Rule("no", "the ONNX Runtime GenAI builder reads int4 weights, not other widths",
                           fix="use 4-bit weights (W4A16)"),
    formats.MODELOPT_NVFP4: Rule("no", "ONNX Runtime GenAI does not read ModelOpt NVFP4 checkpoints",
                                 fix="use nvfp4 (compressed-tensors) with a CUDA GPU"),
    formats.MODELOPT_INT4_AWQ: Rule("undocumented", "the ONNX Runtime GenAI builder documents AutoAWQ / AutoGPTQ "
                                    "folders, not ModelOpt INT4 AWQ checkpoints"),
    formats.MODELOPT_INT8_SQ: Rule("undocumented", "the ONNX Runtime GenAI builder documents AutoAWQ / AutoGPTQ "
                                   "folders, not ModelOpt INT8 SmoothQuant checkpoints"),
    formats.SPARSE_2_4: Rule("no", "ONNX Runtime GenAI does not serve 2:4 sparse checkpoints",
                             fix="leave out the 2:4 sparsity step"),
}


class OrtOptions(files.DeploymentOptions):
    provider: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Execution provider; auto: the one the graph was built for ([export] "
        "execution_provider); another is refused.")
    intra_op_num_threads: int | None = Field(
        None, ge=1, description="CPU threads of one operator (default: ONNX Runtime's choice).")
    max_queue: int | None = Field(
        None, ge=0, description="Requests that may wait while others generate (llmopt serve --max-queue); default: "
        "llmopt serve's, 512 (a load generator's sweep) or [serve] workload concurrency when higher.")
    parallel: int = Field(1, ge=1, description="Requests generated at the same time, each by a worker process with its "
                          "own copy of the model (llmopt serve --parallel); on a CPU, parallel x intra_op_num_threads "
                          "should not exceed its cores. [tune] searches the two together.")
    max_num_seqs: int = Field(0, ge=0, description="Requests batched in one copy of the model by onnxruntime-genai's "
                              "engine (llmopt serve --max-num-seqs; docs/serve.md, \"Batching\"); 0: none. Not with "
                              "parallel > 1. Off unless set: on a CPU the engine batches statically, which wins with "
                              "requests of equal length and loses with mixed ones (docs/benchmarks.md); [tune] "
                              "measures it against parallel on the workload.")
    port: int = Field(8000, ge=1, le=65535, description="HTTP port of the server.")
    image: str | None = Field(
        None, description="A container image with `llmopt[ort,serve]` installed; when set, docker-compose.yaml and "
        "kubernetes.yaml are written too.")


def overlay(options: OrtOptions, max_length: int) -> dict:
    """What the deploy changes: threads and the longest sequence. The provider and its options stay the
    export's (the overlay replaces a list it names, so it names none)."""
    top: dict = {"search": {"max_length": max_length}}
    if options.intra_op_num_threads:
        top["model"] = {"decoder": {"session_options": {"intra_op_num_threads": options.intra_op_num_threads}}}
    return top


def merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for key, value in top.items():
        out[key] = merge(out.get(key, {}), value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def queue(options: OrtOptions, concurrency: int) -> int:
    """launch.sh's ``--max-queue``: the recipe's ``max_queue``, else llmopt serve's own rule for the workload
    (``queue_for``: room for a load generator's sweep of 512 requests in flight)."""
    return queue_for(concurrency) if options.max_queue is None else options.max_queue


def validate(model_dir: Path, text: str) -> dict:
    """Apply the overlay with onnxruntime-genai's own Config when it is installed."""
    version = package_version("onnxruntime-genai")
    if version is None:
        return {"ok": True, "validated_by": "not validated (onnxruntime-genai is not installed)", "errors": []}
    import onnxruntime_genai as og

    try:
        og.Config(str(model_dir)).overlay(text)
    except Exception as exc:  # the library raises its own RuntimeError types
        return {"ok": False, "validated_by": f"onnxruntime-genai {version} Config", "errors": [str(exc)]}
    return {"ok": True, "validated_by": f"onnxruntime-genai {version} Config", "errors": []}


def script(serve_args: list[str], publish_host: str) -> str:
    """launch.sh: a folder of links to model/ with the adapted genai_config.json, served by llmopt serve,
    listening on ``publish_host`` unless LLMOPT_HOST says otherwise (the container files set 0.0.0.0); llmopt
    serve reads the API key from LLMOPT_API_KEY itself."""
    host = f'"${{LLMOPT_HOST:-{publish_host}}}"'
    args = [host if a == host else shlex.quote(a) for a in files.local_host(serve_args, host)]
    return "\n".join([
        "#!/usr/bin/env bash",
        "# Serves the artifact two folders up with ONNX Runtime GenAI through `llmopt serve` (written by llmopt).",
        f"# It listens on {publish_host} (LLMOPT_HOST: another address); clients send the key in {apikey.ENV} as",
        "# `Authorization: Bearer` when it is set where this runs (docs/deploy.md).",
        "set -euo pipefail",
        'cd "$(dirname "$0")/../.."',
        'run="${LLMOPT_RUN_DIR:-$(mktemp -d)}"',
        'for f in model/*; do ln -sfn "$PWD/$f" "$run/$(basename "$f")"; done',
        'rm -f "$run/genai_config.json" && cp deploy/ort/genai_config.json "$run/genai_config.json"',
        f'exec llmopt serve "$run" {" ".join(args)} "$@"',
        "",
    ])


@register("serve", "ort")
class OrtServe(ServeBackend):
    Options = OrtOptions
    requires = ()
    extra = "deploy"

    def accepts(self, options: OrtOptions) -> dict[formats.Format, Rule]:
        """What ONNX Runtime GenAI serves, by the checkpoint format its model is built from (``ACCEPTS``)."""
        return ACCEPTS

    def check(self, options: OrtOptions, ctx: PlanContext) -> list[Problem]:
        problems = speculative.problems(speculative.of(ctx.recipe.recipe.serve), "ort", None, ctx)
        if options.max_num_seqs and options.parallel > 1:
            problems.append(ctx.problem(f"max_num_seqs = {options.max_num_seqs} batches requests in one copy of the "
                                        f"model, parallel = {options.parallel} starts a copy per request", "max_num_seqs",
                                        hint="set one of them (parallel = 1, or max_num_seqs = 0)"))
        exported = ctx.recipe.recipe.export.format
        if exported != "onnx":
            problems.append(Problem(f"serve.backend = \"ort\" serves ONNX models, but the recipe exports {exported!r}",
                                    ctx.where("backend"), "set [export] format = \"onnx\""))
        else:
            ep = getattr(ctx.recipe.options_for("export", None), "execution_provider", None)
            if options.provider != "auto" and ep and ep != options.provider:
                problems.append(ctx.problem(f"provider \"{options.provider}\" is not the one the graph is built for: "
                                            f"[export] execution_provider = \"{ep}\"", "provider",
                                            hint=f"leave provider = \"auto\", or export with execution_provider = "
                                            f"\"{options.provider}\""))
            elif ep == "cpu" and ctx.gpu is not None:
                problems.append(ctx.problem(f"the graph is built for the cpu execution provider: it is served on the "
                                            f"CPU although [target] names {ctx.gpu.name}", "provider",
                                            hint="export with execution_provider = \"cuda\" to serve it on the GPU",
                                            severity="warning"))
            elif ep in GPU_PROVIDERS and ctx.gpu is None:
                problems.append(ctx.problem(f"the graph is built for the {ep} execution provider, but [target] names "
                                            "no GPU", "provider", hint="set [target] gpu"))
        if options.provider == "cuda" and ctx.gpu is None:
            problems.append(ctx.problem("provider \"cuda\" needs a GPU, but [target] names none", "provider",
                                        hint="set [target] gpu, or provider = \"cpu\""))
        return problems

    def render(self, options: OrtOptions, ctx: StageContext) -> dict:
        recipe, model_dir, folder = ctx.recipe.recipe, ctx.model_dir, ctx.out_dir
        config_path = Path(model_dir) / "genai_config.json"
        if not config_path.is_file():
            raise StageFailed("ort serves ONNX Runtime GenAI models, but model/ has no genai_config.json",
                              where="serve.backend", fix="set [export] format = \"onnx\"")
        base = json.loads(config_path.read_text())
        context = base.get("model", {}).get("context_length")
        max_length = min(recipe.serve.max_model_len, context) if context else recipe.serve.max_model_len
        provider = built_for(base)
        if options.provider not in ("auto", provider):
            raise StageFailed(f"the ONNX model was built for the {provider} execution provider, not "
                              f"{options.provider}", where="serve.provider",
                              fix=f"leave provider = \"auto\", or export with execution_provider = "
                              f"\"{options.provider}\"")
        top = overlay(options, max_length)
        text = json.dumps(top, indent=2)
        validation = validate(model_dir, text)
        if not validation["ok"]:
            raise StageFailed(f"{validation['validated_by']} refused the overlay: {validation['errors'][0]}",
                              where="serve", fix="adjust the [serve] options")
        (folder / "genai_config.overlay.json").write_text(text + "\n")
        merged = merge(base, top)
        (folder / "genai_config.json").write_text(json.dumps(merged, indent=2) + "\n")
        serve_args = ["--host", "0.0.0.0", "--port", str(options.port), "--max-model-len", str(max_length),
                      "--model-name", recipe.name, "--max-queue", str(queue(options, recipe.serve.workload.concurrency)),
                      "--parallel", str(options.parallel)] + (["--device", "cuda"] if provider in GPU_PROVIDERS else [])
        if options.max_num_seqs:
            serve_args += ["--max-num-seqs", str(options.max_num_seqs)]
        weights = sum(f.stat().st_size for f in Path(model_dir).iterdir() if f.name.endswith((".onnx", ".onnx.data")))
        gpus = 1 if provider in GPU_PROVIDERS else 0
        # the container runs launch.sh, listening on every interface of the container; llmopt serve reads the key
        launch = files.Launch("ort", recipe.name, options.image, ["bash"], ["{config}/launch.sh"], options.port, gpus,
                              options, host_memory_gib=0 if gpus else files.gib_of(weights),
                              env={"LLMOPT_HOST": "0.0.0.0"}, key_env=apikey.ENV)
        written = files.write_all(folder, launch, script=script(serve_args, options.publish_host))
        command = " ".join(["llmopt", "serve", ".", *(shlex.quote(a) for a in serve_args)])
        return {"engine": "ort", "engine_version": package_version("onnxruntime-genai"), "command": command,
                "launch": "deploy/ort/launch.sh", "image": options.image, "port": options.port,
                "files": [f"deploy/ort/{f}" for f in ["genai_config.overlay.json", "genai_config.json", *written]],
                "served_model_name": recipe.name, "gpus": gpus, "provider": provider,
                "session_options": merged["model"]["decoder"].get("session_options", {}),
                "max_length": max_length, "validated_by": validation["validated_by"]}
