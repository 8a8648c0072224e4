"""Runtime: any OpenAI-compatible HTTP endpoint (vLLM, SGLang, trtllm-serve, ...).

Evaluates a model as it is served. Prompts are sent as token ids (tokenized
locally with the model folder's tokenizer, so baseline and candidate see the
same tokens):

* ``nll`` posts ``/v1/completions`` with ``echo=true, logprobs=1, max_tokens=0``
  and sums the returned prompt log-probabilities. A server that refuses
  ``max_tokens=0`` is asked once more with ``max_tokens=1`` and the generated
  token's entry is dropped. A server that does not return one log-probability
  per prompt token (llama.cpp's server returns them for generated tokens only)
  fails with a clear error instead of scoring silently wrong;
* ``generate`` posts ``/v1/completions`` greedily (``temperature=0``);
* ``chat`` posts ``/v1/chat/completions`` with a user message.

The served model name comes from ``GET /v1/models`` unless given. An API key,
when the server needs one, is read from ``LLMOPT_API_KEY`` and sent as
``Authorization: Bearer`` (never written anywhere); a server that refuses it
fails with a message that says so.

``probe`` asks a server, in a few small requests, whether it can do what an eval
needs (it answers; it echoes prompt log-probabilities; it generates; it chats),
so that a plan fails before any model is scored rather than after the baseline.
Needs: httpx, and transformers for the tokenizer.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from llmopt import apikey
from llmopt.libraries import require
from llmopt.runtimes import hf_adds_bos
from llmopt.errors import StageFailed

LOGPROB_FIX = ("serve the model with an engine whose completions API echoes prompt log-probabilities "
               "(vLLM, SGLang, llmopt serve), or score in-process with runtime = \"transformers\"")


KEEPALIVE_S = 2.0  # see EndpointRuntime.__init__
PROBE_PROMPT = "The river ran past the old mill, and the miller watched it go."
NEED_WORDS = {
    "answers": "answer",
    "loglikelihood": "score log-likelihoods (perplexity, multiple_choice, lm-eval log-likelihood tasks)",
    "generation": "generate text on /v1/completions",
    "chat": "answer chat on /v1/chat/completions",
}


def auth_headers() -> dict:
    """``Authorization: Bearer`` with the key in LLMOPT_API_KEY, when it is set (llmopt/apikey.py)."""
    return apikey.headers()


def key_refused(url: str, status: int) -> tuple[str, str]:
    """(message, fix) for a server that refused the request for want of the right API key."""
    sent = f"the key in {apikey.ENV} was refused" if apikey.from_env() else "no key was sent"
    return (f"endpoint {url} wants an API key: GET /models answered {status} ({sent})",
            f"set {apikey.ENV} to the key the server was started with")


def base_url(url: str) -> str:
    """``http://host:port`` or ``http://host:port/v1`` -> ``http://host:port/v1``."""
    url = url.rstrip("/")
    for suffix in ("/completions", "/chat/completions"):
        if url.endswith(suffix):
            url = url[: -len(suffix)]
    return url if url.endswith("/v1") else url + "/v1"


