"""One benchmark: resolve the target, start its server if it is a folder, run the load points, write results."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

from llmopt import apikey
from llmopt.bench import client, engine, metrics, report, speculation, split, workload as wl
from llmopt.bench.options import SLO, BenchOptions, Workload
from llmopt.errors import StageFailed, UsageError

SCHEMA_VERSION = 1
SWEEP_GROWTH = 1.10  # a sweep stops once request throughput grows by less than this factor
SWEEP_MAX_ERROR = 0.10  # ... or once more than this share of a point's requests fail


def is_url(target: str | Path) -> bool:
    return str(target).startswith(("http://", "https://"))


def base_url(url: str) -> str:
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def served_models(url: str) -> dict:
    """GET /v1/models (with the key in LLMOPT_API_KEY, when set), or a StageFailed saying that nothing
    OpenAI-compatible answers there, or that it wants a key."""
    request = urllib.request.Request(f"{url}/v1/models", headers=apikey.headers())
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            sent = "the key in LLMOPT_API_KEY was refused" if apikey.from_env() else "no key was sent"
            raise StageFailed(f"the server at {url} wants an API key: GET /v1/models answered {exc.code} ({sent})",
                              where=url, fix=f"set {apikey.ENV} to the key the server was started with") from None
        raise StageFailed(f"no OpenAI-compatible server answers at {url}/v1/models: {exc}", where=url,
                          fix="start the server first, or check the URL (http://HOST:PORT)") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise StageFailed(f"no OpenAI-compatible server answers at {url}/v1/models: {exc}", where=url,
                          fix="start the server first, or check the URL (http://HOST:PORT)") from None


def run_bench(target: str | Path, workload: Workload | dict | None, slo: SLO | dict | None,
              options: BenchOptions | dict | None, out_dir: str | Path, *, cache_dir: str | Path | None = None,
              say=None) -> dict:
    """Benchmark ``target`` (an OpenAI-compatible server's URL, or an artifact or model folder whose server is
    started and always stopped); writes bench.json, bench.md, requests.jsonl and plots to ``out_dir`` and
    returns bench.json's content."""
    from llmopt.store.cache import default_root
    from llmopt.libraries import require

    workload, slo = checked(Workload, workload, "workload"), checked(SLO, slo, "slo")
    options = checked(BenchOptions, options, "options")
    options.point_requests(workload)  # a count per point that does not fit the points: exit 2, before a server starts
    require("aiohttp", "bench", "llmopt bench")  # before a server is started
    out_dir, say = Path(out_dir), say or (lambda message: None)
    if is_url(target):
        return measure(base_url(str(target)), None, workload, slo, options, out_dir, say, options.vocab_size,
                       _folder(options.tokenizer))
    folder = Path(target).expanduser().resolve()
    if not folder.is_dir():
        raise UsageError(f"{target} is neither a URL (http://...) nor a folder",
                         fix="pass a server's URL, or an artifact or model folder")
    from llmopt.server.model import locate, model_limits

    model_dir = locate(folder)[0]
    root = Path(cache_dir).expanduser() if cache_dir else default_root()
    for info in engine.stop_leftovers(root):
        say(f"stopped a server left by an earlier llmopt bench (pid {info['pid']}: {' '.join(info['argv'][:4])} ...)")
    port = options.port or engine.free_port()
    launch = engine.plan_launch(folder, options.engine, port)
    vocab = options.vocab_size or model_limits(model_dir)[1]
    with engine.running(launch, port, root, out_dir / "engine.log", options.startup_timeout_s, say) as (url, pid):
        started = {"engine": launch.engine, "argv": launch.argv, "pid": pid, "log": "engine.log"}
        return measure(url, started, workload, slo, options, out_dir, say, vocab,
                       _folder(options.tokenizer) or model_dir)


def _folder(path: str | None) -> Path | None:
    if path is None:
        return None
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise UsageError(f"--tokenizer {path}: not a folder", fix="pass the model folder that holds tokenizer.json")
    return folder


