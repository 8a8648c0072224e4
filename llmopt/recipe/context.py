"""The plan-time context a backend's ``check`` gets: the recipe, where in it the step is, and the
model's config facts as the steps before leave them; never weights. The size model
(``llmopt.model.estimates``) hands the same context to each step's ``layout``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llmopt.errors import Problem


@dataclass
class PlanContext:
    """What a backend's ``check`` may look at: the recipe and facts, never weights."""

    recipe: Any  # LoadedRecipe
    step: tuple  # ("compress", 0) or ("export",)
    model: Any = None  # ModelInfo of the model entering this stage, or None when unknown
    gpu: Any = None  # catalogue GPU, or None for CPU
    upstream: list[str] = field(default_factory=list)  # stage kinds/methods before this one
    source: Any = None  # ModelInfo of the recipe's source model (a distill step's teacher), or None when unknown

    def where(self, *keys: Any) -> str:
        step = tuple(k for k in self.step if k is not None)
        return self.recipe.where(*step, *keys)

    def problem(self, message: str, *keys: Any, hint: str = "", severity: str = "error") -> Problem:
        return Problem(message, self.where(*keys), hint, severity)
