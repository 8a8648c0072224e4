"""The engine version a launch config is written for, the engine installed here, and the image tag.

A GPU serve backend writes for one version of its engine: its ``engine_version`` option, else the version of
the engine installed here, else the version llmopt's flag table was written for (``llmopt.deploy.flags``).
vLLM counts as installed when a Python with vLLM is named (``engine_python``, ``$LLMOPT_VLLM_PYTHON``) or the
``vllm`` on PATH is a Python script, SGLang when a Python with it is named (``engine_python``,
``$LLMOPT_SGLANG_PYTHON``; the ``sglang`` on PATH is not looked for); the version is read in that Python
(``importlib.metadata``), never by importing the engine into llmopt. Every flag the config writes is checked at plan time against llmopt's table of
that version, and at the deploy stage by that version's own parser where it is installed
(``llmopt.deploy.validate_engine``). A version that is neither in a table nor installed here is a plan error, as is
a flag the version lacks. The container image's tag follows the version (``image_tag``).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from llmopt.errors import Problem

PATTERN = r"^v?\d+\.\d+\.\d+((rc|a|b|\.post|\.dev)\d+)?$"  # an engine_version option: "0.26.0", "v0.26.0"
VERSION = re.compile(r"^v?(\d+\.\d+\.\d+(?:(?:rc|a|b|\.post|\.dev)\d+)?)$")
READ_VERSION = "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))"


@dataclass(frozen=True)
class Installed:
    """An engine installed here: its version (without a local part such as +cu130), the Python that has it,
    and how llmopt found that Python."""

    version: str
    python: str
    found_by: str  # "serve.engine_python", "$LLMOPT_VLLM_PYTHON", "`vllm` on PATH"


@dataclass(frozen=True)
class Choice:
    """The version a config is written for, and what checks its flags."""

    engine: str  # vLLM | SGLang | TensorRT-LLM
    version: str
    source: str  # where the version came from
    table: frozenset | None  # llmopt's flag table of the version; None: it has none (the installed parser checks)
    installed: Installed | None = None  # the installed engine, when it is this version
    error: tuple[str, str] | None = None  # (what, how to fix): the version cannot be written for
    warning: str | None = None

    @property
    def checked_by(self) -> str:
        """What checks the flags: the installed engine's parser or llmopt's table of the version."""
        if self.installed is not None:
            return f"{self.engine} {self.version}'s own parser ({self.installed.python})"
        return self.table_name

    @property
    def table_name(self) -> str:
        return f"llmopt's flag table of {self.engine} {self.version}"

    def missing(self, names) -> list[str]:
        """The names the version's table lacks (none when only the installed parser knows the version)."""
        return [] if self.table is None else sorted(set(names) - self.table)


def normalized(version: str) -> str | None:
    """``0.26.0`` of "0.26.0", "v0.26.0" or an installed "0.26.0+cu130"; None for anything else."""
    match = VERSION.match(version.strip().split("+")[0])
    return match.group(1) if match else None


@functools.lru_cache(maxsize=None)
def read_version(python: str, dist: str) -> str | None:
    """The version of ``dist`` installed for ``python`` (read in that interpreter, not imported), or None."""
    try:
        done = subprocess.run([python, "-c", READ_VERSION, dist], capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, PYTHONWARNINGS="ignore"))
    except (OSError, subprocess.TimeoutExpired):
        return None
    return normalized(done.stdout.strip()) if done.returncode == 0 else None


def script_python(path: str) -> str | None:
    """The Python interpreter that runs a console script: its ``#!`` line, or the ``exec`` of pip's ``/bin/sh``
    preamble for a long interpreter path; None for any other program (a shell wrapper, a binary)."""
    try:
        head = Path(path).read_bytes()[:1024].decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    if not head or not head[0].startswith("#!"):
        return None
    words = head[0][2:].split()
    if words and Path(words[0]).name.startswith("python"):
        return words[0]
    if words == ["/bin/sh"] and len(head) > 1 and (found := re.match(r"'''exec' \"?([^\" ]+)\"? ", head[1])):
        return found.group(1) if Path(found.group(1)).name.startswith("python") else None
    return None


