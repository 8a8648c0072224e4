"""Text workloads: prompts from JSONL files in vLLM's and GuideLLM's conventions, the built-in text workloads
made from llmopt's own text, and what llmopt bench, its stage in `llmopt run` and the tune stage send of them."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys

import pytest

from test_bench_engine import put_fake_vllm
from test_bench_fakeserver import Running

from llmopt import api
from llmopt.bench import BenchOptions, Workload, dataset, run_bench, workload as wl
from llmopt.bench.dataset import Item
from llmopt.cli.main import main
from llmopt.data import workloads
from llmopt.errors import UsageError


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    return put_fake_vllm(tmp_path, monkeypatch)


def write(folder, lines: list, name: str = "prompts.jsonl"):
    path = folder / name
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


SYSTEM, USER, ASSISTANT = ({"role": r, "content": c} for r, c in (("system", "Be brief."), ("user", "Hi?"),
                                                                    ("assistant", "Hello.")))


@pytest.mark.parametrize("record, item", [
    ({"prompt": "Capital of India?", "output_tokens": 10}, Item(prompt="Capital of India?", output_tokens=10)),  # vLLM
    ({"question": "Why?", "system_prompt": "Be brief.", "output_tokens_count": 5},  # GuideLLM's column names
     Item(prompt="Why?", system="Be brief.", output_tokens=5)),
    ({"instruction": "Add.", "input": "1 2", "output": "3"}, Item(prompt="Add.", answer="3")),  # GuideLLM's order
    ({"prompt": "p", "completion": "c", "output_tokens": 4.0}, Item(prompt="p", answer="c", output_tokens=4)),
    ({"messages": [SYSTEM, USER, ASSISTANT]},
     Item(messages=(("system", "Be brief."), ("user", "Hi?")), answer="Hello.")),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]},
     Item(messages=(("user", "ab"),))),
    ({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}, {"from": "human", "value": "q2"}]},
     Item(prompt="q", answer="a")),  # as vLLM's sharegpt: the first human turn and the answer after it
    ({"conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "q"}]}, Item(prompt="q", system="s")),
])
def test_records_in_the_conventions_of_vllm_and_guidellm(record, item):
    assert dataset.parse_record(record) == item


@pytest.mark.parametrize("line, message", [
    ('{"prompt": "cut off', "line 2 is not JSON"),
    ('["a list"]', "line 2: a record must be a JSON object, not list"),
    ('{"title": "x"}', "line 2: no prompt: none of prompt, instruction"),
    ('{"prompt": "  "}', '"prompt" must be non-empty text'),
    ('{"prompt": "a", "output_tokens": 0}', '"output_tokens" must be a whole number of tokens, at least 1 (got 0)'),
    ('{"prompt": "a", "output_tokens_count": "ten"}', '"output_tokens_count" must be a whole number'),
    ('{"messages": [{"role": "tool", "content": "x"}]}', "has role 'tool'"),
    ('{"messages": [{"role": "assistant", "content": "x"}]}', '"messages" must hold a user message'),
    ('{"conversations": []}', '"conversations" must be a non-empty list'),
])
def test_a_malformed_line_is_exit_2_naming_the_file_and_line(tmp_path, capsys, line, message):
    path = write(tmp_path, ['{"prompt": "fine"}', line, '{"prompt": "fine too"}'])
    assert main(["bench", "http://127.0.0.1:9", "--dataset", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:2" in err and message in err and 'fix: one JSON object a line: {"prompt"' in err


def test_a_json_array_is_read_as_sharegpt_ships_it(tmp_path):
    turns = [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps([{"id": "x", "conversations": turns}, {"id": "y", "conversations": turns}]))
    loaded = dataset.load(str(path))
    assert loaded.items == [Item(prompt="q", answer="a")] * 2
    assert loaded.sha256 == hashlib.sha256(path.read_bytes()).hexdigest() and loaded.name == str(path)
    path.write_text(json.dumps([{"conversations": turns}, {"conversations": "no"}]))
    with pytest.raises(UsageError, match="record 2: \"conversations\" must be a non-empty list") as err:
        dataset.load(str(path))
    assert err.value.where == f"{path}:2"


@pytest.mark.parametrize("args, message", [
    (["--dataset", "missing.jsonl"], "data set not found"),
    (["--dataset", "builtin:prose"], "unknown built-in text workload 'builtin:prose'"),
    (["--dataset", "builtin:rewrite", "--input-len", "8"], "--input-len does not apply with --dataset"),
])
def test_dataset_usage_errors_exit_2(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "http://127.0.0.1:9", *args]) == 2
    err = capsys.readouterr().err
    assert message in err
    if "builtin:prose" in args:
        assert "builtin:continue, builtin:rewrite, builtin:code-edit, builtin:multiturn" in err


def test_builtin_workloads_are_the_same_in_every_process():
    here = {name: hashlib.sha256(workloads.jsonl(name).encode()).hexdigest() for name in workloads.WORKLOADS}
    code = ("import hashlib; from llmopt.data import workloads as w; "
            "print({n: hashlib.sha256(w.jsonl(n).encode()).hexdigest() for n in w.WORKLOADS})")
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert eval(there) == here  # noqa: S307 - a dict this test printed
    for name in workloads.WORKLOADS:
        loaded = dataset.load(f"builtin:{name}")
        assert loaded.sha256 == here[name] and 32 <= len(loaded.items) <= 64, name


def _words(text: str) -> list[str]:
    return text.replace("\n", " ").split()


def _copied(answer: str, prompt: str) -> float:
    """The share of the answer's words that the prompt holds."""
    have = set(_words(prompt))
    return sum(w in have for w in _words(answer)) / len(_words(answer))


