"""Speculative decoding as one recipe concept: ``[serve.speculative]`` in each engine's own spelling.

A method (ngram, draft_model, eagle, eagle3, mtp), the draft (a hub id or an absolute folder) and the tokens
drafted per step become vLLM's ``speculative-config``, SGLang's ``--speculative-*`` options and TensorRT-LLM's
``speculative_config`` (``vllm_config``, ``sglang_args``, ``trtllm_config``). At plan time (``problems``) a
method the engine version lacks, a draft whose vocabulary differs from the target's and a draft bigger than the
target are errors; the memory model counts the draft's weights and KV cache (``draft_memory``).

A recipe's own draft ([[draft]] steps on the source, which the artifact carries in ``draft/``) is named by the
placeholder ``OWN_DRAFT`` until the launch files fill in where the artifact is (``files.Launch.argv``).

vLLM's older ``[serve]`` keys (``speculative_method``, ``speculative_model``, ``num_speculative_tokens``) still
work: they are read as the section (``of``), with a deprecation warning; both at once is an error.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from llmopt.errors import Problem, UsageError
from llmopt.model import memory
from llmopt.model.modelinfo import DTYPE_BYTES, ModelInfo, from_config, from_folder

DRAFTED = ("draft_model", "eagle", "eagle3")  # the methods that read a draft model
NGRAM_LOOKUP_MAX = 4  # longest n-gram matched unless the recipe says: what llmopt wrote for vLLM before

# Which methods each engine version has, under the engine's own name. None: llmopt has no table of the version.
# vLLM: the SpeculativeMethod literal of vllm/config/speculative.py, read from the 0.26.0 and 0.33.0 wheels
#   (both: ngram, draft_model, suffix, eagle, eagle3, mtp and per-model *_mtp names; 0.26.0 also medusa and
#   mlp_speculator, which 0.33.0 dropped and llmopt does not write).
# SGLang 0.5.23: SpeculativeAlgorithm of sglang/srt/speculative/spec_info.py (EAGLE, EAGLE3, STANDALONE, NGRAM, ...)
#   and its reserved alias NEXTN (spec_registry.py, _RESERVED_ALIASES: read as EAGLE over the target's own
#   next-n layers, the MTP of DeepSeek-V3 and GLM-4.5).
# TensorRT-LLM 1.2.1: the decoding_type of each DecodingBaseConfig subclass in tensorrt_llm/llmapi/llm_args.py,
#   read from the repository's main at commit 0004396 as the field table in llmopt.deploy.flags (NGram,
#   Draft_Target, Eagle, Eagle3, MTP). Its "Eagle" config runs the EAGLE-3 one-model drafter (spec_dec_mode
#   EAGLE3_ONE_MODEL), so an EAGLE-1/2 head has no path in trtllm-serve's PyTorch backend.
METHODS: dict[str, dict[str, dict[str, str]]] = {
    "vllm": {v: {"ngram": "ngram", "draft_model": "draft_model", "eagle": "eagle", "eagle3": "eagle3", "mtp": "mtp"}
             for v in ("0.26.0", "0.33.0")},
    "sglang": {"0.5.23": {"ngram": "NGRAM", "draft_model": "STANDALONE", "eagle": "EAGLE", "eagle3": "EAGLE3",
                          "mtp": "NEXTN"}},
    "trtllm": {"1.2.1": {"ngram": "NGram", "draft_model": "Draft_Target", "eagle3": "Eagle3", "mtp": "MTP"}},
}
WHY_NOT = {
    ("trtllm", "eagle"): "TensorRT-LLM's Eagle decoding type runs the EAGLE-3 one-model drafter "
                         "(tensorrt_llm/llmapi/llm_args.py, EagleDecodingConfig.spec_dec_mode); an EAGLE-1/2 head has "
                         "no path in trtllm-serve's PyTorch backend",
}
LABELS = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM", "ort": "llmopt serve"}
OWN_DRAFT = "{draft}"  # the artifact's draft/ folder, in the launch files' placeholder form
OWN_DRAFT_ENGINES = ("vllm", "sglang")  # whose launch command can name the artifact's draft folder


@dataclass(frozen=True)
class Spec:
    """Speculative decoding as the recipe states it, from [serve.speculative] or vLLM's deprecated keys."""

    method: str
    model: str | None = None
    num_tokens: int = 3
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    key: str = "speculative"  # the [serve] key it came from, for a problem's where

    def to_dict(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None and k != "key"}


def of(serve, options=None) -> Spec | None:
    """The recipe's speculative decoding: [serve.speculative], else vLLM's deprecated keys, else None (off)."""
    section = getattr(serve, "speculative", None) if serve is not None else None
    if section is not None:
        return Spec(section.method, section.model, section.num_tokens, section.prompt_lookup_min,
                    section.prompt_lookup_max)
    method = getattr(options, "speculative_method", None)
    if method is None:
        return None
    return Spec(method, options.speculative_model, options.num_speculative_tokens, key="speculative_method")


