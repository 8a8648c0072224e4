"""``llmopt serve``: an OpenAI-compatible HTTP server over llmopt's embedded runtimes.

``load_model`` opens an artifact or model folder with its runtime (transformers
for Hugging Face folders, ONNX Runtime GenAI for ``genai_config.json`` folders);
``create_app`` builds the FastAPI app (llmopt/server/app.py); ``serve`` runs it
under uvicorn. Needs: fastapi and uvicorn (the ``serve`` extra), jinja2 for chat
templates of runtimes without a transformers tokenizer. With an API key (``llmopt serve --api-key`` or
``LLMOPT_API_KEY``), every route but /health and /metrics wants ``Authorization: Bearer <key>``.
"""

from __future__ import annotations

import errno
import socket

from llmopt.catalog.engines import SWEEP_QUEUE
from llmopt.errors import UsageError
from llmopt.server.model import ServedModel, load_model

__all__ = ["ServedModel", "bind", "create_app", "load_model", "serve"]


def create_app(served: ServedModel, max_queue: int = SWEEP_QUEUE, parallel: int = 1, api_key: str | None = None,
               max_num_seqs: int | None = None):
    from llmopt.libraries import require

    require("fastapi", "serve", "llmopt serve")
    from llmopt.server.app import create_app as build

    return build(served, max_queue, parallel, api_key, max_num_seqs)


def bind(host: str, port: int) -> socket.socket:
    """A listening-ready socket on host:port (port 0: any free port), or a UsageError saying why not."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        taken = getattr(exc, "errno", None) in (errno.EADDRINUSE, errno.EACCES)
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                         fix="pick another --port, or stop what is using it" if taken
                         else "pass --host an address of this machine (127.0.0.1, 0.0.0.0 for every one)") from None
    return sock


def serve(served: ServedModel, sock: socket.socket, max_queue: int = SWEEP_QUEUE, log_level: str = "info",
          parallel: int = 1, api_key: str | None = None, max_num_seqs: int | None = None) -> None:
    """Serve until interrupted (Ctrl-C or SIGTERM); in-flight requests get up to 30 s to finish. With
    ``api_key``, requests must carry it as ``Authorization: Bearer <key>`` (llmopt/server/auth.py)."""
    from llmopt.libraries import require

    uvicorn = require("uvicorn", "serve", "llmopt serve")
    config = uvicorn.Config(create_app(served, max_queue, parallel, api_key, max_num_seqs), log_level=log_level, timeout_graceful_shutdown=30)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C once it has shut down cleanly
        pass
