"""Verify an artifact against its manifest: recompute every file's checksum.

``manifest.json`` lists the checksum of every file of the artifact except itself
(``files``), BLAKE3 or SHA-256 as its ``checksum`` says (SHA-256 when it names none).
``verify_artifact`` recomputes them and reports the files whose content changed, the
listed files that are missing and the files that are not listed (extra).
The artifact is intact only when all three lists are empty. ``llmopt verify`` exits 0
when it is, 1 when it is not (the check failed, like a failed stage), and 2 when the
folder is not an artifact (no or an unreadable manifest.json: bad usage).
"""

from __future__ import annotations

import json
from pathlib import Path

from llmopt.store.cache import CHECKSUMS, checksums
from llmopt.errors import EXIT_STAGE_FAILED, LlmoptError, UsageError


class VerifyFailed(LlmoptError):
    """An artifact whose files do not match its manifest."""

    exit_code = EXIT_STAGE_FAILED

    def __init__(self, report: dict, **kw):
        self.report = report
        super().__init__(**kw)


def verify_artifact(folder: str | Path) -> dict:
    """``{"ok", "changed", "missing", "extra", ...}`` for the artifact in ``folder``."""
    root = Path(folder)
    manifest_path = root / "manifest.json"
    if not manifest_path.is_file():
        raise UsageError("not an llmopt artifact: the folder has no manifest.json", where=str(root),
                         fix="pass the folder `llmopt run` wrote (artifacts/<recipe name> by default)")
    try:
        manifest = json.loads(manifest_path.read_text())
        listed: dict[str, str] = dict(manifest["files"])
        algorithm = manifest.get("checksum", "sha256")
        if algorithm not in CHECKSUMS:
            raise ValueError(f"unknown checksum {algorithm!r}")
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{manifest_path} is not a readable artifact manifest ({exc})", where=str(manifest_path),
                         fix="restore manifest.json from the original artifact") from None
    actual = checksums(root, algorithm)
    changed = sorted(p for p, digest in listed.items() if p in actual and actual[p] != digest)
    missing = sorted(p for p in listed if p not in actual)
    extra = sorted(p for p in actual if p not in listed)
    return {
        "artifact": str(root),
        "recipe": (manifest.get("recipe") or {}).get("name"),
        "ok": not (changed or missing or extra),
        "checksum": algorithm,
        "checked": len(listed),
        "changed": changed,
        "missing": missing,
        "extra": extra,
    }


def failure(report: dict) -> VerifyFailed:
    parts = [f"{len(report[k])} {k}" for k in ("changed", "missing", "extra") if report[k]]
    return VerifyFailed(report, what=f"{report['artifact']} does not match its manifest: {', '.join(parts)}",
                        where=str(Path(report["artifact"]) / "manifest.json"),
                        fix="rebuild the artifact with `llmopt run`, or restore the files from the original")
