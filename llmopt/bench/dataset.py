"""Text workloads: prompts from a JSONL file or a built-in text workload, instead of random token ids.

A file holds one JSON object a line (``.jsonl``; a ``.json`` file holds one array of them, as
ShareGPT's does), in the conventions of vLLM's benchmark and GuideLLM:

* a plain prompt: the first of ``prompt``, ``instruction``, ``question``, ``input``, ``context``,
  ``content``, ``text`` (GuideLLM's prompt columns, in its order), with an optional system prompt in
  ``system_prompt``, ``system`` or ``prefix`` and an optional reference answer in ``completion``,
  ``response``, ``output`` or ``answer``;
* a chat: ``messages`` (OpenAI's ``role`` / ``content``; content as text or text parts), sent up to
  its last user message; a last assistant message is the reference answer;
* a ShareGPT conversation: ``conversations`` (``from`` / ``value``), of which, as vLLM's sharegpt
  dataset does, the first human turn is the prompt and the turn after it the reference answer.

The output length of a request: ``output_tokens`` (vLLM), ``output_tokens_count`` or
``completion_tokens_count`` (GuideLLM) where the record gives one, else its reference answer's
length in the model's tokens, else the workload's ``output_len``; or ``output_len`` for every
request (``output_len_from = "fixed"``). Prompts and answers are tokenized with the model folder's
own tokenizer (``tokenizer.json``, read with the ``tokenizers`` library) and chat template (as
``llmopt serve`` renders it): with ``/v1/completions`` a chat is sent as its rendered text, with
``/v1/chat/completions`` as messages. A record that does not fit the served context with its output
is left out, and the results count it.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from llmopt.errors import UsageError

PROMPT_FIELDS = ("prompt", "instruction", "question", "input", "context", "content", "text")
SYSTEM_FIELDS = ("system_prompt", "system", "prefix")
ANSWER_FIELDS = ("completion", "response", "output", "answer")
LENGTH_FIELDS = ("output_tokens", "output_tokens_count", "completion_tokens_count")
ROLES = {"system": "system", "user": "user", "human": "user", "assistant": "assistant", "gpt": "assistant",
         "chatgpt": "assistant", "bard": "assistant", "model": "assistant"}
FORMAT_FIX = ('one JSON object a line: {"prompt": "..."} (optionally "output_tokens": N), {"messages": [{"role": '
              '"user", "content": "..."}]} or {"conversations": [{"from": "human", "value": "..."}]}; docs/bench.md, '
              '"Text workloads"')


@dataclass(frozen=True)
class Item:
    """One record: a plain prompt or chat messages (ending with a user turn), its reference answer and length."""

    prompt: str | None = None
    messages: tuple[tuple[str, str], ...] | None = None  # (role, content)
    system: str | None = None
    answer: str | None = None
    output_tokens: int | None = None

    @property
    def kind(self) -> str:
        return "chat" if self.messages is not None else "prompt"

    def plain(self) -> str | None:
        """A plain prompt as one text: its system prompt, a blank line, the prompt."""
        return f"{self.system}\n\n{self.prompt}" if self.system and self.prompt else self.prompt

    def chat(self) -> list[dict]:
        """The messages a chat request carries."""
        if self.messages is not None:
            return [{"role": role, "content": content} for role, content in self.messages]
        return ([{"role": "system", "content": self.system}] if self.system else []) + [
            {"role": "user", "content": self.prompt}]


@dataclass
class Dataset:
    name: str  # builtin:NAME, or the file's absolute path
    sha256: str
    items: list[Item]


def _text(value, what: str) -> str:
    """A message's content: text, or OpenAI's content parts of type text."""
    if isinstance(value, list):
        parts = [p.get("text") for p in value if isinstance(p, dict) and p.get("type", "text") == "text"]
        if parts and all(isinstance(p, str) for p in parts):
            return "".join(parts)
    if isinstance(value, str):
        return value
    raise ValueError(f"{what} is not text")


def _turns(obj: dict) -> list[tuple[str, str]]:
    key = "messages" if "messages" in obj else "conversations"
    turns = obj[key]
    if not isinstance(turns, list) or not turns:
        raise ValueError(f'"{key}" must be a non-empty list of turns')
    out = []
    for n, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise ValueError(f'"{key}"[{n}] is not an object')
        role = turn.get("role", turn.get("from"))
        if role not in ROLES:
            raise ValueError(f'"{key}"[{n}] has role {role!r}; use one of {", ".join(sorted(ROLES))}')
        out.append((ROLES[role], _text(turn.get("content", turn.get("value")), f'"{key}"[{n}] content')))
    return out


def _length(obj: dict) -> int | None:
    for key in LENGTH_FIELDS:
        if key in obj and obj[key] is not None:
            value = obj[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < 1:
                raise ValueError(f'"{key}" must be a whole number of tokens, at least 1 (got {value!r})')
            return int(value)
    return None


def parse_record(obj) -> Item:
    """One record as an Item; a ValueError says what is wrong with it."""
    if not isinstance(obj, dict):
        raise ValueError(f"a record must be a JSON object, not {type(obj).__name__}")
    length = _length(obj)
    if "messages" in obj:
        turns = _turns(obj)
        answer = turns.pop()[1] if turns[-1][0] == "assistant" else None
        if not turns or turns[-1][0] != "user":
            raise ValueError('"messages" must hold a user message, last or before a last assistant message')
        return Item(messages=tuple(turns), answer=answer, output_tokens=length)
    if "conversations" in obj:
        turns = _turns(obj)
        first = next((i for i, (role, _) in enumerate(turns) if role == "user"), None)
        if first is None:
            raise ValueError('"conversations" has no human turn')
        system = "\n\n".join(text for role, text in turns[:first] if role == "system") or None
        answer = turns[first + 1][1] if first + 1 < len(turns) and turns[first + 1][0] == "assistant" else None
        return Item(prompt=turns[first][1], system=system, answer=answer, output_tokens=length)
    key = next((k for k in PROMPT_FIELDS if k in obj), None)
    if key is None:
        raise ValueError(f"no prompt: none of {', '.join(PROMPT_FIELDS)}, messages, conversations")
    prompt = obj[key]
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError(f'"{key}" must be non-empty text')
    system = next((obj[k] for k in SYSTEM_FIELDS if isinstance(obj.get(k), str) and obj[k]), None)
    answer = next((obj[k] for k in ANSWER_FIELDS if isinstance(obj.get(k), str) and obj[k]), None)
    return Item(prompt=prompt, system=system, answer=answer, output_tokens=length)


def read_file(path: Path) -> list[Item]:
    """The records of a .jsonl file (or a .json array); a bad record is a UsageError naming its line."""
    from llmopt.data import read_text

    text = read_text(path)
    if path.suffix == ".json":
        try:
            records = json.loads(text)
        except ValueError as exc:
            raise UsageError(f"not JSON: {exc}", where=str(path), fix=FORMAT_FIX) from None
        if not isinstance(records, list):
            raise UsageError("a .json data set must be one array of records", where=str(path), fix=FORMAT_FIX)
        numbered = [(f"record {n}", r) for n, r in enumerate(records, 1)]
    else:
        numbered = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    numbered.append((f"line {n}", json.loads(line)))
                except ValueError as exc:
                    raise UsageError(f"line {n} is not JSON ({exc})", where=f"{path}:{n}", fix=FORMAT_FIX) from None
    items = []
    for where, record in numbered:
        try:
            items.append(parse_record(record))
        except ValueError as exc:
            raise UsageError(f"{where}: {exc}", where=f"{path}:{where.split()[-1]}", fix=FORMAT_FIX) from None
    if not items:
        raise UsageError("the data set holds no records", where=str(path), fix=FORMAT_FIX)
    return items


def resolve(spec: str, base: Path | None = None) -> Path | None:
    """The file a spec names (relative to ``base``, else the current folder); None for a built-in."""
    if spec.startswith("builtin:"):
        return None
    path = Path(spec).expanduser()
    return path if path.is_absolute() or base is None else base / path


def load(spec: str, base: Path | None = None) -> Dataset:
    """The data set a spec names: ``builtin:NAME`` or a .jsonl / .json file."""
    from llmopt.data import workloads

    path = resolve(spec, base)
    if path is None:
        name = spec.split(":", 1)[1]
        if name not in workloads.WORKLOADS:
            raise UsageError(f"unknown built-in text workload {spec!r}",
                             fix=f"use one of {', '.join(workloads.names())} (llmopt ls data), or a .jsonl file")
        text = workloads.jsonl(name)
        items = [parse_record(json.loads(line)) for line in text.splitlines()]
        return Dataset(spec, hashlib.sha256(text.encode()).hexdigest(), items)
    if not path.is_file():
        raise UsageError(f"data set not found: {path}", fix="pass a .jsonl file, or builtin:NAME (llmopt ls data)")
    if path.suffix not in (".jsonl", ".json"):
        raise UsageError(f"{path}: a data set is a .jsonl file (or a .json array), not {path.suffix or 'no suffix'}",
                         fix=FORMAT_FIX)
    path = path.resolve()
    stat = path.stat()
    return _load_file(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4)
def _load_file(path: str, mtime_ns: int, size: int) -> Dataset:
    from llmopt.store.cache import sha256_file

    return Dataset(path, sha256_file(Path(path)), read_file(Path(path)))


def check(spec: str, base: Path | None = None) -> str | None:
    """What is wrong with a data set spec (its file read and every record parsed), or None."""
    try:
        load(spec, base)
    except UsageError as exc:
        return f"{exc.where}: {exc.what}" if exc.where else exc.what
    return None


@dataclass
class Request:
    """One request of a text workload, ready to send."""

    prompt: str | None  # /v1/completions
    messages: list[dict] | None  # /v1/chat/completions
    max_tokens: int
    input_tokens: int | None  # with the model's tokenizer; None without one


@dataclass
class Prepared:
    """A data set's requests for one endpoint and model, taken in order and around again."""

    dataset: Dataset
    requests: list[Request]
    info: dict
    _next: int = field(default=0, repr=False)

    def take(self, n: int) -> list[Request]:
        out = [self.requests[(self._next + k) % len(self.requests)] for k in range(n)]
        self._next = (self._next + n) % len(self.requests)
        return out


