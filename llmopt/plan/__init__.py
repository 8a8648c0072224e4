"""Turn a recipe into a plan: ordered stages with cache keys, checks and estimates.

One planner for every command: ``llmopt run`` plans the whole pipeline (source,
compress, export, evals, gate, deploy, bench, tune), ``llmopt eval`` a scope of it (the
source, or another baseline, scored alone or against a candidate, and the gate), ``llmopt tune
ARTIFACT`` the tune stage over a finished artifact's model and launch config. The plan
reads config.json (or a GGUF header), never weights, so it is cheap and runs before any
GPU time is spent. By concern:

* ``types``: the ``Stage`` and the ``Plan``;
* ``builder``: ``build_plan``, which appends the stages in order, runs every backend's
  ``check`` and assigns the cache keys;
* ``facts``: the model's config facts, and what is not checked without them;
* ``rules``: the rules that span stages (held-out data, formats handed from step to
  engine, quantize-after-prune, GPUs per node);
* ``estimates``: sizes, the compress placement and the KV cache.
"""

from llmopt.plan.builder import build_artifact_plan, build_gate_plan, build_plan, is_artifact, is_url, resolve_cache
from llmopt.plan.facts import unchecked_without_facts
from llmopt.plan.types import Plan, Stage

__all__ = ["Plan", "Stage", "build_artifact_plan", "build_gate_plan", "build_plan", "is_artifact", "is_url", "resolve_cache", "unchecked_without_facts"]
