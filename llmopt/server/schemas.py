"""Request and response bodies of the OpenAI-compatible API.

Requests are strict, as OpenAI's API is: an argument the API does not know is a
400 ("Unrecognized request argument supplied"). Besides OpenAI's arguments, the
sampling extensions of vLLM's OpenAI server that benchmark clients send are
implemented as vLLM defines them: ``top_k``, ``repetition_penalty``, ``ignore_eos``,
``min_tokens`` and ``stream_options.continuous_usage_stats``. ``n`` > 1, several prompts
in one completion request and chat log-probabilities are served without ``stream``.
Arguments OpenAI knows but llmopt does not implement (``best_of``, presence and
frequency penalties, tools...) are accepted at their no-op values and answered 400
otherwise, so a client never gets silently different behaviour.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

MAX_LOGPROBS = 20  # vLLM's default --max-logprobs

# argument -> the values that mean "not used"
NO_OP = {
    "n": (None, 1),
    "best_of": (None, 1),
    "echo": (None, False),
    "suffix": (None, ""),
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "presence_penalty": (None, 0),
    "frequency_penalty": (None, 0),
    "logit_bias": (None, {}),
    "tools": (None, []),
    "tool_choice": (None, "none", "auto"),
    "response_format": (None, {"type": "text"}),
}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(Strict):
    include_usage: bool = Field(True, description="Send a last chunk with the token usage before [DONE] "
                                "(vLLM's default once stream_options is given).")
    continuous_usage_stats: bool = Field(False, description="vLLM's extension: with include_usage, every chunk "
                                         "carries the usage so far.")


class Sampling(Strict):
    """Arguments both generation endpoints take."""

    model: Optional[str] = Field(None, description="The served model's name (see GET /v1/models); may be left out.")
    max_tokens: Optional[int] = Field(None, ge=1, description="Most tokens to generate.")
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="0 is greedy; higher samples more freely.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Sample from the smallest token set with this probability.")
    top_k: Optional[int] = Field(None, ge=-1, description="vLLM: sample from the k most likely tokens (-1, 0 or "
                                 "None: all). Greedy (temperature 0) ignores it.")
    repetition_penalty: Optional[float] = Field(None, gt=0.0, description="vLLM: divide a positive logit (multiply a "
                                                "negative one) of each token already in the prompt or the output "
                                                "by this; 1 or None: off. Applies to greedy decoding too.")
    ignore_eos: bool = Field(False, description="vLLM: do not stop at the end-of-sequence token; generate max_tokens.")
    min_tokens: int = Field(0, ge=0, description="vLLM: no end-of-sequence token and no stop string before this "
                            "many tokens.")
    stop: Union[str, list[str], None] = Field(None, description="Strings that end the completion (not included); "
                                              "any number, as vLLM takes them.")
    seed: Optional[int] = Field(None, description="Seed of the sampler: the same seed, prompt and arguments repeat an answer.")
    stream: bool = Field(False, description="Send server-sent events as tokens are generated.")
    stream_options: Optional[StreamOptions] = Field(None, description="Options of a streamed answer.")
    n: Optional[int] = Field(None, ge=1, description="Choices per prompt (without stream); with a seed, choice k "
                             "samples with seed + k.")
    presence_penalty: Optional[float] = Field(None, description="Not supported (0 only).")
    frequency_penalty: Optional[float] = Field(None, description="Not supported (0 only).")
    logit_bias: Optional[dict[str, float]] = Field(None, description="Not supported.")
    user: Optional[str] = Field(None, description="An end-user id; accepted and ignored.")

    IMPLEMENTED: ClassVar[tuple[str, ...]] = ("n",)  # NO_OP arguments this endpoint implements

    def choices(self) -> int:
        return self.n or 1

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def continuous_usage(self) -> bool:
        """Usage in every chunk: vLLM's ``continuous_usage_stats``, which needs ``include_usage``."""
        return self.include_usage() and self.stream_options.continuous_usage_stats

    def limit(self) -> int | None:
        """The most tokens to generate, as asked."""
        return self.max_tokens

    def unsupported(self) -> str | None:
        """The first argument set to a value llmopt does not implement, as a message; or None."""
        for name, values in NO_OP.items():
            if name in type(self).model_fields and name not in self.IMPLEMENTED and getattr(self, name) not in values:
                return f"{name}={getattr(self, name)!r} is not supported by this server"
        limit = self.limit()
        if limit is not None and self.min_tokens > limit:
            return f"min_tokens ({self.min_tokens}) must be at most max_tokens ({limit})"
        return None


