"""llmopt serve: an OpenAI-compatible HTTP server over an artifact or a model folder."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from llmopt import apikey
from llmopt.cli.app import FormatOpt, app, sink

LOOPBACK = ("127.0.0.1", "localhost", "::1")


@app.command()
def serve(
    path: Annotated[Path, typer.Argument(help="An artifact folder (manifest.json and model/) or a model folder.",
                                         show_default=False)],
    host: Annotated[str, typer.Option(help="Address to listen on; 0.0.0.0 opens it to the network (then require a key: --api-key / LLMOPT_API_KEY).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port to listen on (0: any free one).")] = 8000,
    runtime: Annotated[str, typer.Option(help="auto (by the model's format: transformers for hf, onnxruntime for onnx), or a runtime name.")] = "auto",
    max_queue: Annotated[Optional[int], typer.Option(min=0, help="Requests that may wait while others generate; more are "
                                                     "answered 429. Default: 512 (a load generator's sweep), or the "
                                                     "artifact's [serve] workload concurrency when higher.")] = None,
    parallel: Annotated[int, typer.Option(min=1, help="Requests generated at the same time, each by a worker process with "
                                          "its own copy of the model (the onnxruntime runtime only). On a CPU, parallel x "
                                          "the model's intra_op_num_threads at most its cores.")] = 1,
    max_num_seqs: Annotated[Optional[int], typer.Option(min=0, help="Batch: up to this many requests generated "
                                                        "together by onnxruntime-genai's engine over one copy of the "
                                                        "model (vLLM's option of the same name; the onnxruntime runtime "
                                                        "with og.Engine, else one at a time). 0: no batching. Not with "
                                                        "--parallel.")] = None,
    max_model_len: Annotated[Optional[int], typer.Option(help="Longest prompt + completion in tokens (default: the model's context).")] = None,
    model_name: Annotated[Optional[str], typer.Option(help="The name clients pass as `model` (default: the artifact's recipe name, else the folder name).")] = None,
    device: Annotated[str, typer.Option(help="auto: an ONNX model on the EP its graph was built for (cpu or cuda), "
                                        "a Hugging Face one on the GPU when torch sees one; or cpu, cuda, cuda:N.")] = "auto",
    api_key: Annotated[Optional[str], typer.Option(envvar="LLMOPT_API_KEY", show_envvar=True, show_default=False,
                                                   help="Require `Authorization: Bearer KEY` on every route but /health "
                                                   "and /metrics (401 without it). Default: the LLMOPT_API_KEY variable, "
                                                   "the better place for it (a command line is visible to every user of "
                                                   "the machine).")] = None,
    format: FormatOpt = "human",
) -> None:
    """Serve a model over an OpenAI-compatible HTTP API (completions, chat, streaming, metrics).

    Endpoints: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics.

    One request generates at a time (``--parallel N``: N at once, ``--max-num-seqs N``: N batched by
    onnxruntime-genai's engine) while others wait in a bounded queue.
    With a key (``export LLMOPT_API_KEY=$(openssl rand -hex 32)``, or --api-key), every route but /health
    and /metrics wants it as OpenAI's ``Authorization: Bearer``; see docs/serve.md.

    Examples:

        llmopt serve artifacts/quickstart

        llmopt serve artifacts/quickstart/model --port 8080 --max-queue 4 --max-model-len 2048

        llmopt serve artifacts/quickstart --max-num-seqs 4 --port 8081

        llmopt serve artifacts/quickstart --host 0.0.0.0 --model-name smollm2
    """
    from llmopt import server
    from llmopt.server.model import default_queue, locate
    from llmopt.runtimes import RUNTIMES
    from llmopt.errors import UsageError

    out = sink(format)
    api_key = _checked_key(api_key)
    if runtime != "auto" and runtime not in RUNTIMES:
        raise UsageError(f"unknown runtime {runtime!r}", fix=f"use auto or one of: {', '.join(RUNTIMES)}")
    max_num_seqs = max_num_seqs or None  # 0: no batching, as a tuned launch.sh may say
    if max_num_seqs is not None and parallel > 1:
        raise UsageError(f"--max-num-seqs {max_num_seqs} batches requests in one copy of the model; --parallel "
                         f"{parallel} starts a copy per request", fix="pass one of --max-num-seqs and --parallel")
    locate(path)  # a bad path fails before the port is taken
    if max_queue is None:
        max_queue = default_queue(path)
    sock = server.bind(host, port)
    with out.status(f"loading {path}"):
        served = server.load_model(path, runtime, device, max_model_len, model_name)
    if parallel > 1 and not getattr(served.runtime, "processes", False):
        raise UsageError(f"--parallel {parallel}: the {served.runtime.name} runtime generates one request at a time",
                         fix="leave out --parallel, or serve an ONNX model (the onnxruntime runtime)")
    scheduler = "processes" if parallel > 1 else "single"
    if max_num_seqs is not None:
        kind = getattr(served.runtime, "batch_kind", None)
        refusal = getattr(served.runtime, "batch_refusal", None)
        if kind:
            scheduler = f"engine-{kind}"
        elif refusal:
            out.warn(f"--max-num-seqs: the model is not batched: {refusal}; one request generates at a time")
        else:
            out.warn(f"--max-num-seqs: the {served.runtime.name} runtime has no batching engine here (the onnxruntime "
                     "runtime with onnxruntime-genai 0.18 or later has one); one request generates at a time")
    bound_host, bound_port = sock.getsockname()[:2]
    info = {"url": f"http://{_url_host(bound_host)}:{bound_port}/v1", "model": served.name,
            "model_dir": str(served.model_dir), "format": served.format, "runtime": served.runtime.name,
            "max_model_len": served.max_model_len, "max_queue": max_queue, "parallel": parallel,
            "max_num_seqs": max_num_seqs, "scheduler": scheduler, "authentication": "bearer" if api_key else "none"}
    out.result(info, lambda c: c.print(f"serving [bold]{served.name}[/] ({served.format}, {served.runtime.name}, "
                                       f"context {served.max_model_len}, scheduler {scheduler}) at {info['url']}"))
    out.flush()  # the document now: the command serves until it is stopped
    if host not in LOOPBACK and not api_key:
        out.warn(f"listening on {host} without an API key: anyone who can reach this machine can use the server; "
                 "set LLMOPT_API_KEY (or pass --api-key) to require one")
    if api_key and os.environ.get(apikey.ENV) != api_key:
        out.warn("the key given with --api-key is visible to every user of this machine (ps); prefer LLMOPT_API_KEY")
    server.serve(served, sock, max_queue, log_level="info" if out.chatty else "warning", parallel=parallel,
                 api_key=api_key, max_num_seqs=max_num_seqs if scheduler.startswith("engine") else None)


def _checked_key(key: str | None) -> str | None:
    """The key, None for none (an empty LLMOPT_API_KEY included), or a usage error naming what is wrong."""
    from llmopt.errors import UsageError

    if not key:
        return None
    if problem := apikey.problem(key):
        raise UsageError(problem, where=f"--api-key / {apikey.ENV}",
                         fix="make one with `openssl rand -hex 32` or `python -c 'import secrets; print(secrets.token_urlsafe(32))'`")
    return key


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
