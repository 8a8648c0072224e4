"""What this machine's kernel says about memory: available RAM, and this process's peak RSS.

Both read a ``kB`` line of a /proc file (Linux) and fall back to the portable call elsewhere.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path


def proc_bytes(path: str, key: str) -> int | None:
    """The ``key:  N kB`` line of a /proc file, in bytes; None where the file or line is missing."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def available_ram() -> int | None:
    """MemAvailable of this machine in bytes (Linux), else the free pages, else None."""
    ram = proc_bytes("/proc/meminfo", "MemAvailable")
    if ram is not None:
        return ram
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def peak_rss_bytes() -> int:
    """This process's peak resident memory. Linux: VmHWM, which starts afresh at exec (ru_maxrss
    keeps the parent's peak across fork and exec, so a worker process would report its parent's)."""
    peak = proc_bytes("/proc/self/status", "VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
