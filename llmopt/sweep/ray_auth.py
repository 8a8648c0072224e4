"""Joining a Ray cluster at ``--address`` that asks for a token (Ray's token authentication).

``ray start --head`` turns token authentication on by itself when this machine has a token
(``~/.ray/auth_token``, written by ``ray get-auth-token --generate`` or by any earlier local
``ray.init()``). A client joining it by address sends the token only when ``RAY_AUTH_MODE=token``;
without it the cluster answers 'InvalidAuthToken', Ray retries once a second, and ``ray.init``
ends in a bare ConnectionError some 20 s later. ``prepare`` asks the cluster once before
``ray.init``: when it asks for a token and none was sent, it turns token mode on for this process
if a token is at hand (one named by ``RAY_AUTH_TOKEN`` / ``RAY_AUTH_TOKEN_PATH``, or
``~/.ray/auth_token`` for a cluster on this machine: like Ray, it does not send that file to an
address elsewhere unless ``RAY_AUTH_MODE=token`` says so) and the cluster takes it; otherwise it
raises a UsageError at once that says what to set. An address where no cluster answers is a
UsageError too, after about 15 s.

Needs: ray (the ``ray`` extra).
"""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path

from llmopt.errors import UsageError

MODE = "RAY_AUTH_MODE"
PROBE_TIMEOUT_MS = 5_000  # after ray's own GCS client has waited 5 s for a connection and 5 s for its pubsub


def prepare(address: str | None) -> bool:
    """Check that the cluster at ``address`` (or ``RAY_ADDRESS``) will take this client. True when this
    turned ``RAY_AUTH_MODE=token`` on, for ``restore`` to turn off after ``ray.shutdown()``."""
    target = _gcs_address(address or os.environ.get("RAY_ADDRESS"))
    if target is None:
        return False
    shown, mode, source = address or target, os.environ.get(MODE), token_source()
    if mode == "token" and source is None:  # Ray's first call to the cluster would abort this process
        raise UsageError("RAY_AUTH_MODE=token is set but this client has no Ray token", where="--address",
                         fix=_give_token())
    if _accepts(target):
        return False
    if mode is None and source and (_named_token() or _on_this_machine(target)):
        _set_mode("token")
        if _accepts(target):
            return True
        _set_mode(None)
        mode = "token"
    raise _refused(shown, mode, source)


def restore(turned_on: bool) -> None:
    if turned_on:
        _set_mode(None)


def token_source() -> str | None:
    """Where Ray reads this client's token from, in Ray's own order; None when Ray finds none."""
    from ray._raylet import AuthenticationTokenLoader

    loader = AuthenticationTokenLoader.instance()
    loader.reset_cache()
    if not loader.has_token(ignore_auth_mode=True):
        return None
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return "the RAY_AUTH_TOKEN variable"
    return f"{_token_file()} (RAY_AUTH_TOKEN_PATH)" if os.environ.get("RAY_AUTH_TOKEN_PATH") else str(_token_file())


def _token_file() -> Path:
    named = os.environ.get("RAY_AUTH_TOKEN_PATH")
    return Path(named).expanduser() if named else Path.home() / ".ray" / "auth_token"


def _give_token() -> str:
    return (f"give this client the cluster's token: copy the head's ~/.ray/auth_token to {_token_file()}, or set "
            "RAY_AUTH_TOKEN_PATH=<file> or RAY_AUTH_TOKEN=<token> (`ray get-auth-token` on the head prints it)")


def _refused(address: str, mode: str | None, source: str | None) -> UsageError:
    where = "--address"
    if mode == "token":
        return UsageError(f"the Ray cluster at {address} has token authentication and refuses the token in {source}",
                          where=where, fix=_give_token())
    told = f" (RAY_AUTH_MODE={mode})" if mode else ""
    fix = f"set RAY_AUTH_MODE=token to send the token in {source}" if source else \
        f"set RAY_AUTH_MODE=token and {_give_token()}"
    return UsageError(f"the Ray cluster at {address} has token authentication and this client sends no "
                      f"token{told}", where=where, fix=fix)


def _gcs_address(address: str | None) -> str | None:
    """host:port of the cluster to join, as ``ray.init`` resolves it; None for a new local cluster,
    Ray Client (``ray://``) or an address Ray itself will refuse."""
    if not address or address == "local" or "://" in address:
        return None
    from ray._private.services import canonicalize_bootstrap_address

    try:
        return canonicalize_bootstrap_address(address)
    except Exception:  # noqa: BLE001 - no cluster found for "auto", or a malformed address: ray.init says which
        return None


def _accepts(target: str) -> bool:
    """Whether the cluster's GCS answers this client; False only when it asks for a token it did not get."""
    from ray._raylet import InnerGcsClient
    from ray.exceptions import AuthenticationError, RayError

    try:
        InnerGcsClient.standalone(target, None, PROBE_TIMEOUT_MS)
    except AuthenticationError:
        return False
    except RayError as exc:
        raise UsageError(f"no Ray cluster answers at {target}: {exc}", where="--address",
                         fix="check the address (the head's GCS port, `ray start --head --port`) and that the "
                         "head is running, or leave --address out to start a local cluster") from None
    return True


def _named_token() -> bool:
    return bool(os.environ.get("RAY_AUTH_TOKEN", "").strip() or os.environ.get("RAY_AUTH_TOKEN_PATH"))


def _on_this_machine(target: str) -> bool:
    """Whether ``host:port`` is a loopback address or one of this machine's own (it can bind there)."""
    host = target.rsplit(":", 1)[0].strip("[]")
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, _, _, _, sockaddr in infos:
        if ipaddress.ip_address(sockaddr[0]).is_loopback:
            return True
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((sockaddr[0], 0))
            return True
        except OSError:
            continue
    return False


def _set_mode(mode: str | None) -> None:
    """Set or clear RAY_AUTH_MODE for this process, and make Ray's cached configuration see it."""
    from ray._raylet import AuthenticationTokenLoader, Config

    if mode is None:
        os.environ.pop(MODE, None)
    else:
        os.environ[MODE] = mode
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()
