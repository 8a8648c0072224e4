"""What serves what: checkpoint format x serving engine x GPU compute capability.

The planner asks each serve backend's ``accepts`` (a cross-stage rule, see
``llmopt.plan.cross_stage_rules``) whether the stages the recipe produces can be served by
that engine on the target GPU. The table below is keyed on the compression backends' names
(``stage.backend``) and the export format ``onnx``; each entry says whether the engine
serves that format ("yes"), does not ("no": an error) or does not document it
("undocumented": a warning), and from which compute capability it runs natively
(below: a slower fallback, a warning) and at all (below: an error).

Sources: vLLM 0.33.0's quantization configs (``get_min_capability`` of each scheme: W8A8
FP8 89 with a W8A16 fallback from 75, WNA16 75 with Marlin from 80, ModelOpt FP8 80,
ModelOpt NVFP4 75 with Blackwell-native W4A4; sparse compressors raise a deprecation
error; ModelOpt INT4 AWQ is not among its ModelOpt algorithms), TensorRT-LLM's and
SGLang's support matrices as summarised in DESIGN.md ("What serves what").
"""

from __future__ import annotations

from dataclasses import dataclass

from llmopt.errors import Problem

# the format family each producing backend writes
FAMILY = {
    "gptq": "w4a16", "awq": "w4a16", "rtn": "w4a16", "w8a16": "w8a16",
    "fp8": "fp8", "fp8_static": "fp8", "int8_sq": "int8", "nvfp4": "nvfp4", "nvfp4a16": "nvfp4a16",
    "modelopt_fp8": "modelopt_fp8", "modelopt_int4_awq": "modelopt_int4", "modelopt_nvfp4": "modelopt_nvfp4",
    "prune_depth": "dense", "prune_width": "dense", "onnx": "onnx",
}


@dataclass(frozen=True)
class Rule:
    status: str  # "yes" | "no" | "undocumented"
    note: str = ""
    min_cc: tuple[int, int] | None = None  # below: the engine refuses the format (error)
    native_cc: tuple[int, int] | None = None  # below (and >= min_cc): a slower fallback (warning)
    needs_gpu: bool = False  # ort: only with the CUDA execution provider


YES = Rule("yes")
CT = "TensorRT-LLM's PyTorch backend documents ModelOpt checkpoints, not compressed-tensors"
TABLE: dict[str, dict[str, Rule]] = {
    "vllm": {
        "dense": YES,
        "w4a16": Rule("yes", "Marlin int4 kernels need CC 8.0; older GPUs get a slower kernel", (7, 5), (8, 0)),
        "w8a16": Rule("yes", "Marlin kernels need CC 8.0; older GPUs get a slower kernel", (7, 5), (8, 0)),
        "fp8": Rule("yes", "FP8 W8A8 compute needs CC 8.9; older GPUs run it weight-only (FP8 Marlin)", (7, 5), (8, 9)),
        "int8": Rule("yes", "INT8 W8A8 needs CC 7.5", (7, 5)),
        "nvfp4": Rule("yes", "NVFP4 is native on Blackwell (CC 10.0); elsewhere a slower weight-only fallback",
                      (7, 5), (10, 0)),
        "nvfp4a16": Rule("yes", "FP4 Marlin kernels need CC 8.0", (7, 5), (8, 0)),
        "modelopt_fp8": Rule("yes", "ModelOpt FP8 compute needs CC 8.9; from 8.0 it runs weight-only", (8, 0), (8, 9)),
        "modelopt_nvfp4": Rule("yes", "NVFP4 is native on Blackwell (CC 10.0); elsewhere a slower weight-only "
                               "fallback", (7, 5), (10, 0)),
        "modelopt_int4": Rule("no", "vLLM reads ModelOpt FP8 / NVFP4 / MXFP8 checkpoints, not INT4 AWQ; "
                              "use awq or gptq (compressed-tensors) for vLLM"),
        "sparse24": Rule("no", "2:4 sparse checkpoints were removed from vLLM"),
        "onnx": Rule("no", "vLLM does not serve ONNX models; use serve.backend = \"ort\""),
    },
    "trtllm": {
        "dense": YES,
        "w4a16": Rule("undocumented", CT + "; use modelopt_int4_awq"),
        "w8a16": Rule("undocumented", CT),
        "fp8": Rule("undocumented", CT + "; use modelopt_fp8", (8, 9)),
        "nvfp4": Rule("undocumented", CT + "; use modelopt_nvfp4", (10, 0)),
        "nvfp4a16": Rule("undocumented", CT),
        "int8": Rule("no", "INT8 SmoothQuant runs only on TensorRT-LLM's legacy engine path, not trtllm-serve's "
                     "PyTorch backend"),
        "modelopt_fp8": Rule("yes", "FP8 needs Ada, Hopper or Blackwell (CC 8.9+)", (8, 9)),
        "modelopt_nvfp4": Rule("yes", "NVFP4 needs Blackwell (CC 10.0+)", (10, 0)),
        "modelopt_int4": Rule("yes", "INT4 AWQ needs CC 8.0", (8, 0)),
        "sparse24": Rule("no", "2:4 sparsity runs only on TensorRT-LLM's legacy engine path"),
        "onnx": Rule("no", "TensorRT-LLM does not serve ONNX models; use serve.backend = \"ort\""),
    },
    "sglang": {
        "dense": YES,
        "w4a16": Rule("yes", "Marlin int4 kernels need CC 8.0", (8, 0)),
        "w8a16": Rule("yes", "Marlin kernels need CC 8.0", (8, 0)),
        "fp8": Rule("yes", "FP8 W8A8 compute needs CC 8.9; from 8.0 it runs weight-only", (8, 0), (8, 9)),
        "int8": Rule("yes", "INT8 W8A8 needs CC 7.5", (7, 5)),
        "nvfp4": Rule("yes", "NVFP4 needs Blackwell (CC 10.0+)", (10, 0)),
        "nvfp4a16": Rule("yes", "NVFP4 needs Blackwell (CC 10.0+)", (10, 0)),
        "modelopt_fp8": Rule("yes", "SGLang's modelopt_fp8 needs Hopper (CC 9.0+)", (9, 0)),
        "modelopt_nvfp4": Rule("yes", "NVFP4 needs Blackwell (CC 10.0+)", (10, 0)),
        "modelopt_int4": Rule("undocumented", "SGLang does not document ModelOpt INT4 AWQ checkpoints"),
        "sparse24": Rule("undocumented", "SGLang does not document 2:4 sparse checkpoints"),
        "onnx": Rule("no", "SGLang does not serve ONNX models; use serve.backend = \"ort\""),
    },
    "ort": {
        "dense": YES, "onnx": YES, "w4a16": YES, "int8": YES,
        "fp8": Rule("yes", "FP8 ONNX models run only on the CUDA execution provider", needs_gpu=True),
        "modelopt_fp8": Rule("yes", "FP8 ONNX models run only on the CUDA execution provider", needs_gpu=True),
        "nvfp4": Rule("yes", "NVFP4 ONNX models run only on the CUDA execution provider", needs_gpu=True),
        "nvfp4a16": Rule("yes", "NVFP4 ONNX models run only on the CUDA execution provider", needs_gpu=True),
        "w8a16": Rule("no", "the ONNX Runtime GenAI builder reads FP8 / NVFP4 compressed-tensors and AutoGPTQ / "
                      "AutoAWQ int4 folders, not W8A16"),
        "modelopt_nvfp4": Rule("no", "ONNX Runtime GenAI does not read ModelOpt NVFP4 checkpoints"),
        "modelopt_int4": Rule("undocumented", "the ONNX Runtime GenAI builder documents AutoAWQ / AutoGPTQ folders, "
                              "not ModelOpt INT4 AWQ checkpoints"),
        "sparse24": Rule("no", "ONNX Runtime GenAI does not serve 2:4 sparse checkpoints"),
    },
}


