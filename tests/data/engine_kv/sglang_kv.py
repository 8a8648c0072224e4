"""KV bytes per token per GPU from SGLang 0.5.23's own sizing code, on a CPU, for every config in
tests/data/configs at tensor parallel 1 and 8 and kv_cache_dtype "auto" and "fp8_e4m3": the record
``sglang-0.5.23.json`` beside this file, which tests/test_engine_kv.py compares llmopt's memory model with.
The suite does not run this script (its environment is SGLang's, about 50 packages); run it to check the
record against a new SGLang:

    python3 -m venv /tmp/sgl && /tmp/sgl/bin/pip install torch==2.13.0
    /tmp/sgl/bin/pip install --no-deps sglang==0.5.23
    for p in in numpy==2.4.6 orjson==3.13.0 psutil==7.2.2 pybase64==1.5.1 requests==2.34.2 urllib3==2.8.0 idna==3.20 certifi==2026.10.19.post1 triton==3.9.0 packaging==26.4 pillow==13.0.0 starlette==1.10.0 anyio==4.16.0 msgspec==0.23.0 pydantic-core==2.50.5 pyzmq==27.3.0 tqdm==4.70.1 ipython==9.18.1 traitlets==5.16.1 pygments==2.21.0 pydantic==2.14.4 typing-inspection==0.4.5 aiohttp==3.14.5 multidict==7.2.1 attrs==26.1.0 yarl==1.25.1 propcache==0.5.4 aiohappyeyeballs==2.7.1 aiosignal==1.4.0 frozenlist==1.8.0 transformers==5.19.0 regex==2026.11.19 huggingface_hub==2.4.0 httpx2==2.16.2 PyYAML==6.0.4 httpcore2==2.16.2 truststore==0.10.5 h11==0.16.0 safetensors==0.8.0 tokenizers==0.23.2 typer==0.29.2 click==8.5.1 dill==0.4.1 sentencepiece==0.2.1 apache-tvm-ffi==0.1.11 compressed-tensors==0.18.0 loguru==0.7.3 annotated-types==0.8.0 gguf==0.19.0 einops==0.8.2; do /tmp/sgl/bin/pip install --no-deps "$p"; done
    /tmp/sgl/bin/python tests/data/engine_kv/sglang_kv.py        # about 3 minutes on 2 cores

(SGLang's declared dependencies pull CUDA packages and torch 2.14.1; the sizing code needs none of them:
the list above is what its import chain asks for, in order, SGLang's own pins taken where it has them.)

Per case, in a fresh process (SGLang's runtime context is process-wide), the chain SGLang's ModelRunner
runs at start-up, with SGLang's own functions:

    ServerArgs(model_path, tp_size, kv_cache_dtype, device="cpu", skip_tokenizer_init=True)
    runtime_context.publish(server_args, role="scheduler")      # parallel widths: attn_tp_size etc.
    ModelConfig.from_server_args(server_args)
    model_loader.loader._get_quantization_config(model_config, LoadConfig())  # the model's quant_config
    mem_cache.kv_cache_dtype.configure_kv_cache_dtype(...)       # "auto" honours quant_config.kv_cache_quant_algo
    layer_setup.resolve_layer_indices(model=None, ...)           # ModelLayerInfo (whole model, no PP)
    spec_aux_hidden_state.resolve_spec_aux_hidden_state_config(...)
    kv_cache_configurator.KVCacheConfigurator(...)
    pool_configurator.create_memory_pool_configurator(kvc)       # Default / HybridSWA / ...
    -> ._cell_size  (DefaultPoolConfigurator._compute_cell_size, or HybridSWAPoolConfigurator._recompute_cell_size)

What is not SGLang's, recorded per case: a placeholder ``torchvision`` (PyPI's torchvision 0.28.0 is a CUDA
build that does not import on a CPU torch; SGLang's config package imports it through its multimodal
helpers, and no sizing code uses it); ``model=None`` where ModelRunner passes the loaded module, except for
``configure_kv_cache_dtype``, which gets an object holding only the quant_config SGLang builds; no process
groups (pp_group=None, pp_size=1). Where SGLang resolves the quant_config through the model class, whose
module needs ``sgl_kernel`` (not on a CPU), its callee ``weight_utils.get_quant_config`` is called; gpt-oss's
MXFP4 method is registered only on GPUs, so it is sized from its config.json without ``quantization_config``
(weight quantization does not enter a KV cache).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import subprocess
import sys
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONFIGS = HERE.parent / "configs"
RECORD = HERE / "sglang-0.5.23.json"
VLLM = HERE / "vllm-0.33.0.json"
WORK = Path(os.environ.get("SGLANG_KV_WORK", "/tmp/sglang-kv-models"))  # config-only model folders
MODELS = WORK / "models"
KV_DTYPES = ("auto", "fp8_e4m3")
TP_SIZES = (1, 8)


class _Placeholder:
    def __init__(self, *a, **k):
        pass

    def __call__(self, *a, **k):
        raise RuntimeError("torchvision placeholder: not usable on this machine")

    def __getattr__(self, name):
        return _Placeholder()


class _Module(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (_Placeholder,), {})


def _called_from_sglang() -> bool:
    f = sys._getframe(2)
    while f is not None:
        name = f.f_globals.get("__name__", "")
        if not name.startswith(("importlib", "_frozen_importlib", __name__)):
            return name.startswith("sglang")
        f = f.f_back
    return False


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            if fullname == "torchvision" and not _called_from_sglang():
                return None  # transformers' find_spec probe: report torchvision absent
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        m = _Module(spec.name)
        m.__path__ = []
        m.__version__ = "0.0.0+placeholder"
        return m

    def exec_module(self, module):
        pass


def install_torchvision_placeholder() -> None:
    """Serve a placeholder torchvision to imports made from sglang modules only (transformers' probe still
    finds none): SGLang's config package imports it, no sizing code uses it."""
    sys.meta_path.insert(0, _Finder())


