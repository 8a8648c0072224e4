"""What ``llmopt serve`` serves: find the model folder and its format, open its runtime.

PATH is an artifact folder (``manifest.json`` next to ``model/``: the format comes
from the manifest's last model-producing stage), a stage folder from the cache
(the same layout), or a plain model folder. A folder with ``genai_config.json`` is
an ONNX Runtime GenAI model (format ``onnx``); anything else is a Hugging Face
folder (format ``hf``).
"""

from __future__ import annotations

import contextlib
import json
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmopt.catalog.engines import queue_for
from llmopt.errors import UsageError

MODEL_STAGE_PREFIXES = ("source", "compress", "export")


@dataclass
class ServedModel:
    """A model opened for serving."""

    name: str  # what clients pass as ``model``
    model_dir: Path
    format: str
    runtime: Any  # llmopt.runtimes interface, with ``stream``
    max_model_len: int  # longest prompt + completion, in tokens
    vocab_size: int | None = None
    identity: dict | None = None  # what answers: the model files' digest, the runtime and its libraries
    device: str = "cpu"
    tokenizer: Any = None  # the model folder's Hugging Face tokenizer; opened when first needed
    _loading: Future | None = field(default=None, repr=False)  # its load, started by ``warm``
    _lock: Any = field(default_factory=threading.Lock, repr=False)

    def tokenize(self, text: str, special: bool = True) -> list[int]:
        """Token ids of a text prompt as the model's Hugging Face tokenizer gives them: its special tokens
        (a BOS...) only where it adds them itself, as vLLM tokenizes a completion prompt; ``special=False``:
        none, for a rendered chat template, which writes its own."""
        return list(self.text_tokenizer()(text, add_special_tokens=special)["input_ids"])

    def text_tokenizer(self):
        """The tokenizer, waiting for the load ``warm`` started; a load that failed is tried again here, so
        the request that needs it reports why."""
        with self._lock:
            if self.tokenizer is None and self._loading is not None:
                loading, self._loading = self._loading, None
                with contextlib.suppress(Exception):
                    self.tokenizer = loading.result()
            if self.tokenizer is None:
                self.tokenizer = hf_tokenizer(self.runtime, self.model_dir)
            return self.tokenizer

    def warm(self) -> None:
        """Start opening the tokenizer in the background at start-up: the first text request would otherwise
        wait for it (a GuideLLM sweep's first request against the quickstart on two cores waited 8.7 s for its
        first token, the next ones 0.4 s), while requests of token ids, and the server's readiness, never
        wait for it (AutoTokenizer takes 6 to 9 s to open the quickstart's on two cores)."""
        if self.tokenizer is None and self._loading is None:
            future: Future = Future()

            def load() -> None:
                try:
                    future.set_result(hf_tokenizer(self.runtime, self.model_dir))
                except Exception as exc:
                    future.set_exception(exc)

            self._loading = future
            threading.Thread(target=load, name="llmopt-tokenizer", daemon=True).start()


RUNTIME_LIBRARIES = ("onnxruntime-genai", "onnxruntime", "torch", "transformers")


def identity(model_dir: Path, runtime: Any, device: str) -> dict:
    """What a client needs to know that two servers give the same scores: one digest of the model folder's
    files (every file, configs included: an ONNX model's session options are in genai_config.json), the
    runtime, the device and the versions of the libraries that compute. ``/v1/models`` lists it under
    ``llmopt``, and llmopt's endpoint evals key their cache on it instead of the URL."""
    import hashlib

    from llmopt.store.cache import checksums
    from llmopt.libraries import versions

    files = checksums(model_dir)
    digest = hashlib.sha256("\n".join(f"{name} {files[name]}" for name in sorted(files)).encode()).hexdigest()
    return {"model_digest": f"sha256:{digest}", "runtime": getattr(runtime, "name", type(runtime).__name__),
            "device": device, "versions": versions(RUNTIME_LIBRARIES)}


def locate(path: Path) -> tuple[Path, str, str]:
    """(model folder, format, default served name) for an artifact or model folder."""
    path = Path(path).expanduser().resolve()
    if not path.is_dir():
        raise UsageError(f"{path} is not a folder", fix="pass an artifact folder (with manifest.json) or a model folder")
    manifest_path = path / "manifest.json"
    if manifest_path.is_file() and (path / "model").is_dir():
        manifest = json.loads(manifest_path.read_text())
        model_dir = path / "model"
        fmt = manifest_format(manifest) or detect_format(model_dir)
        name = (manifest.get("recipe") or {}).get("name") or path.name
        return model_dir, fmt, name
    if not (path / "config.json").is_file() and not (path / "genai_config.json").is_file():
        raise UsageError(f"{path} holds neither a model (config.json or genai_config.json) nor an artifact "
                         "(manifest.json and model/)", fix="pass the artifact folder that `llmopt run` wrote, "
                         "or a model folder")
    return path, detect_format(path), path.name


def manifest_format(manifest: dict) -> str | None:
    """The model format an artifact or stage manifest records."""
    outputs = manifest.get("outputs") or {}
    if outputs.get("format"):  # a stage manifest
        return outputs["format"]
    stages = [s for s in manifest.get("stages") or [] if str(s.get("name", "")).startswith(MODEL_STAGE_PREFIXES)]
    formats = [(s.get("outputs") or {}).get("format") for s in stages]
    formats = [f for f in formats if f]
    return formats[-1] if formats else None


