"""Tiny models of other families than Llama served by vLLM from llmopt's launch configs (benchmarks/gpu_vllm.sh's
variant `families`, docs/results/gpu-engines.md "Other model families on vLLM").

``build`` makes each family's model with tests/families.py's ``make_tiny`` (the family's own transformers config, a
512-token BPE tokenizer, 300 steps of training on the shipped prose) and gives it a plain chat template, since the
test tokenizer has none and vLLM refuses a chat request to a model without one::

    python benchmarks/tiny_families.py build OUT qwen3 gemma3_text phi3 [--wide]

OUT/<family>/ is a Hugging Face model folder (0.3-1.5 MB). ``--wide`` builds them at hidden 256, head_dim 64
(intermediate 512), for an attention backend that refuses the default's head sizes (32, or 16 for phi3 and mixtral,
whose head_dim is hidden / heads).

``ask`` starts each artifact's server from its own deploy/vllm/launch.sh (as `llmopt bench ARTIFACT` does), asks it
/v1/models, three greedy /v1/completions and one greedy /v1/chat/completions, stops it, and keeps the engine's log
lines that name the architecture and the attention backend it chose; for a BF16 artifact it also generates the same
completions with transformers on the same GPU, for a side-by-side look (not a gate: greedy decoding of a model this
unsure flips on rounding)::

    python benchmarks/tiny_families.py ask OUT NAME=ARTIFACT [NAME=ARTIFACT ...]

OUT/NAME.json holds what each answered, OUT/NAME/engine.log the engine's log. ``summarize`` keeps, from an unpacked
vllm-h200.tgz, the machine's versions, the progress log and each NAME.json (the launch config, the answers, the
engine's architecture and backend lines) in one record::

    python benchmarks/tiny_families.py summarize DIR --out docs/runs/vllm-families-h200.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import urllib.request
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
# a turn per line, then the assistant's turn: what a tiny model trained on prose continues as prose
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")
PROMPTS = ["The river runs", "In the morning the", "The history of the city"]
CHAT = [{"role": "user", "content": "Tell me about the old town by the river."}]
MAX_TOKENS = 24
# the engine's log lines worth keeping: what it resolved the checkpoint to, and how it attends and runs it
LOG_LINES = re.compile(r"architecture|Resolved|attention backend|Using .*backend|FLASH|TRITON|FLEX|cudagraph|"
                       r"torch.compile|quantization|dtype|Error|error:|Traceback", re.IGNORECASE)


def build(out: Path, family: str, wide: bool) -> Path:
    sys.path.insert(0, str(TESTS))
    import families

    if wide:  # the module's sizes, and each family's own head_dim where it sets one
        families.HIDDEN, families.INTERMEDIATE = 256, 512
        for _, _, special in families.FAMILIES.values():
            if "head_dim" in special:
                special["head_dim"] = 64
            if "query_pre_attn_scalar" in special:
                special["query_pre_attn_scalar"] = 64
            if "moe_intermediate_size" in special:
                special["moe_intermediate_size"] = 256
    folder = families.make_tiny(family, out / family)
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return folder


def post(url: str, body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as resp:
        return json.loads(resp.read())


def questions(url: str) -> dict:
    models = post(f"{url}/v1/models")
    model = models["data"][0]["id"]
    answers = {"model": model, "max_model_len": models["data"][0].get("max_model_len"), "completions": []}
    for prompt in PROMPTS:
        done = post(f"{url}/v1/completions", {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS,
                                               "temperature": 0})
        answers["completions"].append({"prompt": prompt, "text": done["choices"][0]["text"],
                                       "finish_reason": done["choices"][0]["finish_reason"], "usage": done["usage"]})
    done = post(f"{url}/v1/chat/completions", {"model": model, "messages": CHAT, "max_tokens": MAX_TOKENS,
                                               "temperature": 0})
    answers["chat"] = {"messages": CHAT, "text": done["choices"][0]["message"]["content"],
                       "finish_reason": done["choices"][0]["finish_reason"], "usage": done["usage"]}
    return answers


def transformers_answers(model_dir: Path) -> list[str]:
    """The same greedy completions from transformers, in the checkpoint's dtype on the GPU."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to("cuda").eval()
    texts = []
    for prompt in PROMPTS:
        ids = tok(prompt, return_tensors="pt").input_ids.to("cuda")
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False, pad_token_id=tok.pad_token_id)
        texts.append(tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
    return texts


def ask(out: Path, name: str, artifact: Path) -> dict:
    from llmopt.bench import engine
    from llmopt.store.cache import default_root

    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "engine.log"
    model_config = json.loads((artifact / "model" / "config.json").read_text())
    result = {"name": name, "artifact": str(artifact), "model_type": model_config.get("model_type"),
              "architectures": model_config.get("architectures"), "quantization": model_config.get("quantization_config",
                                                                                                    {}).get("quant_method"),
              "launch_sh": _read(artifact / "deploy" / "vllm" / "launch.sh"),
              "config_yaml": _read(artifact / "deploy" / "vllm" / "config.yaml")}
    started = time.time()
    try:
        port = engine.free_port()
        launch = engine.plan_launch(artifact, "auto", port)
        result["argv"] = launch.argv
        with engine.running(launch, port, default_root(), log, 240, print) as (url, _pid):
            result["start_s"] = round(time.time() - started, 1)
            result["answers"] = questions(url)
        result["ok"] = True
    except Exception as e:  # noqa: BLE001 - a family that fails is recorded, the next one still runs
        result["ok"], result["error"] = False, f"{type(e).__name__}: {e}"[-4000:]
    text = log.read_text(errors="replace") if log.is_file() else ""
    result["engine_log"] = [line[-400:] for line in text.splitlines() if LOG_LINES.search(line)][:60]
    result["engine_log_tail"] = text.splitlines()[-25:]
    if result["ok"] and not result["quantization"]:
        try:
            result["transformers"] = transformers_answers(artifact / "model")
            result["same_as_transformers"] = [a["text"] == b for a, b in
                                              zip(result["answers"]["completions"], result["transformers"])]
        except Exception as e:  # noqa: BLE001
            result["transformers_error"] = f"{type(e).__name__}: {e}"[-2000:]
    (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def summarize(folder: Path) -> dict:
    env = folder / "env.json"
    progress = folder / "progress.log"
    return {"env": json.loads(env.read_text()) if env.is_file() else None,
            "progress": progress.read_text().splitlines() if progress.is_file() else [],
            "families": [json.loads(p.read_text()) for p in sorted((folder / "fam").glob("*.json"))]}


def _read(path: Path) -> str | None:
    return path.read_text() if path.is_file() else None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build tiny models")
    b.add_argument("out", type=Path)
    b.add_argument("families", nargs="+")
    b.add_argument("--wide", action="store_true", help="hidden 256, head_dim 64")
    a = sub.add_parser("ask", help="serve artifacts from their launch configs and ask them")
    a.add_argument("out", type=Path)
    a.add_argument("pairs", nargs="+", metavar="NAME=ARTIFACT")
    s = sub.add_parser("summarize", help="one record of an unpacked vllm-h200.tgz")
    s.add_argument("folder", type=Path)
    s.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "summarize":
        args.out.write_text(json.dumps(summarize(args.folder), indent=2) + "\n")
        return 0
    if args.command == "build":
        for family in args.families:
            print(build(args.out, family, args.wide), flush=True)
        return 0
    failed = 0
    for pair in args.pairs:
        name, _, artifact = pair.partition("=")
        result = ask(args.out, name, Path(artifact))
        failed += not result["ok"]
        print(name, "ok" if result["ok"] else f"failed: {result['error'][:300]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
