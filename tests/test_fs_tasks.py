"""pyfuse3's pool of request tasks, bounded through its public ``main(min_tasks, max_tasks)``
(memfs/fs/mount.py): with several agents appending and a reader, every line lands once, in each
writer's order; more concurrent ``fsync``-mode writers than the pool has tasks are all answered
(the others' requests wait in the kernel, nothing waits forever); and the server still ends, by
signal or by ``fusermount -u``, with its tasks waiting for requests. (The server's memory under
a stream of large writes with readers: ``tests/test_reliability_hardening.py``.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest
from memfs.fs.mount import MAX_TASKS

from mounting import is_mounted, mounted, needs_fuse

pytestmark = needs_fuse

WRITER = r"""
import json, os, sys
path, me, turns = sys.argv[1], sys.argv[2], int(sys.argv[3])

def event(etype, **fields):
    return json.dumps({"schema_version": "0.18.0", "event": {"type": etype, **fields}}, separators=(",", ":"))

fd = os.open(path, os.O_WRONLY | os.O_APPEND)
for k in range(turns):
    item = {"id": f"{me}-{k}", "type": "agent_message", "text": f"{me} {k}"}
    for line in [event("turn.started"), event("item.completed", item=item), event("turn.completed", usage={})]:
        data = (line + "\n").encode()
        assert os.write(fd, data) == len(data)  # one write() per line, as agents append
os.close(fd)
"""


@contextmanager
def writers(sessions, names, turns: int):
    """One writer process per session in ``names``, each appending ``turns`` turns; any still
    running when the block ends is killed (by pid) and reaped."""
    for name in names:
        os.mkdir(sessions / name)
    procs = []
    try:
        for name in names:
            procs.append(subprocess.Popen([sys.executable, "-c", WRITER, str(sessions / name / "events.jsonl"),
                                           name, str(turns)]))
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(10)


def items_in_store(store, name: str) -> list[str]:
    stored = [json.loads(line) for line in (store / name / "events.jsonl").read_text().splitlines()]
    return [e["event"]["item"]["id"] for e in stored if e["event"]["type"] == "item.completed"]


def test_concurrent_writers_with_a_reader_land_every_line_once_in_order(tmp_path):
    turns = 300
    with mounted(tmp_path / "store", tmp_path / "mnt") as m:
        sessions = m.mnt / "sessions"
        names = [f"w{k}" for k in range(4)]
        with writers(sessions, names, turns) as procs:
            deadline = time.monotonic() + 120
            while any(p.poll() is None for p in procs):  # an idle reader meanwhile, as a person would
                assert time.monotonic() < deadline, "a writer still running after 120 s"
                os.listdir(sessions)
            assert [p.wait(60) for p in procs] == [0] * 4
        for name in names:
            assert int(os.getxattr(sessions / name, "user.memfs.turn_count")) == turns
    for name in names:  # the store holds each writer's lines once, in its order
        assert items_in_store(tmp_path / "store", name) == [f"{name}-{k}" for k in range(turns)]


def test_more_fsync_writers_than_the_pool_has_tasks_are_all_answered(tmp_path):
    # each fsync-mode write holds a task until its sync: with more writers than tasks, requests
    # wait in the kernel until a task comes back, and every write is still answered
    count, turns = MAX_TASKS + 16, 10
    with mounted(tmp_path / "store", tmp_path / "mnt", "--durability", "fsync") as m:
        names = [f"w{k}" for k in range(count)]
        with writers(m.mnt / "sessions", names, turns) as procs:
            assert [p.wait(180) for p in procs] == [0] * count
        for name in names:
            assert int(os.getxattr(m.mnt / "sessions" / name, "user.memfs.event_count")) == 3 * turns
    for name in names:  # acknowledged: in the store, in order
        assert items_in_store(tmp_path / "store", name) == [f"{name}-{k}" for k in range(turns)]


@pytest.mark.parametrize("how", ["SIGTERM", "fusermount -u"])
def test_the_server_ends_after_fsync_writers_with_its_tasks_idle(tmp_path, how):
    # 16 fsync-mode writers: up to 16 requests wait for their syncs at once, while the others'
    # are read. Then both ways of ending end every task (16 idle ones at least).
    with mounted(tmp_path / "store", tmp_path / "mnt", "--durability", "fsync") as m:
        with writers(m.mnt / "sessions", [f"w{k}" for k in range(16)], 20) as procs:
            assert [p.wait(120) for p in procs] == [0] * 16
        if how == "SIGTERM":
            m.proc.send_signal(signal.SIGTERM)
        else:
            subprocess.run(["fusermount3", "-u", str(m.mnt)], check=True)
        assert m.proc.wait(20) == 0, m.log_text()
        assert not is_mounted(m.mnt)
    for k in range(16):  # what was acknowledged is in the store
        assert len((tmp_path / "store" / f"w{k}" / "events.jsonl").read_text().splitlines()) == 60


def test_fsync_writers_through_cap_rewrites_are_all_answered_and_counted(tmp_path):
    # 8 fsync writers drive 8 sessions through rewrites (a write that passes the cap runs on a
    # worker thread, the others commit on the loop and wait for the syncer): every write is
    # answered, and each session holds its turns in order, the cap kept.
    cap, turns = 12, 40
    with mounted(tmp_path / "store", tmp_path / "mnt", "--durability", "fsync", "--max-events", str(cap)) as m:
        names = [f"w{k}" for k in range(8)]
        with writers(m.mnt / "sessions", names, turns) as procs:
            assert [p.wait(120) for p in procs] == [0] * 8
        for name in names:
            manifest = json.loads((m.mnt / "sessions" / name / "manifest.json").read_bytes())
            assert manifest["turn_count"] == turns and manifest["event_count"] <= cap
            assert manifest["retained_turn_base"] > 1  # rewrites happened
    for name in names:
        items = items_in_store(tmp_path / "store", name)
        assert items == [f"{name}-{k}" for k in range(turns - len(items), turns)]  # the last turns, in order