def spec_of(recipe, options=None) -> Spec | None:
    """``of`` for a whole recipe: with [[draft]] steps, draft_model's model is the artifact's own draft."""
    spec = of(recipe.serve, options)
    if spec is not None and recipe.draft and spec.method == "draft_model" and spec.model is None:
        return dataclasses.replace(spec, model=OWN_DRAFT)
    return spec


# --- each engine's spelling -----------------------------------------------------------------------------------

def vllm_config(spec: Spec | None) -> dict | None:
    """vLLM's ``speculative-config`` (SpeculativeConfig fields: method, num_speculative_tokens, model,
    prompt_lookup_min / prompt_lookup_max; vllm/config/speculative.py of 0.26.0 and 0.33.0)."""
    if spec is None:
        return None
    out: dict = {"method": spec.method, "num_speculative_tokens": spec.num_tokens}
    if spec.method == "ngram":
        if spec.prompt_lookup_min is not None:
            out["prompt_lookup_min"] = spec.prompt_lookup_min
        out["prompt_lookup_max"] = spec.prompt_lookup_max or NGRAM_LOOKUP_MAX
    if spec.model:
        out["model"] = spec.model
    return out


def sglang_args(spec: Spec | None) -> dict:
    """SGLang 0.5.23's launch_server options (sglang/srt/arg_groups/fields/spec.py): a chain of ``num_tokens``
    drafts (``--speculative-eagle-topk 1``, ``--speculative-num-draft-tokens`` = steps + 1, as its speculative hook
    sets for top-k 1); for NGRAM only the verify window, SGLang derives the rest (``_handle_ngram``). Metrics on:
    /metrics then reports the acceptance the bench reads."""
    if spec is None:
        return {}
    args: dict = {"speculative-algorithm": METHODS["sglang"]["0.5.23"][spec.method]}
    if spec.method != "ngram":
        args |= {"speculative-num-steps": spec.num_tokens, "speculative-eagle-topk": 1}
    args["speculative-num-draft-tokens"] = spec.num_tokens + 1
    if spec.model:
        args["speculative-draft-model-path"] = spec.model
    return args | {"enable-metrics": True}


def trtllm_config(spec: Spec | None) -> dict | None:
    """TensorRT-LLM's ``speculative_config`` (DecodingBaseConfig: decoding_type, max_draft_len, and the draft as
    ``speculative_model_dir``, the older name that main still reads through its alias of speculative_model;
    NGramDecodingConfig.max_matching_ngram_size)."""
    if spec is None:
        return None
    out: dict = {"decoding_type": METHODS["trtllm"]["1.2.1"].get(spec.method, spec.method),
                 "max_draft_len": spec.num_tokens}
    if spec.method == "ngram":
        out["max_matching_ngram_size"] = spec.prompt_lookup_max or NGRAM_LOOKUP_MAX
    if spec.model:
        out["speculative_model_dir"] = spec.model
    return out


# --- plan-time checks -----------------------------------------------------------------------------------------

def problems(spec: Spec | None, engine: str, version: str | None, ctx, options=None) -> list[Problem]:
    """Whether the recipe's speculative decoding can work: the engine version has the method, the draft is
    given where needed, and it shares the target's vocabulary and is smaller than it."""
    section = getattr(ctx.recipe.recipe.serve, "speculative", None)
    found = []
    if section is not None and getattr(options, "speculative_method", None):
        found.append(Problem("speculative decoding is set twice: [serve.speculative] and serve.speculative_method",
                             ctx.where("speculative_method"), "remove speculative_method, speculative_model and "
                             "num_speculative_tokens; [serve.speculative] replaces them"))
    elif spec is not None and spec.key == "speculative_method":
        model = f'model = "{spec.model}", ' if spec.model else ""
        found.append(Problem("serve.speculative_method, speculative_model and num_speculative_tokens are deprecated",
                             ctx.where("speculative_method"), f'write [serve.speculative] method = "{spec.method}", '
                             f"{model}num_tokens = {spec.num_tokens} (the same config for every engine)",
                             severity="warning"))
    own = bool(ctx.recipe.recipe.draft)
    if own and (spec is None or spec.method != "draft_model" or spec.model):
        said = "no [serve.speculative]" if spec is None else (
            f"model = {spec.model!r}" if spec.model and spec.method == "draft_model" else f"method = {spec.method!r}")
        found.append(Problem(f"[[draft]] makes a draft model, but the recipe serves none ({said})",
                             ctx.recipe.where("draft"), '[serve.speculative] method = "draft_model" without model '
                             "serves the draft [[draft]] makes; or remove [[draft]]"))
    if spec is None:
        return found
    where = ctx.where(spec.key) if spec.key != "speculative" else ctx.recipe.where("serve", "speculative")
    found += method_problems(spec, engine, version, where)
    if own and spec.method == "draft_model" and not spec.model and engine not in OWN_DRAFT_ENGINES + ("ort",):
        found.append(Problem(f"{LABELS.get(engine, engine)}'s launch config cannot name the draft [[draft]] makes yet",
                             where, "serve it with vllm or sglang, or give model a draft folder"))
    elif spec.method in DRAFTED and not spec.model and not (own and spec.method == "draft_model"):
        found.append(Problem(f"speculative method {spec.method!r} needs a draft model", where,
                             "set model to the draft's hub id or absolute folder"
                             + (", or make one from the source with [[draft]] steps" if spec.method == "draft_model"
                                else "")))
    elif spec.method not in DRAFTED and spec.model:
        found.append(Problem(f"speculative method {spec.method!r} reads no draft model", where,
                             "leave model out" + (" (mtp drafts with the target's own layers)"
                                                  if spec.method == "mtp" else "")))
    if spec.model and spec.method in DRAFTED:
        found += draft_problems(spec, ctx.model, where)
    return found


