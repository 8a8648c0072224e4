"""What ``[tune]`` searches for each engine, where each value lives in the launch config, and its candidates.

Each engine's space is data (``SPACES``): a parameter names the engine's own option, the file of
``deploy/<engine>/`` that holds it (``config.yaml``, ``genai_config.json``, or an argument of
``launch.sh``'s command) and how its candidates grow from the value the deploy stage predicted:

* ``size`` (a token budget a step): the prediction, x2 and x4. The memory model already fitted the
  prediction to the KV cache and the SLO, and starts from the engine's own defaults
  (``llmopt.catalog.engines``), so a search never goes below it;
* ``seqs`` (how many sequences a step may hold): as ``size``, but no value past the first that holds the
  workload's concurrency: a limit above the requests in flight cannot change how many run at once, so
  such a trial spends an engine start for nothing (on a live vLLM at 256 users, max-num-seqs 2,048 gained
  nothing on 1,024 and 4,096 measured 24% less, one run each, docs/results/tuning.md);
* ``fraction`` (the memory share the engine may take): the prediction, +0.03 and 0.95, never above 0.95;
* ``graph`` (vLLM's largest CUDA-graph batch, ``max-cudagraph-capture-size``): the prediction (vLLM's
  own when the config names none: twice max-num-seqs, at most 512 below Blackwell, vllm/config/vllm.py
  of 0.33.0), then 1024: decode batches above 512 run without a graph otherwise, at the cost of
  capture time and graph memory at start-up;
* ``threads`` (ONNX Runtime's intra-op threads): ONNX Runtime's own choice (the prediction when the
  deploy config names none) and 1 to the CPUs this machine has;
* ``slots`` (``llmopt serve --parallel``, requests generated at once): the prediction, then 1 to the
  CPUs this machine has, at most the workload's concurrency (more slots than requests in flight are idle);
* ``queue`` (``llmopt serve --max-queue``): the prediction, and llmopt serve's own queue for the workload
  (``queue_for``: 512, room for a load generator's sweep, or the concurrency when more) when the prediction
  is shorter. Nothing shorter is tried: a waiting request costs no compute, so a shorter queue can only
  refuse requests, and a tuned launch.sh must still hold a sweep without 429s.
* ``batch`` (``llmopt serve --max-num-seqs``, requests batched in one model copy by onnxruntime-genai's
  engine): the prediction (0, off, unless the recipe sets it), 0, then 2, 4, 8, 16 up to the first that holds
  the workload's concurrency; nothing at concurrency 1 (one request has nothing to batch with). On a CPU the
  engine batches statically, which wins with requests of equal length and loses with mixed ones, so only a
  measurement on the workload says (docs/results/serving.md). A batch and worker processes exclude each other:
  moving one sets the other back to its default (``follow``).
* ``speculative`` (tokens drafted per step, where ``[serve.speculative]`` is configured; ``num_speculative_tokens``
  for every engine): the prediction (the recipe's ``num_tokens``), 0 (speculation off: the engine's whole
  speculative config removed), one fewer and one more. It comes first in the grid: its effect is the largest, and
  the batch sizes that suit a step of k + 1 tokens a sequence differ from those of one. ``llmopt.tune.speculation``
  says why it must also earn its place. SGLang's is on the command line: ``--speculative-num-draft-tokens`` (the
  drafted tokens plus one) and ``--speculative-num-steps`` set in launch.sh and the container manifests, every
  ``--speculative-*`` option removed for off. A draft the artifact carries ([[draft]]) has vLLM's speculative
  config on the command line too (``--speculative-config``), where it is searched the same way.

Worker processes and ONNX Runtime's threads split the same cores, so they are not searched apart: a trial
of ``parallel`` = N runs each worker with cores // N intra-op threads (``shares``), and the threads are
then searched with the number of workers found; two workers of two threads on two cores lose to one of
two, and two of one win, which one parameter at a time would not find.

``[tune] space`` replaces a parameter's candidates. CUDA graph capture sizes are searched for vLLM;
TensorRT-LLM's (``cuda_graph_config.max_batch_size``, planned by the deploy stage) and SGLang's are not.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from llmopt.catalog.engines import ENGINE_DEFAULTS, SWEEP_QUEUE, queue_for
from llmopt.errors import StageFailed

MAX_FRACTION = 0.95
GRAPH_SIZES = [1024]  # vLLM's largest capture size tried beyond its own (at most 512 below Blackwell)


@dataclass(frozen=True)
class Param:
    """One launch parameter of an engine."""

    name: str  # the engine's own spelling, as tuning.json and [tune] space name it
    where: str  # yaml | json | arg
    file: str  # the file of deploy/<engine>/ that holds it
    key: str  # a dotted path in the file, or the command-line flag (arg)
    grows: str  # size | seqs | fraction | graph | threads | slots | queue | batch | speculative
    default: Any = None  # the engine's own value when the config leaves it out (None: leave it out)
    shares: str | None = None  # a parameter that splits the cores with this one: it moves to cores // this
    excludes: str | None = None  # a parameter that must be at its default while this one is not at its own
    offset: int = 0  # the file holds the value plus this (SGLang's draft tokens: the drafted ones plus one)


VLLM, TRTLLM = ENGINE_DEFAULTS["vllm"], ENGINE_DEFAULTS["trtllm"]  # the pinned engines' own defaults
SPECULATIVE = "num_speculative_tokens"  # the name of speculation's parameter, whichever the engine
SPACES: dict[str, tuple[Param, ...]] = {
    "vllm": (Param("max-num-seqs", "yaml", "config.yaml", "max-num-seqs", "seqs"),
             Param("max-num-batched-tokens", "yaml", "config.yaml", "max-num-batched-tokens", "size"),
             Param("gpu-memory-utilization", "yaml", "config.yaml", "gpu-memory-utilization", "fraction",
                   VLLM["gpu_memory_utilization"]),
             Param("max-cudagraph-capture-size", "yaml", "config.yaml", "max-cudagraph-capture-size", "graph"),
             Param(SPECULATIVE, "yaml", "config.yaml", "speculative-config.num_speculative_tokens", "speculative")),
    "trtllm": (Param("max_batch_size", "yaml", "config.yaml", "max_batch_size", "seqs", TRTLLM["max_num_seqs"]),
               Param("max_num_tokens", "yaml", "config.yaml", "max_num_tokens", "size",
                     TRTLLM["max_num_batched_tokens"]),
               Param("free_gpu_memory_fraction", "yaml", "config.yaml", "kv_cache_config.free_gpu_memory_fraction",
                     "fraction", TRTLLM["free_gpu_memory_fraction"]),
               Param(SPECULATIVE, "yaml", "config.yaml", "speculative_config.max_draft_len", "speculative")),
    "sglang": (Param("max-running-requests", "arg", "launch.sh", "--max-running-requests", "seqs"),
               Param("chunked-prefill-size", "arg", "launch.sh", "--chunked-prefill-size", "size"),
               Param("mem-fraction-static", "arg", "launch.sh", "--mem-fraction-static", "fraction"),
               Param(SPECULATIVE, "arg", "launch.sh", "--speculative-num-draft-tokens", "speculative", offset=1)),
    "ort": (Param("parallel", "arg", "launch.sh", "--parallel", "slots", 1, shares="intra_op_num_threads",
                  excludes="max-num-seqs"),
            Param("intra_op_num_threads", "json", "genai_config.json",
                  "model.decoder.session_options.intra_op_num_threads", "threads"),
            Param("max-queue", "arg", "launch.sh", "--max-queue", "queue", SWEEP_QUEUE),
            Param("max-num-seqs", "arg", "launch.sh", "--max-num-seqs", "batch", 0, excludes="parallel")),
}


def space(engine: str) -> tuple[Param, ...]:
    return SPACES.get(engine, ())


def predicted(folder: Path, engine: str) -> dict[str, Any]:
    """Each parameter's value in the deploy config at ``folder`` (``deploy/<engine>/``), else its default."""
    out = {}
    for param in space(engine):
        value = read(folder, param)
        out[param.name] = param.default if value is None else value
    return out


