"""Hostile names through the mount, and symlinks planted in the backing store (issue 7).

``mkdir`` of names that are not a session directory's sanitized form, too long, or taken
must fail with the right errno and create nothing. A symlink planted in the store — as a
session directory, or in place of a session's file or directory — is never followed: its
target is neither read nor written (not even by a view copy or a removal), nothing of it is
shown through the mount, and the refusal is reported (``ELOOP`` or ``ENOENT`` on access, and
a log line naming the link). One such session never breaks the others, nor the store-wide
search.
"""

from __future__ import annotations

import errno
import json
import os
import shutil

import pytest

from mounting import event, mounted, needs_fuse
from store_helpers import errno_of

pytestmark = needs_fuse

SECRET = "zanzibarquokka"  # only the symlinks' targets hold it
TURN = event("turn.started")


def test_mkdir_of_hostile_names(tmp_path):
    store = tmp_path / "store"
    store.mkdir(mode=0o700)
    (store / "stray").write_text("not a session")  # a file and a link where a session could be
    os.symlink(tmp_path, store / "linked")
    with mounted(store, tmp_path / "mnt") as m:
        sessions = m.mnt / "sessions"
        os.mkdir(sessions / "taken")
        cases = {
            "..": errno.EEXIST, ".": errno.EEXIST,  # the kernel answers these itself
            "..x": errno.EINVAL, "café": errno.EINVAL, "a\nb": errno.EINVAL, "a\\b": errno.EINVAL,
            "a*": errno.EINVAL, "\x01": errno.EINVAL,
            "-": errno.EINVAL, "-rf": errno.EINVAL, "--help": errno.EINVAL,  # read as options by tools
            "y" * 256: errno.ENAMETOOLONG, "z" * 1100: errno.ENAMETOOLONG,
            "taken": errno.EEXIST, "stray": errno.EEXIST, "linked": errno.EEXIST,
        }
        got = {name: errno_of(lambda name=name: os.mkdir(sessions / name)) for name in cases}
        assert got == cases
        longest = "x" * 255
        for name in (longest, "x..", "a-", "_"):  # sanitized form already: accepted
            os.mkdir(sessions / name)
        with open(sessions / longest / "events.jsonl", "a") as f:
            f.write(TURN + "\n")
        assert sorted(os.listdir(sessions)) == sorted(["taken", longest, "x..", "a-", "_"])
        assert "invalid session name '..x'" in m.log_text()
        assert "invalid session name '-rf': it must not begin with '-'" in m.log_text()
    assert sorted(n for n in os.listdir(store) if n != ".memfs") == sorted(  # (.memfs: the store catalog)
        ["stray", "linked", "taken", longest, "x..", "a-", "_"])
    assert os.path.islink(store / "linked") and (store / "stray").read_text() == "not a session"
    assert (store / longest / "events.jsonl").read_text() == TURN + "\n"


# session name → the path inside it replaced by a symlink (None: the session dir itself)
PLANTED = {
    "linkdir": None,
    "manifest": "manifest.json",
    "events": "events.jsonl",
    "turns": "index/turns.json",
    "lock": "session.lock",
    "index": "index",
    "rejected": "rejected.jsonl",
    "derived": "derived",
}
BROKEN = ("manifest", "events", "turns", "index")  # what a read needs: the session cannot be opened
UNWRITABLE = ("lock", "rejected")  # read as usual (reading never locks); the first change is refused
READS = ("events.jsonl", "manifest.json", "rejected.jsonl", "index/turns.json", "derived/memory.json",
         "derived/summary.md", "derived/trajectory.jsonl", f"search/{SECRET}", "search/retry")


