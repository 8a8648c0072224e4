"""Does measuring sensitivity matter? The demo model with every decoder linear rounded to 4 bits (zero points,
groups of 32: compressed-tensors' round-to-nearest, as `sensitive_layers` scores them) except 16 layer groups kept
at 8-bit symmetric weights, chosen four ways: the 16 that llmopt's measurement ranks highest (what
``sensitive_layers = 16`` keeps), the 16 it ranks lowest, and 16 at random (two seeds). Perplexity change against
the float32 model on 24 windows of 256 tokens of three held-out domains; the same 30 rows of builtin:mix as the
quickstart's calibration (each document's first 256 tokens) for the measurement. No AWQ: the rounding alone, so the
choice of layers is all that differs. One JSON line per choice on stdout.

    .venv/bin/python benchmarks/sensitive_control.py <the source stage's model/>
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = ROOT / "llmopt" / "data"
KEEP, BITS, GROUP = 16, 4, 32


def main(source: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llmopt.backends.compress import _sensitivity

    tok = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    docs = [json.loads(line)["text"] for line in (DATA / "calib_mix.jsonl").read_text().splitlines() if line.strip()]
    random.Random(0).shuffle(docs)
    rows = [ids[:256] for ids in (tok(d)["input_ids"] for d in docs) if len(ids) >= 256][:30]
    started = time.time()
    ranked = _sensitivity.rank(model, [torch.tensor([r]) for r in rows], BITS, GROUP, False, {"lm_head"})
    print(json.dumps({"units": len(ranked), "seconds": round(time.time() - started, 1),
                      "top": [u.names[0] for u in ranked[:KEEP]]}), flush=True)
    linears = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"}
    weights = {n: m.weight.data.clone() for n, m in linears.items()}
    windows = {}
    for name in ("prose", "encyclopedia", "dialogue"):
        ids = tok((DATA / f"{name}_eval.txt").read_text())["input_ids"]
        windows[name] = [ids[i:i + 256] for i in range(0, len(ids) - 256, 256)][:24]

    def perplexity() -> dict:
        out = {}
        with torch.no_grad():
            for name, spans in windows.items():
                nll = count = 0
                for span in spans:
                    logits = model(torch.tensor([span])).logits[0, :-1].float()
                    nll += float(torch.nn.functional.cross_entropy(logits, torch.tensor(span[1:]), reduction="sum"))
                    count += len(span) - 1
                out[name] = math.exp(nll / count)
        return out

    base = perplexity()
    choices = [("none", []), ("measured, highest", ranked[:KEEP]), ("measured, lowest", ranked[-KEEP:])]
    choices += [(f"random, seed {seed}", random.Random(seed).sample(ranked, KEEP)) for seed in (1, 2)]
    for label, units in choices:
        kept = {n for u in units for n in u.names}
        for n, m in linears.items():
            m.weight.data = (_sensitivity.rounded(weights[n], 8, GROUP, True) if n in kept
                             else _sensitivity.rounded(weights[n], BITS, GROUP, False))
        scores = perplexity()
        print(json.dumps({"kept": label, "parameters_8bit": sum(u.parameters for u in units),
                          "increase_pct": {k: round(100 * (scores[k] / base[k] - 1), 1) for k in scores}}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
