"""The bench reports speculative decoding: per load point, the acceptance rate and mean acceptance length from the
engine's Prometheus counters (differenced over the point), beside TTFT, TPOT and ITL; no acceptance columns when
the server reports none. Against the simulated engines of tests/sim_engine.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from llmopt.bench import run_bench, speculation

SIM = Path(__file__).with_name("sim_engine.py")
FAST = {"requests": 6, "warmup": 2, "repeats": 1, "plots": False, "split": []}
WORK = {"input_len": 8, "output_len": 17, "concurrency": 2}


class Sim:
    """The simulated engine as a process with ``argv``; ``url``; stopped on exit."""

    def __init__(self, engine: str, argv: list[str], acceptance: float = 0.75):
        env = dict(os.environ, LLMOPT_SIM_ACCEPTANCE=str(acceptance), LLMOPT_SIM_TTFT_MS="2", LLMOPT_SIM_ITL_MS="1")
        env.pop("LLMOPT_SIM_CHILDREN", None)
        self.proc = subprocess.Popen([sys.executable, str(SIM), engine, *argv, "--port", "0"], stdout=subprocess.PIPE,
                                     text=True, env=env)
        line = ""
        while not line.startswith("listening"):
            line = self.proc.stdout.readline()
            assert line, "the simulated engine exited"
        self.url = f"http://127.0.0.1:{line.split()[1]}"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()


def vllm_sim(tmp_path: Path, spec: dict | None) -> Sim:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"max-num-seqs": 8} | ({"speculative-config": spec} if spec else {})))
    return Sim("vllm", ["serve", "model", "--config", str(config)])


def test_vllm_acceptance_per_point(tmp_path):
    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}
    with vllm_sim(tmp_path, spec) as sim:
        result = run_bench(sim.url, WORK, {}, FAST | {"concurrency": [1, 2]}, tmp_path / "out")
    assert len(result["points"]) == 2
    for point in result["points"]:
        spec = point["speculation"]
        assert spec["source"] == "vllm /metrics"
        assert spec["acceptance_rate"] == pytest.approx(0.75) and spec["mean_acceptance_length"] == pytest.approx(4.0)
        # 8 requests (6 + 2 warm-up) of 17 tokens: 16 after the first, 4 per step
        assert spec["drafts"] == 32 and spec["per_position"] == [0.75] * 4
    saved = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert saved["points"][0]["speculation"]["mean_acceptance_length"] == pytest.approx(4.0)
    table = (tmp_path / "out" / "bench.md").read_text()
    assert "| accepted | tokens / step |" in table and "| 75% | 4.00 |" in table
    assert "TPOT p50 / p99 ms" in table


def test_no_acceptance_columns_without_speculation(tmp_path):
    with vllm_sim(tmp_path, None) as sim:
        result = run_bench(sim.url, WORK, {}, FAST, tmp_path / "out")
    assert "speculation" not in result["points"][0]
    assert "accepted" not in (tmp_path / "out" / "bench.md").read_text()


def test_sglang_acceptance_from_its_counters(tmp_path):
    argv = ["--model-path", "model", "--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "5"]
    with Sim("sglang", argv, acceptance=0.5) as sim:
        result = run_bench(sim.url, WORK, {}, FAST, tmp_path / "out")
    spec = result["points"][0]["speculation"]
    assert spec["source"] == "sglang /metrics"
    assert spec["mean_acceptance_length"] == pytest.approx(3.0) and spec["acceptance_rate"] == pytest.approx(0.5)


def test_parse_sums_engines_and_reads_positions():
    text = ('# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.\n'
            'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0\n'
            'vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 5.0\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 3.0\n'
            'vllm:num_requests_running{engine="0"} 2.0\n')
    assert speculation.parse(text) == {"drafts": 15.0, "position:1": 3.0}
    assert speculation.point({"drafts": 1.0}, {"drafts": 1.0}, 4) is None  # nothing drafted in the window


def test_the_batching_engine_s_mean_batch_per_point():
    """llmopt serve's batch-size histogram, differenced over a point: its mean batch (the H100's batches of the ONNX
    CUDA artifact were once only inferred from TTFT)."""
    before = speculation.parse("llmopt_batch_size_bucket{le=\"1\"} 3\nllmopt_batch_size_sum 3\nllmopt_batch_size_count 3\n")
    after = speculation.parse("llmopt_batch_size_sum 43\nllmopt_batch_size_count 8\nllmopt_queue_depth 0\n")
    assert before == {"batch_sequences": 3.0, "engine_steps": 3.0}
    assert speculation.batching(before, after) == {"source": "llmopt /metrics", "engine_steps": 5, "mean_batch_size": 8.0}
    assert speculation.batching(after, after) is None and speculation.point(before, after, 4) is None
