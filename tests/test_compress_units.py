"""Compression stages, fast: calibration rows, plan-time checks, composition rules, and real runs
of the pruning and round-to-nearest backends on the tiny model."""

from __future__ import annotations

import json

import pytest

from llmopt import api

from llmopt.data import calibration
from llmopt.backends.compress import _checks
from llmopt.errors import RecipeError, StageFailed
from llmopt.recipe.schema import CalibrationSection

from conftest import write_recipe

DEMO = "builtin:smollm2-135m"  # facts from the GGUF header: hidden 576, intermediate 1536, 30 layers


def recipe_text(source, steps: str, extra: str = "") -> str:
    return f'schema_version = 1\nname = "t"\n[model]\nsource = "{source}"\n{extra}\n{steps}'


def plan_of(tmp_path, source, steps: str, extra: str = ""):
    return api.plan(write_recipe(tmp_path, recipe_text(source, steps, extra)))


def messages(plan, severity: str = "error") -> list[str]:
    return [p.message for p in plan.problems if p.severity == severity]


# --- calibration rows ---------------------------------------------------------------------------

def tokenizer_of(folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def test_calibration_rows_are_exact_and_seeded(tiny_model):
    tok = tokenizer_of(tiny_model)
    cal = CalibrationSection(samples=25, max_seq_len=48, seed=0)
    a = calibration.token_rows(cal, tok)
    assert len(a.rows) == 25 and {len(r) for r in a.rows} == {48}
    assert calibration.token_rows(cal, tok).rows == a.rows  # deterministic
    b = calibration.token_rows(CalibrationSection(samples=25, max_seq_len=48, seed=1), tok)
    assert b.rows != a.rows  # another seed, another document order
    assert tok.eos_token_id in sum(a.rows, [])  # documents are joined with the end-of-sequence token
    for kind in ("newline", "none"):  # or with a blank line, or nothing: the same documents in the same order
        other = calibration.token_rows(CalibrationSection(samples=25, max_seq_len=48, separator=kind), tok)
        assert tok.eos_token_id not in sum(other.rows, []) and other.rows != a.rows
    ds = calibration.as_dataset(a)
    assert ds.column_names == ["input_ids", "attention_mask"] and ds[0]["attention_mask"] == [1] * 48
    batches = calibration.as_batches(a, batch_size=10)
    assert [tuple(t.shape) for t in batches] == [(10, 48), (10, 48), (5, 48)]


def test_calibration_too_little_text_names_the_fix(tiny_model, tmp_path):
    (tmp_path / "few.txt").write_text("Only a handful of words here.")
    cal = CalibrationSection(data=str(tmp_path / "few.txt"), samples=4, max_seq_len=512)
    with pytest.raises(StageFailed, match="fewer than one row of max_seq_len = 512") as err:
        calibration.token_rows(cal, tokenizer_of(tiny_model))
    assert "lower calibration.max_seq_len" in err.value.fix


def test_calibration_jsonl_and_chat_template(tiny_model, tmp_path):
    path = tmp_path / "cal.jsonl"
    path.write_text("\n".join(json.dumps({"body": f"Sentence number {i} about rivers and hills."}) for i in range(60)))
    tok = tokenizer_of(tiny_model)
    cal = CalibrationSection(data=str(path), text_field="body", samples=2, max_seq_len=32, chat_template=True)
    with pytest.raises(StageFailed, match="no chat template"):
        calibration.token_rows(cal, tok)
    tok.chat_template = "{% for m in messages %}<s>{{ m['content'] }}</s>{% endfor %}"
    rows = calibration.token_rows(cal, tok).rows
    assert len(rows) == 2 and tok.bos_token_id in rows[0]


# --- plan-time checks ---------------------------------------------------------------------------

def test_group_size_that_does_not_divide_576_is_an_error_with_the_fix(tmp_path):
    plan = plan_of(tmp_path, DEMO, '[[compress]]\nmethod = "gptq"\ngroup_size = 128\n')
    [problem] = plan.errors
    assert problem.message == ("group_size 128 does not divide the input width of q_proj (576), k_proj (576), "
                               "v_proj (576), o_proj (576), gate_proj (576), up_proj (576)")
    assert problem.hint == ("use group_size = 64, the largest power of two that divides every targeted layer's input "
                            "width; or leave these layers unquantized: ignore = [\"lm_head\", \"re:.*q_proj$\", "
                            "\"re:.*k_proj$\", \"re:.*v_proj$\", \"re:.*o_proj$\", \"re:.*gate_proj$\", \"re:.*up_proj$\"]")
    assert problem.where.endswith("compress[0].group_size")
    assert not plan_of(tmp_path, DEMO, '[[compress]]\nmethod = "gptq"\ngroup_size = 64\n').errors


def test_default_w4a16_group_and_block_sizes_are_checked_too(tmp_path):
    assert messages(plan_of(tmp_path, DEMO, '[[compress]]\nmethod = "gptq"\n'))[0].startswith("group_size 128 does not")
    awq = plan_of(tmp_path, DEMO, '[[compress]]\nmethod = "modelopt_int4_awq"\n')
    assert messages(awq)[0].startswith("block_size 128 does not divide the input width of q_proj (576)")
    assert "use block_size = 64" in awq.errors[0].hint
    assert not plan_of(tmp_path, DEMO, '[[compress]]\nmethod = "gptq"\nscheme = "W8A8"\n').errors


def test_ignoring_the_misfit_layers_satisfies_the_check(tmp_path):
    ignore = '["lm_head", "re:.*q_proj$", "re:.*k_proj$", "re:.*v_proj$", "re:.*o_proj$", "re:.*gate_proj$", "re:.*up_proj$"]'
    plan = plan_of(tmp_path, DEMO, f'[[compress]]\nmethod = "rtn"\ngroup_size = 128\nignore = {ignore}\n')
    assert not plan.errors


def test_two_quantization_steps_are_refused(tmp_path):
    plan = plan_of(tmp_path, DEMO, '[[compress]]\nmethod = "gptq"\ngroup_size = 64\n'
                                   '[[compress]]\nmethod = "fp8"\n')
    assert messages(plan) == ["a second quantization step (fp8) after gptq: quantized weights cannot be quantized again"]
    assert plan.errors[0].where.endswith("compress[1].method")


def test_pruning_after_quantization_is_refused_and_before_is_fine(tmp_path):
    after = plan_of(tmp_path, DEMO, '[[compress]]\nmethod = "awq"\ngroup_size = 64\n'
                                    '[[compress]]\nmethod = "prune_depth"\nlayers = 2\n')
    assert messages(after) == ["prune_depth comes after awq: pruning needs unquantized weights"]
    before = plan_of(tmp_path, DEMO, '[[compress]]\nmethod = "prune_depth"\nlayers = 2\n'
                                     '[[compress]]\nmethod = "gptq"\ngroup_size = 64\n')
    assert not before.errors
    assert [s.name for s in before.stages] == ["source", "compress.0.prune_depth", "compress.1.gptq"]


def test_pruned_shape_reaches_later_checks_and_estimates(tmp_path):
    plan = plan_of(tmp_path, DEMO, '[[compress]]\nmethod = "prune_width"\nintermediate_size = 960\n'
                                   '[[compress]]\nmethod = "prune_depth"\nlayers = 6\n'
                                   '[[compress]]\nmethod = "rtn"\ngroup_size = 128\n'
                                   'ignore = ["lm_head", "re:.*proj$"]\n')
    assert not plan.errors  # every linear ignored
    plan = plan_of(tmp_path, DEMO, '[[compress]]\nmethod = "prune_width"\nintermediate_size = 960\n'
                                   '[[compress]]\nmethod = "rtn"\ngroup_size = 64\nignore = ["lm_head", "re:.*down_proj$"]\n'
                                   '[[compress]]\nmethod = "prune_depth"\nlayers = 1\n')
    assert "prune_depth comes after rtn" in messages(plan)[0]
    plan = plan_of(tmp_path, DEMO, '[[compress]]\nmethod = "prune_width"\nintermediate_size = 960\n'
                                   '[[compress]]\nmethod = "prune_depth"\nlayers = 6\n'
                                   '[[compress]]\nmethod = "awq"\ngroup_size = 128\nignore = ["lm_head", "re:.*q_proj$", '
                                   '"re:.*k_proj$", "re:.*v_proj$", "re:.*o_proj$", "re:.*gate_proj$", "re:.*up_proj$"]\n')
    assert messages(plan) == ["group_size 128 does not divide the input width of down_proj (960)"]  # pruned width
    assert plan.model.num_layers == 24 and plan.model.intermediate_size == 960


def test_prune_option_errors(tmp_path):
    assert messages(plan_of(tmp_path, DEMO, '[[compress]]\nmethod = "prune_depth"\n')) == [
        "set exactly one of layers and fraction"]
    assert messages(plan_of(tmp_path, DEMO, '[[compress]]\nmethod = "prune_depth"\nlayers = 29\n')) == [
        "cannot drop 29 of 30 layers with 1 first and 1 last protected (28 can go)"]
    plan = plan_of(tmp_path, DEMO, '[[compress]]\nmethod = "prune_width"\nintermediate_size = 1000\n')
    assert messages(plan) == ["intermediate_size 1000 is not a multiple of 64"] and plan.errors[0].hint == "use 960"
    plan = plan_of(tmp_path, DEMO, '[[compress]]\nmethod = "prune_width"\nfraction = 0.3\n')
    assert plan.model.intermediate_size == 1024  # 1536 x 0.7 = 1075 -> 1024, a multiple of 64


def test_gpu_capability_warnings_only_without_serve(tmp_path):
    plan = plan_of(tmp_path, DEMO, '[[compress]]\nmethod = "fp8"\n', '[target]\ngpu = "A100-80GB"\n')
    [warning] = messages(plan, "warning")
    assert warning.startswith("FP8 compute needs compute capability >= 8.9; A100-80GB has 8.0")
    assert not messages(plan_of(tmp_path, DEMO, '[[compress]]\nmethod = "fp8"\n', '[target]\ngpu = "L4"\n'), "warning")


def test_modelopt_nvfp4_warns_that_it_is_emulated_without_cuda(tmp_path, monkeypatch):
    from llmopt.backends.compress import _modelopt

    monkeypatch.setattr(_modelopt, "cuda_present", lambda: False)
    plan = plan_of(tmp_path, DEMO, '[[compress]]\nmethod = "modelopt_nvfp4"\n')
    assert not plan.errors
    assert any(m.startswith("no CUDA GPU on this machine: ModelOpt's NVFP4 fake-quantization kernels cannot run here")
               for m in messages(plan, "warning"))
    monkeypatch.setattr(_modelopt, "cuda_present", lambda: True)
    assert not messages(plan_of(tmp_path, DEMO, '[[compress]]\nmethod = "modelopt_nvfp4"\n'), "warning")


def test_calibration_memory_warning(tmp_path, monkeypatch):
    monkeypatch.setattr(_checks, "available_ram", lambda: 2**20)
    plan = plan_of(tmp_path, DEMO, '[[compress]]\nmethod = "fp8_static"\n')
    [warning] = messages(plan, "warning")
    assert "calibration needs about" in warning and "0.0 GiB available" in warning
    assert not messages(plan_of(tmp_path, DEMO, '[[compress]]\nmethod = "fp8"\n'), "warning")  # no calibration


def test_calibration_memory_counts_float32_weights_where_the_method_computes_in_float32(tmp_path, monkeypatch):
    from llmopt.model import estimates

    need = {}

    def bytes_for(info, dtype, samples, seq_len, layerwise=True):
        need[dtype] = estimates.float_weight_bytes(info, dtype)
        return need[dtype]

    monkeypatch.setattr(_checks, "available_ram", lambda: 2**20)
    monkeypatch.setattr(estimates, "calibration_bytes", bytes_for)
    for method in ('"fp8_static"', '"prune_depth"\nlayers = 2'):
        [warning] = messages(plan_of(tmp_path, DEMO, f'[[compress]]\nmethod = {method}\n'), "warning")
        # the bfloat16 recipe's weights, widened on the CPU: 0.5 GiB, not 0.3
        assert f"about {need['float32'] / 2**30:.1f} GiB" in warning and "about 0.5 GiB" in warning, (method, warning)
        need.clear()


def packed_int4(rows: int, cols: int, group: int, zero_points: bool = False) -> int:
    """compressed-tensors pack-quantized int4, by hand: int32 words of 8 codes, a bf16 scale per group,
    int32-packed 4-bit zero points, the int64 shape."""
    zeros = -(-rows // 8) * 4 * (cols // group) if zero_points else 0  # 8 per int32 word, down the rows
    return rows * cols // 2 + rows * (cols // group) * 2 + zeros + 16


def test_estimates_follow_what_gptq_writes(tmp_path):
    bf16 = 'dtype = "bfloat16"'
    plan = plan_of(tmp_path, DEMO, '[[compress]]\nmethod = "gptq"\ngroup_size = 64\n', bf16)
    est = plan.estimates
    layer = 2 * packed_int4(576, 576, 64) + 2 * packed_int4(192, 576, 64) + 3 * packed_int4(1536, 576, 64)
    tensors = 30 * 7 * 3 + 1 + 61  # codes, scales, shape per linear; the tied embedding once; norms
    assert est["weight_bytes_after"] == 30 * layer + 49152 * 576 * 2 + 61 * 576 * 2 + tensors * 104
    assert est["model_size"]["stored"]["lm_head"].startswith("none of its own")  # ignored and tied: written once
    assert 2.2 < est["compression_ratio"] < 2.6  # the embeddings (37% of this model) stay bf16
    assert "calibration_memory_bytes" in est
    # asymmetric, and nothing ignored: zero points everywhere, and the tied head becomes a table of its own
    head = plan_of(tmp_path, DEMO, '[[compress]]\nmethod = "gptq"\ngroup_size = 64\nignore = []\nsymmetric = false\n',
                   bf16)
    zeros = 4 * (9 * (2 * 72 + 2 * 24 + 2 * 192) + 24 * 72)  # int32 words of 8 rows, a word per group
    grown = 30 * (zeros + 7 * 104) + packed_int4(49152, 576, 64, zero_points=True) + 4 * 104
    assert head.estimates["weight_bytes_after"] - est["weight_bytes_after"] == grown


def test_an_architecture_the_family_table_does_not_name_is_refused_for_every_method(tmp_path):
    folder = tmp_path / "gpt2ish"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "gpt_neox", "hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 4,
        "num_attention_heads": 8, "vocab_size": 1000}))
    (folder / "model.safetensors").write_bytes(b"")
    for step in ('[[compress]]\nmethod = "gptq"\n', '[[compress]]\nmethod = "prune_depth"\nlayers = 1\n'):
        assert "llmopt has no test of model family 'gpt_neox'" in messages(plan_of(tmp_path, folder, step))[0]


