"""[serve.speculative]: one recipe section mapped to vLLM's speculative-config, SGLang's --speculative-* options and
TensorRT-LLM's speculative_config; the plan errors for what cannot work; the memory model counting the draft; vLLM's
deprecated keys read as the section."""

from __future__ import annotations

import json

import pytest
import yaml

from llmopt.deploy import speculative

from test_deploy_configs import DEMO, planned, plan_errors, render

# a draft of the demo model's family: the same vocabulary, a quarter of its layers and half its width
DRAFT = DEMO | {"hidden_size": 288, "intermediate_size": 768, "num_hidden_layers": 8}


def draft_folder(tmp_path, config: dict = DRAFT, weights: int = 40_000_000):
    folder = tmp_path / "draft"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    with open(folder / "model.safetensors", "wb") as f:  # a sparse file of the draft's size; never read
        f.truncate(weights)
    return folder


def section(method: str, model=None, tokens: int = 4, extra: str = "") -> str:
    return (f'[serve.speculative]\nmethod = "{method}"\nnum_tokens = {tokens}\n'
            + (f'model = "{model}"\n' if model else "") + extra)


def warnings(plan) -> list[str]:
    return [p.message for p in plan.problems if p.severity == "warning"]


# --- each engine's spelling -----------------------------------------------------------------------------------

def test_ngram_in_each_engines_spelling(tmp_path):
    (tmp_path / "v").mkdir(), (tmp_path / "s").mkdir(), (tmp_path / "t").mkdir()
    vllm, out = render(tmp_path / "v", "vllm", section("ngram", extra="prompt_lookup_min = 2\n"))
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["speculative-config"] == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
                                            "prompt_lookup_max": 4}
    sglang, _ = render(tmp_path / "s", "sglang", section("ngram"))
    assert sglang["args"]["speculative-algorithm"] == "NGRAM" and sglang["args"]["speculative-num-draft-tokens"] == 5
    assert sglang["args"]["enable-metrics"] is True and "speculative-num-steps" not in sglang["args"]
    _, out = render(tmp_path / "t", "trtllm", section("ngram"))
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["speculative_config"] == {"decoding_type": "NGram", "max_draft_len": 4, "max_matching_ngram_size": 4}


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_a_draft_model_in_each_engines_spelling(tmp_path, engine):
    draft = draft_folder(tmp_path)
    result, out = render(tmp_path, engine, section("draft_model", draft, tokens=3))
    if engine == "vllm":
        assert result["args"]["speculative-config"] == {"method": "draft_model", "num_speculative_tokens": 3,
                                                        "model": str(draft)}
    elif engine == "sglang":
        args = result["args"]
        assert (args["speculative-algorithm"], args["speculative-draft-model-path"]) == ("STANDALONE", str(draft))
        assert (args["speculative-num-steps"], args["speculative-eagle-topk"], args["speculative-num-draft-tokens"]) \
            == (3, 1, 4)
        assert f"--speculative-draft-model-path {draft}" in (out / "launch.sh").read_text()
    else:
        config = yaml.safe_load((out / "config.yaml").read_text())
        assert config["speculative_config"] == {"decoding_type": "Draft_Target", "max_draft_len": 3,
                                                "speculative_model_dir": str(draft)}


def test_mtp_and_eagle3_names(tmp_path):
    assert speculative.sglang_args(speculative.Spec("mtp"))["speculative-algorithm"] == "NEXTN"
    assert speculative.trtllm_config(speculative.Spec("mtp", num_tokens=2)) == {"decoding_type": "MTP",
                                                                                 "max_draft_len": 2}
    assert speculative.trtllm_config(speculative.Spec("eagle3", "org/eagle3"))["decoding_type"] == "Eagle3"
    assert speculative.vllm_config(speculative.Spec("eagle3", "org/eagle3")) == {
        "method": "eagle3", "num_speculative_tokens": 3, "model": "org/eagle3"}


# --- what cannot work -----------------------------------------------------------------------------------------

def test_a_method_the_engine_lacks_is_a_plan_error(tmp_path):
    errors = plan_errors(tmp_path, "trtllm", section("eagle", "org/eagle-head"))
    assert any("TensorRT-LLM 1.2.1 cannot run speculative method 'eagle'" in e and "eagle3" in e for e in errors)


