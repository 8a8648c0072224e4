"""The FastAPI app: OpenAI-compatible completions and chat over one served model.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (JSON, or
server-sent events with ``stream: true``), ``GET /v1/models``, ``GET /health`` and
``GET /metrics``; with an API key, every route but the last two wants it (llmopt/server/auth.py).
Generation runs on the scheduler's worker threads; a handler
tokenizes, queues a job and relays the job's events. A client that goes away
cancels its job: a streamed answer notices when its send is cancelled, a plain
one polls for the disconnect while it waits. A completion with ``echo`` and
``max_tokens=0`` generates nothing: the worker scores its prompt between two tokens
of the running job (llmopt/server/logprobs.py), as it tokenizes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from llmopt.catalog.engines import SWEEP_QUEUE
from llmopt.server import logprobs, schemas, workers
from llmopt.model.chat import NoChatTemplate, render_chat
from llmopt.server.auth import ApiKeyMiddleware
from llmopt.server.metrics import CONTENT_TYPE, Metrics
from llmopt.server.model import ServedModel
from llmopt.server.batching import BatchScheduler
from llmopt.server.scheduler import Job, QueueFull, Scheduler, needs_stream

log = logging.getLogger("llmopt.server")

ENDPOINT_OF_PATH = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}
DISCONNECT_POLL_S = 0.25


class ApiError(Exception):
    """An error answered as OpenAI's error JSON with this HTTP status."""

    STATUS_OF = {400: "invalid", 404: "not_found", 429: "queue_full"}  # the worker counts its own errors

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None):
        super().__init__(message)
        self.status, self.body = status, schemas.error_body(message, kind, code, param)


def create_app(served: ServedModel, max_queue: int = SWEEP_QUEUE, parallel: int = 1,
               api_key: str | None = None, max_num_seqs: int | None = None) -> FastAPI:
    """The app serving ``served``; its ``parallel`` worker threads run while the app's lifespan does, each
    generating in a process of its own when ``parallel`` > 1 and the runtime is not ``concurrent``. With
    ``max_num_seqs``, one thread steps onnxruntime-genai's engine over up to that many requests instead
    (llmopt/server/batching.py), where the runtime has one; else the worker threads serve. With
    ``api_key``, a request without ``Authorization: Bearer <api_key>`` is answered 401 (but /health and
    /metrics)."""
    metrics = Metrics()
    scheduler = make_scheduler(served, metrics, max_queue, parallel, max_num_seqs)
    metrics.scheduler = {"scheduler": scheduler.scheduler, "max_num_seqs": str(scheduler.parallel)}
    log.info("scheduler: %s, %d request(s) generated at once", scheduler.scheduler, scheduler.parallel)

    @asynccontextmanager
    async def lifespan(app):
        scheduler.start()
        served.warm()  # the tokenizer opens in the background: readiness and token-id requests do not wait
        yield
        await asyncio.to_thread(scheduler.close)

    app = FastAPI(title="llmopt serve", summary=f"OpenAI-compatible API over {served.name}", lifespan=lifespan)
    app.state.served, app.state.scheduler, app.state.metrics = served, scheduler, metrics
    add_error_handlers(app, metrics)
    if api_key:
        app.add_middleware(ApiKeyMiddleware, key=api_key)
    created = int(time.time())

    @app.post("/v1/completions")
    async def completions(body: schemas.CompletionRequest, request: Request):
        check_request(body, served)
        prompts = await asyncio.wrap_future(scheduler.call(completion_prompts, body, served))
        reply = Reply("cmpl", served.name, chat=False)
        if body.max_tokens == 0:
            return await score_prompts(body, prompts, reply, served, scheduler, metrics)
        jobs = [make_job("completions", body, ids, body.max_tokens, served, k) for ids in prompts for k in range(body.choices())]
        if len(jobs) == 1:
            return await answer(request, jobs[0], body, reply, scheduler)
        return await answer_all(request, jobs, body, reply, scheduler, len(prompts))

    @app.post("/v1/chat/completions")
    async def chat_completions(body: schemas.ChatCompletionRequest, request: Request):
        check_request(body, served)
        prompt_ids = await asyncio.wrap_future(scheduler.call(chat_prompt, body, served))
        limit = body.max_completion_tokens or body.max_tokens
        jobs = [make_job("chat", body, prompt_ids, limit, served, k) for k in range(body.choices())]
        reply = Reply("chatcmpl", served.name, chat=True)
        if len(jobs) == 1 and not body.logprobs:
            return await answer(request, jobs[0], body, reply, scheduler)
        return await answer_all(request, jobs, body, reply, scheduler, 1)

    @app.get("/v1/models")
    async def models() -> schemas.ModelList:
        return schemas.ModelList(data=[schemas.ModelCard(id=served.name, created=created,
                                                         max_model_len=served.max_model_len,
                                                         llmopt=served.identity)])

    @app.get("/health")
    async def health():
        ok = scheduler.alive
        return JSONResponse({"status": "ok" if ok else "worker stopped", "model": served.name,
                             "queue_depth": metrics.waiting, "running": metrics.running,
                             "scheduler": scheduler.scheduler},
                            status_code=200 if ok else 503)

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    return app


