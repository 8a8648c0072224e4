"""Where a model source is: a Hugging Face hub id or a local folder, and a hub model's config.json.

The planner reads a hub model's config before any weights (``hub_config``); the hf source backend
downloads the model itself. Needs: huggingface_hub, for hub ids only.
"""

from __future__ import annotations

import os
from pathlib import Path

from llmopt.errors import UsageError
from llmopt.libraries import require

HUB_PROBE_TIMEOUT_S = 5.0  # the plan's one request for config.json: no retries, so an unreachable hub is said at once
OFFLINE_FIX = ("check the network (and HF_ENDPOINT or proxy settings), or work offline with --offline (or "
               "HF_HUB_OFFLINE=1): config.json then comes from the local hub cache, and the checks that need it "
               "are skipped, with a warning, when it is not there")
# huggingface_hub's error classes, by name: 0.x raises requests' errors and EntryNotFoundError, 1.x httpx's and
# RemoteEntryNotFoundError
_NETWORK_ERRORS = {"TransportError", "ConnectionError", "Timeout", "TimeoutException"}


def hub_offline() -> bool:
    """Whether HF_HUB_OFFLINE (which `--offline` sets) keeps llmopt off the hub."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def hub_config(repo_id: str, revision: str | None, offline: bool) -> Path | None:
    """A hub model's config.json: offline, from the local hub cache (None when it is not there); else
    after one quick request (huggingface_hub alone retries an unreachable hub for about 24 s), from the
    hub. Raises UsageError when the hub cannot be reached or has no such model, revision or file."""
    hub = require("huggingface_hub", "hub", "a hub model source")
    from huggingface_hub import constants

    if offline or constants.HF_HUB_OFFLINE:  # the variable as huggingface_hub read it on import
        cached = hub.try_to_load_from_cache(repo_id, "config.json", revision=revision)
        return Path(cached) if isinstance(cached, str) else None
    endpoint = os.environ.get("HF_ENDPOINT", "").rstrip("/") or constants.ENDPOINT
    url = hub.hf_hub_url(repo_id, "config.json", revision=revision, endpoint=endpoint)
    try:
        hub.get_hf_file_metadata(url, timeout=HUB_PROBE_TIMEOUT_S)
        return Path(hub.hf_hub_download(repo_id, "config.json", revision=revision, endpoint=endpoint,
                                        etag_timeout=HUB_PROBE_TIMEOUT_S))
    except Exception as exc:  # noqa: BLE001 - what the hub said becomes the error's what and fix
        raise _hub_error(exc, repo_id, revision, endpoint) from None


def _hub_error(exc: Exception, repo_id: str, revision: str | None, endpoint: str) -> Exception:
    names = {cls.__name__ for cls in type(exc).__mro__}
    status = getattr(getattr(exc, "response", None), "status_code", None)
    login = "a private model needs `hf auth login` (or HF_TOKEN)"
    if "GatedRepoError" in names:
        return UsageError(f"{repo_id} is gated on the Hugging Face hub",
                          fix="accept its terms on the model's page, then `hf auth login` (or set HF_TOKEN)")
    if "RepositoryNotFoundError" in names:
        return UsageError(f"{repo_id} was not found on the Hugging Face hub ({endpoint})",
                          fix=f"check model.source (org/name); {login}")
    if "RevisionNotFoundError" in names:
        return UsageError(f"{repo_id} has no revision {revision!r}",
                          fix="check model.revision (a branch, tag or commit)")
    if names & {"EntryNotFoundError", "RemoteEntryNotFoundError"}:
        return UsageError(f"{repo_id} has no config.json; is it a transformers model?",
                          fix="give a Hugging Face model repository, a local folder or a .gguf file")
    if names & _NETWORK_ERRORS or (status or 0) >= 500:
        return UsageError(f"cannot reach the Hugging Face hub at {endpoint} to read {repo_id}'s config.json: {exc}",
                          fix=OFFLINE_FIX)
    return exc


def is_hub_id(source: str) -> bool:
    return source.count("/") == 1 and not Path(source).expanduser().exists() and not source.startswith((".", "/", "~"))


def local_folder(source: str, base: Path | None) -> Path:
    path = Path(source).expanduser()
    if not path.is_absolute() and base is not None and (base / path).exists():
        path = base / path
    return path.resolve()
