"""The accuracy gate: paired differences between candidate and baseline, with intervals.

Baseline and candidate are scored on the same examples (pairs joined by example
id). For perplexity the statistic is the relative increase ``ppl_c / ppl_b - 1``
over token-weighted windows; for other metrics the mean difference ``mean(c - b)``.

Its interval comes from one of two methods (``method="auto"`` picks):

* ``score`` (auto for 0/1 scores): Tango's score interval for a difference of
  paired proportions. It depends only on the counts of discordant pairs and,
  unlike the bootstrap, does not collapse to zero width when no pair differs:
  200 identical answers still leave an interval of about +-0.019, because 200
  examples cannot rule out a difference that small. Its coverage stays close to
  the stated level with few discordant pairs (tests/test_gate.py simulates it);
* ``bootstrap`` (auto otherwise): a paired percentile bootstrap that resamples
  examples, so the correlation between the two models' scores is kept.

Both are deterministic: the bootstrap draws from ``numpy.random.default_rng(seed)``.

With ``gate_on = "interval"`` (the default) an eval passes only when the whole
interval lies within its threshold; a point estimate within the threshold whose
interval crosses it is reported as undecided (and fails), with the number of
examples that would likely decide it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from statistics import NormalDist

import numpy as np

BOOTSTRAP = 2000
METHODS = ("auto", "bootstrap", "score")


class NotPaired(Exception):
    """Baseline and candidate scores that share example ids but not what was scored: no paired difference exists."""


def read_scores(path: Path) -> dict[str, dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {str(r["id"]): r for r in rows}


def paired(baseline: dict[str, dict], candidate: dict[str, dict]) -> list[str]:
    ids = [i for i in baseline if i in candidate]
    return sorted(ids)


def perplexity_stat(b_nll, b_tok, c_nll, c_tok) -> float:
    return math.exp(c_nll.sum() / c_tok.sum() - b_nll.sum() / b_tok.sum()) - 1.0


def compare(metric: str, baseline: dict[str, dict], candidate: dict[str, dict], confidence: float, seed: int = 0,
            method: str = "auto") -> dict:
    """Point estimate and interval of the paired statistic."""
    if method not in METHODS:
        raise ValueError(f"unknown interval method {method!r}; use one of {', '.join(METHODS)}")
    ids = paired(baseline, candidate)
    n = len(ids)
    unpaired = {"baseline_only": len(baseline) - n, "candidate_only": len(candidate) - n}
    if n == 0:
        return {"metric": metric, "n": 0, "delta": None, "ci": [None, None], "unpaired": unpaired}
    if metric == "perplexity":
        if method == "score":
            raise ValueError("the score interval needs 0/1 scores; perplexity's interval is the bootstrap")
        out = _perplexity(baseline, candidate, ids, confidence, seed)
    else:
        b = np.array([float(baseline[i]["score"]) for i in ids])
        c = np.array([float(candidate[i]["score"]) for i in ids])
        out = paired_difference(b, c, confidence, seed, method)
    return {"metric": metric, "n": n, **out, "unpaired": unpaired}


def paired_difference(b: np.ndarray, c: np.ndarray, confidence: float, seed: int = 0, method: str = "auto") -> dict:
    """Mean of ``c - b`` with its interval; the score interval when both are 0/1 (or asked for)."""
    binary = bool(np.isin(b, (0.0, 1.0)).all() and np.isin(c, (0.0, 1.0)).all())
    if method == "score" and not binary:
        raise ValueError("the score interval needs 0/1 scores")
    diff = c - b
    out = {"baseline": float(b.mean()), "candidate": float(c.mean()), "delta": float(diff.mean())}
    if binary and method in ("auto", "score"):
        better, worse = int(((c == 1) & (b == 0)).sum()), int(((c == 0) & (b == 1)).sum())
        lo, hi = score_interval(better, worse, len(b), confidence)
        half = NormalDist().inv_cdf(0.5 + confidence / 2)
        return dict(out, ci=[lo, hi], se=(hi - lo) / (2 * half), method="score",
                    discordant={"candidate_better": better, "candidate_worse": worse})
    boot = bootstrap(lambda d: diff[d].mean(1), len(diff), seed)
    return dict(out, ci=percentile_ci(boot, confidence), se=float(boot.std(ddof=1)), method="bootstrap")


def _perplexity(baseline, candidate, ids, confidence, seed) -> dict:
    arrays = [np.array([float(src[i][k]) for i in ids]) for src in (baseline, candidate) for k in ("nll", "tokens")]
    b_nll, b_tok, c_nll, c_tok = arrays
    if (b_tok != c_tok).any():  # the same windows, scored on different tokens: not a paired comparison
        first = ids[int(np.argmax(b_tok != c_tok))]
        raise NotPaired(f"baseline and candidate scored different tokens in the same window ({first}: "
                         f"{int(baseline[first]['tokens'])} against {int(candidate[first]['tokens'])}): their "
                         "tokenizers differ, or only one of them puts a BOS before each window")
    boot = bootstrap(lambda d: np.exp(c_nll[d].sum(1) / c_tok[d].sum(1) - b_nll[d].sum(1) / b_tok[d].sum(1)) - 1.0,
                     len(ids), seed)
    return {"baseline": math.exp(b_nll.sum() / b_tok.sum()), "candidate": math.exp(c_nll.sum() / c_tok.sum()),
            "delta": perplexity_stat(b_nll, b_tok, c_nll, c_tok), "ci": percentile_ci(boot, confidence),
            "se": float(boot.std(ddof=1)), "method": "bootstrap"}


def bootstrap(stat, n: int, seed: int) -> np.ndarray:
    """``stat`` over BOOTSTRAP resamples of n examples; ``stat`` gets an index array of shape (BOOTSTRAP, n)."""
    draws = np.random.default_rng(seed).integers(0, n, size=(BOOTSTRAP, n))
    return stat(draws)


def percentile_ci(boot: np.ndarray, confidence: float) -> list[float]:
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(boot, [alpha, 1 - alpha])
    return [float(lo), float(hi)]


def score_interval(better: int, worse: int, n: int, confidence: float) -> tuple[float, float]:
    """Tango's score interval for P(candidate right, baseline wrong) - P(candidate wrong, baseline right).

    ``better``/``worse`` count the discordant pairs, ``n`` all pairs. The bounds are
    the differences d at which the score statistic equals +-z, found by bisection."""
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    point = (better - worse) / n
    lo = _solve(lambda d: _score_stat(d, better, worse, n) - z, -1.0, point)
    hi = _solve(lambda d: _score_stat(d, better, worse, n) + z, point, 1.0)
    return lo, hi


def _score_stat(d: float, x: int, y: int, n: int) -> float:
    """Score statistic of the difference d, with the nuisance parameter at its constrained MLE."""
    if d < 0:  # symmetric: swap the roles of the two kinds of discordant pairs
        return -_score_stat(-d, y, x, n)
    w = -(x + y) + d * (2 * n - x + y)
    p_worse = (-w + math.sqrt(w * w + 8 * n * y * d * (1 - d))) / (4 * n)
    var = n * (2 * p_worse + d - d * d)
    numerator = x - y - n * d
    if var <= 0:
        return math.copysign(math.inf, numerator) if numerator else 0.0
    return numerator / math.sqrt(var)


def _solve(f, lo: float, hi: float) -> float:
    """The root of a decreasing f on [lo, hi]; an end when f does not change sign there."""
    if f(lo) <= 0:
        return lo
    if f(hi) >= 0:
        return hi
    for _ in range(60):
        mid = (lo + hi) / 2
        if f(mid) > 0:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def judge(item, comparison: dict, higher_is_better: bool) -> dict:
    """Apply an eval's thresholds to its comparison; returns the gate record."""
    out = dict(comparison, name=item.name, kind=item.kind, confidence=item.confidence, gate_on=item.gate_on,
               higher_is_better=higher_is_better)
    if comparison["n"] == 0:
        out.update(verdict="fail", reason="no paired examples: baseline and candidate share no example id")
        return out
    checks = threshold_checks(item, comparison, higher_is_better)
    if not checks:
        out.update(verdict="no-gate", reason="no threshold set")
        return out
    verdict, reasons, undecided = "pass", [], False
    for name, point, worst_value, limit, label in checks:
        if point is None:
            verdict = "fail"
            reasons.append(f"{name}: the baseline is 0, so a relative threshold is undefined")
        elif point > limit + 1e-12:
            verdict = "fail"
            reasons.append(f"{name}: {label} {point:.4g} exceeds {limit:.4g}")
        elif worst_value > limit + 1e-12:
            undecided = True
            if item.gate_on == "interval":
                verdict = "fail"
            reasons.append(f"{name}: {label} {point:.4g} is within {limit:.4g} but the {item.confidence:.0%} "
                           f"interval reaches {worst_value:.4g}; {needed_n(comparison['n'], point, worst_value, limit)}")
        else:
            reasons.append(f"{name}: {label} {point:.4g} within {limit:.4g} (interval bound {worst_value:.4g})")
    out.update(verdict=verdict, undecided=undecided, reason="; ".join(reasons),
               thresholds={name: getattr(item, name) for name, *_ in checks})
    return out


