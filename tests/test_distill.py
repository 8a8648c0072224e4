"""Distillation after pruning: the loss falls, a killed run resumes from its last checkpoint, the plan refuses
what cannot train, and the stage key's working folder lives exactly until the stage commits."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from llmopt import api
from llmopt.backends.base import PlanContext
from llmopt.backends.compress import _distill
from llmopt.backends.compress.distill import DistillOptions
from llmopt.store.cache import Cache
from llmopt.model.modelinfo import from_folder
from llmopt.recipe.load import load_recipe

from conftest import calibrated_head, make_tiny_llama, wait_for, write_recipe


@pytest.fixture(scope="module")
def four_layers(tmp_path_factory) -> Path:
    """A tiny random Llama of four layers whose (tied) embeddings and decoder weights are scaled up: at the
    initialisation's scale the residual stream is nearly all embedding, the layers change the logits little,
    and dropping two of them costs a KL of about 1e-5, which no training can visibly win back; scaled, it
    costs about 0.35 (checked in the tests below)."""
    import torch
    from transformers import AutoModelForCausalLM

    folder = make_tiny_llama(tmp_path_factory.mktemp("distill") / "tiny-4", layers=4, seed=1)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(5)
        for weight in (p for layer in model.model.layers for p in layer.parameters() if p.dim() == 2):
            weight.mul_(10)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    monkeypatch.setenv("LLMOPT_CPU_THREADS", "1")  # tiny steps on a shared CPU: one thread is many times faster


def recipe(model: Path, distill: str = "", extra: str = "", shape: str = "batch_size = 4\nseq_len = 64") -> str:
    return calibrated_head("tiny-distill", model) + f"""\
[[compress]]
method = "prune_depth"
layers = 2

