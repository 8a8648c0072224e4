"""Tiny GGUF files for tests: a Gemma 3 model whose vocabulary is SentencePiece's, in K-quant blocks.

``spm_vocabulary`` trains a SentencePiece BPE model on the shipped prose (as Gemma's and Llama 2's are BPE),
with Gemma's settings: no normalization, no dummy prefix, byte fallback, digits split, pad/eos/bos/unk at
ids 0-3. ``write_gemma3_gguf`` writes a random-weight ``gemma3`` GGUF with that vocabulary: the linears in
Q4_K blocks and the embedding in Q6_K, as a Q4_K_M file mixes them. The gguf package (0.19) dequantizes
K-quants but has no quantizer for them, so ``q4_k`` and ``q6_k`` here write the blocks as llama.cpp lays
them out (the simple min/max fit, not llama.cpp's search for the best scales); tests check that the gguf
package reads them back within a quantization step.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parent.parent / "llmopt" / "data"
QK_K = 256
HIDDEN, FFN, LAYERS = 256, 512, 2  # K-quant rows are whole blocks of 256 values


def spm_vocabulary(folder: Path, vocab_size: int = 1000, space_prefix: bool = False) -> Path:
    """A SentencePiece BPE model trained on prose_calib.txt, saved as ``folder/spm.model``; ``space_prefix``:
    a ``▁`` before the text, as Llama 2's vocabulary adds (Gemma's does not)."""
    import sentencepiece as spm

    folder.mkdir(parents=True, exist_ok=True)
    lines = [line for line in (DATA / "prose_calib.txt").read_text().splitlines() if line.strip()]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=str(folder / "spm"), vocab_size=vocab_size, model_type="bpe",
        normalization_rule_name="identity", remove_extra_whitespaces=False, add_dummy_prefix=space_prefix,
        byte_fallback=True, split_digits=True, allow_whitespace_only_pieces=True, character_coverage=1.0,
        pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>",
        unk_piece="<unk>", user_defined_symbols=["<start_of_turn>", "<end_of_turn>", "\n"],
        num_threads=1, minloglevel=2)
    return folder / "spm.model"


def spm_entries(model: Path) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and GGUF token types (1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte)."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model))
    tokens = [sp.IdToPiece(i) for i in range(sp.GetPieceSize())]
    scores = [sp.GetScore(i) for i in range(sp.GetPieceSize())]
    types = [2 if sp.IsUnknown(i) else 3 if sp.IsControl(i) else 6 if sp.IsByte(i) else 5 if sp.IsUnused(i)
             else 4 if t in ("<start_of_turn>", "<end_of_turn>", "\n") else 1 for i, t in enumerate(tokens)]
    return tokens, scores, types


def q4_k(weights: np.ndarray) -> np.ndarray:
    """Q4_K blocks of a float matrix (rows of whole 256-value blocks): per block an fp16 scale and min, eight
    6-bit sub-scales and sub-mins, and 4-bit codes; a value is d * sc * q - dmin * m."""
    x = weights.astype(np.float32).reshape(-1, 8, 32)
    lo, hi = np.minimum(x.min(-1), 0), x.max(-1)
    scale, mins = (hi - lo) / 15, -lo
    d = np.maximum(scale.max(-1, keepdims=True) / 63, 1e-12).astype(np.float16).astype(np.float32)
    dmin = np.maximum(mins.max(-1, keepdims=True) / 63, 1e-12).astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(scale / d), 1, 63).astype(np.uint8)
    m = np.clip(np.round(mins / dmin), 0, 63).astype(np.uint8)
    step = (d * sc)[..., None]
    q = np.clip(np.round((x + (dmin * m)[..., None]) / step), 0, 15).astype(np.uint8)
    packed = np.concatenate([  # the 12-byte layout Q4_K.get_scale_min unpacks
        sc[:, :4] | ((sc[:, 4:] >> 4) << 6), m[:, :4] | ((m[:, 4:] >> 4) << 6),
        (sc[:, 4:] & 15) | ((m[:, 4:] & 15) << 4)], axis=-1)
    q = q.reshape(-1, 4, 2, 32)
    qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128)
    halves = [d.astype(np.float16).view(np.uint8), dmin.astype(np.float16).view(np.uint8)]
    blocks = np.concatenate([*halves, packed, qs], -1)
    return blocks.reshape(weights.shape[0], -1)


def q6_k(weights: np.ndarray) -> np.ndarray:
    """Q6_K blocks: sixteen int8 sub-scales of 16 values, an fp16 scale, 6-bit codes; a value is d * sc * (q - 32)."""
    x = weights.astype(np.float32).reshape(-1, 16, 16)
    scale = np.abs(x).max(-1) / 31
    d = np.maximum(np.abs(scale).max(-1, keepdims=True) / 127, 1e-12).astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(scale / d), 1, 127).astype(np.int8)
    q = (np.clip(np.round(x / (d * sc)[..., None]), -32, 31) + 32).astype(np.uint8).reshape(-1, 8, 32)
    low, high = (q & 15).reshape(-1, 2, 2, 64), (q >> 4).reshape(-1, 2, 4, 32)
    ql = (low[:, :, 0] | (low[:, :, 1] << 4)).reshape(-1, 128)
    qh = (high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)).reshape(-1, 64)
    blocks = np.concatenate([ql, qh, sc.view(np.uint8), d.astype(np.float16).view(np.uint8)], -1)
    return blocks.reshape(weights.shape[0], -1)


def gemma3_weights(vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    """GGUF tensor name -> float weights of a random two-layer Gemma 3 (norms stored as 1 + weight, as
    llama.cpp's converter writes Gemma's)."""
    rng = np.random.default_rng(seed)

    def normal(*shape):
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    out = {"token_embd.weight": normal(vocab, HIDDEN), "output_norm.weight": np.ones(HIDDEN, np.float32)}
    for i in range(LAYERS):
        out |= {f"blk.{i}.attn_q.weight": normal(HIDDEN, HIDDEN), f"blk.{i}.attn_k.weight": normal(HIDDEN, HIDDEN),
                f"blk.{i}.attn_v.weight": normal(HIDDEN, HIDDEN), f"blk.{i}.attn_output.weight": normal(HIDDEN, HIDDEN),
                f"blk.{i}.ffn_gate.weight": normal(FFN, HIDDEN), f"blk.{i}.ffn_up.weight": normal(FFN, HIDDEN),
                f"blk.{i}.ffn_down.weight": normal(HIDDEN, FFN)}
        for norm in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
            out[f"blk.{i}.{norm}.weight"] = np.ones(HIDDEN, np.float32)
        for norm in ("attn_q_norm", "attn_k_norm"):
            out[f"blk.{i}.{norm}.weight"] = np.ones(HIDDEN, np.float32)  # one head of 256
    return out


def write_gemma3_gguf(path: Path, model: Path, add_bos: bool = True, space_prefix: bool = False,
                      seed: int = 0) -> dict[str, np.ndarray]:
    """A ``gemma3`` GGUF at ``path`` with the SentencePiece ``model``'s vocabulary (``space_prefix`` as it was
    trained); returns the raw blocks of the quantized tensors."""
    import gguf
    from gguf import GGMLQuantizationType as QT

    tokens, scores, types = spm_entries(model)
    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_name("tiny-gemma3-spm")
    for key, value in {"context_length": 1024, "embedding_length": HIDDEN, "block_count": LAYERS,
                       "feed_forward_length": FFN, "attention.head_count": 1, "attention.head_count_kv": 1,
                       "attention.key_length": HIDDEN, "attention.value_length": HIDDEN,
                       "attention.sliding_window": 512}.items():
        writer.add_uint32(f"gemma3.{key}", value)
    writer.add_float32("gemma3.attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_float32("gemma3.rope.freq_base", 1_000_000.0)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(3)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(add_bos)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(space_prefix)
    raw = {}
    for name, weights in gemma3_weights(len(tokens), seed).items():
        if weights.ndim == 1:
            writer.add_tensor(name, weights)
            continue
        kind = QT.Q6_K if name == "token_embd.weight" else QT.Q4_K
        raw[name] = (q6_k if kind == QT.Q6_K else q4_k)(weights)
        writer.add_tensor(name, raw[name], raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return raw