def make_scheduler(served: ServedModel, metrics: Metrics, max_queue: int, parallel: int,
                   max_num_seqs: int | None) -> Scheduler:
    """The engine scheduler with ``max_num_seqs`` where the runtime has an engine (else, logged, the worker
    threads); ``parallel`` > 1: worker processes, unless the runtime is ``concurrent``."""
    if max_num_seqs is not None:
        if parallel > 1:
            raise ValueError("max_num_seqs batches in one model copy: parallel must be 1")
        opener = getattr(served.runtime, "batch_engine", None)
        batch = opener(max_num_seqs, served.max_model_len) if opener else None
        if batch is not None:
            return BatchScheduler(served.runtime, batch, metrics, max_queue, max_num_seqs)
        refusal = getattr(served.runtime, "batch_refusal", None)
        if refusal:
            log.warning("the model is not batched: %s; one request generates at a time", refusal)
        else:
            log.warning("the %s runtime has no batching engine here (onnxruntime-genai with og.Engine, 0.18 or "
                        "later): one request generates at a time", served.runtime.name)
    generators = None
    if parallel > 1 and not getattr(served.runtime, "concurrent", False):
        if not getattr(served.runtime, "processes", False):
            raise ValueError(f"the {served.runtime.name} runtime generates one request at a time: parallel must be 1")
        generators = workers.start(served.runtime.name, served.model_dir, parallel, served.device)
    return Scheduler(served.runtime, metrics, max_queue, parallel, generators)


def add_error_handlers(app: FastAPI, metrics: Metrics) -> None:
    """Errors as OpenAI's error JSON, counted in the metrics by endpoint."""

    def count(request: Request, status: int) -> None:
        endpoint = ENDPOINT_OF_PATH.get(request.url.path)
        if endpoint and status in ApiError.STATUS_OF:
            metrics.count(endpoint, ApiError.STATUS_OF[status])

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError):
        count(request, exc.status)
        return JSONResponse(exc.body, status_code=exc.status, headers={"Retry-After": "1"} if exc.status == 429 else None)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        count(request, 400)
        message, param = validation_message(exc.errors())
        return JSONResponse(schemas.error_body(message, param=param), status_code=400)


def validation_message(errors) -> tuple[str, str | None]:
    """One message for pydantic's errors, in OpenAI's words where it has them."""
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    if first.get("type") == "json_invalid":
        return f"The request body is not valid JSON: {first.get('ctx', {}).get('error', first.get('msg'))}", None
    if first.get("type") == "extra_forbidden":
        return f"Unrecognized request argument supplied: {param}", param
    if not loc and first.get("type") == "missing":
        return "The request body is empty: send a JSON object", None
    if not loc and isinstance(first.get("input"), (bytes, bytearray)):  # not parsed: another content type
        return "The request body must be JSON, sent with the header Content-Type: application/json", None
    text = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body') or 'body'}: {e.get('msg')}"
                     for e in errors[:5])
    return f"Invalid request: {text}", param


def check_request(body: schemas.Sampling, served: ServedModel) -> None:
    if body.model is not None and body.model != served.name:
        raise ApiError(404, f"The model `{body.model}` does not exist; this server serves `{served.name}`.",
                       code="model_not_found", param="model")
    problem = body.unsupported()
    if problem:
        raise ApiError(400, problem)
    if not hasattr(served.runtime, "stream") and needs_stream(job_of(body, [], 1)):
        raise ApiError(400, f"the {served.runtime.name} runtime can only generate greedily to the end of the "
                       "text: pass temperature 0, no repetition_penalty, min_tokens or ignore_eos")
    asks = body.logprobs is not None if isinstance(body, schemas.CompletionRequest) else bool(body.logprobs)
    if asks and not hasattr(served.runtime, "logits"):
        raise ApiError(400, f"the {served.runtime.name} runtime cannot return log-probabilities", param="logprobs")


