"""llmopt bench end to end against llmopt serve on the tiny model: an artifact folder whose manifest
holds the workload, the SLO and [bench], served by ``llmopt serve`` that bench starts and stops."""

from __future__ import annotations

import json
import os

import pytest

from conftest import load_json, run_cli
from test_bench_fakeserver import alive

from llmopt.bench import engine


@pytest.fixture
def tiny_artifact(tmp_path, tiny_model):
    folder = tmp_path / "tiny-artifact"
    folder.mkdir()
    (folder / "model").symlink_to(tiny_model, target_is_directory=True)
    resolved = {"schema_version": 1, "name": "tiny-art", "model": {"source": str(tiny_model)}, "serve": {"backend": "ort", "max_model_len": 256,
                                              "workload": {"input_len": 24, "output_len": 6, "concurrency": 2},
                                              "slo": {"ttft_p99_ms": 60000, "tpot_p99_ms": None, "e2e_p99_ms": None}},
                "bench": {"enabled": False, "requests": 4, "warmup": 1, "repeats": 1}}
    (folder / "manifest.json").write_text(json.dumps({"recipe": {"name": "tiny-art", "resolved": resolved}}))
    return folder


@pytest.mark.slow  # a fresh interpreter importing torch and transformers: 10-30 s on a small CPU machine
def test_bench_artifact_through_llmopt_serve(tmp_path, tiny_artifact, isolated_cache):
    out = tmp_path / "out"
    res = run_cli("bench", str(tiny_artifact), "-o", str(out), "--format", "json", timeout=300)
    assert res.returncode == 0, res.stderr
    result = load_json(res.stdout)
    assert result["schema_version"] == 1
    assert result["target"]["server"] == "llmopt" and result["target"]["model"] == "tiny-art"
    assert result["target"]["started"]["engine"] == "llmopt"  # no deploy/ort: llmopt serve itself
    assert result["workload"] == {"input_len": 24, "output_len": 6, "concurrency": 2}
    point = result["points"][0]
    assert point["load"] == {"kind": "concurrency", "value": 2.0}
    assert point["requests"] == {"sent": 4, "ok": 4, "failed": 0}, point["errors"]
    assert point["input_tokens_mean"] == 24 and point["output_tokens_mean"] == 6  # ignore_eos: every answer is full
    for metric in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert set(point[metric]) == {"mean", "p50", "p90", "p95", "p99"}
    assert point["goodput"]["requests"] == 4 and point["slo_met"] == {"ttft_p99_ms": True}
    sent = result["client"]["sent"]
    assert sent["prompt"] == "token ids" and sent["vocab_size"] and sent["ignore_eos"] and "ignore_eos" in sent["fields"]
    # the prefill / decode split by default against llmopt serve: of 128, 512 and 2048 prompt tokens only 128 fits
    # the served context (256) with its 32 output tokens
    split = result["split"]
    assert [row["input_len"] for row in split["lengths"]] == [128] and split["skipped_lengths"] == [512, 2048]
    row = split["lengths"][0]
    assert row["requests"] == {"sent": 3, "ok": 3, "failed": 0} and row["prompt_tokens"] == 128
    assert row["prefill_tokens_per_s"] > 0
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert len(records) == 4 + 2 + 3 + 1  # warm-up: one round of 2; split
    # The tiny model decodes 32 tokens in a few milliseconds: when the client was slower to read than the server to
    # write, every token of a request arrived in one read, the client saw no decode time, and the split says so
    # (no figure) instead of dividing by zero. A decode rate is given exactly when some request's tokens came in
    # more than one read.
    measured = [r for r in records if r.get("split") == 128 and not r["warmup"]]
    decoded = [r for r in measured if r["end_s"] > r["chunks_s"][0]]
    assert (row["decode_tokens_per_s"] is not None) == bool(decoded), (row, measured)
    assert row["decode_tokens_per_s"] is None or row["decode_tokens_per_s"] > 0
    markdown = (out / "bench.md").read_text()
    assert markdown.count("| c=2 |") == 1 and "| 128 | 3 / 3 |" in markdown
    assert not alive(result["target"]["started"]["pid"])
    assert not list(engine.pid_dir(isolated_cache).glob("*.json"))
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pytest.skip("matplotlib is not installed: no plots to check")
    assert result["files"]["plots"] == ["latency.png", "throughput.png", "split.png"]
    for name in result["files"]["plots"]:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # as above
def test_bench_url_of_a_running_llmopt_serve(tmp_path, tiny_model, isolated_cache):
    """A URL target: nothing is started; the CLI flags set the workload; text prompts; 429s from the queue."""
    import subprocess
    import sys

    port = engine.free_port()
    server = subprocess.Popen([sys.executable, "-m", "llmopt", "serve", str(tiny_model), "--port", str(port),
                               "--max-queue", "1", "--format", "quiet"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env=dict(os.environ))
    try:
        engine.wait_ready(f"http://127.0.0.1:{port}", server, tmp_path / "none.log", 120)
        res = run_cli("bench", f"http://127.0.0.1:{port}/v1", "--input-len", "8", "--output-len", "3", "-c", "1,3",
                      "-n", "3", "--warmup", "0", "-o", str(tmp_path / "out"), "--format", "json",
                      "--no-plots")
    finally:
        server.terminate()
        server.wait(timeout=60)
    assert res.returncode == 0, res.stderr
    result = load_json(res.stdout)
    assert result["target"]["started"] is None and result["client"]["sent"]["prompt"] == "text"  # no vocabulary
    one, three = result["points"]
    assert one["requests"]["ok"] == 3 and one["errors"] == {}
    # max-queue 1: while one request generates and one waits, a third is refused with 429
    assert three["errors"]["http_429"]["count"] >= 1 and "busy" in three["errors"]["http_429"]["example"]
    assert result["files"]["plots"] == []