def snapshot(path):
    """What a symlink's target holds: every file's bytes and mtime."""
    return {str(p): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture
def planted(tmp_path):
    """A store whose sessions each have one symlink planted, and the links' targets."""
    store, outside = tmp_path / "store", tmp_path / "outside"
    secret = event("item.completed", item={"id": "s", "type": "agent_message", "text": SECRET}) + "\n"
    (outside / "dir").mkdir(parents=True)
    (outside / "file").write_text(secret)
    for name in ("memory.json", "turns.json", "summary.md"):
        (outside / "dir" / name).write_text(secret)
    (outside / "session").mkdir()
    (outside / "session" / "events.jsonl").write_text(secret)
    (outside / "session" / "manifest.json").write_text(json.dumps({"session_id": SECRET}))
    msg = event("item.completed", item={"id": "m", "type": "agent_message", "text": "the retry loop works"})
    with mounted(store, tmp_path / "setup") as m:
        for name in PLANTED:
            if PLANTED[name] is not None:
                os.mkdir(m.mnt / "sessions" / name)
                with open(m.mnt / "sessions" / name / "events.jsonl", "a") as f:
                    f.write(f"{TURN}\n{msg}\n")
                (m.mnt / "sessions" / name / "derived" / "memory.json").read_bytes()
    for name, rel in PLANTED.items():
        if rel is None:
            os.symlink(outside / "session", store / name)
            continue
        path = store / name / rel
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
        os.symlink(outside / ("dir" if rel in ("index", "derived") else "file"), path)
    return store, outside


def read(path) -> str | int:
    """The text a reader gets, or its errno."""
    try:
        return path.read_text()
    except OSError as exc:
        return exc.errno


def test_planted_symlinks_are_never_followed_and_are_reported(tmp_path, planted):
    store, outside = planted
    before = snapshot(outside)
    with mounted(store, tmp_path / "mnt") as m:
        sessions = m.mnt / "sessions"
        assert sorted(os.listdir(sessions)) == sorted(n for n in PLANTED if n != "linkdir")
        shown = {name: {rel: read(sessions / name / rel) for rel in READS} for name in PLANTED}
        shown["/"] = {"search": read(m.mnt / "search" / SECRET), "retry": read(m.mnt / "search" / "retry")}
        leaked = [(name, rel) for name, got in shown.items() for rel, text in got.items() if SECRET in str(text)]
        assert leaked == []  # nothing of a link's target is ever shown

        # a symlinked session directory does not exist, and its name is not free either
        assert set(shown["linkdir"].values()) == {errno.ENOENT}
        assert errno_of(lambda: os.mkdir(sessions / "linkdir")) == errno.EEXIST
        assert errno_of(lambda: os.rmdir(sessions / "linkdir")) == errno.ENOENT
        # a session with a planted file cannot be opened: every access says ELOOP
        for name in BROKEN:
            got = dict(shown[name])
            if name != "rejected":  # a real (empty) file, read without opening the session
                assert got.pop("rejected.jsonl") == ""
            assert set(got.values()) == {errno.ELOOP}, (name, got)
            assert errno_of(lambda name=name: open(sessions / name / "events.jsonl", "a")) == errno.ELOOP
            assert errno_of(lambda name=name: os.getxattr(sessions / name, "user.memfs.status")) == errno.ELOOP
            assert errno_of(lambda name=name: os.rmdir(sessions / name)) != 0
            assert f"refusing symlink inside the store: {store / name / PLANTED[name]}" in m.log_text()
        # a planted lock or rejected.jsonl: that file costs the session its writes, not its reads
        for name in UNWRITABLE:
            got = dict(shown[name])
            assert got.pop("rejected.jsonl") == (errno.ELOOP if name == "rejected" else "")
            assert "the retry loop works" in got.pop("derived/memory.json")
            assert {k: v for k, v in got.items() if isinstance(v, int)} == {}, (name, got)
            log_before = (store / name / "events.jsonl").read_bytes()

            def append(name=name):
                with open(sessions / name / "events.jsonl", "a") as f:
                    f.write('{"type":"turn.started"}\n')
            assert errno_of(append) == errno.ELOOP
            assert (store / name / "events.jsonl").read_bytes() == log_before
        # a planted derived/: views are served from the log, and their copies never written
        assert json.loads(shown["derived"]["derived/memory.json"])["grounded_facts"][0]["fact"] == \
            "the retry loop works"
        # the store-wide search still answers, from the sessions that can be opened
        hits = [json.loads(line)["session_id"] for line in shown["/"]["retry"].splitlines()]
        assert sorted(hits) == ["derived", "lock", "rejected"]
        assert "search: session manifest left out" in m.log_text()
    assert "session derived: derived view memory.json not copied" in m.log_text()
    assert snapshot(outside) == before  # no target was written, replaced or removed
    for name, rel in PLANTED.items():
        assert os.path.islink(store / name if rel is None else store / name / rel), name
