"""Compression on tiny models of the families whose layout differs from Llama's (tests/families.py, through the
``family_model`` fixture, which tests/test_families.py shares), CPU.

Each test runs a recipe through ``llmopt.api.run`` (calibration: 8 rows of 64 tokens; eval: 4 windows of 64
tokens of builtin:prose-eval) and checks that the candidate, loaded back from disk, scores within a few % of the
source. Every case failed before, loudly or silently:

* AWQ and SmoothQuant on OLMo 2 (norms after attention and the MLP, none before q/k/v): llm-compressor had no
  mappings for it;
* 4-bit experts with zero points, or beside layers kept at 8 bits (Qwen 3 MoE): transformers' own dequantizing of
  experts failed to load the first and read the second at the wrong width (perplexity x17);
* Mixtral: the checkpoint named its experts gate_proj / up_proj / down_proj, which transformers skipped and
  filled with random experts (+45%, every method);
* SmoothQuant on Gemma 2 folded the MLP's scales into the norm of the attention's output (+34%);
* a ModelOpt export of a MoE (Qwen 3 MoE): its experts' input scales named modules the loaded model no longer has.

And width pruning narrows Phi-3's fused gate_up_proj (it refused: "no gate/up/down MLP").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from conftest import module_folder
from families import recipe
from llmopt import api



@dataclass
class Outcome:
    baseline: float
    candidate: float
    model: Path

    @property
    def increase_pct(self) -> float:
        return 100 * (self.candidate / self.baseline - 1)


class Lab:
    """Runs recipes on tiny family models, on one stage cache (each source's baseline is scored once)."""

    def __init__(self, root: Path, family_model):
        self.root, self.model = root, family_model

    def run(self, family: str, name: str, steps: str) -> Outcome:
        path = self.root / f"{family}-{name}.toml"
        path.write_text(recipe(f"{family}-{name}", self.model(family), steps, window=64, windows=4))
        result = api.run(path, cache_dir=self.root / "cache", output_dir=self.root / f"{family}-{name}")
        stages = {r.name: r.outputs for r in result.records}
        return Outcome(stages["eval.prose.baseline"]["value"], stages["eval.prose.candidate"]["value"],
                       result.artifact / "model")


@pytest.fixture(scope="module")
def lab(request, tmp_path_factory, family_model) -> Iterator[Lab]:
    with module_folder(request, tmp_path_factory, "compress-families") as folder:
        yield Lab(folder, family_model)


def tensor_names(model: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(model / "model.safetensors", "pt") as f:
        return list(f.keys())


def test_awq_and_smoothquant_run_on_olmo2_whose_norms_follow_attention_and_mlp(lab):
    awq = lab.run("olmo2", "awq", '[[compress]]\nmethod = "awq"\ngroup_size = 32\nn_grid = 4\n')
    assert abs(awq.increase_pct) < 10, awq.increase_pct
    sq = lab.run("olmo2", "int8-sq", '[[compress]]\nmethod = "int8_sq"\n')
    assert abs(sq.increase_pct) < 5, sq.increase_pct


def test_int4_experts_with_zero_points_or_kept_layers_reload_as_quantized(lab):
    gptq = lab.run("qwen3_moe", "gptq-asym", '[[compress]]\nmethod = "gptq"\ngroup_size = 32\nsymmetric = false\n')
    assert abs(gptq.increase_pct) < 10, gptq.increase_pct
    awq = lab.run("qwen3_moe", "awq-kept", '[[compress]]\nmethod = "awq"\ngroup_size = 32\nn_grid = 4\n'
                  'sensitive_layers = 2\n')
    assert abs(awq.increase_pct) < 10, awq.increase_pct


def test_a_modelopt_export_of_a_moe_is_scored(lab):
    # the experts' input scales have no module to go to once transformers fuses the experts: they were an error
    fp8 = lab.run("qwen3_moe", "modelopt-fp8", '[[compress]]\nmethod = "modelopt_fp8"\n')
    assert abs(fp8.increase_pct) < 10, fp8.increase_pct


def test_a_mixtral_checkpoint_keeps_mixtral_s_expert_names(lab):
    rtn = lab.run("mixtral", "rtn", '[[compress]]\nmethod = "rtn"\ngroup_size = 32\n')
    experts = [name for name in tensor_names(rtn.model) if ".experts.0." in name]
    assert "model.layers.0.block_sparse_moe.experts.0.w1.weight_packed" in experts, experts
    assert not [name for name in experts if "_proj" in name], experts
    assert abs(rtn.increase_pct) < 10, rtn.increase_pct


def test_smoothquant_on_gemma2_scales_the_norm_the_mlp_reads(lab):
    sq = lab.run("gemma2", "int8-sq", '[[compress]]\nmethod = "int8_sq"\n')
    assert abs(sq.increase_pct) < 5, sq.increase_pct


def test_width_pruning_narrows_phi3_s_fused_gate_up_projection():
    """The narrowed MLP computes what the whole one does with the dropped neurons' down_proj columns zeroed."""
    import copy

    import torch
    import transformers
    from transformers.models.phi3.modeling_phi3 import Phi3MLP

    from llmopt.backends.compress.prune_width import shrink_mlp

    torch.manual_seed(0)
    mlp = Phi3MLP(transformers.Phi3Config(hidden_size=32, intermediate_size=64, num_attention_heads=2))
    keep = torch.randperm(64)[:32].sort().values
    masked = copy.deepcopy(mlp)
    dropped = sorted(set(range(64)) - set(keep.tolist()))
    x = torch.randn(4, 32)
    with torch.no_grad():
        masked.down_proj.weight[:, dropped] = 0
        expected = masked(x)
        shrink_mlp(mlp, keep)
        got = mlp(x)
    assert mlp.gate_up_proj.weight.shape == (64, 32) and mlp.down_proj.weight.shape == (32, 32)
    torch.testing.assert_close(got, expected)


def test_depth_pruning_renumbers_the_dense_layers_of_a_qwen_moe(tmp_path):
    """Qwen 3 MoE names its dense layers by index (mlp_only_layers, decoder_sparse_step): after a cut, the saved
    config gives every kept layer the MLP it had, and the reloaded model computes what the cut one did."""
    import torch
    import transformers

    from llmopt.backends.compress.prune_depth import drop_layers

    config = transformers.Qwen3MoeConfig(hidden_size=32, intermediate_size=64, moe_intermediate_size=32,
                                         num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
                                         head_dim=16, vocab_size=64, num_experts=4, num_experts_per_tok=2,
                                         decoder_sparse_step=2, mlp_only_layers=[3])
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(config).eval()  # routed: layer 1 only (3 is named dense)
    drop_layers(model, [0])
    model.save_pretrained(tmp_path)
    reloaded = transformers.Qwen3MoeForCausalLM.from_pretrained(tmp_path).eval()
    saved = reloaded.config
    assert (saved.num_hidden_layers, saved.mlp_only_layers, saved.decoder_sparse_step) == (3, [1, 2], 1)
    kinds = [type(layer.mlp).__name__ for layer in reloaded.model.layers]
    assert kinds == ["Qwen3MoeSparseMoeBlock", "Qwen3MoeMLP", "Qwen3MoeMLP"], kinds
    ids = torch.tensor([[1, 5, 9, 2, 7]])
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, model(input_ids=ids).logits)


def test_width_pruning_is_refused_for_routed_experts_and_depth_pruning_is_not_by_the_backend(family_model, tmp_path):
    """A MoE's MLPs are experts, which prune_width cannot narrow: refused once (the family table's reason for a family
    it lists, the backend's own check for one it does not); prune_depth cuts any decoder (the family table may still
    refuse it where it has no test)."""
    model = family_model("qwen3_moe")
    messages = {}
    for method in ("prune_width", "prune_depth"):
        path = tmp_path / f"{method}.toml"
        path.write_text(recipe(method, model, f'[[compress]]\nmethod = "{method}"\nfraction = 0.5\n', 64, 4))
        plan = api.plan(path, cache_dir=tmp_path / "cache")
        messages[method] = [p.message for p in plan.problems if p.severity == "error"]
    assert sum("routed experts" in m for m in messages["prune_width"]) == 1, messages  # said once, not twice
    assert not any(m.startswith("prune_depth") for m in messages["prune_depth"]), messages
