"""The search: coordinate descent over an engine's launch parameters, each trial measured on the live engine.

The first trial is the deploy stage's prediction (the default). Then, one parameter at a time, each
of its candidates is tried with the others held at the best setting so far (and what ``follow`` moves
along with it: ONNX Runtime's threads with the number of workers that share the cores); a candidate becomes the
best when its objective beats the best by more than ``MIN_GAIN`` and none of its requests failed.
Passes repeat while they improve, within ``max_trials`` and ``max_minutes``. A grid of three
parameters of three values is 27 trials; coordinate descent finds a separable optimum in 7 and
stops at the budget otherwise (docs/architecture.md says why no search library is used).

The objective is goodput (requests per second meeting every bound of ``[serve].slo``) when the SLO
has a bound, else output tokens per second. Measurements on a shared machine are noisy, so a winner
other than the default is measured again: ``repeats`` rounds of default then winner, alternating, and
its gain is the ratio of the medians over all its measurements; a gain within ``MIN_GAIN`` keeps the
default.

A parameter that must earn its place (``earn``: its name and its "off" value; speculative decoding, which
the recipe turns on but which costs compute a step at high concurrency) is held to the opposite rule too:
when the search (and the confirmation) ends with it on, the same values with it off are measured (from the store
when the search already did), and it stays on only when on beats off by more than ``MIN_GAIN``; off is then the
winner even where it is slower than the default by less than that, and its gain says so. That trial is one beyond
``max_trials`` when the search had not measured it.

Every trial's record is a file of the trial store (``<cache>/tune/<key>/trials/<id>.json``, written
last and renamed into place), named by the hash of its values and its round, so a search killed
half-way resumes without repeating the trials it finished.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from llmopt.errors import LlmoptError

MIN_GAIN = 0.05  # a candidate must beat the best by more than this share to replace it


@dataclass
class Budget:
    max_trials: int
    max_minutes: float | None = None
    repeats: int = 1  # confirmation rounds of default and winner, alternating


class TrialStore:
    """Finished trials under ``root/trials/``: ``<id>.json`` (the record) and ``<id>/`` (the bench files)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        (self.root / "trials").mkdir(parents=True, exist_ok=True)

    def folder(self, trial: str) -> Path:
        return self.root / "trials" / trial

    def get(self, trial: str) -> dict | None:
        path = self.root / "trials" / f"{trial}.json"
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None

    def put(self, trial: str, record: dict) -> None:
        path = self.root / "trials" / f"{trial}.json"
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(record, indent=2) + "\n")
        tmp.replace(path)