class CompletionRequest(Sampling):
    prompt: Union[str, list[str], list[int], list[list[int]]] = Field(
        description="The prompt: text or token ids, or a list of prompts (one choice each, or n).")
    max_tokens: Optional[int] = Field(16, ge=0, description="Most tokens to generate (OpenAI's default: 16); 0 only "
                                      "with echo: score the prompt, generate nothing.")
    echo: Optional[bool] = Field(None, description="Return the prompt before the completion (with its "
                                 "log-probabilities when logprobs is set).")
    logprobs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS, description="Return each token's "
                                    "log-probability, and this many of the most likely tokens at its position.")
    best_of: Optional[int] = Field(None, description="Not supported (1 only).")
    suffix: Optional[str] = Field(None, description="Not supported.")

    IMPLEMENTED: ClassVar[tuple[str, ...]] = ("n", "echo", "logprobs")

    def unsupported(self) -> str | None:
        if self.max_tokens == 0 and not self.echo:
            return "max_tokens must be at least 1 (0 only with echo=true, to score the prompt)"
        if self.stream and (self.echo or self.logprobs is not None):
            return "echo and logprobs are supported without stream only"
        if self.stream and (self.choices() > 1 or isinstance(self.prompt, list) and len(self.prompt) > 1
                            and isinstance(self.prompt[0], (str, list))):
            return "n > 1 and several prompts are supported without stream only"
        return super().unsupported()


class TextPart(Strict):
    type: Literal["text"]
    text: str


class Message(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[TextPart], None] = None
    name: Optional[str] = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(Sampling):
    messages: list[Message] = Field(min_length=1, description="The conversation so far.")
    max_completion_tokens: Optional[int] = Field(None, ge=1, description="Most tokens to generate (same as max_tokens).")
    logprobs: Optional[bool] = Field(None, description="Return each generated token's log-probability "
                                     "(choices[i].logprobs.content; without stream).")
    top_logprobs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS, description="With logprobs: this many of the "
                                        "most likely tokens at each position.")
    tools: Optional[list[dict[str, Any]]] = Field(None, description="Not supported.")
    tool_choice: Union[str, dict[str, Any], None] = Field(None, description="Not supported.")
    parallel_tool_calls: Optional[bool] = Field(None, description="Accepted and ignored (no tools).")
    response_format: Optional[dict[str, Any]] = Field(None, description="Only {\"type\": \"text\"}.")
    store: Optional[bool] = Field(None, description="Accepted and ignored: nothing is stored.")
    metadata: Optional[dict[str, str]] = Field(None, description="Accepted and ignored.")

    IMPLEMENTED: ClassVar[tuple[str, ...]] = ("n", "logprobs", "top_logprobs")

    def limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def unsupported(self) -> str | None:
        if self.top_logprobs and not self.logprobs:
            return "top_logprobs needs logprobs=true"
        if self.stream and (self.choices() > 1 or self.logprobs):
            return "n > 1 and logprobs are supported without stream only"
        return super().unsupported()


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(BaseModel):
    """Per token of the returned text: its text, offset in the text, log-probability (None for the
    first prompt token: nothing predicts it) and the most likely tokens there."""

    tokens: list[str]
    text_offset: list[int]
    token_logprobs: list[Optional[float]]
    top_logprobs: list[Optional[dict[str, float]]]


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: Optional[CompletionLogprobs] = None
    finish_reason: Optional[str] = None


class Completion(BaseModel):
    """A completion, or one chunk of a streamed one."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Optional[Usage] = None


class ChatMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatMessage
    logprobs: Optional[dict] = None
    finish_reason: Optional[str] = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    role: Optional[Literal["assistant"]] = None
    content: Optional[str] = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    logprobs: None = None
    finish_reason: Optional[str] = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Optional[Usage] = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "llmopt"
    max_model_len: int
    llmopt: Optional[dict] = Field(None, description="What answers: model_digest (sha256 of the model folder's files), "
                                   "runtime, device and library versions. Clients may cache scores on it.")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def error_body(message: str, kind: str = "invalid_request_error", code: str | None = None,
               param: str | None = None) -> dict:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
