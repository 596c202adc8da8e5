"""Sessions shared by many processes (SPEC §3.5, §3.6), for real: a store-wide mount serving a
store while the CLI, a sandboxed ``--session`` mount, a second store-wide mount and ``memfs
gc`` use the same store. Reading never locks; a writer holds a session's lock only while it
writes (and ``idle_release`` seconds after); a refused writer is told who holds it.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mounting import is_mounted, mounted, needs_fuse, start
from store_helpers import wait_until
from test_reliability_sandbox import check_confined, sandbox

pytestmark = needs_fuse

IDLE = "1"  # idle_release for these mounts, in seconds


def memfs_cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memfs", *args], input=stdin, capture_output=True, timeout=60)


def line(text: str) -> bytes:
    return json.dumps({"type": "item.completed", "item": {"id": text, "type": "agent_message",
                                                           "text": text}}).encode() + b"\n"



def touch_everything(mnt: Path, name: str) -> None:
    """What a user and the warm-up do to a session without writing it."""
    session = mnt / "sessions" / name
    os.stat(session / "events.jsonl")
    subprocess.run(["ls", "-l", str(session)], check=True, capture_output=True)
    os.listxattr(session)
    os.getxattr(session, "user.memfs.event_count")
    (session / "manifest.json").read_bytes()
    (session / "derived" / "memory.json").read_bytes()
    (mnt / "search" / "retry").read_bytes()


def make_store(store: Path, names: list[str]) -> None:
    """Sessions written by the CLI (no mount), one line each."""
    for name in names:
        res = memfs_cli("append", "--store", str(store), name, "-", stdin=line(f"retry loop of {name}"))
        assert res.returncode == 0, res.stderr


def live(store: Path, name: str) -> bool:
    import memfs

    return memfs.is_live(store / name)


def test_a_store_wide_mount_locks_nothing_it_only_reads(tmp_path):
    store = tmp_path / "store"
    make_store(store, ["a", "b", "c"])
    with mounted(store, tmp_path / "mnt", "-o", f"idle_release={IDLE}") as m:
        for name in ("a", "b", "c"):
            touch_everything(m.mnt, name)
        assert not any(live(store, n) for n in ("a", "b", "c"))  # the warm-up and every read: no lock
        # (a) the CLI appends to a session the mount serves, and the mount sees it at once
        res = memfs_cli("append", "--store", str(store), "a", "-", stdin=line("from the cli"))
        assert res.returncode == 0, res.stderr
        assert json.loads((m.mnt / "sessions" / "a" / "manifest.json").read_bytes())["event_count"] == 2
        assert b"from the cli" in (m.mnt / "sessions" / "a" / "events.jsonl").read_bytes()
        facts = json.loads((m.mnt / "sessions" / "a" / "derived" / "memory.json").read_bytes())["grounded_facts"]
        assert [f["fact"] for f in facts] == ["retry loop of a", "from the cli"]
        hits = [json.loads(r)["snippet"] for r in (m.mnt / "search" / "from the cli").read_text().splitlines()]
        assert hits[0] == "from the cli"  # search follows another process's appends too
        # (d) gc sees the idle sessions as not live while the mount serves them
        gc = memfs_cli("gc", "--store", str(store), "--dry-run", "--json", "--max-sessions", "0",
                       "--max-age-days", "0")
        assert gc.returncode == 0, gc.stderr
        report = json.loads(gc.stdout)
        assert "live" not in json.dumps(report["kept"])
    assert m.proc.returncode == 0


def test_a_writer_holds_the_lock_only_while_writing_and_a_refused_writer_is_told_who(tmp_path):
    store = tmp_path / "store"
    make_store(store, ["a"])
    with mounted(store, tmp_path / "mnt", "-o", f"idle_release={IDLE}") as m:
        events = m.mnt / "sessions" / "a" / "events.jsonl"
        with open(events, "ab") as f:
            f.write(line("from the mount"))
            f.flush()
            assert live(store, "a")  # the mount is a's writer now, while the file is open...
            res = memfs_cli("append", "--store", str(store), "a", "-", stdin=line("refused"))
            assert res.returncode == 1
            assert res.stderr.decode().strip() == f"memfs: session a is being written by process {m.proc.pid}"
        # ...and for idle_release seconds after its last change; then anyone may write
        wait_until(lambda: not live(store, "a"), "the mount releases a's lock once idle")
        res = memfs_cli("append", "--store", str(store), "a", "-", stdin=line("after the release"))
        assert res.returncode == 0, res.stderr
        # the mount takes over again: its counts go on from what the CLI wrote
        with open(events, "ab") as f:
            f.write(line("the mount again"))
        manifest = json.loads((m.mnt / "sessions" / "a" / "manifest.json").read_bytes())
        assert manifest["event_count"] == 4
        lines = events.read_bytes().splitlines()
        assert [json.loads(x)["event"]["item"]["text"] for x in lines] == [
            "retry loop of a", "from the mount", "after the release", "the mount again"]
    on_disk = json.loads((store / "a" / "manifest.json").read_bytes())
    assert on_disk["event_count"] == 4 and on_disk["persisted_file_len"] == (store / "a" / "events.jsonl").stat().st_size


def test_a_mount_refused_by_another_writer_says_ebusy_and_names_it(tmp_path):
    store = tmp_path / "store"
    make_store(store, ["a"])
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, memfs\n"
         "h = memfs.open_session(sys.argv[1], 'a', durability='write')\n"
         "h.lock(); print('held', flush=True); sys.stdin.readline(); h.close()", str(store)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with mounted(store, tmp_path / "mnt") as m:
            session = m.mnt / "sessions" / "a"
            assert b"retry loop of a" in (session / "events.jsonl").read_bytes()  # reading works
            fd = os.open(session / "events.jsonl", os.O_WRONLY | os.O_APPEND)
            try:
                with pytest.raises(OSError) as err:
                    os.write(fd, line("refused"))
                assert err.value.errno == errno.EBUSY
            finally:
                os.close(fd)
            reason = os.getxattr(session, "user.memfs.last_error").decode()
            assert reason == f"session a is being written by process {holder.pid}"
            assert f"session a is being written by process {holder.pid}" in m.log_text()
    finally:
        holder.communicate("\n", timeout=30)
    assert holder.returncode == 0


def test_a_sandboxed_session_mount_works_beside_a_store_wide_mount(tmp_path):
    store = tmp_path / "store"
    make_store(store, ["b"])
    res = memfs_cli("append", "--store", str(store), "a", "-", stdin=b"")  # an empty session a
    assert res.returncode == 0, res.stderr
    with mounted(store, tmp_path / "wide", "-o", f"idle_release={IDLE}") as wide:
        touch_everything(wide.mnt, "a")
        touch_everything(wide.mnt, "b")
        # (b) the README's sandbox recipe, while scripts/run.sh's kind of mount serves the store
        with mounted(store, tmp_path / "one", "--session", "a") as one:
            report = sandbox(one.mnt, store)
        assert report["append"] == ["ok", "ok", "ok", "ok", "EBADMSG"]
        assert len(report["events"]) == 4
        check_confined(report, store)
        # the store-wide mount sees what the sandbox wrote
        manifest = json.loads((wide.mnt / "sessions" / "a" / "manifest.json").read_bytes())
        assert manifest["event_count"] == 4 and manifest["turn_count"] == 1
        assert [json.loads(x)["event"]["type"] for x in
                (wide.mnt / "sessions" / "a" / "events.jsonl").read_bytes().splitlines()] == \
            ["thread.started", "turn.started", "item.completed", "turn.completed"]


def test_two_store_wide_mounts_read_everything_and_write_in_turn(tmp_path):
    store = tmp_path / "store"
    make_store(store, ["a", "b"])
    with mounted(store, tmp_path / "m1", "-o", f"idle_release={IDLE}") as m1, \
            mounted(store, tmp_path / "m2", "-o", f"idle_release={IDLE}") as m2:
        # (c) the second mount reads everything the first one touched
        for m in (m1, m2):
            for name in ("a", "b"):
                touch_everything(m.mnt, name)
        with open(m1.mnt / "sessions" / "a" / "events.jsonl", "ab") as f:  # m1 writes a...
            f.write(line("m1 writes a"))
        with open(m2.mnt / "sessions" / "b" / "events.jsonl", "ab") as f:  # ...m2 writes b meanwhile
            f.write(line("m2 writes b"))
        assert b"m1 writes a" in (m2.mnt / "sessions" / "a" / "events.jsonl").read_bytes()
        assert b"m2 writes b" in (m1.mnt / "sessions" / "b" / "events.jsonl").read_bytes()
        os.mkdir(m2.mnt / "sessions" / "c")  # created by one, served by both
        wait_until(lambda: (m1.mnt / "sessions" / "c").is_dir(), "m1 lists the session m2 created")
        # a is m1's until it is idle; then m2 may write it
        wait_until(lambda: not live(store, "a"), "m1 releases a once idle")
        with open(m2.mnt / "sessions" / "a" / "events.jsonl", "ab") as f:
            f.write(line("m2 writes a"))
        texts = [json.loads(x)["event"]["item"]["text"] for x in
                 (m1.mnt / "sessions" / "a" / "events.jsonl").read_bytes().splitlines()]
        assert texts == ["retry loop of a", "m1 writes a", "m2 writes a"]
        assert json.loads((m1.mnt / "sessions" / "a" / "manifest.json").read_bytes())["event_count"] == 3


def test_umount_returns_once_the_server_has_exited(tmp_path):
    store = tmp_path / "store"
    make_store(store, ["a"])
    m = start(store, tmp_path / "mnt", "-o", "idle_release=60")
    try:
        with open(m.mnt / "sessions" / "a" / "events.jsonl", "ab") as f:
            f.write(line("held until unmount"))
        assert live(store, "a")
        res = memfs_cli("umount", str(m.mnt))
        assert res.returncode == 0, res.stderr
        # no wait: the server is gone and its lock with it when umount returns
        assert m.proc.poll() is not None and not is_mounted(m.mnt)
        assert not live(store, "a")
        res = memfs_cli("append", "--store", str(store), "a", "-", stdin=line("right after"))
        assert res.returncode == 0, res.stderr
    finally:
        if m.proc.poll() is None:
            m.stop()
        if is_mounted(m.mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(m.mnt)], check=False)
    assert m.proc.returncode == 0
