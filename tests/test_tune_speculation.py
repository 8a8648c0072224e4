"""Speculative decoding in the tune stage, against the simulated engine (tests/sim_engine.py).

The simulator makes speculation pay at one request in flight and cost at eight (a decode step of 8 x (k + 1)
tokens is compute-bound), so the search keeps the recipe's ``[serve.speculative]`` at concurrency 1 and turns it
off at 8. Its greedy answers are deterministic, the same with and without speculation unless told to corrupt them:
the lossless check passes, then fails the stage (exit 1). No test asserts a timing.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import run_cli, write_recipe
from test_tune import nothing_left, put_sim

from llmopt import api
from llmopt.bench import engine
from llmopt.tune import spaces, speculation
from llmopt.tune.search import Budget, Search, TrialStore

# per-token time dominates a request (20 ms a step, 5 ms to the first token), so the speed effect is large
FAST = {"ttft_ms": 5, "itl_ms": 20}


@pytest.fixture(autouse=True)
def no_server_left(isolated_cache):
    yield
    engine.stop_leftovers(isolated_cache)


def spec_recipe(folder: Path, model: Path, concurrency: int, backend: str = "vllm", trials: int = 3,
                space: str = "") -> Path:
    body = (f'schema_version = 1\nname = "tiny-spec"\n\n[model]\nsource = "{model}"\n\n'
            f'[target]\ngpu = "H100-SXM-80GB"\n\n[serve]\nbackend = "{backend}"\nmax_model_len = 256\n'
            f"workload = {{ input_len = 16, output_len = 12, concurrency = {concurrency} }}\n"
            "slo = { ttft_p99_ms = 60000 }\n\n"
            '[serve.speculative]\nmethod = "ngram"\nnum_tokens = 3\n\n'
            f"[bench]\nrequests = {2 * concurrency + 2}\nwarmup = 1\n\n"
            f"[tune]\nenabled = true\nmax_trials = {trials}\nrepeats = 0\nlossless_prompts = 4\n{space}\n")
    return write_recipe(folder, body)


def tuning_of(art: Path) -> dict:
    return json.loads((art / "reports" / "tune" / "tuning.json").read_text())


# --- units ----------------------------------------------------------------------------------------------------

def test_speculation_candidates_are_off_and_the_neighbours_of_num_tokens():
    param = next(p for p in spaces.space("vllm") if p.name == spaces.SPECULATIVE)
    assert spaces.candidates(param, 3, 1) == [3, 0, 2, 4]
    assert spaces.candidates(param, 1, 1) == [1, 0, 2] and spaces.candidates(param, 16, 1) == [16, 0, 15]
    assert spaces.candidates(param, None, 1) == []  # no [serve.speculative]: not searched
    assert spaces.SPECULATIVE not in [p.name for p in spaces.space("ort")]  # llmopt serve does not speculate


@pytest.mark.parametrize("engine_name, block, key", [("vllm", "speculative-config", "num_speculative_tokens"),
                                                     ("trtllm", "speculative_config", "max_draft_len")])
def test_num_tokens_is_written_and_zero_removes_the_engines_speculative_config(tmp_path, engine_name, block, key):
    config = {"model": "m", block: {"method": "ngram", key: 3, "other": 4}, "max-num-seqs": 8}
    for value, expected in ((2, {"method": "ngram", key: 2, "other": 4}), (0, None)):
        folder = tmp_path / str(value)
        folder.mkdir()
        (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        (folder / "launch.sh").write_text("#!/bin/sh\nexec engine \"$@\"\n")
        spaces.apply(folder, engine_name, {spaces.SPECULATIVE: value})
        written = yaml.safe_load((folder / "config.yaml").read_text())
        assert written.get(block) == expected and written["max-num-seqs"] == 8


def test_lossless_rule_tolerates_a_rare_late_divergence_only():
    same = [f"answer {i} and more" for i in range(20)]
    one_late = same[:19] + ["answer 19 and mork"]
    verdict = speculation.compare(one_late, same)
    assert verdict["passed"] and verdict["identical"] == 19
    assert verdict["diverged"] == [{"prompt": 19, "at_char": 17, "of_chars": 18, "with": "k", "without": "e"}]
    three = same[:17] + ["x", "y", "z"]
    assert not speculation.compare(three, same)["passed"]  # 85% identical
    assert speculation.compare(one_late[10:], same[10:])["passed"]  # 9 of 10
    assert not speculation.compare(one_late[11:], same[11:])["passed"]  # under 10 prompts: every answer must match
    assert speculation.first_divergence("abc", "abcdef") == 3 and speculation.first_divergence("a", "a") is None


def test_speculation_on_must_beat_off(tmp_path):
    """Coordinate descent keeps the default unless a candidate beats it by 5%; speculation is held to the
    opposite rule too: on within 5% of off is turned off."""
    scores = {3: 10.2, 0: 10.0, 2: 9.0}

    def measure(values, out_dir):
        value = scores[values[spaces.SPECULATIVE]]
        return {"target": {"simulated": True}, "points": [{
            "load": {"kind": "concurrency", "value": 1.0}, "requests": {"sent": 4, "ok": 4, "failed": 0},
            "ttft_ms": None, "tpot_ms": None, "itl_ms": None, "e2e_ms": None, "request_throughput": value,
            "output_throughput": value, "total_token_throughput": value, "goodput": None, "errors": {}}]}

    grid = {spaces.SPECULATIVE: [3, 0, 2]}
    plain = Search(grid, measure, TrialStore(tmp_path / "a"), Budget(8, None, 0), goodput=False).execute()
    assert plain["winner"] == {spaces.SPECULATIVE: 3}
    earned = Search(grid, measure, TrialStore(tmp_path / "b"), Budget(8, None, 0), goodput=False,
                    earn={spaces.SPECULATIVE: 0}).execute()
    assert earned["winner"] == {spaces.SPECULATIVE: 0} and len(earned["trials"]) == 3  # off: measured once


def test_space_naming_speculation_without_it_is_a_plan_error(tmp_path, tiny_model):
    body = spec_recipe(tmp_path, tiny_model, 1).read_text().replace('[serve.speculative]\nmethod = "ngram"\n'
                                                                     'num_tokens = 3\n', "")
    recipe = write_recipe(tmp_path, body + "space = { num_speculative_tokens = [0, 2] }\n")
    res = run_cli("plan", str(recipe))
    assert res.returncode == 2 and "no speculative decoding to tune" in res.stderr


# --- the stage against the simulated engine -------------------------------------------------------------------

def test_speculation_is_kept_at_one_request_in_flight(tmp_path, tiny_model, monkeypatch, isolated_cache):
    children = put_sim(tmp_path, monkeypatch, **FAST)
    art = tmp_path / "art"
    result = api.run(spec_recipe(tmp_path, tiny_model, 1), output_dir=art)
    tuning = tuning_of(art)
    assert tuning["space"][spaces.SPECULATIVE] == [3, 0, 2, 4]
    kept = tuning["winner"][spaces.SPECULATIVE]
    assert tuning["default"][spaces.SPECULATIVE] == 3 and kept in (2, 3)  # 3 is the simulator's best, 2 close
    spec = tuning["speculation"]
    assert spec["kept"] is True and spec["concurrency"] == 1
    assert spec["with"]["values"][spaces.SPECULATIVE] == kept and spec["without"]["values"][spaces.SPECULATIVE] == 0
    assert spec["with"]["acceptance_rate"] == pytest.approx(0.75, abs=0.01)  # the engine's own counters
    assert spec["without"]["acceptance_rate"] is None
    assert spec["output_throughput_ratio"] > 1 and spec["tpot_p50_ratio"] < 1
    lossless = spec["lossless"]
    assert lossless["passed"] and lossless["identical"] == lossless["prompts"] == 4 and lossless["diverged"] == []
    config = yaml.safe_load((art / "deploy" / "vllm" / "config.yaml").read_text())
    assert config["speculative-config"]["num_speculative_tokens"] == kept
    report = (art / "reports" / "report.md").read_text()
    assert "Speculative decoding (num_speculative_tokens 3 in the recipe): kept at concurrency 1" in report
    assert "Lossless check: 4 of 4 greedy answers identical" in report
    assert result.report["tune"]["speculation"]["kept"] is True
    assert nothing_left(children, isolated_cache)


def test_speculation_is_turned_off_at_high_concurrency(tmp_path, tiny_model, monkeypatch, isolated_cache):
    children = put_sim(tmp_path, monkeypatch, **(FAST | {"itl_ms": 40}))  # the client's overheads matter less
    art = tmp_path / "art"
    api.run(spec_recipe(tmp_path, tiny_model, 8), output_dir=art)
    tuning = tuning_of(art)
    assert tuning["winner"][spaces.SPECULATIVE] == 0 and tuning["gain"] > 1
    spec = tuning["speculation"]
    assert spec["kept"] is False and spec["output_throughput_ratio"] < 1 and spec["tpot_p50_ratio"] > 1
    assert spec["lossless"]["passed"] and spec["lossless"]["with_values"][spaces.SPECULATIVE] == 3
    config = yaml.safe_load((art / "deploy" / "vllm" / "config.yaml").read_text())
    assert "speculative-config" not in config
    assert "num_speculative_tokens 0 (speculation off) (predicted 3)" in (art / "deploy" / "vllm" / "launch.sh").read_text()
    assert "turned off at concurrency 8" in (art / "reports" / "report.md").read_text()
    assert nothing_left(children, isolated_cache)


def test_answers_changed_by_speculation_fail_the_stage(tmp_path, tiny_model, monkeypatch, isolated_cache):
    children = put_sim(tmp_path, monkeypatch, spec_corrupt=1, **FAST)
    art = tmp_path / "art"
    res = run_cli("run", str(spec_recipe(tmp_path, tiny_model, 1, trials=1)), "-o", str(art))
    assert res.returncode == 1, res.stderr
    assert "speculative decoding changed greedy answers: 4 of 4 differ with num_speculative_tokens 3" in res.stderr
    assert "parts at character" in res.stderr and "[serve.speculative]" in res.stderr
    assert not art.exists()
    verdict = next(isolated_cache.glob("tune/*/trials/lossless-*.json"))
    assert json.loads(verdict.read_text())["passed"] is False
    assert nothing_left(children, isolated_cache)


def test_sglang_speculation_is_searched_on_its_command_line(tmp_path, tiny_model, monkeypatch, isolated_cache):
    """SGLang's speculation is flags: the search sets --speculative-num-draft-tokens (tokens + 1) in launch.sh and
    the container manifests, and off removes every --speculative-* option from all three."""
    res = run_cli("plan", str(spec_recipe(tmp_path, tiny_model, 1, backend="sglang")))
    assert res.returncode == 0, res.stderr
    assert "does not search" not in res.stdout + res.stderr
    children = put_sim(tmp_path, monkeypatch, "sglang", **FAST)
    art = tmp_path / "art"
    api.run(spec_recipe(tmp_path, tiny_model, 1, backend="sglang"), output_dir=art)
    tuning = tuning_of(art)
    assert tuning["space"][spaces.SPECULATIVE] == [3, 0, 2, 4]
    spec = tuning["speculation"]
    kept = tuning["winner"][spaces.SPECULATIVE]
    assert spec["kept"] is True and kept in (2, 3) and spec["lossless"]["passed"]
    assert spec["with"]["acceptance_rate"] == pytest.approx(0.75, abs=0.01)  # SGLang's own counters
    deploy = art / "deploy" / "sglang"
    compose = next(iter(yaml.safe_load((deploy / "docker-compose.yaml").read_text())["services"].values()))
    k8s = next(yaml.safe_load_all((deploy / "kubernetes.yaml").read_text()))["spec"]["template"]["spec"]
    launch = spaces.exec_line((deploy / "launch.sh").read_text()).split()
    for argv in (launch, compose["command"], k8s["containers"][0]["args"]):
        assert argv[argv.index("--speculative-num-draft-tokens") + 1].strip("'") == str(kept + 1)
        assert argv[argv.index("--speculative-algorithm") + 1] == "NGRAM"
    param = next(p for p in spaces.space("sglang") if p.name == spaces.SPECULATIVE)
    assert spaces.read(deploy, param) == kept
    assert nothing_left(children, isolated_cache)
    off = tmp_path / "off"
    shutil.copytree(deploy, off)
    spaces.apply(off, "sglang", {spaces.SPECULATIVE: 0})
    compose = next(iter(yaml.safe_load((off / "docker-compose.yaml").read_text())["services"].values()))
    k8s = next(yaml.safe_load_all((off / "kubernetes.yaml").read_text()))["spec"]["template"]["spec"]
    launch = spaces.exec_line((off / "launch.sh").read_text()).split()
    for argv in (launch, compose["command"], k8s["containers"][0]["args"]):
        assert not [a for a in argv if a.startswith("--speculative")] and "--enable-metrics" in argv
        assert argv[argv.index("--chunked-prefill-size") + 1].strip("'") == "8192"
    assert spaces.read(off, param) is None


def test_trtllm_speculation_is_searched_in_its_speculative_config(tmp_path, tiny_model, monkeypatch, isolated_cache):
    """TensorRT-LLM: max_draft_len under speculative_config; its /metrics has no acceptance counters, so the
    effect is TPOT and throughput alone."""
    children = put_sim(tmp_path, monkeypatch, "trtllm", **FAST)
    art = tmp_path / "art"
    api.run(spec_recipe(tmp_path, tiny_model, 1, backend="trtllm"), output_dir=art)
    tuning = tuning_of(art)
    kept = tuning["winner"][spaces.SPECULATIVE]
    assert tuning["default"][spaces.SPECULATIVE] == 3 and kept in (2, 3)
    spec = tuning["speculation"]
    assert spec["kept"] and spec["with"]["acceptance_rate"] is None and spec["tpot_p50_ratio"] < 1
    assert spec["lossless"]["passed"]
    config = yaml.safe_load((art / "deploy" / "trtllm" / "config.yaml").read_text())
    assert config["speculative_config"]["max_draft_len"] == kept
    assert config["speculative_config"]["decoding_type"] == "NGram"
    assert nothing_left(children, isolated_cache)


def test_a_config_without_speculation_does_not_search_it(tmp_path):
    """As in an artifact whose tuning turned speculation off: there is no speculative config to set num_tokens in,
    even where the recipe's space names it."""
    folder = tmp_path / "vllm"
    folder.mkdir()
    (folder / "config.yaml").write_text("max-num-seqs: 4\nmax-num-batched-tokens: 8192\n")
    assert spaces.SPECULATIVE not in spaces.grid("vllm", folder, 1, {spaces.SPECULATIVE: [0, 2]})
    (folder / "config.yaml").write_text("max-num-seqs: 4\nspeculative-config:\n  method: ngram\n"
                                        "  num_speculative_tokens: 3\n")
    assert spaces.grid("vllm", folder, 1, {spaces.SPECULATIVE: [0, 2]})[spaces.SPECULATIVE] == [3, 0, 2]
    assert next(iter(spaces.grid("vllm", folder, 1))) == spaces.SPECULATIVE  # searched first
