"""Start the server a folder target needs, and always stop it.

An artifact's own launch config starts it: ``deploy/<engine>/launch.sh`` for vLLM, SGLang
and TensorRT-LLM (when the engine is installed here; else an error, exit 4, naming it) and
for ort (``llmopt serve`` over the tuned ONNX Runtime config); an artifact without deploy
configs, or a model folder, is served by ``llmopt serve``. ``--host 127.0.0.1 --port P`` is
appended (the last value of an option wins in every one of these parsers).

The server runs in its own process group, which is killed (SIGTERM, then SIGKILL) when the
benchmark ends for any reason: success, error, timeout, Ctrl-C or SIGTERM. Its pid is written
to ``<cache>/bench/engines/<pid>.json`` while it runs, so that a later ``llmopt bench`` stops
a server left behind by a ``kill -9`` of llmopt.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from llmopt.store.cache import host_tag, process_exists
from llmopt.errors import EXIT_MISSING_EXTRA, LlmoptError, StageFailed

STOP_GRACE_S = 20.0
POLL_S = 0.5
# engine -> (how to tell it is installed, its pinned version, what to install)
INSTALLED_BY = {"vllm": ("vllm", "vllm==0.33.0"), "trtllm": ("trtllm-serve", "tensorrt-llm==1.2.1"),
                "sglang": (None, "sglang==0.5.23")}


class EngineMissing(LlmoptError):
    """The launch config starts an engine that is not installed here."""

    exit_code = EXIT_MISSING_EXTRA


class Interrupted(LlmoptError):
    """Ctrl-C, SIGTERM or SIGHUP during a benchmark (after its server was stopped)."""

    exit_code = 130


@dataclass
class Launch:
    """A server to start: its command, where, and what it is."""

    engine: str  # llmopt | ort | vllm | sglang | trtllm
    argv: list[str]
    cwd: Path
    env: dict[str, str] = field(default_factory=dict)
    cleanup: list[Path] = field(default_factory=list)  # temporary folders removed after the stop


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def engine_installed(engine: str) -> bool:
    if engine == "sglang":
        python = shutil.which("python3")
        return bool(python) and subprocess.run(
            [python, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('sglang') is None)"],
            capture_output=True).returncode == 0
    return shutil.which(INSTALLED_BY[engine][0]) is not None


def llmopt_shim() -> Path:
    """A folder with an ``llmopt`` that runs this interpreter's llmopt, for launch scripts that call it."""
    folder = Path(tempfile.mkdtemp(prefix="llmopt-bench-bin-"))
    shim = folder / "llmopt"
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} -m llmopt \"$@\"\n")
    shim.chmod(0o755)
    return folder


def plan_launch(folder: Path, engine: str, port: int) -> Launch:
    """How to serve ``folder`` (artifact or model folder) with ``engine`` (auto: its deploy config)."""
    deploy = folder / "deploy"
    found = sorted(p.parent.name for p in deploy.glob("*/launch.sh")) if deploy.is_dir() else []
    if engine == "auto":
        manifest = folder / "manifest.json"
        recorded = served_engine(json.loads(manifest.read_text())) if manifest.is_file() else None
        engine = recorded if recorded in found else (found[0] if len(found) == 1 else "llmopt")
    address = ["--host", "127.0.0.1", "--port", str(port)]
    if engine == "llmopt":
        return Launch("llmopt", [sys.executable, "-m", "llmopt", "serve", str(folder), *address, "--format", "quiet"],
                      folder)
    script = deploy / engine / "launch.sh"
    if not script.is_file():
        raise LlmoptError(f"{folder} has no deploy/{engine}/launch.sh", where=str(folder),
                          fix=f"choose one of: {', '.join(['llmopt', *found])} (--engine), or pass a server's URL")
    if engine == "ort":
        shim, run_dir = llmopt_shim(), Path(tempfile.mkdtemp(prefix="llmopt-bench-ort-"))
        env = {"PATH": f"{shim}{os.pathsep}{os.environ.get('PATH', '')}", "LLMOPT_RUN_DIR": str(run_dir)}
        return Launch("ort", ["bash", str(script), *address], folder, env, [shim, run_dir])
    if not engine_installed(engine):
        what, pin = INSTALLED_BY[engine]
        raise EngineMissing(
            f"the artifact's launch config starts {engine}, which is not installed on this machine"
            + (f" (no `{what}` on PATH)" if what else " (python3 cannot import sglang)"),
            where=str(script), fix=f"install {engine} ({pin}) where the GPU is and run llmopt bench there; or start "
            "the server yourself and pass its URL; or --engine llmopt to serve the model with llmopt serve")
    return Launch(engine, ["bash", str(script), *address], folder)


