"""How many of a draft model's tokens the served model accepts: the acceptance stage of a recipe with [[draft]].

Speculative decoding with greedy verification accepts a draft's tokens up to its first disagreement with the
target's own greedy choice, then takes the target's token there (the "bonus" token). So with both models in
hand the engine's acceptance can be found without an engine: the target generates each prompt's greedy answer,
the draft reads prompt and answer in one forward pass, and where the draft's next-token choice at a position
equals the answer's token, a draft proposed there would have been accepted. A draft proposes its later tokens
from its own earlier ones, but those matter only while every earlier one was accepted, that is, while they
are the answer's own tokens: so the one pass gives exactly what each step of ``num_tokens`` drafts accepts.
Walking the answer step by step gives vLLM's figures (``llmopt.bench.speculation``): acceptance rate = accepted
/ drafted tokens, mean acceptance length = 1 + accepted / steps, and the acceptance at each draft position.

The prompts are the recipe's text workload (``[serve.workload] dataset``), else ``builtin:continue``; the
target is the model the engine loads (the last [[compress]] step's, before an export). Numerics differ between
this runtime and an engine's kernels, so an engine's figure can differ a little; ``llmopt bench`` reads the
engine's own counters where it serves the draft.
"""

from __future__ import annotations

import json
import time

from pydantic import BaseModel, Field

from llmopt.backends.base import StageContext, StageKind
from llmopt.registry import register

DEFAULT_DATASET = "builtin:continue"


class AcceptanceOptions(BaseModel):
    num_tokens: int = Field(description="Tokens the draft proposes a step ([serve.speculative] num_tokens).")
    dataset: str = Field(description="The prompts: the recipe's text workload, else builtin:continue.")
    prompts: int = Field(8, ge=1, description="Records of the data set measured (the first ones).")
    output_len: int = Field(128, ge=1, description="Greedy tokens the target answers each prompt with.")


def acceptance_options(loaded) -> AcceptanceOptions:
    """The acceptance stage's options from the recipe: its speculative num_tokens and its workload's data set."""
    serve = loaded.recipe.serve
    spec = getattr(serve, "speculative", None)
    workload = getattr(serve, "workload", None)
    dataset = getattr(workload, "dataset", None) or DEFAULT_DATASET
    output_len = min(getattr(workload, "output_len", 128), 128)  # enough steps to count; a CPU answers in seconds
    return AcceptanceOptions(num_tokens=spec.num_tokens if spec is not None else 3, dataset=dataset,
                             output_len=output_len)


def walk(matches: list[bool], num_tokens: int) -> dict:
    """Greedy speculative decoding over one answer whose token ``j`` the draft would have guessed where
    ``matches[j]``: steps taken, tokens drafted and accepted, accepted per draft position."""
    steps = accepted = 0
    per_position = [0] * num_tokens
    at = 0
    while at < len(matches):
        taken = 0
        while taken < num_tokens and at + taken < len(matches) and matches[at + taken]:
            per_position[taken] += 1
            taken += 1
        steps += 1
        accepted += taken
        at += taken + 1  # the accepted drafts and the target's own token after them
    return {"steps": steps, "drafted": steps * num_tokens, "accepted": accepted, "per_position": per_position}


def figures(walks: list[dict], num_tokens: int) -> dict:
    """vLLM's acceptance figures over several answers."""
    steps = sum(w["steps"] for w in walks)
    drafted = sum(w["drafted"] for w in walks)
    accepted = sum(w["accepted"] for w in walks)
    per_position = [sum(w["per_position"][i] for w in walks) for i in range(num_tokens)]
    return {"steps": steps, "drafted_tokens": drafted, "accepted_tokens": accepted,
            "acceptance_rate": round(accepted / drafted, 4) if drafted else None,
            "mean_acceptance_length": round(1 + accepted / steps, 3) if steps else None,
            "per_position": [round(n / steps, 4) for n in per_position] if steps else []}


def prompt_ids(runtime, model_dir, item) -> list[int]:
    """A workload record as the served model reads it: a chat through its template, a plain prompt as text."""
    from llmopt.model.chat import NoChatTemplate, render_chat

    if item.messages is not None:
        try:
            return runtime.encode(render_chat(runtime, model_dir, item.chat()), bos=False)
        except NoChatTemplate:
            pass
    text = item.plain() or item.chat()[-1]["content"]
    return runtime.encode(text, bos=runtime.adds_bos)


@register("stage", "acceptance")
class AcceptanceStage(StageKind):
    """The draft's acceptance by the served model on the workload's prompts (module docstring)."""

    Options = AcceptanceOptions
    requires = ("torch", "transformers")

    def run(self, options: AcceptanceOptions, ctx: StageContext) -> dict:
        from llmopt.bench import dataset as datasets
        from llmopt.model.modelinfo import from_folder
        from llmopt.runtimes.hf import TransformersRuntime

        started = time.monotonic()
        target_dir, draft_dir = ctx.input_model_dir("target"), ctx.input_model_dir("draft")
        device = "cuda" if str(ctx.device).startswith("cuda") else "cpu"
        target = TransformersRuntime(target_dir, device)
        draft = TransformersRuntime(draft_dir, device)
        items = datasets.load(options.dataset, ctx.recipe.path.parent).items[: options.prompts]
        walks, records = [], []
        for index, item in enumerate(items):
            ids = prompt_ids(target, target_dir, item)
            answer = target.generate(ids, options.output_len, target.eos_ids)
            if not answer:
                continue
            guesses = draft.logits(ids + answer)[len(ids) - 1: len(ids) - 1 + len(answer)].argmax(-1).tolist()
            matches = [g == t for g, t in zip(guesses, answer)]
            walks.append(walk(matches, options.num_tokens))
            records.append({"prompt": index, "prompt_tokens": len(ids), "answer_tokens": len(answer),
                            "token_agreement": round(sum(matches) / len(matches), 4), **walks[-1]})
            ctx.progress(f"prompt {index + 1}/{len(items)}")
        if not walks:
            raise RuntimeError(f"the target answered none of {options.dataset}'s first {len(items)} prompts")
        out = figures(walks, options.num_tokens)
        out |= {"dataset": options.dataset, "prompts": len(walks), "num_tokens": options.num_tokens,
                "answer_tokens": sum(r["answer_tokens"] for r in records),
                "token_agreement": round(sum(r["token_agreement"] * r["answer_tokens"] for r in records)
                                         / sum(r["answer_tokens"] for r in records), 4),
                "draft_parameters": from_folder(draft_dir).total_params,
                "target_parameters": from_folder(target_dir).total_params,
                "device": device, "seconds": round(time.monotonic() - started, 1), "file": "acceptance.jsonl"}
        (ctx.out_dir / "acceptance.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        return out