# --- real runs on the tiny model ----------------------------------------------------------------

def run_tiny(tmp_path, tiny_model, steps: str):
    body = recipe_text(tiny_model, steps, "[calibration]\nsamples = 4\nmax_seq_len = 64\n")
    return api.run(write_recipe(tmp_path, body), output_dir=tmp_path / "out")


def reload(folder):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[1, 5, 9, 30, 7]])).logits
    assert torch.isfinite(logits).all()
    return model


def test_prune_depth_runs_and_renumbers(tiny_model, tmp_path):
    result = run_tiny(tmp_path, tiny_model, '[[compress]]\nmethod = "prune_depth"\nlayers = 1\nprotect_first = 0\n'
                                            'protect_last = 0\n')
    outputs = result.records[1].outputs
    assert len(outputs["layer_scores"]) == 2 and all(0 <= s <= 1 for s in outputs["layer_scores"])
    kept = 1 - outputs["dropped_layers"][0]
    assert outputs["dropped_layers"] == [min(range(2), key=lambda i: outputs["layer_scores"][i])]
    config = json.loads((tmp_path / "out" / "model" / "config.json").read_text())
    assert config["num_hidden_layers"] == 1 and kept in (0, 1)
    model = reload(tmp_path / "out" / "model")
    assert len(model.model.layers) == 1 and model.model.layers[0].self_attn.layer_idx == 0
    assert outputs["parameters_after"] < outputs["parameters_before"]


