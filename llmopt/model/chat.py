"""Chat templates: turn a list of chat messages into the prompt text the model was tuned on.

A runtime with a transformers tokenizer renders through the tokenizer's own
``apply_chat_template``; any other runtime (ONNX Runtime GenAI) gets the template
from the model folder (``chat_template.jinja``, else ``chat_template`` in
``tokenizer_config.json``) rendered here with a sandboxed jinja2 environment. The
rendered text already holds the special tokens the template writes (BOS included,
when it writes one), so it is encoded with ``bos=False``.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path


class NoChatTemplate(ValueError):
    """The model folder has no chat template."""


def render_chat(runtime, model_dir: Path, messages: list[dict]) -> str:
    """The prompt text for ``messages`` (dicts with ``role`` and ``content``), ending with the
    assistant's turn header."""
    tokenizer = getattr(runtime, "tokenizer", None)
    if getattr(tokenizer, "chat_template", None) and hasattr(tokenizer, "apply_chat_template"):
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    template = read_template(Path(model_dir))
    if template is None:
        raise NoChatTemplate(f"the model in {model_dir} has no chat template")
    return render_template(template, messages, special_tokens(Path(model_dir)))


def read_template(model_dir: Path) -> str | None:
    """The chat template in a model folder, or None."""
    path = model_dir / "chat_template.jinja"
    if path.is_file():
        return path.read_text()
    config = _tokenizer_config(model_dir)
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def special_tokens(model_dir: Path) -> dict[str, str]:
    """``bos_token``, ``eos_token``... as strings, the variables templates use."""
    out = {}
    for key, value in _tokenizer_config(model_dir).items():
        if key.endswith("_token") and isinstance(value, dict):
            value = value.get("content")
        if key.endswith("_token") and isinstance(value, str):
            out[key] = value
    return out


def render_template(template: str, messages: list[dict], tokens: dict[str, str]) -> str:
    return _compile(template).render(messages=messages, add_generation_prompt=True, **tokens)


def _tokenizer_config(model_dir: Path) -> dict:
    path = model_dir / "tokenizer_config.json"
    return json.loads(path.read_text()) if path.is_file() else {}


@lru_cache(maxsize=8)
def _compile(template: str):
    from jinja2 import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # jinja's own tojson escapes HTML characters, which chat prompts must not contain
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)
