"""Runtime: in-process transformers (PyTorch) on CPU or CUDA.

Needs: torch, transformers (the ``torch`` extra).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Iterator

from llmopt.libraries import require


class TransformersRuntime:
    """In-process transformers on CPU or CUDA."""

    name = "transformers"

    def __init__(self, model_dir: Path, device: str = "cpu", trust_remote_code: bool = False):
        torch = require("torch", "core", "the transformers runtime")
        transformers = require("transformers", "core", "the transformers runtime")
        self.torch = torch
        self.device = device
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
        # float32 on CPU (bf16 matmuls are slow there and less exact); bf16 on GPU
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=dtype, trust_remote_code=trust_remote_code
        ).to(device)
        self.model.eval()

    def encode(self, text: str, bos: bool = True) -> list[int]:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        bos_id = self.tokenizer.bos_token_id
        return ([bos_id] if bos and bos_id is not None else []) + ids

    def nll(self, sequences: list[list[int]], scored: list[int]) -> list[float]:
        torch = self.torch
        width = max(len(s) for s in sequences)
        pad = self.tokenizer.pad_token_id or 0
        ids = torch.full((len(sequences), width), pad, dtype=torch.long)
        mask = torch.zeros((len(sequences), width), dtype=torch.long)
        for i, seq in enumerate(sequences):  # right padding: positions stay 0..len-1
            ids[i, : len(seq)] = torch.tensor(seq)
            mask[i, : len(seq)] = 1
        with torch.inference_mode():
            logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).logits.float()
        logprobs = torch.log_softmax(logits[:, :-1], dim=-1)
        targets = ids[:, 1:].to(self.device)
        token_lp = logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        out = []
        for i, seq in enumerate(sequences):
            end = len(seq) - 1  # logits at t predict token t+1
            out.append(float(-token_lp[i, end - scored[i] : end].sum()))
        return out

    def generate(self, prompt_ids: list[int], max_new_tokens: int, stop_ids: set[int] | None = None) -> list[int]:
        torch = self.torch
        ids = torch.tensor([prompt_ids], device=self.device)
        with torch.inference_mode():
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                      do_sample=False, pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id)
        new = out[0, len(prompt_ids) :].tolist()
        stops = stop_ids or {self.tokenizer.eos_token_id}
        for i, tok in enumerate(new):
            if tok in stops:
                return new[:i]
        return new

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    @property
    def eos_ids(self) -> set[int]:
        """The tokenizer's end-of-sequence id and the generation config's (an int or a list)."""
        ids = {self.tokenizer.eos_token_id}
        config_eos = getattr(self.model.generation_config, "eos_token_id", None)
        ids.update(config_eos if isinstance(config_eos, (list, tuple)) else [config_eos])
        return {i for i in ids if i is not None}

    def stream(self, prompt_ids: list[int], max_new_tokens: int, stop_ids: set[int] | None = None,
               temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None) -> Iterator[int]:
        """Yield new token ids one at a time, reusing the KV cache between steps.

        Greedy when ``temperature`` is 0, else nucleus sampling (``top_p``) seeded by ``seed``.
        Stops before a stop id (the model's end-of-sequence ids by default; not yielded) or
        after ``max_new_tokens``. Closing the iterator stops the work at once."""
        torch = self.torch
        stops = self.eos_ids if stop_ids is None else set(stop_ids)
        generator = None
        if temperature > 0:
            generator = torch.Generator(device=self.device)
            if seed is None:
                generator.seed()
            else:
                generator.manual_seed(seed)
        # only the last position's logits: a long prompt's full logits would take vocab x length floats
        last_only = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(self.model.forward).parameters else {}
        ids, past = torch.tensor([prompt_ids], device=self.device), None
        for _ in range(max_new_tokens):
            with torch.inference_mode():
                out = self.model(input_ids=ids, past_key_values=past, use_cache=True, **last_only)
                token = pick_token(torch, out.logits[0, -1].float(), temperature, top_p, generator)
            past, out = out.past_key_values, None
            if token in stops:
                return
            yield token
            ids = torch.tensor([[token]], device=self.device)


def pick_token(torch, logits, temperature: float, top_p: float, generator) -> int:
    """The next token from one position's logits: argmax, or a sample from the top-p nucleus."""
    if temperature <= 0:
        return int(logits.argmax())
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        keep = sorted_probs.cumsum(-1) - sorted_probs < top_p  # the smallest set reaching top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
    return int(torch.multinomial(probs, 1, generator=generator))
