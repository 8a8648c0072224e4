"""Shared fixtures: a tiny random Llama with its own tokenizer, an isolated cache, recipes, and one real
run of the quickstart recipe on the demo model for the slow tests that need its artifact."""

from __future__ import annotations

import json
import os
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

# A shell started in the background (`make test &`, some CI runners) ignores Ctrl-C, and the processes it starts
# inherit that: the tests' llmopt subprocesses would never see the SIGINT the tests send them. A handler, unlike
# an ignored signal, is reset to the default when a child starts, so the children get Ctrl-C as a terminal would.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


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


@pytest.fixture(scope="session")
def quickstart(tmp_path_factory) -> Quickstart:
    """ONE real ``llmopt run recipes/quickstart.toml --format json`` (many minutes on a CPU) in its own cache,
    shared by tests/test_quickstart.py and tests/test_docs_commands.py; the tests assert on its result.

    LLMOPT_TEST_QUICKSTART_CACHE=<folder> starts that cache as hard links to a cache that already holds the
    quickstart's stages (a developer's own): the run is still run, and then takes seconds. CI leaves it unset."""
    root = tmp_path_factory.mktemp("quickstart")
    cache = root / "cache"
    seed = os.environ.get("LLMOPT_TEST_QUICKSTART_CACHE")
    if seed:
        link_tree(Path(seed), cache)
    artifact = root / "artifacts" / "quickstart"
    result = run_cli("run", str(ROOT / "recipes" / "quickstart.toml"), "-o", str(artifact), "--format", "json",
                     cwd=root, env=QUIET_HUB | {"LLMOPT_CACHE": str(cache)}, timeout=3 * 3600)
    return Quickstart(root, artifact, cache, result)
