"""Runtime: in-process transformers (PyTorch) on CPU or CUDA.

Needs: torch, transformers (the ``torch`` extra).
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from typing import Iterator

from llmopt.deploy.inputs import checkpoint_quantization, read_config
from llmopt.libraries import require
from llmopt.runtimes import hf_adds_bos


class TransformersRuntime:
    """In-process transformers on CPU or CUDA."""

    name = "transformers"

    def __init__(self, model_dir: Path, device: str = "cpu", trust_remote_code: bool = False):
        torch = require("torch", "core", "the transformers runtime")
        transformers = require("transformers", "core", "the transformers runtime")
        self.torch = torch
        self.device = device
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
        self.adds_bos = hf_adds_bos(self.tokenizer)
        # float32 on CPU (bf16 matmuls are slow there and less exact); bf16 on GPU
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        # On the CPU a compressed-tensors checkpoint is decompressed as it loads, then cast: left compressed,
        # it decompresses on its first forward pass into the checkpoint's own dtype (NVFP4's weights come out
        # bfloat16 and meet float32 activations). Not on a GPU: there the dtypes agree, and decompressing at
        # load wraps the layers in compressed-tensors' offloading, which keeps them on the CPU through .to()
        # (an H200 run failed so: "index is on cuda:0, different from other tensors on cpu"). One with routed
        # experts stored one module each is loaded from a dense copy (``load_dequantized``), on either device
        on_cpu = not device.startswith("cuda")
        compressed = (checkpoint_quantization(model_dir) or {}).get("quant_method") == "compressed-tensors"
        if compressed and per_expert(model_dir):
            model, quantized = load_dequantized(transformers, model_dir, dtype, trust_remote_code), {}
        else:
            quantized = {"quantization_config": transformers.CompressedTensorsConfig(dequantize=True)} \
                if on_cpu and compressed else {}
            model = complete(transformers, model_dir, dtype=dtype, trust_remote_code=trust_remote_code, **quantized)
        self.model = model.to(dtype=dtype) if quantized else model.to(device)
        self.model.eval()
        # whether the head can be computed at chosen positions only (most causal LMs of transformers take it)
        self.keeps_logits = "logits_to_keep" in inspect.signature(self.model.forward).parameters

    def encode(self, text: str, bos: bool = True) -> list[int]:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        bos_id = self.tokenizer.bos_token_id
        return ([bos_id] if bos and bos_id is not None else []) + ids

    def nll(self, sequences: list[list[int]], scored: list[int]) -> list[float]:
        torch = self.torch
        ids, mask = self._padded(sequences)
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

    def continuation_nll(self, groups: list[tuple[list[int], list[list[int]]]]) -> list[list[float]]:
        """Summed negative log-likelihood of each continuation after its context, for contexts each shared by
        several continuations (a multiple-choice question's choices): ``nll`` of each context + continuation
        scored whole, within float rounding, from fewer tokens. The contexts go through the model once, side by
        side; a continuation's first token is scored from its context's last position, and the continuations
        of more than one token continue their context's key/value cache together."""
        torch = self.torch
        contexts = [context for context, _ in groups]
        ids, mask = self._padded(contexts)
        last = torch.tensor([len(context) - 1 for context in contexts])
        # the head at the contexts' last positions only (a fifth of the demo model's work at every other position)
        kept, column = torch.unique(last, return_inverse=True)
        heads = {"logits_to_keep": kept.to(self.device)} if self.keeps_logits else {}
        with torch.inference_mode():
            out = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device), use_cache=True, **heads)
        at = column if heads else last
        first = torch.log_softmax(out.logits[torch.arange(len(groups)), at.to(self.device)].float(), dim=-1)
        result = [[-float(first[g, tokens[0]]) for tokens in continuations] for g, (_, continuations) in enumerate(groups)]
        longer = [(g, k) for g, (_, continuations) in enumerate(groups) for k, tokens in enumerate(continuations)
                  if len(tokens) > 1]
        if not longer:
            return result
        cache = out.past_key_values
        if not hasattr(cache, "batch_select_indices"):  # a cache that cannot be copied per row: each sequence whole
            whole = self.nll([groups[g][0] + groups[g][1][k] for g, k in longer], [len(groups[g][1][k]) for g, k in longer])
            for (g, k), nll in zip(longer, whole):
                result[g][k] = nll
            return result
        rows = torch.tensor([g for g, _ in longer])
        cache.batch_select_indices(rows.to(self.device))  # a context's cache once for each of its continuations
        fed = [groups[g][1][k][:-1] for g, k in longer]  # the last token is only predicted
        tail, tail_mask = self._padded(fed)
        positions = (last[rows] + 1)[:, None] + torch.arange(tail.shape[1])
        with torch.inference_mode():
            logits = self.model(input_ids=tail.to(self.device), past_key_values=cache, use_cache=True,
                                attention_mask=torch.cat([mask[rows], tail_mask], dim=1).to(self.device),
                                position_ids=positions.to(self.device)).logits.float()
        logprobs = torch.log_softmax(logits, dim=-1)
        for row, (g, k) in enumerate(longer):
            targets = torch.tensor(groups[g][1][k][1:], device=self.device)
            result[g][k] -= float(logprobs[row, torch.arange(len(targets), device=self.device), targets].sum())
        return result

    def _padded(self, sequences: list[list[int]]):
        """Token ids right-padded to the longest sequence (positions stay 0..len-1), and their attention mask."""
        torch = self.torch
        width = max(len(s) for s in sequences)
        ids = torch.full((len(sequences), width), self.tokenizer.pad_token_id or 0, dtype=torch.long)
        mask = torch.zeros((len(sequences), width), dtype=torch.long)
        for i, seq in enumerate(sequences):
            ids[i, : len(seq)] = torch.tensor(seq)
            mask[i, : len(seq)] = 1
        return ids, mask

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

    def logits(self, ids: list[int]):
        """float32 logits [len(ids), vocab] of one sequence, every position (a numpy array)."""
        torch = self.torch
        with torch.inference_mode():
            out = self.model(input_ids=torch.tensor([ids], device=self.device)).logits[0]
        return out.float().cpu().numpy()

    def stream(self, prompt_ids: list[int], max_new_tokens: int, stop_ids: set[int] | None = None,
               temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None, top_k: int = 0,
               repetition_penalty: float = 1.0, min_new_tokens: int = 0) -> Iterator[int]:
        """Yield new token ids one at a time, reusing the KV cache between steps.

        Each step's logits go through ``Sampler``: the repetition penalty, then greedy at
        ``temperature`` 0, else top-k / top-p sampling seeded by ``seed``. Stops at a stop id
        (the model's end-of-sequence ids by default; masked for the first ``min_new_tokens``), which
        is not yielded but returned (the generator's StopIteration value), or after
        ``max_new_tokens``. Closing the iterator stops the work at once."""
        torch = self.torch
        stops = self.eos_ids if stop_ids is None else set(stop_ids)
        sampler = Sampler(torch, self.device, temperature, top_p, top_k, repetition_penalty, seed)
        sampler.saw(prompt_ids)
        # only the last position's logits: a long prompt's full logits would take vocab x length floats
        last_only = {"logits_to_keep": 1} if self.keeps_logits else {}
        ids, past = torch.tensor([prompt_ids], device=self.device), None
        for step in range(max_new_tokens):
            with torch.inference_mode():
                out = self.model(input_ids=ids, past_key_values=past, use_cache=True, **last_only)
                token = sampler.pick(out.logits[0, -1].float(), stops if step < min_new_tokens else ())
            past, out = out.past_key_values, None
            if token in stops:
                return token
            sampler.saw([token])
            yield token
            ids = torch.tensor([[token]], device=self.device)