def installed_vllm(explicit: str | None, env_var: str) -> tuple[Installed | None, tuple[str, str, str] | None]:
    """The vLLM installed here and, when a Python was named that has none, the (what, where, fix) of that."""
    return installed("vllm", "vLLM", explicit, env_var, program="vllm")


def installed(dist: str, engine: str, explicit: str | None, env_var: str, program: str | None = None
              ) -> tuple[Installed | None, tuple[str, str, str] | None]:
    """The engine ``dist`` in the Python named by ``explicit`` (serve.engine_python), else by ``$env_var``, else
    (with ``program``) the Python of that console script on PATH; when a named Python has no ``dist``, the
    (what, where, fix) of that. ``make <dist>-env`` builds one in .test-envs/<dist>."""
    for python, found_by in ((explicit, "serve.engine_python"), (os.environ.get(env_var), f"${env_var}")):
        if not python:
            continue
        version = read_version(python, dist) if Path(python).is_file() else None
        if version is None:
            return None, (f"the Python {python!r} has no {engine} installed", found_by,
                          f"run `make {dist}-env` (it builds .test-envs/{dist}/bin/python), name a Python with "
                          f"{engine}, or leave it out to write for engine_version against llmopt's flag table")
        return Installed(version, python, found_by), None
    if program is None:
        return None, None
    program = shutil.which(program)
    python = script_python(program) if program else None
    version = read_version(python, dist) if python else None
    return (Installed(version, python, f"`vllm` on PATH ({program})") if version else None), None


def choose(engine: str, stated: str | None, installed: Installed | None, tables: dict[str, frozenset],
           default: str) -> Choice:
    """The version to write for: ``stated``, else the installed one, else ``default`` (the table's)."""
    known = ", ".join(sorted(tables))
    if stated is None and installed is not None:
        version, source = installed.version, f"installed here ({installed.found_by})"
    else:
        version, source = stated or default, "serve.engine_version" if stated else "llmopt's flag table"
    here = installed if installed is not None and installed.version == version else None
    table, warning = tables.get(version), None
    if installed is not None and here is None:
        warning = (f"{engine} {installed.version} is installed here ({installed.found_by}) but the config is "
                   f"written for {version}: its flags are checked against llmopt's table of {version}, not by "
                   f"{engine}'s own parser")
    if table is None and here is None:
        return Choice(engine, version, source, None, error=(
            f"llmopt has no flag table of {engine} {version}, and {engine} {version} is not installed here"
            + (f" (the one at {installed.python} is {installed.version})" if installed else ""),
            f"name a Python with {engine} {version} installed (engine_python), or set engine_version to one "
            f"llmopt knows: {known}"))
    return Choice(engine, version, source, table, here, warning=warning)


def table_choice(engine: str, stated: str | None, tables: dict[str, frozenset], default: str) -> Choice:
    """The version of an engine llmopt checks by its flag table only (TensorRT-LLM)."""
    return choose(engine, normalized(stated) if stated else None, None, tables, default)


def image_tag(tag: str | None, version: str, prefix: str = "v") -> str:
    """The image tag: the one given, else the engine version's (``v0.26.0`` for vllm/vllm-openai)."""
    return tag or f"{prefix}{version}"


def problems(choice: Choice, bad: tuple[str, str, str] | None, ctx) -> list[Problem]:
    """The plan's findings about the release a config is written for (``ctx``: the backend's PlanContext); ``bad``:
    an engine_python that could not be read, as (what, where, fix)."""
    found = []
    if bad:
        what, found_by, fix = bad
        found.append(Problem(what, ctx.where("engine_python") if found_by == "serve.engine_python" else found_by,
                                fix))
    if choice.error:
        found.append(Problem(choice.error[0], ctx.where("engine_version"), choice.error[1]))
    if choice.warning:
        found.append(Problem(choice.warning, ctx.where("engine_version"), "set engine_version to the installed "
                                "release, or name a Python with the release written for (engine_python)",
                                severity="warning"))
    return found