def one_case(name: str, tp: int, kv: str, model_dir: Path | None = None) -> dict:
    install_torchvision_placeholder()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import logging

    logging.disable(logging.WARNING)
    import warnings

    warnings.filterwarnings("ignore")

    import torch

    import sglang
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import AttentionArch, ModelConfig
    from sglang.srt.mem_cache import kv_cache_dtype as kv_cache_dtype_mod
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
    from sglang.srt.model_executor import pool_configurator as pc
    from sglang.srt.model_executor.model_runner_components.layer_setup import resolve_layer_indices
    from sglang.srt.model_executor.model_runner_components.load_model_utils import resolve_sliding_window_size
    from sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state import (
        resolve_spec_aux_hidden_state_config,
    )
    from sglang.srt.model_loader.loader import _get_quantization_config
    from sglang.srt.runtime_context import get_parallel, get_schedule, get_spec, publish
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    out: dict = {"model": name, "tp": tp, "kv_cache_dtype": kv, "sglang": sglang.__version__}
    server_args = ServerArgs(
        model_path=str(model_dir or MODELS / name), tp_size=tp, kv_cache_dtype=kv, device="cpu", skip_tokenizer_init=True
    )
    publish(server_args, role="scheduler")
    par = get_parallel()
    out["parallel"] = {"tp_size": par.tp_size, "attn_tp_size": par.attn_tp_size, "attn_dcp_size": par.attn_dcp_size}
    model_config = ModelConfig.from_server_args(server_args)

    quant_config = None
    quant_note = None
    if model_config.quantization is not None:
        try:
            quant_config = _get_quantization_config(model_config, LoadConfig())
            out["quant_config_from"] = "model_loader.loader._get_quantization_config"
        except Exception as e:  # noqa: BLE001
            # It resolves the model class first (get_model_architecture); the class module does not
            # import here, so call the function it delegates to, with no packed-module mapping.
            quant_note = f"_get_quantization_config failed: {type(e).__name__}: {e}"[:200]
            from sglang.srt.model_loader.weight_utils import get_quant_config

            quant_config = get_quant_config(model_config, LoadConfig(), {}, None)
            out["quant_config_from"] = "model_loader.weight_utils.get_quant_config (packed_modules_mapping={})"
    out["quantization"] = model_config.quantization
    out["quant_config"] = type(quant_config).__name__ if quant_config is not None else None
    out["kv_cache_quant_algo"] = getattr(quant_config, "kv_cache_quant_algo", None)
    if quant_note:
        out["quant_note"] = quant_note

    class _QuantOnly:  # what configure_kv_cache_dtype reads from the loaded model: .quant_config
        pass

    holder = _QuantOnly()
    holder.quant_config = quant_config
    spec_algorithm = SpeculativeAlgorithm.from_string(get_spec().speculative_algorithm)
    resolved, kv_dtype = kv_cache_dtype_mod.configure_kv_cache_dtype(
        server_args_kv_cache_dtype=kv,
        model=holder,
        model_dtype=model_config.dtype,
        is_draft_worker=False,
        is_dflash=False,
        speculative_draft_attention_backend=None,
        speculative_draft_kv_cache_dtype=get_spec().speculative_draft_kv_cache_dtype,
    )
    kv_dtype_str = resolved if resolved is not None else kv
    layer_info = resolve_layer_indices(model=None, model_config=model_config, is_draft_worker=False)
    spec_aux = resolve_spec_aux_hidden_state_config(
        server_args=server_args, model_config=model_config, spec_algorithm=spec_algorithm, is_draft_worker=False
    )
    kvc = KVCacheConfigurator(
        device="cpu",
        gpu_id=0,
        attn_dp_size=par.attn_dp_size,
        pp_size=1,
        pp_group=None,
        model=None,
        model_config=model_config,
        server_args=server_args,
        kv_cache_dtype=kv_dtype,
        kv_cache_dtype_str=kv_dtype_str,
        model_dtype=model_config.dtype,
        page_size=get_schedule().page_size,
        sliding_window_size=resolve_sliding_window_size(None, model_config),
        spec_algorithm=spec_algorithm,
        is_draft_worker=False,
        post_capture_kv_active=False,
        spec_aux_config=spec_aux,
        draft_parallel_layout=None,
        is_hybrid_swa=model_config.is_hybrid_swa,
        is_hybrid_swa_compress=model_config.is_hybrid_swa_compress,
        use_mla_backend=model_config.attention_arch == AttentionArch.MLA,
        layer_info=layer_info,
        forward_stream=None,
        req_to_token_pool=None,
        token_to_kv_pool_allocator=None,
        memory_pool_config=None,
        draft_model_idx=None,
    )
    conf = pc.create_memory_pool_configurator(kvc)
    out.update(
        model_class=model_config.hf_config.architectures[0],
        attention_arch=model_config.attention_arch.name,
        kv_torch_dtype=str(kv_dtype).replace("torch.", ""),
        kv_cache_dtype_str=kv_dtype_str,
        dtype_bytes=torch._utils._element_size(kv_dtype),
        is_hybrid_swa=model_config.is_hybrid_swa,
        sliding_window_size=kvc.sliding_window_size,
        hf_sliding_window=model_config.sliding_window_size,
        page_size=kvc.page_size,
        num_effective_layers=layer_info.num_effective_layers,
        configurator=type(conf).__name__,
        num_kv_heads_per_gpu=model_config.get_num_kv_heads(par.attn_tp_size, par.attn_dcp_size),
        head_dim=model_config.head_dim,
        v_head_dim=model_config.v_head_dim,
    )
    if kvc.use_mla_backend:
        from sglang.srt.mem_cache.kv_cache_configurator import calculate_mla_kv_cache_dim

        out["mla_kv_cache_dim"] = calculate_mla_kv_cache_dim(model_config=model_config, kv_cache_dtype=kv_dtype)
        out["kv_lora_rank"] = model_config.kv_lora_rank
        out["qk_rope_head_dim"] = model_config.qk_rope_head_dim
    if isinstance(conf, pc.HybridSWAPoolConfigurator):
        out["functions"] = [
            "sglang.srt.model_executor.pool_configurator.create_memory_pool_configurator",
            "HybridSWAPoolConfigurator.__init__ (_full_per_token, _swa_per_token) / _recompute_cell_size",
        ]
        out["swa"] = {
            "full_layers": conf._full_layers_num,
            "swa_layers": conf._swa_layers_num,
            "full_per_token_per_layer": conf._full_per_token,
            "swa_per_token_per_layer": conf._swa_per_token,
            "full_pool_bytes_per_token": conf._full_cell_bytes(),
            "swa_pool_bytes_per_token": conf._swa_cell_bytes(),
            "swa_full_tokens_ratio": conf._swa_full_tokens_ratio,
            "cell_size_per_full_token": conf._cell_size,
        }
        # One token held in both pools (a token inside the window): full + SWA rows.
        out["bytes_per_token_every_layer"] = conf._full_cell_bytes() + conf._swa_cell_bytes()
        out["cell_size"] = conf._cell_size
    else:
        out["functions"] = [
            "sglang.srt.model_executor.pool_configurator.create_memory_pool_configurator",
            "DefaultPoolConfigurator._compute_cell_size (via __init__)",
        ]
        out["cell_size"] = conf._cell_size
        out["bytes_per_token_every_layer"] = conf._cell_size
    return out