def family(stage) -> str | None:
    """The format family a producing stage writes (None for backends this table does not know)."""
    options = stage.options.model_dump() if hasattr(stage.options, "model_dump") else {}
    if any(str(v).replace(" ", "") == "2:4" for v in options.values()):
        return "sparse24"
    return FAMILY.get(stage.backend)


def cc_text(cc: tuple[int, int]) -> str:
    return f"{cc[0]}.{cc[1]}"


def engine_problems(engine: str, produced: list, gpu, loaded) -> list[Problem]:
    """Problems serving the formats ``produced`` (compress / export stages) with ``engine`` on ``gpu``."""
    problems: list[Problem] = []
    table = TABLE[engine]
    for stage in produced:
        fam = family(stage)
        rule = table.get(fam) if fam else None
        if rule is None:
            continue
        key = "format" if stage.kind == "export" else "method"
        where = loaded.where(*stage.step, key)
        what = f"{stage.backend} output served by {engine}"
        if rule.status == "no":
            problems.append(Problem(f"{what}: {rule.note}", where, "choose another method or serve.backend"))
            continue
        if rule.status == "undocumented":
            problems.append(Problem(f"{what}: {rule.note}", where, severity="warning"))
        if rule.needs_gpu and gpu is None:
            problems.append(Problem(f"{what}: {rule.note}", where, "set [target] gpu"))
        if gpu is None:
            continue
        if rule.min_cc and gpu.cc < rule.min_cc:
            problems.append(Problem(f"{what} on {gpu.name} (CC {gpu.cc_str}): {rule.note}", where,
                                    f"target a GPU with CC {cc_text(rule.min_cc)} or newer, or choose another method"))
        elif rule.native_cc and gpu.cc < rule.native_cc:
            problems.append(Problem(f"{what} on {gpu.name} (CC {gpu.cc_str}): {rule.note}", where,
                                    severity="warning"))
    if engine == "ort" and not any(s.kind == "export" and s.backend == "onnx" for s in produced):
        problems.append(Problem("serve.backend = \"ort\" serves ONNX models, but the recipe exports "
                                f"{loaded.recipe.export.format!r}", loaded.where("serve", "backend"),
                                "set [export] format = \"onnx\""))
    return problems
