"""Stage kinds the plan adds that are not a recipe step: the accuracy gate and the deploy configs.

Both are registered as kind "stage" (as the bench and tune stages are, in their own packages) and run
in the plan like every other stage, with a cache key, a folder and a manifest:

* ``gate`` reads the per-example scores of each eval's baseline and candidate stages and
  judges the recipe's thresholds on the pairs (``llmopt.scoring.gate``). Its key hashes the
  thresholds and the eval stages' keys, so a changed threshold re-judges without scoring
  again. The verdicts are its outputs; a failed gate is not a failed stage: the run goes on
  to write the artifact and then exits 3.
* ``deploy`` renders the serve backend's launch configs for the final model into its folder
  (``render(options, ctx)``), which the artifact copies to ``deploy/<engine>/``.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from llmopt import registry

from llmopt.scoring import gate
from llmopt.backends.base import StageContext, StageKind
from llmopt.errors import GateFailed, StageFailed, UsageError
from llmopt.registry import register

GATE_FIELDS = ("name", "kind", "max_drop", "max_rel_drop_pct", "min_recovery", "max_increase_pct", "confidence",
               "gate_on")


class GateSpec(BaseModel):
    """One eval's thresholds, as the recipe's [[eval]] table gives them."""

    model_config = ConfigDict(extra="forbid")
    name: str
    kind: str
    max_drop: float | None = None
    max_rel_drop_pct: float | None = None
    min_recovery: float | None = None
    max_increase_pct: float | None = None
    confidence: float = 0.95
    gate_on: Literal["interval", "point"] = "interval"
    interval: Literal[gate.METHODS] = "auto"  # how the interval is computed (`llmopt gate -s EVAL.interval=...`)
    domain: str | None = None  # the kind of text the eval's data holds, when known


class GateOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gates: list[GateSpec] = Field(default_factory=list)


def gate_options(loaded) -> GateOptions:
    """The gate stage's options from the recipe's [[eval]] tables, with each eval data's domain."""
    from llmopt import data

    specs = []
    for index, item in enumerate(loaded.recipe.eval):
        spec = getattr(loaded.options_for("eval", index), "data", None)
        readable = isinstance(spec, str) and not data.check_spec(spec, loaded.path.parent)
        domain = data.domain(spec, loaded.path.parent) if readable else None
        specs.append(GateSpec(**{k: getattr(item, k) for k in GATE_FIELDS}, domain=domain))
    return GateOptions(gates=specs)


@register("stage", "gate")
class GateStage(StageKind):
    Options = GateOptions

    def run(self, options: GateOptions, ctx: StageContext) -> dict:
        return {"gates": [self.judge(spec, ctx) for spec in options.gates]}

    @staticmethod
    def judge(spec: GateSpec, ctx: StageContext) -> dict:
        b, c = (ctx.input_manifests[f"{spec.name}.{role}"] for role in ("baseline", "candidate"))
        try:
            comparison = gate.compare(
                b["outputs"]["metric"],
                gate.read_scores(ctx.inputs[f"{spec.name}.baseline"] / b["outputs"].get("scores", "scores.jsonl")),
                gate.read_scores(ctx.inputs[f"{spec.name}.candidate"] / c["outputs"].get("scores", "scores.jsonl")),
                spec.confidence, method=spec.interval)
        except gate.NotPaired as exc:
            raise StageFailed(f"gate {spec.name!r}: {exc}", where=ctx.name,
                              fix="score both with the same tokenizer files; report this if they are") from None
        except ValueError as exc:  # an interval method the scores do not suit (`llmopt gate -s EVAL.interval=`)
            raise UsageError(f"gate {spec.name!r}: {exc}", fix="use interval=bootstrap for scores that are not 0/1") from None
        record = gate.judge(spec, comparison, b["outputs"].get("higher_is_better", True))
        record["baseline_stage"], record["candidate_stage"] = b["key"], c["key"]
        record["domain"] = spec.domain
        return record


@register("stage", "deploy")
class DeployStage(StageKind):
    """The serve backend's ``render`` as a stage: reads the final model, writes launch configs."""

    def __init__(self, backend: str):
        super().__init__(backend)
        self.serve = registry.get("serve", backend)()
        self.requires = self.serve.requires

    def run(self, options, ctx: StageContext) -> dict:
        ctx = dataclasses.replace(ctx, recipe=ctx.recipe.for_engine(self.backend))  # one of several: as its own
        return self.serve.render(options, ctx) or {}


def failure(gates: list[dict], where: str, report: str) -> GateFailed | None:
    """The error a run, an eval or a re-judged report raises when a gate failed (exit 3), or None."""
    failed = [g["name"] for g in gates if g["verdict"] == "fail"]
    if not failed:
        return None
    return GateFailed(f"accuracy gate failed: {', '.join(failed)}", where=where,
                      fix=f"see {report}; loosen a threshold only if the drop is acceptable")
