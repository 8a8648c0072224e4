"""Every command the docs show runs on the demo model and exits as the docs say.

Which commands: every command line of the ```sh / ```bash blocks of README.md and docs/*.md (a line
ending in a backslash goes on on the next one), and the indented lines under "Examples:" in
docs/cli.md, which `python -m llmopt.docgen` writes from the docstrings in llmopt/cli/*.py.

Exit codes: a command must exit 0, unless its trailing comment says `exits N`, as in
`llmopt gate report.json -s mc.max_drop=0.05   # exits 3: ...`. A trailing comment that speaks of
an exit in other words ("exit 0: ...") is a mistake this test reports, so the form stays fixed.

How they run: the commands of one page run in the order they are written, under bash, in a folder
laid out as a checkout after `make demo`: `recipes/`, `artifacts/quickstart/` (hard links to the
one quickstart run of tests/conftest.py) and `.venv/bin/llmopt` (this Python's llmopt), with that
run's stage cache, so a command runs only the stages its options change. The docs therefore name
what exists there (recipes/quickstart.toml, artifacts/quickstart, artifacts/quickstart/model) or
what an earlier command of the same page wrote (quickstart.toml, my.toml, reports/), never
placeholders such as ./my-model.

- `llmopt serve ...` starts in the background on a free port, must answer /health, and must exit
  as documented (0) when stopped with Ctrl-C (SIGINT).
- A command naming 127.0.0.1:8000 or localhost:8000 talks to `llmopt serve artifacts/quickstart`,
  started for the page on a free port that replaces 8000. curl's answer must be JSON with no
  "error" (curl -s exits 0 whatever the HTTP status).
- A command that another page shows with the same text, that measures or searches (`llmopt bench`,
  `eval`, `sweep`, `tune`: minutes each on two cores; an eval through an endpoint scores every window
  again) and names no file but those every page starts with (artifacts/quickstart, recipes/, a URL),
  runs once a run: its outcome is that of the page that ran it first (SharedOutcomes).
- Anything else runs only when it is llmopt or curl; every command that is not run is in NOT_RUN
  with the reason. test_every_documented_command_is_classified (fast, no model) fails for a
  command in neither, and for an entry of NOT_RUN or EXPECTED_TO_FAIL that no page shows any more.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

from conftest import GGUF_RECIPE, ROOT, link_tree, module_folder, shared_folder

# README.md last. A page's command that runs gguf-onnx-cpu.toml runs on the cache of the suite's one run of it
# (tests/conftest.py, gguf_run), which it waits for. Under pytest-xdist each page is a unit of work, and so is each
# measurement every page could run (tests/conftest.py, docs_unit), which go first.
DOCS = [*(f"docs/{p.name}" for p in sorted((ROOT / "docs").glob("*.md"))), "README.md"]
SHELLS = {"sh", "bash", "shell"}
LLMOPT = {"llmopt", ".venv/bin/llmopt"}
SERVED = re.compile(r"\b(127\.0\.0\.1|localhost):8000\b")
EXITS = re.compile(r"\bexits (\d+)\b")
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
TIMEOUT_S = 1800  # one command; scoring the ONNX model in place takes minutes on two cores

VLLM_ENV = ("needs the environment `make vllm-env` builds; tests/test_serve_vllm_engine.py builds it and has vLLM's "
            "own parser check the demo model's launch config")
NOT_RUN = {
    "make demo": "the quickstart itself: the session fixture `quickstart` (tests/conftest.py) runs "
                 "`llmopt run recipes/quickstart.toml`, and every page here starts from its artifact",
    "make test": "this test suite",
    ("guidellm run --backend kind=openai_http,target=http://127.0.0.1:8000 --profile kind=synchronous --constraint "
     "kind=max_requests,count=20 --data kind=synthetic_text,prompt_tokens=256,output_tokens=128 --tokenizer "
     "kind=hf_auto,model=artifacts/quickstart/model"):
        "GuideLLM is not installed by `make test`: from PyPI it pulls a CUDA torch; tests/test_server.py replays "
        "its request bodies against llmopt serve instead",
    ("guidellm run --backend kind=openai_http,target=http://127.0.0.1:8000 --profile kind=sweep --constraint "
     "kind=max_duration,seconds=60 --data kind=synthetic_text,prompt_tokens=256,output_tokens=128 --tokenizer "
     "kind=hf_auto,model=artifacts/quickstart/model --output kind=json,path=guidellm-sweep.json"):
        "GuideLLM is not installed by `make test` (a CUDA torch from PyPI), and its sweep runs 13 minutes on two "
        "cores; its report is docs/runs/guidellm-sweep-quickstart-cpu.json, and tests/test_deploy_configs.py "
        "checks that the ort deploy's launch.sh queues the 512 requests it keeps in flight",
    "llmopt sweep my.toml --executor ray --address auto --cache-dir /shared/llmopt-cache -o /shared/sweeps/my":
        "joins a running Ray cluster (`--address auto`) and writes to a folder its machines share; "
        "tests/test_sweep.py runs the Ray executor on a local cluster and compares its table with the local one's",
    "llmopt sweep recipes/sweep-onnx-cpu.toml":
        "runs the shipped sweep's 12 variants, 15 minutes on two cores (docs/results/sweeps.md); the next command runs two of them "
        "(RTN) on the demo model through the same planner and runner, and tests/test_sweep.py runs whole sweeps, "
        "the chosen variant's artifact and a resumed sweep on a four-layer model",
    "llmopt tune artifacts/smollm2-vllm-h100 --max-minutes 30 --format json":
        "starts vLLM, which needs a GPU; tests/test_tune.py runs the search against a simulated vLLM",
    "make vllm-env": "installs vLLM 0.33.0 into .test-envs/vllm from PyPI; tests/test_serve_vllm_engine.py runs it",
    "LLMOPT_VLLM_PYTHON=.test-envs/vllm/bin/python llmopt run recipes/smollm2-vllm-h100.toml": VLLM_ENV,
    "llmopt run recipes/smollm2-vllm-h100.toml -s serve.engine_python='\".test-envs/vllm/bin/python\"'": VLLM_ENV,
    "make sglang-env": "installs SGLang 0.5.23 (and triton) into .test-envs/sglang from PyPI; "
                       "tests/test_serve_sglang_engine.py runs it",
    "LLMOPT_SGLANG_PYTHON=.test-envs/sglang/bin/python llmopt run my-sglang.toml":
        "a recipe of your own, in the environment `make sglang-env` builds; tests/test_serve_sglang_engine.py has "
        "SGLang's own parser check the tiny model's launch arguments through llmopt run",
}
EXPECTED_TO_FAIL: dict[str, str] = {}  # command -> why it fails today (xfail, not strict)
MEASURES = {"bench", "eval", "sweep", "tune"}  # verbs whose repeats on later pages are not run again
COMMON = ("artifacts/quickstart", "recipes/", "http://", "https://")  # what every page starts with


# ---------------------------------------------------------------- what the docs show


@dataclass(frozen=True)
class DocCommand:
    doc: str  # relative to the repository root
    line: int  # where the command starts
    text: str  # as written, continuation lines joined, the trailing comment removed
    expect: int = 0  # the exit code its comment states, else 0

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def words(self) -> list[str]:
        """The command's words after any leading VAR=value assignments."""
        words = shlex.split(self.text)
        while words and ASSIGNMENT.match(words[0]):
            words.pop(0)
        return words

    @property
    def is_serve(self) -> bool:
        words = self.words
        return len(words) > 1 and words[0] in LLMOPT and words[1] == "serve"

    @property
    def same_on_every_page(self) -> bool:
        """A measurement or search that reads only what every page starts with: its outcome does not depend
        on the page's earlier commands."""
        words = self.words
        if len(words) < 2 or words[0] not in LLMOPT or words[1] not in MEASURES:
            return False
        named = [w for w in words[2:] if "/" in w or w.endswith((".toml", ".json"))]
        return all(w.startswith(COMMON) for w in named) and not {"-o", "--output", ">"} & set(words)