[[compress]]
method = "distill"
{shape}
learning_rate = 3e-3
{distill}
{extra}"""


def test_a_key_s_working_folder_survives_stale_cleaning_and_goes_when_the_stage_commits(tmp_path):
    cache = Cache(tmp_path / "c")
    work = cache.work_dir("abc")
    (work / "checkpoints").mkdir(parents=True)
    (cache.root / "tmp" / "abc.999999999").mkdir(parents=True)  # a dead run's temporary folder
    cache.clean_stale()
    assert (work / "checkpoints").is_dir() and not any((cache.root / "tmp").iterdir())
    other = cache.work_dir("other")
    other.mkdir()
    cache.commit("abc", cache.begin("abc"), {"outputs": {}})
    assert cache.has("abc") and not work.exists() and other.is_dir()


def test_distillation_lowers_the_loss_and_reports_its_curve(four_layers, tmp_path, isolated_cache):
    path = write_recipe(tmp_path, recipe(four_layers, "steps = 24\ncheckpoint_every = 10"))
    plan = api.plan(path, output_dir=tmp_path / "art")
    stage = plan.stage("compress.1.distill")
    assert stage.inputs == {"model": "compress.0.prune_depth", "teacher": "source"}
    result = api.run(path, output_dir=tmp_path / "art")
    training = {r.name: r for r in result.records}["compress.1.distill"].outputs["training"]
    history = json.loads((isolated_cache / "stages" / stage.key / training["history"]).read_text())
    losses = [h["loss"] for h in history]
    assert len(losses) == 24 and training["steps"] == 24 and training["resumed_from"] == 0
    first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
    assert first > 0.05 and last < 0.8 * first, losses  # a loss to win back, and won back
    assert (isolated_cache / "stages" / stage.key / "training" / "loss.png").is_file()
    assert (tmp_path / "art" / "reports" / "training" / "compress.1.distill.loss.png").is_file()
    assert "compress.1.distill" in (tmp_path / "art" / "reports" / "report.md").read_text()
    assert not (isolated_cache / "work" / stage.key).exists()  # the checkpoints went with the commit
    config = json.loads((tmp_path / "art" / "model" / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and config["torch_dtype" if "torch_dtype" in config else "dtype"]
    again = api.run(path, output_dir=tmp_path / "art")
    assert {r.name: r.status for r in again.records}["compress.1.distill"] == "cached"



def kill_9_at_a_checkpoint(path: Path, out: Path, checkpoints: Path, before_the_kill=lambda: None) -> int:
    """Start ``llmopt run`` of ``path``, kill -9 it once a checkpoint is complete (after ``before_the_kill``);
    the step of the last checkpoint."""
    proc = subprocess.Popen([sys.executable, "-m", "llmopt", "run", str(path), "-o", str(out), "-f", "quiet"],
                            env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: _distill.last_checkpoint(checkpoints) is not None if checkpoints.is_dir() else False,
                 timeout=300, proc=proc)
        before_the_kill()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    return int(_distill.last_checkpoint(checkpoints).name.split("-")[1])


def test_kill_9_mid_training_resumes_from_the_last_checkpoint(four_layers, tmp_path, isolated_cache):
    path = write_recipe(tmp_path, recipe(four_layers, "steps = 120\ncheckpoint_every = 10"))
    key = api.plan(path).stage("compress.1.distill").key
    checkpoints = isolated_cache / "work" / key / _distill.CHECKPOINTS
    saved = kill_9_at_a_checkpoint(path, tmp_path / "art", checkpoints)
    assert 10 <= saved < 120 and not (isolated_cache / "stages" / key).exists()
    result = api.run(path, output_dir=tmp_path / "art")
    record = {r.name: r for r in result.records}["compress.1.distill"]
    assert record.status == "ran" and record.outputs["training"]["resumed_from"] >= saved
    assert record.outputs["training"]["steps"] == 120 and not checkpoints.exists()
    assert {r.name: r.status for r in api.run(path, output_dir=tmp_path / "art").records}["compress.1.distill"] == "cached"


def _workers(spec_under: Path) -> list[int]:
    """Processes of data-parallel distillation (torchrun and its workers) whose spec lies under ``spec_under``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(b"_distill_worker" in a for a in argv) and any(str(spec_under).encode() in a for a in argv):
            found.append(int(proc.name))
    return found


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc to find the workers")
def test_data_parallel_training_in_two_processes_learns_dies_with_llmopt_and_resumes(four_layers, tmp_path,
                                                                                     isolated_cache):
    """data_parallel = 2 on the CPU: torchrun starts two gloo processes, Trainer trains the student as
    DistributedDataParallel. A kill -9 of llmopt takes torchrun and its workers with it (nothing left to
    race the resumed run for the checkpoints); the next run resumes from the last checkpoint."""
    body = recipe(four_layers, "steps = 48\ncheckpoint_every = 6\ndata_parallel = 2", shape="batch_size = 2\nseq_len = 64")
    path = write_recipe(tmp_path, body)
    key = api.plan(path).stage("compress.1.distill").key
    checkpoints = isolated_cache / "work" / key / _distill.CHECKPOINTS
    seen: list[int] = []
    saved = kill_9_at_a_checkpoint(path, tmp_path / "art", checkpoints, lambda: seen.extend(_workers(isolated_cache)))
    assert len(seen) == 3  # torchrun's agent and its two workers, running when llmopt was killed
    wait_for(lambda: not _workers(isolated_cache), timeout=60)
    assert 6 <= saved < 48 and not (isolated_cache / "stages" / key).exists()
    result = api.run(path, output_dir=tmp_path / "art")
    record = {r.name: r for r in result.records}["compress.1.distill"]
    training = record.outputs["training"]
    assert record.status == "ran" and training["resumed_from"] >= saved and training["data_parallel"] == 2
    assert training["steps"] == 48 and record.outputs["data"]["samples"] == 48 * 2 * 2
    history = json.loads((isolated_cache / "stages" / key / training["history"]).read_text())
    losses = [h["loss"] for h in history]
    assert [h["step"] for h in history] == list(range(1, 49)), history  # the resumed run's log goes on from the checkpoint's
    first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
    assert first > 0.05 and last < 0.8 * first, losses
    assert not checkpoints.parent.exists() and not _workers(isolated_cache)
    config = json.loads((tmp_path / "art" / "model" / "config.json").read_text())
    assert config["num_hidden_layers"] == 2


