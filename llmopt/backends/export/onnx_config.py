"""The Hugging Face config as onnxruntime-genai's model builder (0.18) must read it to build the model it describes.

transformers 5 writes some settings in forms the builder does not read, or reads differently. ``adapt`` changes
the in-memory config the builder was given (``parse_extra_options``'s ``hf_details``), never the files: the
weights are still loaded with the model's own config, and a config.json rewritten in the old forms would be read
back into the new ones by the transformers config class. Each change, and why:

* RoPE parameters per layer type (Gemma 3: ``rope_parameters = {"full_attention": {...}, "sliding_attention":
  {...}}``): the builder reads one flat dict (``rope_type``), takes the full layers' base frequency from
  ``rope_theta`` (10,000 when absent) and the sliding layers' from ``rope_local_base_freq``. Both are given, and
  the full layers' dict becomes the flat one. The builder computes the sliding layers' cos/sin caches with the
  full layers' scaling factor, so any RoPE other than ``default`` on either layer type is refused;
* a sliding window without ``layer_types`` (Mistral: transformers applies ``sliding_window`` to every layer): the
  builder windows only the layers ``layer_types`` marks ``sliding_attention``, so every layer is marked so;
* Phi-3 with ``original_max_position_embeddings`` unlike ``max_position_embeddings`` but no LongRoPE factors (a
  config class default, 4096): the builder picks its LongRoPE class, which needs them, by that difference alone;
  the two are made equal, which picks the plain class (the RoPE transformers applies: ``rope_type`` default).
"""

from __future__ import annotations

from llmopt.errors import StageFailed

LAYER_TYPES = ("full_attention", "sliding_attention")


def adapt(config, where: str) -> list[str]:
    """Change ``config`` (a transformers ``PretrainedConfig``, in place) into what the builder reads; returns what
    was changed, one line each, for the stage's manifest. Raises StageFailed for RoPE the builder cannot express."""
    changes = []
    rope = getattr(config, "rope_parameters", None)
    if isinstance(rope, dict) and set(rope) & set(LAYER_TYPES):
        changes += per_layer_rope(config, rope, where)
    window = getattr(config, "sliding_window", None)
    if window and getattr(config, "layer_types", None) is None and config.model_type == "mistral":
        config.layer_types = ["sliding_attention"] * config.num_hidden_layers
        changes.append(f"layer_types: every layer sliding_attention (sliding_window {window})")
    original = getattr(config, "original_max_position_embeddings", None)
    rope = getattr(config, "rope_parameters", None) or {}
    if config.model_type == "phi3" and original not in (None, config.max_position_embeddings) \
            and rope.get("rope_type", "default") != "longrope":
        config.original_max_position_embeddings = config.max_position_embeddings
        changes.append(f"original_max_position_embeddings: {original} -> {config.max_position_embeddings} "
                       "(no LongRoPE factors)")
    return changes


def per_layer_rope(config, rope: dict, where: str) -> list[str]:
    """Gemma 3's RoPE per layer type as the builder reads it: the full layers' flat dict, ``rope_theta`` and
    ``rope_local_base_freq``."""
    full, sliding = rope.get("full_attention") or {}, rope.get("sliding_attention") or full
    kinds = {name: params.get("rope_type", "default") for name, params in (("full", full), ("sliding", sliding))}
    if set(kinds.values()) != {"default"} or "rope_theta" not in full:
        raise StageFailed(f"the model's RoPE per layer type ({kinds}) cannot be built: onnxruntime-genai's builder "
                          "gives the sliding layers the full layers' scaling, and builds default RoPE only there",
                          where=where, fix="export this model in another format (format = \"hf\" or \"gguf\")")
    config.rope_parameters = dict(full)
    config.rope_theta = full["rope_theta"]
    config.rope_local_base_freq = sliding.get("rope_theta", full["rope_theta"])
    return [f"rope_parameters per layer type: rope_theta {config.rope_theta} (full layers), rope_local_base_freq "
            f"{config.rope_local_base_freq} (sliding layers)"]