def trial_id(values: dict, round_: str) -> str:
    text = json.dumps({"values": values, "round": round_}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# measure(values, out_dir) -> the bench result (bench.json's content); raises on a failed start
Measure = Callable[[dict, Path], dict]


class Search:
    """One search: the grid, how to measure a setting, where trials are kept, and the budget."""

    def __init__(self, grid: dict[str, list], measure: Measure, store: TrialStore, budget: Budget, goodput: bool,
                 say=None, follow=None, earn: dict[str, Any] | None = None):
        self.grid, self.measure, self.store, self.budget, self.goodput = grid, measure, store, budget, goodput
        self.earn = {k: v for k, v in (earn or {}).items() if k in grid}  # parameter -> its "off" value
        self.say = say or (lambda message: None)
        self.follow = follow or (lambda name, values: values)  # what moves along with a parameter (spaces.follow)
        self.trials: list[dict] = []
        self.started = time.monotonic()
        self.stopped = ""

    def out_of_budget(self) -> str:
        searched = sum(t["round"] != "confirm" for t in self.trials)
        if searched >= self.budget.max_trials:
            return f"max_trials ({self.budget.max_trials}) reached"
        minutes = self.budget.max_minutes
        if minutes is not None and time.monotonic() - self.started > 60 * minutes:
            return f"max_minutes ({minutes:g}) reached"
        return ""

    def run(self, values: dict, round_: str = "search", phase: str = "search") -> dict:
        """One trial, from the store when it finished before."""
        trial = trial_id(values, round_)
        record = self.store.get(trial)
        if record is not None:
            record = dict(record, cached=True, phase=phase)
            self.say(f"trial {len(self.trials) + 1} ({label(values)}): from an earlier search, "
                     f"{record['score']:.3g}")
        else:
            record = self.measure_one(trial, values, round_, phase)
            self.store.put(trial, record)
            record = dict(record, cached=False)
        self.trials.append(record)
        return record

    def measure_one(self, trial: str, values: dict, round_: str, phase: str) -> dict:
        self.say(f"trial {len(self.trials) + 1}: {label(values)}")
        t0 = time.monotonic()
        base = {"id": trial, "values": values, "round": round_, "phase": phase, "files": f"trials/{trial}/"}
        try:
            result = self.measure(values, self.store.folder(trial))
        except LlmoptError as exc:
            if getattr(exc, "exit_code", 1) in (4, 130):  # engine missing, interrupted: the search stops
                raise
            return base | {"score": 0.0, "verdict": "failed", "error": exc.what, "simulated": False,
                           "seconds": round(time.monotonic() - t0, 1), "figures": None}
        point = result["points"][0]
        record = base | {"score": self.score(point), "verdict": verdict(point, self.goodput),
                         "simulated": bool(result["target"].get("simulated")),
                         "seconds": round(time.monotonic() - t0, 1), "figures": figures(point)}
        self.say(f"  {self.objective}: {record['score']:.3g} ({record['verdict']})")
        return record

    @property
    def objective(self) -> str:
        return "goodput" if self.goodput else "output_throughput"

    def score(self, point: dict) -> float:
        if self.goodput:
            return float((point.get("goodput") or {}).get("requests_per_s") or 0.0)
        return float(point.get("output_throughput") or 0.0)

    def descend(self) -> tuple[dict, dict]:
        """Coordinate descent from the default; returns (default values, best values)."""
        default = {name: values[0] for name, values in self.grid.items()}
        best, best_score = default, eligible(self.run(default, phase="default"))
        tried = {key_of(default)}
        improved = True
        while improved:
            improved = False
            for name, values in self.grid.items():
                for value in values:
                    candidate = self.follow(name, best | {name: value})
                    if key_of(candidate) in tried:
                        continue
                    self.stopped = self.out_of_budget()
                    if self.stopped:
                        return default, best
                    tried.add(key_of(candidate))
                    score = eligible(self.run(candidate))
                    if score > best_score * (1 + MIN_GAIN):
                        best, best_score, improved = candidate, score, True
        self.stopped = "no candidate left that improves on the best"
        return default, best

    def confirm(self, default: dict, best: dict) -> float | None:
        """Default and winner measured again, alternating; the gain is the ratio of their medians."""
        if best == default:
            return None
        for index in range(self.budget.repeats):
            self.run(default, f"confirm-{index}", "confirm")
            self.run(best, f"confirm-{index}", "confirm")
        return gain(self.trials, default, best)

    def earned(self, best: dict) -> dict:
        """``best``, with each parameter of ``earn`` that is on set off unless on beat off by more than MIN_GAIN."""
        for name, off in self.earn.items():
            if best.get(name) == off:
                continue
            without = best | {name: off}
            mine = [t for t in self.trials if key_of(t["values"]) == key_of(best) and t["round"] == "search"]
            on = eligible(mine[-1]) if mine else eligible(self.run(best))
            found = [t for t in self.trials if key_of(t["values"]) == key_of(without) and t["round"] == "search"]
            off_score = eligible(found[-1] if found else self.run(without, phase="earn"))
            if not on > off_score * (1 + MIN_GAIN):
                self.say(f"{name} {best[name]} did not beat {name} {off} by more than {MIN_GAIN:.0%} "
                         f"({on:.3g} against {off_score:.3g}): off")
                best = without
        return best

    def execute(self) -> dict:
        default, best = self.descend()
        ratio = self.confirm(default, best)
        if ratio is not None and ratio <= 1 + MIN_GAIN:
            self.say(f"the best candidate's gain did not hold when measured again ({ratio:.2f}x): keeping the default")
            best = default
        earned = self.earned(best)
        if earned != best:  # on did not earn its place: off, whatever off's ratio to the default
            best, ratio = earned, gain(self.trials, default, earned)
        return {"objective": self.objective, "default": default, "winner": best,  # gain None: the default scored 0
                "gain": ratio if best != default else 1.0, "stopped": self.stopped,
                # goodput 0 in every trial: nothing met the SLO at this load, so no candidate could be ranked
                "no_trial_met_slo": self.goodput and not any(eligible(t) > 0 for t in self.trials),
                "simulated": any(t.get("simulated") for t in self.trials), "trials": self.trials,
                "space": self.grid, "budget": vars(self.budget), "min_gain": MIN_GAIN,
                "seconds": round(time.monotonic() - self.started, 1)}


def judges_goodput(slo) -> bool:
    """The objective is goodput when ``[serve].slo`` has a bound, else output tokens per second."""
    return any(v is not None for v in slo.model_dump().values())


def gain(trials: list[dict], default: dict, best: dict) -> float | None:
    scores = {key_of(default): [], key_of(best): []}
    for trial in trials:
        if key_of(trial["values"]) in scores:
            scores[key_of(trial["values"])].append(trial["score"])
    base = statistics.median(scores[key_of(default)])
    return statistics.median(scores[key_of(best)]) / base if base else None


def eligible(record: dict) -> float:
    """A trial's score when it may win: no failed request, the server started."""
    return record["score"] if record["verdict"] in ("meets SLO", "misses SLO", "measured") else 0.0


def verdict(point: dict, goodput: bool) -> str:
    if point["requests"]["failed"]:
        return "errors"
    if not goodput:
        return "measured"
    met = point.get("slo_met") or {}
    return "meets SLO" if met and all(met.values()) else "misses SLO"


def figures(point: dict) -> dict:
    from llmopt.bench.stage import point_figures

    return point_figures(point)


def key_of(values: dict) -> str:
    return json.dumps(values, sort_keys=True)


def label(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={'default' if v is None else v}" for k, v in values.items())
