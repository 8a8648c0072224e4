"""Deploy stage: launch configs and deployment files for every engine, what each engine declares
it serves, plan-time memory checks, and `llmopt verify`."""

from __future__ import annotations

import json
import logging
import re
import secrets
from pathlib import Path

import pytest
import yaml

from llmopt import api
from llmopt.cli.main import main

from conftest import ROOT, link_tree, make_tiny_llama, tiny_recipe, write_recipe

SERVE = """
[target]
gpu = "H100-SXM-80GB"
count = 2

[serve]
backend = "vllm"
max_model_len = 512
workload = {{ input_len = 128, output_len = 64, concurrency = 32 }}
{extra}
"""
LLAMA_70B = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 8192, "intermediate_size": 28672,
    "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256,
    "tie_word_embeddings": False, "max_position_embeddings": 131072, "torch_dtype": "bfloat16",
}
DEMO = dict(LLAMA_70B, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
            num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True, max_position_embeddings=8192)


def serve_recipe(tmp_path: Path, model: Path, extra: str = "") -> Path:
    return write_recipe(tmp_path, tiny_recipe(model, windows=2) + SERVE.format(extra=extra))


def config_only(tmp_path: Path, config: dict, name: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"not really weights")  # the planner never reads weights
    return folder


def generated(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()]


def test_every_engine_writes_parseable_configs_without_secrets(tiny_model, tmp_path, monkeypatch):
    token = "hf_" + secrets.token_hex(16)
    monkeypatch.setenv("HF_TOKEN", token)
    monkeypatch.delenv("LLMOPT_VLLM_PYTHON", raising=False)
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    recipe = serve_recipe(tmp_path, tiny_model)
    for engine in ("vllm", "trtllm", "sglang"):
        out = tmp_path / engine
        api.run(recipe, overrides=[f"serve.backend={engine!r}"], output_dir=out)
        manifest = json.loads((out / "manifest.json").read_text())
        deploy, folder = manifest["deploy"], out / "deploy" / engine
        assert deploy["engine"] == engine and deploy["command"]
        assert manifest["hardware"]["serving_gpus"] == deploy["gpus"] == 1
        assert 'answers to `model="tiny"`' in (out / "README.md").read_text()  # the served model name
        assert deploy["validated_by"].startswith("flag table")
        assert deploy["memory"]["tensor_parallel_size"] == 1  # the tiny model fits one H100
        # the engine's own default (the tiny model's KV cache holds far more), not the workload's concurrency 32
        assert deploy["memory"]["max_num_seqs"] == {"vllm": 1024, "trtllm": 2048, "sglang": 4096}[engine]
        assert deploy["memory"]["max_model_len"] == 512
        for path in folder.glob("*.yaml"):
            docs = list(yaml.safe_load_all(path.read_text()))
            assert docs and all(isinstance(d, dict) for d in docs), path
        for doc in yaml.safe_load_all((folder / "kubernetes.yaml").read_text()):
            kubernetes_validate.validate(doc, "1.37.0", strict=True)  # raises on any schema violation
        deployment = next(yaml.safe_load_all((folder / "kubernetes.yaml").read_text()))
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert {"readinessProbe", "livenessProbe"} <= set(container)
        assert container["env"][0]["valueFrom"]["secretKeyRef"]["name"] == "hf-token"
        compose = yaml.safe_load((folder / "docker-compose.yaml").read_text())
        service = next(iter(compose["services"].values()))
        assert service["deploy"]["resources"]["reservations"]["devices"][0]["count"] == 1
        assert service["environment"]["HF_TOKEN"] == "${HF_TOKEN:-}"
        assert (folder / "launch.sh").stat().st_mode & 0o777 == 0o755
        assert all(f.stat().st_mode & 0o777 == 0o644 for f in folder.iterdir() if f.name != "launch.sh")
        for path in generated(out):
            assert token.encode() not in path.read_bytes(), f"{path} holds the HF token"
    vllm = yaml.safe_load((tmp_path / "vllm" / "deploy" / "vllm" / "config.yaml").read_text())
    assert vllm["max-model-len"] == 512 and vllm["gpu-memory-utilization"] == 0.92  # vLLM 0.33's default
    trt = yaml.safe_load((tmp_path / "trtllm" / "deploy" / "trtllm" / "config.yaml").read_text())
    # TensorRT-LLM 1.2.1's own 0.9 of what the weights and activations leave
    assert trt["max_seq_len"] == 512 and trt["kv_cache_config"]["free_gpu_memory_fraction"] == 0.9
    sglang = json.loads((tmp_path / "sglang" / "manifest.json").read_text())["deploy"]["args"]
    # SGLang 0.5.23's own on an H100 (81,101 MiB): a reserve of max(512 + 8192 x 1.5 + 256 x 2 + 128, 10240) MiB
    assert sglang["context-length"] == 512 and sglang["mem-fraction-static"] == round(1 - 13440 / 81100.8, 3) == 0.834
    assert "--mem-fraction-static" in (tmp_path / "sglang" / "deploy" / "sglang" / "launch.sh").read_text()


