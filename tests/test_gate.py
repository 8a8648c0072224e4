"""The gate's statistics: interval coverage by simulation, determinism, thresholds and their units."""

from __future__ import annotations

import numpy as np
import pytest

from llmopt.scoring import gate
from llmopt.recipe.schema import EvalItem

SIMULATIONS = 400


def draw_binary(rng, n: int, better: float, worse: float, both: float) -> tuple[np.ndarray, np.ndarray]:
    """Paired 0/1 scores: P(candidate right, baseline wrong) = better, the reverse = worse."""
    kind = rng.choice(4, size=n, p=[better, worse, both, 1 - better - worse - both])
    candidate = np.isin(kind, (0, 2)).astype(float)
    baseline = np.isin(kind, (1, 2)).astype(float)
    return baseline, candidate


def coverage(draw, truth: float, method: str, seed: int = 7) -> float:
    rng = np.random.default_rng(seed)
    hits = 0
    for i in range(SIMULATIONS):
        b, c = draw(rng)
        lo, hi = gate.paired_difference(b, c, 0.95, seed=i, method=method)["ci"]
        hits += lo <= truth <= hi
    return hits / SIMULATIONS


@pytest.mark.parametrize("n, better, worse", [(200, 0.08, 0.05), (100, 0.10, 0.06), (200, 0.15, 0.15)])
def test_score_interval_covers_the_true_difference_at_the_stated_rate(n, better, worse):
    rate = coverage(lambda rng: draw_binary(rng, n, better, worse, 0.6), better - worse, "score")
    print(f"score interval, n={n}, discordant {better}/{worse}: coverage {rate:.3f}")
    assert 0.92 <= rate <= 0.98


def test_bootstrap_interval_covers_a_continuous_difference_at_the_stated_rate():
    def draw(rng):
        b = rng.gamma(2.0, 0.5, size=200)
        return b, b + 0.05 + rng.exponential(0.3, size=200) - 0.3  # skewed differences with mean 0.05

    rate = coverage(draw, 0.05, "bootstrap")
    print(f"bootstrap, continuous, n=200: coverage {rate:.3f}")
    assert 0.92 <= rate <= 0.98


def test_with_rare_discordance_the_score_interval_stays_conservative_and_the_bootstrap_does_not():
    draw = lambda rng: draw_binary(rng, 50, 0.02, 0.01, 0.7)  # noqa: E731  (about 1.5 discordant pairs in 50)
    score, boot = coverage(draw, 0.01, "score"), coverage(draw, 0.01, "bootstrap")
    print(f"n=50, rare discordance: score interval coverage {score:.3f}, bootstrap {boot:.3f}")
    assert score >= 0.95  # too few discordant pairs for an exact 95%: it errs on the safe side
    assert boot < 0.85  # the bootstrap interval is often [0, 0] here


def test_score_interval_known_values():
    # no discordant pair: the bound solves n d / (1 - d) = z^2, i.e. d = z^2 / (n + z^2)
    z2 = 1.959963984540054 ** 2
    lo, hi = gate.score_interval(0, 0, 200, 0.95)
    assert hi == pytest.approx(z2 / (200 + z2), rel=1e-6) and lo == pytest.approx(-hi, rel=1e-9)
    lo, hi = gate.score_interval(10, 5, 200, 0.95)
    assert lo < 0.025 < hi and hi - 0.025 > 0.025 - lo  # skewed away from the boundary at 0
    assert gate.score_interval(0, 100, 100, 0.95)[0] == -1.0
    assert gate.score_interval(5, 5, 100, 0.99)[1] > gate.score_interval(5, 5, 100, 0.90)[1]


def rows(values, key="score"):
    return {f"x{i:03d}": {"id": f"x{i:03d}", key: v} for i, v in enumerate(values)}


def test_compare_is_deterministic_given_a_seed_and_ignores_row_order():
    rng = np.random.default_rng(0)
    b, c = rng.normal(size=80), rng.normal(size=80)
    base, cand = rows(b), rows(c)
    shuffled = dict(reversed(list(cand.items())))
    first = gate.compare("acc", base, cand, 0.95, seed=3)
    assert first["method"] == "bootstrap"
    assert gate.compare("acc", base, shuffled, 0.95, seed=3) == first
    assert gate.compare("acc", base, cand, 0.95, seed=4)["ci"] != first["ci"]