def checked(cls, value, what: str):
    """``value`` (a model, a dict or None) as ``cls``; a bad field is a usage error naming it."""
    from pydantic import ValidationError

    if isinstance(value, cls):
        return value
    try:
        return cls(**(value or {}))
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        raise UsageError(f"bench {what}.{key}: {first['msg']}", fix="see docs/bench.md") from None


def measure(url: str, started: dict | None, workload: Workload, slo: SLO, options: BenchOptions, out_dir: Path,
            say, vocab: int | None, model_dir: Path | None = None) -> dict:
    models = served_models(url)
    model = options.model or next((m.get("id") for m in models.get("data") or []), None)
    if not model:
        raise StageFailed(f"{url}/v1/models lists no model", where=url, fix="pass --model NAME")
    server = wl.server_kind(models)
    path = "/v1/chat/completions" if options.endpoint == "chat" else "/v1/completions"
    vocab = vocab if options.endpoint == "completions" else None
    texts = text_workload(workload, options, model_dir, split.served_context(models), say)
    began, rows = time.time(), []
    ctx = {"url": url + path, "base": url, "model": model, "server": server, "vocab": vocab,
           "slo": slo.model_dump(), "rows": rows, "texts": texts}
    points, saturation = [], None
    counts = options.point_requests(workload)
    for index, (kind, value) in enumerate(options.points(workload)):
        points.append(run_point(ctx, index, kind, value, counts[index], workload, options, say))
    if options.sweep:
        saturation = sweep(ctx, points, workload, options, say)
    split_lengths, skipped = split.lengths(options, server, split.served_context(models))
    prefill_decode = split.measure(ctx, options, split_lengths, skipped, say)
    result = {
        "schema_version": SCHEMA_VERSION,
        "target": {"url": url, "model": model, "server": server, "started": started,
                   "simulated": any(m.get("llmopt_simulated") for m in models.get("data") or [])},
        "workload": workload.model_dump(), **({"dataset": texts.info} if texts else {}), "slo": slo.model_dump(),
        "options": options.model_dump(),
        "client": {"kind": "llmopt asyncio client (aiohttp)", "aiohttp": _version("aiohttp"),
                   "sent": wl.sent_fields(options, server, vocab, texts)},
        "points": points, "saturation": saturation, "split": prefill_decode, "out_dir": str(out_dir),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(began)), "duration_s": round(time.time() - began, 2),
    }
    report.write_all(result, rows, out_dir, options.plots)
    if not any(p["requests"]["ok"] for p in points):
        first = next((e for p in points for e in p["errors"].items()), ("unknown", {"example": ""}))
        raise StageFailed(f"no request succeeded ({first[0]}: {first[1]['example']})", where=url,
                          fix=f"see {out_dir / 'requests.jsonl'}; a 400 names the argument the server refused")
    return result


def text_workload(workload: Workload, options: BenchOptions, model_dir: Path | None, context: int | None, say):
    """The dataset's requests, prepared for the endpoint and the model's tokenizer; None for random prompts."""
    if not workload.dataset:
        return None
    from llmopt.bench import dataset

    texts = dataset.prepare(dataset.load(workload.dataset), options.endpoint, workload.output_len,
                            workload.output_len_from, model_dir, context)
    info = texts.info
    say(f"workload {info['name']}: {info['used']} of {info['records']} records"
        + (f" ({info['too_long']} longer than the served context left out)" if info["too_long"] else "")
        + ("" if info["tokenizer"] else "; no tokenizer: prompt lengths are the server's"))
    return texts


