"""A simulated serving engine for the tune tests: the engine's real flag set in, latencies that depend on it out.

``python tests/sim_engine.py ENGINE ARGS...`` takes the command line the artifact's launch.sh gives the
engine (vllm: ``serve MODEL --config config.yaml ...``; trtllm: ``MODEL --backend pytorch --config
config.yaml ...``; sglang: ``--model-path MODEL --flag value ...``), reads the config file the way the
engine does (the command line wins over the file, the last value of a flag wins) and refuses any option the
pinned engine version does not have, from llmopt's flag tables of vLLM 0.33.0, TensorRT-LLM 1.2.1 and
SGLang 0.5.23 (``llmopt.deploy.flags``; vLLM's own parser is not installable on a machine without a GPU).
It then serves the OpenAI streaming API of tests/test_bench_fakeserver.py, and every answer's delays
depend on the tuned parameters:

    speed = exp(-SHARPNESS x sum over parameters of |log2(value / best value)|)   (sizes)
                                       ... of |value - best value| / 0.03      (memory fractions)
    TTFT = LLMOPT_SIM_TTFT_MS / speed, decode step = LLMOPT_SIM_ITL_MS / speed x max(1, n x (k + 1) / KNEE)

with the best values from ``LLMOPT_SIM_BEST`` (JSON: parameter -> value), so one setting is best and a
search can be checked to find it. A memory fraction above ``LLMOPT_SIM_OOM_ABOVE`` exits at start-up as an
engine out of memory does, a draft model (vLLM's ``speculative-config`` ``model``) that is not a folder exits at
start-up, and the settings of ``LLMOPT_SIM_HANG`` never answer. With speculative decoding in
its settings (vLLM's ``speculative-config``, SGLang's ``speculative-algorithm``) it drafts ``k`` tokens per step of
which a share ``LLMOPT_SIM_ACCEPTANCE`` (0.75) is accepted, and ``GET /metrics`` reports the engine's own
Prometheus counters of that (vLLM's ``vllm:spec_decode_*``, SGLang's verify steps and output tokens).

Speculation's speed depends on acceptance and load, as on a GPU: a step of ``n`` requests in flight computes
``n x (k + 1)`` tokens, which cost no more than one token's step up to ``LLMOPT_SIM_KNEE`` (8: memory-bound
decoding) and proportionally more beyond it (compute-bound); drafting adds ``DRAFT_COST`` of a step per drafted
token; each step yields ``1 + k x acceptance`` tokens a request. So k = 3 at 0.75 acceptance is about 2.5x faster
per token at one request in flight, and slower than no speculation from about 3 in flight. Answers are greedy and
deterministic: each token a word chosen by a hash of the prompt and its position, the same streamed or not, with
or without speculation, unless ``LLMOPT_SIM_SPEC_CORRUPT`` (a share, 0 to 1) makes that share of the prompts'
answers differ with speculation on, from their second token (a broken speculative path). ``GET /v1/models`` says ``llmopt_simulated: true``: llmopt labels every figure
it measures here as simulated. A child process (``sleep``, as an engine's worker) is started, its pid written
into ``LLMOPT_SIM_CHILDREN`` (a folder) when that is set, so tests can check the whole group is stopped.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from test_bench_fakeserver import FakeServer  # noqa: E402

SHARPNESS = 0.7
DRAFT_COST = 0.1  # a drafted token's share of a decode step
FRACTIONS = {"vllm": "gpu-memory-utilization", "trtllm": "free_gpu_memory_fraction", "sglang": "mem-fraction-static"}
FRONTEND = {"host", "port", "config", "model", "model-path", "backend"}


def parse(engine: str, argv: list[str]) -> dict:
    """The engine's settings from its command line and config file; exits 2 on an unknown option."""
    from llmopt.deploy import flags

    if engine == "vllm" and argv[:1] == ["serve"]:
        argv = argv[1:]
    if engine in ("vllm", "trtllm") and argv and not argv[0].startswith("--"):
        argv = argv[1:]  # the model
    cli: dict = {}
    i = 0
    while i < len(argv):
        if not argv[i].startswith("--"):
            i += 1
            continue
        name = argv[i][2:]
        if "=" in name:
            name, value = name.split("=", 1)
            i += 1
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            value, i = argv[i + 1], i + 2
        else:
            value, i = "true", i + 1
        cli[name if engine == "trtllm" else name.replace("_", "-")] = value
    settings: dict = {}
    if "config" in cli:
        import yaml

        settings = yaml.safe_load(Path(cli["config"]).read_text()) or {}
    if engine == "trtllm":
        known = flags.TRTLLM_FIELDS | {"host", "port", "config", "backend"}
        fraction = (settings.get("kv_cache_config") or {}).get("free_gpu_memory_fraction")
        if fraction is not None:
            settings["free_gpu_memory_fraction"] = fraction
        settings.pop("kv_cache_config", None)
    else:
        known = (flags.VLLM_FLAGS if engine == "vllm" else flags.SGLANG_FLAGS) | FRONTEND
    for name in list(settings) + list(cli):
        if name not in known and name != "free_gpu_memory_fraction":
            print(f"{engine}: error: unrecognized arguments: --{name}", file=sys.stderr)
            sys.exit(2)
    return settings | cli


