"""Verify an exported ONNX Runtime GenAI model with ONNX Runtime's own profiler.

A plain ``InferenceSession`` on the requested execution provider runs a prefill and
a few decode steps (the KV cache fed back), with profiling on. From the profile:
kernel time by operator type, whether MatMulNBits (the int4/int8 kernels) and
GatherBlockQuantized (a quantized embedding table) are in the graph and executed, and every node that ran on another execution provider
than the one asked for (a silent fallback). Plain functions, used by the onnx
export stage. Needs: onnxruntime, onnx, numpy.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np

from llmopt.runtimes.onnx import load_cuda_libraries

EP_NAMES = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider", "dml": "DmlExecutionProvider",
            "webgpu": "WebGpuExecutionProvider", "NvTensorRtRtx": "NvTensorRTRTXExecutionProvider"}
# operators whose fallback to another EP is a real loss, not a shape computation
HEAVY_OPS = {"MatMulNBits", "MatMul", "Gemm", "GroupQueryAttention", "MultiHeadAttention", "Attention",
             "GatherBlockQuantized", "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization"}
PROMPT_TOKENS = 32
DECODE_STEPS = 4
ORT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


def profile(model_dir: Path, ep: str, quantized: bool, intra_op_threads: int | None = None,
            graph_optimization_level: str = "ORT_ENABLE_ALL", work_dir: Path | None = None) -> dict:
    """Run the model once with profiling and return the report (status passed / failed / skipped)."""
    import onnxruntime as ort

    wanted = EP_NAMES[ep]
    if ep == "cuda":
        load_cuda_libraries()
    report = {"execution_provider": wanted, "prompt_tokens": PROMPT_TOKENS, "decode_steps": DECODE_STEPS,
              "onnxruntime": ort.__version__, "problems": []}
    if wanted not in ort.get_available_providers():
        return report | {"status": "skipped", "reason": f"{wanted} is not available in this onnxruntime build "
                         f"(available: {', '.join(ort.get_available_providers())})"}
    config = json.loads((model_dir / "genai_config.json").read_text())["model"]
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, graph_optimization_level)
    if intra_op_threads:
        options.intra_op_num_threads = intra_op_threads
    with tempfile.TemporaryDirectory(dir=work_dir) as tmp:
        options.profile_file_prefix = os.path.join(tmp, "profile")
        providers = [wanted] + (["CPUExecutionProvider"] if wanted != "CPUExecutionProvider" else [])
        session = ort.InferenceSession(str(model_dir / config["decoder"]["filename"]), options, providers=providers)
        run_steps(session, config)
        events = json.loads(Path(session.end_profiling()).read_text())
    report |= summarize_events(events, wanted)
    for op in ("MatMulNBits", "GatherBlockQuantized"):
        report[op.lower()] = {"in_graph": count_ops(model_dir / config["decoder"]["filename"], op),
                              "executed": report["by_op"].get(op, {}).get("nodes", 0)}
    report["problems"] = judge(report, quantized)
    report["status"] = "failed" if report["problems"] else "passed"
    return report


def run_steps(session, config: dict) -> None:
    """Prefill PROMPT_TOKENS tokens, then DECODE_STEPS greedy steps reusing the KV cache."""
    dec = config["decoder"]
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = [o.name for o in session.get_outputs()]
    past = [n for n in inputs if n.startswith(dec["inputs"]["past_key_names"].split("%")[0])
            or n.startswith(dec["inputs"]["past_value_names"].split("%")[0])]
    present = {name: present_name(name, dec) for name in past}
    rng = np.random.default_rng(0)
    ids = rng.integers(0, config["vocab_size"], (1, PROMPT_TOKENS), dtype=np.int64)
    capacity = window_capacities(dec)
    feeds = {n: np.zeros((1, dec["num_key_value_heads"], capacity.get(layer_of(n, dec), 0), dec["head_size"]),
                         ORT_TYPES.get(inputs[n].type, np.float32)) for n in past}
    length = 0
    for _ in range(DECODE_STEPS + 1):
        length += ids.shape[1]
        feeds |= step_inputs(inputs, ids, length)
        values = dict(zip(outputs, session.run(outputs, feeds)))
        logits = values.get("logits")
        ids = np.array([[int(logits[0, -1].argmax()) if logits is not None else 0]], np.int64)
        feeds = {n: values[present[n]] for n in past}


def window_capacities(dec: dict) -> dict[int, int]:
    """The KV-cache capacity of each sliding-window layer (genai_config.json's ``sliding_window``), as
    onnxruntime-genai allocates it: such a layer's cache is a buffer of the window's size (plus ``cache_slack``)
    from the first step, which its attention node fills and evicts in place, and refuses one smaller than the
    window; a full layer's cache grows from empty."""
    window = dec.get("sliding_window") or {}
    size = int(window.get("window_size") or 0) + int(window.get("cache_slack") or 0)
    return dict.fromkeys(window.get("layers") or [], size) if size > 0 else {}


def past_kind_layer(past: str, dec: dict) -> tuple[str, int]:
    """("key" or "value", layer) of a past KV-cache input name."""
    for kind in ("key", "value"):
        head, _, tail = dec["inputs"][f"past_{kind}_names"].partition("%d")
        if past.startswith(head) and past.endswith(tail):
            return kind, int(past[len(head): len(past) - len(tail)])
    raise KeyError(past)


def layer_of(past: str, dec: dict) -> int:
    return past_kind_layer(past, dec)[1]


def present_name(past: str, dec: dict) -> str:
    kind, layer = past_kind_layer(past, dec)
    return dec["outputs"][f"present_{kind}_names"] % layer


def step_inputs(inputs: dict, ids: np.ndarray, length: int) -> dict:
    feeds = {"input_ids": ids, "attention_mask": np.ones((1, length), np.int64)}
    if "position_ids" in inputs:
        feeds["position_ids"] = np.arange(length - ids.shape[1], length, dtype=np.int64)[None]
    return {k: v for k, v in feeds.items() if k in inputs}


def summarize_events(events: list[dict], wanted: str) -> dict:
    by_op: dict[str, dict] = defaultdict(lambda: {"ms": 0.0, "nodes": 0})
    by_ep: dict[str, float] = defaultdict(float)
    seen: dict[str, tuple] = {}
    runs = 0
    for event in events:
        if event.get("cat") == "Session" and event.get("name") == "model_run":
            runs += 1
        if event.get("cat") != "Node" or not event.get("name", "").endswith("_kernel_time"):
            continue
        args = event.get("args", {})
        op, ep, node = args.get("op_name", "?"), args.get("provider", "?"), event["name"][: -len("_kernel_time")]
        by_op[op]["ms"] += event["dur"] / 1000
        by_ep[ep] += event["dur"] / 1000
        if node not in seen:
            by_op[op]["nodes"] += 1
            seen[node] = (op, ep)
    total = sum(v["ms"] for v in by_op.values()) or 1.0
    ops = {op: {"ms": round(v["ms"], 3), "share": round(v["ms"] / total, 4), "nodes": v["nodes"]}
           for op, v in sorted(by_op.items(), key=lambda kv: -kv[1]["ms"])}
    fallback = [{"node": n, "op": op, "ep": ep} for n, (op, ep) in seen.items() if ep != wanted]
    return {"runs": runs, "kernel_ms": round(total, 3), "by_op": ops,
            "by_ep": {ep: round(ms, 3) for ep, ms in by_ep.items()}, "fallback": fallback}


def count_ops(onnx_path: Path, op_type: str) -> int:
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    return sum(1 for node in model.graph.node if node.op_type == op_type)


def judge(report: dict, quantized: bool) -> list[str]:
    problems = []
    nbits = report["matmulnbits"]
    if quantized and nbits["in_graph"] == 0:
        problems.append("the int4/int8 model has no MatMulNBits node")
    elif quantized and nbits["executed"] < nbits["in_graph"]:
        problems.append(f"only {nbits['executed']} of {nbits['in_graph']} MatMulNBits nodes executed")
    gathers = report.get("gatherblockquantized", {"in_graph": 0, "executed": 0})
    if gathers["executed"] < gathers["in_graph"]:
        problems.append(f"only {gathers['executed']} of {gathers['in_graph']} GatherBlockQuantized nodes executed")
    heavy = [f for f in report["fallback"] if f["op"] in HEAVY_OPS]
    if heavy:
        listed = ", ".join(f"{f['node']} ({f['op']} on {f['ep']})" for f in heavy[:5])
        problems.append(f"{len(heavy)} compute nodes fell back from {report['execution_provider']}: {listed}")
    return problems


def summary(report: dict) -> dict:
    """The part of the report that goes into the stage manifest."""
    keys = ("status", "execution_provider", "reason", "runs", "kernel_ms", "matmulnbits", "gatherblockquantized",
            "problems")
    out = {k: report[k] for k in keys if k in report}
    if "by_op" in report:
        out["top_ops"] = {op: v["share"] for op, v in list(report["by_op"].items())[:6]}
        out["fallback_nodes"] = len(report["fallback"])
    return out
