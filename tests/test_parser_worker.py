"""The engines' parser worker (llmopt.deploy.validate_engine.ask_parser): an engine's Python is started once a
process, and every check after the first is answered by it without importing the engine again; a worker that dies
or runs past its time is ended, says why, and the next check starts another. A script in this Python stands in for
the engine's."""

from __future__ import annotations

import os
import sys

from llmopt.deploy.validate_engine import ask_parser

SCRIPT = """
import json, os, sys, time


def check(what):
    if what == "die":
        sys.stderr.write("the engine gave up\\n")
        sys.stderr.flush()
        os._exit(3)
    if what == "hang":
        time.sleep(60)
    print("the engine talks on stdout too")
    return {"pid": os.getpid(), "what": what}
"""


def ask(what: str, timeout: float = 60, **env):
    return ask_parser(sys.executable, SCRIPT, [what], dict(os.environ, **env), timeout)


def test_checks_after_the_first_are_answered_by_the_same_process():
    first, second = ask("a"), ask("b")
    assert (first["what"], second["what"]) == ("a", "b")
    assert first["pid"] == second["pid"] != os.getpid()


def test_a_worker_that_dies_says_why_and_the_next_check_starts_another():
    before = ask("a")
    died = ask("die")
    assert died.startswith("the validation script failed") and "the engine gave up" in died
    assert ask("b")["pid"] != before["pid"]


def test_a_worker_past_its_time_is_ended_and_the_next_check_starts_another():
    before = ask("a")
    assert ask("hang", timeout=2) == "took over 2s"
    assert ask("b")["pid"] != before["pid"]


def test_another_engine_setting_starts_another_worker_and_another_variable_does_not():
    """pytest names the running test in PYTEST_CURRENT_TEST: a worker restarted on every change of the
    environment would import the engine once a test."""
    first = ask("a")["pid"]
    assert ask("b", PYTEST_CURRENT_TEST="another test")["pid"] == first
    assert ask("c", VLLM_LOGGING_LEVEL="DEBUG")["pid"] != first