def test_data_parallel_is_planned_on_the_compute_machine_s_gpus_and_one_process_keeps_the_key(four_layers, tmp_path):
    gpus = '[compute]\ngpu = "H100-SXM-80GB"\ncount = 2\n'
    over = api.plan(write_recipe(tmp_path, recipe(four_layers, "data_parallel = 4", gpus)))
    problems = [p for p in _errors(over) if "data_parallel" in p.message]
    assert len(problems) == 1 and "compress[1].data_parallel" in problems[0].where
    assert "2 ([compute] count)" in problems[0].message and "data_parallel = 2" in problems[0].hint
    assert not _errors(api.plan(write_recipe(tmp_path, recipe(four_layers, "data_parallel = 2", gpus))))
    one = api.plan(write_recipe(tmp_path, recipe(four_layers, "data_parallel = 1"))).stage("compress.1.distill")
    unset = api.plan(write_recipe(tmp_path, recipe(four_layers))).stage("compress.1.distill")
    two = api.plan(write_recipe(tmp_path, recipe(four_layers, "data_parallel = 2"))).stage("compress.1.distill")
    assert one.key == unset.key != two.key  # caches made before the option existed stay valid


def _errors(plan) -> list:
    return [p for p in plan.problems if p.severity == "error"]


def test_plan_refuses_distillation_after_quantization_naming_the_key_and_the_fix(four_layers, tmp_path):
    body = recipe(four_layers).replace('[[compress]]\nmethod = "distill"',
                                       '[[compress]]\nmethod = "rtn"\n\n[[compress]]\nmethod = "distill"')
    problems = [p for p in _errors(api.plan(write_recipe(tmp_path, body))) if "distill comes after" in p.message]
    assert len(problems) == 1
    assert "compress[2].method" in problems[0].where and "before the quantization step" in problems[0].hint


def test_plan_refuses_training_that_does_not_fit_the_target_gpu(four_layers, tmp_path):
    body = recipe(four_layers, "", '[target]\ngpu = "T4"\n', shape="batch_size = 4096\nseq_len = 32768")
    problems = [p for p in _errors(api.plan(write_recipe(tmp_path, body))) if "distillation needs" in p.message]
    assert len(problems) == 1 and "T4" in problems[0].message
    assert "compress[1].batch_size" in problems[0].where and "gradient_accumulation" in problems[0].hint
    fits = recipe(four_layers, "", '[target]\ngpu = "T4"\n')
    assert not [p for p in api.plan(write_recipe(tmp_path, fits)).problems if "distillation needs" in p.message]


def test_teacher_and_student_must_share_a_vocabulary_and_hidden_states_a_width(four_layers, tmp_path):
    loaded = load_recipe(write_recipe(tmp_path, recipe(four_layers)))
    teacher = from_folder(four_layers)
    ctx = PlanContext(recipe=loaded, step=("compress", 1), model=dataclasses.replace(teacher, vocab_size=1000,
                                                                                     hidden_size=32))
    problems = _distill.teacher_problems(DistillOptions(hidden_weight=1.0), ctx, teacher)
    assert ["vocabularies differ" in p.message for p in problems] == [True, False]
    assert "compress[1].hidden_weight" in problems[1].where and problems[1].hint == "set hidden_weight = 0"
    assert not _distill.teacher_problems(DistillOptions(hidden_weight=1.0), dataclasses.replace(ctx, model=teacher),
                                         teacher)


def test_hidden_states_are_matched_at_the_same_relative_depth():
    assert _distill.layer_map(2, 4) == [2, 4]
    assert _distill.layer_map(24, 30)[-1] == 30 and _distill.layer_map(24, 30)[0] == 1


def test_an_eval_on_distill_s_own_training_text_is_not_held_out(four_layers, tmp_path):
    evals = '[[eval]]\nname = "prose"\nkind = "perplexity"\ndata = "builtin:prose-eval"\nmax_increase_pct = 50\n'
    clean = api.plan(write_recipe(tmp_path, recipe(four_layers, "", evals)))
    assert not [p for p in clean.problems if "held out" in p.message]
    own = api.plan(write_recipe(tmp_path, recipe(four_layers, 'data = "builtin:prose-eval"', evals)))
    problems = [p for p in _errors(own) if "not held out" in p.message]
    assert len(problems) == 1 and "eval[0].data" in problems[0].where
