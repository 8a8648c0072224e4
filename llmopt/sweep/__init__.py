"""``llmopt sweep``: many variants of one recipe on one shared cache, judged by the same gates.

``variants`` expands the axes and plans every variant with the one planner; ``execute`` runs
them with the one runner (in this process, in ``--jobs N`` processes, or as Ray tasks through
``ray_executor``), a variant never building a stage another running variant builds;
``report`` reads each variant's artifact into one table, the Pareto front and the chosen
variant; ``plots`` draws accuracy against size; ``run`` ties them together.
"""

from llmopt.sweep.run import SweepResult, VariantsFailed, run_sweep
from llmopt.sweep.variants import SweepPlan, Variant, parse_axis, plan_sweep

__all__ = ["SweepPlan", "SweepResult", "Variant", "VariantsFailed", "parse_axis", "plan_sweep", "run_sweep"]