def test_builtin_answers_copy_their_prompts_where_they_should():
    rewrite = workloads.records("rewrite")
    assert [r["prompt"].split()[0] for r in rewrite[:4]] == ["Correct", "Rewrite", "Copy", "Summarize"]
    for r in rewrite:
        if "completion" in r:
            assert _copied(r["completion"], r["prompt"]) > 0.85, r
        else:
            assert r["output_tokens"] == workloads.SUMMARY_TOKENS and r["prompt"].startswith("Summarize")
    edits = workloads.records("code-edit")
    for r in edits:
        code = r["prompt"].split("```python\n", 1)[1]
        assert r["completion"] != f"```python\n{code}" and _copied(r["completion"], code) > 0.6, r
    assert {r["prompt"].split(":", 1)[1].split()[0] for r in edits} == {"Rename", "Remove"}
    assert any("Rename the parameter" in r["prompt"] for r in edits)
    for r in workloads.records("continue"):
        assert r["completion"] not in r["prompt"] and _copied(r["completion"], r["prompt"]) < 0.8
    chats = workloads.records("multiturn")
    assert len({json.dumps(r["messages"][0]) for r in chats}) == 1  # one system prompt shared by every request
    assert len(chats[0]["messages"][0]["content"].split()) > 600
    for c in range(16):
        turns = [r["messages"] for r in chats[4 * c : 4 * c + 4]]
        assert [len(t) for t in turns] == [3, 5, 7, 9]  # the system prompt, the history, the reference answer
        assert all(later[: len(earlier)] == earlier for earlier, later in zip(turns, turns[1:]))


def test_ls_data_lists_the_text_workloads(capsys):
    assert main(["ls", "data", "--format", "json"]) == 0
    listed = {d["name"]: d for d in json.loads(capsys.readouterr().out)["data"]}
    assert all(listed[name]["role"] == "workload" for name in workloads.names())
    assert listed["builtin:prose"]["role"] == "calibration"