def main() -> None:
    if sys.argv[1:] == ["--compare"]:
        compare()
        return
    if len(sys.argv) == 4:
        name, tp, kv = sys.argv[1], int(sys.argv[2]), sys.argv[3]
        try:
            res = one_case(name, tp, kv)
        except ValueError as e:
            if "Unknown quantization method" not in str(e):
                raise
            # SGLang registers "mxfp4" only for CUDA/ROCm-gfx95/XPU or its CPU engine
            # (SGLANG_USE_CPU_ENGINE=1, whose memory_pool import needs the sgl_kernel CPU build):
            # size the model from a copy of config.json without quantization_config.
            cfg = json.loads((MODELS / name / "config.json").read_text())
            dropped = cfg.pop("quantization_config")
            d = WORK / "models-noquant" / name
            d.mkdir(parents=True, exist_ok=True)
            (d / "config.json").write_text(json.dumps(cfg))
            res = one_case(name, tp, kv, model_dir=d)
            res["fallback"] = ("config.json without quantization_config " + json.dumps(dropped)[:120]
                               + f": ModelConfig raised {str(e)[:90]}")
        print("RESULT " + json.dumps(res))
        return
    for p in sorted(CONFIGS.glob("*.json")):
        (MODELS / p.stem).mkdir(parents=True, exist_ok=True)
        (MODELS / p.stem / "config.json").write_text(p.read_text())
    results = {}
    for p in sorted(CONFIGS.glob("*.json")):
        for kv in KV_DTYPES:
            for tp in TP_SIZES:
                r = subprocess.run(["nice", "-n", "19", sys.executable, __file__, p.stem, str(tp), kv],
                                   capture_output=True, text=True)
                line = [l for l in r.stdout.splitlines() if l.startswith("RESULT ")]
                res = json.loads(line[-1][7:]) if line else {"error": r.stderr[-3000:]}
                results[f"{p.stem}/{kv}/tp{tp}"] = res
                print(p.stem, kv, tp, res.get("cell_size"), res.get("bytes_per_token_every_layer"),
                      res.get("configurator"), res.get("error", ""), flush=True)
    RECORD.write_text(json.dumps({"version": "0.5.23", "results": results}, indent=1))
    compare()


