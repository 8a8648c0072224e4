"""The API key of a served model: one environment variable, ``LLMOPT_API_KEY``, on both sides.

``llmopt serve`` requires it (``--api-key``, else this variable) as OpenAI's ``Authorization: Bearer
<key>``; the deployment files hand it to each engine from the same variable or from the Kubernetes
Secret ``llmopt-api-key`` (docs/deploy.md); and the clients, ``llmopt bench``, ``llmopt eval
--candidate URL``, the endpoint runtime and the bench and tune stages, send it when it is set. A key is
never written into a file, a manifest or a report.
"""

from __future__ import annotations

import os

ENV = "LLMOPT_API_KEY"
SECRET = "llmopt-api-key"  # the Kubernetes Secret the manifests read it from
SECRET_KEY = "api-key"  # ... and its key


def from_env() -> str | None:
    """The key in ``LLMOPT_API_KEY``; None when it is unset or empty."""
    return os.environ.get(ENV) or None


def headers(key: str | None = None) -> dict[str, str]:
    """The request header that carries ``key`` (default: the one in ``LLMOPT_API_KEY``); {} without one."""
    key = key if key is not None else from_env()
    return {"Authorization": f"Bearer {key}"} if key else {}


def problem(key: str) -> str | None:
    """Why ``key`` cannot be an API key, or None. A key is sent in an HTTP header and compared byte for
    byte, so it is printable ASCII without spaces (what ``openssl rand -hex 32`` prints)."""
    bad = sorted({c for c in key if not "!" <= c <= "~"})
    if bad:
        return f"the API key holds {', '.join(repr(c) for c in bad[:3])}: use printable ASCII without spaces"
    return None