def prepare(dataset: Dataset, endpoint: str, output_len: int, output_len_from: str, model_dir: Path | None,
            context: int | None) -> Prepared:
    """The data set's requests: prompts rendered for ``endpoint``, lengths counted with ``model_dir``'s tokenizer
    (none: input lengths unknown, and output lengths from the records' own counts or ``output_len``)."""
    tok = Tokens(model_dir)
    requests, too_long = [], 0
    for item in dataset.items:
        if output_len_from == "fixed":
            out = output_len
        else:
            out = item.output_tokens or (tok.count(item.answer) if item.answer and tok.ok else None) or output_len
        if endpoint == "chat":
            request = Request(None, item.chat(), out, tok.count_chat(item.chat()))
        else:
            text = tok.render(item.chat()) if item.messages is not None else item.plain()
            request = Request(text, None, out, tok.count(text, special=True))
        if context and request.input_tokens is not None and request.input_tokens + out > context:
            too_long += 1
            continue
        requests.append(request)
    if not requests:
        raise UsageError(f"no record of {dataset.name} fits the served context of {context} tokens with its output",
                         fix="use shorter prompts, --output-len, or a server with a longer context")
    return Prepared(dataset, requests, describe(dataset, requests, too_long, output_len_from, tok))


def _spread(values: list[int]) -> dict | None:
    if not values:
        return None
    return {"mean": round(sum(values) / len(values), 1), "min": min(values), "max": max(values)}


