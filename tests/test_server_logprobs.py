"""Log-likelihood scoring over HTTP against llmopt serve: /v1/completions with echo and logprobs
(the shape of OpenAI's legacy API and vLLM's), llmopt's endpoint runtime, and lm-eval's
local-completions model running a local log-likelihood task."""

from __future__ import annotations

import math

import pytest

from llmopt import evaluate
from llmopt.runtimes.endpoint import EndpointRuntime, probe
from llmopt.server import load_model

from conftest import write_recipe
from test_server import MAX_LEN, metrics, post, requests, running


@pytest.fixture(scope="module")
def served(tiny_model):
    return load_model(tiny_model, max_model_len=MAX_LEN, name="tiny")


@pytest.fixture(scope="module")
def url(served):
    with running(served) as base:
        yield base


def test_echo_without_generation_scores_every_prompt_token_like_nll(url, served):
    rt = served.runtime
    ids = rt.encode("The river ran past the old mill and into the sea.")
    body = {"model": "tiny", "prompt": ids, "echo": True, "logprobs": 1, "max_tokens": 0, "temperature": 0}
    answer = post(url, "/v1/completions", body).json()
    choice, lp = answer["choices"][0], answer["choices"][0]["logprobs"]
    assert answer["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 0, "total_tokens": len(ids)}
    assert choice["text"] == rt.decode(ids) and choice["finish_reason"] == "length"
    assert len(lp["tokens"]) == len(lp["text_offset"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(ids)
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None  # nothing predicts the first
    for scored in (len(ids) - 1, 4, 1):
        assert -sum(lp["token_logprobs"][len(ids) - scored:]) == pytest.approx(rt.nll([ids], [scored])[0], rel=1e-5)
    assert "".join(lp["tokens"]) == choice["text"]
    assert lp["text_offset"] == [len("".join(lp["tokens"][:i])) for i in range(len(ids))]
    for token, value, top in zip(lp["tokens"][1:], lp["token_logprobs"][1:], lp["top_logprobs"][1:]):
        assert 1 <= len(top) <= 2 and top.get(token) == value  # the most likely token, and the token itself
        assert max(top.values()) >= value
    wider = post(url, "/v1/completions", {**body, "logprobs": 5}).json()["choices"][0]["logprobs"]
    assert wider["token_logprobs"] == lp["token_logprobs"]
    for narrow, wide in zip(lp["top_logprobs"][1:], wider["top_logprobs"][1:]):  # two byte tokens may share "\ufffd"
        assert max(wide.values()) == max(narrow.values()) and 2 <= len(wide) <= 6 and set(narrow) <= set(wide)


def test_echo_of_a_text_prompt_and_logprobs_of_generated_tokens(url, served):
    rt = served.runtime
    prompt = "Stones in the water"
    ids = rt.encode(prompt)
    # lm-eval's local-completions asks for one generated token and drops its entry
    one = post(url, "/v1/completions", {"prompt": prompt, "echo": True, "logprobs": 1, "max_tokens": 1,
                                        "temperature": 0}).json()["choices"][0]
    generated = list(rt.stream(ids, 1))
    assert one["text"] == prompt + rt.decode(generated)  # echo returns the prompt as written
    values = one["logprobs"]["token_logprobs"]
    assert len(values) == len(ids) + 1
    assert -sum(values[1:]) == pytest.approx(rt.nll([ids + generated], [len(ids)])[0], rel=1e-5)
    last_top = one["logprobs"]["top_logprobs"][-1]
    assert values[-1] == max(last_top.values())  # greedy: lm-eval's is_greedy holds
    assert one["logprobs"]["text_offset"][-1] == len(prompt)
    # without echo: the generated tokens only, offsets in the generated text
    alone = post(url, "/v1/completions", {"prompt": prompt, "logprobs": 0, "max_tokens": 4, "temperature": 0,
                                          "ignore_eos": True}).json()["choices"][0]
    four = list(rt.stream(ids, 4, stop_ids=set()))
    assert alone["text"] == rt.decode(four) and len(alone["logprobs"]["token_logprobs"]) == 4
    assert alone["logprobs"]["text_offset"][0] == 0 and "".join(alone["logprobs"]["tokens"]) == alone["text"]
    assert all(len(top) == 1 for top in alone["logprobs"]["top_logprobs"])  # logprobs=0: the token itself
    whole = rt.nll([ids + four], [4])[0]
    assert -sum(alone["logprobs"]["token_logprobs"]) == pytest.approx(whole, rel=1e-5)
    assert all(not math.isnan(v) for v in alone["logprobs"]["token_logprobs"])


def test_endpoint_runtime_and_probe_against_llmopt_serve(url, served, tiny_model):
    rt = served.runtime
    remote = EndpointRuntime(tiny_model, url=url + "/v1")
    sequences = [rt.encode("The river ran past the old mill."), rt.encode("A short one.")]
    scored = [5, len(sequences[1]) - 1]
    assert remote.nll(sequences, scored) == pytest.approx(rt.nll(sequences, scored), rel=1e-5)
    assert remote._echo_tokens == 0  # max_tokens=0 was accepted
    assert probe(url, {"answers", "loglikelihood", "generation"}) == []
    chat = probe(url, {"chat"})  # the plain tiny model has no chat template
    assert len(chat) == 1 and "cannot answer chat" in chat[0][0] and "no chat template" in chat[0][0]


def test_lm_eval_local_completions_scores_a_local_task_against_llmopt_serve(url, tiny_model, tmp_path):
    pytest.importorskip("lm_eval")
    from test_eval_lm_eval import rows, write_task

    write_task(tmp_path, items=8)
    body = f"""schema_version = 1
name = "lm-eval-served"

[model]
source = "{tiny_model}"

[[eval]]
name = "tiny"
kind = "lm_eval"
task = "tasks/tiny_mc.yaml"
batch_size = 2
max_drop = 0.5
"""
    before = requests(metrics(url), "completions", "ok")
    result = evaluate.evaluate(write_recipe(tmp_path, body), candidate=url + "/v1", output=tmp_path / "r")
    answered = requests(metrics(url), "completions", "ok") - before
    assert answered >= 8 * 3  # one request per choice (the tasks have 3-4), through local-completions
    base = rows(tmp_path / "r" / "eval.tiny.baseline.scores.jsonl")  # lm-eval's HFLM in process
    cand = rows(tmp_path / "r" / "eval.tiny.candidate.scores.jsonl")
    assert len(cand) == 8 and [r["score"] for r in base] == [r["score"] for r in cand]
    assert result.gates[0]["verdict"] == "pass" and result.evals["eval.tiny.candidate"]["runtime"] == "endpoint"