def test_prune_width_keeps_the_important_neurons(tiny_model, tmp_path):
    result = run_tiny(tmp_path, tiny_model, '[[compress]]\nmethod = "prune_width"\nfraction = 0.5\nmultiple_of = 32\n')
    outputs = result.records[1].outputs
    assert outputs["intermediate_size_before"] == 128 and outputs["intermediate_size"] == 64
    model = reload(tmp_path / "out" / "model")
    mlp = model.model.layers[0].mlp
    assert mlp.gate_proj.weight.shape == (64, 64) and mlp.down_proj.weight.shape == (64, 64)


def test_rtn_on_the_tiny_model_keeps_library_logs_off_the_terminal(tiny_model, tmp_path, capfd):
    result = run_tiny(tmp_path, tiny_model, '[[compress]]\nmethod = "rtn"\nbits = 4\ngroup_size = 32\n')
    captured = capfd.readouterr()
    assert "llmcompressor" not in captured.out + captured.err and "accelerator" not in captured.out + captured.err
    q = json.loads((tmp_path / "out" / "model" / "config.json").read_text())["quantization_config"]
    assert q["quant_method"] == "compressed-tensors" and q["format"] == "pack-quantized"
    assert q["config_groups"]["group_0"]["weights"]["group_size"] == 32 and q["ignore"] == ["lm_head"]
    log = result.log_path.read_text()
    assert "llmcompressor: " in log  # the library's records are in the run log
    assert result.records[1].outputs["quantization"]["config_groups"]["group_0"]["weights"]["num_bits"] == 4
    reload(tmp_path / "out" / "model")


