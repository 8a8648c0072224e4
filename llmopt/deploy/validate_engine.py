"""Check a launch config with the serving engine's own parser, or with its flag table.

vLLM: given a Python interpreter that has vLLM installed (an argument, the recipe's
``serve.engine_python`` or ``$LLMOPT_VLLM_PYTHON``; ``make vllm-env`` builds one in
``.test-envs/vllm``), a small script runs in that interpreter with ``VLLM_TARGET_DEVICE=cpu``:
``EngineArgs.add_cli_args(FlexibleArgumentParser())`` parses ``--model <folder> --config
config.yaml`` and ``EngineArgs.from_cli_args(ns).create_engine_config()`` builds the engine
config against the real model folder (its config.json, tokenizer and quantization), which
is where vLLM refuses bad parallel sizes, context lengths and quantization methods; an option
the parser lacks, and a ``false`` its config loader would drop, are named first. Nothing
is loaded onto a device. Without such an interpreter the config is checked against the
versioned flag table (``llmopt.deploy.flags``) plus the same shape rules, and the result
says which was used (``validated_by``).

SGLang: given a Python with SGLang (the recipe's ``serve.engine_python`` or ``$LLMOPT_SGLANG_PYTHON``;
``make sglang-env`` builds one in ``.test-envs/sglang``), a script parses llmopt's launch arguments in that
interpreter with ``prepare_server_args`` (``ServerArgs.add_cli_args`` on launch_server's argparse, then the
``ServerArgs`` record), names the options the parser lacks first (argparse would take an unknown option that
abbreviates a known one), checks that each value reaches ``ServerArgs`` as written and that SGLang knows the
speculative algorithm. It stops before ``ServerArgs.resolve_once``, the launcher's step that reads the model
and the platform (it needs transformers and a device), so parallel sizes against the model are left to
``shape_errors``. SGLang's parser needs no GPU.

Either script runs in a worker kept for the process (``ParserWorker``): the engine is imported once, and each
config after the first is checked in a second or two.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import subprocess
import tempfile
import threading
from pathlib import Path

from llmopt.deploy import flags
from llmopt.errors import UsageError

ENV_VAR = "LLMOPT_VLLM_PYTHON"
SGLANG_ENV_VAR = "LLMOPT_SGLANG_PYTHON"
MARK = "LLMOPT_RESULT "

VLLM_SCRIPT = r"""
import contextlib, io, json, os, sys


def check(model, config):
    out = {"ok": False, "errors": [], "version": None, "stage": "import"}
    try:
        import vllm
        from vllm.engine.arg_utils import EngineArgs
        from vllm.utils.argparse_utils import FlexibleArgumentParser
        out["version"] = vllm.__version__
        out["stage"] = "parser"
        parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
        out["stage"] = "config"
        import yaml
        with open(config) as f:
            written = yaml.safe_load(f) or {}
        options = parser._option_string_actions
        out["unknown"] = sorted(k for k in written if "--" + str(k) not in options)
        if out["unknown"]:
            raise ValueError("unknown option(s): " + ", ".join("--" + k for k in out["unknown"]))
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                ns = parser.parse_args(["--model", model, "--config", config])
        except SystemExit:
            raise ValueError(err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else "argument error")
        for key, value in written.items():
            got = getattr(ns, options["--" + key].dest, None)
            if value is False and got is not False:
                raise ValueError(f"{key}: false in a config file reaches this vLLM as {got} (its loader drops it); "
                                 f"write no-{key}: true")
        engine = EngineArgs.from_cli_args(ns).create_engine_config()
        out["engine"] = {
            "max_model_len": engine.model_config.max_model_len,
            "dtype": str(engine.model_config.dtype),
            "quantization": engine.model_config.quantization,
            "tensor_parallel_size": engine.parallel_config.tensor_parallel_size,
            "pipeline_parallel_size": engine.parallel_config.pipeline_parallel_size,
            "max_num_seqs": engine.scheduler_config.max_num_seqs,
            "max_num_batched_tokens": engine.scheduler_config.max_num_batched_tokens,
            "gpu_memory_utilization": engine.cache_config.gpu_memory_utilization,
        }
        out["ok"] = True
    except Exception as exc:
        out["errors"].append(f"{type(exc).__name__}: {exc}".strip())
    return out
"""


SGLANG_SCRIPT = r"""
import contextlib, io, json, sys