def completion_prompts(body: schemas.CompletionRequest, served: ServedModel) -> list[list[int]]:
    """The token ids of each prompt of the request (a text, token ids, or a list of either)."""
    prompt = body.prompt
    prompts = prompt if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)) else [prompt]
    return [prompt_ids(p, served) for p in prompts]


def prompt_ids(prompt: str | list[int], served: ServedModel) -> list[int]:
    if isinstance(prompt, str):
        return served.tokenize(prompt)
    if not prompt:
        raise ApiError(400, "the prompt is empty", param="prompt")
    bad = [t for t in prompt if t < 0 or (served.vocab_size is not None and t >= served.vocab_size)]
    if bad:
        raise ApiError(400, f"token id {bad[0]} is outside the vocabulary (0..{served.vocab_size})", param="prompt")
    return list(prompt)


def chat_prompt(body: schemas.ChatCompletionRequest, served: ServedModel) -> list[int]:
    from jinja2 import TemplateError

    messages = [{"role": m.role, "content": m.text(), **({"name": m.name} if m.name else {})} for m in body.messages]
    try:
        text = render_chat(served.runtime, served.model_dir, messages)
    except NoChatTemplate as exc:
        raise ApiError(400, f"{exc}; use /v1/completions, or add chat_template.jinja to the model folder") from None
    except TemplateError as exc:
        raise ApiError(400, f"the model's chat template rejected the messages: {exc}", param="messages") from None
    return served.tokenize(text, special=False)


def make_job(endpoint: str, body: schemas.Sampling, prompt_ids: list[int], max_tokens: int | None,
             served: ServedModel, choice: int = 0) -> Job:
    """A job, once the prompt and the completion fit the served context; ``choice`` k of ``n`` samples
    with ``seed + k`` when a seed is given, so that the n choices differ and repeat."""
    limit, n_prompt = served.max_model_len, len(prompt_ids)
    if max_tokens is None:  # chat without a limit: up to the end of the context
        max_tokens = limit - n_prompt
    check_length(n_prompt, max_tokens, limit)
    job = job_of(body, prompt_ids, max_tokens, endpoint)
    job.scored = wants_scores(body)
    if choice and job.seed is not None:
        job.seed += choice
    return job


def check_length(n_prompt: int, max_tokens: int, limit: int, least: int = 1) -> None:
    """A 400 unless the prompt and ``max_tokens`` (at least ``least``) fit the served context."""
    if n_prompt + max(max_tokens, least) > limit:
        raise ApiError(400, f"This model's maximum context length is {limit} tokens. However, you requested "
                       f"{n_prompt + max_tokens} tokens ({n_prompt} in the prompt, {max_tokens} for the completion). "
                       "Please reduce the length of the prompt or of max_tokens.", code="context_length_exceeded")


def job_of(body: schemas.Sampling, prompt_ids: list[int], max_tokens: int, endpoint: str = "completions") -> Job:
    """The job of a request's sampling arguments, with vLLM's defaults for its extensions."""
    penalty = 1.0 if body.repetition_penalty is None else body.repetition_penalty
    return Job(endpoint, prompt_ids, max_tokens, body.temperature, body.top_p, body.seed, body.stops(),
               top_k=max(body.top_k or 0, 0), repetition_penalty=penalty, min_tokens=body.min_tokens,
               ignore_eos=body.ignore_eos)


async def score_prompts(body: schemas.CompletionRequest, prompts: list[list[int]], reply: "Reply",
                        served: ServedModel, scheduler: Scheduler, metrics: Metrics):
    """``echo`` with ``max_tokens=0``: each prompt with its log-probabilities, nothing generated (``n``
    copies of each: there is nothing to sample)."""
    for ids in prompts:
        check_length(len(ids), 0, served.max_model_len, least=0)
        if not ids:
            raise ApiError(400, "the prompt is empty: there is nothing to echo", param="prompt")
    choices = []
    for index, ids in enumerate(prompts):
        started = time.monotonic()
        text, scores = await scored(scheduler, body, ids, [], "", index)
        metrics.finished("completions", "ok", len(ids), 0, time.monotonic() - started)
        choices += [(text, "length", scores)] * body.choices()
    usage = reply.usage_of(sum(len(ids) for ids in prompts), 0)
    return JSONResponse(reply.full_choices(choices, usage))