def detect_format(model_dir: Path) -> str:
    return "onnx" if (model_dir / "genai_config.json").is_file() else "hf"


def model_limits(model_dir: Path) -> tuple[int | None, int | None]:
    """(context length, vocabulary size) from genai_config.json or config.json."""
    genai = model_dir / "genai_config.json"
    if genai.is_file():
        model = json.loads(genai.read_text()).get("model", {})
        return model.get("context_length"), model.get("vocab_size")
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        return None, None
    config = json.loads(config_path.read_text())
    text = config.get("text_config") or config
    context = text.get("max_position_embeddings") or config.get("max_position_embeddings")
    return context, text.get("vocab_size") or config.get("vocab_size")


def max_len(context: int | None, requested: int | None, model_dir: Path) -> int:
    """The served context: ``--max-model-len`` when given (no more than the model's), else the model's."""
    if requested is not None:
        if requested < 2:
            raise UsageError(f"--max-model-len {requested} is too small", fix="pass at least 2 tokens")
        if context is not None and requested > context:
            raise UsageError(f"--max-model-len {requested} exceeds the model's context of {context} tokens",
                             where=str(model_dir), fix=f"pass --max-model-len {context} or less")
        return requested
    if context is None:
        raise UsageError("the model's context length is not in its config", where=str(model_dir),
                         fix="pass --max-model-len N")
    return int(context)


def default_queue(path: Path) -> int:
    """``--max-queue`` when not given: room for a load generator's sweep (512 waiting requests), or the
    artifact's ``[serve].workload`` concurrency when that is more (``llmopt.catalog.engines.queue_for``, the
    rule the ort deploy's launch.sh follows too)."""
    return queue_for(workload_concurrency(path))


def workload_concurrency(path: Path) -> int | None:
    """The ``[serve] workload`` concurrency recorded in an artifact's manifest, or None."""
    manifest = Path(path).expanduser() / "manifest.json"
    if not manifest.is_file():
        return None
    resolved = (json.loads(manifest.read_text()).get("recipe") or {}).get("resolved") or {}
    return ((resolved.get("serve") or {}).get("workload") or {}).get("concurrency")


def hf_tokenizer(runtime: Any, model_dir: Path):
    """The runtime's own transformers tokenizer when it has one, else the folder's (AutoTokenizer)."""
    own = getattr(runtime, "text_tokenizer", None) or getattr(runtime, "tokenizer", None)  # ONNX's, transformers'
    if callable(getattr(own, "convert_ids_to_tokens", None)):
        return own
    import transformers

    return transformers.AutoTokenizer.from_pretrained(model_dir)


def serving_device(requested: str, model_dir: Path, fmt: str, runtime: str = "auto") -> str:
    """The device ``--device auto`` means: for an ONNX Runtime GenAI model the one its graph was built for
    (``cuda`` for a GPU EP, else ``cpu``), for the transformers runtime the GPU when torch sees one. Another
    device is checked: cpu, cuda or cuda:N; not cuda for an ONNX graph built for the CPU; for cuda otherwise, a
    GPU torch sees."""
    import re

    from llmopt.runtimes import FORMAT_RUNTIME
    from llmopt.runtimes.onnx import GPU_PROVIDERS, built_for
    from llmopt.libraries import pick_device

    name = FORMAT_RUNTIME.get(fmt, "transformers") if runtime == "auto" else runtime
    config = Path(model_dir) / "genai_config.json"
    graph = built_for(json.loads(config.read_text())) if name == "onnxruntime" and config.is_file() else None
    own = None if graph is None else "cuda" if graph in GPU_PROVIDERS else "cpu"
    if requested == "auto":
        return own or pick_device()
    if not re.fullmatch(r"cpu|cuda(:\d+)?", requested):
        raise UsageError(f"--device {requested}: not a device", fix="pass auto, cpu, cuda or cuda:N")
    if own == "cpu" and requested.startswith("cuda"):  # a GPU graph runs on the CPU EP too (its providers cleared)
        raise UsageError(f"--device {requested}: this ONNX model's graph was built for the CPU EP",
                         fix="leave --device auto, or export for cuda ([export] execution_provider = \"cuda\")")
    if own is None and requested.startswith("cuda") and pick_device() != "cuda":
        raise UsageError(f"--device {requested}: torch sees no CUDA GPU here", fix="leave --device auto, or pass cpu")
    return requested


def load_model(path: Path, runtime: str = "auto", device: str = "auto", max_model_len: int | None = None,
               name: str | None = None) -> ServedModel:
    """Open the model at ``path`` (artifact or model folder) for serving."""
    from llmopt.runtimes import open_runtime

    model_dir, fmt, default_name = locate(path)
    context, vocab = model_limits(model_dir)
    limit = max_len(context, max_model_len, model_dir)
    device = serving_device(device, model_dir, fmt, runtime)
    opened = open_runtime(model_dir, fmt, runtime, device)
    return ServedModel(name or default_name, model_dir, fmt, opened, limit, vocab, identity(model_dir, opened, device),
                       device)