def served_engine(manifest: dict) -> str | None:
    """The engine an artifact is served with: its deploy stage's (the chosen one, of several engines in [serve]
    backend), else the one its recipe names; None without [serve]."""
    serve = ((manifest.get("recipe") or {}).get("resolved") or {}).get("serve") or {}
    backend = serve.get("backend")
    return (manifest.get("deploy") or {}).get("engine") or (backend if isinstance(backend, str) else None)


# --- pid files -------------------------------------------------------------------------------------------------

def _stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat after the command name (Linux): [state, ppid, ...]; None elsewhere or when gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _start_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks (Linux), to tell it from a later process with its pid."""
    stat = _stat(pid)
    return stat[19] if stat and len(stat) > 19 else None


def _alive(pid: int, ticks: str | None = None) -> bool:
    """Running (not a zombie), and the same process as when ``ticks`` was read."""
    if not process_exists(pid):
        return False
    stat = _stat(pid)
    if stat is None:
        return True
    return stat[0] != "Z" and (ticks is None or stat[19] == ticks)


def pid_dir(cache_root: Path) -> Path:
    return Path(cache_root) / "bench" / "engines"


def stop_leftovers(cache_root: Path) -> list[dict]:
    """Stop servers that an llmopt bench which is gone (killed) started on this host; returns what was
    stopped. Records of other hosts sharing the cache are left: their processes cannot be seen from here."""
    stopped = []
    for path in sorted(pid_dir(cache_root).glob("*.json")):
        try:
            info = json.loads(path.read_text())
        except (OSError, ValueError):
            path.unlink(missing_ok=True)
            continue
        if info.get("host", host_tag()) != host_tag():
            continue
        if _alive(info["owner_pid"], info.get("owner_ticks")):
            continue  # its bench is still running
        if _alive(info["pid"], info.get("ticks")):
            kill_group(info["pgid"], None)
            stopped.append(info)
        path.unlink(missing_ok=True)
    return stopped


def kill_group(pgid: int, proc: subprocess.Popen | None, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM to the group, up to ``grace_s`` for the leader to exit, then SIGKILL to what is left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            break
        if proc is None and not _alive(pgid):  # the leader; the group gets SIGKILL below
            break
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    if proc is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


# --- one server's life -----------------------------------------------------------------------------------------

def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def terminate_as_interrupt():
    """SIGTERM and SIGHUP raise KeyboardInterrupt (so ``finally`` blocks run) while the block runs in the
    main thread; elsewhere nothing changes."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def running(launch: Launch, port: int, cache_root: Path, log_path: Path, startup_timeout_s: float, say=print):
    """Start ``launch``, wait until it answers, yield (its base URL, its pid); stop its process group on the
    way out, whatever the way."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    pids = pid_dir(cache_root)
    pids.mkdir(parents=True, exist_ok=True)
    with terminate_as_interrupt(), open(log_path, "ab") as log:
        proc = subprocess.Popen(launch.argv, cwd=launch.cwd, env={**os.environ, **launch.env}, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        record = pids / f"{host_tag()}.{proc.pid}.json"
        try:
            record.write_text(json.dumps({
                "host": host_tag(), "pid": proc.pid, "pgid": proc.pid, "ticks": _start_ticks(proc.pid), "argv": launch.argv,
                "owner_pid": os.getpid(), "owner_ticks": _start_ticks(os.getpid()), "started": time.time()}))
            url = f"http://127.0.0.1:{port}"
            say(f"started {launch.engine} (pid {proc.pid}); waiting for {url}/health (log: {log_path})")
            wait_ready(url, proc, log_path, startup_timeout_s)
            yield url, proc.pid
        finally:
            kill_group(proc.pid, proc)
            record.unlink(missing_ok=True)
            for folder in launch.cleanup:
                shutil.rmtree(folder, ignore_errors=True)


def wait_ready(url: str, proc: subprocess.Popen, log_path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise StageFailed(f"the server exited with code {proc.returncode} before it answered",
                              where=str(log_path), fix=f"read the end of its log:\n{log_tail(log_path)}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(POLL_S)
    raise StageFailed(f"the server did not answer {url}/health within {timeout_s:.0f} s", where=str(log_path),
                      fix="raise --startup-timeout, or read its log:\n" + log_tail(log_path))


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