def shell_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line inside a ```sh, ```bash or ```shell block."""
    out, fence = [], None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = stripped[3:].strip().lower() if fence is None else None
        elif fence in SHELLS:
            out.append((number, line))
    return out


def example_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the indented lines under each "Examples:" (docs/cli.md)."""
    out, inside = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip() == "Examples:":
            inside = True
        elif inside and line.strip():
            if not line.startswith("    "):
                inside = False
            else:
                out.append((number, line))
    return out


def split_comment(line: str) -> tuple[str, str]:
    """The line's command and its trailing comment: a # at the start or after a space, outside quotes."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1:].strip()
    return line.rstrip(), ""


def parse(doc: str, lines: list[tuple[int, str]]) -> tuple[list[DocCommand], list[str]]:
    """The commands of ``lines`` and the problems found (an exit stated in other words than `exits N`)."""
    commands, problems, parts, start = [], [], [], 0
    for number, line in lines:
        body, comment = split_comment(line)
        if not parts and not body.strip():
            continue  # blank, or a comment line
        start = start or number
        if body.endswith("\\"):
            parts.append(body[:-1].strip())
            continue
        parts.append(body.strip())
        found = EXITS.search(comment)
        if found is None and re.search(r"\bexit", comment, re.IGNORECASE):
            problems.append(f"{doc}:{start}: the comment {comment!r} speaks of an exit; write `exits N`")
        commands.append(DocCommand(doc, start, " ".join(p for p in parts if p), int(found.group(1)) if found else 0))
        parts, start = [], 0
    return commands, problems


def documented_commands() -> tuple[list[DocCommand], list[str]]:
    commands, problems = [], []
    for doc in DOCS:
        text = (ROOT / doc).read_text()
        found, wrong = parse(doc, shell_lines(text) + (example_lines(text) if doc == "docs/cli.md" else []))
        commands += found
        problems += wrong
    return commands, problems


COMMANDS, PROBLEMS = documented_commands()
RUN = [c for c in COMMANDS if c.text not in NOT_RUN]


def test_every_documented_command_is_classified():
    assert PROBLEMS == []
    assert len({c.doc for c in COMMANDS}) >= 5 and sum(c.doc == "docs/cli.md" for c in COMMANDS) >= 20
    unknown = [f"{c.id}: {c.text}" for c in RUN if c.words[0] not in LLMOPT | {"curl"}]
    assert unknown == [], "run these in test_documented_command, or list them in NOT_RUN with the reason"
    shown = {c.text for c in COMMANDS}
    assert sorted(set(NOT_RUN) - shown) == [] and sorted(set(EXPECTED_TO_FAIL) - shown) == [], "no doc shows these"


def test_extraction_reads_blocks_continuations_and_stated_exits():
    text = """intro `llmopt nothing` in prose
```sh
# a comment line
llmopt gate r.json -s mc.max_drop=0.05   # stricter: exits 3 (the interval reaches past it)
curl -s localhost:8000/v1/models \\
  -H 'x: a # b'
