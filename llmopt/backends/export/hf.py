"""Export: the Hugging Face folder as the last stage wrote it (plain safetensors, or
compressed-tensors / ModelOpt checkpoints from a quantization step). Nothing to convert,
so the planner adds no stage for it; the artifact takes the last model folder.
Needs: nothing.
"""

from __future__ import annotations

from llmopt.model import formats
from llmopt.backends.base import ExportBackend, Options, PlanContext, StageContext
from llmopt.store.cache import copy_tree
from llmopt.errors import Problem
from llmopt.registry import register


class HFExportOptions(Options):
    pass


@register("export", "hf")
class HFExport(ExportBackend):
    Options = HFExportOptions
    requires = ()

    def produces(self, options: HFExportOptions) -> formats.Format:
        return formats.AS_INPUT

    def check(self, options: HFExportOptions, ctx: PlanContext) -> list[Problem]:
        return []

    def run(self, options: HFExportOptions, ctx: StageContext) -> dict:
        copy_tree(ctx.model_dir, ctx.out_dir / "model")
        return {"format": "hf", "model_dir": "model"}
