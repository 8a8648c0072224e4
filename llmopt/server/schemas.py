"""Request and response bodies of the OpenAI-compatible API.

Requests are strict, as OpenAI's API is: an argument the API does not know is a
400 ("Unrecognized request argument supplied"). Arguments OpenAI knows but llmopt
does not implement (``n`` > 1, ``logprobs``, penalties, tools...) are accepted at
their no-op values and answered 400 otherwise, so a client never gets silently
different behaviour.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

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
    include_usage: bool = Field(False, description="Send a last chunk with the token usage before [DONE].")


class Sampling(Strict):
    """Arguments both generation endpoints take."""

    model: Optional[str] = Field(None, description="The served model's name (see GET /v1/models); may be left out.")
    max_tokens: Optional[int] = Field(None, ge=1, description="Most tokens to generate.")
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="0 is greedy; higher samples more freely.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Sample from the smallest token set with this probability.")
    stop: Union[str, list[str], None] = Field(None, description="Up to 4 strings that end the completion (not included).")
    seed: Optional[int] = Field(None, description="Seed of the sampler: the same seed, prompt and arguments repeat an answer.")
    stream: bool = Field(False, description="Send server-sent events as tokens are generated.")
    stream_options: Optional[StreamOptions] = Field(None, description="Options of a streamed answer.")
    n: Optional[int] = Field(None, description="Choices per prompt; only 1 is supported.")
    logprobs: Union[bool, int, None] = Field(None, description="Not supported.")
    presence_penalty: Optional[float] = Field(None, description="Not supported (0 only).")
    frequency_penalty: Optional[float] = Field(None, description="Not supported (0 only).")
    logit_bias: Optional[dict[str, float]] = Field(None, description="Not supported.")
    user: Optional[str] = Field(None, description="An end-user id; accepted and ignored.")

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def unsupported(self) -> str | None:
        """The first argument set to a value llmopt does not implement, as a message; or None."""
        for name, values in NO_OP.items():
            if name in type(self).model_fields and getattr(self, name) not in values:
                return f"{name}={getattr(self, name)!r} is not supported by this server"
        if len(self.stops()) > 4:
            return "stop takes at most 4 strings"
        return None


class CompletionRequest(Sampling):
    prompt: Union[str, list[str], list[int], list[list[int]]] = Field(
        description="The prompt: text or token ids (one prompt per request).")
    max_tokens: Optional[int] = Field(16, ge=1, description="Most tokens to generate (OpenAI's default: 16).")
    echo: Optional[bool] = Field(None, description="Not supported.")
    best_of: Optional[int] = Field(None, description="Not supported (1 only).")
    suffix: Optional[str] = Field(None, description="Not supported.")


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
    top_logprobs: Optional[int] = Field(None, description="Not supported.")
    tools: Optional[list[dict[str, Any]]] = Field(None, description="Not supported.")
    tool_choice: Union[str, dict[str, Any], None] = Field(None, description="Not supported.")
    parallel_tool_calls: Optional[bool] = Field(None, description="Accepted and ignored (no tools).")
    response_format: Optional[dict[str, Any]] = Field(None, description="Only {\"type\": \"text\"}.")
    store: Optional[bool] = Field(None, description="Accepted and ignored: nothing is stored.")
    metadata: Optional[dict[str, str]] = Field(None, description="Accepted and ignored.")


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: None = None
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
    logprobs: None = None
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


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def error_body(message: str, kind: str = "invalid_request_error", code: str | None = None,
               param: str | None = None) -> dict:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
