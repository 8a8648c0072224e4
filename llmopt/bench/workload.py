"""Request bodies of fixed input and output lengths, in the dialect the server accepts.

Prompts: with /v1/completions and a known vocabulary, random token ids (exactly
``input_len`` tokens, no tokenizer needed, a different prompt per request so that no
prefix cache helps); otherwise text of ``input_len`` common English words, which BPE
tokenizers mostly encode as one token each (the server's usage figure is what the
results report). With a text workload (``[serve.workload] dataset``, ``llmopt.bench.dataset``),
its prompts instead, each with its own ``max_tokens``, in the data set's order.

What is sent: ``model``, the prompt, ``max_tokens``, ``temperature: 0``, ``stream: true``
and ``stream_options: {include_usage: true}``, which every OpenAI-compatible server
accepts. Servers that accept it (vLLM, SGLang, TensorRT-LLM and ``llmopt serve``, told
apart by ``owned_by`` in GET /v1/models) also get ``ignore_eos: true`` with random prompts,
so every answer is ``output_len`` tokens long; a server of another kind may refuse an argument
it does not know (OpenAI's API answers 400), so it gets only the fields above. A text workload's
requests go without it: each answer ends where the model ends it, its record's ``max_tokens``
a cap, as a user's would (what speculative decoding and prefix caching gain depends on the
text the model really writes; vLLM's own benchmark also leaves ignore_eos off unless asked).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from llmopt.bench.dataset import Prepared, Request
from llmopt.bench.options import BenchOptions, Workload

WORDS = ("the of and to in is that for it as was with be by on not he this are or his from at which but have an "
         "they you were her she there one all we their been has when who will more no if out so said what up its "
         "about into than them can only other new some could time these two may then do first any my now such like "
         "our over man me even most made after also did many before must through back years where much your way well "
         "down should because each just those people how too little state good very make world still own see men work "
         "long get here between both life being under never day same another know while last might us great old year "
         "off come since against go came right used take three").split()
IGNORE_EOS_SERVERS = ("vllm", "sglang", "tensorrt", "trtllm", "llmopt")


def server_kind(models: dict) -> str:
    """Who answers, from GET /v1/models: llmopt, vllm, sglang, trtllm, or unknown."""
    owners = " ".join(str(m.get("owned_by", "")) for m in models.get("data") or []).lower()
    for kind, marks in (("llmopt", ("llmopt",)), ("vllm", ("vllm",)), ("sglang", ("sglang",)),
                        ("trtllm", ("tensorrt", "trtllm"))):
        if any(mark in owners for mark in marks):
            return kind
    return "unknown"


def vocab_size(model_dir: Path | None) -> int | None:
    """The vocabulary size from a model folder's config.json (text config of a multimodal model)."""
    if model_dir is None or not (Path(model_dir) / "config.json").is_file():
        return None
    config = json.loads((Path(model_dir) / "config.json").read_text())
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    return int(size) if size else None


def token_prompt(rng: random.Random, n: int, vocab: int) -> list[int]:
    """Token ids away from both ends of the vocabulary, where special tokens usually sit."""
    low, high = max(3, vocab // 64), max(4, int(vocab * 0.9))
    return [rng.randrange(low, high) for _ in range(n)]


def text_prompt(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def sends_ignore_eos(options: BenchOptions, server: str, texts: Prepared | None) -> bool:
    """Whether the requests carry ``ignore_eos: true``: as ``options.ignore_eos`` says, else only random prompts
    to a server that accepts it."""
    if options.ignore_eos is not None:
        return options.ignore_eos
    return texts is None and server in IGNORE_EOS_SERVERS


def bodies(workload: Workload, options: BenchOptions, model: str, server: str, vocab: int | None, n: int,
           seed: int, texts: Prepared | None = None) -> list[bytes]:
    """``n`` encoded request bodies; ``seed`` makes them repeatable (and distinct between points). With a text
    workload (``texts``), its next ``n`` requests instead."""
    ignore_eos = sends_ignore_eos(options, server, texts)
    if texts is not None:
        return [text_body(r, model, ignore_eos) for r in texts.take(n)]
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        body: dict = {"model": model, "max_tokens": workload.output_len, "temperature": 0.0, "stream": True,
                      "stream_options": {"include_usage": True}}
        if options.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": text_prompt(rng, workload.input_len)}]
        elif vocab:
            body["prompt"] = token_prompt(rng, workload.input_len, vocab)
        else:
            body["prompt"] = text_prompt(rng, workload.input_len)
        if ignore_eos:
            body["ignore_eos"] = True
        out.append(json.dumps(body).encode())
    return out


def text_body(request: Request, model: str, ignore_eos: bool) -> bytes:
    body: dict = {"model": model, "max_tokens": request.max_tokens, "temperature": 0.0, "stream": True,
                  "stream_options": {"include_usage": True}}
    if request.messages is not None:
        body["messages"] = request.messages
    else:
        body["prompt"] = request.prompt
    if ignore_eos:
        body["ignore_eos"] = True
    return json.dumps(body).encode()


def sent_fields(options: BenchOptions, server: str, vocab: int | None, texts: Prepared | None = None) -> dict:
    """What the requests carry, for the results."""
    ignore_eos = sends_ignore_eos(options, server, texts)
    prompt = "chat messages (text)" if options.endpoint == "chat" else ("token ids" if vocab else "text")
    if texts is not None:
        prompt = f"{'chat messages' if options.endpoint == 'chat' else 'text'} from {texts.dataset.name}"
    fields = ["model", "prompt" if options.endpoint == "completions" else "messages", "max_tokens", "temperature",
              "stream", "stream_options.include_usage"] + (["ignore_eos"] if ignore_eos else [])
    return {"endpoint": f"/v1/{'chat/completions' if options.endpoint == 'chat' else 'completions'}",
            "prompt": prompt, "vocab_size": vocab, "fields": fields, "ignore_eos": ignore_eos}