def activation_scales_dropped():
    """A compressed-tensors checkpoint converter that drops the activations' static scales (FP8 static, NVFP4),
    which the dequantizer leaves and then refuses as orphans; the dense copy computes its activations unquantized."""
    from compressed_tensors.entrypoints.convert import Converter

    class DropActivationScales(Converter):
        def process(self, tensors: dict) -> dict:
            return {name: t for name, t in tensors.items() if not name.rsplit(".", 1)[-1].startswith(("input_", "output_"))}

        def update_config(self, config):
            return config

        def get_dependencies(self, weight_name: str) -> set[str]:
            return set()

    return DropActivationScales()


EXPERT_TENSOR = re.compile(r"\.experts\.\d+\.")


def tensor_names(model_dir: Path) -> list[str]:
    """The names of the checkpoint's tensors (from its shard index, else from the shards' headers)."""
    from safetensors import safe_open

    index = Path(model_dir) / "model.safetensors.index.json"
    if index.is_file():
        return list(json.loads(index.read_text())["weight_map"])
    names = []
    for shard in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(shard, "pt") as f:
            names += list(f.keys())
    return names


def per_expert(model_dir: Path) -> bool:
    """Whether the checkpoint stores routed experts one module each (``mlp.experts.3.up_proj``), the layout
    llm-compressor saves a mixture-of-experts model in, which transformers fuses into one tensor per layer as it
    loads."""
    return any(EXPERT_TENSOR.search(name) for name in tensor_names(model_dir))