class Refused(Exception):
    pass


def check(argv, written):
    out = {"ok": False, "errors": [], "version": None, "stage": "import", "unknown": []}
    try:
        import argparse
        import sglang
        from sglang.srt.server_args import ServerArgs, prepare_server_args
        out["version"] = sglang.__version__
        out["stage"] = "parser"
        parser = argparse.ArgumentParser(prog="sglang serve")
        ServerArgs.add_cli_args(parser)
        options = parser._option_string_actions
        out["stage"] = "config"
        out["unknown"] = sorted({a[2:] for a in argv if a.startswith("--") and a not in options})
        if out["unknown"]:
            raise Refused("unknown option(s): " + ", ".join("--" + k for k in out["unknown"]))
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                args = prepare_server_args(argv)
        except SystemExit:
            raise Refused(err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else "argument error")
        for key, value in written.items():
            got = getattr(args, options["--" + key].dest, None)
            if isinstance(value, bool):
                same = bool(got) == value
            elif isinstance(value, (int, float)):
                same = isinstance(got, (int, float)) and float(got) == float(value)
            elif isinstance(value, str):
                same = str(got) == value
            else:
                continue
            if not same:
                out["errors"].append(f"{key}: written as {value!r}, reaches ServerArgs as {got!r}")
        if getattr(args, "speculative_algorithm", None):
            from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
            SpeculativeAlgorithm.from_string(args.speculative_algorithm)
        out["server_args"] = {k: getattr(args, k, None) for k in (
            "model_path", "served_model_name", "dtype", "quantization", "context_length", "mem_fraction_static",
            "max_running_requests", "chunked_prefill_size", "tp_size", "pp_size", "dp_size", "ep_size",
            "speculative_algorithm", "speculative_num_steps", "speculative_num_draft_tokens", "port")}
        out["ok"] = not out["errors"]
    except Refused as exc:
        out["errors"].append(str(exc))
    except Exception as exc:
        out["errors"].append(f"{type(exc).__name__}: {exc}".strip())
    return out
"""

# After either script: one request a line on stdin (check's arguments as a JSON list), one answer a line on
# stdout after MARK; whatever the engine prints on its own is skipped by the reader.
SERVE = r"""

for line in sys.stdin:
    answer = check(*json.loads(line))
    sys.stdout.write("LLMOPT_RESULT " + json.dumps(answer, default=str) + "\n")
    sys.stdout.flush()
"""


class ParserWorker:
    """An engine's Python kept running with its parser script: the engine's import (15 to 20 s for vLLM on a
    2-vCPU VM) is paid once a process rather than once a config, which is what a sweep's deploy stages, or a
    test session, would otherwise pay again and again. One check at a time (a lock); a worker that dies or
    runs past its time is ended, and the next check starts another. A forked child starts its own, never
    sharing its parent's pipes."""

    def __init__(self, argv: list[str], env: dict):
        self.env, self.pid, self.lock, self.answers = env, os.getpid(), threading.Lock(), queue.Queue()
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115 - open while the worker lives; close() closes it
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                     env=env, text=True, bufsize=1)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith(MARK):
                self.answers.put(json.loads(line[len(MARK):]))
        self.answers.put(None)  # the process ended

    def ask(self, args: list, timeout: float) -> dict | str:
        """check(*args)'s answer, or why there is none (the process's last words, or the timeout)."""
        try:
            self.proc.stdin.write(json.dumps(args) + "\n")
            self.proc.stdin.flush()
        except (OSError, ValueError):
            pass  # it has ended: an answer it gave first is in the queue, else the end is
        try:
            answer = self.answers.get(timeout=timeout)
        except queue.Empty:
            self.close()
            return f"took over {timeout:.0f}s"
        if answer is None:
            self.stderr.seek(0)
            tail = self.stderr.read().decode(errors="replace").strip().splitlines()[-3:]
            self.close()
            return "the validation script failed: " + " | ".join(tail)
        return answer

    def alive(self) -> bool:
        return self.proc.poll() is None and self.pid == os.getpid()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()


SETTINGS = ("VLLM_", "SGLANG_", "SGL_", "HF_", "TRANSFORMERS_", "CUDA_", "PYTHON")