def candidates(param: Param, value: Any, concurrency: int, cpus: int | None = None) -> list[Any]:
    """The values a search tries for ``param`` whose predicted value is ``value``, the prediction first."""
    if param.grows in ("size", "seqs"):
        sizes = [] if value is None else [int(value), int(value) * 2, int(value) * 4]
        if param.grows == "seqs":  # none past the first that runs every request in flight at once
            sizes = sizes[:next((i + 1 for i, size in enumerate(sizes) if size >= concurrency), len(sizes))]
        return sizes
    if param.grows == "fraction":
        if value is None:
            return []
        steps = [float(value), round(min(float(value) + 0.03, MAX_FRACTION), 3), MAX_FRACTION]
        return sorted({v for v in steps if v >= float(value)}, key=steps.index)
    if param.grows == "graph":
        return list(dict.fromkeys([value, *(GRAPH_SIZES if value is None else [int(value) * 2])]))
    if param.grows == "threads":
        return [value, *[n for n in range(1, (cpus or os.cpu_count() or 1) + 1) if n != value]]
    if param.grows == "slots":
        most = max(min(cpus or os.cpu_count() or 1, concurrency), 1)
        return list(dict.fromkeys([value, *range(1, most + 1)]))
    if param.grows == "queue":
        return list(dict.fromkeys([value, max(int(value), queue_for(concurrency))]))
    if param.grows == "batch":  # off, then 2, 4, ... up to the first that batches every request in flight
        sizes = [2 ** n for n in range(1, 5)]
        sizes = sizes[:next((i + 1 for i, size in enumerate(sizes) if size >= concurrency), len(sizes))]
        return [value] if concurrency < 2 else list(dict.fromkeys([value, 0, *sizes]))
    if param.grows == "speculative":  # off, then the neighbours of the recipe's num_tokens (1 to 16)
        return [] if not value else list(dict.fromkeys([int(value), 0, *(n for n in (int(value) - 1, int(value) + 1)
                                                                          if 1 <= n <= 16)]))
    raise ValueError(param.grows)


