"""Eval: perplexity over text, in fixed windows with a stride.

The text is tokenized once and cut into windows of ``window`` tokens, each
starting ``stride`` tokens after the previous one; a window scores only the
tokens no earlier window scored (all of them for the first), so every token is
scored exactly once with up to ``window - stride`` tokens of context. Where the
model's tokenizer starts every text with a BOS token, every window does: the
text's own BOS begins the first, and the others get one before their first
token, as the model sees any text it is given (Gemma scores 4x worse without
it: a window that starts mid-text is not what it was trained on). The
negative log-likelihood of each window is kept (``scores.jsonl``), so that the
gate can pair baseline and candidate window by window.
Needs: torch and transformers (in-process runtime), or an endpoint that echoes
prompt log-probabilities (runtime = "endpoint").
"""

from __future__ import annotations

import json
import math

from pydantic import Field

from llmopt import data as datasets
from llmopt.scoring import evalkit
from llmopt.backends.base import EvalBackend, Options, PlanContext, StageContext
from llmopt.backends.source import _sanity as sanity
from llmopt.errors import Problem, StageFailed
from llmopt.registry import register


class PerplexityOptions(Options):
    data: str = Field("builtin:prose-eval", description="Text to score: builtin:prose-eval, a .txt/.jsonl/.parquet file, or hf:<dataset>[:<config>]:<split>.")
    text_field: str = Field("text", description="Field holding the text in .jsonl/.parquet/hub data.")
    window: int = Field(256, ge=8, le=131_072, description="Tokens per window.")
    stride: int | None = Field(None, ge=1, description="Tokens between window starts (default: window, i.e. no overlap).")
    max_windows: int | None = Field(64, ge=1, description="Score at most this many windows (None: all).")
    batch_size: int = Field(4, ge=1, description="Windows per forward pass.")
    runtime: evalkit.Runtime = Field("auto", description=evalkit.RUNTIME_HELP)
    endpoint: str | None = Field(None, description=evalkit.ENDPOINT_HELP)
    endpoint_model: str | None = Field(None, description=evalkit.ENDPOINT_MODEL_HELP)


def windows(n_tokens: int, window: int, stride: int, limit: int | None,
            prefixed: bool = False) -> list[tuple[int, int, int]]:
    """(begin, end, scored) triples: the window is tokens[begin:end], and its last ``scored``
    tokens are scored, each predicted from the tokens before it in the window. ``prefixed``: every
    window but the first gets a BOS before it, so its first token is predicted (from the BOS) too."""
    out, prev_end = [], 0
    for begin in range(0, max(n_tokens - 1, 0), stride):
        end = min(begin + window, n_tokens)
        scored = min(end - prev_end, end - begin - (0 if prefixed and begin else 1))
        if scored > 0:
            out.append((begin, end, scored))
        prev_end = end
        if end == n_tokens or (limit is not None and len(out) >= limit):
            break
    return out


@register("eval", "perplexity")
class Perplexity(EvalBackend):
    Options = PerplexityOptions
    requires = ("torch", "transformers")
    version = 2  # 2: a BOS before every window where the tokenizer starts texts with one (in every runtime)

    def check(self, options: PerplexityOptions, ctx: PlanContext) -> list[Problem]:
        problems = evalkit.check_runtime(options, ctx)
        problem = datasets.check_spec(options.data, ctx.recipe.path.parent)
        if problem:
            problems.append(ctx.problem(problem, "data"))
        if options.stride and options.stride > options.window:
            problems.append(ctx.problem(f"stride {options.stride} is larger than window {options.window}; tokens would be skipped", "stride"))
        if ctx.model is not None and ctx.model.max_position and options.window > ctx.model.max_position:
            problems.append(ctx.problem(f"window {options.window} exceeds the model's context of {ctx.model.max_position}", "window"))
        return problems

    def run(self, options: PerplexityOptions, ctx: StageContext) -> dict:
        model = evalkit.open_model(ctx, options)
        texts = datasets.load_texts(options.data, options.text_field, ctx.recipe.path.parent)
        ids = model.encode("\n\n".join(texts))
        bos = ids[:1] if getattr(model, "adds_bos", False) else []  # the text's own BOS, put before each later window
        spans = windows(len(ids), options.window, options.stride or options.window, options.max_windows, bool(bos))
        if not spans:
            raise StageFailed(f"{options.data} has {len(ids)} tokens: nothing to score", where=ctx.name,
                              fix="give more text, or a smaller window")
        rows = []
        for start in range(0, len(spans), options.batch_size):
            batch = spans[start : start + options.batch_size]
            ctx.progress(f"window {start + len(batch)}/{len(spans)}")
            for (begin, end, scored), nll in zip(batch, model.nll([(bos if b else []) + ids[b:e] for b, e, _ in batch],
                                                           [s for *_, s in batch])):
                rows.append({"id": f"w{len(rows):05d}", "begin": begin, "end": end, "tokens": scored, "nll": nll})
        with open(ctx.out_dir / "scores.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        total_nll = sum(r["nll"] for r in rows)
        total_tokens = sum(r["tokens"] for r in rows)
        value = math.exp(total_nll / total_tokens)
        checked = {}
        if ctx.input_manifests.get("model", {}).get("stage") == "source":  # the baseline: the source scored
            vocab = ctx.model.vocab_size if ctx.model is not None else None
            checked = sanity.check_baseline_perplexity(value, ids, vocab, ctx.name)
        return {
            "metric": "perplexity",
            "value": value,
            "higher_is_better": False,
            "n": len(rows),
            "tokens": total_tokens,
            "runtime": model.name,
            "scores": "scores.jsonl",
            **checked,
        }