def run_point(ctx: dict, index: int, kind: str, value: float, requests: int, workload: Workload,
              options: BenchOptions, say) -> dict:
    """One load point, ``options.repeats`` times; its figures are the medians over the repeats."""
    label = f"concurrency {value:g}" if kind == "concurrency" else f"{value:g} requests/s (Poisson)"
    repeats = []
    for repeat in range(options.repeats):
        seed = options.seed + 1000 * index + repeat
        n_warm = max(options.warmup, int(value)) if options.warmup and kind == "concurrency" else options.warmup
        warm = wl.bodies(workload, options, ctx["model"], ctx["server"], ctx["vocab"], n_warm, seed + 500, ctx["texts"])
        bodies = wl.bodies(workload, options, ctx["model"], ctx["server"], ctx["vocab"], requests, seed, ctx["texts"])
        say(f"{label}: {requests} requests" + (f" (repeat {repeat + 1}/{options.repeats})" if options.repeats > 1 else ""))
        before = speculation.scrape(ctx["base"]) if ctx.get("base") else None
        got = client.run(ctx["url"], kind, value, bodies, warm, options.request_timeout_s, seed)
        after = speculation.scrape(ctx["base"]) if before else None
        accepted = speculation.point(before, after, len(got["records"]) + len(got["warmup"]))
        batches = speculation.batching(before, after)
        costs = metrics.client_costs(got["client_cpu_s"], got["client_wall_s"], got["loop_lag_s"])
        repeats.append(metrics.summarize(got["records"], ctx["slo"], costs) | (
            {"speculation": accepted} if accepted else {}) | ({"batching": batches} if batches else {}))
        origin = min((r.start for r in got["records"]), default=0.0)
        ctx["rows"] += [{"point": index, "repeat": repeat, **r.to_dict(origin)} for r in got["warmup"] + got["records"]]
    point = {"load": {"kind": kind, "value": value}, **metrics.median_of(repeats)}
    if options.repeats > 1:
        point["repeats"] = repeats
    say(f"  {point['requests']['ok']}/{point['requests']['sent']} ok, {point['request_throughput']:.2f} req/s, "
        f"{point['output_throughput']:.1f} output tok/s" + (f", TTFT p99 {point['ttft_ms']['p99']:.1f} ms"
                                                            if point["ttft_ms"] else "")
        + (f", {point['speculation']['mean_acceptance_length']:.2f} tokens per step" if point.get("speculation")
           else "") + (f", mean batch {point['batching']['mean_batch_size']:.2f}" if point.get("batching") else ""))
    return point


def sweep(ctx: dict, points: list[dict], workload: Workload, options: BenchOptions, say) -> dict:
    """Concurrency 1, 2, 4, ... until saturation; appends its points; returns why it stopped."""
    concurrency, best, reason = 1, None, f"reached max_concurrency {options.max_concurrency}"
    while concurrency <= options.max_concurrency:
        point = run_point(ctx, len(points), "concurrency", float(concurrency), max(options.requests, 2 * concurrency),
                          workload, options, say)
        points.append(point)
        sent = point["requests"]["sent"]
        if sent and point["requests"]["failed"] / sent > SWEEP_MAX_ERROR:
            reason = f"more than {SWEEP_MAX_ERROR:.0%} of the requests failed at concurrency {concurrency}"
            break
        if best is not None and point["request_throughput"] < SWEEP_GROWTH * best["request_throughput"]:
            reason = (f"request throughput grew less than {SWEEP_GROWTH - 1:.0%} from concurrency "
                      f"{best['load']['value']:g} to {concurrency}")
            best = max(best, point, key=lambda p: p["request_throughput"])
            break
        best = point if best is None or point["request_throughput"] >= best["request_throughput"] else best
        concurrency *= 2
    return {"reason": reason, "best_concurrency": best["load"]["value"] if best else None}


def _version(dist: str) -> str | None:
    from llmopt.libraries import package_version

    return package_version(dist)


def default_out_dir(target: str | Path) -> Path:
    """bench/<target name>-<UTC time> under the current folder."""
    import re

    name = re.sub(r"^https?://", "", str(target)).rstrip("/") if is_url(target) else Path(target).resolve().name
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "server"
    return Path("bench") / f"{name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