```
```toml
name = "llmopt run not-a-command.toml"
```
```bash
llmopt verify art   # exit 0 when untouched
```
"""
    commands, problems = parse("x.md", shell_lines(text))
    assert [(c.line, c.text, c.expect) for c in commands] == [
        (4, "llmopt gate r.json -s mc.max_drop=0.05", 3),
        (5, "curl -s localhost:8000/v1/models -H 'x: a # b'", 0),
        (12, "llmopt verify art", 0)]
    assert problems == ["x.md:12: the comment 'exit 0 when untouched' speaks of an exit; write `exits N`"]
    help_text = "Examples:\n\n    llmopt ls\n\n    X=1 llmopt serve a --port 9\n\n| option | help |\n    llmopt no\n"
    examples, _ = parse("docs/cli.md", example_lines(help_text))
    assert [c.text for c in examples] == ["llmopt ls", "X=1 llmopt serve a --port 9"] and examples[1].is_serve


def test_only_measurements_of_what_every_page_starts_with_are_run_once():
    def same(text: str) -> bool:
        return DocCommand("x.md", 1, text).same_on_every_page

    assert same("llmopt bench artifacts/quickstart --sweep -n 8 --slo ttft_p99_ms=2000")
    assert same("llmopt sweep recipes/sweep-onnx-cpu.toml --axis compress[0].group_size=32,64")
    assert same("llmopt bench http://127.0.0.1:8000/v1 -n 8") and same("llmopt tune artifacts/quickstart -n 2")
    assert same("llmopt eval recipes/quickstart.toml --candidate http://127.0.0.1:8000/v1 --only prose")
    assert not same("llmopt eval recipes/quickstart.toml --candidate http://127.0.0.1:8000/v1 -o reports/")
    assert not same("llmopt eval quickstart.toml --candidate http://127.0.0.1:8000/v1")  # a page's own copy
    assert not same("llmopt cp quickstart") and not same("llmopt run recipes/quickstart.toml")  # they write files
    assert not same("llmopt sweep my.toml") and not same("llmopt bench artifacts/quickstart -o out/")
    repeated = [c for c in RUN if c.same_on_every_page]  # the examples pages share (found by text: the reference
    # page is generated, and its lines move when a command gains an option)
    assert any(c.doc == "docs/bench.md" and c.text.startswith("llmopt bench http://127.0.0.1:8000 ") for c in repeated)
    assert any(c.id.startswith("docs/cli.md:") and c.text.startswith("llmopt sweep recipes/") and "--axis" in c.text
               for c in repeated)
    served = [c.id for c in repeated
              if c.text == "llmopt eval recipes/quickstart.toml --candidate http://127.0.0.1:8000/v1 --only prose"]
    assert len(served) == 2  # docs/ci.md and docs/cli.md: scored once, by the first page that reaches it
    rtn = [c for c in repeated if c.text.startswith("llmopt sweep recipes/sweep-onnx-cpu.toml --axis 'compress[0]={ method")]
    assert {c.doc for c in rtn} == {"docs/sweep.md", "docs/cli.md"}
    assert len({c.text for c in rtn}) == 1  # one sweep for both pages: the two spellings once ran two (64 s more)


def test_a_shared_command_runs_once_while_another_page_waits_for_it(tmp_path):
    import threading

    shared, ran = SharedOutcomes(tmp_path / "outcomes"), []
    command = DocCommand("docs/a.md", 3, "llmopt bench artifacts/quickstart -n 8")

    def run(c: DocCommand) -> Outcome:
        ran.append(c.id)
        time.sleep(0.3)  # the other page asks meanwhile
        return Outcome(c.text, 0, "measured", "")

    got = []
    pages = [threading.Thread(target=lambda: got.append(shared.get(command, run))) for _ in range(2)]
    for page in pages:
        page.start()
    for page in pages:
        page.join()
    assert ran == ["docs/a.md:3"] and got == [Outcome(command.text, 0, "measured", "")] * 2
    again = SharedOutcomes(tmp_path / "outcomes").get(command, run)  # another worker's view of the same folder
    assert ran == ["docs/a.md:3"] and again.stdout == "measured"


# ---------------------------------------------------------------- running them


@dataclass
class Outcome:
    ran: str  # the command as run (ports replaced)
    returncode: int
    stdout: str
    stderr: str
    problem: str = ""

    def explain(self, command: DocCommand) -> str:
        said = (f"`{command.text}` ({command.id}) ran as `{self.ran}`: exit {self.returncode}, "
                f"the docs say {command.expect}")
        outputs = ["stdout: " + self.stdout[-2000:], "stderr: " + self.stderr[-4000:]]
        return "\n".join(filter(None, [said, self.problem, *outputs]))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(proc: subprocess.Popen, port: int, seconds: float = 600) -> str:
    """'' once http://127.0.0.1:port/health answers 200, else what went wrong."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"the server exited ({proc.returncode}) before /health answered"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as answer:
                if answer.status == 200:
                    return ""
        except OSError:
            pass
        time.sleep(0.5)
    return f"/health did not answer within {seconds:.0f} s"


def stop(proc: subprocess.Popen) -> str:
    """Ctrl-C, as the docs say to stop a server; '' when it stops within a minute."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(60)
        return ""
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return "did not stop within 60 s of Ctrl-C"


def curl_problem(stdout: str) -> str:
    try:
        answer = json.loads(stdout)
    except ValueError:
        return "curl's answer is not JSON"
    return f"the server answered an error: {answer['error']}" if isinstance(answer, dict) and "error" in answer else ""


class SharedOutcomes:
    """The outcomes of the commands run once a run (``DocCommand.same_on_every_page``), in a folder every test
    worker sees: the first page that reaches such a command runs it holding a lock, and a page that reaches it
    meanwhile, on another worker, waits for that outcome instead of running the command again."""

    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    @staticmethod
    def key(command: DocCommand) -> str:
        return hashlib.sha256(command.text.encode()).hexdigest()[:20]

    def get(self, command: DocCommand, run) -> Outcome:
        import fcntl

        key = self.key(command)
        saved = self.folder / f"{key}.json"
        with open(self.folder / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if saved.is_file():
                return Outcome(**json.loads(saved.read_text()))
            outcome = run(command)
            saved.write_text(json.dumps(asdict(outcome)))
            return outcome


class Page:
    """The commands of one doc page, run in order in a folder laid out as a checkout after `make demo`."""

    def __init__(self, doc: str, folder: Path, quickstart, shared: SharedOutcomes, gguf_run):
        self.doc, self.folder, self.quickstart, self.shared = doc, folder, quickstart, shared
        self.gguf_run = gguf_run  # () -> the suite's run of GGUF_RECIPE (tests/conftest.py), made or waited for
        self.commands = [c for c in RUN if c.doc == doc]
        self.done: set[DocCommand] = set()
        self.server: tuple[subprocess.Popen, int] | None = None  # `llmopt serve artifacts/quickstart` for URLs
        shutil.copytree(ROOT / "recipes", folder / "recipes")
        link_tree(quickstart.artifact, folder / "artifacts" / "quickstart")
        bin_dir = folder / ".venv" / "bin"
        bin_dir.mkdir(parents=True)
        (bin_dir / "llmopt").write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m llmopt "$@"\n')
        (bin_dir / "llmopt").chmod(0o755)
        self.logs = folder.parent / f"{folder.name}-logs"
        self.logs.mkdir()
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))  # this checkout's llmopt
        self.env = dict(os.environ, LLMOPT_CACHE=str(quickstart.cache), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", PYTHONPATH=path)

    def run(self, command: DocCommand) -> Outcome:
        """``command``, after the page's earlier commands that have not run (their outcomes are their own tests').
        A measurement every page could run (``DocCommand.same_on_every_page``) needs none of them, and writes
        nothing a later command reads: it runs on its own, and the page's other commands go on without it."""
        try:
            if not command.same_on_every_page:
                for earlier in self.commands[: self.commands.index(command)]:
                    if earlier not in self.done and not earlier.same_on_every_page:
                        self.execute(earlier)
            return self.execute(command)
        finally:
            if command == self.commands[-1]:
                self.close()

    def execute(self, command: DocCommand) -> Outcome:
        self.done.add(command)
        if command.same_on_every_page:
            return self.shared.get(command, self.execute_here)
        return self.execute_here(command)

    def execute_here(self, command: DocCommand) -> Outcome:
        ran = SERVED.sub(lambda m: f"{m.group(1)}:{self.served_port()}", command.text)
        if command.is_serve:
            return self.serve(ran)
        env = self.env
        if GGUF_RECIPE in command.text:  # its stages: the suite's run of it
            env = dict(env, LLMOPT_CACHE=str(self.gguf_run().cache))
        done = subprocess.run(["bash", "-c", ran], cwd=self.folder, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT_S)
        outcome = Outcome(ran, done.returncode, done.stdout, done.stderr)
        if command.words[0] == "curl":
            outcome.problem = curl_problem(done.stdout)
        return outcome

    def start(self, command: str) -> tuple[subprocess.Popen, Path, Path]:
        name = f"{len(list(self.logs.iterdir())) // 2:02d}"
        out, err = self.logs / f"{name}.out", self.logs / f"{name}.err"
        with out.open("w") as stdout, err.open("w") as stderr:  # files, not pipes: a server writes as long as it runs
            proc = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=self.folder, env=self.env, stdout=stdout,
                                    stderr=stderr)
        return proc, out, err

    def serve(self, command: str) -> Outcome:
        port = free_port()
        ran = re.sub(r"--port[ =]\d+", f"--port {port}", command) if "--port" in command else f"{command} --port {port}"
        proc, out, err = self.start(ran)
        problem = wait_healthy(proc, port)
        if proc.poll() is None:
            stopped = stop(proc)
            problem = problem or stopped
        return Outcome(ran, proc.returncode, out.read_text(), err.read_text(), problem)

    def served_port(self) -> int:
        if self.server is None:
            port = free_port()
            proc, _, err = self.start(f"llmopt serve artifacts/quickstart --port {port}")
            self.server = proc, port
            problem = wait_healthy(proc, port)
            if problem:
                log = err.read_text()[-3000:]
                pytest.fail(f"llmopt serve artifacts/quickstart, for the page's URLs: {problem}\n{log}")
        return self.server[1]

    def close(self) -> None:
        if self.server is not None and self.server[0].poll() is None:
            stop(self.server[0])
        self.server = None


@pytest.fixture(scope="module")
def pages(request, quickstart, tmp_path_factory):
    assert quickstart.result.returncode == 0, "the shared quickstart run failed:\n" + quickstart.result.stderr[-3000:]
    made: dict[str, Page] = {}
    shared = SharedOutcomes(shared_folder(tmp_path_factory) / "docs-outcomes")
    with module_folder(request, tmp_path_factory, "docs-pages") as root:

        def page(doc: str) -> Page:
            if doc not in made:
                made[doc] = Page(doc, root / doc.replace("/", "-").removesuffix(".md"), quickstart, shared,
                                 lambda: request.getfixturevalue("gguf_run"))
            return made[doc]

        yield page
        for each in made.values():
            each.close()


def _param(command: DocCommand):
    """The test of ``command``, its id the page and line; a measurement every page could run also names the text's
    key (``-shared-KEY``), by which tests/conftest.py schedules the pages showing it as one unit of work."""
    reason = EXPECTED_TO_FAIL.get(command.text)
    marks = [pytest.mark.xfail(reason=reason, strict=False)] if reason else []
    shared = f"-shared-{SharedOutcomes.key(command)[:8]}" if command.same_on_every_page else ""
    return pytest.param(command, id=command.id + shared, marks=marks)


@pytest.mark.slow
@pytest.mark.parametrize("command", [_param(c) for c in RUN])
def test_documented_command(command: DocCommand, pages):
    outcome = pages(command.doc).run(command)
    assert outcome.returncode == command.expect and not outcome.problem, outcome.explain(command)