class EndpointRuntime:
    """An OpenAI-compatible server, with a local tokenizer."""

    name = "endpoint"

    def __init__(self, model_dir: Path | None, device: str = "cpu", trust_remote_code: bool = False,
                 url: str | None = None, served_model: str | None = None, timeout: float = 300.0,
                 concurrency: int = 8):
        if not url:
            raise StageFailed("the endpoint runtime needs a URL", fix="set endpoint = \"http://host:port/v1\"")
        httpx = require("httpx", "serve", "the endpoint runtime")
        transformers = require("transformers", "core", "the endpoint runtime's tokenizer")
        self.url = base_url(url)
        # Idle connections are dropped after 2 s, before the 5 s after which uvicorn (vLLM's, SGLang's and
        # llmopt serve's server) closes them: a request is then not sent on a connection being closed.
        self.client = httpx.Client(timeout=timeout, headers=auth_headers(),
                                   limits=httpx.Limits(keepalive_expiry=KEEPALIVE_S))
        self.concurrency = concurrency
        if model_dir is None:
            raise StageFailed("the endpoint runtime needs a tokenizer folder", fix="pass the model folder the endpoint serves")
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
        self.adds_bos = hf_adds_bos(self.tokenizer)
        self.model = served_model or self._served_model()
        self._echo_tokens = 0  # max_tokens used with echo; becomes 1 when the server refuses 0

    def _post(self, path: str, body: dict, allow_error: bool = False):
        """POST ``body``; a dropped connection (a reset, a close before the answer) is tried once more,
        since every request here is greedy or scores a prompt, so sending it again changes nothing."""
        import httpx

        for attempt in (1, 2):
            try:
                response = self.client.post(self.url + path, json=body)
                break
            except (httpx.NetworkError, httpx.RemoteProtocolError) as exc:
                if attempt == 2:
                    raise StageFailed(f"endpoint {self.url}{path} did not answer: {exc} (tried twice)",
                                      fix="check that the server is up and the URL is right") from None
            except httpx.HTTPError as exc:
                raise StageFailed(f"endpoint {self.url}{path} did not answer: {exc}",
                                  fix="check that the server is up and the URL is right") from None
        if response.status_code >= 400 and not allow_error:
            raise StageFailed(f"endpoint {self.url}{path} answered {response.status_code}: {response.text[:300]}",
                              fix="check the server's log; the request is an OpenAI-compatible one")
        return response

    def _served_model(self) -> str:
        import httpx

        try:
            response = self.client.get(self.url + "/models")
            if response.status_code in (401, 403):
                message, fix = key_refused(self.url, response.status_code)
                raise StageFailed(message, fix=fix)
            response.raise_for_status()
            models = response.json().get("data") or []
        except (httpx.HTTPError, ValueError) as exc:
            raise StageFailed(f"could not list the models served at {self.url}: {exc}",
                              fix="check the URL, or set endpoint_model to the served model's name") from None
        if not models:
            raise StageFailed(f"{self.url}/models lists no model", fix="set endpoint_model to the served model's name")
        return str(models[0]["id"])

    def encode(self, text: str, bos: bool = True) -> list[int]:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        bos_id = self.tokenizer.bos_token_id
        return ([bos_id] if bos and bos_id is not None else []) + ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def nll(self, sequences: list[list[int]], scored: list[int]) -> list[float]:
        if not sequences:
            return []
        first = self._prompt_logprobs(sequences[0])  # settles max_tokens before going concurrent
        with ThreadPoolExecutor(self.concurrency) as pool:
            rest = list(pool.map(self._prompt_logprobs, sequences[1:]))
        out = []
        for seq, n, logprobs in zip(sequences, scored, [first] + rest):
            out.append(-sum(logprobs[len(seq) - n:]))
        return out

    def _prompt_logprobs(self, seq: list[int]) -> list[float]:
        """Log-probability of each prompt token (the first is 0: nothing predicts it)."""
        body = {"model": self.model, "prompt": seq, "echo": True, "logprobs": 1, "temperature": 0,
                "max_tokens": self._echo_tokens}
        response = self._post("/completions", body, allow_error=self._echo_tokens == 0)
        if response.status_code >= 400:  # some servers refuse max_tokens=0: ask for one token and drop it
            self._echo_tokens = 1
            response = self._post("/completions", dict(body, max_tokens=1))
        choice = (response.json().get("choices") or [{}])[0]
        values = (choice.get("logprobs") or {}).get("token_logprobs")
        if not isinstance(values, list) or len(values) < len(seq):
            got = len(values) if isinstance(values, list) else 0
            raise StageFailed(f"endpoint {self.url} returned {got} log-probabilities for a prompt of {len(seq)} tokens: "
                              "it does not echo prompt log-probabilities (echo=true, logprobs=1)", fix=LOGPROB_FIX)
        values = values[: len(seq)]
        if any(v is None for v in values[1:]):
            raise StageFailed(f"endpoint {self.url} left some prompt log-probabilities empty",
                              fix="disable prefix caching on the server, or " + LOGPROB_FIX)
        return [0.0] + [float(v) for v in values[1:]]

    def generate(self, prompt_ids: list[int], max_new_tokens: int, stop_ids: set[int] | None = None) -> list[int]:
        body = {"model": self.model, "prompt": prompt_ids, "max_tokens": max_new_tokens, "temperature": 0}
        choice = (self._post("/completions", body).json().get("choices") or [{}])[0]
        return self.encode(choice.get("text") or "", bos=False)

    def chat(self, text: str, max_new_tokens: int) -> str:
        """Greedy reply of the served model to one user message, through its chat template."""
        body = {"model": self.model, "messages": [{"role": "user", "content": text}], "max_tokens": max_new_tokens,
                "temperature": 0}
        choice = (self._post("/chat/completions", body).json().get("choices") or [{}])[0]
        return (choice.get("message") or {}).get("content") or ""


