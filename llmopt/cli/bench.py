"""llmopt bench: latency and throughput of an OpenAI-compatible server, or of an artifact's own server."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from llmopt.cli.app import CacheOpt, FormatOpt, app, sink

Ints = Annotated[Optional[list[str]], typer.Option("--concurrency", "-c", help="Fixed-concurrency point(s): -c 8, or -c 1,4,16 (repeatable).")]
Rates = Annotated[Optional[list[str]], typer.Option("--rate", "-r", help="Poisson-rate point(s) in requests/s: -r 2,5 (repeatable).")]
SloOpt = Annotated[Optional[list[str]], typer.Option("--slo", help="An SLO bound: --slo ttft_p99_ms=500 (also tpot_p99_ms, e2e_p99_ms; repeatable). Default: the artifact's [serve].slo.")]


@app.command()
def bench(
    target: Annotated[str, typer.Argument(help="A server's URL (http://HOST:PORT, vLLM, SGLang, trtllm-serve, llmopt serve), "
                                          "or an artifact or model folder whose server bench starts and stops.", show_default=False)],
    input_len: Annotated[Optional[int], typer.Option(min=1, help="Prompt tokens of random token-id prompts (default: the artifact's [serve].workload, else 1024).")] = None,
    output_len: Annotated[Optional[int], typer.Option(min=1, help="Output tokens (default: the artifact's workload, else 256); with a dataset, every request's, instead of the data's own lengths.")] = None,
    dataset: Annotated[Optional[str], typer.Option(help="Prompts from a .jsonl file (plain prompts or chat conversations, as vLLM's and GuideLLM's benchmarks read them) or a built-in text workload (builtin:continue, builtin:rewrite, builtin:code-edit, builtin:multiturn), instead of random token ids; `random` for those (default: the artifact's [serve].workload dataset).", show_default=False)] = None,
    tokenizer: Annotated[Optional[Path], typer.Option(help="Model folder whose tokenizer counts a dataset's prompts and answers (default: the target folder's model; needed for a URL to take output lengths from reference answers).", show_default=False)] = None,
    concurrency: Ints = None,
    rate: Rates = None,
    sweep: Annotated[bool, typer.Option("--sweep", help="Concurrency 1, 2, 4, ... until throughput stops growing.")] = False,
    max_concurrency: Annotated[int, typer.Option(min=1, help="Highest concurrency of a sweep.")] = 256,
    requests: Annotated[Optional[list[str]], typer.Option("--requests", "-n", help="Measured requests per point, or one count per point in order: -c 1,8,32 -n 16,128,128 (default: [bench] requests, else 64).")] = None,
    warmup: Annotated[Optional[int], typer.Option(min=0, help="Warm-up requests before each point, left out (default 4).")] = None,
    repeats: Annotated[Optional[int], typer.Option(min=1, help="Repeats of each point; figures are the medians (default 1).")] = None,
    slo: SloOpt = None,
    endpoint: Annotated[str, typer.Option(help="completions or chat.")] = "completions",
    model: Annotated[Optional[str], typer.Option(help="Model name to send (default: the first of GET /v1/models).")] = None,
    engine: Annotated[str, typer.Option(help="For a folder: auto (its deploy/<engine>/launch.sh, else llmopt serve), llmopt, ort, vllm, sglang or trtllm.")] = "auto",
    port: Annotated[Optional[int], typer.Option(help="Port for a started server (default: a free one).")] = None,
    ignore_eos: Annotated[Optional[bool], typer.Option("--ignore-eos/--no-ignore-eos", help="Send ignore_eos (default: with random prompts only, to vLLM, SGLang, TensorRT-LLM and llmopt serve; never with --dataset).")] = None,
    vocab_size: Annotated[Optional[int], typer.Option(help="Vocabulary size, for token-id prompts to a URL.")] = None,
    split: Annotated[Optional[list[str]], typer.Option("--split", help="Prompt lengths of the prefill / decode split, one request at a time: --split 128,512,2048; --split off: none. Default: 128, 512, 2048 against llmopt serve (those that fit its context), none against other servers.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the prompts and of the Poisson arrivals.")] = 0,
    timeout: Annotated[float, typer.Option(help="Seconds one request may take.")] = 600.0,
    startup_timeout: Annotated[float, typer.Option(help="Seconds a started server may take to answer /health.")] = 1200.0,
    plots: Annotated[bool, typer.Option("--plots/--no-plots", help="Write PNG plots (needs matplotlib).")] = True,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Results folder (default: bench/<target>-<time>).")] = None,
    cache_dir: CacheOpt = None,
    format: FormatOpt = "human",
) -> None:
    """Measure TTFT, TPOT, ITL, end-to-end latency, throughput and goodput under load.

    Writes bench.json, bench.md, requests.jsonl and plots; see docs/bench.md.

    Examples:

        llmopt bench http://127.0.0.1:8000 --input-len 128 --output-len 16 -c 1,4 -n 8 --split 128,512

        llmopt bench artifacts/quickstart --sweep --max-concurrency 2 --input-len 128 --output-len 16 -n 8 --slo ttft_p99_ms=2000 --split off

        llmopt bench http://127.0.0.1:8000/v1 --rate 1,2 -n 8 --input-len 128 --output-len 16 --split off --format json

        llmopt bench artifacts/quickstart --dataset builtin:multiturn --endpoint chat -c 2 -n 4 --warmup 1 --repeats 1 --split off
    """
    from llmopt import api

    out = sink(format)
    workload = _workload(input_len, output_len, dataset)
    counts = _numbers(requests, int, "--requests")
    requests = None if not counts else counts[0] if len(counts) == 1 else counts
    options = {"concurrency": _numbers(concurrency, int, "--concurrency"), "rate": _numbers(rate, float, "--rate"),
               "sweep": sweep, "max_concurrency": max_concurrency, "endpoint": endpoint, "model": model, "engine": engine,
               "port": port, "ignore_eos": ignore_eos, "vocab_size": vocab_size, "seed": seed, "request_timeout_s": timeout,
               "tokenizer": str(tokenizer.expanduser().resolve()) if tokenizer else None,
               "startup_timeout_s": startup_timeout, "plots": plots,
               **{k: v for k, v in (("requests", requests), ("warmup", warmup), ("repeats", repeats),
                                    ("split", _split(split))) if v is not None}}
    from llmopt.bench.engine import Interrupted

    try:
        result = api.bench(target, workload, _slo(slo), _valid(options), output, cache_dir, out)
    except KeyboardInterrupt:
        raise Interrupted("interrupted; any server that llmopt bench started has been stopped") from None
    out.result(result, lambda c: _show(c, result, output))


def _workload(input_len: int | None, output_len: int | None, dataset: str | None) -> dict:
    """The workload fields the command sets. --output-len makes a dataset's output lengths fixed; --dataset names
    a file (made absolute: the bench of an artifact reads it from another folder), a built-in, or `random`."""
    from llmopt.bench import dataset as datasets
    from llmopt.errors import UsageError

    workload = {k: v for k, v in (("input_len", input_len), ("output_len", output_len)) if v is not None}
    if output_len is not None:
        workload["output_len_from"] = "fixed"
    if dataset is None:
        return workload
    if dataset == "random":
        return workload | {"dataset": None}
    if input_len is not None:
        raise UsageError("--input-len does not apply with --dataset: the prompts are the data set's",
                         fix="drop --input-len, or use --dataset random for random token-id prompts")
    path = datasets.resolve(dataset)
    spec = dataset if path is None else str(path.resolve())
    datasets.load(spec)  # a missing file or a bad record: exit 2 now, naming the line, not a failed run
    return workload | {"dataset": spec}


def _numbers(values: list[str] | None, kind, flag: str) -> list:
    from llmopt.errors import UsageError

    try:
        numbers = [kind(part) for value in values or [] for part in value.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"{flag} takes numbers: {', '.join(values or [])}", fix=f"e.g. {flag} 1,4,16") from None
    if any(n <= 0 for n in numbers):
        raise UsageError(f"{flag} takes positive numbers", fix=f"e.g. {flag} 1,4,16")
    return numbers


def _split(values: list[str] | None) -> list[int] | None:
    """--split: None when not given (the default lengths), [] for `off`, else the lengths."""
    if not values:
        return None
    if [v.strip().lower() for v in values] == ["off"]:
        return []
    return _numbers(values, int, "--split")


def _slo(values: list[str] | None) -> dict:
    from llmopt.errors import UsageError

    bounds = {}
    for value in values or []:
        key, _, number = value.partition("=")
        if key not in ("ttft_p99_ms", "tpot_p99_ms", "e2e_p99_ms"):
            raise UsageError(f"unknown SLO bound {key!r}", fix="use ttft_p99_ms=N, tpot_p99_ms=N or e2e_p99_ms=N")
        try:
            bounds[key] = float(number)
        except ValueError:
            raise UsageError(f"--slo {value}: {number!r} is not a number", fix=f"e.g. --slo {key}=500") from None
    return bounds


def _valid(options: dict) -> dict:
    """The options, checked now so that a bad value is a usage error (exit 2), not a failed run."""
    from pydantic import ValidationError

    from llmopt.bench import BenchOptions
    from llmopt.errors import UsageError

    try:
        BenchOptions(**options)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise UsageError(f"--{'-'.join(str(p) for p in first['loc']).replace('_', '-')}: {first['msg']}",
                         fix="see llmopt bench --help") from None
    return options


def _show(console, result: dict, output: Path | None) -> None:
    from llmopt.bench.report import markdown, split_table

    table = [line for line in markdown(dict(result, split=None)).splitlines() if line.startswith("|")]
    console.print("\n".join(table), markup=False)
    if result.get("saturation"):
        console.print(f"saturation: {result['saturation']['reason']}", markup=False)
    if result.get("split"):
        console.print("\n".join(line for line in split_table(result["split"]) if line), markup=False)
    files = result.get("files", {})
    console.print(f"results: {result.get('out_dir', output)} ({', '.join([files.get('json', ''), files.get('markdown', ''), *files.get('plots', [])])})",
                  markup=False)