def engine_settings(env: dict) -> dict:
    """The variables of ``env`` that can change what an engine's parser says (the engine's own, the Hugging Face
    hub's, CUDA's, Python's); a change of any other (a test runner's name of the running test) keeps the worker."""
    return {k: v for k, v in env.items() if k.startswith(SETTINGS)}


_workers: dict[tuple, ParserWorker] = {}
_workers_lock = threading.Lock()


def ask_parser(exe: str, script: str, args: list, env: dict, timeout: float) -> dict | str:
    """``check(*args)`` of ``script`` in the interpreter ``exe``, through the worker kept for it (started on the
    first call, and again when ``env``'s engine settings differ from those it was started with)."""
    key = (exe, script)
    with _workers_lock:
        worker = _workers.get(key)
        if worker is None or not worker.alive() or engine_settings(worker.env) != engine_settings(env):
            if worker is not None and worker.pid == os.getpid():
                worker.close()
            worker = _workers[key] = ParserWorker([exe, "-c", script + SERVE], env)
    with worker.lock:
        return worker.ask(args, timeout)


@atexit.register
def _close_workers() -> None:
    for worker in _workers.values():
        if worker.pid == os.getpid():
            worker.close()


def engine_python(explicit: str | None = None) -> str | None:
    """The interpreter to validate with: the argument, else $LLMOPT_VLLM_PYTHON, else None."""
    return explicit or os.environ.get(ENV_VAR) or None


def validate_vllm(config_path: Path, model_dir: Path, python: str | None = None, timeout: int = 900,
                  version: str | None = None) -> dict:
    """``{"ok", "validated_by", "errors", "unknown", "stage"}`` for a vLLM config.yaml and the model folder it
    serves (``unknown``: the config's options the installed parser lacks; ``stage``: where a failure came from,
    "import" or "parser" when vLLM could not build its parser here, "config" when it judged the config). ``version``: the vLLM release the config is
    written for, and ``python`` the one that has it installed (None: llmopt's flag table of that version); without
    ``version``, ``python`` falls back to $LLMOPT_VLLM_PYTHON and the table to vLLM 0.33.0's."""
    exe = engine_python(python) if version is None else python
    if exe is None:
        return vllm_table_check(_load_yaml(config_path), model_dir, version or flags.VLLM_VERSION)
    if not Path(exe).is_file():
        raise UsageError(f"the vLLM Python {exe!r} does not exist", where=ENV_VAR if not python else "serve.engine_python",
                         fix="run `make vllm-env` (it builds .test-envs/vllm/bin/python) or unset it")
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               VLLM_LOGGING_LEVEL="ERROR", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    result = ask_parser(exe, VLLM_SCRIPT, [str(Path(model_dir).resolve()), str(Path(config_path).resolve())], env,
                        timeout)
    if isinstance(result, str):
        if result.startswith("took"):
            return {"ok": False, "validated_by": "vllm EngineArgs", "errors": [f"vLLM's parser {result}"]}
        return {"ok": False, "validated_by": "vllm EngineArgs", "stage": "import", "errors": [result]}
    result["validated_by"] = f"vllm {result.pop('version')} EngineArgs"
    return result


def validate_sglang(argv: list[str], written: dict, python: str, timeout: int = 300) -> dict:
    """``{"ok", "validated_by", "errors", "unknown", "stage"}`` of launch_server's arguments ``argv`` (the whole
    command line after ``-m sglang.launch_server``) as the SGLang in ``python`` parses them; ``written``: llmopt's
    options by long name, whose values must reach ``ServerArgs`` as written. ``unknown``: the options its parser
    lacks; ``stage``: "import" or "parser" when SGLang could not build its parser, "config" when it judged them."""
    if not Path(python).is_file():
        raise UsageError(f"the SGLang Python {python!r} does not exist", where="serve.engine_python",
                         fix="run `make sglang-env` (it builds .test-envs/sglang/bin/python) or leave it out")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONWARNINGS="ignore", DO_NOT_TRACK="1")
    result = ask_parser(python, SGLANG_SCRIPT, [argv, written], env, timeout)
    if isinstance(result, str):
        if result.startswith("took"):
            return {"ok": False, "validated_by": "sglang ServerArgs", "errors": [f"SGLang's parser {result}"]}
        return {"ok": False, "validated_by": "sglang ServerArgs", "stage": "import", "errors": [result]}
    result["validated_by"] = f"sglang {result.pop('version')} ServerArgs"
    return result


