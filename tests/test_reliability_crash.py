"""kill -9 of the mount process during continuous appends from several writers (issue 7).

Four writer processes append distinct numbered lines through one mount, one ``write()`` per
line, and record each line whose ``write()`` returned success. The server is killed with
SIGKILL while they run. Then: ``auto_unmount`` must have removed the dead mount, a remount
must work, every acknowledged line must be in ``events.jsonl`` exactly once and in its
writer's order, no line may be torn or merged, and the metadata on disk must agree with a
fresh rescan. In ``write`` mode a successful ``write()`` means the bytes reached the OS page
cache, which survives the death of the process; ``fsync`` mode makes them durable as well.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from mounting import cleanup, is_mounted, needs_fuse, start
from test_reliability_helpers import acked, assert_consistent, line_id, start_writer, wait_unmounted

pytestmark = needs_fuse

WRITERS = 4
LINES_BEFORE_KILL = 150  # per writer: the kill comes mid-stream, after this much progress


def wait_for_progress(acks, least: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while min(len(acked(a)) for a in acks) < least:
        assert time.monotonic() < deadline, "writers made no progress"
        time.sleep(0.02)

def stop_all(m, writers) -> None:
    """Whatever happened: no writer left running, nothing left mounted."""
    for w in writers:
        if w.poll() is None:
            w.kill()
            w.wait(5)
    cleanup(m)



def kill_server(m, writers) -> None:
    """kill -9 the server mid-stream; every writer stops at its first failed write (the
    connection is gone) and exits cleanly; auto_unmount's helper removes the dead mount."""
    m.proc.send_signal(signal.SIGKILL)
    m.proc.wait(10)
    for w in writers:
        w.wait(30)
    assert all(w.returncode == 0 for w in writers), [w.stderr.read() for w in writers]
    cleaned = wait_unmounted(m.mnt, 10)
    if not cleaned:
        subprocess.run(["fusermount3", "-u", "-z", str(m.mnt)], check=False)
    assert cleaned, "the dead mount was not cleaned up by auto_unmount"



@pytest.mark.parametrize("durability", ["write", "fsync"])
def test_kill_9_mid_stream_keeps_every_acknowledged_line_once(tmp_path, durability):
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    acks = [tmp_path / f"w{i}.acks" for i in range(WRITERS)]
    m = start(store, mnt, "--durability", durability)
    writers = []
    try:
        session = m.mnt / "sessions" / "s1"
        os.mkdir(session)
        writers = [start_writer(session / "events.jsonl", f"w{i}", acks[i], per_turn=5) for i in range(WRITERS)]
        wait_for_progress(acks, LINES_BEFORE_KILL)
        kill_server(m, writers)
    finally:
        stop_all(m, writers)

    wrote = {f"w{i}": acked(acks[i]) for i in range(WRITERS)}
    assert all(len(v) >= LINES_BEFORE_KILL for v in wrote.values())

    m = start(store, mnt, "--durability", durability)  # the remount works
    try:
        session = m.mnt / "sessions" / "s1"
        served = (session / "events.jsonl").read_bytes()  # read without repairing anything
        live_manifest = json.loads((session / "manifest.json").read_bytes())
        closing = b'{"schema_version":"0.18.0","event":{"type":"turn.completed","usage":{}}}\n'
        with open(session / "events.jsonl", "ab") as f:  # the next writer repairs and goes on
            f.write(closing)
    finally:
        cleanup(m)  # SIGTERM: a clean unmount that persists the metadata
    assert not is_mounted(mnt)

    lines = assert_consistent(store / "s1")  # metadata on disk agrees with a fresh rescan
    assert lines[-1] + b"\n" == closing
    lines = lines[:-1]
    assert served == b"".join(line + b"\n" for line in lines)
    assert live_manifest["event_count"] == len(lines)
    found: dict[str, list[int]] = {name: [] for name in wrote}
    for line in lines:  # every line is one whole line of one writer: nothing torn or merged
        name, n = line_id(line)
        found[name].append(n)
    for name, numbers in found.items():
        # in order, each once; at most the one write in flight at the kill beyond the acks
        assert numbers == list(range(len(numbers))), name
        assert len(wrote[name]) <= len(numbers) <= len(wrote[name]) + 1, name
    rejected = store / "s1" / "rejected.jsonl"
    if rejected.exists():  # only a torn in-flight line may have been cut at the reopen
        for record in map(json.loads, rejected.read_text().splitlines()):
            assert record["reason"].startswith("torn-tail"), record


SESSIONS = 4


def test_kill_9_fsync_writers_in_several_sessions_keep_every_acknowledged_line(tmp_path):
    """``fsync`` mode, one writer per session in four sessions of one mount (their syncs run
    concurrently on worker threads, issue 14): after kill -9 of the server every acknowledged
    line of every session is in its log, once and in order, and nothing is torn."""
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    acks = [tmp_path / f"w{i}.acks" for i in range(SESSIONS)]
    m = start(store, mnt, "--durability", "fsync")
    writers = []
    try:
        for i in range(SESSIONS):
            os.mkdir(m.mnt / "sessions" / f"s{i}")
        writers = [start_writer(m.mnt / "sessions" / f"s{i}" / "events.jsonl", f"w{i}", acks[i], per_turn=5)
                   for i in range(SESSIONS)]
        wait_for_progress(acks, 60)
        kill_server(m, writers)
    finally:
        stop_all(m, writers)

    m = start(store, mnt, "--durability", "fsync")
    try:
        served = {i: (m.mnt / "sessions" / f"s{i}" / "events.jsonl").read_bytes() for i in range(SESSIONS)}
    finally:
        cleanup(m)
    for i in range(SESSIONS):
        wrote = acked(acks[i])
        assert len(wrote) >= 60
        data = (store / f"s{i}" / "events.jsonl").read_bytes()
        assert served[i] == data and data.endswith(b"\n")  # (the mount's read repairs nothing)
        lines = data.splitlines()
        numbers = [line_id(line)[1] for line in lines]
        assert all(line_id(line)[0] == f"w{i}" for line in lines)
        assert numbers == list(range(len(numbers)))  # each once, in order, nothing torn
        assert len(wrote) <= len(numbers) <= len(wrote) + 1  # every acknowledged line is there


KILLS = 5


def test_kill_9_on_a_busy_machine_leaves_no_dead_mount(tmp_path):
    """``auto_unmount`` removes the dead mount after kill -9 also while another process keeps
    a CPU busy. The server's files are released last-closed-first at its death, and the FUSE
    connection must end before libfuse's socket to the ``fusermount3`` helper closes (see
    ``memfs.fs.mount._last_close``); before that, 5 of 10 such kills with the Python twin left
    the mount behind, answering ``ENOTCONN``."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        for k in range(KILLS):
            acks = tmp_path / f"w{k}.acks"
            m = start(tmp_path / f"store{k}", tmp_path / f"mnt{k}", "--durability", "fsync")
            writers = []
            try:
                os.mkdir(m.mnt / "sessions" / "s1")
                writers = [start_writer(m.mnt / "sessions" / "s1" / "events.jsonl", "w", acks, per_turn=5)]
                wait_for_progress([acks], 20)
                kill_server(m, writers)  # (asserts that the mount went)
            finally:
                stop_all(m, writers)
    finally:
        busy.kill()
        busy.wait()