def test_random_prompts_are_what_they_were():
    """Without a dataset the bodies are byte for byte those of llmopt before text workloads existed."""
    digest = hashlib.sha256()
    for endpoint in ("completions", "chat"):
        for server, vocab in (("vllm", 49152), ("unknown", None), ("llmopt", 512)):
            for body in wl.bodies(Workload(input_len=32, output_len=8), BenchOptions(endpoint=endpoint), "m", server,
                                  vocab, 5, 7):
                digest.update(body)
    assert digest.hexdigest() == "c94385dd2cd0aee028da6cdd5bdf61fb8e109d3e188d9268d9ca3a553bda64b5"
    assert Workload().model_dump() == {"input_len": 1024, "output_len": 256, "concurrency": 16}  # keys as before
    assert Workload(dataset="builtin:rewrite").model_dump()["output_len_from"] == "data"


def test_lengths_are_counted_with_the_models_tokenizer(tmp_path, tiny_model):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))

    def count(text, special=False):
        return len(tok.encode(text, add_special_tokens=special).ids)

    answer = "Light bends as it enters the drop."
    items = [Item(prompt="Why is the sky blue?", answer=answer), Item(prompt="Go on.", output_tokens=12),
             Item(prompt="Plain.", system="Be brief."), Item(messages=(("user", "Hi?"),), answer="Hello there.")]
    data = dataset.Dataset("set", "0" * 64, items)
    got = dataset.prepare(data, "completions", 7, "data", tiny_model, None)
    assert [r.max_tokens for r in got.requests] == [count(answer), 12, 7, count("Hello there.")]
    assert got.requests[2].prompt == "Be brief.\n\nPlain." and got.requests[0].input_tokens == count(
        "Why is the sky blue?", True)
    assert got.info["input_tokens"]["max"] == max(r.input_tokens for r in got.requests)
    assert got.info["tokenizer"] == str(tiny_model) and got.info["kind"] == "mixed"
    assert {r.max_tokens for r in dataset.prepare(data, "chat", 7, "fixed", tiny_model, None).requests} == {7}
    blind = dataset.prepare(data, "completions", 7, "data", None, None)  # no tokenizer: the records' own counts
    assert [r.max_tokens for r in blind.requests] == [7, 12, 7, 7] and blind.info["input_tokens"] is None
    limit = min(r.input_tokens + r.max_tokens for r in got.requests)
    short = dataset.prepare(data, "completions", 7, "data", tiny_model, limit)
    fits = [r for r in got.requests if r.input_tokens + r.max_tokens <= limit]
    assert short.requests == fits and short.info["too_long"] == 4 - len(fits) > 0
    with pytest.raises(UsageError, match="no record of set fits the served context of 5 tokens"):
        dataset.prepare(data, "completions", 7, "data", tiny_model, 5)
    # the model's chat template renders a chat for /v1/completions, as llmopt serve renders it for chat
    folder = tmp_path / "templated"
    shutil.copytree(tiny_model, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    (folder / "chat_template.jinja").write_text(
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<assistant>"
        "{% endif %}")
    chat = dataset.prepare(data, "completions", 7, "data", folder, None).requests[3]
    assert chat.prompt == "<user>Hi?\n<assistant>" and chat.input_tokens == count(chat.prompt)
    sent = dataset.prepare(data, "chat", 7, "data", folder, None).requests
    assert sent[2].messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Plain."}]


def test_bench_sends_the_records_in_order_and_names_the_dataset(tmp_path):
    path = write(tmp_path, [{"prompt": "one", "output_tokens": 3}, {"prompt": "two", "output_tokens": 5},
                            {"messages": [SYSTEM, USER], "output_tokens": 2}])
    options = {"concurrency": [1], "requests": 4, "warmup": 1, "plots": False, "split": []}
    with Running("--owned-by", "vllm") as server:
        result = run_bench(server.url, {"dataset": str(path), "output_len": 9}, {}, options, tmp_path / "out")
        chat = run_bench(server.url, {"dataset": str(path)}, {}, options | {"endpoint": "chat", "warmup": 0,
                                                                          "ignore_eos": True}, tmp_path / "chat")
        truth = sorted(server.truth().values(), key=lambda r: int(r["id"][1:]))
    sent = [(r["prompt"], r["max_tokens"]) for r in truth[:5]]  # warm-up, then the measured ones, around again
    assert sent == [("one", 3), ("two", 5), ("Be brief.\n\nHi?", 2), ("one", 3), ("two", 5)]
    # a text workload's answers end where the model ends them, even on an engine that takes ignore_eos; asked for, it
    # is sent
    assert not any("ignore_eos" in r["keys"] for r in truth[:5]) and all("ignore_eos" in r["keys"] for r in truth[5:])
    assert result["client"]["sent"]["ignore_eos"] is False and chat["client"]["sent"]["ignore_eos"] is True
    assert [r["messages"] for r in truth[5:7]] == [[{"role": "user", "content": "one"}], [{"role": "user", "content": "two"}]]
    assert truth[7]["messages"] == [SYSTEM, USER]
    info = result["dataset"]
    assert info["name"] == str(path) and info["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert info["records"] == info["used"] == 3 and info["output_tokens"] == {"mean": 3.3, "min": 2, "max": 5}
    assert result["workload"]["dataset"] == str(path) and result["client"]["sent"]["prompt"] == f"text from {path}"
    assert chat["client"]["sent"]["prompt"] == f"chat messages from {path}"
    assert f"Workload: {path} (sha256 {info['sha256'][:12]}, 3 of 3 records), prompt lengths from the server" in (
        tmp_path / "out" / "bench.md").read_text()


def test_recipe_dataset_is_checked_keyed_and_sent_by_the_bench_stage(tmp_path, tiny_model, fake_vllm):
    from conftest import served_recipe

    recipe = served_recipe(tmp_path, tiny_model, bench="enabled = true\nrequests = 3\nwarmup = 0\nrepeats = 1\n",
                           tune="enabled = true\nmax_trials = 1\n")
    data = write(tmp_path, [{"prompt": "The sky is", "completion": "blue and wide."}])
    overrides = ['serve.workload.dataset="prompts.jsonl"']  # relative to the recipe's folder
    plan = api.plan(recipe, overrides)
    assert not plan.errors, plan.errors
    bench, tune = plan.stage("bench"), plan.stage("tune")
    digest = hashlib.sha256(data.read_bytes()).hexdigest()
    assert bench.material["dataset_sha256"] == tune.material["dataset_sha256"] == digest
    assert "dataset_sha256" not in api.plan(recipe).stage("bench").material
    write(tmp_path, [{"prompt": "The sea is", "completion": "grey."}])
    assert api.plan(recipe, overrides).stage("bench").key != bench.key  # the file's content is in the key
    write(tmp_path, [{"prompt": "fine"}, {"prompt": 3}])
    errors = [str(p) for p in api.plan(recipe, overrides).errors]
    assert any(f"{data}:2: line 2: \"prompt\" must be non-empty text" in e and "serve.workload.dataset" in e
               for e in errors), errors

    write(tmp_path, [{"prompt": "The sky is", "completion": "blue and wide."}])
    result = api.run(recipe, [*overrides, "tune.enabled=false"], output_dir=tmp_path / "art")
    bench = json.loads((tmp_path / "art" / "manifest.json").read_text())["bench"]
    assert bench["dataset"]["name"] == str(data) and bench["dataset"]["sha256"] == digest
    assert bench["dataset"]["tokenizer"] and bench["dataset"]["input_tokens"]["min"] > 0
    assert bench["points"][0]["requests"]["ok"] == 3 and result is not None
    report = (tmp_path / "art" / "reports" / "report.md").read_text()
    assert f"Workload: {data} (sha256 {digest[:12]}, 1 of 1 records), prompts of " in report