def _load_yaml(path: Path) -> dict:
    from llmopt.libraries import require

    yaml = require("yaml", "deploy", "checking launch configs", package="pyyaml")

    return yaml.safe_load(Path(path).read_text()) or {}


def check_flags(config: dict, types: dict, names: frozenset | None = None, prefix: str = "",
                nested: dict | None = None) -> tuple[list, list]:
    """Errors and warnings of ``config`` against a flag table: unknown names, wrong types or choices.
    ``names`` is the engine's full option list (None: ``types`` is a curated subset, so unknown keys warn);
    ``nested`` the full field lists of tables (``{"kv_cache_config": frozenset(...)}``), checked the same way."""
    errors, warnings = [], []
    for key, value in config.items():
        spec = types.get(key)
        label = prefix + key
        if names is not None and key not in names:
            errors.append(f"unknown option {label!r}")
            continue
        if spec is None:
            if names is None:
                warnings.append(f"{label!r} is not in llmopt's flag table; passed through unchecked")
            continue
        if isinstance(spec, dict) and isinstance(value, dict):
            sub_errors, sub_warnings = check_flags(value, spec, (nested or {}).get(key), label + ".")
            errors += sub_errors
            warnings += sub_warnings
        elif problem := _type_problem(value, spec):
            errors.append(f"{label}: {problem}")
    return errors, warnings


def _type_problem(value, spec) -> str:
    if isinstance(spec, tuple):
        return "" if value in spec else f"{value!r} is not one of {', '.join(map(str, spec))}"
    if isinstance(spec, dict):
        return "" if isinstance(value, dict) else f"expected a table, got {value!r}"
    if spec is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif spec is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, spec)
    return "" if ok else f"expected {spec.__name__}, got {value!r}"


def vllm_table_check(config: dict, model_dir: Path, version: str = flags.VLLM_VERSION) -> dict:
    """llmopt's flag table of a vLLM release (0.33.0 unless named) plus the shape rules vLLM's
    create_engine_config applies."""
    config = {k.replace("_", "-"): v for k, v in config.items()}
    names = flags.VLLM_TABLES[version]
    errors, _ = check_flags(config, flags.VLLM_TYPES, names)
    unknown = sorted(k for k in config if k not in names)
    model_config = Path(model_dir) / "config.json"
    if model_config.is_file():
        from llmopt.model.modelinfo import from_folder

        errors += shape_errors(from_folder(model_dir), config.get("tensor-parallel-size", 1),
                               config.get("max-model-len"), config.get("max-num-seqs"),
                               config.get("max-num-batched-tokens"), config.get("enable-chunked-prefill", True))
    return {"ok": not errors, "validated_by": f"flag table vllm {version}", "errors": errors, "unknown": unknown}


def shape_errors(info, tp: int, max_model_len, max_num_seqs, batched, chunked: bool) -> list[str]:
    errors = []
    if isinstance(tp, int) and tp > 0:
        if info.num_heads % tp:
            errors.append(f"total number of attention heads ({info.num_heads}) must be divisible by tensor "
                          f"parallel size ({tp})")
        if info.num_kv_heads % tp and tp % info.num_kv_heads:
            errors.append(f"KV heads ({info.num_kv_heads}) and tensor parallel size ({tp}) must divide one another")
    if isinstance(max_model_len, int) and info.max_position and max_model_len > info.max_position:
        errors.append(f"max_model_len {max_model_len} exceeds the model's max_position_embeddings {info.max_position}")
    if isinstance(batched, int) and isinstance(max_num_seqs, int) and batched < max_num_seqs:
        errors.append(f"max_num_batched_tokens ({batched}) must be at least max_num_seqs ({max_num_seqs})")
    if not chunked and isinstance(batched, int) and isinstance(max_model_len, int) and batched < max_model_len:
        errors.append(f"without chunked prefill max_num_batched_tokens ({batched}) must be at least "
                      f"max_model_len ({max_model_len})")
    return errors


def validate_table(engine: str, config: dict, types: dict, names: frozenset | None, version: str,
                   nested: dict | None = None) -> dict:
    """Flag-table validation for an engine llmopt cannot run here (TensorRT-LLM, SGLang)."""
    errors, warnings = check_flags(config, types, names, nested=nested)
    return {"ok": not errors, "validated_by": f"flag table {engine} {version}", "errors": errors, "warnings": warnings}
