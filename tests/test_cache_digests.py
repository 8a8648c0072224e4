"""What the cache and the artifact rely on: file digests, linked weights and entries that notice edits."""

from __future__ import annotations

import hashlib
import os

import blake3
import pytest

from llmopt.store import cache
def test_digests_are_what_b3sum_and_sha256sum_print(tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "MAP_WINDOW", 1 << 20)
    data = os.urandom(3 * cache.CHUNK + 7)  # several read chunks and mapped windows, not a multiple of either
    path = tmp_path / "w.safetensors"
    path.write_bytes(data)
    assert cache.file_digest(path) == cache.blake3_file(path) == blake3.blake3(data).hexdigest()
    assert cache.file_digest(path, "sha256") == cache.sha256_file(path) == hashlib.sha256(data).hexdigest()
    (tmp_path / "empty").write_bytes(b"")
    assert cache.blake3_file(tmp_path / "empty") == blake3.blake3(b"").hexdigest()
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # one bit
    assert cache.file_digest(path) != blake3.blake3(data).hexdigest()
    files = [path, tmp_path / "empty"]
    for algorithm, fn in (("blake3", cache.blake3_file), ("sha256", cache.sha256_file)):
        assert cache.file_digests(files, algorithm) == {p: fn(p) for p in files}
    with pytest.raises(ValueError, match="unknown checksum"):
        cache.file_digest(path, "md5")


def _tree(root, files: dict[str, bytes]):
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)


def test_place_tree_links_weights_and_copies_the_rest(tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "LINK_MIN", 1000)
    src, dst = tmp_path / "src", tmp_path / "dst"
    files = {"model.safetensors": os.urandom(5000), "config.json": b"{}", "sub/tok.json": b"x" * 10}
    _tree(src, files)
    assert cache.place_tree(src, dst) == {"config.json": "copy", "model.safetensors": "link", "sub/tok.json": "copy"}
    assert all((dst / name).read_bytes() == data for name, data in files.items())
    assert (dst / "model.safetensors").stat().st_ino == (src / "model.safetensors").stat().st_ino
    (dst / "config.json").write_bytes(b"changed")  # small files are copies: the source keeps its own
    assert (src / "config.json").read_bytes() == b"{}"
    copied = cache.place_tree(src, tmp_path / "copied", link=False)
    assert set(copied.values()) == {"copy"}
    assert (tmp_path / "copied" / "model.safetensors").stat().st_ino != (src / "model.safetensors").stat().st_ino


def test_an_entry_whose_files_change_is_not_reused(tmp_path):
    store = cache.Cache(tmp_path / "cache")
    tmp = store.begin("k")
    _tree(tmp, {"model/model.safetensors": b"w" * 100, "model/config.json": b"{}"})
    store.commit("k", tmp, None)  # placed but not sealed: a stage whose deferred work still runs
    assert store.state("k") == "missing"
    store.seal("k", {"outputs": {}})
    assert store.state("k") == "whole" and store.has("k")
    weights = store.path("k") / "model" / "model.safetensors"
    with open(weights, "r+b") as f:  # written in place, same size, as through a hard link
        f.write(b"v")
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 1))  # clocks coarser than writes
    assert store.state("k") == "changed" and not store.has("k")
    again = store.begin("k")
    _tree(again, {"model/model.safetensors": b"w" * 100})
    store.commit("k", again, {"outputs": {}})  # a re-run replaces the changed entry
    assert store.state("k") == "whole" and not (store.path("k") / "model" / "config.json").exists()
