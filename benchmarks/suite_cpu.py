"""Where the test suite's time and CPU go: a pytest plugin that writes one JSON line per test.

    PYTHONPATH=benchmarks SUITE_CPU_OUT=/tmp/suite-cpu.jsonl .venv/bin/python -m pytest -q -p suite_cpu
    python3 benchmarks/suite_cpu.py /tmp/suite-cpu.jsonl          # totals by file, and the slowest tests

Per test (its fixtures' set-up included): ``wall`` seconds; ``self`` and ``children``, the CPU seconds of the
test process and of the children it has waited for (a child still running, such as the quickstart run that goes
on in the background, is counted when it is reaped); ``busy_all`` and ``idle_all``, the whole machine's busy and
idle core-seconds from /proc/stat, which is what shows whether two cores were used (anything else running on the
machine counts too, so measure on a quiet one).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict

import pytest

OUT = os.environ.get("SUITE_CPU_OUT", "suite-cpu.jsonl")


def machine() -> tuple[int, int]:
    """(all, idle) clock ticks of /proc/stat's first line."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    return sum(values), values[3] + values[4]


def cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    started, own, kids, (total, idle) = time.monotonic(), cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN), machine()
    yield
    total2, idle2 = machine()
    tick = os.sysconf("SC_CLK_TCK")
    record = {"id": item.nodeid, "wall": round(time.monotonic() - started, 2),
              "self": round(cpu(resource.RUSAGE_SELF) - own, 2), "children": round(cpu(resource.RUSAGE_CHILDREN) - kids, 2),
              "busy_all": round(((total2 - total) - (idle2 - idle)) / tick, 2), "idle_all": round((idle2 - idle) / tick, 2)}
    with open(OUT, "a") as f:
        f.write(json.dumps(record) + "\n")


def summarize(path: str) -> None:
    rows = [json.loads(line) for line in open(path)]
    keys = ("wall", "self", "children", "busy_all", "idle_all")
    by_file: dict[str, list[float]] = defaultdict(lambda: [0.0] * len(keys))
    for row in rows:
        sums = by_file[row["id"].split("::")[0]]
        for i, key in enumerate(keys):
            sums[i] += row[key]
    print("file                                          " + "  ".join(f"{k:>9}" for k in keys))
    for name, sums in sorted(by_file.items(), key=lambda kv: -kv[1][3])[:25]:
        print(f"{name[:45]:45} " + "  ".join(f"{v:9.0f}" for v in sums))
    print("total" + " " * 41 + "  ".join(f"{sum(s[i] for s in by_file.values()):9.0f}" for i in range(len(keys))))
    print("\nslowest tests")
    for row in sorted(rows, key=lambda r: -r["wall"])[:15]:
        print(f"{row['wall']:8.0f} s  {row['busy_all']:8.0f} busy  {row['idle_all']:6.0f} idle  {row['id']}")


if __name__ == "__main__":
    summarize(sys.argv[1])