def method_problems(spec: Spec, engine: str, version: str | None, where: str) -> list[Problem]:
    label = LABELS.get(engine, engine)
    if engine == "ort":
        return [Problem("llmopt serve (ONNX Runtime) has no speculative decoding", where,
                        "leave out [serve.speculative], or serve with vllm, sglang or trtllm")]
    table = METHODS.get(engine, {}).get(version or "")
    if table is None:
        return [Problem(f"llmopt has no table of the speculative methods of {label} {version}", where,
                        "the engine's own parser (where installed) or its start-up checks the config",
                        severity="warning")]
    if spec.method in table:
        return []
    why = WHY_NOT.get((engine, spec.method), f"{label} {version} has no speculative method {spec.method!r}")
    return [Problem(f"{label} {version} cannot run speculative method {spec.method!r}: {why}", where,
                    f"use one it has: {', '.join(table)}")]


def draft_problems(spec: Spec, target: ModelInfo | None, where: str) -> list[Problem]:
    try:
        draft = draft_info(spec.model)
    except UsageError as exc:
        return [Problem(exc.what, where, exc.fix)]
    if draft is None:
        return [Problem(f"the draft {spec.model}'s config.json could not be read: its vocabulary, size and memory "
                        "are not checked", where, "give a local folder, or work with the hub reachable",
                        severity="warning")]
    if target is None:
        return []
    out = []
    if draft.vocab_size != target.vocab_size:
        out.append(Problem(f"the draft's vocabulary ({draft.vocab_size:,} tokens) differs from the target's "
                           f"({target.vocab_size:,}): its tokens would not mean the target's", where,
                           "use a draft of the target's family with the same tokenizer"))
    if spec.method == "draft_model" and draft.total_params >= target.total_params:
        out.append(Problem(f"the draft ({draft.total_params / 1e9:.2f}B parameters) is not smaller than the target "
                           f"({target.total_params / 1e9:.2f}B): drafting would cost more than it saves", where,
                           "use a smaller model of the target's family"))
    return out


def is_local(model: str) -> bool:
    return model.startswith(("/", "./", "../", "~")) or Path(model).expanduser().is_dir()


def draft_info(model: str) -> ModelInfo | None:
    """The draft's config facts: a local folder's config.json, else the hub's (None when it cannot be reached).
    Raises UsageError for a local folder that is missing, relative or has no config.json."""
    if is_local(model):
        folder = Path(model).expanduser()
        if not folder.is_absolute():
            raise UsageError(f"the draft folder {model!r} is relative", fix="give its absolute path: the engine "
                             "reads it where it runs, not relative to the recipe")
        if not (folder / "config.json").is_file():
            raise UsageError(f"the draft folder {model} has no config.json", fix="point model at a Hugging Face "
                             "model folder (or a hub id)")
        return from_folder(folder)
    from llmopt.model import hub

    try:
        path = hub.hub_config(model, None, hub.hub_offline())
    except UsageError:
        return None
    if path is None:
        return None
    import json

    return from_config(json.loads(Path(path).read_text()))


# --- the memory model -----------------------------------------------------------------------------------------

def draft_memory(spec: Spec | None, target: ModelInfo, dtype: str) -> memory.Draft | None:
    """What the draft adds to each replica: its weights (a local folder's safetensors, else its parameters in
    the serving dtype) and its KV cache per token. ngram: nothing. mtp: the KV of one more layer of the target
    (vLLM and SGLang run the next-n layer, whose weights the checkpoint already holds). A draft whose facts are
    unknown adds nothing (the plan warns)."""
    if spec is None or spec.method == "ngram":
        return None
    if spec.method == "mtp":
        return memory.Draft("mtp", 0, dataclasses.replace(target, num_layers=1, sliding_layers=0))
    if spec.model == OWN_DRAFT:  # not made yet: the deploy stage counts it from its folder
        return None
    try:
        info = draft_info(spec.model) if spec.model else None
    except UsageError:
        info = None
    if info is None:
        return None
    weights = memory.safetensors_bytes(spec.model) if is_local(spec.model) else None
    if weights is None:
        weights = math.ceil(info.total_params * DTYPE_BYTES.get(dtype, 2))
    return memory.Draft(spec.method, weights, info)
