"""Digests the cache and the artifact rely on: the piecewise source digest and the copy that hashes as it copies."""

from __future__ import annotations

import hashlib
import os

from llmopt import cache


def test_tree_digest_is_the_sha256_of_the_pieces_digests(tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "TREE_CHUNK", 1000)
    data = os.urandom(4500)
    path = tmp_path / "w.bin"
    path.write_bytes(data)
    pieces = b"".join(hashlib.sha256(data[i:i + 1000]).digest() for i in range(0, len(data), 1000))
    expected = "sha256-tree64m:" + hashlib.sha256(pieces).hexdigest()
    assert cache.tree_digest(path, workers=1) == expected == cache.tree_digest(path, workers=3)
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # one bit in the last piece
    assert cache.tree_digest(path) != expected
    (tmp_path / "empty").write_bytes(b"")
    assert cache.tree_digest(tmp_path / "empty") == "sha256-tree64m:" + hashlib.sha256(hashlib.sha256(b"").digest()).hexdigest()


def test_copy_tree_digests_copies_every_file_and_hashes_it(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    files = {"a.safetensors": os.urandom(3 * cache.CHUNK + 7), "config.json": b"{}", "sub/tok.json": b"x" * 10}
    for name, data in files.items():
        (src / name).write_bytes(data)
    digests = cache.copy_tree_digests(src, tmp_path / "dst")
    assert digests == {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    assert all((tmp_path / "dst" / name).read_bytes() == data for name, data in files.items())
    (tmp_path / "dst" / "config.json").write_bytes(b"changed")  # a copy, not a link
    assert (src / "config.json").read_bytes() == b"{}"
    assert cache.file_digests([src / "config.json", src / "sub" / "tok.json"]) == {
        src / "config.json": hashlib.sha256(b"{}").hexdigest(), src / "sub" / "tok.json": hashlib.sha256(b"x" * 10).hexdigest()}
