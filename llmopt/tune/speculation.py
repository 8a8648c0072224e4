"""Speculative decoding in the tune stage: its measured effect, and the check that it does not change answers.

Where ``[serve.speculative]`` is configured, the search has one more parameter, ``num_speculative_tokens``
(``llmopt.tune.spaces``): the recipe's num_tokens, 0 (off), one fewer and one more. Speculation must earn its
place (``Search(earn=...)``): it stays on only when on beats off by more than the search's 5% at the workload's
concurrency. At one request in flight a decode step is bound by reading the weights, so verifying k + 1 tokens
costs about what one does and every accepted draft is a token for free; at a high concurrency the step is bound
by compute, verification multiplies the tokens a step computes, and rejected drafts are compute thrown away.
``effect`` reports what was measured with and without it at the winner's other values: TPOT, output tokens per
second and the engine's own acceptance figures.

The lossless check (``check``): greedy speculative decoding verifies every drafted token against the target's
own argmax, so it should leave greedy answers unchanged. The workload's first ``[tune] lossless_prompts`` prompts
are sent one at a time at temperature 0 to the winner's launch config with speculation on (the winner's
num_tokens, or the recipe's when the winner turned it off) and with it off, and the answers compared as text.

The rule (``compare``): at least ``MIN_IDENTICAL`` (90%) of the answers must be identical, else the stage fails
(exit 1). Why not all of them: verification runs the target over k + 1 positions at once, with other kernels and
batch shapes than decoding one token, so on a GPU the logits differ in the last bits and an argmax between two
near-tied tokens can flip; the answers then agree up to that token and differ after it. Such flips are rare and
late. A broken speculative path (a draft of another tokenizer, a verification bug, a sampler that ignores
temperature 0) changes most answers, usually within the first tokens. Each differing answer's first divergence
(the character where the two texts part) is reported with both continuations, so a reader can tell a late flip
from corruption. With fewer than 10 prompts the rule asks for every answer to match.
"""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from pathlib import Path

from llmopt.errors import StageFailed

MIN_IDENTICAL = 0.9  # share of greedy answers that must be identical with and without speculation
SHOWN = 40  # characters of each continuation shown at a divergence


# --- the measured effect ----------------------------------------------------------------------------------------

def first_search(trials: list[dict], values: dict) -> dict | None:
    key = json.dumps(values, sort_keys=True)
    return next((t for t in trials if json.dumps(t["values"], sort_keys=True) == key and t.get("figures")), None)


def side(trial: dict | None) -> dict | None:
    if trial is None:
        return None
    fig = trial["figures"]
    spec = fig.get("speculation") or {}
    return {"values": trial["values"], "output_throughput": fig.get("output_throughput"),
            "tpot_ms": fig.get("tpot_ms"), "ttft_ms": fig.get("ttft_ms"), "score": trial["score"],
            "acceptance_rate": spec.get("acceptance_rate"), "mean_acceptance_length": spec.get("mean_acceptance_length")}


def effect(result: dict, name: str, concurrency: int) -> dict | None:
    """With against without speculation at the winner's other values (else the prediction's), from the trials."""
    if name not in (result.get("space") or {}) or not result.get("trials"):
        return None
    winner, default = result["winner"], result["default"]
    configured = default.get(name) or next((v for v in result["space"][name] if v), None)
    for base in (winner, default):
        on = base if base.get(name) else base | {name: configured}
        with_, without = first_search(result["trials"], on), first_search(result["trials"], base | {name: 0})
        if with_ and without:
            break
    out = {"parameter": name, "configured": configured, "kept": bool(winner.get(name)), "winner": winner.get(name),
           "concurrency": concurrency, "with": side(with_), "without": side(without)}
    if with_ and without:
        a, b = out["with"], out["without"]
        out["output_throughput_ratio"] = _ratio(a["output_throughput"], b["output_throughput"])
        out["tpot_p50_ratio"] = _ratio((a["tpot_ms"] or {}).get("p50"), (b["tpot_ms"] or {}).get("p50"))
    return out


def _ratio(a, b) -> float | None:
    return round(a / b, 3) if a is not None and b else None


# --- the lossless check -----------------------------------------------------------------------------------------

