"""The content-addressed stage cache.

A stage's output lives in ``<root>/stages/<key>/``. It is written into
``<root>/tmp/<key>.<pid>/``, renamed into place only when complete, and becomes an
entry when its ``manifest.json`` is written, last. A run killed mid-stage leaves a
temporary folder, which the next run removes, or a folder without a manifest, which
the next run replaces. An entry whose files changed since (see ``Cache.state``) is
replaced too.

A stage that keeps state across runs (a training stage's checkpoints) writes it under
``<root>/work/<key>/`` (``Cache.work_dir``): no pid in the name, so a run killed with
``kill -9`` leaves it for the next run of the same key to resume from, and the stale
cleaning of ``tmp/`` never touches it. ``commit`` removes it once the stage is an entry.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import re
import shutil
import socket
from concurrent.futures import ThreadPoolExecutor
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


CHUNK = 1 << 22
CHECKSUMS = ("blake3", "sha256")


def sha256_file(path: Path) -> str:
    """Plain SHA-256 of a file, as ``sha256sum`` prints it (one core per file)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


MAP_WINDOW = 1 << 26  # 64 MiB


def blake3_file(path: Path) -> str:
    """BLAKE3 of a file, as ``b3sum`` prints it. BLAKE3 is a tree hash: each 64 MiB window of the
    file is memory-mapped and hashed on every core, without the GIL, where SHA-256 of a single large
    weight file is one core's work. Mapping a window at a time, not the file, keeps the process's
    resident set small; the window is large enough that a background hash, which takes the GIL
    back after every window, waits for it rarely while the main thread runs Python
    (benchmarks/hashing.py; docs/results/suite.md, "BLAKE3 window size")."""
    import blake3

    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        for offset in range(0, size, MAP_WINDOW):
            with mmap.mmap(f.fileno(), min(MAP_WINDOW, size - offset), offset=offset, access=mmap.ACCESS_READ) as window:
                h.update(window)
    return h.hexdigest()


def file_digest(path: Path, algorithm: str = "blake3") -> str:
    if algorithm not in CHECKSUMS:
        raise ValueError(f"unknown checksum {algorithm!r}; one of {', '.join(CHECKSUMS)}")
    return blake3_file(path) if algorithm == "blake3" else sha256_file(path)


def hash_workers(count: int) -> int:
    """Threads for hashing ``count`` files with SHA-256: hashlib releases the GIL on large buffers,
    so files hash in parallel; at most 8 (disk bandwidth, not cores, bounds it beyond that)."""
    return max(1, min(count, os.cpu_count() or 1, 8))


def file_digests(paths: list[Path], algorithm: str = "blake3") -> dict[Path, str]:
    """The digest of each file: BLAKE3 spreads each file over every core, SHA-256 several files at a time."""
    if algorithm == "blake3" or len(paths) < 2:
        return {p: file_digest(p, algorithm) for p in paths}
    with ThreadPoolExecutor(hash_workers(len(paths))) as pool:
        return dict(zip(paths, pool.map(sha256_file, paths)))


def checksums(root: Path, algorithm: str = "blake3") -> dict[str, str]:
    """The digest of every file under ``root`` but the manifest, by relative path."""
    files = [p for p in sorted(root.rglob("*")) if p.is_file() and p.name != "manifest.json"]
    digests = file_digests(files, algorithm)
    return {str(p.relative_to(root)): digests[p] for p in files}


def swap_into_place(tmp: Path, final: Path) -> None:
    """Rename the finished folder ``tmp`` to ``final``; an older ``final`` is moved aside first and removed
    after, so ``final`` is always either the old folder or the new one, never half of each."""
    if final.exists():
        old = final.parent / f".{final.name}.old-{os.getpid()}"
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)