async def scored(scheduler: Scheduler, body: schemas.Sampling, prompt_ids: list[int], generated: list[int],
                 text: str, index: int = 0) -> tuple[str, dict | None]:
    """The choice's text and logprobs (completions: with ``echo`` / ``logprobs``; chat: with ``logprobs``),
    computed on the worker thread; ``index``: which of the request's prompts."""
    if isinstance(body, schemas.ChatCompletionRequest):
        call = (logprobs.chat_logprobs, scheduler.runtime, prompt_ids, generated, body.top_logprobs or 0)
    else:
        call = (logprobs.choice_parts, scheduler.runtime, prompt_ids, prompt_string(body, index), generated, text,
                bool(body.echo), body.logprobs)
    try:
        result = await asyncio.wrap_future(scheduler.call(*call))
    except Exception as exc:  # the runtime could not score: this request fails, not the server
        raise ApiError(500, f"scoring the tokens failed: {type(exc).__name__}: {exc}", kind="server_error") from None
    return (text, result) if isinstance(body, schemas.ChatCompletionRequest) else result


def prompt_string(body: schemas.CompletionRequest, index: int = 0) -> str | None:
    """Prompt ``index`` as the client wrote it, when it is text (what ``echo`` returns); None for token ids."""
    prompt = body.prompt[index] if isinstance(body.prompt, list) and body.prompt \
        and isinstance(body.prompt[0], (str, list)) else body.prompt
    return prompt if isinstance(prompt, str) else None


async def answer(request: Request, job: Job, body: schemas.Sampling, reply: "Reply", scheduler: Scheduler):
    """Queue the job; relay its events as server-sent events or as one JSON answer."""
    loop, events = asyncio.get_running_loop(), asyncio.Queue()
    job.emit = lambda event: loop.call_soon_threadsafe(events.put_nowait, event)
    try:
        scheduler.submit(job)
    except QueueFull as exc:
        raise ApiError(429, f"The server is busy: {exc}. Retry shortly.", kind="rate_limit_exceeded",
                       code="rate_limit_exceeded") from None
    if body.stream:
        return StreamingResponse(sse(job, events, reply, body, scheduler),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"},
                                 background=BackgroundTask(scheduler.cancel, job))
    done = await collect(request, job, events, scheduler)
    if done is None:
        return Response(status_code=499)  # nobody reads it
    text, finish, completion_tokens = done
    scores = None
    if wants_scores(body):
        text, scores = await scored(scheduler, body, job.prompt_ids, job.tokens, text)
    return JSONResponse(reply.full(text, finish, reply.usage(job, completion_tokens), scores))


