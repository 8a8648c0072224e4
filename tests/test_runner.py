"""The runner: cache reuse, resume after kill -9, atomic stages and artifacts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from llmopt import api

from conftest import tiny_recipe, wait_for, write_recipe


def test_run_writes_artifact_and_second_run_is_cached(tiny_model, tmp_path, isolated_cache):
    recipe = write_recipe(tmp_path, tiny_recipe(tiny_model))
    out = tmp_path / "art"
    first = api.run(recipe, output_dir=out)
    # the candidate is the baseline model (no compression): its eval is the baseline's; the gate runs
    assert [(r.name, r.status) for r in first.records] == [
        ("source", "ran"), ("eval.prose.baseline", "ran"), ("eval.prose.candidate", "cached"), ("gate", "ran")]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["recipe"]["sha256"] == first.plan.recipe.digest
    assert manifest["source"]["fingerprint"]
    assert set(manifest["files"]) >= {"model/config.json", "model/model.safetensors", "reports/report.json", "README.md"}
    assert first.gates[0]["verdict"] == "pass" and first.gates[0]["delta"] == 0.0
    modes = {str(f.relative_to(out)): f.stat().st_mode & 0o777 for f in out.rglob("*") if f.is_file()}
    assert set(modes.values()) == {0o644}, modes  # a container or another user can read the artifact
    second = api.run(recipe, output_dir=out)
    assert [r.status for r in second.records] == ["cached"] * 4


def test_an_output_folder_of_other_files_is_refused_before_any_stage_runs(tiny_model, tmp_path, isolated_cache, capsys):
    """The artifact replaces its folder whole: `llmopt run recipe.toml -o userdir` deleted the user's files there.
    A folder that is not an earlier artifact (no manifest.json) and is not empty is refused at plan time."""
    from llmopt.cli.main import main

    recipe = write_recipe(tmp_path, tiny_recipe(tiny_model))
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("precious")
    assert main(["run", str(recipe), "-o", str(mine)]) == 2
    err = capsys.readouterr().err
    assert f"-o {mine} (command line): {mine} exists and is not an earlier artifact" in err
    assert "fix: fix the command line" in err
    assert (mine / "notes.txt").read_text() == "precious" and sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    assert not (isolated_cache / "stages").exists() or not any((isolated_cache / "stages").iterdir())  # ran nothing
    assert main(["plan", str(recipe), "-o", str(mine)]) == 2  # the plan says so too
    assert main(["run", str(recipe), "-o", str(mine / "notes.txt")]) == 2  # a file is not replaced either
    assert (mine / "notes.txt").read_text() == "precious"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert api.run(recipe, output_dir=empty).plan.output_dir == empty  # an empty folder is taken
    assert api.run(recipe, output_dir=empty).records  # and an earlier artifact is replaced


def test_a_cache_or_output_that_cannot_be_written_is_a_usage_error_before_any_stage(tiny_model, tmp_path, capsys):
    """`--cache-dir /proc/cache` and `-o /proc/foo` were internal errors, the second after every stage had run."""
    from llmopt.cli.main import main

    recipe = write_recipe(tmp_path, tiny_recipe(tiny_model))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(["run", str(recipe), "--cache-dir", str(blocker / "cache"), "-o", str(tmp_path / "art")]) == 2
    err = capsys.readouterr().err
    assert f"cannot write the stage cache, {blocker / 'cache'}" in err and "internal error" not in err
    assert main(["run", str(recipe), "--cache-dir", str(tmp_path / "cache"), "-o", str(blocker / "art")]) == 2
    err = capsys.readouterr().err
    assert f"cannot write the output folder, {blocker / 'art'}" in err and "pass -o a folder" in err
    assert not (tmp_path / "cache" / "stages").exists()  # no stage ran


def test_changing_only_eval_reruns_only_eval(tiny_model, tmp_path):
    recipe = write_recipe(tmp_path, tiny_recipe(tiny_model))
    api.run(recipe, output_dir=tmp_path / "a")
    again = api.run(recipe, overrides=["eval[0].max_windows=3"], output_dir=tmp_path / "a")
    assert {r.name: r.status for r in again.records}["source"] == "cached"
    assert {r.name: r.status for r in again.records}["eval.prose.baseline"] == "ran"


def test_force_reruns_stage_and_downstream(tiny_model, tmp_path):
    recipe = write_recipe(tmp_path, tiny_recipe(tiny_model))
    api.run(recipe, output_dir=tmp_path / "a")
    forced = api.run(recipe, force=["source"], output_dir=tmp_path / "a")
    assert all(r.status == "ran" for r in forced.records[:2])
    only_eval = api.run(recipe, force=["eval"], output_dir=tmp_path / "a")
    assert [r.status for r in only_eval.records][:2] == ["cached", "ran"]



def test_force_of_a_name_no_stage_has_is_a_usage_error(tiny_model, tmp_path, capsys):
    """`--force compres` (a typo) matched no stage and the run took every stage from the cache, silently."""
    from llmopt.cli.main import main

    recipe = write_recipe(tmp_path, tiny_recipe(tiny_model))
    assert main(["run", str(recipe), "-o", str(tmp_path / "art"), "--force", "evl"]) == 2
    err = capsys.readouterr().err
    assert "--force evl: no stage is named so or starts with evl." in err and "did you mean 'eval'?" in err
    assert not (tmp_path / "art").exists()
    assert main(["run", str(recipe), "-o", str(tmp_path / "art"), "--force", "eval", "--force", "all"]) == 0


def test_kill_mid_stage_then_resume(tiny_model, tmp_path, isolated_cache):
    # a slow eval stage to kill: 400 windows of 512 tokens one at a time (6 s on one CPU thread; the source stage
    # imports transformers and loads the model for its checks, so the eval stage's own time is all there is)
    slow = tiny_recipe(tiny_model, windows=400).replace("window = 64", "window = 512\nstride = 8\nbatch_size = 1")
    recipe = write_recipe(tmp_path, slow)
    out = tmp_path / "art"
    plan = api.plan(recipe, output_dir=out)
    source_key = plan.stage("source").key
    eval_key = plan.stage("eval.prose.baseline").key
    proc = subprocess.Popen([sys.executable, "-m", "llmopt", "run", str(recipe), "-o", str(out), "-f", "quiet"],
                            env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    tmp_root = isolated_cache / "tmp"
    wait_for(lambda: any(p.name.startswith(eval_key) for p in tmp_root.glob("*")) if tmp_root.exists() else False,
             timeout=300)
    time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    stages = isolated_cache / "stages"
    assert (stages / source_key / "manifest.json").is_file()
    assert not (stages / eval_key).exists()  # the unfinished stage is not visible
    assert not out.exists()  # nor a half-written artifact
    result = api.run(recipe, overrides=["eval[0].max_windows=400"], output_dir=out)
    status = {r.name: r.status for r in result.records}
    assert status["source"] == "cached" and status["eval.prose.baseline"] == "ran"
    assert not any(tmp_root.iterdir())  # the dead run's temporary folder was cleaned
    assert (out / "manifest.json").is_file()
    assert not list(tmp_path.glob(".art.tmp-*"))


def test_failed_stage_leaves_nothing(tiny_model, tmp_path, isolated_cache):
    recipe = write_recipe(tmp_path, tiny_recipe(tiny_model, extra='data = "missing.txt"\n'))
    result = subprocess.run([sys.executable, "-m", "llmopt", "run", str(recipe), "-o", str(tmp_path / "art")],
                            capture_output=True, text=True)
    assert result.returncode == 2  # the plan check catches the missing file before any stage runs
    assert "data file not found" in result.stderr
    assert not (tmp_path / "art").exists()
    assert not (isolated_cache / "stages").exists()


def test_stage_error_exits_1_and_commits_nothing(tiny_model, tmp_path, isolated_cache):
    bad = tmp_path / "bad.txt"
    bad.write_text("")  # empty text: no windows to score
    recipe = write_recipe(tmp_path, tiny_recipe(tiny_model, extra=f'data = "{bad}"\n'))
    result = subprocess.run([sys.executable, "-m", "llmopt", "run", str(recipe), "-o", str(tmp_path / "art")],
                            capture_output=True, text=True)
    assert result.returncode == 1, result.stderr
    assert "nothing to score" in result.stderr and "Traceback" not in result.stderr
    stages = [p.name for p in (isolated_cache / "stages").iterdir()]
    assert len(stages) == 1  # the source stage only
    assert not any((isolated_cache / "tmp").iterdir())
    assert not (tmp_path / "art").exists()


def test_artifact_links_cached_weights_and_an_edit_through_the_link_reruns_the_stage(tiny_model, tmp_path, isolated_cache,
                                                                                     monkeypatch):
    from llmopt.store import cache
    from llmopt.store.verify import verify_artifact

    monkeypatch.setattr(cache, "LINK_MIN", 1)  # the tiny model's weights are far below 64 MiB
    prune = '[[compress]]\nmethod = "prune_depth"\nlayers = 1\nprotect_first = 0\n'
    recipe = write_recipe(tmp_path, tiny_recipe(tiny_model, prune))
    out = tmp_path / "art"
    first = api.run(recipe, output_dir=out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["checksum"] == "blake3" and "model/model.safetensors" in manifest["linked"]
    assert manifest["source"]["fingerprint"].startswith("blake3:")  # hashed in the background, there by the end
    key = first.plan.stage("compress.0.prune_depth").key
    weights = out / "model" / "model.safetensors"
    assert weights.stat().st_ino == (isolated_cache / "stages" / key / "model" / "model.safetensors").stat().st_ino
    assert verify_artifact(out)["ok"]
    with open(weights, "r+b") as f:  # written in place through the artifact's link
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 1]))
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 1))
    assert not verify_artifact(out)["ok"] and first.plan.cache.state(key) == "changed"
    second = api.run(recipe, output_dir=out)
    assert {r.name: r.status for r in second.records}["compress.0.prune_depth"] == "ran"
    assert {r.name: r.status for r in second.records}["source"] == "cached"
    again = json.loads((out / "manifest.json").read_text())
    assert again["files"]["model/model.safetensors"] == manifest["files"]["model/model.safetensors"]  # same pruning
    assert verify_artifact(out)["ok"]


def test_sha256_checksums_when_the_recipe_asks(tiny_model, tmp_path):
    import hashlib

    from llmopt.store.verify import verify_artifact

    recipe = write_recipe(tmp_path, tiny_recipe(tiny_model, '[output]\nchecksum = "sha256"\n'))
    out = tmp_path / "art"
    api.run(recipe, output_dir=out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["checksum"] == "sha256" and manifest["linked"] == []  # the source folder is the user's: copied
    weights = (out / "model" / "model.safetensors").read_bytes()
    assert manifest["files"]["model/model.safetensors"] == hashlib.sha256(weights).hexdigest()
    report = verify_artifact(out)
    assert report["ok"] and report["checksum"] == "sha256"
    del manifest["checksum"]  # a manifest that names no checksum is read as SHA-256
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert verify_artifact(out)["ok"]


def test_deferred_work_runs_on_the_stage_folder_in_the_cache_and_seals_it(tmp_path):
    import logging
    from types import SimpleNamespace

    from llmopt.run import runner

    from llmopt.store import cache
    from llmopt.output import Output

    class Writer:
        requires = ()

        def run(self, options, ctx):
            (ctx.out_dir / "model").mkdir()
            (ctx.out_dir / "model" / "w.bin").write_bytes(b"abc")
            ctx.defer(lambda folder: {"size": (folder / "model" / "w.bin").stat().st_size, "where": str(folder)})
            return {"model_dir": "model"}

    store = cache.Cache(tmp_path / "cache")
    stage = SimpleNamespace(name="source", key="k1", kind="source", backend="fake", inputs={}, impl=Writer(), pinned="",
                            options=SimpleNamespace(model_dump=lambda mode: {}), material={}, volatile=False)
    plan = SimpleNamespace(cache=store, stages=[stage], recipe=SimpleNamespace(path=tmp_path / "r.toml"),
                           stage=lambda name: stage, model=None, gpu=None)
    log = logging.getLogger("llmopt.test.deferred")
    log.addHandler(logging.FileHandler(tmp_path / "run.log"))
    try:
        manifests, records = runner.execute_stages(plan, Output("quiet"), log, "cpu")
    finally:
        for handler in list(log.handlers):
            handler.close()
            log.removeHandler(handler)
    sealed = store.manifest("k1")  # written by the background job, after the folder moved out of tmp/
    assert sealed["outputs"] == {"model_dir": "model", "size": 3, "where": str(store.path("k1"))} == records[0].outputs
    assert store.state("k1") == "whole" and sealed["timing"]["deferred_seconds"] >= 0


def test_native_output_of_a_stage_goes_to_the_run_log(tmp_path, capfd):
    """torch's and ONNX Runtime's C++ warnings write to descriptors 1 and 2 directly, not through
    sys.stdout / sys.stderr: they must reach the run log, not the terminal or a JSON document."""
    import logging
    from types import SimpleNamespace

    from llmopt.run import runner

    from llmopt.store import cache
    from llmopt.output import Output

    class Native:
        requires = ()

        def run(self, options, ctx):
            os.write(1, b"native print\n")
            os.write(2, b"[W native warning]\n")
            print("python print")
            return {}

    store = cache.Cache(tmp_path / "cache")
    stage = SimpleNamespace(name="source", key="k1", kind="source", backend="fake", inputs={}, impl=Native(), pinned="",
                            options=SimpleNamespace(model_dump=lambda mode: {}), material={}, volatile=False)
    plan = SimpleNamespace(cache=store, stages=[stage], recipe=SimpleNamespace(path=tmp_path / "r.toml"),
                           stage=lambda name: stage, model=None, gpu=None)
    log = logging.getLogger("llmopt.test.native")
    log.addHandler(logging.FileHandler(tmp_path / "run.log"))
    out = Output("human")
    try:
        runner.execute_stages(plan, out, log, "cpu")
    finally:
        for handler in list(log.handlers):
            handler.close()
            log.removeHandler(handler)
    captured = capfd.readouterr()
    assert "native" not in captured.out + captured.err and "python print" not in captured.out
    assert "source" in captured.err  # progress still reaches the terminal
    text = (tmp_path / "run.log").read_text()
    assert "native print" in text and "[W native warning]" in text and "python print" in text
    os.write(1, b"after\n")  # the descriptors are the terminal's again
    assert capfd.readouterr().out == "after\n"


def test_stale_temporary_folders_are_cleaned_only_for_this_host(tmp_path, monkeypatch):
    """A cache shared by hosts (a sweep's Ray workers on a shared filesystem): a folder another host is
    writing must survive this host's clean-up, although its pid means nothing here."""
    from llmopt.store import cache as cache_mod
    cache = cache_mod.Cache(tmp_path / "cache")
    mine = cache.begin("a" * 16)
    assert mine.name == f"{'a' * 16}.{cache_mod.host_tag()}.{os.getpid()}"
    tmp_root = mine.parent
    dead = 2**22 + 1  # no such pid
    theirs = tmp_root / f"{'b' * 16}.other-host.{dead}"
    stale = tmp_root / f"{'c' * 16}.{cache_mod.host_tag()}.{dead}"
    legacy = tmp_root / f"{'d' * 16}.{dead}"  # named before folders carried their host
    for folder in (theirs, stale, legacy):
        folder.mkdir()
    removed = cache.clean_stale()
    assert sorted(p.name for p in removed) == sorted([stale.name, legacy.name, mine.name])  # this run's own too
    assert theirs.is_dir()
    monkeypatch.setattr(cache_mod, "host_tag", lambda: "other-host")
    assert cache.clean_stale() == [theirs]