def speed(settings: dict, best: dict) -> float:
    """1 at the best setting, lower away from it: one unit per doubling of a size, per 0.03 of a fraction."""
    def off(value: float, best_value: float) -> float:
        if best_value <= 1:  # a memory fraction
            return abs(value - best_value) / 0.03
        return abs(math.log2(value / best_value))

    return math.exp(-SHARPNESS * sum(off(float(settings[k]), float(v)) for k, v in best.items()
                                     if settings.get(k) is not None))


def drafted(engine: str, settings: dict) -> int:
    """Tokens drafted per step (0: no speculative decoding)."""
    spec = settings.get("speculative-config")
    if engine == "vllm" and spec:
        spec = json.loads(spec) if isinstance(spec, str) else spec
        return int(spec.get("num_speculative_tokens") or 1)
    if engine == "sglang" and settings.get("speculative-algorithm"):
        return int(settings.get("speculative-num-draft-tokens") or 4) - 1
    if engine == "trtllm" and settings.get("speculative_config"):
        return int(settings["speculative_config"].get("max_draft_len") or 1)
    return 0


def fraction(*parts) -> float:
    """A number in [0, 1) fixed by ``parts``."""
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2 ** 64


def answer(req: dict, n_out: int, corrupt: float) -> list[str]:
    """The greedy answer's ``n_out`` tokens (a word each) to ``req``'s prompt; a ``corrupt`` share of prompts answered
    otherwise from the second token."""
    prompt = req.get("messages") or req.get("prompt")
    words = [f" w{int(fraction(prompt, k) * 1000)}" for k in range(n_out)]
    if corrupt and fraction(prompt, "corrupt") < corrupt:
        words[1:] = [f" x{int(fraction(prompt, k, 'x') * 1000)}" for k in range(1, n_out)]
    return words


