"""Compress: knowledge distillation, the source model teaching the model the earlier steps left.

The student is the model as the previous ``[[compress]]`` steps left it (a depth- or
width-pruned model); the teacher is the recipe's source model, handed to this stage by the
planner as its second input (``teacher = True``). The student is trained to match the
teacher's next-token distribution: KL divergence of the softened logits at ``temperature``
(scaled by its square, as in Hinton et al.), plus, optionally, a next-token cross-entropy on
the text (``ce_weight``) and a loss on the hidden states of matched layers
(``hidden_weight``: student layer j against the teacher layer at the same relative depth).
The text is the recipe's ``[calibration]`` data, or ``data`` of its own, cut into rows of
``seq_len`` tokens in the calibration section's seeded order.

Training is transformers' ``Trainer`` with the loss above: gradient accumulation, the
learning-rate schedule, bf16 on a GPU, checkpoints and resume are the library's. With
``data_parallel`` above 1, torchrun starts that many processes (``_distill_worker``) and Trainer
trains the student as DistributedDataParallel across them (NCCL on GPUs, gloo on the CPU). Its
checkpoints go to the stage key's working folder under the cache (``StageContext.work_dir``),
which outlives a ``kill -9`` of llmopt: the next run of the same recipe resumes from the last
complete checkpoint, and the folder is removed once the stage is in the cache.
Needs: torch, transformers, accelerate (the core ``torch`` extra); matplotlib (the ``plots``
or ``bench`` extra) for the loss curve, else the curve is only ``training/loss.json``.
Produces: ``model/`` (safetensors in the recipe's dtype, tokenizer); ``training/loss.json``
(and ``training/loss.png``); outputs give the first and last loss, steps, tokens, the step it
resumed from and the seconds spent.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from llmopt.model import formats
from llmopt.backends.base import CompressBackend, Options, PlanContext, StageContext
from llmopt.backends.compress import _checks, _distill, _prune
from llmopt.backends.compress._common import folder_bytes
from llmopt.errors import Problem
from llmopt.registry import register


class DistillOptions(Options):
    steps: int = Field(100, ge=1, description="Optimizer steps to train for.")
    batch_size: int = Field(4, ge=1, description="Rows of seq_len tokens per forward pass (per device).")
    gradient_accumulation: int = Field(1, ge=1, description="Forward passes per optimizer step; the effective batch "
                                       "is batch_size x gradient_accumulation rows.")
    seq_len: int = Field(256, ge=8, description="Tokens per training row.")
    learning_rate: float = Field(1e-4, gt=0, description="Peak learning rate of AdamW.")
    schedule: Literal["cosine", "linear", "constant", "constant_with_warmup"] = Field(
        "cosine", description="Learning-rate schedule after the warm-up (transformers' lr_scheduler_type).")
    warmup_steps: int = Field(0, ge=0, description="Steps of linear warm-up from 0 to learning_rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    temperature: float = Field(2.0, gt=0, description="Softmax temperature of the logit KL; the loss is scaled by "
                               "its square so its gradients keep their size.")
    ce_weight: float = Field(0.0, ge=0, description="Weight of the next-token cross-entropy on the text, added to "
                             "the KL (0: the teacher's distribution alone).")
    hidden_weight: float = Field(0.0, ge=0, description="Weight of the hidden-state loss (normalized MSE between "
                                 "each student layer's output and the teacher layer at the same relative depth); "
                                 "needs equal hidden sizes.")
    data: str | None = Field(None, description="Training text of its own (builtin:NAME, a local .txt/.jsonl/.parquet "
                             "or hf:<dataset>[:<config>]:<split>); default: the recipe's [calibration] data.")
    text_field: str = Field("text", description="The text field of data's records (.jsonl / .parquet / hub data).")
    checkpoint_every: int = Field(50, ge=1, description="Steps between checkpoints in the stage's working folder "
                                  "under the cache; a killed run resumes from the last one.")
    bf16: bool | None = Field(None, description="Mixed precision in bfloat16; default: on a GPU yes, on the CPU no "
                              "(float32 there).")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in the backward pass: less "
                                         "memory, about a third more time.")
    seed: int = Field(0, description="Seed of the data order and of training.")
    data_parallel: int = Field(1, ge=1, le=64, description="Processes of data-parallel training, started by "
                               "torchrun: one per GPU of the compute machine (at most [compute] count), or on the "
                               "CPU processes that share its cores. Each holds teacher and student whole; the "
                               "effective batch is batch_size x gradient_accumulation x data_parallel rows.")


@register("compress", "distill")
class Distill(CompressBackend):
    Options = DistillOptions
    requires = ("torch", "transformers", "accelerate")
    extra = _prune.EXTRA
    calibrates = True  # reads [calibration] (its data, or only its seed and chat template with data of its own)
    teacher = True  # the planner hands it the source stage as the input "teacher"
    keyless_defaults = {"data_parallel": 1}  # one process trains as before the option existed: same stage key

    def produces(self, options: DistillOptions) -> formats.Format:
        return formats.DENSE

    def check(self, options: DistillOptions, ctx: PlanContext) -> list[Problem]:
        problems = _checks.not_quantized(ctx) + _distill.order_problems(ctx)
        problems += _distill.data_problems(options, ctx)
        teacher = ctx.source  # the source model's config facts
        problems += _distill.teacher_problems(options, ctx, teacher) + _distill.parallel_problems(options, ctx)
        return problems + _distill.memory_problems(options, ctx, teacher)

    def run(self, options: DistillOptions, ctx: StageContext) -> dict:
        trained = _distill.train(options, ctx)
        out = _prune.save(ctx, trained.model.to(_distill.save_dtype(ctx)), trained.tokenizer)
        return {"format": "hf", "model_dir": "model", "model_bytes": folder_bytes(out),
                "training": trained.summary(), "data": trained.rows.summary()}
