"""The accuracy gate: paired differences between candidate and baseline, with intervals.

Baseline and candidate are scored on the same examples (pairs joined by example
id). The statistic is computed on the pairs and its interval by a paired
bootstrap (resampling examples, so the correlation between the two models'
scores is kept). For perplexity the statistic is the relative increase
``ppl_c / ppl_b - 1`` over token-weighted windows; for other metrics the mean
difference ``mean(c - b)``.

With ``gate_on = "interval"`` (the default) an eval passes only when the whole
interval lies within its threshold; a point estimate within the threshold whose
interval crosses it is reported as undecided, with the number of examples that
would likely decide it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

BOOTSTRAP = 2000


def read_scores(path: Path) -> dict[str, dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {str(r["id"]): r for r in rows}


def paired(baseline: dict[str, dict], candidate: dict[str, dict]) -> list[str]:
    ids = [i for i in baseline if i in candidate]
    return sorted(ids)


def perplexity_stat(b_nll, b_tok, c_nll, c_tok) -> float:
    return math.exp(c_nll.sum() / c_tok.sum() - b_nll.sum() / b_tok.sum()) - 1.0


def compare(metric: str, baseline: dict[str, dict], candidate: dict[str, dict], confidence: float, seed: int = 0) -> dict:
    """Point estimate and bootstrap interval of the paired statistic."""
    ids = paired(baseline, candidate)
    n = len(ids)
    if n == 0:
        return {"metric": metric, "n": 0, "delta": None, "ci": [None, None]}
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n, size=(BOOTSTRAP, n))
    alpha = (1 - confidence) / 2
    if metric == "perplexity":
        arrays = [np.array([float(src[i][k]) for i in ids]) for src in (baseline, candidate) for k in ("nll", "tokens")]
        b_nll, b_tok, c_nll, c_tok = arrays
        point = perplexity_stat(b_nll, b_tok, c_nll, c_tok)
        boot = np.exp(c_nll[draws].sum(1) / c_tok[draws].sum(1) - b_nll[draws].sum(1) / b_tok[draws].sum(1)) - 1.0
        b_value = math.exp(b_nll.sum() / b_tok.sum())
        c_value = math.exp(c_nll.sum() / c_tok.sum())
    else:
        b = np.array([float(baseline[i]["score"]) for i in ids])
        c = np.array([float(candidate[i]["score"]) for i in ids])
        diff = c - b
        point = float(diff.mean())
        boot = diff[draws].mean(1)
        b_value, c_value = float(b.mean()), float(c.mean())
    lo, hi = np.quantile(boot, [alpha, 1 - alpha])
    return {"metric": metric, "n": n, "baseline": b_value, "candidate": c_value, "delta": float(point), "ci": [float(lo), float(hi)],
            "se": float(boot.std(ddof=1))}


def judge(item, comparison: dict, higher_is_better: bool) -> dict:
    """Apply an eval's thresholds to its comparison; returns the gate record."""
    out = dict(comparison, name=item.name, kind=item.kind, confidence=item.confidence, gate_on=item.gate_on)
    checks = []
    if comparison["n"] == 0:
        out.update(verdict="fail", reason="no paired examples")
        return out
    b = comparison["baseline"]
    delta, (lo, hi) = comparison["delta"], comparison["ci"]
    # express each threshold as a bound on the statistic, on the "worse" side
    if item.max_increase_pct is not None:
        stat = delta if comparison.get("metric") == "perplexity" else (delta / b if b else 0.0)
        stat_ci = (lo, hi) if comparison.get("metric") == "perplexity" else ((lo / b, hi / b) if b else (0.0, 0.0))
        checks.append(("max_increase_pct", stat * 100, stat_ci[1] * 100, item.max_increase_pct, "increase %"))
    worse = (lambda x: -x) if higher_is_better else (lambda x: x)
    worst = lo if higher_is_better else hi
    if item.max_drop is not None:
        checks.append(("max_drop", worse(delta), worse(worst), item.max_drop, "drop"))
    if item.max_rel_drop_pct is not None and b:
        checks.append(("max_rel_drop_pct", worse(delta) / abs(b) * 100, worse(worst) / abs(b) * 100, item.max_rel_drop_pct, "relative drop %"))
    if item.min_recovery is not None and b:
        # recovery = candidate / baseline; a bound on recovery is a bound on the drop
        bound = (1 - item.min_recovery) * abs(b)
        checks.append(("min_recovery", worse(delta), worse(worst), bound, "drop implied by min_recovery"))
    if not checks:
        out.update(verdict="no-gate", reason="no threshold set")
        return out
    verdict, reasons, undecided = "pass", [], False
    for name, point, worst_value, limit, label in checks:
        point_ok = point <= limit + 1e-12
        interval_ok = worst_value <= limit + 1e-12
        if not point_ok:
            verdict = "fail"
            reasons.append(f"{name}: {label} {point:.4g} exceeds {limit:.4g}")
        elif not interval_ok:
            undecided = True
            if item.gate_on == "interval":
                verdict = "fail"
            reasons.append(f"{name}: {label} {point:.4g} is within {limit:.4g} but the {item.confidence:.0%} "
                           f"interval reaches {worst_value:.4g}; {needed_n(comparison['n'], point, worst_value, limit)}")
        else:
            reasons.append(f"{name}: {label} {point:.4g} within {limit:.4g} (interval bound {worst_value:.4g})")
    out.update(verdict=verdict, undecided=undecided, reason="; ".join(reasons),
               thresholds={name: limit for name, _, _, limit, _ in checks})
    return out


def needed_n(n: int, point: float, worst: float, limit: float) -> str:
    """How many examples would likely shrink the interval enough to decide.

    The interval's half-width shrinks as 1/sqrt(n); it must shrink from
    ``worst - point`` to the margin ``limit - point``."""
    half, margin = abs(worst - point), limit - point
    if margin <= 0 or half <= 0:
        return "more examples are needed to decide"
    return f"n={n} is too small to decide; about {math.ceil(n * (half / margin) ** 2)} examples would"
