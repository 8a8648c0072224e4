"""The suite's own machinery in tests/conftest.py that a fresh clone depends on and a quick run would not show."""

from __future__ import annotations

import subprocess
import sys
import time

from conftest import wait_for_exit


def test_the_wait_for_vllm_s_build_ends_when_the_build_is_a_zombie():
    """SGLang's environment is built after vLLM's, by a shell that waits for vLLM's build process to end. That
    process is a test worker's child; while the worker is busy elsewhere nothing reaps it, so the wait must see a
    zombie as ended."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    time.sleep(1)  # it has exited; not reaped (no wait), so it is a zombie
    try:
        started = time.monotonic()
        subprocess.run(["sh", "-c", wait_for_exit(child.pid) + "true"], timeout=20, check=True)
        assert time.monotonic() - started < 10
    finally:
        child.wait()


def test_the_wait_for_vllm_s_build_waits_while_it_runs():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3)"])
    try:
        started = time.monotonic()
        subprocess.run(["sh", "-c", wait_for_exit(child.pid) + "true"], timeout=20, check=True)
        assert time.monotonic() - started >= 2
    finally:
        child.wait()


def dealt_at_the_start(items) -> tuple[list[str], list[str]]:
    """The units of work pytest-xdist's scheduling by scope (``ModulesQuickstartFirst``) gives its two workers
    before any test ends: the first unit to one, the second to the other, then one more to each whose units hold
    two tests or fewer (xdist/scheduler/loadscope.py, ``schedule`` and ``_reschedule``)."""
    import conftest

    units: dict[str, list] = {}
    for item in items:
        units.setdefault(conftest.ModulesQuickstartFirst._split_scope(None, item.nodeid), []).append(item)
    queue = list(units)
    workers = [[queue.pop(0)], [queue.pop(0)]]
    for worker in workers:
        if sum(len(units[unit]) for unit in worker) <= 2:
            worker.append(queue.pop(0))
    return workers[0], workers[1]


def test_neither_worker_starts_with_a_test_that_waits_for_the_quickstart_run_before_other_work(monkeypatch):
    """Under ``make test`` one worker makes the quickstart run (its module has one test) and the other takes the
    other modules. The unit xdist tops the first worker up with waits behind the run for half an hour: it must be
    a test that needs the run anyway (a docs measurement), and the other worker's first unit must not (once the
    measurement went second, both workers waited for the run)."""
    from types import SimpleNamespace

    import conftest

    def item(nodeid: str, *fixtures: str):
        return SimpleNamespace(nodeid=nodeid, fixturenames=list(fixtures))

    docs = "tests/test_docs_commands.py::test_documented_command"
    items = [item("tests/test_bench_dataset.py::test_a"), item("tests/test_bench_dataset.py::test_b"),
             item("tests/test_bench_dataset.py::test_c"), item("tests/test_bench_engine.py::test_a"),
             item(f"{docs}[docs/bench.md:23-shared-36a24862]", "quickstart"), item(f"{docs}[docs/ci.md:12]", "quickstart"),
             item(f"{docs}[docs/cli.md:296-shared-eedb8e5e]", "quickstart"), item("tests/test_quickstart.py::test_run", "quickstart"),
             item("tests/test_records.py::test_each"), item(conftest.GGUF_RECORD, "gguf_run"),
             item(conftest.QUICKSTART_LAST, "quickstart")]
    monkeypatch.setattr(conftest, "WORKER", "gw0")
    baselines = item("tests/test_quickstart_baselines.py::test_scored", "quickstart_cache")
    items.insert(7, baselines)
    conftest.pytest_collection_modifyitems(None, None, items)
    quickstart_worker, other = dealt_at_the_start(items)
    assert quickstart_worker == ["tests/test_quickstart.py", "measurement 36a24862"]
    assert other == ["tests/test_bench_dataset.py"]
    order = [i.nodeid for i in items]  # the run's baselines on the other worker, after the bench modules, early
    assert order.index("tests/test_bench_engine.py::test_a") < order.index(baselines.nodeid) < order.index(
        "tests/test_records.py::test_each")
    assert order.index(conftest.GGUF_RECORD) > order.index("tests/test_records.py::test_each")
    assert order.index(conftest.GGUF_RECORD) < order.index(f"{docs}[docs/cli.md:296-shared-eedb8e5e]")
