"""Eval: multiple choice, scored by the log-likelihood of each choice.

Each example ``{id, question, choices, answer}`` (``answer``: the index of the
right choice, or its text) becomes one context (``prompt`` filled with the
question, optionally after ``few_shot`` solved examples and inside the model's
chat template) and one continuation per choice. The model's pick is the choice
whose continuation has the highest log-likelihood given the context:

* ``acc``: highest total log-likelihood;
* ``acc_norm``: highest log-likelihood per character of the continuation
  (length-normalised by characters, not tokens, so that the figure does not
  depend on the tokenizer).

``scores.jsonl`` holds one row per example with ``score`` (0/1, of the metric
chosen by ``metric``), both picks and every choice's log-likelihood.
Needs: a runtime with ``nll`` (transformers in-process, or an endpoint that
echoes prompt log-probabilities). In process, a question's choices share passes over its context
(``continuation_nll``): on transformers the context once, its key/value cache continued by each choice (about
half the time of each context + choice whole); on ONNX Runtime a choice of one token read from another's pass
(a third less).
"""

from __future__ import annotations

import random
from typing import Literal

from pydantic import Field

from llmopt import data as datasets
from llmopt.scoring import evalkit
from llmopt.backends.base import EvalBackend, Options, PlanContext, StageContext
from llmopt.errors import Problem, StageFailed
from llmopt.registry import register

LABELS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


class MultipleChoiceOptions(Options):
    data: str = Field("builtin:mc", description="JSONL examples {id, question, choices, answer}: builtin:mc (200 shipped) or a local file.")
    metric: Literal["acc", "acc_norm"] = Field("acc", description="Metric the gate uses: acc (total log-likelihood) or acc_norm (per character).")
    limit: int | None = Field(None, ge=1, description="Score only the first this many examples (None: all).")
    prompt: str = Field("Question: {question}\nAnswer:", description="Context template: {question}, and {choices} for the choices listed as 'A. ...' lines.")
    continuation: str = Field(" {choice}", description="Continuation template scored for each choice: {choice} (its text) and {label} (A, B, ...).")
    chat_template: bool = Field(False, description="Put the prompt in the tokenizer's chat template as a user turn; the continuation is the reply.")
    few_shot: int = Field(0, ge=0, le=16, description="Solved examples before each question, drawn from the other examples (seeded).")
    seed: int = Field(0, description="Seed for drawing few-shot examples.")
    bos: evalkit.Bos = Field("tokenizer", description=evalkit.BOS_HELP)
    batch_size: int = Field(16, ge=1, description="Sequences per forward pass (or concurrent requests to an endpoint).")
    runtime: evalkit.Runtime = Field("auto", description=evalkit.RUNTIME_HELP)
    endpoint: str | None = Field(None, description=evalkit.ENDPOINT_HELP)
    endpoint_model: str | None = Field(None, description=evalkit.ENDPOINT_MODEL_HELP)


def answer_index(item: dict) -> int:
    answer, choices = item["answer"], item["choices"]
    if isinstance(answer, int) and not isinstance(answer, bool) and 0 <= answer < len(choices):
        return answer
    if isinstance(answer, str) and answer in choices:
        return choices.index(answer)
    if isinstance(answer, str) and len(answer) == 1 and answer in LABELS[: len(choices)]:
        return LABELS.index(answer)
    raise StageFailed(f"example {item['id']}: answer {answer!r} is neither a choice index, a choice's text nor its label",
                      fix="give answer as the 0-based index of the right choice")


def question_text(template: str, item: dict) -> str:
    listed = "\n".join(f"{LABELS[i]}. {c}" for i, c in enumerate(item["choices"]))
    return template.format(question=item["question"], choices=listed)


def choice_text(template: str, item: dict, index: int) -> str:
    return template.format(choice=item["choices"][index], label=LABELS[index])


def context_of(options: MultipleChoiceOptions, item: dict, pool: list[dict]) -> str:
    """The prompt for ``item``: ``few_shot`` solved examples from ``pool`` (never the item), then its question."""
    shots = ""
    if options.few_shot:
        others = [p for p in pool if p["id"] != item["id"]]
        picked = random.Random(f"{options.seed}:{item['id']}").sample(others, min(options.few_shot, len(others)))
        shots = "".join(question_text(options.prompt, p) + choice_text(options.continuation, p, answer_index(p)) + "\n\n"
                        for p in picked)
    return shots + question_text(options.prompt, item)


def split_pair(model, context: str, continuation: str, chat_tokenizer=None, bos: evalkit.Bos = "tokenizer"
               ) -> tuple[list[int], int]:
    """Token ids of context + continuation, and how many trailing ones are the continuation.

    Trailing spaces of the context move to the continuation, and the whole text is
    tokenized at once, so that the continuation's tokens are those the model would
    see in running text."""
    spaces = len(context) - len(context.rstrip(" "))
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = evalkit.encode_prompt(model, context + continuation, chat_tokenizer, bos)
    prefix = evalkit.encode_prompt(model, context, chat_tokenizer, bos)
    n = len(whole) - len(prefix)
    if n < 1 or len(prefix) < 1:
        raise StageFailed(f"a continuation {continuation!r} has no tokens of its own", fix="check the continuation template")
    return whole, n


