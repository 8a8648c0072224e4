"""The API key check of ``llmopt serve --api-key``: OpenAI's ``Authorization: Bearer <key>``.

With a key, every request but ``/health`` and ``/metrics`` (open, as vLLM leaves them, for probes and
Prometheus) must carry it; any other is answered 401 with OpenAI's error JSON (code
``invalid_api_key``) and ``WWW-Authenticate: Bearer`` before a route runs: the completions and chat
routes, ``/v1/models``, FastAPI's ``/docs`` and ``/openapi.json``, any method, and paths that do not exist
(a 401, not a 404, so that nothing about the routes is learnt without the key). A websocket is closed.
The key is compared with ``hmac.compare_digest`` (its time does not depend on where a guess goes wrong)
and is never logged or echoed. A plain ASGI middleware, so that streamed answers and the disconnect
checks of llmopt/server/app.py pass through it untouched.
"""

from __future__ import annotations

import hmac
import json

from llmopt.server.schemas import error_body

OPEN_PATHS = frozenset({"/health", "/metrics"})
MISSING = ("Missing API key: send the header `Authorization: Bearer <key>` with the key this server was "
           "started with (llmopt serve --api-key, or LLMOPT_API_KEY).")
WRONG = "Incorrect API key provided: it is not the key this server was started with."


def authorized(headers: list[tuple[bytes, bytes]], key: bytes) -> bool | None:
    """True when an ``Authorization: Bearer`` header carries ``key``; False for another key; None when no
    bearer token (or an empty one) was sent."""
    token = None
    for name, value in headers:
        if name == b"authorization":
            scheme, _, rest = value.strip().partition(b" ")
            if scheme.lower() == b"bearer":
                token = rest.strip()
    if not token:
        return None
    return hmac.compare_digest(token, key)


class ApiKeyMiddleware:
    """Refuse every request without the key but those to ``OPEN_PATHS``."""

    def __init__(self, app, key: str):
        self.app, self.key = app, key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        verdict = authorized(scope.get("headers") or [], self.key)
        if verdict:
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps(error_body(MISSING if verdict is None else WRONG, code="invalid_api_key")).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})