async def answer_all(request: Request, jobs: list[Job], body: schemas.Sampling, reply: "Reply",
                     scheduler: Scheduler, prompts: int):
    """Several choices (``n`` > 1, several prompts, or chat with ``logprobs``): every job queued at once
    (all or none: a full queue refuses the request), the answers gathered into one JSON answer, choice
    ``i * n + k`` the k-th of prompt i, as vLLM orders them."""
    if body.stream:
        raise ApiError(400, "stream is supported with one choice only: send n=1 and one prompt, or stream=false",
                       param="stream")
    loop = asyncio.get_running_loop()
    queues = []
    for job in jobs:
        events = asyncio.Queue()
        job.emit = lambda event, events=events: loop.call_soon_threadsafe(events.put_nowait, event)
        queues.append(events)
    submitted = []
    try:
        for job in jobs:
            scheduler.submit(job)
            submitted.append(job)
    except QueueFull as exc:
        for job in submitted:
            scheduler.cancel(job)
        raise ApiError(429, f"The server is busy: {exc}. Retry shortly.", kind="rate_limit_exceeded",
                       code="rate_limit_exceeded") from None
    try:
        done = await asyncio.gather(*(collect(request, job, events, scheduler) for job, events in zip(jobs, queues)))
    finally:
        for job in jobs:
            scheduler.cancel(job)
    if any(d is None for d in done):
        return Response(status_code=499)
    per_prompt = len(jobs) // prompts
    choices, completion = [], 0
    for i, (job, (text, finish, tokens)) in enumerate(zip(jobs, done)):
        completion += tokens
        scores = None
        if wants_scores(body):
            text, scores = await scored(scheduler, body, job.prompt_ids, job.tokens, text, i // per_prompt)
        choices.append((text, finish, scores))
    prompt_tokens = sum(len(job.prompt_ids) for job in jobs[::per_prompt])
    return JSONResponse(reply.full_choices(choices, reply.usage_of(prompt_tokens, completion)))


def wants_scores(body: schemas.Sampling) -> bool:
    if isinstance(body, schemas.ChatCompletionRequest):
        return bool(body.logprobs)
    return bool(body.echo) or body.logprobs is not None


async def collect(request: Request, job: Job, events: asyncio.Queue, scheduler: Scheduler):
    """(text, finish_reason, completion tokens) of a job, or None when the client went away."""
    parts, loop = [], asyncio.get_running_loop()
    checked = loop.time()
    try:
        while True:
            try:
                event = await asyncio.wait_for(events.get(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                event = None
            if loop.time() - checked >= DISCONNECT_POLL_S:
                checked = loop.time()
                if await request.is_disconnected():
                    scheduler.cancel(job)
                    return None
            if event is None:
                continue
            if event[0] == "text":
                parts.append(event[1])
            elif event[0] == "error":
                raise ApiError(500, event[1], kind="server_error")
            else:
                return "".join(parts), event[1], event[2]
    finally:
        scheduler.cancel(job)  # no-op once the job has finished


async def sse(job: Job, events: asyncio.Queue, reply: "Reply", body: schemas.Sampling, scheduler: Scheduler):
    """The job's events as server-sent events; with ``continuous_usage_stats`` each chunk carries the
    usage so far (vLLM's extension), with ``include_usage`` a last chunk carries the total."""
    continuous = body.continuous_usage()

    def usage(tokens: int) -> schemas.Usage | None:
        return reply.usage(job, tokens) if continuous else None

    try:
        if reply.chat:
            yield data(reply.chunk(None, None, role=True, usage=usage(0)))
        while True:
            event = await events.get()
            if event[0] == "text":
                yield data(reply.chunk(event[1], None, usage=usage(event[2])))
            elif event[0] == "error":
                yield data(schemas.error_body(event[1], "server_error"))
                break
            else:
                yield data(reply.chunk(None if reply.chat else "", event[1], usage=usage(event[2])))
                if body.include_usage():
                    yield data(reply.usage_chunk(reply.usage(job, event[2])))
                break
        yield "data: [DONE]\n\n"
    finally:  # also when the client disconnects and the send is cancelled
        scheduler.cancel(job)


def data(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


class Reply:
    """Builds the answer objects of one request, for completions or chat."""

    def __init__(self, prefix: str, model: str, chat: bool):
        self.id, self.model, self.chat = f"{prefix}-{uuid.uuid4().hex}", model, chat
        self.created = int(time.time())

    def usage(self, job: Job, completion_tokens: int) -> schemas.Usage:
        return self.usage_of(len(job.prompt_ids), completion_tokens)

    @staticmethod
    def usage_of(prompt_tokens: int, completion_tokens: int) -> schemas.Usage:
        return schemas.Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                             total_tokens=prompt_tokens + completion_tokens)

    def full(self, text: str, finish: str, usage: schemas.Usage, scores: dict | None = None) -> dict:
        return self.full_choices([(text, finish, scores)], usage)

    def full_choices(self, choices: list[tuple[str, str, dict | None]], usage: schemas.Usage) -> dict:
        """The answer with one choice per (text, finish_reason, logprobs), indexed in order."""
        head = {"id": self.id, "created": self.created, "model": self.model, "usage": usage}
        if self.chat:
            chat = [schemas.ChatChoice(index=i, message=schemas.ChatMessage(content=text), finish_reason=finish,
                                       logprobs=scores) for i, (text, finish, scores) in enumerate(choices)]
            return schemas.ChatCompletion(**head, choices=chat).model_dump(mode="json")
        plain = [schemas.CompletionChoice(index=i, text=text, finish_reason=finish, logprobs=scores)
                 for i, (text, finish, scores) in enumerate(choices)]
        return schemas.Completion(**head, choices=plain).model_dump(mode="json")

    def chunk(self, text: str | None, finish: str | None, role: bool = False,
              usage: schemas.Usage | None = None) -> dict:
        head = {"id": self.id, "created": self.created, "model": self.model, "usage": usage}
        if self.chat:
            delta = schemas.ChatDelta(role="assistant", content="") if role else schemas.ChatDelta(content=text)
            choice = schemas.ChatChunkChoice(delta=delta, finish_reason=finish)
            payload = schemas.ChatCompletionChunk(**head, choices=[choice]).model_dump(mode="json")
            payload["choices"][0]["delta"] = delta.model_dump(exclude_none=True)  # {} on the last chunk
            return payload
        choice = schemas.CompletionChoice(text=text or "", finish_reason=finish)
        return schemas.Completion(**head, choices=[choice]).model_dump(mode="json")

    def usage_chunk(self, usage: schemas.Usage) -> dict:
        head = {"id": self.id, "created": self.created, "model": self.model, "choices": [], "usage": usage}
        model = schemas.ChatCompletionChunk if self.chat else schemas.Completion
        return model(**head).model_dump(mode="json")