def test_compare_pairs_by_id_and_counts_the_unpaired():
    base = rows([1, 0, 1, 1])
    cand = {**rows([1, 1, 1]), "extra": {"id": "extra", "score": 0}}
    out = gate.compare("acc", base, cand, 0.95)
    assert out["n"] == 3 and out["unpaired"] == {"baseline_only": 1, "candidate_only": 1}
    assert out["method"] == "score" and out["discordant"] == {"candidate_better": 1, "candidate_worse": 0}
    assert out["delta"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError):
        gate.compare("acc", rows([0.5, 1]), rows([1, 1]), 0.95, method="score")


def item(**thresholds) -> EvalItem:
    return EvalItem(name="e", kind="multiple_choice", **thresholds)


def comparison(**values) -> dict:
    return {"metric": "acc", "n": 400, "baseline": 0.6, "candidate": 0.57, "delta": -0.03, "ci": [-0.05, -0.01], **values}


def test_judge_interval_versus_point_and_the_n_needed():
    undecided = gate.judge(item(max_drop=0.04), comparison(), True)
    assert undecided["verdict"] == "fail" and undecided["undecided"]
    assert "n=400 is too small to decide; about 1600 examples would" in undecided["reason"]  # (0.02 / 0.01)^2 * 400
    assert gate.judge(item(max_drop=0.04, gate_on="point"), comparison(), True)["verdict"] == "pass"
    assert gate.judge(item(max_drop=0.06), comparison(), True)["verdict"] == "pass"
    assert gate.judge(item(max_drop=0.02), comparison(), True)["verdict"] == "fail"
    assert gate.judge(item(), comparison(), True)["verdict"] == "no-gate"
    assert gate.judge(item(max_drop=1), {"metric": "acc", "n": 0, "delta": None, "ci": [None, None]}, True)["verdict"] == "fail"


def test_judge_relative_thresholds_and_recovery():
    # relative drop 5% (interval up to 8.3%); recovery 0.95 (interval down to 0.917)
    assert gate.judge(item(max_rel_drop_pct=9), comparison(), True)["verdict"] == "pass"
    assert gate.judge(item(max_rel_drop_pct=8), comparison(), True)["verdict"] == "fail"
    assert gate.judge(item(min_recovery=0.91), comparison(), True)["verdict"] == "pass"
    assert gate.judge(item(min_recovery=0.96), comparison(), True)["verdict"] == "fail"
    zero = gate.judge(item(max_rel_drop_pct=5), comparison(baseline=0.0), True)
    assert zero["verdict"] == "fail" and "undefined" in zero["reason"]


def test_judge_perplexity_in_its_own_units():
    # perplexity 10 -> 10.3: +3% (interval +1%..+4%), i.e. +0.3 perplexity points (up to +0.4)
    ppl = {"metric": "perplexity", "n": 64, "baseline": 10.0, "candidate": 10.3, "delta": 0.03, "ci": [0.01, 0.04]}
    assert gate.judge(item(max_increase_pct=5), ppl, False)["verdict"] == "pass"
    assert gate.judge(item(max_increase_pct=3.5), ppl, False)["verdict"] == "fail"
    assert gate.judge(item(max_drop=0.5), ppl, False)["verdict"] == "pass"  # +0.4 points at worst
    assert gate.judge(item(max_drop=0.35), ppl, False)["verdict"] == "fail"
    assert gate.judge(item(min_recovery=0.95), ppl, False)["verdict"] == "pass"  # 10 / 10.4 = 0.96
    assert gate.judge(item(min_recovery=0.97), ppl, False)["verdict"] == "fail"


def test_windows_scored_on_different_tokens_are_not_paired():
    """A baseline that put a BOS before each window and a candidate that did not score 256 and 255 tokens of the
    same windows: their perplexities are not comparable, and the gate says so instead of judging."""
    baseline = {"w0": {"nll": 900.0, "tokens": 255}, "w1": {"nll": 880.0, "tokens": 256}}
    candidate = {"w0": {"nll": 910.0, "tokens": 255}, "w1": {"nll": 1300.0, "tokens": 255}}
    with pytest.raises(gate.NotPaired, match=r"w1: 256 against 255"):
        gate.compare("perplexity", baseline, candidate, 0.95)