def describe(dataset: Dataset, requests: list[Request], too_long: int, output_len_from: str, tok) -> dict:
    """What the results say of the workload: its name and hash, its records, their lengths."""
    counted = [r.input_tokens for r in requests if r.input_tokens is not None]
    kinds = sorted({item.kind for item in dataset.items})
    return {"name": dataset.name, "sha256": dataset.sha256, "records": len(dataset.items),
            "kind": kinds[0] if len(kinds) == 1 else "mixed", "used": len(requests), "too_long": too_long,
            "output_len_from": output_len_from, "tokenizer": str(tok.folder) if tok.ok else None,
            "input_tokens": _spread(counted) if len(counted) == len(requests) else None,
            "output_tokens": _spread([r.max_tokens for r in requests])}


def _have(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


class Tokens:
    """Counts and chat rendering with a model folder's own tokenizer and template; nothing without them."""

    def __init__(self, folder: Path | None):
        from llmopt.data.counting import model_tokenizer

        self.folder = Path(folder).resolve() if folder else None  # the model folder, not a link to it
        self.tokenizer = model_tokenizer(str(folder)) if folder else None
        self.template = None
        if self.folder is not None:
            from llmopt.model.chat import read_template

            self.template = read_template(self.folder) if _have("jinja2") else None

    @property
    def ok(self) -> bool:
        return self.tokenizer is not None

    def count(self, text: str, special: bool = False) -> int | None:
        return len(self.tokenizer.encode(text, add_special_tokens=special).ids) if self.ok else None

    def render(self, messages: list[dict]) -> str:
        """The prompt text of a chat, as the model's template writes it (without a template: the contents)."""
        if self.template:
            from llmopt.model.chat import render_template, special_tokens

            return render_template(self.template, messages, special_tokens(self.folder))
        return "\n\n".join(m["content"] for m in messages)

    def count_chat(self, messages: list[dict]) -> int | None:
        if not self.ok:
            return None
        if self.template:
            return self.count(self.render(messages))
        return sum(self.count(m["content"]) for m in messages)
