"""Eval: short-answer generation, scored against the answer and its aliases.

Each example ``{id, prompt, answer, aliases}`` is put in the ``template`` (and,
with ``chat_template``, in the model's chat template as a user turn); the model
answers greedily for at most ``max_new_tokens`` tokens, and the reply is cut at
the first ``stop`` string after its first non-blank character. Matching, after
normalising both sides (``normalize``: case, punctuation, whitespace, and
optionally English articles):

* ``exact_match``: the reply equals the answer or an alias;
* ``contains``: the answer or an alias appears in the reply as whole words;
* ``regex``: the first match of ``pattern`` in the reply (its first group if it
  has one) equals the answer or an alias.

``scores.jsonl`` holds one row per example: ``score`` (0/1) and the reply.
Needs: a runtime with ``generate`` (transformers in-process, or an endpoint;
through an endpoint with ``chat_template`` the server's chat API is used).
"""

from __future__ import annotations

import re
import string
from typing import Literal

from pydantic import Field

from llmopt import data as datasets
from llmopt.scoring import evalkit
from llmopt.backends.base import EvalBackend, Options, PlanContext, StageContext
from llmopt.errors import Problem
from llmopt.registry import register

Normalisation = Literal["case", "punctuation", "whitespace", "articles"]


class GenerationOptions(Options):
    data: str = Field("builtin:qa", description="JSONL examples {id, prompt, answer, aliases}: builtin:qa (150 shipped) or a local file.")
    match: Literal["exact_match", "contains", "regex"] = Field("exact_match", description="How a reply is compared with the answer and its aliases.")
    pattern: str = Field(r"-?\d[\d,]*(?:\.\d+)?", description="match = regex: the pattern whose first match (or first group) is taken as the reply's answer.")
    normalize: list[Normalisation] = Field(["case", "punctuation", "whitespace"], description="What is ignored when comparing: case, punctuation, whitespace, articles (a, an, the).")
    limit: int | None = Field(None, ge=1, description="Score only the first this many examples (None: all).")
    template: str = Field("Question: {prompt}\nAnswer:", description="Prompt template around each example's {prompt}.")
    chat_template: bool = Field(False, description="Put the prompt in the tokenizer's chat template as a user turn.")
    max_new_tokens: int = Field(24, ge=1, le=4096, description="Longest reply generated.")
    stop: list[str] = Field(["\n"], description="The reply is cut at the first of these strings (after its first non-blank character).")
    bos: evalkit.Bos = Field("tokenizer", description=evalkit.BOS_HELP)
    runtime: evalkit.Runtime = Field("auto", description=evalkit.RUNTIME_HELP)
    endpoint: str | None = Field(None, description=evalkit.ENDPOINT_HELP)
    endpoint_model: str | None = Field(None, description=evalkit.ENDPOINT_MODEL_HELP)


ARTICLES = re.compile(r"\b(a|an|the)\b")
PUNCTUATION = str.maketrans({c: " " for c in string.punctuation})


def normalise(text: str, how: list[str]) -> str:
    if "case" in how:
        text = text.lower()
    if "punctuation" in how:
        text = text.translate(PUNCTUATION)
    if "articles" in how:
        text = ARTICLES.sub(" ", text)
    if "whitespace" in how:
        text = " ".join(text.split())
    return text.strip()


def cut(reply: str, stops: list[str]) -> str:
    reply = reply.lstrip()
    ends = [reply.find(s) for s in stops if s and s in reply]
    return reply[: min(ends)] if ends else reply


def extract(reply: str, options: GenerationOptions) -> str:
    """The part of the reply compared with the answers."""
    if options.match != "regex":
        return reply
    found = re.search(options.pattern, reply)
    if found is None:
        return ""
    return found.group(1) if found.groups() else found.group(0)


def is_correct(reply: str, answers: list[str], options: GenerationOptions) -> bool:
    got = normalise(extract(reply, options), options.normalize)
    targets = [normalise(str(a), options.normalize) for a in answers]
    if options.match == "contains":
        return any(t and f" {t} " in f" {got} " for t in targets)
    return bool(got) and got in targets


def generate(model, prompt_ids: list[int], options: GenerationOptions) -> str:
    """Greedy reply; a runtime that streams tokens is stopped as soon as a stop string completes."""
    if not hasattr(model, "stream"):
        return model.decode(model.generate(prompt_ids, options.max_new_tokens))
    new: list[int] = []
    tokens = model.stream(prompt_ids, options.max_new_tokens)
    for token in tokens:
        new.append(token)
        text = model.decode(new).lstrip()
        if any(s and s in text for s in options.stop):
            tokens.close()
            break
    return model.decode(new)


@register("eval", "generation")
class Generation(EvalBackend):
    Options = GenerationOptions
    requires = ("torch", "transformers")
    version = 2  # 2: an ONNX model's prompts start with the BOS its tokenizer files ask for, as the baseline's do

    def check(self, options: GenerationOptions, ctx: PlanContext) -> list[Problem]:
        problems = evalkit.check_runtime(options, ctx)
        problem = datasets.check_spec(options.data, ctx.recipe.path.parent)
        if problem:
            problems.append(ctx.problem(problem, "data"))
        if "{prompt}" not in options.template:
            problems.append(ctx.problem("template has no {prompt} placeholder", "template"))
        if options.match == "regex":
            try:
                re.compile(options.pattern)
            except re.error as exc:
                problems.append(ctx.problem(f"pattern is not a valid regular expression: {exc}", "pattern"))
        return problems

    def run(self, options: GenerationOptions, ctx: StageContext) -> dict:
        items = evalkit.load_items(options.data, ctx.recipe.path.parent, ("prompt", "answer"), options.limit, ctx.name)
        model = evalkit.open_model(ctx, options)
        served_chat = options.chat_template and hasattr(model, "chat")
        tokenizer = evalkit.tokenizer_of(model, ctx.model_dir) if options.chat_template and not served_chat else None
        rows = []
        for number, item in enumerate(items, 1):
            ctx.progress(f"example {number}/{len(items)}")
            text = options.template.format(prompt=item["prompt"])
            if served_chat:
                raw = model.chat(text, options.max_new_tokens)
            else:
                if tokenizer is not None:
                    text = evalkit.chat_text(tokenizer, text)
                raw = generate(model, evalkit.encode_prompt(model, text, tokenizer, options.bos), options)
            reply = cut(raw, options.stop)
            answers = [item["answer"], *(item.get("aliases") or [])]
            rows.append({"id": item["id"], "score": int(is_correct(reply, answers, options)), "reply": reply,
                         "answer": item["answer"]})
        evalkit.write_scores(ctx.out_dir, rows)
        return {
            "metric": options.match,
            "value": evalkit.mean(r["score"] for r in rows),
            "higher_is_better": True,
            "n": len(rows),
            "runtime": model.name,
            "scores": "scores.jsonl",
        }