@pytest.mark.parametrize("steps", ['method = "fp8_static"', 'method = "prune_width"\nfraction = 0.5',
                                   'method = "modelopt_fp8"'])
def test_calibrating_methods_compute_in_float32_on_the_cpu_and_save_the_recipe_s_dtype(tiny_model, tmp_path, steps):
    """Static FP8, pruning and ModelOpt calibrate in float32 on a CPU, as AWQ and GPTQ do: on the demo model, one
    thread, FP8 static took 72.7 s in bfloat16 and 16.5 s in float32, width pruning 55.6 and 14.6 s (2026-12-06).
    The checkpoint's weights stay in the recipe's 16-bit dtype (ModelOpt's scales are float32 either way)."""
    from safetensors import safe_open

    method = steps.split('"')[1]
    result = run_tiny(tmp_path, tiny_model, f"[[compress]]\n{steps}\n")
    stage = next(r for r in result.records if r.name.startswith("compress."))
    assert stage.outputs["compute_dtype"] == "float32"
    assert result.plan.stage(stage.name).material["cpu_compute_dtype"] == "float32"
    folder = result.artifact / "model"
    with safe_open(str(next(folder.glob("*.safetensors"))), "pt") as f:
        weights = {str(f.get_tensor(name).dtype) for name in f.keys() if name.endswith(".weight")}
    assert "torch.float32" not in weights and "torch.bfloat16" in weights, (method, weights)  # scales may be float32