def test_llmopt_serve_has_no_speculation(tmp_path):
    plan, _ = planned(tmp_path, "ort", section("ngram"), target="")
    assert any("llmopt serve (ONNX Runtime) has no speculative decoding" in p.message for p in plan.errors)


def test_a_draft_with_another_vocabulary_is_a_plan_error(tmp_path):
    draft = draft_folder(tmp_path, DRAFT | {"vocab_size": 32000})
    errors = plan_errors(tmp_path, "vllm", section("draft_model", draft))
    assert any("the draft's vocabulary (32,000 tokens) differs from the target's (49,152)" in e for e in errors)


def test_a_draft_bigger_than_the_target_is_a_plan_error(tmp_path):
    draft = draft_folder(tmp_path, DEMO | {"num_hidden_layers": 60})
    errors = plan_errors(tmp_path, "sglang", section("draft_model", draft))
    assert any("is not smaller than the target" in e for e in errors)


@pytest.mark.parametrize("spec, message", [
    (section("eagle3"), "speculative method 'eagle3' needs a draft model"),
    (section("ngram", "org/draft"), "speculative method 'ngram' reads no draft model"),
    (section("draft_model", "./draft"), "the draft folder './draft' is relative"),
])
def test_the_draft_is_given_where_the_method_reads_one(tmp_path, spec, message):
    assert any(message in e for e in plan_errors(tmp_path, "vllm", spec))


def test_an_unreachable_hub_draft_is_a_warning(tmp_path):
    plan, _ = planned(tmp_path, "vllm", section("eagle3", "org/not-in-the-cache"))
    assert not plan.errors and any("could not be read" in w for w in warnings(plan))


# --- the memory model -----------------------------------------------------------------------------------------

def test_the_memory_model_counts_the_drafts_weights_and_kv_cache(tmp_path):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    plain, _ = render(tmp_path / "a", "vllm")
    draft = draft_folder(tmp_path / "b", weights=400_000_000)
    drafted, _ = render(tmp_path / "b", "vllm", section("draft_model", draft))
    before, after = plain["memory"], drafted["memory"]
    assert "draft" not in before
    assert after["draft"]["weight_bytes"] == 400_000_000 and after["tensor_parallel_size"] == 1
    assert after["weight_bytes_per_gpu"] == before["weight_bytes_per_gpu"] + 400_000_000
    # the draft's 8 layers of 3 KV heads of 32 values (288 / 9 heads), K and V, bf16, beside the target's 30 of 64
    assert after["draft"]["kv_bytes_per_token_per_gpu"] == 8 * 2 * 3 * 32 * 2
    assert before["kv_bytes_per_token_per_gpu"] == 30 * 2 * 3 * 64 * 2
    assert after["kv_bytes_per_token_per_gpu"] == before["kv_bytes_per_token_per_gpu"] + 8 * 2 * 3 * 32 * 2
    assert after["kv_tokens"] < before["kv_tokens"]


def test_ngram_adds_nothing_and_mtp_adds_one_layer(tmp_path):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    ngram, _ = render(tmp_path / "a", "vllm", section("ngram"))
    assert "draft" not in ngram["memory"]
    mtp, _ = render(tmp_path / "b", "vllm", section("mtp"))
    assert mtp["memory"]["draft"]["weight_bytes"] == 0
    assert mtp["memory"]["draft"]["kv_bytes_per_token_per_gpu"] == mtp["memory"]["kv_bytes_per_token_per_gpu"] // 31


# --- vLLM's deprecated keys -----------------------------------------------------------------------------------

def test_vllms_old_keys_still_work_with_a_deprecation_warning(tmp_path):
    (tmp_path / "old").mkdir(), (tmp_path / "new").mkdir()
    old, _ = render(tmp_path / "old", "vllm", 'speculative_method = "ngram"\nnum_speculative_tokens = 4\n')
    new, _ = render(tmp_path / "new", "vllm", section("ngram"))
    assert old["args"]["speculative-config"] == new["args"]["speculative-config"]
    plan, _ = planned(tmp_path / "old", "vllm", 'speculative_method = "ngram"\n')
    assert any("deprecated" in w for w in warnings(plan))


def test_both_the_old_keys_and_the_section_is_an_error(tmp_path):
    errors = plan_errors(tmp_path, "vllm", 'speculative_method = "ngram"\n' + section("ngram"))
    assert any("speculative decoding is set twice" in e for e in errors)