def test_verify_passes_untouched_and_fails_on_changes(tiny_model, tmp_path, capsys):
    out = tmp_path / "art"
    api.run(serve_recipe(tmp_path, tiny_model), output_dir=out)
    assert main(["verify", str(out)]) == 0
    assert "files match manifest.json" in capsys.readouterr().out
    code = main(["verify", str(out), "--format", "json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["ok"] and report["checked"] >= 8
    config = out / "deploy" / "vllm" / "config.yaml"
    config.write_text(config.read_text().replace("max-num-seqs: 1024", "max-num-seqs: 64"))
    (out / "reports" / "report.md").unlink()
    (out / "notes.txt").write_text("added later")
    code = main(["verify", str(out), "--format", "json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and not report["ok"]
    assert report["changed"] == ["deploy/vllm/config.yaml"]
    assert report["missing"] == ["reports/report.md"] and report["extra"] == ["notes.txt"]
    assert main(["verify", str(out)]) == 1
    assert "does not match its manifest: 1 changed, 1 missing, 1 extra" in capsys.readouterr().err
    assert main(["verify", str(tmp_path)]) == 2  # no manifest.json: not an artifact


def test_plan_refuses_what_does_not_fit(tmp_path):
    folder = config_only(tmp_path, LLAMA_70B, "llama-70b")
    recipe = write_recipe(tmp_path, f'schema_version = 1\nname = "big"\n[model]\nsource = "{folder}"\n'
                                    '[target]\ngpu = "L40S"\ncount = 2\n[serve]\nbackend = "vllm"\nmax_model_len = 8192\n')
    errors = api.plan(recipe).errors
    assert len(errors) == 1 and "does not fit on 2 x L40S" in errors[0].message
    assert "weights take 65.7 GiB per GPU" in errors[0].message  # 131.4 GiB over tp 2; L40S budget 40 GiB
    assert "set [target] count = 4 (tensor parallel 4)" in errors[0].hint
    assert not api.plan(recipe, ["target.count=4"]).errors


def test_plan_checks_tensor_parallel_size_and_context(tmp_path):
    folder = config_only(tmp_path, DEMO, "demo")
    recipe = write_recipe(tmp_path, f'schema_version = 1\nname = "demo"\n[model]\nsource = "{folder}"\n'
                                    '[target]\ngpu = "H100"\ncount = 4\n[serve]\nbackend = "vllm"\n'
                                    'tensor_parallel_size = 2\nmax_model_len = 16384\n')
    messages = [p.message for p in api.plan(recipe).errors]
    assert any("exceeds the model's context of 8192" in m for m in messages)
    assert any("tensor_parallel_size 2 does not split 9 attention heads / 3 KV heads" in m for m in messages)
    assert not api.plan(recipe, ["serve.tensor_parallel_size=3", "serve.max_model_len=8192"]).errors


def test_engines_need_a_gpu_and_known_options(tiny_model, tmp_path):
    recipe = write_recipe(tmp_path, tiny_recipe(tiny_model) + '[serve]\nbackend = "sglang"\n'
                                    'extra_args = { "mem-fraction-statik" = 0.5 }\n')
    messages = " ".join(p.message for p in api.plan(recipe).errors)
    assert "written for a GPU, but [target] names none" in messages
    assert "unknown option 'mem-fraction-statik'" in messages


def served(tmp_path, tiny_model, engine: str, steps: str, gpu: str | None, export: str = "") -> list:
    """The plan's problems about handing the recipe's stages to ``engine``."""
    if engine == "ort" and not export:
        export = 'format = "onnx"\nexecution_provider = "cuda"'  # ort serves ONNX models; judge the method alone
    body = tiny_recipe(tiny_model) + "".join(f"[[compress]]\n{step}\n" for step in steps.split(";") if step)
    body += f"[export]\n{export}\n" if export else ""
    body += f'[target]\ngpu = "{gpu}"\n' if gpu else ""
    recipe = write_recipe(tmp_path, body + f'[serve]\nbackend = "{engine}"\nmax_model_len = 256\n')
    return [p for p in api.plan(recipe).problems if f"served by {engine}" in p.message]


@pytest.mark.parametrize("engine, steps, gpu, severity, text", [
    ("vllm", 'method = "fp8"', "T4", "warning", "run it weight-only"),
    ("vllm", 'method = "fp8"', "L4", None, ""),
    ("vllm", 'method = "gptq"\ngroup_size = 32', "T4", "warning", "Marlin int4 kernels need CC 8.0"),
    ("vllm", 'method = "gptq"\nscheme = "W8A8"', "T4", None, ""),  # INT8 W8A8 runs from CC 7.5
    ("vllm", 'method = "nvfp4"', "H100", "warning", "weight-only, the FP4 weights through its Marlin kernel"),
    ("vllm", 'method = "nvfp4"', "B200", None, ""),
    ("vllm", 'method = "modelopt_int4_awq"\nblock_size = 32', "H100", "error", "not INT4 AWQ"),
    ("vllm", 'method = "modelopt_int8_sq"', "H100", "error", "not INT8 SmoothQuant"),
    ("vllm", 'method = "int8_sq"', "T4", None, ""),
    ("vllm", 'method = "sparsegpt";method = "gptq"\ngroup_size = 32', "H100", "error", "removed from vLLM"),
    ("trtllm", 'method = "modelopt_fp8"', "A100-80GB", "error", "Ada, Hopper or Blackwell"),
    ("trtllm", 'method = "modelopt_fp8"', "L40S", None, ""),
    ("trtllm", 'method = "modelopt_nvfp4"', "H100", "error", "Blackwell"),
    ("trtllm", 'method = "int8_sq"', "H100", "error", "legacy engine path"),
    ("trtllm", 'method = "modelopt_int8_sq"', "H100", "error", "legacy engine path"),
    ("trtllm", 'method = "gptq"\ngroup_size = 32', "H100", "warning", "not compressed-tensors"),
    ("sglang", 'method = "modelopt_fp8"', "A100-80GB", "error", "needs CC 8.9"),  # SGLang 0.5.23: min capability 89
    ("sglang", 'method = "modelopt_fp8"', "L40S", None, ""),
    ("sglang", 'method = "modelopt_int4_awq"\nblock_size = 32', "H100", "error", "not INT4 AWQ"),
    ("sglang", 'method = "modelopt_int8_sq"', "H100", "error", "not INT8 SmoothQuant"),
    ("sglang", 'method = "fp8"', "H100", None, ""),
    # the tiny model's o_proj (K 64, N 64) fits none of SGLang's Marlin tiles (test_sglang_marlin_tiles)
    ("sglang", 'method = "gptq"\ngroup_size = 32', "H100", "error", "Marlin kernels have no tile for o_proj (K 64, N 64)"),
    ("ort", 'method = "modelopt_nvfp4"', None, "error", "does not read ModelOpt NVFP4"),
    ("ort", 'method = "fp8"', None, "error", "CUDA execution provider"),
    ("ort", 'method = "rtn"\nbits = 8\ngroup_size = 32', "L4", "error", "not W8A16"),
])
def test_what_serves_what(tiny_model, tmp_path, engine, steps, gpu, severity, text):
    problems = served(tmp_path, tiny_model, engine, steps, gpu)
    if severity is None:
        assert problems == []
    else:
        assert [p.severity for p in problems] == [severity], problems
        assert text in problems[0].message and problems[0].where.endswith(".method")


def test_sglang_marlin_tiles():
    """Seen on an H100 (2026-12-06): SGLang 0.5.17, started from the launch.sh llmopt wrote for
    recipes/gptq-w4a16-vllm.toml with serve.backend = "sglang", died at its first forward pass: "Invalid thread
    config ... for MKN = [8192, 576, 960]", the demo model's qkv_proj, which fits none of its Marlin kernel's tiles.
    The plan now refuses it, naming the layers (per GPU at tensor parallel); shapes that tile (Llama-3-8B's, alone
    and over 8 GPUs) pass."""
    from llmopt.backends.serve.sglang import marlin_misfits
    from llmopt.model.modelinfo import from_config

    def llama(hidden, inter, heads, kv, head_dim=None):
        return from_config({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": hidden,
                            "intermediate_size": inter, "num_hidden_layers": 2, "num_attention_heads": heads,
                            "num_key_value_heads": kv, "vocab_size": 1000, "head_dim": head_dim or hidden // heads})

    demo = llama(576, 1536, 9, 3)
    assert "qkv_proj (K 576, N 960), o_proj (K 576, N 576):" in marlin_misfits(demo)
    eight_b = llama(4096, 14336, 32, 8)
    assert marlin_misfits(eight_b) is None and marlin_misfits(eight_b, 8) is None
    split = llama(1024, 2880, 16, 8)  # down_proj's input tiles whole, not halved over two GPUs
    assert marlin_misfits(split) is None
    assert "no tile for down_proj (K 1440, N 1024) at tensor parallel 2:" in marlin_misfits(split, 2)
    problems = api.plan(ROOT / "recipes" / "gptq-w4a16-vllm.toml", ["serve.backend=sglang"]).errors
    assert [p.where.split(": ")[-1] for p in problems] == ["compress[0].method"]
    assert "served by sglang: SGLang's Marlin kernels have no tile for qkv_proj" in problems[0].message
    assert 'serve.backend = "vllm"' in problems[0].hint


@pytest.mark.parametrize("engine", ["vllm", "trtllm", "sglang"])
def test_gpu_engines_refuse_onnx_and_ort_needs_it(tiny_model, tmp_path, engine):
    [problem] = served(tmp_path, tiny_model, engine, "", "H100", export='format = "onnx"')
    assert "does not serve ONNX models" in problem.message and problem.where.endswith("export.format")
    assert problem.hint == 'use serve.backend = "ort"'
    recipe = write_recipe(tmp_path, tiny_recipe(tiny_model) + '[serve]\nbackend = "ort"\nmax_model_len = 256\n')
    [problem] = [p for p in api.plan(recipe).problems if "serves ONNX models" in p.message]
    assert problem.where.endswith("serve.backend") and problem.hint == 'set [export] format = "onnx"'


def test_plan_warns_for_fp8_on_turing(tiny_model, tmp_path):
    recipe = write_recipe(tmp_path, tiny_recipe(tiny_model) + '[[compress]]\nmethod = "fp8"\n[target]\ngpu = "T4"\n'
                                    '[serve]\nbackend = "vllm"\nmax_model_len = 512\n')
    warnings = [p.message for p in api.plan(recipe).problems if p.severity == "warning"]
    assert any("fp8 output (compressed-tensors FP8 W8A8) served by vllm on T4 (CC 7.5)" in w for w in warnings)


@pytest.mark.slow
def test_every_shipped_serve_recipe_gets_deploy_configs(request, tmp_path, isolated_cache, monkeypatch):
    monkeypatch.delenv("LLMOPT_VLLM_PYTHON", raising=False)
    link_tree(request.getfixturevalue("demo_seed"), isolated_cache)  # the GGUF recipe's float32 conversion
    shipped = [r for r in api.shipped_recipes() if re.search(r"(?m)^\[serve\]", Path(r["path"]).read_text())]
    assert len(shipped) >= 2
    # the recipes as shipped on a small model of the same family (every width a multiple of 128, so each
    # group size divides it; six layers, so depth pruning has some to drop), with less calibration data and
    # no evals: this test is about the deploy files and the size model; the compression of the demo model is
    # tests/test_compress_models.py's, the gates the quickstart's. A recipe that carries the GGUF file's own
    # blocks keeps its GGUF source.
    small = make_tiny_llama(tmp_path / "small", hidden=128, intermediate=256, layers=6, context=8192)
    smaller = ["eval=[]", "calibration.samples=4", "calibration.max_seq_len=64"]
    for item in shipped:
        out = tmp_path / item["name"]
        keeps_gguf = "gguf_blocks" in Path(item["path"]).read_text()
        text = Path(item["path"]).read_text()
        # a draft cut from six layers, and a token of training: the draft's deploy files are what is tested here
        drafted = ["draft[0].layers=3", "draft[1].steps=1"] if "[[draft]]" in text else []
        result = api.run(item["path"], smaller + drafted + ([] if keeps_gguf else [f'model.source="{small}"']),
                         output_dir=out)
        manifest = json.loads((out / "manifest.json").read_text())
        engine = result.plan.recipe.recipe.serve.backend
        assert manifest["deploy"]["engine"] == engine and manifest["deploy"]["command"] in (out / "README.md").read_text()
        assert (out / "deploy" / engine / "launch.sh").is_file()
        assert main(["verify", str(out)]) == 0
        written = sum(p.stat().st_size for p in (out / "model").rglob("*") if p.is_file())
        estimate = result.plan.estimates["artifact_bytes"]
        assert abs(estimate / written - 1) < 0.05, f"{item['name']}: estimated {estimate:,} B, wrote {written:,} B"


@pytest.mark.slow
def test_ort_overlay_is_accepted_by_onnxruntime_genai(tiny_model, tmp_path):
    import subprocess
    import sys

    og = pytest.importorskip("onnxruntime_genai")
    from llmopt import registry
    from llmopt.backends.base import StageContext
    from llmopt.errors import StageFailed

    onnx = tmp_path / "onnx"
    subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-m", str(tiny_model), "-i",
                    str(tiny_model), "-o", str(onnx), "-p", "fp32", "-e", "cpu", "-c", str(tmp_path / "hf")],
                   check=True, capture_output=True, timeout=600)
    recipe = write_recipe(tmp_path, tiny_recipe(tiny_model) + '[target]\ngpu = "L4"\n'
                                    '[serve]\nbackend = "ort"\nmax_model_len = 256\nintra_op_num_threads = 2\n')
    for overrides, provider in (([], "cpu"), (['serve.provider="cuda"'], None)):
        plan = api.plan(recipe, overrides)  # its own check says ort needs [export] format = "onnx"
        folder = tmp_path / f"deploy-{provider}"
        folder.mkdir()
        ctx = StageContext(name="deploy.ort", out_dir=folder, inputs={"model": onnx},
                           input_manifests={"model": {"outputs": {"model_dir": str(onnx), "format": "onnx"}}},
                           recipe=plan.recipe, log=logging.getLogger("llmopt.test"), model=plan.model, gpu=plan.gpu)
        if provider is None:  # the graph is built for the CPU: a GPU target does not switch it to CUDA
            with pytest.raises(StageFailed, match="built for the cpu execution provider"):
                registry.get("serve", "ort")().render(plan.recipe.options_for("serve"), ctx)
            continue
        deploy = registry.get("serve", "ort")().render(plan.recipe.options_for("serve"), ctx)
        assert deploy["provider"] == provider and deploy["validated_by"].startswith("onnxruntime-genai 0.18")
        merged = json.loads((folder / "genai_config.json").read_text())
        session = merged["model"]["decoder"]["session_options"]
        exported = json.loads((onnx / "genai_config.json").read_text())["model"]["decoder"]["session_options"]
        assert session.get("provider_options") == exported.get("provider_options")  # the export's, kept
        assert session["intra_op_num_threads"] == 2 and merged["search"]["max_length"] == 256
        assert merged["model"]["decoder"]["num_hidden_layers"] == 2  # the rest of the model's config is kept
    run = tmp_path / "run"  # what launch.sh builds: links to model/ plus the adapted genai_config.json
    run.mkdir()
    for f in onnx.iterdir():
        (run / f.name).symlink_to(f)
    (run / "genai_config.json").unlink()
    (run / "genai_config.json").write_text((tmp_path / "deploy-cpu" / "genai_config.json").read_text())
    model = og.Model(str(run))  # loads on the CPU provider
    assert len(og.Tokenizer(model).encode("the river")) > 0
