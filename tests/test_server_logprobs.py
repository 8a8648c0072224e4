"""Log-likelihood scoring over HTTP against llmopt serve: /v1/completions with echo and logprobs
(the shape of OpenAI's legacy API and vLLM's), llmopt's endpoint runtime, and lm-eval's
local-completions model running a local log-likelihood task."""

from __future__ import annotations

import math

import pytest

from llmopt.run import evaluate
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
    ids = served.tokenize(prompt)  # as the model's HF tokenizer gives them
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


@pytest.fixture(scope="module")
def stopping_model(tiny_model, tmp_path_factory):
    """The tiny model with every even token id an end-of-sequence id (a generation_config.json list, as
    Llama 3 ships): about half the greedy next tokens end the generation at once."""
    import json
    import shutil

    folder = tmp_path_factory.mktemp("stopping") / "tiny-stops"
    shutil.copytree(tiny_model, folder)
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    config = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**config, "eos_token_id": list(range(0, vocab, 2))}))
    return folder


@pytest.fixture(scope="module")
def stopping(stopping_model):
    served = load_model(stopping_model, max_model_len=MAX_LEN, name="tiny")
    with running(served) as base:
        yield served, base


def greedy_next(rt, ids: list[int]) -> int:
    return int(rt.logits(ids)[-1].argmax())


def test_a_stop_token_generated_is_counted_and_scored_as_vllm_does(stopping):
    served, url = stopping
    rt = served.runtime
    texts = ["The river ran past the old mill.", "Stones in the water", "A short one.", "Once upon a time",
             "The sea", "Question: what is it?\nAnswer:"]
    prompts = [rt.encode(t, bos=False) for t in texts]
    ending = [ids for ids in prompts if greedy_next(rt, ids) in rt.eos_ids]
    going = [ids for ids in prompts if greedy_next(rt, ids) not in rt.eos_ids]
    assert ending and going
    for ids in ending + going:  # lm-eval's loglikelihood request
        body = {"prompt": ids, "echo": True, "logprobs": 1, "max_tokens": 1, "temperature": 0}
        answer = post(url, "/v1/completions", body).json()
        choice, lp = answer["choices"][0], answer["choices"][0]["logprobs"]
        stop = greedy_next(rt, ids)
        assert answer["usage"]["completion_tokens"] == 1  # the stop token is generated, as vLLM counts it
        assert len(lp["token_logprobs"]) == len(ids) + 1
        assert lp["token_logprobs"][-1] == pytest.approx(-rt.nll([ids + [stop]], [1])[0], abs=1e-4)
        assert -sum(lp["token_logprobs"][1:-1]) == pytest.approx(rt.nll([ids], [len(ids) - 1])[0], abs=1e-4)
        if stop in rt.eos_ids:
            assert choice["finish_reason"] == "stop" and choice["text"] == rt.decode(ids)  # not in the text
        else:
            assert choice["finish_reason"] == "length"
    streamed_usage = None
    import httpx

    body = {"prompt": ending[0], "max_tokens": 5, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                import json

                chunk = json.loads(line[6:])
                streamed_usage = chunk.get("usage") or streamed_usage
    assert streamed_usage["completion_tokens"] == 1


def test_lm_eval_local_completions_loglikelihoods_equal_the_runtimes_own(stopping, stopping_model):
    """lm-eval's own local-completions model against llmopt serve: each request's log-likelihood and
    is_greedy as the runtime scores the same tokens, also where the token generated after the
    continuation is an end-of-sequence id (lm-eval drops the last entry as the generated token's)."""
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    from conftest import DATA

    served, url = stopping
    rt = served.runtime
    lm = LocalCompletionsAPI(base_url=url + "/v1/completions", model="tiny", tokenizer=str(stopping_model),
                             tokenizer_backend="huggingface", num_concurrent=1, max_retries=1)
    import json

    items = [json.loads(line) for line in (DATA / "mc.jsonl").read_text().splitlines()[:4]]
    pairs = [(f"Question: {item['question']}\nAnswer:", f" {choice}") for item in items for choice in item["choices"]]
    requests_ = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]
    theirs = lm.loglikelihood(requests_, disable_tqdm=True)
    ended = 0
    for (context, continuation), (value, greedy) in zip(pairs, theirs):
        ctx_ids, cont_ids = lm._encode_pair(context, continuation)
        ids = ctx_ids + cont_ids
        logits = rt.logits(ids)
        ended += int(logits[-1].argmax()) in rt.eos_ids
        assert value == pytest.approx(-rt.nll([ids], [len(cont_ids)])[0], abs=1e-4)
        picks = [int(logits[t].argmax()) for t in range(len(ctx_ids) - 1, len(ids) - 1)]
        assert greedy == (picks == cont_ids)
    assert ended >= 2  # the case lm-eval got wrong: the generated token was a stop id


def test_text_prompts_are_tokenized_as_the_models_hf_tokenizer_does(url, served, tiny_model, tmp_path):
    """A text prompt gets exactly AutoTokenizer's ids, special tokens only where it adds them: none for the
    tiny model's tokenizer, a BOS for a copy whose post-processor adds one; text and ids score the same."""

    from transformers import AutoTokenizer

    text = "The river ran past the old mill and into the sea."
    for folder, bos in ((tiny_model, False), (with_bos_post_processor(tiny_model, tmp_path / "bos"), True)):
        hf = AutoTokenizer.from_pretrained(folder)
        ids = hf(text)["input_ids"]
        assert (ids[0] == hf.bos_token_id) == bos
        model = load_model(folder, max_model_len=MAX_LEN, name="tiny")
        assert model.tokenize(text) == ids and model.tokenize(text, special=False) == hf(text, add_special_tokens=False)["input_ids"]
    body = {"echo": True, "logprobs": 1, "max_tokens": 0}
    as_text = post(url, "/v1/completions", {**body, "prompt": text}).json()
    as_ids = post(url, "/v1/completions", {**body, "prompt": AutoTokenizer.from_pretrained(tiny_model)(text)["input_ids"]}).json()
    assert as_text["usage"] == as_ids["usage"] and as_text["usage"]["prompt_tokens"] == len(served.tokenize(text))
    assert as_text["choices"][0]["logprobs"] == as_ids["choices"][0]["logprobs"]
    assert as_text["choices"][0]["text"] == text


def with_bos_post_processor(tiny_model, folder):
    """A copy of the tiny model whose tokenizer.json adds <s> to every text (as Llama's does)."""
    import json
    import shutil

    shutil.copytree(tiny_model, folder)
    path = folder / "tokenizer.json"
    tok = json.loads(path.read_text())
    bos = next(t["id"] for t in tok["added_tokens"] if t["content"] == "<s>")
    tok["post_processor"] = {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                                                      {"Sequence": {"id": "A", "type_id": 0}}],
                             "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                      {"Sequence": {"id": "B", "type_id": 1}}],
                             "special_tokens": {"<s>": {"id": "<s>", "ids": [bos], "tokens": ["<s>"]}}}
    path.write_text(json.dumps(tok))
    return folder
