"""Plain helpers shared by the eval backends: which runtime scores the model,
example sets, chat templates, and the per-example scores file the gate reads.

Every eval stage writes ``scores.jsonl`` with one row per example and an ``id``
that is the same for baseline and candidate; the gate pairs rows by it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Literal

from llmopt import data as datasets
from llmopt import runtimes
from llmopt.errors import Problem, StageFailed

Runtime = Literal["auto", "transformers", "endpoint", "onnxruntime"]
RUNTIME_HELP = ("Where the model runs: auto picks by the model's format; endpoint scores it through the "
                "OpenAI-compatible server at `endpoint` (as it is served).")
Bos = Literal["tokenizer", "always", "never"]
BOS_HELP = ("Whether a BOS token starts each prompt: tokenizer (where the model's tokenizer puts one when it "
            "encodes text, as lm-eval and vLLM do: SmolLM2's and GPT-2's do not, Llama's do), always, or never.")
ENDPOINT_HELP = "URL of an OpenAI-compatible server (http://host:port/v1), for runtime = \"endpoint\"."
ENDPOINT_MODEL_HELP = "Model name to request from the endpoint (default: the first one its /v1/models lists)."


# what an eval kind needs of an endpoint (llmopt.runtimes.endpoint.probe); other kinds: that it answers
ENDPOINT_NEEDS = {"perplexity": {"loglikelihood"}, "multiple_choice": {"loglikelihood"}, "generation": {"generation"}}
LM_EVAL_NEEDS = {"loglikelihood": "loglikelihood", "multiple_choice": "loglikelihood",
                 "loglikelihood_rolling": "loglikelihood", "generate_until": "generation"}


def check_runtime(options, ctx) -> list[Problem]:
    """Plan-time problems of the runtime / endpoint options. An endpoint is asked, before anything
    runs, whether it answers and can do what the eval needs (``endpoint.probe``)."""
    problems = []
    endpoint = getattr(options, "endpoint", None)
    if options.runtime == "endpoint" and not endpoint:
        problems.append(ctx.problem("runtime = \"endpoint\" needs an endpoint URL", "endpoint",
                                    hint="set endpoint = \"http://127.0.0.1:8000/v1\""))
    if endpoint and not endpoint.startswith(("http://", "https://")):
        problems.append(ctx.problem(f"endpoint must be an http:// or https:// URL (got {endpoint!r})", "endpoint"))
    if endpoint and options.runtime != "endpoint":
        problems.append(ctx.problem("endpoint is set but runtime is not \"endpoint\"; the URL is ignored", "endpoint",
                                    severity="warning", hint="set runtime = \"endpoint\" to score the served model"))
    if options.runtime == "endpoint" and endpoint and endpoint.startswith(("http://", "https://")):
        from llmopt.runtimes.endpoint import probe

        for message, fix in probe(endpoint, endpoint_needs(options, ctx), options.endpoint_model):
            problems.append(ctx.problem(message, "endpoint", hint=fix))
    return problems


def endpoint_needs(options, ctx) -> set[str]:
    """What the eval at ``ctx.step`` asks of an endpoint: log-likelihoods, generation or chat."""
    step = tuple(ctx.step)
    kind = ctx.recipe.recipe.eval[step[1]].kind if step[:1] == ("eval",) else ""
    if kind == "generation" and getattr(options, "chat_template", False):
        return {"chat"}
    if kind == "lm_eval":
        task = str(getattr(options, "task", ""))
        path = (ctx.recipe.path.parent / task).expanduser()
        if task.endswith((".yaml", ".yml")) and path.is_file():
            found = re.search(r"^output_type:\s*['\"]?(\w+)", path.read_text(encoding="utf-8"), re.MULTILINE)
            if found and found.group(1) in LM_EVAL_NEEDS:
                return {LM_EVAL_NEEDS[found.group(1)]}
        return {"answers"}
    return ENDPOINT_NEEDS.get(kind, {"answers"})


def open_model(ctx, options):
    """The runtime that scores the stage's model: in-process, or through the endpoint."""
    if options.runtime != "endpoint":
        return runtimes.load(ctx, options.runtime)
    from llmopt.runtimes.endpoint import EndpointRuntime

    ctx.progress(f"connecting to {options.endpoint}")
    return EndpointRuntime(ctx.model_dir, url=options.endpoint, served_model=options.endpoint_model,
                           trust_remote_code=ctx.recipe.recipe.model.trust_remote_code)


def load_items(spec: str, base: Path, fields: tuple[str, ...], limit: int | None, where: str) -> list[dict]:
    """Records of a JSONL example set with the required fields and unique ids; the first ``limit``."""
    records = datasets.load_records(spec, base)
    items, seen = [], set()
    for number, record in enumerate(records, 1):
        if not isinstance(record, dict):
            raise StageFailed(f"{spec}: record {number} is not a JSON object", where=where)
        missing = [f for f in fields if f not in record]
        if missing:
            raise StageFailed(f"{spec}: record {number} has no {', '.join(missing)}", where=where,
                              fix=f"every record needs: {', '.join(fields)}")
        record = dict(record, id=str(record.get("id", f"{number:05d}")))
        if record["id"] in seen:
            raise StageFailed(f"{spec}: id {record['id']!r} appears twice", where=where,
                              fix="ids pair baseline and candidate examples; make them unique")
        seen.add(record["id"])
        items.append(record)
    if not items:
        raise StageFailed(f"{spec} has no examples", where=where)
    return items[:limit] if limit else items


def tokenizer_of(model, model_dir: Path):
    """The runtime's Hugging Face tokenizer, or one loaded from the model folder."""
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is not None and hasattr(tokenizer, "apply_chat_template"):
        return tokenizer
    from llmopt.libraries import require

    transformers = require("transformers", "core", "chat templates")
    return transformers.AutoTokenizer.from_pretrained(model_dir)


def chat_text(tokenizer, user: str) -> str:
    """``user`` as one user turn in the tokenizer's chat template, ready for the assistant's reply."""
    if not getattr(tokenizer, "chat_template", None):
        raise StageFailed("chat_template = true, but the model's tokenizer has no chat template",
                          fix="set chat_template = false, or use a model folder whose tokenizer_config.json has one")
    return tokenizer.apply_chat_template([{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True)


def encode_prompt(model, text: str, tokenizer=None, bos: Bos = "tokenizer") -> list[int]:
    """Token ids of a prompt: with the BOS token where ``bos`` says (``tokenizer``: where the model's tokenizer
    puts one), never twice when the (chat-formatted) text already starts with it."""
    token = getattr(tokenizer, "bos_token", None) if tokenizer is not None else None
    wanted = model.adds_bos if bos == "tokenizer" else bos == "always"
    return model.encode(text, bos=wanted and not (token and text.startswith(token)))


def write_scores(folder: Path, rows: list[dict]) -> str:
    with open(folder / "scores.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    return "scores.jsonl"


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0
