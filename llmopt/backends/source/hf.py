"""Source: a Hugging Face model folder, local or from the hub (or, for ``llmopt eval --candidate``,
an ONNX Runtime GenAI model folder, which has ``genai_config.json``).

A local folder is read in place (not copied); a hub id is downloaded with
``huggingface_hub`` (safetensors, configs and tokenizer files only, unless the
recipe allows pickle). The stage records the model's fingerprint: the BLAKE3 of
its config and of every weight file, hashed in the background while the next
stages run (``StageContext.defer``). At plan time a hub id's config.json comes from
one quick request (``llmopt.model.hub.hub_config``), or from the local hub cache when offline.
Where torch and transformers are installed, the stage checks the folder before it ends (``_sanity``): its
tokenizer round-trips text in subword tokens, and (for weights up to 2 GiB) its greedy tokens are not one
token repeated whatever the prompt.
Needs: huggingface_hub for hub ids only.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from llmopt.model import estimates
from llmopt.backends.base import PlanContext, SourceBackend, StageContext
from llmopt.backends.source import _sanity as sanity
from llmopt.libraries import require
from llmopt.store.cache import blake3_file
from llmopt.errors import Problem, StageFailed
from llmopt.model.hub import is_hub_id, local_folder
from llmopt.recipe.schema import ModelSection
from llmopt.registry import register

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".onnx", ".onnx.data")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth")
HUB_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]


def folder_problems(folder: Path, options: ModelSection) -> list[str]:
    """What keeps a folder from being loaded safely, as messages."""
    if is_onnx_folder(folder):
        return [] if any(folder.glob("*.onnx")) else [f"{folder} has genai_config.json but no .onnx model"]
    if not (folder / "config.json").is_file():
        return [f"{folder} has no config.json; is it a Hugging Face model folder?"]
    problems = []
    config = json.loads((folder / "config.json").read_text())
    if config.get("auto_map") and not options.trust_remote_code:
        problems.append(
            "this model needs its own Python code (config.json has auto_map); "
            "set model.trust_remote_code = true only if you trust its source"
        )
    names = [p.name for p in folder.iterdir()]
    if not any(n.endswith(".safetensors") for n in names):
        if any(n.endswith(PICKLE_SUFFIXES) for n in names) and not options.allow_pickle:
            problems.append(
                "the folder holds only pickled weights (.bin/.pt), which can run code when loaded; "
                "convert them to safetensors, or set model.allow_pickle = true if you trust them"
            )
        elif not any(n.endswith(PICKLE_SUFFIXES) for n in names):
            problems.append(f"{folder} has no weight files")
    return problems


def is_onnx_folder(folder: Path) -> bool:
    return (folder / "genai_config.json").is_file()


def stat_signature(folder: Path) -> list:
    """Cheap identity of a folder's files for cache keys (name, size, mtime)."""
    out = []
    for p in sorted(folder.iterdir()):
        if p.is_file():
            st = p.stat()
            out.append([p.name, st.st_size, int(st.st_mtime)])
    return out


def fingerprint(folder: Path) -> str:
    """``blake3:`` + the BLAKE3 over the names and BLAKE3 digests of config.json and every weight
    file, in name order (each file hashed on every core)."""
    import blake3

    h = blake3.blake3()
    for p in sorted(folder.iterdir()):
        if p.name in ("config.json", "genai_config.json") or p.name.endswith(WEIGHT_SUFFIXES):
            h.update(p.name.encode() + b"\0" + blake3_file(p).encode() + b"\n")
    return "blake3:" + h.hexdigest()


@register("source", "hf")
class HuggingFaceSource(SourceBackend):
    Options = ModelSection
    requires = ()

    def check(self, options: ModelSection, ctx: PlanContext) -> list[Problem]:
        if is_hub_id(options.source):
            return []  # the plan's model facts reach the hub, and say when they cannot
        folder = local_folder(options.source, ctx.recipe.path.parent)
        if not folder.exists():
            return [ctx.problem(f"model folder not found: {folder}", "source", hint="give a hub id (org/name), a local folder or a .gguf file")]
        return [ctx.problem(message, "source") for message in folder_problems(folder, options)]

    def fingerprint(self, options: ModelSection, base: Path) -> dict:
        if is_hub_id(options.source):
            return {"hub": options.source, "revision": options.revision}
        folder = local_folder(options.source, base)
        return {"folder": str(folder), "files": stat_signature(folder) if folder.is_dir() else []}

    def layout(self, options: ModelSection, ctx: PlanContext) -> estimates.Layout:
        """The folder as it is: weights in the checkpoint's own dtype (a W4A16 checkpoint's packed
        integers and scales); its other files measured when it is local."""
        info = ctx.model
        folder = None if is_hub_id(options.source) else local_folder(options.source, ctx.recipe.path.parent)
        files = estimates.measured_files(folder) if folder is not None and folder.is_dir() \
            else estimates.tokenizer_files(info)
        dtype = info.dtype or estimates.model_dtype(ctx.recipe.recipe, info)
        layout = estimates.float_layout(dtype, info.tie_embeddings, files)
        quantized = estimates.checkpoint_weights(info.quantization, dtype)
        return layout.with_linears(quantized, estimates.checkpoint_kinds(info.quantization)) if quantized else layout

    def run(self, options: ModelSection, ctx: StageContext) -> dict:
        if is_hub_id(options.source):
            hub = require("huggingface_hub", "hub", "a hub model source")
            patterns = HUB_PATTERNS + (["*.bin", "*.pt"] if options.allow_pickle else [])
            ctx.progress(f"downloading {options.source}")
            folder = Path(hub.snapshot_download(options.source, revision=options.revision, allow_patterns=patterns))
        else:
            folder = local_folder(options.source, ctx.recipe.path.parent)
        problems = folder_problems(folder, options)
        if problems:
            raise StageFailed(problems[0], where="source")
        checked = {}
        if not is_onnx_folder(folder) and all(importlib.util.find_spec(m) for m in ("torch", "transformers")):
            ctx.progress("checking the tokenizer and a few greedy tokens")
            checked = sanity.check_folder(folder, ctx.name, options.trust_remote_code, ctx.log)
        ctx.defer(lambda stage_folder: {"fingerprint": fingerprint(folder)})  # the source, read in place
        return {"format": "onnx" if is_onnx_folder(folder) else "hf", "model_dir": str(folder), "sanity": checked}