def test_awq_on_the_cpu_computes_in_float32_and_saves_the_recipe_s_dtype(tiny_model, tmp_path):
    """A bfloat16 recipe's AWQ runs in float32 on a CPU (bfloat16 products were 8x slower than float32 on an
    AVX2-only CPU: the quickstart's AWQ stage took over 25 minutes) and writes the checkpoint a bfloat16 run
    writes: bfloat16 tensors and scales, the recipe beside them."""
    from safetensors import safe_open

    result = run_tiny(tmp_path, tiny_model, '[[compress]]\nmethod = "awq"\ngroup_size = 32\n')
    stage = next(r for r in result.records if r.name == "compress.0.awq")
    assert stage.outputs["compute_dtype"] == "float32"
    assert result.plan.stage("compress.0.awq").material["cpu_compute_dtype"] == "float32"
    folder = result.artifact / "model"
    assert json.loads((folder / "config.json").read_text())["dtype"] == "bfloat16"
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        dtypes = {name.rsplit(".", 1)[-1]: str(f.get_tensor(name).dtype) for name in f.keys()}
    assert dtypes["weight_scale"] == dtypes["weight"] == "torch.bfloat16" and dtypes["weight_packed"] == "torch.int32"
    assert (folder / "recipe.yaml").is_file()
    reload(folder)


