"""llmopt bench's parts: figures from records, stream parsing, request bodies, sweeps, repeats, usage errors."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from test_bench_fakeserver import Running

from llmopt.bench import BenchOptions, Workload, client, metrics, run_bench, runner, workload as wl
from llmopt.bench.client import Record
from llmopt.bench.report import markdown
from llmopt.cli.main import main


def record(start, ttft, gaps, tokens=None, error=None, end_after=0.0):
    rec = Record(start=start, sent=start)
    if error:
        rec.fail(error, f"{error} happened")
        rec.end = start + 0.01
        return rec
    rec.chunks = [start + ttft + sum(gaps[:k]) for k in range(len(gaps) + 1)]
    rec.end, rec.done = rec.chunks[-1] + end_after, True
    rec.output_tokens, rec.prompt_tokens = tokens or len(rec.chunks), 10
    return rec


def test_stats_are_numpy_percentiles():
    values = random.Random(0).sample(range(1000), 200)
    got = metrics.stats(values)
    assert got["p99"] == pytest.approx(np.percentile(values, 99), abs=1e-3) and got["mean"] == pytest.approx(np.mean(values))
    assert metrics.stats([]) is None


def test_summary_of_records():
    records = [record(0.0, 0.1, [0.02] * 4), record(0.0, 0.3, [0.05] * 4), record(0.5, 0.1, [], tokens=1),
               record(0.2, 0, [], error="http_429"), record(0.3, 0, [], error="http_429"), record(0.3, 0, [], error="timeout")]
    slo = {"ttft_p99_ms": 200, "tpot_p99_ms": 30, "e2e_p99_ms": None}
    s = metrics.summarize(records, slo)
    assert s["requests"] == {"sent": 6, "ok": 3, "failed": 3}
    assert s["errors"] == {"http_429": {"count": 2, "example": "http_429 happened"},
                           "timeout": {"count": 1, "example": "timeout happened"}}
    assert s["duration_s"] == pytest.approx(0.6) and s["request_throughput"] == pytest.approx(3 / 0.6)
    assert s["output_throughput"] == pytest.approx(11 / 0.6, abs=1e-3)
    assert s["total_token_throughput"] == pytest.approx(41 / 0.6, abs=1e-3)
    assert s["ttft_ms"]["p50"] == pytest.approx(100) and s["tpot_ms"]["mean"] == pytest.approx(35)  # 1-token: no TPOT
    assert sorted(round(v) for v in [s["itl_ms"]["p50"], s["itl_ms"]["mean"]]) == [35, 35]
    # the first request meets both bounds; the second misses TTFT; the 1-token one has no TPOT
    assert s["goodput"] == {"requests_per_s": pytest.approx(1 / 0.6, rel=1e-3), "requests": 1, "fraction": 0.3333,
                            "bounds": {"ttft_p99_ms": 200, "tpot_p99_ms": 30}}
    assert s["slo_met"] == {"ttft_p99_ms": False, "tpot_p99_ms": False}
    assert metrics.summarize(records, {})["goodput"] is None


def test_median_of_repeats_sums_the_counts():
    a = metrics.summarize([record(0, 0.1, [0.01] * 3)], {})
    b = metrics.summarize([record(0, 0.3, [0.01] * 3), record(0, 0, [], error="http_500")], {})
    c = metrics.summarize([record(0, 0.2, [0.01] * 3)], {})
    m = metrics.median_of([a, b, c])
    assert m["ttft_ms"]["p50"] == pytest.approx(200) and m["requests"] == {"sent": 4, "ok": 3, "failed": 1}
    assert m["errors"]["http_500"]["count"] == 1


@pytest.mark.parametrize("data, chunks, tokens, done, error", [
    (b'{"id":"a","choices":[{"index":0,"text":"hi","finish_reason":null}]}', 1, None, False, None),
    (b'{"id":"a","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}', 0, None, False, None),
    (b'{"id":"a","choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"stop"}]}', 1, None, True, None),
    (b'{"id":"a","choices":[{"index":0,"delta":{"reasoning_content":"r"}}]}', 1, None, False, None),
    (b'{"id":"a","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":7}}', 0, 7, False, None),
    (b'{"error":{"message":"boom"}}', 0, None, False, "stream_error"),
    (b"[DONE]", 0, None, True, None),
    (b"not json", 0, None, False, "stream_error"),
])
def test_stream_events(data, chunks, tokens, done, error):
    rec = Record(start=0.0)
    client.handle_event(rec, data, 1.0)
    assert (len(rec.chunks), rec.output_tokens, rec.done, rec.error) == (chunks, tokens, done, error)


def test_server_kind_and_bodies():
    assert wl.server_kind({"data": [{"owned_by": "vllm"}]}) == "vllm"
    assert wl.server_kind({"data": [{"owned_by": "llmopt"}]}) == "llmopt"
    assert wl.server_kind({"data": [{"owned_by": "tensorrt_llm"}]}) == "trtllm"
    assert wl.server_kind({"data": [{"owned_by": "openai"}]}) == "unknown"
    work = Workload(input_len=50, output_len=7)
    bodies = [json.loads(b) for b in wl.bodies(work, BenchOptions(), "m", "vllm", 512, 20, seed=1)]
    assert all(len(b["prompt"]) == 50 and all(8 <= t < 460 for t in b["prompt"]) for b in bodies)
    assert len({tuple(b["prompt"]) for b in bodies}) == 20  # no two prompts alike
    assert all(b["ignore_eos"] is True and b["max_tokens"] == 7 and b["stream"] for b in bodies)
    plain = json.loads(wl.bodies(work, BenchOptions(), "m", "unknown", None, 1, seed=1)[0])
    assert set(plain) == {"model", "prompt", "max_tokens", "temperature", "stream", "stream_options"}
    assert json.loads(wl.bodies(work, BenchOptions(), "m", "llmopt", None, 1, seed=1)[0])["ignore_eos"] is True
    assert len(plain["prompt"].split()) == 50
    chat = json.loads(wl.bodies(work, BenchOptions(endpoint="chat", ignore_eos=True), "m", "llmopt", 512, 1, 1)[0])
    assert chat["messages"][0]["role"] == "user" and chat["ignore_eos"] is True and "prompt" not in chat
    assert wl.bodies(work, BenchOptions(), "m", "x", 512, 3, seed=5) == wl.bodies(work, BenchOptions(), "m", "x", 512, 3, 5)


def test_targets():
    assert runner.base_url("http://h:8000/v1/") == "http://h:8000" and runner.is_url("https://h")
    assert runner.default_out_dir("http://h:8000/v1").name.startswith("h-8000-v1-")


def test_an_artifacts_bench_is_its_recipes_settings_with_the_commands_over_them(tmp_path):
    from llmopt.bench.stage import artifact_bench_options
    from llmopt.errors import UsageError
    from llmopt.plan import is_artifact
    from llmopt.recipe.schema import Recipe

    recipe = Recipe.model_validate({"schema_version": 1, "name": "r", "model": {"source": "x"}, "bench": {"requests": 3, "warmup": 1},
                                    "serve": {"backend": "vllm", "workload": {"input_len": 5},
                                              "slo": {"ttft_p99_ms": 9}}})
    got = artifact_bench_options(recipe, {"workload": {"output_len": 7}, "slo": {"tpot_p99_ms": 2},
                                          "options": {"repeats": 2, "concurrency": [1, 4], "endpoint": "chat"}})
    assert (got.engine, got.workload.input_len, got.workload.output_len) == ("vllm", 5, 7)
    assert (got.slo.ttft_p99_ms, got.slo.tpot_p99_ms) == (9, 2)
    assert (got.requests, got.warmup, got.repeats) == (3, 1, 2)  # [bench]'s, and the command's repeats
    assert got.load.concurrency == [1, 4] and got.load.endpoint == "chat" and got.load.engine == "auto"
    with pytest.raises(UsageError, match=r"bench workload\.input_len"):  # said as for a URL's bench
        artifact_bench_options(recipe, {"workload": {"input_len": 0}})
    with pytest.raises(UsageError, match=r"bench options\.requests"):
        artifact_bench_options(recipe, {"options": {"requests": 0}})
    # a count per load point (llmopt bench ARTIFACT -c 1,4 -n 2,6), which [bench] requests cannot say: the command's
    per_point = artifact_bench_options(recipe, {"options": {"concurrency": [1, 4], "requests": [2, 6]}})
    assert per_point.requests == [2, 6] and per_point.bench().point_requests(per_point.workload) == [2, 6]
    with pytest.raises(UsageError, match="-n gives 2 request counts for 1 load point"):  # before the engine starts
        artifact_bench_options(recipe, {"options": {"requests": [2, 6]}})
    bare = artifact_bench_options(Recipe.model_validate({"schema_version": 1, "name": "r", "model": {"source": "x"}}), {})
    assert bare.engine == "llmopt" and bare.load == BenchOptions() and bare.repeats == 3
    assert not is_artifact("http://h:1") and not is_artifact(tmp_path)
    (tmp_path / "model").mkdir()
    (tmp_path / "manifest.json").write_text("{}")
    assert is_artifact(tmp_path)


def test_markdown_has_a_row_per_point():
    point = {"load": {"kind": "rate", "value": 2.5}, **metrics.summarize([record(0, 0.1, [0.01] * 3)], {"ttft_p99_ms": 500})}
    text = markdown({"target": {"model": "m", "url": "u"}, "workload": {"input_len": 1, "output_len": 4},
                     "slo": {"ttft_p99_ms": 500}, "options": {"requests": 1, "warmup": 0}, "points": [point, point]})
    assert text.count("| 2.5 req/s | 1 / 1 |") == 2 and "ttft_p99_ms <= 500" in text


def test_sweep_stops_at_saturation_or_errors(tmp_path):
    work = {"input_len": 4, "output_len": 3}
    with Running("--max-inflight", "2") as server:  # more than 2 in flight: 429
        result = run_bench(server.url, work, {}, {"sweep": True, "requests": 8, "warmup": 0, "plots": False}, tmp_path)
    assert [p["load"]["value"] for p in result["points"]] == [1, 2, 4]
    assert "failed at concurrency 4" in result["saturation"]["reason"]
    assert result["points"][2]["errors"]["http_429"]["count"] > 0
    with Running() as server:
        result = run_bench(server.url, work, {}, {"sweep": True, "max_concurrency": 2, "requests": 4, "warmup": 1,
                                                  "repeats": 2, "plots": False}, tmp_path / "b")
    assert result["saturation"]["reason"] == "reached max_concurrency 2"
    assert [len(p["repeats"]) for p in result["points"]] == [2, 2]
    assert result["points"][1]["requests"]["sent"] == 8  # 2 repeats of max(4, 2 x 2)


@pytest.mark.parametrize("args, message", [
    (["--slo", "latency=5"], "unknown SLO bound"),
    (["-c", "two"], "--concurrency takes numbers"),
    (["-r", "0"], "--rate takes positive numbers"),
    (["--endpoint", "embeddings"], "--endpoint"),
    (["--slo", "ttft_p99_ms=-1"], "slo.ttft_p99_ms: Input should be greater than 0"),
])
def test_usage_errors_exit_2(args, message, capsys):
    assert main(["bench", "http://127.0.0.1:9", *args]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["-c", "1,8", "-n", "16,128,128"], "-n gives 3 request counts for 2 load points"),
    (["-n", "16,128"], "-n gives 2 request counts for 1 load point"),  # the workload's one concurrency
    (["--sweep", "-n", "16,128"], "a sweep takes one request count"),
    (["-c", "1,8", "-n", "16,0"], "--requests takes positive numbers"),
])
def test_a_count_per_point_must_match_the_points(args, message, capsys):
    assert main(["bench", "http://127.0.0.1:9", *args]) == 2
    assert message in capsys.readouterr().err


def test_requests_per_point(tmp_path, capsys):
    """-n 2,6 with -c 1,2: two requests one at a time, six at two in flight (a point of one request in flight
    needs fewer to be measured than a loaded one), in one run against one server."""
    with Running() as server:
        code = main(["bench", server.url, "--input-len", "4", "--output-len", "3", "-c", "1,2", "-n", "2,6",
                     "--warmup", "0", "--vocab-size", "100", "--no-plots", "-o", str(tmp_path), "--format", "json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0
    assert [p["requests"]["sent"] for p in result["points"]] == [2, 6]
    assert result["options"]["requests"] == [2, 6]
    assert "2, 6 requests at the load points in order" in (tmp_path / "bench.md").read_text()


def test_bad_targets(tmp_path, capsys):
    assert main(["bench", str(tmp_path / "nothing")]) == 2
    assert "neither a URL" in capsys.readouterr().err
    assert main(["bench", "http://127.0.0.1:9", "-o", str(tmp_path / "out")]) == 1
    assert "no OpenAI-compatible server answers" in capsys.readouterr().err


def test_cli_json_output(tmp_path, capsys):
    with Running("--owned-by", "sglang") as server:
        code = main(["bench", server.url, "--input-len", "4", "--output-len", "3", "-c", "2", "-n", "4", "--warmup", "0",
                     "--vocab-size", "100", "--slo", "e2e_p99_ms=5000", "-o", str(tmp_path), "--format", "json"])
        truth = server.truth()
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result == json.loads((tmp_path / "bench.json").read_text())
    assert result["target"]["server"] == "sglang" and all("ignore_eos" in r["keys"] for r in truth.values())
    assert result["points"][0]["goodput"]["bounds"] == {"e2e_p99_ms": 5000.0}
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pytest.skip("matplotlib is not installed: no plots to check")
    assert result["files"]["plots"] == ["latency.png", "throughput.png"]
    assert all((tmp_path / name).read_bytes()[:4] == b"\x89PNG" for name in result["files"]["plots"])


@pytest.mark.parametrize("server, context, asked, expect", [
    ("llmopt", 600, None, ([128, 512], [2048])),  # the default lengths that fit the context with 32 output tokens
    ("llmopt", None, None, ([128, 512, 2048], [])),
    ("llmopt", 600, [], ([], [])),  # asked for none
    ("vllm", 4096, None, ([], [])),  # not measured against a GPU engine unless asked
    ("vllm", 4096, [1024, 4090], ([1024], [4090])),
])
def test_split_lengths(server, context, asked, expect):
    from llmopt.bench import split

    assert split.lengths(BenchOptions(split=asked), server, context) == expect


def test_split_off_on_the_command_line(tmp_path, capsys):
    with Running("--owned-by", "llmopt") as server:
        code = main(["bench", server.url, "--input-len", "4", "--output-len", "3", "-c", "1", "-n", "2", "--warmup", "0",
                     "--vocab-size", "100", "--split", "off", "--no-plots", "-o", str(tmp_path), "--format", "json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["split"] is None and result["options"]["split"] == []


def test_an_artifacts_recorded_split_is_kept_unless_the_command_line_sets_one():
    from llmopt.bench.stage import artifact_bench_options
    from llmopt.cli.bench import _split
    from llmopt.recipe.schema import Recipe

    recipe = Recipe.model_validate({"schema_version": 1, "name": "r", "model": {"source": "x"},
                                    "serve": {"backend": "ort", "workload": {"input_len": 8}},
                                    "bench": {"requests": 2, "split": [64]}})
    for args, expect in ((None, [64]), (["off"], []), (["128"], [128]), (["128,512"], [128, 512])):
        given = {} if _split(args) is None else {"split": _split(args)}
        assert artifact_bench_options(recipe, {"options": given}).split == expect, args
