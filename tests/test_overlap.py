"""The held-out check: eval data against calibration data (llmopt.data.overlap)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from conftest import DATA
from llmopt import data as datasets
from llmopt.data import overlap

EVALS = [name for name, b in datasets.BUILTIN.items() if b.role == "eval"]


def test_shipped_eval_sets_are_clean_against_the_shipped_calibration_sets():
    start = time.perf_counter()
    for cal in ("builtin:mix", "builtin:prose"):
        for name in EVALS:
            result = overlap.check(f"builtin:{name}", cal)
            print(f"\n{result.summary()}")
            assert not result.contaminated and result.fraction < 0.001 and result.worst_passage < 0.2, result.summary()
            assert result.longest_span < overlap.MIN_SPAN_WORDS, result.summary()
            expected = "same source" if (name, cal) == ("prose-eval", "builtin:prose") else "clean"
            assert result.verdict == expected, result.summary()
    assert time.perf_counter() - start < 10  # about 0.5 s here; generous for a loaded CI machine


def test_calibration_text_reused_as_eval_is_contaminated(tmp_path):
    same = overlap.check("builtin:prose", "builtin:prose")
    assert same.verdict == "contaminated" and same.same_source == "the same file" and same.fraction == 1.0
    (tmp_path / "copy.jsonl").write_bytes((DATA / "calib_mix.jsonl").read_bytes())
    copy = overlap.check("copy.jsonl", "builtin:mix", tmp_path)
    assert copy.contaminated and copy.exact_documents == copy.documents and copy.same_source == "identical content"


def _fiction_with(tmp_path, insert) -> Path:
    paragraphs = datasets.load_texts("builtin:fiction-eval")
    records = [json.loads(line)["text"] for line in (DATA / "calib_mix.jsonl").read_text().splitlines()]
    passage = next(p for r in records for p in r.split("\n\n") if 40 <= len(p.split()) <= 80)
    insert(paragraphs, passage)
    (tmp_path / "eval.txt").write_text("\n\n".join(paragraphs))
    return tmp_path / "eval.txt"


def test_one_copied_passage_is_flagged_whole_or_inside_a_paragraph(tmp_path):
    clean = overlap.check(str(_fiction_with(tmp_path, lambda ps, p: None)), "builtin:mix")
    assert clean.verdict == "clean" and clean.fraction == 0.0

    whole = overlap.check(str(_fiction_with(tmp_path, lambda ps, p: ps.insert(30, p))), "builtin:mix")
    assert whole.verdict == "contaminated" and whole.exact_passages == 1 and whole.fraction < overlap.THRESHOLD

    def inside(ps, p):  # most of the passage, within an eval paragraph
        ps[30] = ps[30][:200] + " " + " ".join(p.split()[:-5]) + " " + ps[30][200:400]

    near = overlap.check(str(_fiction_with(tmp_path, inside)), "builtin:mix")
    assert near.verdict == "contaminated" and near.exact_passages == 0 and near.flagged_passages == 1
    assert near.worst_passage < overlap.PASSAGE_THRESHOLD and near.longest_span >= 35  # found by its copied run
    assert near.examples and near.to_dict()["contaminated"] is True


def test_question_sets_are_compared_through_all_their_strings(tmp_path):
    record = json.loads((DATA / "mc.jsonl").read_text().splitlines()[0])
    question = " ".join([record["question"]] * 3)
    (tmp_path / "cal.txt").write_text(question + "\n\nan unrelated paragraph of calibration text")
    (tmp_path / "mc.jsonl").write_text(json.dumps(record | {"question": question}) + "\n")
    result = overlap.check("mc.jsonl", "cal.txt", tmp_path)
    assert result.contaminated and overlap.check("hf:a:b", "cal.txt", tmp_path) is None