def test_autoround_learns_a_rounding_that_round_to_nearest_does_not_give(tiny_model, tmp_path):
    """Issue 37: AutoRound as a backend. Same integers and layout as RTN (so the ONNX export and the engines read
    it), but the rounding is tuned: some codes differ from RTN's at the same group size. Symmetric only: with zero
    points llm-compressor 0.14.0.1 stores each as 0 (on the H200, +196% to +428% perplexity), so the plan refuses."""
    from safetensors.torch import load_file

    steps = '[[compress]]\nmethod = "{}"\ngroup_size = 32\n'
    (tmp_path / "ar").mkdir()
    (tmp_path / "rtn").mkdir()
    tuned = run_tiny(tmp_path / "ar", tiny_model, steps.format("autoround") + "iters = 20\n")
    plain = run_tiny(tmp_path / "rtn", tiny_model, steps.format("rtn"))
    q = json.loads((tuned.artifact / "model" / "config.json").read_text())["quantization_config"]
    weights = q["config_groups"]["group_0"]["weights"]
    assert q["format"] == "pack-quantized" and (weights["num_bits"], weights["group_size"], weights["symmetric"]) == (4, 32, True)
    assert tuned.records[1].outputs["pipeline"] == "sequential"
    a, b = (load_file(r.artifact / "model" / "model.safetensors") for r in (tuned, plain))
    packed = [k for k in a if k.endswith("weight_packed")]
    assert packed and any(not a[k].equal(b[k]) for k in packed)
    reload(tuned.artifact / "model")
    with pytest.raises(RecipeError) as err:
        run_tiny(tmp_path, tiny_model, steps.format("autoround") + "symmetric = false\n")
    [problem] = err.value.problems
    assert problem.where.endswith("compress[0].symmetric") and "stores every zero point as 0" in problem.message


# --- the ModelOpt runtime's dequantization against ModelOpt's own reference code --------------

def test_modelopt_runtime_dequantizes_like_modelopt():
    pytest.importorskip("modelopt.torch.quantization")
    import torch
    from modelopt.torch.export.quant_utils import pack_int4_in_uint8
    from modelopt.torch.quantization.qtensor import NVFP4QTensor

    from llmopt.runtimes.modelopt import dequantize, nvfp4_fake_quant

    torch.manual_seed(0)
    w = torch.randn(32, 128)
    packed, block_scale, global_scale = NVFP4QTensor.quantize(w, 16)
    reference = packed.dequantize(dtype=torch.float32, scale=block_scale, double_scale=global_scale, block_sizes={-1: 16})
    tensors = {"m.weight_scale": block_scale, "m.weight_scale_2": global_scale}
    ours = dequantize(packed._quantized_data, tensors, "m", {"quant_algo": "NVFP4"})
    assert torch.allclose(ours, reference.float(), rtol=1e-5, atol=0)
    assert (ours - w).abs().max() < w.abs().max() * 0.2  # and it is close to the original

    x = torch.randn(4, 128) * 3
    g = x.abs().amax() / (6 * 448)
    expected, s, g2 = NVFP4QTensor.quantize(x, 16, weights_scaling_factor_2=g)
    expected = expected.dequantize(dtype=torch.float32, scale=s, double_scale=g2, block_sizes={-1: 16})
    assert torch.allclose(nvfp4_fake_quant(x, g), expected)

    scale = torch.rand(32, 2) * 0.1 + 0.01  # INT4 AWQ: one scale per block of 64
    ints = torch.randint(-8, 8, (32, 128)).float()
    packed = pack_int4_in_uint8(ints * scale.repeat_interleave(64, dim=1), scale, 64)
    ours = dequantize(packed, {"m.weight_scale": scale}, "m", {"quant_algo": "W4A16_AWQ"})
    assert torch.allclose(ours, ints * scale.repeat_interleave(64, dim=1))


def test_sparsegpt_warns_where_it_is_served_and_writes_a_2_4_pattern(tiny_model, tmp_path):
    steps = '[[compress]]\nmethod = "sparsegpt"\n[[compress]]\nmethod = "fp8"\n'
    served = plan_of(tmp_path, DEMO, steps + '[serve]\nbackend = "sglang"\nmax_model_len = 2048\n')  # an error too
    assert any(m.startswith("2:4 sparsity brings no speed or size gain") for m in messages(served, "warning"))
    studied = plan_of(tmp_path, DEMO, steps)  # no [serve]: what 2:4 costs in accuracy, which the warning's hint advises
    assert not studied.errors and not any(m.startswith("2:4 sparsity") for m in messages(studied, "warning"))
    run_tiny(tmp_path, tiny_model, '[[compress]]\nmethod = "sparsegpt"\n')
    model = reload(tmp_path / "out" / "model")
    weight = model.model.layers[0].mlp.up_proj.weight.detach()
    zeros_per_group = (weight.reshape(-1, 4) == 0).sum(dim=1)
    assert (zeros_per_group >= 2).all()
    assert (model.lm_head.weight == 0).float().mean() < 0.05  # ignored: dense (only the tied padding row is zero)