def first_divergence(a: str, b: str) -> int | None:
    """The first character where ``a`` and ``b`` differ (the shorter one's length when one extends the other)."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def compare(with_: list[str], without: list[str]) -> dict:
    """The verdict of the rule above over the answers to the same prompts, with and without speculation."""
    diverged = []
    for index, (a, b) in enumerate(zip(with_, without)):
        at = first_divergence(a, b)
        if at is not None:
            diverged.append({"prompt": index, "at_char": at, "of_chars": len(b), "with": a[at:at + SHOWN],
                             "without": b[at:at + SHOWN]})
    n = min(len(with_), len(without))
    same = n - len(diverged)
    share = same / n if n else 1.0
    return {"prompts": n, "identical": same, "identical_share": round(share, 4), "min_identical": MIN_IDENTICAL,
            "passed": share >= MIN_IDENTICAL, "diverged": diverged}


def ask(url: str, body: bytes, timeout_s: float) -> str:
    """One greedy answer, not streamed."""
    from llmopt import apikey

    payload = json.loads(body)
    payload.pop("stream_options", None)
    payload["stream"] = False
    path = "/v1/chat/completions" if "messages" in payload else "/v1/completions"
    request = urllib.request.Request(url + path, data=json.dumps(payload).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **apikey.headers()})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            choice = (json.loads(resp.read()).get("choices") or [{}])[0]
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise StageFailed(f"the lossless check's request to {url}{path} failed: {exc}", where="[tune]",
                          fix="see the engine's log in the tune store's lossless folder") from None
    return (choice.get("message") or {}).get("content") or choice.get("text") or ""


def answers(options, values: dict, model_dir: Path, deploy_dir: Path, manifest: dict, cache_root: Path,
            folder: Path, say, draft_dir: Path | None = None) -> list[str]:
    """The greedy answers of the launch config with ``values`` to the workload's first prompts, one at a time."""
    from llmopt.bench import engine, runner, split, workload as wl
    from llmopt.bench.options import BenchOptions
    from llmopt.server.model import locate, model_limits
    from llmopt.tune.spaces import trial_target

    target = trial_target(folder / "target", model_dir, deploy_dir, options.engine, manifest, values, draft_dir)
    bench = BenchOptions(engine=options.engine, startup_timeout_s=options.startup_timeout_s)
    port = engine.free_port()
    launch = engine.plan_launch(target, options.engine, port)
    try:
        with engine.running(launch, port, cache_root, folder / "engine.log", options.startup_timeout_s, say) as (url, _):
            models = runner.served_models(url)
            model = next((m.get("id") for m in models.get("data") or []), None)
            texts = runner.text_workload(options.workload, bench, locate(target)[0], split.served_context(models), say)
            vocab = model_limits(locate(target)[0])[1] if bench.endpoint == "completions" else None
            bodies = wl.bodies(options.workload, bench, model, wl.server_kind(models), vocab, options.lossless_prompts,
                               bench.seed, texts)
            return [ask(url, body, bench.request_timeout_s) for body in bodies]
    finally:
        shutil.rmtree(target, ignore_errors=True)


def check(options, winner: dict, name: str, configured: int, run_answers, store, say) -> dict:
    """Greedy answers with and without speculation at the winner's other values, compared; raises StageFailed when
    they differ beyond the rule. ``run_answers(values, folder)`` gives one side's answers; the verdict is kept in
    ``store`` (a killed search does not repeat it)."""
    from llmopt.tune.search import trial_id

    on = winner | {name: winner.get(name) or configured}
    off = winner | {name: 0}
    key = "lossless-" + trial_id({"on": on, "prompts": options.lossless_prompts}, "lossless")
    verdict = store.get(key)
    if verdict is None:
        say(f"lossless check: {options.lossless_prompts} greedy answers with {name} {on[name]} and without")
        with_ = run_answers(on, store.folder(key) / "with")
        without = run_answers(off, store.folder(key) / "without")
        verdict = compare(with_, without) | {"with_values": on, "without_values": off}
        store.put(key, verdict)
    say(f"lossless check: {verdict['identical']} of {verdict['prompts']} greedy answers identical "
        f"({'passed' if verdict['passed'] else 'FAILED'}, at least {MIN_IDENTICAL:.0%} needed)")
    if not verdict["passed"]:
        first = verdict["diverged"][0]
        raise StageFailed(
            f"speculative decoding changed greedy answers: {verdict['prompts'] - verdict['identical']} of "
            f"{verdict['prompts']} differ with {name} {on[name]} from the same launch config without it (at most "
            f"{1 - MIN_IDENTICAL:.0%} may, for engine numerics); prompt {first['prompt']} parts at character "
            f"{first['at_char']}: {first['with']!r} against {first['without']!r}",
            where="[serve.speculative]",
            fix=f"check the draft (same tokenizer as the target) and the engine version, or remove "
                f"[serve.speculative]; every divergence is in {store.root / 'trials' / (key + '.json')}")
    return verdict
