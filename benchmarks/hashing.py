"""How llmopt checksums large weight files: BLAKE3 over memory-mapped windows of several sizes.

Each (window size, repeat) runs in a fresh process that hashes every file once with
``llmopt.store.cache.blake3_file`` (``MAP_WINDOW`` set to the size), so each gets its own peak
resident set: the JSON line has the seconds, the process's VmHWM growth while hashing
(mapped file pages count while mapped) and the digest, which must be the same for every
size. ``--populate`` adds the same loop with ``MAP_POPULATE`` (each window faulted in by one
call instead of page by page) as a candidate; ``--sha256`` adds one SHA-256 pass.
The files are read once first, so every row hashes from the page cache.

    python benchmarks/hashing.py /path/model.safetensors --windows 16,64,256 --repeats 3 --populate
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def blake3_populated(path: Path, window: int) -> str:
    """The candidate: ``blake3_file``'s loop with each window populated by the mapping call."""
    import blake3

    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        for offset in range(0, size, window):
            with mmap.mmap(f.fileno(), min(window, size - offset), flags=mmap.MAP_SHARED | mmap.MAP_POPULATE,
                           prot=mmap.PROT_READ, offset=offset) as view:
                h.update(view)
    return h.hexdigest()


def child(kind: str, window_mib: int, files: list[Path]) -> None:
    from llmopt.store import cache
    from llmopt.sysinfo import peak_rss_bytes

    cache.MAP_WINDOW = window_mib << 20
    hash_one = {"blake3": cache.blake3_file, "sha256": cache.sha256_file,
                "populate": lambda p: blake3_populated(p, cache.MAP_WINDOW)}[kind]
    before = peak_rss_bytes()
    started = time.perf_counter()
    digests = [hash_one(p) for p in files]
    seconds = time.perf_counter() - started
    print(json.dumps({"seconds": round(seconds, 3), "rss_growth_mib": round((peak_rss_bytes() - before) / 2**20, 1),
                      "digest": digests[0][:16]}))


def run(kind: str, window_mib: int, files: list[Path]) -> dict:
    cmd = [sys.executable, __file__, "--child", kind, "--windows", str(window_mib), *map(str, files)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--windows", default="16,64,256", help="window sizes in MiB, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--populate", action="store_true", help="also the MAP_POPULATE candidate")
    parser.add_argument("--sha256", action="store_true", help="also one SHA-256 pass")
    parser.add_argument("--child", choices=["blake3", "populate", "sha256"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child, int(args.windows), args.files)
    total = sum(p.stat().st_size for p in args.files)
    for p in args.files:  # into the page cache
        with open(p, "rb") as f:
            while f.read(1 << 26):
                pass
    kinds = ["blake3"] + (["populate"] if args.populate else [])
    digests = set()
    for window in map(int, args.windows.split(",")):
        for kind in kinds:
            rows = [run(kind, window, args.files) for _ in range(args.repeats)]
            digests |= {r["digest"] for r in rows}
            print(json.dumps({"kind": kind, "window_mib": window, "gib": round(total / 2**30, 2), "repeats": len(rows),
                              "median_s": statistics.median(r["seconds"] for r in rows),
                              "all_s": [r["seconds"] for r in rows],
                              "rss_growth_mib": max(r["rss_growth_mib"] for r in rows), "cpus": os.cpu_count()}),
                  flush=True)
    if len(digests) != 1:
        raise SystemExit(f"the window sizes gave different digests: {sorted(digests)}")
    if args.sha256:
        row = run("sha256", 16, args.files)
        print(json.dumps({"kind": "sha256", "gib": round(total / 2**30, 2), "seconds": row["seconds"]}), flush=True)


if __name__ == "__main__":
    main()
