"""Checks that a source model is sane before hours of work go into it: both sources (``hf``, ``gguf``) call
``check_tokenizer`` and ``check_greedy`` before their stage ends, and a perplexity eval that scores the
source calls ``check_baseline_perplexity``. A failing check raises ``StageFailed`` (exit 1) that says what
failed, the numbers and the likely cause; it never becomes a score.

The thresholds, and what every model the tests use gives (the demo is SmolLM2-135M, vocabulary 49,152; the
tiny models have vocabularies of 512 to 8,192 and random or briefly trained weights):

* **Round trip.** ``decode(encode(text)) == text`` on the shipped calibration prose (``builtin:prose``,
  35 kB of English), without special tokens and without transformers' clean-up of spaces. Every tokenizer
  of the suite gives the text back exactly.
* **Tokens per word** on that text (words split on whitespace; it has 5.55 characters a word, spaces
  counted), at most ``MAX_TOKENS_PER_WORD = 3.5``. Subword tokenizers give 1.23 (the demo), 2.03 (a 1,000-piece
  SentencePiece vocabulary) and 2.59 (the tests' 512-piece byte-level BPE); one that splits text into single
  characters gives 5.5-5.6 (the reported Gemma 3 GGUF conversion: "The capital" became ``T h e ▁ c a p ...``).
* **Greedy tokens.** ``GREEDY_TOKENS = 8`` tokens from each of two plain prompts that end in different
  words. Failing: a logit that is not finite, or both continuations being one and the same token repeated
  (the model's output does not depend on its input: NaN weights give argmax 0 everywhere, weights read in the
  wrong layout give one token whatever the prompt). One token repeated is not failing alone: a random-weight
  model with tied embeddings repeats the prompt's last word (" is is is ...", " was was was ..."), as the
  tests' tiny models do, and the demo continues " Paris.\\n\\nThe answer is:". In the ``hf`` source the model
  is loaded for this only when its weights take at most ``GREEDY_MAX_BYTES`` and it is not a quantized
  checkpoint (whose kernels may need a GPU); the baseline perplexity check covers the others.
* **Baseline perplexity.** Failing where both: the perplexity is within a factor ``VOCAB_FACTOR = 10`` of
  the vocabulary's size (the perplexity of guessing uniformly), and at least ``UNIGRAM_FACTOR = 10`` times the
  unigram perplexity of the eval's text (what counting the text's own token frequencies gives; over the whole
  text the eval tokenized, as the few hundred tokens of the windows it scores give a lower one: 109 for 4
  windows of 64, where the whole of ``builtin:prose-eval`` gives 314). On ``builtin:prose-eval``: the demo
  scores 29.6 against a unigram 530 (0.06 times); trained tiny models 76-90 against 184 (0.4-0.5 times); the
  tests' random-weight models 515-531 on a vocabulary of 512 against 184 (2.9 times), and about 1,400 on
  1,000 against 314 (4.5 times): random weights predict nothing, but are no worse than guessing uniformly over
  a vocabulary a little wider than the text's, and the suite runs its pipeline on them. The reported Gemma 3
  baseline, 95,350 on 262,144 scored on character ids (whose unigram perplexity is 21), fails both by far
  (36% of the vocabulary, 4,600 times), as a random model with a real vocabulary (32k+) does.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

from llmopt.errors import StageFailed

MAX_TOKENS_PER_WORD = 3.5
GREEDY_TOKENS = 8
PROMPTS = ("The capital of France is", "Once upon a time, there was")
GREEDY_MAX_BYTES = 2 * 1024**3  # the hf source loads a model for the greedy check up to this size of weights
VOCAB_FACTOR = 10
UNIGRAM_FACTOR = 10
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def calibration_text() -> str:
    from llmopt.data import HERE

    return (HERE / "prose_calib.txt").read_text()


def check_tokenizer(tokenizer, where: str = "source") -> dict:
    """Round trip and tokens per word of the calibration text; returns the numbers."""
    text = calibration_text()
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    back = tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    per_word = len(ids) / len(text.split())
    if per_word > MAX_TOKENS_PER_WORD:
        how = "into single characters" if len(text) / len(ids) < 1.5 else "into pieces far shorter than subwords"
        raise StageFailed(
            f"the tokenizer splits text {how}: {per_word:.1f} tokens a word on the calibration text "
            f"(a subword tokenizer gives 1.2-2.6; at most {MAX_TOKENS_PER_WORD} is accepted); "
            f"{text[:11]!r} became {' '.join(tokenizer.convert_ids_to_tokens(ids[:8]))!r}",
            where=where, fix=TOKENIZER_FIX)
    if back != text:
        at = next((i for i, (a, b) in enumerate(zip(text, back)) if a != b), min(len(text), len(back)))
        raise StageFailed(
            f"the tokenizer does not give back the text it encodes: decode(encode(text)) differs from the "
            f"calibration text at character {at} of {len(text)}: {text[max(at - 10, 0):at + 10]!r} came back as "
            f"{back[max(at - 10, 0):at + 10]!r}", where=where, fix=TOKENIZER_FIX)
    return {"tokens_per_word": round(per_word, 3), "round_trip": True}


TOKENIZER_FIX = ("the tokenizer's ids are not the vocabulary the weights were trained on: give the model's own "
                 "tokenizer files (tokenizer.json / tokenizer.model) with its weights")


def check_greedy(model, tokenizer, where: str = "source") -> dict:
    """``GREEDY_TOKENS`` greedy tokens from each prompt (both in one batch, left-padded, with the cache); fails
    on non-finite logits or on one and the same token repeated after both prompts. Returns the continuations."""
    import torch

    device = next(model.parameters()).device
    encoded = [tokenizer(prompt)["input_ids"] for prompt in PROMPTS]
    width = max(map(len, encoded))
    ids = torch.tensor([[tokenizer.pad_token_id or 0] * (width - len(e)) + e for e in encoded], device=device)
    mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded], device=device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    steps, past = [], None
    with torch.inference_mode():
        for _ in range(GREEDY_TOKENS):
            out = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=past,
                        use_cache=True)
            logits = out.logits[:, -1].float()
            for prompt, row in zip(PROMPTS, logits):
                if not torch.isfinite(row).all():
                    raise StageFailed(f"the model's logits after {prompt!r} are not finite (NaN or infinite)",
                                      where=where, fix=WEIGHTS_FIX)
            ids, past = logits.argmax(-1, keepdim=True), out.past_key_values
            steps.append(ids[:, 0].tolist())
            mask = torch.cat([mask, torch.ones_like(ids)], dim=-1)
            positions = positions[:, -1:] + 1
    stops = {tokenizer.eos_token_id, *_ids(getattr(getattr(model, "generation_config", None), "eos_token_id", None))}
    continuations = [_until(list(tokens), stops) for tokens in zip(*steps)]
    if all(len(set(t)) == 1 and len(t) == GREEDY_TOKENS for t in continuations) and \
            continuations[0][0] == continuations[1][0]:
        token = tokenizer.convert_ids_to_tokens(continuations[0][0])
        raise StageFailed(
            f"the model's greedy continuation is one token repeated whatever the prompt: {PROMPTS[0]!r} and "
            f"{PROMPTS[1]!r} both continue with {token!r} (id {continuations[0][0]}) {GREEDY_TOKENS} times",
            where=where, fix=WEIGHTS_FIX)
    return {"greedy": [tokenizer.decode(t) for t in continuations]}


def _ids(value) -> list:
    return value if isinstance(value, list) else [value]


def _until(tokens: list[int], stops: set) -> list[int]:
    """``tokens`` up to the first end-of-sequence token, that one included."""
    end = next((i for i, t in enumerate(tokens) if t in stops), len(tokens) - 1)
    return tokens[: end + 1]


WEIGHTS_FIX = ("the weights were read wrongly (a tensor layout or quantization type the conversion does not "
               "handle), or the tokenizer's ids are not the model's vocabulary")


def check_folder(folder: Path, where: str = "source", trust_remote_code: bool = False, log=None) -> dict:
    """The checks on a Hugging Face folder: its tokenizer; then its greedy tokens, where the folder's weights
    are small enough to load here for a moment and are not a quantized checkpoint."""
    import json

    import transformers

    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        _say(log, f"{where}: {folder} has no tokenizer files; the source checks are skipped")
        return {}
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
    found = check_tokenizer(tokenizer, where)
    config = json.loads((folder / "config.json").read_text())
    size = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    limit = GREEDY_MAX_BYTES / 1024**3
    skip = ("a quantized checkpoint" if "quantization_config" in config else "no safetensors weights" if not size
            else f"{size / 1024**3:.1f} GiB of weights, over {limit:.0f}" if size > GREEDY_MAX_BYTES else None)
    if skip:
        _say(log, f"{where}: greedy tokens not checked ({skip}); the baseline perplexity is")
        return found
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype="auto",
                                                              trust_remote_code=trust_remote_code).eval()
    return found | check_greedy(model, tokenizer, where)


def _say(log, message: str) -> None:
    if log is not None:
        log.info(message)


def unigram_perplexity(token_ids: list[int]) -> float:
    """exp of the entropy of the tokens' own frequencies: the perplexity of a model that only counts them."""
    counts, n = Counter(token_ids), len(token_ids)
    return math.exp(-sum(c * math.log(c / n) for c in counts.values()) / n)


def check_baseline_perplexity(perplexity: float, token_ids: list[int], vocab_size: int | None, where: str) -> dict:
    """Fails where the source's perplexity is near the vocabulary's size and far above the unigram perplexity
    of ``token_ids`` (the whole text the eval tokenized, not only the windows it scored: few tokens would make
    the unigram perplexity low)."""
    unigram = unigram_perplexity(token_ids)
    found = {"unigram_perplexity": round(unigram, 2)}
    if not vocab_size or perplexity < vocab_size / VOCAB_FACTOR or perplexity < UNIGRAM_FACTOR * unigram:
        return found
    raise StageFailed(
        f"the baseline is broken: its perplexity {perplexity:,.0f} is {perplexity / vocab_size:.0%} of the "
        f"vocabulary's size ({vocab_size:,}), near what guessing uniformly gives, and {perplexity / unigram:,.0f} "
        f"times the {unigram:,.1f} of counting the text's token frequencies; a model that reads its own tokens "
        f"scores far below both", where=where,
        fix="the tokenizer's ids are not the model's vocabulary, or its weights were read wrongly: check the "
            "source stage's folder (its tokenizer and a few greedy tokens), and score no compression against it")
