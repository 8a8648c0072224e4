"""The content-addressed stage cache.

A stage's output lives in ``<root>/stages/<key>/``. It is written into
``<root>/tmp/<key>.<pid>/`` and renamed into place only when complete, with its
``manifest.json`` last, so a folder under ``stages/`` is always whole. A run killed
mid-stage leaves only a temporary folder, which the next run removes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

MANIFEST = "manifest.json"


def default_root() -> Path:
    env = os.environ.get("LLMOPT_CACHE")
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "llmopt"


def stage_key(material: dict) -> str:
    """Hash of everything a stage's output depends on."""
    doc = json.dumps(material, sort_keys=True, default=str)
    return hashlib.sha256(doc.encode()).hexdigest()[:24]


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


class Cache:
    def __init__(self, root: Path | str | None = None):
        self.root = Path(root) if root else default_root()

    def path(self, key: str) -> Path:
        return self.root / "stages" / key

    def has(self, key: str) -> bool:
        return (self.path(key) / MANIFEST).is_file()

    def manifest(self, key: str) -> dict:
        return json.loads((self.path(key) / MANIFEST).read_text())

    def begin(self, key: str) -> Path:
        tmp = self.root / "tmp" / f"{key}.{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        return tmp

    def commit(self, key: str, tmp: Path, manifest: dict) -> Path:
        write_json(tmp / MANIFEST, manifest)
        final = self.path(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.exists():  # a forced re-run replaces the old output
            old = final.with_name(f"{key}.old.{os.getpid()}")
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
        return final

    def discard(self, tmp: Path) -> None:
        shutil.rmtree(tmp, ignore_errors=True)

    def clean_stale(self) -> list[Path]:
        """Remove temporary folders left by runs that are no longer alive."""
        removed = []
        tmp_root = self.root / "tmp"
        if not tmp_root.is_dir():
            return removed
        for entry in tmp_root.iterdir():
            pid = entry.name.rsplit(".", 1)[-1]
            if pid.isdigit() and _alive(int(pid)) and int(pid) != os.getpid():
                continue
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
        return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_json(path: Path, data) -> None:
    """Write JSON atomically (temporary file, then rename)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    os.replace(tmp, path)


def copy_tree(src: Path, dst: Path) -> None:
    """Copy a folder. Files are copied, not linked: editing the artifact must never
    change the cache it came from."""
    shutil.copytree(src, dst)