def grid(engine: str, folder: Path, concurrency: int, overrides: dict[str, list] | None = None) -> dict[str, list]:
    """Every parameter's candidates (``overrides`` replace a parameter's), the prediction first; parameters
    without candidates (a value the config does not state) are left out. Speculation comes first."""
    base = predicted(folder, engine)
    out = {}
    for param in sorted(space(engine), key=lambda p: p.grows != "speculative"):
        if param.grows == "speculative" and not base[param.name]:  # no speculative config to set num_tokens in
            continue  # (e.g. an artifact whose tuning turned it off)
        values = list((overrides or {}).get(param.name) or candidates(param, base[param.name], concurrency))
        if base[param.name] not in values:
            values.insert(0, base[param.name])
        if len(values) > 1 or param.name in (overrides or {}):
            out[param.name] = values
    return out


def follow(engine: str, grid: dict[str, list], cpus: int | None = None):
    """``follow(name, values)``: ``values`` with what moves along when ``name`` moves: the shared parameter
    (``Param.shares``) at cores // the new value, when that is one of its candidates; the excluded one
    (``Param.excludes``) back at its default when ``name`` leaves its own (a batch of N and N worker processes
    are two ways to run N requests at once, and llmopt serve takes one of them)."""
    cores = cpus or os.cpu_count() or 1
    params = {p.name: p for p in space(engine)}
    shared = {p.name: p.shares for p in space(engine) if p.shares and p.shares in grid}

    def shares(name: str, values: dict) -> dict:
        other = shared.get(name)
        if other is None or not isinstance(values.get(name), int):
            return values
        share = max(cores // max(values[name], 1), 1)
        return values | {other: share} if share in grid[other] else values

    def moved(name: str, values: dict) -> dict:
        param, values = params.get(name), shares(name, values)
        other = param.excludes if param else None
        if other in grid and values.get(name) != param.default and values.get(other) != params[other].default:
            values = shares(other, values | {other: params[other].default})  # and what moves with it
        return values

    return moved


# --- reading and writing a value in a deploy folder ------------------------------------------------------------

def read(folder: Path, param: Param) -> Any:
    path = folder / param.file
    if not path.is_file():
        return None
    if param.where == "arg":
        found = re.findall(rf"(?:^|\s){re.escape(param.key)}(?:=|\s+)(\S+)", exec_line(path.read_text()))
        value = _number(shlex.split(found[-1])[0]) if found else None
        return value - param.offset if param.offset and isinstance(value, int) else value
    doc = _load(path, param.where)
    for part in param.key.split("."):
        if not isinstance(doc, dict) or part not in doc:
            spec = command_spec(folder) if param.grows == "speculative" else None
            return spec.get(param.key.split(".")[-1]) if spec else None
        doc = doc[part]
    return doc


def apply(folder: Path, engine: str, values: dict[str, Any], note: str = "") -> None:
    """Write ``values`` into the deploy config at ``folder`` (a copy of ``deploy/<engine>/``); ``note`` becomes a
    comment at the top of launch.sh and of a YAML config."""
    params = {p.name: p for p in space(engine)}
    args = []
    for name, value in values.items():
        param = params[name]
        if param.where == "arg" and param.grows == "speculative":
            set_speculative_flags(folder, param, value)
            continue
        if param.where == "arg":
            if value is not None:
                args += [param.key, str(value)]
            continue
        path = folder / param.file
        if param.grows == "speculative" and command_spec(folder) is not None:  # a draft the artifact carries
            set_command_spec(folder, param.key.split(".")[-1], value)
            continue
        if param.grows == "speculative" and not value:  # off: the engine's speculative config removed
            path.write_text(drop_yaml(path.read_text(), param.key.split(".")[0]))
            continue
        if param.where == "yaml":
            path.write_text(set_yaml(path.read_text(), param.key, value))
            continue
        doc = _load(path, param.where)
        node = doc
        *parents, last = param.key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
        _dump(path, param.where, doc, note)
    for path in {folder / p.file for p in params.values() if p.where == "yaml"} if note else ():
        if path.is_file():
            path.write_text("".join(f"# {part}\n" for part in note.splitlines()) + path.read_text())
    launch = folder / "launch.sh"
    if args or note:
        launch.write_text(with_args(launch.read_text(), args, note))
    if args:  # the same command in the container manifests, as the containers run it
        def with_flags(text: str) -> str:
            for flag, value in zip(args[::2], args[1::2]):
                text = set_flag(text, flag, value)
            return text

        edit_launch_files(folder, with_flags, MANIFESTS)


def set_flag(text: str, flag: str, value: str) -> str:
    """A manifest's command with ``flag``'s value replaced: as two list items (``- --flag`` then ``- 'value'``,
    as llmopt writes compose commands and Kubernetes args) or inside a shell command line (``--flag value``)."""
    lines = text.splitlines()
    for i, line in enumerate(lines[:-1]):
        if line.strip() == f"- {flag}" and lines[i + 1].lstrip().startswith("- "):
            indent = lines[i + 1][: len(lines[i + 1]) - len(lines[i + 1].lstrip())]
            lines[i + 1] = f"{indent}- '{value}'"
    out = "\n".join(lines) + ("\n" if text.endswith("\n") else "")
    return re.sub(rf"(?<=\s){re.escape(flag)}(=|[ \t]+)'?[^\s'\"]+'?", lambda m: f"{flag}{m.group(1)}{value}", out)


# vLLM's speculative config on the command line, where it names a draft the artifact carries (its folder is known
# only where the command runs: llmopt.backends.serve.vllm.own_draft_args): in launch.sh's exec line, and as two
# items of a YAML list of arguments in docker-compose.yaml and kubernetes.yaml
COMMAND_SPEC = "--speculative-config"
SPEC_IN_SHELL = re.compile(r"(?P<lead>[ \t]+)--speculative-config[ \t]+'(?P<json>\{[^'\n]*\})'")
SPEC_IN_LIST = re.compile(r"^(?P<lead>[ \t]*- )--speculative-config\n(?P<item>[ \t]*- )'(?P<json>\{[^'\n]*\})'\n",
                          re.M)


def command_spec(folder: Path) -> dict | None:
    """The speculative config on launch.sh's command line, or None."""
    path = folder / "launch.sh"
    argv = shlex.split(exec_line(path.read_text())) if path.is_file() else []
    return json.loads(argv[argv.index(COMMAND_SPEC) + 1]) if COMMAND_SPEC in argv[:-1] else None


def set_command_spec(folder: Path, key: str, value: Any) -> None:
    """The command line's speculative config with ``key`` set to ``value`` (0: the option removed, speculation
    off), in launch.sh and the container manifests."""
    def edited(match: re.Match, form: str) -> str:
        if not value:
            return ""
        spec = json.loads(match["json"]) | {key: value}
        if form == "shell":
            return f"{match['lead']}{COMMAND_SPEC} {shlex.quote(json.dumps(spec))}"
        return f"{match['lead']}{COMMAND_SPEC}\n{match['item']}'{json.dumps(spec)}'\n"

    edit_launch_files(folder, lambda text: SPEC_IN_SHELL.sub(lambda m: edited(m, "shell"),
                                                             SPEC_IN_LIST.sub(lambda m: edited(m, "list"), text)))


MANIFESTS = ("docker-compose.yaml", "kubernetes.yaml")  # the containers' copies of the engine's command line
LAUNCH_FILES = ("launch.sh", *MANIFESTS)  # where an engine's command line is written


def edit_launch_files(folder: Path, edit: Callable[[str], str], names: tuple[str, ...] = LAUNCH_FILES) -> None:
    """Each of ``names`` in ``folder`` that exists, rewritten as ``edit`` returns its text."""
    for name in names:
        path = folder / name
        if path.is_file():
            path.write_text(edit(path.read_text()))


# an engine's speculative options on its command line (SGLang's --speculative-*): a flag and, unless the next
# word is a flag, its value; in launch.sh's exec line, and as items of a YAML list of arguments
FLAG_IN_SHELL = r"[ \t]+{flag}(?:[ \t]+(?!--)(?:'[^'\n]*'|\"[^\"\n]*\"|[^\s'\"]+))?(?=\s)"
FLAG_IN_LIST = r"^[ \t]*- {flag}\n(?:[ \t]*- (?!--)[^\n]*\n)?"


def set_speculative_flags(folder: Path, param: Param, value: Any) -> None:
    """SGLang's speculation at ``value`` tokens drafted a step, in launch.sh and the container manifests:
    ``param``'s flag at value + its offset and ``--speculative-num-steps`` (where the config has it) at value;
    0 removes every ``--speculative-*`` option (speculation off)."""
    flag = r"--speculative-[\w-]+"

    def edit(text: str) -> str:
        if not value:
            text = re.sub(FLAG_IN_LIST.format(flag=flag), "", text, flags=re.M)
            return re.sub(FLAG_IN_SHELL.format(flag=flag), "", text)
        return set_flag(set_flag(text, param.key, str(int(value) + param.offset)), "--speculative-num-steps",
                        str(int(value)))

    edit_launch_files(folder, edit)


def exec_line(script: str) -> str:
    return next((line for line in reversed(script.splitlines()) if line.lstrip().startswith("exec ")), "")


def with_args(script: str, args: list[str], note: str = "") -> str:
    """launch.sh with ``args`` added to its exec line before ``"$@"`` (the last value of a flag wins in these
    engines' parsers) and ``note`` as a comment after the shebang."""
    lines = script.splitlines()
    index = max(i for i, line in enumerate(lines) if line.lstrip().startswith("exec "))
    extra = " ".join(shlex.quote(a) for a in args)
    if extra:
        line = lines[index]
        lines[index] = (line[: line.rindex('"$@"')] + extra + ' "$@"') if '"$@"' in line else f"{line} {extra}"
    if note:
        lines[1:1] = [f"# {part}" for part in note.splitlines()]
    return "\n".join(lines) + "\n"


def _load(path: Path, where: str) -> dict:
    text = path.read_text()
    if where == "json":
        return json.loads(text)
    from llmopt.libraries import require

    return require("yaml", "deploy", "tuning launch configs", package="pyyaml").safe_load(text) or {}


def _dump(path: Path, where: str, doc: dict, note: str) -> None:
    if where == "json":
        path.write_text(json.dumps(doc, indent=2) + "\n")


def set_yaml(text: str, key: str, value: Any) -> str:
    """YAML ``text`` (block style, two-space indents, as llmopt writes it) with the dotted ``key`` set to the
    scalar ``value`` (None: removed), line by line so that its comments stay where they are."""
    lines, parts = text.splitlines(), key.split(".")
    start, indent = 0, 0
    for depth, part in enumerate(parts):
        pattern = re.compile(rf"^{' ' * indent}{re.escape(part)}:(\s|$)")
        found = next((i for i in range(start, len(lines)) if pattern.match(lines[i])), None)
        if found is None:  # add what is missing under the last parent found
            block = [f"{'  ' * (depth + d)}{p}:" for d, p in enumerate(parts[depth:-1])]
            leaf = f"{'  ' * (len(parts) - 1)}{parts[-1]}: {json.dumps(value)}"
            if value is not None:
                lines[start:start] = [*block, leaf] if depth else []
                if not depth:
                    lines += [*block, leaf]
            return "\n".join(lines) + "\n"
        if depth == len(parts) - 1:
            if value is None:
                del lines[found]
            else:
                lines[found] = f"{' ' * indent}{part}: {json.dumps(value)}"
            return "\n".join(lines) + "\n"
        start, indent = found + 1, indent + 2
    return text


def drop_yaml(text: str, key: str) -> str:
    """YAML ``text`` without the top-level ``key`` and the block under it."""
    out, inside = [], False
    for line in text.splitlines():
        if re.match(rf"^{re.escape(key)}:(\s|$)", line):
            inside = True
            continue
        if inside and (line.startswith((" ", "\t")) or not line.strip()):
            continue
        inside = False
        out.append(line)
    return "\n".join(out) + "\n"


def _number(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def check_overrides(engines: list[str], overrides: dict[str, list]) -> str | None:
    """What is wrong with ``[tune] space`` for ``engines`` (a parameter must be one of them's, and is searched on
    each that has it), or None."""
    names = list(dict.fromkeys(p.name for engine in engines for p in space(engine)))
    unknown = [k for k in overrides if k not in names]
    if not unknown:
        return None
    if len(engines) == 1:
        who, whose = f"{engines[0]} is not", "its"
    else:
        who = f"neither {engines[0]} nor {engines[1]} is" if len(engines) == 2 else f"none of {', '.join(engines)} is"
        whose = "their"
    return f"[tune] space names {', '.join(unknown)}, which {who} tuned on ({whose} parameters: {', '.join(names) or 'none'})"


def require_space(engine: str) -> tuple[Param, ...]:
    found = space(engine)
    if not found:
        raise StageFailed(f"no tuning space for the {engine} engine", where="[tune]",
                          fix=f"tune one of: {', '.join(SPACES)}")
    return found


def trial_target(root: Path, model_dir: Path, deploy_dir: Path, engine: str, manifest: dict, values: dict,
                 draft_dir: Path | None = None) -> Path:
    """A folder laid out as an artifact for one trial: ``model/`` (a link), ``draft/`` (a link, where the launch
    config names a draft the artifact carries), ``deploy/<engine>/`` with ``values`` written in, and
    ``manifest.json``."""
    import shutil

    from llmopt.store.cache import write_json

    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    (root / "model").symlink_to(Path(model_dir).resolve(), target_is_directory=True)
    if draft_dir is not None:
        (root / "draft").symlink_to(Path(draft_dir).resolve(), target_is_directory=True)
    folder = root / "deploy" / engine
    shutil.copytree(deploy_dir, folder, ignore=shutil.ignore_patterns("manifest.json"))
    apply(folder, engine, values)
    write_json(root / "manifest.json", manifest)
    return root
