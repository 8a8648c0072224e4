"""``llmopt bench``: serving performance of an OpenAI-compatible server, or of an artifact it starts.

``run_bench(target, workload, slo, options, out_dir)`` measures TTFT, TPOT, ITL and
end-to-end latency (mean, p50, p90, p95, p99), request and token throughput, goodput under
the SLO and errors by kind, at fixed concurrencies, Poisson rates or a sweep of
concurrencies up to saturation; it writes bench.json (``schema_version`` 1), bench.md,
requests.jsonl and PNG plots. Modules: ``options`` (what a run does), ``workload``
(request bodies), ``client`` (the asyncio load generator), ``metrics``, ``report``,
``engine`` (start and always stop a folder's server), ``runner`` (the whole run).

Needs: aiohttp (the ``bench`` extra); matplotlib for the plots. Why llmopt has its own
client rather than GuideLLM: docs/results/serving.md, "Serving benchmark client".
"""

from llmopt.bench.options import SLO, BenchOptions, Workload
from llmopt.bench.runner import SCHEMA_VERSION, run_bench

__all__ = ["SCHEMA_VERSION", "SLO", "BenchOptions", "Workload", "run_bench"]