def probe(url: str, needs, served_model: str | None = None, timeout: float = 60.0) -> list[tuple[str, str]]:
    """What the server at ``url`` cannot do of ``needs`` (keys of NEED_WORDS), as (message, fix) pairs;
    [] when it can do them all. Small requests, each the kind the eval will send: ``answers`` lists
    the served models; ``loglikelihood`` posts /completions with echo=true, logprobs=1, max_tokens=0
    (1 when the server refuses 0) and wants a log-probability for every prompt token but the first;
    ``generation`` posts /completions, ``chat`` /chat/completions, for one greedy token."""
    httpx = require("httpx", "serve", "the endpoint runtime")
    base = base_url(url)
    with httpx.Client(timeout=httpx.Timeout(timeout, connect=5.0), headers=auth_headers()) as client:
        try:
            response = client.get(base + "/models")
            if response.status_code in (401, 403):
                return [key_refused(base, response.status_code)]
            models = (response.json().get("data") or []) if response.status_code < 400 else []
        except httpx.HTTPError as exc:
            return [(f"endpoint {base} does not answer: {exc}",
                     "start the server first (`llmopt serve PATH`, vLLM, ...) or fix the URL")]
        except (ValueError, AttributeError):
            return [(f"endpoint {base}/models does not answer JSON: it is not an OpenAI-compatible API",
                     "give the server's base URL, such as http://127.0.0.1:8000/v1")]
        if not models and served_model is None:
            return [(f"endpoint {base}/models lists no model (HTTP {response.status_code})",
                     "check that the URL is an OpenAI-compatible server, or set endpoint_model")]
        model = served_model or str(models[0].get("id"))
        problems = []
        for need in [n for n in NEED_WORDS if n in set(needs) and n != "answers"]:
            try:
                problem = PROBES[need](client, base, model)
            except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
                problem = f"its answer could not be read: {type(exc).__name__}: {exc}"
            if problem:
                fix = LOGPROB_FIX if need == "loglikelihood" else "check the server's log and its OpenAI API"
                problems.append((f"endpoint {base} cannot {NEED_WORDS[need]}: {problem}", fix))
        return problems


def served_identity(url: str, served_model: str | None = None, timeout: float = 10.0) -> dict | None:
    """The ``llmopt`` entry of the served model in ``GET /v1/models`` (``llmopt serve`` lists the model
    files' digest, the runtime and its library versions there), or None: another engine, or no answer.
    Scores through a server that names what it serves can be cached like in-process scores."""
    httpx = require("httpx", "serve", "the endpoint runtime")
    try:
        with httpx.Client(timeout=httpx.Timeout(timeout, connect=5.0), headers=auth_headers()) as client:
            models = client.get(base_url(url) + "/models").json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    chosen = [m for m in models if isinstance(m, dict) and (served_model is None or m.get("id") == served_model)]
    found = chosen[0].get("llmopt") if chosen else None
    return found if isinstance(found, dict) and str(found.get("model_digest", "")).startswith("sha256:") else None


def refused(response) -> str:
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = response.text[:300]
    return f"HTTP {response.status_code}: {message}"


def probe_loglikelihood(client, base: str, model: str) -> str | None:
    body = {"model": model, "prompt": PROBE_PROMPT, "echo": True, "logprobs": 1, "temperature": 0, "max_tokens": 0}
    response = client.post(base + "/completions", json=body)
    if response.status_code >= 400:  # as the endpoint runtime does: ask for one token and drop it
        first, body["max_tokens"] = refused(response), 1
        response = client.post(base + "/completions", json=body)
        if response.status_code >= 400:
            return f"POST /completions with echo=true, logprobs=1 answered {first}; with max_tokens=1, {refused(response)}"
    answer = response.json()
    values = ((answer["choices"][0] or {}).get("logprobs") or {}).get("token_logprobs")
    counted = (answer.get("usage") or {}).get("prompt_tokens")
    prompt_tokens = int(counted or 2)
    if not isinstance(values, list) or len(values) < prompt_tokens:
        got = len(values) if isinstance(values, list) else 0
        size = f"{prompt_tokens} tokens" if counted else "several tokens"
        return (f"it returned {got} log-probabilities for a prompt of {size} with echo=true, logprobs=1: "
                "it does not echo prompt log-probabilities")
    if any(not isinstance(v, (int, float)) for v in values[1:prompt_tokens]):
        return "it left some prompt log-probabilities empty"
    return None


def probe_generation(client, base: str, model: str) -> str | None:
    body = {"model": model, "prompt": PROBE_PROMPT, "max_tokens": 1, "temperature": 0}
    response = client.post(base + "/completions", json=body)
    if response.status_code >= 400:
        return f"POST /completions answered {refused(response)}"
    return None if isinstance(response.json()["choices"][0].get("text"), str) else "its answer has no text"


def probe_chat(client, base: str, model: str) -> str | None:
    body = {"model": model, "messages": [{"role": "user", "content": PROBE_PROMPT}], "max_tokens": 1, "temperature": 0}
    response = client.post(base + "/chat/completions", json=body)
    if response.status_code >= 400:
        return f"POST /chat/completions answered {refused(response)}"
    message = response.json()["choices"][0].get("message") or {}
    return None if "content" in message else "its answer has no message content"


PROBES = {"loglikelihood": probe_loglikelihood, "generation": probe_generation, "chat": probe_chat}
