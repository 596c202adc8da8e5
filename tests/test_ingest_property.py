"""``memfs import`` of generated hostile trees (SPEC §10 "untrusted input"): random bytes,
invalid UTF-8, deep nesting, huge numbers, NULs, control characters and over-long lines in
files, beside symbolic links (to files and directories outside) and FIFOs. Nothing escapes:
no exception, nothing written outside the store, nothing read through a link, memory bounded."""

from __future__ import annotations

import os
import resource
import tempfile
from pathlib import Path

import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from memfs.ingest.importer import import_paths

FIXTURE = (Path(__file__).parent / "fixtures" / "codex_exec.jsonl").read_bytes().splitlines()
OUTSIDE = (Path(__file__).parent / "fixtures" / "codex_rollout.jsonl").read_bytes()  # reachable by links only
OUTSIDE_ID = b"0199a3c1-2f4e-7c52-b1de-5e0f5a3c9d10"  # its conversation
LIMIT = 512  # max_line_bytes here: a longer line is refused unheld

hostile_lines = st.one_of(
    st.sampled_from(FIXTURE),  # real lines, so that sessions are made
    st.binary(max_size=80).map(lambda b: b.replace(b"\n", b"")),
    st.sampled_from([b"\xff\xfe", b'{"type":"error","message":"\xc3"}', b"\xed\xa0\x80"]),
    st.integers(1, 3000).map(lambda n: b'{"type":"x","a":' + b"[" * n + b"]" * n + b"}"),
    st.sampled_from([b'{"type":"x","n":1e999}', b'{"type":"x","n":' + b"9" * 400 + b"}", b"-1e400"]),
    st.sampled_from([b"\x00", b'{"type":"error","message":"a\x00b"}', b'{"type":"x"}\x00']),
    st.text(alphabet=st.characters(max_codepoint=31), max_size=20).map(str.encode).map(
        lambda b: b.replace(b"\n", b"")),
    st.integers(LIMIT + 1, 4 * LIMIT).map(lambda n: b'{"type":"error","message":"' + b"x" * n + b'"}'),
)
files = st.lists(st.tuples(st.lists(hostile_lines, max_size=12), st.booleans(), st.booleans()), max_size=5)


def snapshot(top: Path) -> dict:
    """Every entry under ``top``, not followed: its type and (for a file) its bytes."""
    out = {}
    for parent, dirs, names in os.walk(top):
        for name in dirs + names:
            p = Path(parent) / name
            st_ = os.lstat(p)
            out[str(p.relative_to(top))] = (st_.st_mode, p.read_bytes() if p.is_file() and not p.is_symlink() else
                                            os.readlink(p) if p.is_symlink() else None)
    return out


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(files=files, link_file=st.booleans(), link_dir=st.booleans(), fifo=st.booleans())
def test_import_of_a_hostile_tree(files, link_file, link_dir, fifo):
    before_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        outside, tree, store = base / "outside", base / "tree", base / "store"
        (outside / "deep").mkdir(parents=True)
        (outside / "secret.jsonl").write_bytes(OUTSIDE)
        (outside / "deep" / "x.jsonl").write_bytes(OUTSIDE)
        (tree / "sub").mkdir(parents=True)
        longs = {}
        for i, (lines, terminated, zst) in enumerate(files):
            data = b"\n".join(lines) + (b"\n" if terminated and lines else b"")
            path = tree / ("sub" if i % 2 else "") / (f"f{i}.jsonl.zst" if zst else f"f{i}.jsonl")
            path.write_bytes(zstandard.ZstdCompressor().compress(data) if zst else data)
            longs[str(path)] = sum(len(x) > LIMIT for x in (lines if terminated else lines[:-1]))
        if link_file:
            (tree / "link.jsonl").symlink_to(outside / "secret.jsonl")
        if link_dir:
            (tree / "sub" / "linked").symlink_to(outside / "deep", target_is_directory=True)
        if fifo:
            os.mkfifo(tree / "sub" / "pipe.jsonl")
        outside_before, tree_before = snapshot(outside), snapshot(tree)

        items = import_paths(store, [tree], max_line_bytes=LIMIT)  # raises nothing, never blocks

        assert snapshot(outside) == outside_before and snapshot(tree) == tree_before
        assert sorted(p.name for p in base.iterdir()) == sorted(["outside", "tree"] + (["store"] if store.exists()
                                                                                        else []))
        skipped = sorted(Path(i.source).name for i in items if i.status == "skipped")
        assert skipped == sorted(["link.jsonl"] * link_file + ["linked"] * link_dir + ["pipe.jsonl"] * fifo)
        for item in items:
            assert item.status in ("imported", "up-to-date", "empty", "skipped"), item
            if item.source in longs:
                assert item.refused >= longs[item.source], item
        if store.exists():  # nothing of the files behind the links
            for parent, _dirs, names in os.walk(store):
                for name in names:
                    assert OUTSIDE_ID not in (Path(parent) / name).read_bytes(), name
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before_rss < 100 * 1024
