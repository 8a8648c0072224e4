"""KV cache bytes per token as a serving engine's own code sizes them, for checking the memory model.

vLLM: a script runs in an interpreter that has vLLM installed (``make vllm-env`` builds one in
``.test-envs/vllm``; llmopt itself never imports an engine) with ``VLLM_TARGET_DEVICE=cpu`` and no network.
For each model folder (a config.json, no weights) it builds the engine config with
``EngineArgs(model=folder, load_format="dummy", kv_cache_dtype=...).create_engine_config()``, starts a
one-process gloo world (tensor parallel 1), builds the model class vLLM resolves for the architecture on
the meta device (no weights, no memory) and asks every attention layer the model registered for its
``get_kv_cache_spec(vllm_config)``, as vLLM's model runner does at start-up. Per layer it reports the spec
class, ``page_size_bytes``, ``block_size`` and sliding window (grouped: each distinct spec with its count of
layers); bytes per token are the sum over layers of
``page_size_bytes / block_size``. For tensor parallel sizes above 1 (one process cannot hold their ranks)
each layer's spec is rebuilt with ``num_kv_heads = ModelConfig.get_num_kv_heads(ParallelConfig(tp))``, the
count vLLM's model files pass to their attention layers, and its page size read again.

Where vLLM's code cannot run on this CPU the script says so in ``fallbacks`` and works around it:

- the checkpoint's weight quantization has no CPU kernel (fp8 block-scaled GEMMs need AMX, MXFP4 MoE has
  no CPU backend): the model is built without its ``quantization_config`` (weight quantization does not
  enter a KV spec; a checkpoint's own ``kv_cache_scheme`` would, so such a config is not altered);
- a multimodal wrapper's class cannot be imported (Gemma 3's needs torchvision): the language model is
  built alone from its ``text_config`` (the vision encoder keeps no KV cache);
- the CPU attention backend refuses the KV cache dtype (fp8 with MLA, or on a CPU without AVX-512): the
  specs of the ``auto`` build are rebuilt with vLLM's own dtype for that name (``kv_cache_dtype_str_to_dtype``)
  and its quantization mode, and their page sizes read again.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from llmopt.errors import UsageError

MARK = "LLMOPT_RESULT "

VLLM_KV_SCRIPT = r"""
import contextlib, copy, dataclasses, io, json, os, shutil, socket, sys, tempfile
import torch
jobs = json.loads(sys.argv[1])
import vllm
from vllm.config import ParallelConfig, set_current_vllm_config
from vllm.distributed import init_distributed_environment, initialize_model_parallel
from vllm.engine.arg_utils import EngineArgs
from vllm.model_executor.model_loader.utils import get_model_architecture
from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype
from vllm.v1.kv_cache_interface import get_kv_quant_mode

started = []


def short(exc):
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()] or [""]
    line = lines[1] if len(lines) > 1 and lines[0].endswith("validation error for ModelConfig") else lines[0]
    return f"{type(exc).__name__}: {line}"[:200]


def engine_config(folder, kv_dtype):
    args = EngineArgs(model=folder, skip_tokenizer_init=True, load_format="dummy", kv_cache_dtype=kv_dtype,
                      max_model_len=4096)
    return args.create_engine_config()


def layer_specs(cfg):
    if not started:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with set_current_vllm_config(cfg):
            init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                         distributed_init_method=f"tcp://127.0.0.1:{port}")
            initialize_model_parallel(1, 1)
        started.append(True)
    cls, _ = get_model_architecture(cfg.model_config)
    with set_current_vllm_config(cfg), torch.device("meta"):
        cls(vllm_config=cfg, prefix="")
    layers = cfg.compilation_config.static_forward_context
    return cls.__name__, {name: layer.get_kv_cache_spec(cfg) for name, layer in layers.items()
                          if hasattr(layer, "get_kv_cache_spec")}


def write(folder, config):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    return folder


def without_weight_quantization(config):
    q = config.get("quantization_config")
    if not q or q.get("kv_cache_scheme"):
        return None
    return {k: v for k, v in config.items() if k != "quantization_config"}


def language_model_alone(config):
    text = config.get("text_config")
    archs = [a.replace("ForConditionalGeneration", "ForCausalLM") for a in config.get("architectures") or []]
    if not text or archs == config.get("architectures"):
        return None
    out = dict(text, architectures=archs)
    out.setdefault("torch_dtype", config.get("torch_dtype") or config.get("dtype"))
    return out