class SimServer(FakeServer):
    def __init__(self, engine: str, factor: float, k: int = 0):
        super().__init__(owned_by=engine)
        self.factor, self.k = factor, k
        self.ttft = float(os.environ.get("LLMOPT_SIM_TTFT_MS", "20")) / factor
        self.itl = float(os.environ.get("LLMOPT_SIM_ITL_MS", "5")) / factor
        self.acceptance = float(os.environ.get("LLMOPT_SIM_ACCEPTANCE", "0.75"))
        self.knee = float(os.environ.get("LLMOPT_SIM_KNEE", "8"))
        self.corrupt = float(os.environ.get("LLMOPT_SIM_SPEC_CORRUPT", "0")) if k else 0.0
        self.counts = {"steps": 0.0, "tokens": 0.0}

    def speculate(self, n_out: int) -> None:
        """Count the steps of a request of ``n_out`` tokens: each yields 1 + k x acceptance tokens."""
        if self.k:
            self.counts["steps"] += max(0, n_out - 1) / (1 + self.k * self.acceptance)
            self.counts["tokens"] += n_out

    def metrics(self) -> str:
        steps, k = self.counts["steps"], self.k
        if self.owned_by == "sglang":
            return (f'sglang:spec_verify_calls_total{{model_name="sim-model"}} {steps}\n'
                    f'sglang:generation_tokens_total{{model_name="sim-model",is_streaming="true"}} '
                    f'{self.counts["tokens"]}\nsglang:spec_num_draft_tokens{{model_name="sim-model"}} {k + 1}\n')
        lines = [f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="sim-model"}} {steps}',
                 f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="sim-model"}} {steps * k}',
                 f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="sim-model"}} '
                 f'{steps * k * self.acceptance}']
        lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="sim-model",'
                  f'position="{i}"}} {steps * self.acceptance}' for i in range(k)]
        return "# TYPE vllm:spec_decode_num_drafts counter\n" + "\n".join(lines) + "\n"

    async def get(self, path: str, writer) -> None:
        if path.startswith("/metrics"):
            # TensorRT-LLM's /metrics is JSON iteration statistics, with no acceptance counters
            data = (self.metrics() if self.k and self.owned_by != "trtllm" else "# no speculative decoding\n").encode()
            writer.write(f"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {len(data)}\r\n\r\n"
                         .encode() + data)
            await writer.drain()
        elif path.startswith("/v1/models"):
            await self.send_json(writer, 200, {"object": "list", "data": [{
                "id": "sim-model", "object": "model", "created": 0, "owned_by": self.owned_by,
                "max_model_len": 4096, "llmopt_simulated": True}]})
        else:
            await super().get(path, writer)

    def gap_ms(self) -> float:
        """The time between a request's tokens now: one decode step of the requests in flight, over the tokens a
        step yields."""
        step = self.itl * (1 + DRAFT_COST * self.k) * max(1.0, self.inflight * (self.k + 1) / self.knee)
        return step / (1 + self.k * self.acceptance)

    async def stream(self, i: int, path: str, req: dict, writer, arrived: float) -> None:
        n_out = int(req.get("max_tokens") or 16)
        words = answer(req, n_out, self.corrupt)
        if not req.get("stream"):  # one JSON answer (the OpenAI default), after the time the tokens take
            await asyncio.sleep((self.ttft + self.gap_ms() * (n_out - 1)) / 1e3)
            self.speculate(n_out)
            choice = ({"message": {"role": "assistant", "content": "".join(words)}} if "messages" in req
                      else {"text": "".join(words)})
            await self.send_json(writer, 200, {"id": f"r{i}", "object": "completion", "model": "sim-model", "choices": [
                {"index": 0, **choice, "finish_reason": "length"}], "usage": {"completion_tokens": n_out}})
            return
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        due = arrived + self.ttft / 1e3
        for k in range(n_out):
            due += 0.0 if k == 0 else self.gap_ms() / 1e3
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            self.chunk(writer, {"id": f"r{i}", "object": "chunk", "created": 0, "model": "sim-model", "choices": [
                {"index": 0, "text": words[k], "finish_reason": "length" if k == n_out - 1 else None}]})
            await writer.drain()
        if (req.get("stream_options") or {}).get("include_usage"):
            prompt = req.get("prompt")
            n_in = len(prompt) if isinstance(prompt, list) else 8
            self.chunk(writer, {"id": f"r{i}", "choices": [], "usage": {
                "prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}})
        self.speculate(n_out)
        writer.write(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
        await writer.drain()


async def serve(server: SimServer, port: int) -> None:
    listening = await asyncio.start_server(server.handle, "127.0.0.1", port)
    print(f"listening {listening.sockets[0].getsockname()[1]} (simulated {server.owned_by})", flush=True)
    async with listening:
        await listening.serve_forever()


def main(argv: list[str]) -> None:
    engine, settings = argv[0], parse(argv[0], argv[1:])
    print(f"simulated {engine} with {json.dumps(settings, default=str)}", flush=True)
    limit = os.environ.get("LLMOPT_SIM_OOM_ABOVE")
    fraction = settings.get(FRACTIONS[engine])
    if limit and fraction is not None and float(fraction) > float(limit):
        print(f"torch.OutOfMemoryError: CUDA out of memory ({FRACTIONS[engine]} {fraction})", file=sys.stderr)
        sys.exit(1)
    spec = settings.get("speculative-config") if engine == "vllm" else None
    spec = json.loads(spec) if isinstance(spec, str) else spec or {}
    if spec.get("model") and not Path(spec["model"]).is_dir():  # a draft model the engine would have to load
        print(f"OSError: draft model {spec['model']} is not a folder", file=sys.stderr)
        sys.exit(1)
    child = subprocess.Popen(["sleep", "600"])
    children = os.environ.get("LLMOPT_SIM_CHILDREN")
    if children:
        Path(children).mkdir(parents=True, exist_ok=True)
        (Path(children) / str(child.pid)).write_text(str(os.getpid()))
    hang = json.loads(os.environ.get("LLMOPT_SIM_HANG", "{}"))  # settings under which it never answers
    if hang and all(str(settings.get(k)) == str(v) for k, v in hang.items()):
        time.sleep(600)
    best = json.loads(os.environ.get("LLMOPT_SIM_BEST", "{}"))
    asyncio.run(serve(SimServer(engine, speed(settings, best), drafted(engine, settings)), int(settings.get("port", 0))))


if __name__ == "__main__":
    main(sys.argv[1:])