class Cache:
    def __init__(self, root: Path | str | None = None):
        self.root = Path(root) if root else default_root()

    def path(self, key: str) -> Path:
        return self.root / "stages" / key

    def state(self, key: str) -> str:
        """"missing" (never written, or not finished), "whole", or "changed": a file of the entry
        differs in size or modification time from what its manifest recorded (a file linked into an
        artifact and written there in place), so the entry must not be reused."""
        if not (self.path(key) / MANIFEST).is_file():
            return "missing"
        recorded = self.manifest(key).get("file_stats")
        return "whole" if recorded is None or recorded == file_stats(self.path(key)) else "changed"

    def has(self, key: str) -> bool:
        return self.state(key) == "whole"

    def manifest(self, key: str) -> dict:
        return json.loads((self.path(key) / MANIFEST).read_text())

    def begin(self, key: str) -> Path:
        tmp = self.root / "tmp" / f"{key}.{host_tag()}.{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        return tmp

    def work_dir(self, key: str) -> Path:
        """The working folder of a stage key that outlives its run (checkpoints to resume from); not
        created here. Kept until the stage commits."""
        return self.root / "work" / key

    def commit(self, key: str, tmp: Path, manifest: dict | None) -> Path:
        """Move a finished stage folder into place; with ``manifest``, seal it too. Without one, the
        folder is there for the stages downstream but is not an entry until ``seal`` (a stage whose
        provenance is still being hashed). The key's working folder goes: the output no longer needs it."""
        final = self.path(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.exists():  # a forced re-run or an unsealed or changed entry is replaced
            old = final.with_name(f"{key}.old.{host_tag()}.{os.getpid()}")
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
        shutil.rmtree(self.work_dir(key), ignore_errors=True)
        if manifest is not None:
            self.seal(key, manifest)
        return final

    def seal(self, key: str, manifest: dict) -> None:
        """Write the manifest, last: only then is the folder an entry. It records each file's size and
        modification time, which ``state`` compares."""
        manifest["file_stats"] = file_stats(self.path(key))
        write_json(self.path(key) / MANIFEST, manifest)

    def discard(self, tmp: Path) -> None:
        shutil.rmtree(tmp, ignore_errors=True)

    def clean_stale(self) -> list[Path]:
        """Remove temporary folders left by runs on this host that are no longer alive. A cache shared by
        several hosts (a sweep's Ray workers) holds other hosts' folders too: whether their process lives
        cannot be seen from here, so they are left alone."""
        removed = []
        tmp_root = self.root / "tmp"
        if not tmp_root.is_dir():
            return removed
        for entry in tmp_root.iterdir():
            host, pid = owner_of(entry.name)
            if host != host_tag():
                continue
            if pid.isdigit() and process_exists(int(pid)) and int(pid) != os.getpid():
                continue
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
        return removed


def host_tag() -> str:
    """This host's name as a file name part (no dots): temporary folders and process records in a cache
    that several hosts share say which host's process they belong to."""
    return re.sub(r"[^A-Za-z0-9-]+", "-", socket.gethostname()) or "localhost"


def owner_of(name: str) -> tuple[str, str]:
    """(host, pid) of a temporary folder named ``<key>.<host>.<pid>``; a name without a host (written by an
    earlier llmopt, ``<key>.<pid>``) is taken as this host's."""
    parts = name.split(".")
    return (parts[-2], parts[-1]) if len(parts) >= 3 else (host_tag(), parts[-1])


def process_exists(pid: int) -> bool:
    """A process of this id exists on this host (possibly a zombie, possibly another user's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def file_stats(folder: Path) -> dict[str, list[int]]:
    """Size and modification time (ns) of every file under ``folder`` but the manifest."""
    stats = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.name != MANIFEST:
            st = path.stat()
            stats[str(path.relative_to(folder))] = [st.st_size, st.st_mtime_ns]
    return stats


def write_json(path: Path, data) -> None:
    """Write JSON atomically (temporary file, then rename)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    os.replace(tmp, path)


def copy_tree(src: Path, dst: Path) -> None:
    """Copy a folder. Files are copied, not linked: editing the copy must never change its source."""
    shutil.copytree(src, dst)


LINK_MIN = 1 << 26  # 64 MiB: weight files; configs and tokenizers are always copied


def place_tree(src: Path, dst: Path, link: bool = True) -> dict[str, str]:
    """Put a cached folder's files into ``dst``: files of ``LINK_MIN`` bytes or more (the weights) as
    hard links to the cache's files when ``link`` and both are on one filesystem, every other file
    as a copy.
    Returns how each file was placed ("link" or "copy") by relative path.

    A link costs nothing where a copy of an 8.5 GB checkpoint costs seconds and the space twice.
    The cache's stage manifests record each file's size and modification time, and a stage whose
    files changed (a linked weight file written in place) is run again rather than reused
    (``Cache.state``), so an edited artifact cannot poison the cache."""
    placed = {}
    for path in sorted(src.rglob("*")):
        target = dst / path.relative_to(src)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        how = "copy"
        if link and path.stat().st_size >= LINK_MIN:
            try:
                os.link(path, target)
                how = "link"
            except OSError:  # another filesystem, or one without hard links
                pass
        if how == "copy":
            shutil.copy2(path, target)
        placed[str(target.relative_to(dst))] = how
    return placed