def build(config, kv_dtype, work):
    # the model's layer specs, with each fallback that had to be taken and why
    fallbacks, tries = [], [("as given", lambda c: c), ("without the weights' quantization_config",
                                                        without_weight_quantization),
                             ("the language model alone (text_config)", language_model_alone)]
    current, last = config, None
    for label, change in tries:
        changed = change(current)
        if changed is None:
            continue
        if changed is not current:
            fallbacks.append(f"built {label}: {last}")
            current = changed
        try:
            folder = write(os.path.join(work, str(len(os.listdir(work)))), current)
            cfg = engine_config(folder, kv_dtype)
            return cfg, *layer_specs(cfg), fallbacks
        except Exception as exc:
            last = short(exc)
    raise RuntimeError(last)


def run(job, work):
    config, kv_dtype = job["config"], job["kv_cache_dtype"]
    fallbacks = []
    try:
        cfg, model_class, specs, fallbacks = build(config, kv_dtype, work)
    except Exception as exc:
        if kv_dtype == "auto":
            raise
        cfg, model_class, specs, fallbacks = build(config, "auto", work)
        dtype = kv_cache_dtype_str_to_dtype(kv_dtype, cfg.model_config)
        specs = {n: dataclasses.replace(s, dtype=dtype, kv_quant_mode=get_kv_quant_mode(kv_dtype))
                 for n, s in specs.items()}
        fallbacks.append(f"specs of the auto build with dtype {dtype} ({kv_dtype}): {exc}")
    model_config = cfg.model_config
    by_tp = {}
    for tp in job["tensor_parallel_sizes"]:
        heads = model_config.get_num_kv_heads(ParallelConfig(tensor_parallel_size=tp))
        sized = {n: s if tp == 1 else dataclasses.replace(s, num_kv_heads=heads) for n, s in specs.items()}
        by_tp[str(tp)] = sum(s.page_size_bytes // s.block_size for s in sized.values())
    layers = {}  # layers of one spec: the spec's facts and how many layers have it
    for s in specs.values():
        facts = {"spec": type(s).__name__, "page_size_bytes": s.page_size_bytes, "block_size": s.block_size,
                 "num_kv_heads": s.num_kv_heads, "head_size": s.head_size, "head_size_v": s.head_size_v,
                 "dtype": str(s.dtype).replace("torch.", ""), "sliding_window": getattr(s, "sliding_window", None)}
        layers.setdefault(json.dumps(facts), dict(facts, layers=0))["layers"] += 1
    layers = list(layers.values())
    return {"model_class": model_class, "kv_cache_dtype": cfg.cache_config.cache_dtype, "layers": layers,
            "bytes_per_token": by_tp, "fallbacks": fallbacks}


out = {"version": vllm.__version__, "results": {}}
work = tempfile.mkdtemp()
for key, job in jobs.items():
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            out["results"][key] = run(job, work)
    except Exception as exc:
        out["results"][key] = {"error": short(exc)}
shutil.rmtree(work, ignore_errors=True)
print("LLMOPT_RESULT " + json.dumps(out, default=str))
"""


def vllm_kv_bytes(configs: dict[str, dict], kv_cache_dtypes: tuple[str, ...] = ("auto", "fp8"),
                  tensor_parallel_sizes: tuple[int, ...] = (1, 8), python: str | None = None,
                  timeout: int = 1800) -> dict:
    """vLLM's KV cache specs of each config.json, keyed ``"<name>/<kv_cache_dtype>"``: ``{"version",
    "results": {key: {"model_class", "kv_cache_dtype", "layers", "bytes_per_token": {tp: bytes}, "fallbacks"} or {"error"}}}``."""
    exe = python or os.environ.get("LLMOPT_VLLM_PYTHON")
    if not exe or not Path(exe).is_file():
        raise UsageError(f"no vLLM Python to run ({exe!r})", where="LLMOPT_VLLM_PYTHON",
                         fix="run `make vllm-env` (it builds .test-envs/vllm/bin/python) and pass its path")
    jobs = {f"{name}/{kv}": {"config": {k: v for k, v in config.items() if k != "auto_map"},
                             "kv_cache_dtype": kv, "tensor_parallel_sizes": list(tensor_parallel_sizes)}
            for name, config in configs.items() for kv in kv_cache_dtypes}
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               VLLM_LOGGING_LEVEL="ERROR", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    with tempfile.TemporaryDirectory() as cwd:
        done = subprocess.run([os.path.abspath(exe), "-c", VLLM_KV_SCRIPT, json.dumps(jobs)], capture_output=True, text=True,
                              timeout=timeout, env=env, cwd=cwd)
    line = next((ln for ln in reversed(done.stdout.splitlines()) if ln.startswith(MARK)), None)
    if line is None:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise UsageError(f"the vLLM KV script failed: {tail}", fix="check the vLLM environment (make vllm-env)")
    return json.loads(line[len(MARK):])
