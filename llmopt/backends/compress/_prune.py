"""Plain functions the structured-pruning backends share.

Both prune backends load a decoder with ``model.layers[i]`` (width pruning: each
with a dense gated ``mlp``; depth pruning: any, experts included), run the recipe's
calibration rows through it with hooks that gather statistics, shrink the model,
fix its config and save a smaller dense checkpoint with the tokenizer.
Needs: torch, transformers (the ``torch`` extra).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from llmopt.data import calibration
from llmopt.libraries import require
from llmopt.backends.compress import _checks
from llmopt.backends.compress._common import copy_tokenizer_files, widen_on_cpu
from llmopt.errors import Problem, StageFailed

REQUIRES = ("torch", "transformers")
EXTRA = "torch"


def plan_checks(ctx, name: str) -> list[Problem]:
    """Unquantized weights, calibration data and memory (the families it runs on are the family table's:
    ``llmopt.model.families``)."""
    return _checks.not_quantized(ctx) + _checks.calibration_data(ctx) + _checks.calibration_memory(ctx, name)


def load(ctx):
    """Tokenizer, model (recipe dtype, on the stage's device; float32 on a CPU, ``widen_on_cpu``) and calibration
    batches."""
    transformers = require("transformers", EXTRA, ctx.name)
    if ctx.model_format != "hf":
        raise StageFailed(f"{ctx.name} needs a Hugging Face model folder, got format {ctx.model_format!r}",
                          where=ctx.name, fix="put prune steps first")
    trust = ctx.recipe.recipe.model.trust_remote_code
    tokenizer = transformers.AutoTokenizer.from_pretrained(ctx.model_dir, trust_remote_code=trust)
    rows = calibration.load(ctx, tokenizer)
    model = transformers.AutoModelForCausalLM.from_pretrained(ctx.model_dir, dtype=compute_dtype(ctx),
                                                              trust_remote_code=trust)
    model.to(ctx.device).eval()
    if not hasattr(getattr(model, "model", None), "layers"):
        raise StageFailed(f"{ctx.name}: {type(model).__name__} has no model.layers", where=ctx.name,
                          fix="prune Llama/Qwen/Mistral-style decoders only")
    return tokenizer, model, rows, calibration.as_batches(rows, 1, ctx.device)


def compute_dtype(ctx) -> str:
    """The dtype the model is scored and cut in: float32 on a CPU for a 16-bit recipe, else the recipe's."""
    return "float32" if widen_on_cpu(ctx) else ctx.recipe.recipe.model.dtype


def layer_output(output):
    """A decoder layer's hidden states (layers return a tensor or a tuple starting with it)."""
    return output[0] if isinstance(output, (tuple, list)) else output


def layer_input(args, kwargs):
    return args[0] if args else kwargs["hidden_states"]


@contextlib.contextmanager
def hooks(handles: list):
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def forward_all(model, batches, progress=None) -> None:
    """Run every calibration batch through the model (no gradients, no logits kept)."""
    torch = require("torch", EXTRA, "pruning")
    with torch.inference_mode():
        for index, batch in enumerate(batches):
            if progress:
                progress(f"calibration batch {index + 1}/{len(batches)}")
            model.model(input_ids=batch, use_cache=False)


def save(ctx, model, tokenizer) -> Path:
    """The pruned model, in the recipe's dtype, and its tokenizer under ``<stage>/model``."""
    out = ctx.out_dir / "model"
    if widen_on_cpu(ctx):
        model.to(getattr(require("torch", EXTRA, ctx.name), ctx.recipe.recipe.model.dtype))
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    copy_tokenizer_files(ctx.model_dir, out)
    return out


def config_of(out: Path) -> dict:
    return json.loads((out / "config.json").read_text())


def param_count(model) -> int:
    return sum(p.numel() for p in model.parameters())
