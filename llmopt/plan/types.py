"""The plan's stages and the plan itself."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from llmopt import registry
from llmopt.store.cache import Cache
from llmopt.catalog.gpus import GPU
from llmopt.errors import Problem
from llmopt.model.modelinfo import ModelInfo
from llmopt.recipe.load import LoadedRecipe


@dataclass
class Stage:
    name: str
    kind: str  # source | compress | draft | export | eval | gate | deploy | bench | tune | acceptance | pinned | in_place
    backend: str
    step: tuple  # where it is in the recipe: ("compress", 0)
    options: BaseModel
    inputs: dict[str, str] = field(default_factory=dict)  # role -> stage name
    material: dict = field(default_factory=dict)  # what its cache key hashes
    key: str = ""
    role: str = ""  # eval stages: baseline | candidate
    volatile: bool = False  # runs even when cached: scores through an endpoint, or reads such a stage
    pinned: str = ""  # the key of what this stage stands for: a finished cache entry, or an artifact's part (in_place)
    unkeyed: tuple[str, ...] = ()  # options left out of the key (an endpoint's URL, when the server names its model)

    @property
    def impl(self) -> Any:
        """The backend that runs this stage: a recipe step's, or the stage kind's (``registry.stage_kind``)."""
        if self.kind in registry.KINDS:
            return registry.get(self.kind, self.backend)()
        if self.kind == "draft":  # a [[draft]] step is a compress step on the draft's model
            return registry.get("compress", self.backend)()
        return registry.stage_kind(self.kind, self.backend)

    def to_dict(self, cache: Cache) -> dict:
        return {
            "name": self.name,
            "kind": self.kind,
            "backend": self.backend,
            "key": self.key,
            "inputs": self.inputs,
            "cached": cache.has(self.key),
            "options": self.options.model_dump(mode="json"),
        }


@dataclass
class Plan:
    recipe: LoadedRecipe
    stages: list[Stage]
    problems: list[Problem]
    model: ModelInfo | None
    gpu: GPU | None
    estimates: dict
    cache: Cache
    output_dir: Path | None  # the artifact (scope "run"), the reports folder ("eval"), the tune or bench results
    # ("tune", "bench"), the re-judged report ("gate"; None: written nowhere)
    scope: str = "run"  # run: every stage and the artifact; eval: sources, evals and the gate, then reports;
    # tune, bench: a finished artifact's model and launch config (in place) and that stage, then its results;
    # gate: a report's saved scores (in place) and the gate stage, then the re-judged report

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)

    def folder(self, name: str) -> Path:
        """Where the output of stage ``name`` is: its cache entry, or the artifact's folder it stands for."""
        stage = self.stage(name)
        return Path(stage.options.folder) if stage.kind == "in_place" else self.cache.path(stage.key)

    def kind(self, kind: str) -> list[Stage]:
        return [s for s in self.stages if s.kind == kind]

    @property
    def final_model_stage(self) -> Stage:
        return [s for s in self.stages if s.kind in ("source", "compress", "export")][-1]

    def to_dict(self) -> dict:
        return {
            "recipe": {"name": self.recipe.recipe.name, "path": str(self.recipe.path), "sha256": self.recipe.digest},
            "scope": self.scope,
            "stages": [s.to_dict(self.cache) for s in self.stages],
            "checks": [p.to_dict() for p in self.problems],
            "estimates": self.estimates,
            "model": self.model.to_dict() if self.model else None,
            "target": self.gpu.to_dict() if self.gpu else {"device": "cpu"},
            "cache_dir": str(self.cache.root),
            "output_dir": str(self.output_dir),
        }


class Pinned(BaseModel):
    artifact: str


class InPlace(BaseModel):
    """A part of a finished artifact that a stage stands for, read where it is (never run): its folder, and
    the outputs the stage that made it recorded (the model's format; ``model_dir`` is the folder)."""

    folder: str
    outputs: dict = {}

    def manifest(self, stage: "Stage") -> dict:
        """What the runner hands the stages that read it, as it hands a cache entry's manifest."""
        return {"stage": stage.name, "kind": stage.kind, "backend": stage.backend, "key": stage.key,
                "outputs": dict(self.outputs)}
