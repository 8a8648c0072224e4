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