def threshold_checks(item, comparison: dict, higher_is_better: bool) -> list[tuple]:
    """Each threshold as (name, point, worst end of the interval, limit, label), all oriented so
    that larger is worse. Absolute changes are in the metric's units (perplexity points for
    perplexity), relative ones in % of the baseline."""
    b, delta, (lo, hi) = comparison["baseline"], comparison["delta"], comparison["ci"]
    if comparison.get("metric") == "perplexity":  # delta and its interval are relative already
        rel, rel_ci, absolute, abs_ci = delta, (lo, hi), delta * b, (lo * b, hi * b)
    else:
        absolute, abs_ci = delta, (lo, hi)
        rel, rel_ci = (delta / abs(b), (lo / abs(b), hi / abs(b))) if b else (None, (None, None))
    sign = -1.0 if higher_is_better else 1.0  # how much worse the candidate is, per unit of change

    def worse(point, ci, scale=1.0):
        if point is None:
            return None, None
        return sign * point * scale + 0.0, max(sign * ci[0], sign * ci[1]) * scale + 0.0  # + 0.0: no "-0"

    checks = []
    if item.max_drop is not None:
        checks.append(("max_drop", *worse(absolute, abs_ci), item.max_drop, "drop"))
    if item.max_rel_drop_pct is not None:
        checks.append(("max_rel_drop_pct", *worse(rel, rel_ci, 100.0), item.max_rel_drop_pct, "relative drop %"))
    if item.max_increase_pct is not None:
        point, worst = (None, None) if rel is None else (rel * 100, max(rel_ci) * 100)
        checks.append(("max_increase_pct", point, worst, item.max_increase_pct, "increase %"))
    if item.min_recovery is not None:
        # recovery = candidate / baseline (baseline / candidate when lower is better)
        if higher_is_better:
            limit, label = 1 - item.min_recovery, "relative loss (1 - recovery)"
        else:
            limit, label = 1 / item.min_recovery - 1, "relative increase (1 / recovery - 1)"
        checks.append(("min_recovery", *worse(rel, rel_ci), limit, label))
    return checks


def needed_n(n: int, point: float, worst: float, limit: float) -> str:
    """How many examples would likely shrink the interval enough to decide.

    The interval's half-width shrinks as 1/sqrt(n); it must shrink from
    ``worst - point`` to the margin ``limit - point``."""
    half, margin = abs(worst - point), limit - point
    if margin <= 0 or half <= 0:
        return "more examples are needed to decide"
    return f"n={n} is too small to decide; about {math.ceil(n * (half / margin) ** 2)} examples would"
