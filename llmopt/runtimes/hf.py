"""Runtime: in-process transformers (PyTorch) on CPU or CUDA.

Needs: torch, transformers (the ``torch`` extra).
"""

from __future__ import annotations

from pathlib import Path

from llmopt.backends.base import require


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