def load_dequantized(transformers, model_dir: Path, dtype, trust_remote_code: bool):
    """A compressed-tensors checkpoint with per-expert weights, loaded through a dense copy that compressed-tensors'
    own checkpoint converter writes (``CompressedTensorsDequantizer``), as an unquantized model. transformers 5.17
    dequantizes such experts itself while it fuses them (``DecompressExperts``), and gets them wrong: it reads no
    zero points (an asymmetric checkpoint fails to load: "Asymmetric quant requires zero-point values"), reads
    NVFP4 experts without their global scales (perplexity x4) and takes the first config group that names modules
    for every expert (with sensitive layers kept at 8 bits, the experts were read as 8-bit: perplexity x17). The
    activations are not quantized on this path (transformers never quantizes a fused expert's inputs either): the
    scores are those of the quantized weights."""
    import tempfile

    import torch
    from compressed_tensors.entrypoints.convert import CompressedTensorsDequantizer, convert_checkpoint

    names = tensor_names(model_dir)
    scaled = {name.rsplit(".", 1)[0] for name in names if name.endswith(".weight_scale")}
    # the converter reads a group targeting "Linear" as every module: the ones stored unquantized (embeddings,
    # norms, those the recipe ignored) are named, else it looks for their scales (int8 and FP8 keep "weight")
    plain = [name.rsplit(".", 1)[0] for name in names if name.endswith(".weight")
             and name.rsplit(".", 1)[0] not in scaled]
    # the copy in the checkpoint's own dtype (half the disk of float32), cast to ``dtype`` as it loads
    config = read_config(model_dir)
    saved = config.get("dtype") or config.get("torch_dtype") or "bfloat16"
    dequantizer = CompressedTensorsDequantizer(model_dir, ignore=plain, dtype=getattr(torch, saved))
    # each tensor takes the first group that matches it: the groups that name their layers (sensitive layers kept
    # at 8 bits) go before the one targeting "Linear", as compressed-tensors ranks them on a model
    groups = dequantizer.quant_config.config_groups
    dequantizer.quant_config.config_groups = dict(sorted(groups.items(), key=lambda item: "Linear" in item[1].targets))
    with tempfile.TemporaryDirectory(prefix="llmopt-dense-") as dense:
        convert_checkpoint(model_dir, dense, [activation_scales_dropped(), dequantizer], device="cpu")
        return complete(transformers, dense, dtype=dtype, trust_remote_code=trust_remote_code, shown_as=model_dir)


def complete(transformers, model_dir, shown_as=None, **kwargs):
    """The model of ``model_dir``, every weight of it read from the checkpoint. transformers fills a weight the
    checkpoint lacks (or names otherwise than the model class does) with random values, says so in a log line and
    goes on: a Mixtral checkpoint whose experts were saved under other names loaded with random experts and
    scored +45% perplexity, as if quantization had cost that. Here it is an error that names what is missing."""
    from llmopt.errors import StageFailed

    model, info = transformers.AutoModelForCausalLM.from_pretrained(model_dir, output_loading_info=True, **kwargs)
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        unexpected = sorted(info.get("unexpected_keys") or [])
        raise StageFailed(
            f"{shown_as or model_dir} lacks {len(missing)} of the weights of {type(model).__name__} "
            f"(e.g. {', '.join(missing[:3])}); loaded, they would be random"
            + (f", and it holds {len(unexpected)} that the class does not read (e.g. {', '.join(unexpected[:3])})"
               if unexpected else ""),
            fix="the checkpoint was saved under other names than this transformers release reads: write it again "
                "with the library versions llmopt pins, or report the model family")
    return model


class Sampler:
    """The next token from one position's logits, as vLLM's sampler picks it: the repetition penalty
    (HF / vLLM style: a seen token's positive logit divided by it, a negative one multiplied) over the
    prompt and the tokens so far; then argmax at temperature 0 (top-k and top-p do not apply), else
    temperature, top-k (0: all tokens), top-p, and a draw from a generator seeded by ``seed``."""

    def __init__(self, torch, device: str, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                 repetition_penalty: float = 1.0, seed: int | None = None):
        self.torch, self.temperature, self.top_p, self.top_k = torch, temperature, top_p, top_k
        self.penalty, self.seen, self.generator = repetition_penalty, set(), None
        if temperature > 0:
            self.generator = torch.Generator(device=device)
            if seed is None:
                self.generator.seed()
            else:
                self.generator.manual_seed(seed)

    def saw(self, ids) -> None:
        if self.penalty != 1.0:
            self.seen.update(int(i) for i in ids)

    def pick(self, logits, banned=()) -> int:
        torch = self.torch
        if self.seen:
            index = torch.tensor(sorted(i for i in self.seen if i < logits.shape[-1]), device=logits.device)
            values = logits[index]
            logits = logits.index_put((index,), torch.where(values > 0, values / self.penalty, values * self.penalty))
        if banned:
            logits = logits.index_fill(0, torch.tensor(sorted(banned), device=logits.device), float("-inf"))
        if self.temperature <= 0:
            return int(logits.argmax())
        logits = logits / self.temperature
        if 0 < self.top_k < logits.shape[-1]:
            kth = logits.topk(self.top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if self.top_p < 1.0:
            sorted_probs, order = probs.sort(descending=True)
            keep = sorted_probs.cumsum(-1) - sorted_probs < self.top_p  # the smallest set reaching top_p
            probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
        return int(torch.multinomial(probs, 1, generator=self.generator))
