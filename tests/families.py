"""Tiny random-weight models of each model family llmopt's table names (``llmopt/model/families.toml``), built
from the family's own transformers config class and saved as a Hugging Face folder with a small trained tokenizer.

Each keeps what sets its family apart, since that is what breaks code written for another family:

* gemma2: sliding-window layers alternating with full ones (``layer_types``), soft-capped logits, tied embeddings;
* gemma3_text: five sliding layers a full one (here: two of three), RoPE parameters per layer type, QK-norm, tied
  embeddings with a vocabulary far wider than the model (Gemma 3's is 262,144 rows);
* qwen3 and olmo2: QK-norm (olmo2's norms after the attention and the MLP, not before);
* phi3: fused ``qkv_proj`` and ``gate_up_proj``;
* granite: its embedding, residual, attention and logit multipliers;
* mistral: a sliding window over every layer;
* qwen3_moe and mixtral: routed experts.

Widths are multiples of 32, so that groups of 32 divide every linear layer, and small enough that a
calibrating method runs in seconds on one CPU thread.
"""

from __future__ import annotations

import json
from pathlib import Path

HIDDEN, LAYERS, HEADS, KV_HEADS, INTERMEDIATE, CONTEXT = 64, 2, 4, 2, 128, 512

# family -> (config class, model class, what sets it apart, as config keys)
FAMILIES: dict[str, tuple[str, str, dict]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 32}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 64}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               {"head_dim": 32, "sliding_window": 64, "layer_types": ["sliding_attention", "full_attention"],
                "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0, "query_pre_attn_scalar": 32}),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM",
                    {"head_dim": 32, "sliding_window": 64, "num_hidden_layers": 3,
                     "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
                     "query_pre_attn_scalar": 32, "vocab_size": 8192}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {}),
    "granite": ("GraniteConfig", "GraniteForCausalLM",
                {"embedding_multiplier": 12.0, "residual_multiplier": 0.22, "attention_multiplier": 0.0156,
                 "logits_scaling": 8.0}),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  {"head_dim": 32, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                   "decoder_sparse_step": 1, "mlp_only_layers": []}),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"num_local_experts": 4, "num_experts_per_tok": 2}),
}


STEPS = 300  # of 8 rows of 64 tokens: enough to take the prose perplexity far below the vocabulary's size


def train(model, tok, steps: int) -> None:
    """A few steps of next-token training on the shipped prose, in float32: a model that has learnt something
    scores a perplexity far below its vocabulary's size (a random one scores about that size, which llmopt's
    checks read as a broken source), and quantization errors then show in its scores."""
    import torch
    from conftest import DATA

    if not steps:
        return
    ids = tok((DATA / "prose_calib.txt").read_text(), return_tensors="pt").input_ids[0]
    rows = ids[: len(ids) // 64 * 64].view(-1, 64)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(steps):
        batch = rows[torch.randint(len(rows), (8,), generator=generator)]
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()


def make_tiny(family: str, folder: Path, seed: int = 0, dtype: str = "bfloat16", steps: int = STEPS) -> Path:
    """A ``family`` model with the shared test tokenizer, trained ``steps`` steps from random weights, saved in
    ``folder``."""
    import torch
    import transformers
    from conftest import train_tokenizer

    config_class, model_class, special = FAMILIES[family]
    folder.mkdir(parents=True, exist_ok=True)
    train_tokenizer(folder)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    keys = dict(hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_hidden_layers=LAYERS,
                num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=len(tok),
                max_position_embeddings=CONTEXT, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id, tie_word_embeddings=family.startswith("gemma"))
    keys |= special
    config = getattr(transformers, config_class)(**keys)
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(config)
    train(model, tok, steps)
    model.to(getattr(torch, dtype)).save_pretrained(folder, safe_serialization=True)
    saved = json.loads((folder / "config.json").read_text())
    assert saved["model_type"] == family, (family, saved["model_type"])
    return folder


def recipe(name: str, model, steps: str = "", window: int = 128, windows: int = 6) -> str:
    """A recipe of a tiny family model: its folder as the source, 8 calibration rows of 64 tokens of builtin:mix,
    ``steps`` (TOML tables: [[compress]], [export], more [[eval]]) and a perplexity eval on ``windows`` held-out
    windows of ``window`` tokens."""
    from conftest import calibrated_head

    return calibrated_head(name, model) + f"""\
[[eval]]
name = "prose"
kind = "perplexity"
data = "builtin:prose-eval"
window = {window}
max_windows = {windows}

{steps}"""