@register("eval", "multiple_choice")
class MultipleChoice(EvalBackend):
    Options = MultipleChoiceOptions
    requires = ("torch", "transformers")
    version = 2  # 2: an ONNX model's prompts start with the BOS its tokenizer files ask for, as the baseline's do

    def check(self, options: MultipleChoiceOptions, ctx: PlanContext) -> list[Problem]:
        problems = evalkit.check_runtime(options, ctx)
        problem = datasets.check_spec(options.data, ctx.recipe.path.parent)
        if problem:
            problems.append(ctx.problem(problem, "data"))
        if "{question}" not in options.prompt:
            problems.append(ctx.problem("prompt has no {question} placeholder", "prompt"))
        if "{choice}" not in options.continuation and "{label}" not in options.continuation:
            problems.append(ctx.problem("continuation has neither {choice} nor {label}", "continuation"))
        return problems

    def run(self, options: MultipleChoiceOptions, ctx: StageContext) -> dict:
        items = evalkit.load_items(options.data, ctx.recipe.path.parent, ("question", "choices", "answer"), None, ctx.name)
        pool, items = items, items[: options.limit] if options.limit else items
        model = evalkit.open_model(ctx, options)
        tokenizer = evalkit.tokenizer_of(model, ctx.model_dir) if options.chat_template else None
        requests = build_requests(model, options, items, pool, tokenizer)
        loglik = score_requests(model, requests, options.batch_size, ctx.progress)
        chars = {(r[0], r[1]): r[4] for r in requests}
        rows = []
        for i, item in enumerate(items):
            choices = range(len(item["choices"]))
            rows.append(example_row(item, [loglik[i, j] for j in choices], [chars[i, j] for j in choices], options.metric))
        evalkit.write_scores(ctx.out_dir, rows)
        return {
            "metric": options.metric,
            "value": evalkit.mean(r["score"] for r in rows),
            "higher_is_better": True,
            "n": len(rows),
            "acc": evalkit.mean(r["acc"] for r in rows),
            "acc_norm": evalkit.mean(r["acc_norm"] for r in rows),
            "normalisation": "characters",
            "chance": evalkit.mean(1 / len(item["choices"]) for item in items),
            "runtime": model.name,
            "scores": "scores.jsonl",
        }


def build_requests(model, options: MultipleChoiceOptions, items: list[dict], pool: list[dict],
                   chat_tokenizer=None) -> list[tuple]:
    """One request per choice of each item: (item index, choice index, token ids, continuation tokens,
    continuation characters); ``pool``: the examples few-shot ones are drawn from."""
    requests = []
    for i, item in enumerate(items):
        context = context_of(options, item, pool)
        if chat_tokenizer is not None:
            context = evalkit.chat_text(chat_tokenizer, context)
        for j in range(len(item["choices"])):
            continuation = choice_text(options.continuation, item, j)
            ids, n = split_pair(model, context, continuation, chat_tokenizer, options.bos)
            requests.append((i, j, ids, n, len(continuation.strip()) or 1))
    return requests


def score_requests(model, requests: list[tuple], batch_size: int, progress) -> dict[tuple[int, int], float]:
    """Log-likelihood of each request's continuation, batched by length to waste little padding: the choices
    of a question after one pass over their context where the runtime can (``continuation_nll``), else each
    context + choice whole."""
    if hasattr(model, "continuation_nll"):
        return score_by_context(model, requests, batch_size, progress)
    order = sorted(range(len(requests)), key=lambda k: len(requests[k][2]))
    out = {}
    for start in range(0, len(order), batch_size):
        batch = [requests[k] for k in order[start : start + batch_size]]
        progress(f"sequence {start + len(batch)}/{len(requests)}")
        for (i, j, _, _, _), nll in zip(batch, model.nll([r[2] for r in batch], [r[3] for r in batch])):
            out[(i, j)] = -nll
    return out


def score_by_context(model, requests: list[tuple], batch_size: int, progress) -> dict[tuple[int, int], float]:
    """``score_requests`` through ``continuation_nll``: the requests grouped by their context's tokens (a
    question's choices, unless a choice's first token merged with the end of the context), ``batch_size``
    contexts a pass."""
    groups: dict[tuple, list[tuple]] = {}
    for request in requests:
        i, _, ids, n = request[:4]
        groups.setdefault((i, tuple(ids[:-n])), []).append(request)
    ordered = sorted(groups.items(), key=lambda item: len(item[0][1]))
    out = {}
    for start in range(0, len(ordered), batch_size):
        batch = ordered[start : start + batch_size]
        progress(f"question {start + len(batch)}/{len(ordered)}")
        scored = model.continuation_nll([(list(context), [r[2][-r[3]:] for r in members])
                                         for (_, context), members in batch])
        for (_, members), nlls in zip(batch, scored):
            for (i, j, *_), nll in zip(members, nlls):
                out[(i, j)] = -nll
    return out


def example_row(item: dict, loglik: list[float], chars: list[int], metric: str) -> dict:
    answer = answer_index(item)
    pred = max(range(len(loglik)), key=lambda j: loglik[j])
    pred_norm = max(range(len(loglik)), key=lambda j: loglik[j] / chars[j])
    acc, acc_norm = int(pred == answer), int(pred_norm == answer)
    return {"id": item["id"], "score": acc if metric == "acc" else acc_norm, "acc": acc, "acc_norm": acc_norm,
            "pred": pred, "pred_norm": pred_norm, "answer": answer, "loglik": [round(x, 5) for x in loglik]}