def compare() -> None:
    """Add a per-case comparison with vLLM 0.33.0's record (its kv "fp8" = SGLang's "fp8_e4m3")."""
    path = RECORD
    doc = json.loads(path.read_text())
    vllm = json.loads(VLLM.read_text())["results"]
    rows = []
    for key, res in doc["results"].items():
        name, kv, tp = key.split("/")
        v = vllm.get(f"{name}/{'fp8' if kv == 'fp8_e4m3' else kv}")
        vb = v["bytes_per_token"][tp[2:]] if v else None
        rows.append({
            "case": key,
            "sglang_cell_size": res.get("cell_size"),
            "sglang_bytes_per_token_every_layer": res.get("bytes_per_token_every_layer"),
            "vllm_bytes_per_token": vb,
            "equal_every_layer": res.get("bytes_per_token_every_layer") == vb,
            "equal_cell_size": res.get("cell_size") == vb,
        })
    doc["comparison_with_vllm_0.33.0"] = rows
    path.write_text(json.dumps(doc, indent=1))
    for r in rows:
        print(f"{r['case']:32} sglang cell {r['sglang_cell_size']!s:>9}  every-layer "
              f"{r['sglang_bytes_per_token_every_layer']!s:>7}  vllm {r['vllm_bytes_per_token']!s:>7}  "
              f"{'=' if r['equal_every_layer'] else '!='}")


if __name__ == "__main__":
    main()
