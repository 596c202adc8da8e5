"""The session log through the library API (SPEC §1, §3.2, §3.4–§3.6, §3.8): appending and
reading back, buffering and metadata persistence, several handles and processes, liveness,
permissions, symlinks and rejected lines."""

from __future__ import annotations

import errno
import inspect
import os
import pathlib
import stat
import subprocess
import textwrap
import threading
import time
from pathlib import Path

import memfs
import orjson
import pytest
from memfs.errors import (
    LineTooLong,
    ReadOnlySession,
    SessionBusy,
    SessionClosed,
    SymlinkRefused,
    TurnNotFound,
    ValidationError,
)
from memfs.events import SCHEMA_VERSION
from memfs.store import paths
from memfs.store.appender import LineAppender

from refcounts import bytes_kept
from store_helpers import (
    DONE,
    FAILED,
    START,
    THREAD_DONE,
    THREAD_START,
    disk_index,
    disk_manifest,
    env,
    join_all,
    log_lines,
    msg,
    open_s,
    run_python,
    turn,
    wait_until,
)


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_round_trip_over_several_turns(tmp_path):
    turns = [turn("one", 1), turn("two", 3, end=FAILED), turn("three", 0)]
    lines = [THREAD_START, *turns[0], msg("between turns"), *turns[1], *turns[2], THREAD_DONE]
    with open_s(tmp_path, "sess-1") as h:
        for line in lines:
            assert h.append(line) is None
        assert h.manifest["turn_count"] == 3
        assert h.manifest["event_count"] == len(lines)
        assert h.manifest["status"] == "completed"
        assert h.manifest["in_turn"] is False
        assert h.manifest["session_id"] == "sess-1"
        for n, expected in enumerate(turns, start=1):
            assert h.reconstruct_turn(n) == [orjson.loads(line)["event"] for line in expected]
            start, end, outcome = h.turn_range(n)
            assert h.read_bytes(start, end - start) == b"".join(line + b"\n" for line in expected)
            assert outcome == ("failed" if n == 2 else "completed")
        live = h.turn_index
    assert log_lines(tmp_path / "sess-1") == lines
    assert [e["turn_number"] for e in live] == [1, 2, 3]
    assert [e["event_count"] for e in live] == [3, 5, 2]
    with open_s(tmp_path, "sess-1") as h:
        assert h.open_report.fast_path
        assert h.turn_index == live
        assert h.reconstruct_turn(2) == [orjson.loads(line)["event"] for line in turns[1]]


def test_append_takes_bytes_text_and_dicts(tmp_path):
    with open_s(tmp_path) as h:
        h.append(START + b"\n")
        h.append('{"type":"item.completed","item":{"id":"x","type":"agent_message","text":"é"}}\r\n')
        h.append({"type": "turn.completed", "usage": {}})
        assert h.reconstruct_turn(1)[1]["item"]["text"] == "é"
    stored = log_lines(tmp_path / "s")
    assert stored[0] == START
    assert stored[1] == (b'{"schema_version":"' + SCHEMA_VERSION.encode() + b'","event":'
                         + '{"type":"item.completed","item":{"id":"x","type":"agent_message","text":"é"}}'.encode() + b"}")


def test_buffered_mode_leaves_the_file_empty_until_a_turn_boundary(tmp_path):
    events = tmp_path / "s" / "events.jsonl"
    with open_s(tmp_path, durability="buffered") as h:
        h.append(START)
        h.append(msg("a"))
        assert events.stat().st_size == 0
        assert h.file_len == len(START) + len(msg("a")) + 2  # the live length counts the buffer
        h.append(DONE)  # boundary
        assert events.stat().st_size == h.file_len
        h.append(START)
        assert events.stat().st_size == h.file_len - len(START) - 1
        h.append(THREAD_DONE)  # thread.completed is a boundary too
        assert events.stat().st_size == h.file_len
        h.append(msg("outside"))
        assert events.stat().st_size < h.file_len
        assert h.read_bytes().endswith(msg("outside") + b"\n")  # a read writes the buffer
        assert events.stat().st_size == h.file_len


def test_write_mode_writes_each_line_before_returning(tmp_path):
    events = tmp_path / "s" / "events.jsonl"
    with open_s(tmp_path, durability="write") as h:
        for i, line in enumerate([START, msg("a"), msg("b")], start=1):
            h.append(line)
            assert events.stat().st_size == h.file_len
            assert len(log_lines(tmp_path / "s")) == i


def test_64k_flush_persists_metadata_mid_turn(tmp_path):
    sdir = tmp_path / "s"
    events = sdir / "events.jsonl"
    with open_s(tmp_path, durability="buffered") as h:
        h.append(START)
        line = msg("x" * 1000)
        appended = 1
        while events.stat().st_size == 0:
            h.append(line)
            appended += 1
            assert appended < 100, "64 KiB of buffered lines never reached the file"
        size = events.stat().st_size
        assert size >= 64 * 1024
        assert size == h.file_len
        manifest = disk_manifest(sdir)
        assert manifest["persisted_file_len"] == size
        assert manifest["in_turn"] is True
        assert manifest["event_count"] == appended
        index = disk_index(sdir)
        assert index[-1]["outcome"] == "open"
        assert index[-1]["end_offset"] == size
        assert index[-1]["event_count"] == appended


def test_write_mode_has_no_64k_flush_and_persists_at_the_boundary(tmp_path):
    """Each line reaches the file on its own in write mode: a long turn is not persisted
    midway (only a 64 KiB *flush* of buffered mode is a persist point), its end is."""
    sdir = tmp_path / "s"
    with open_s(tmp_path, durability="write") as h:
        h.append(START)
        h.append(DONE)
        h.append(START)
        before = disk_manifest(sdir)
        for _ in range(100):
            h.append(msg("x" * 1000))
        assert h.file_len > before["persisted_file_len"] + 64 * 1024
        assert disk_manifest(sdir) == before  # nothing persisted mid-turn
        h.append(DONE)
        after = disk_manifest(sdir)
        assert after["persisted_file_len"] == h.file_len and after["turn_count"] == 2


def test_flush_mid_turn_then_reopen_keeps_the_open_turn(tmp_path):
    with open_s(tmp_path, durability="buffered") as h:
        h.append(DONE)  # no open turn: only counted
        h.append(START)
        h.append(msg("a"))
        h.flush()
        assert disk_manifest(tmp_path / "s")["in_turn"] is True
    with open_s(tmp_path) as h:
        assert h.open_report.fast_path
        assert h.manifest["in_turn"] is True
        assert h.turn_index[-1]["outcome"] == "open"
        h.append(msg("b"))
        h.append(DONE)
        assert h.manifest["turn_count"] == 1
        assert h.manifest["in_turn"] is False
        entry = h.turn_index[0]
        assert (entry["turn_number"], entry["event_count"], entry["outcome"]) == (1, 4, "completed")
        assert entry["start_offset"] == len(DONE) + 1
        assert entry["end_offset"] == h.file_len
        assert [e["type"] for e in h.reconstruct_turn(1)] == [
            "turn.started", "item.completed", "item.completed", "turn.completed"]


def test_flush_mid_turn_survives_a_killed_process(tmp_path):
    code = textwrap.dedent("""
        import os, sys, memfs
        from store_helpers import START, msg
        h = memfs.open_session(sys.argv[1], "s", durability="buffered", metadata_interval=0)
        h.append(START); h.append(msg("a")); h.flush()
        h.append(msg("lost: buffered, never flushed"))
        os._exit(0)
    """)
    res = run_python(code, str(tmp_path), env={**os.environ, "PYTHONPATH": os.path.dirname(__file__)})
    assert res.returncode == 0, res.stderr
    with open_s(tmp_path) as h:
        assert h.open_report.fast_path
        assert h.manifest["event_count"] == 2 and h.manifest["in_turn"] is True
        h.append(DONE)
        assert h.turn_index[0]["event_count"] == 3
        assert h.manifest["turn_count"] == 1


def test_metadata_follows_the_spec_order_at_boundaries(tmp_path):
    sdir = tmp_path / "s"
    with open_s(tmp_path, durability="write") as h:
        for line in turn("a"):
            h.append(line)
        manifest = disk_manifest(sdir)
        assert manifest["turn_count"] == 1
        assert manifest["persisted_file_len"] == (sdir / "events.jsonl").stat().st_size
        assert disk_index(sdir) == h.turn_index
        assert manifest == h.manifest
        assert set(manifest) >= {"session_id", "schema_version", "created_at", "updated_at", "turn_count",
                                 "event_count", "status", "in_turn", "persisted_file_len", "retained_turn_base"}
        assert manifest["schema_version"] == 1
        assert manifest["created_at"].endswith("+00:00") and manifest["updated_at"].endswith("+00:00")


def test_close_persists_metadata_even_mid_turn_in_write_mode(tmp_path):
    with open_s(tmp_path, durability="write", metadata_interval=3600) as h:
        h.append(START)
        h.append(msg("a"))
    manifest = disk_manifest(tmp_path / "s")
    assert manifest["event_count"] == 2 and manifest["in_turn"] is True
    with open_s(tmp_path) as h:
        assert h.open_report.fast_path


def test_metadata_coalescing_is_caught_up_by_flush_and_the_persister(tmp_path):
    sdir = tmp_path / "s"
    with open_s(tmp_path, durability="write", metadata_interval=3600) as h:
        for line in turn("a") + turn("b"):
            h.append(line)
        assert disk_manifest(sdir)["turn_count"] < 2  # coalesced: the spec's default is not this
        h.flush()
        assert disk_manifest(sdir)["turn_count"] == 2
    with open_s(tmp_path, durability="write", metadata_interval=0.001) as h:
        for line in turn("c"):
            h.append(line)
        deadline = time.monotonic() + 10  # the persister thread catches up without another call
        while disk_manifest(sdir)["turn_count"] != 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert disk_manifest(sdir)["turn_count"] == 3


def append_from_threads(h, threads: int, n: int) -> None:
    """``threads`` threads, started together, each appending ``n`` messages ``w<k> <i>``."""
    start = threading.Barrier(threads)

    def writer(k):
        start.wait()
        for i in range(n):
            h.append(msg(f"w{k} {i}"))

    join_all([threading.Thread(target=writer, args=(k,)) for k in range(threads)], "an appending thread hung")


def test_fsync_mode_and_group_commit_from_threads(tmp_path):
    with open_s(tmp_path, durability="fsync") as h:
        h.append(START)
        append_from_threads(h, 4, 20)
        h.append(DONE)
        assert h.manifest["event_count"] == 82
        assert h.turn_index[0]["event_count"] == 82
    lines = log_lines(tmp_path / "s")
    assert len(lines) == 82
    for k in range(4):  # each thread's lines in its order
        mine = [orjson.loads(line)["event"]["item"]["text"] for line in lines[1:-1]]
        mine = [t for t in mine if t.startswith(f"w{k} ")]
        assert mine == [f"w{k} {i}" for i in range(20)]


def test_group_commit_waits_for_the_appenders_a_sync_woke_and_a_lone_one_never_waits(tmp_path):
    with open_s(tmp_path, durability="fsync", max_events=0) as h:
        h.append(START)
        for i in range(30):  # one thread: every append its own sync, never a wait for itself
            h.append(msg(f"alone {i}"))
        alone = h.stats()
        assert alone["owed_waits"] == 0 and alone["syncs"] >= 31
        append_from_threads(h, 8, 30)
        after = h.stats()
        syncs = after["syncs"] - alone["syncs"]
        # 240 appends shared fewer syncs; the syncs waited for the appenders the one before covered
        assert 0 < syncs < 240
        assert after["owed_waits"] > 0 and after["owed_timeouts"] <= after["owed_waits"]
        assert h.manifest["event_count"] == 271
    assert len(log_lines(tmp_path / "s")) == 271


def test_appenders_that_stop_early_cost_the_others_a_bounded_wait_each(tmp_path):
    """Thread k appends 10·(k+1) lines: each thread that stops is owed by the sync that covered
    its last line, and the next sync waits for it only up to the bound, then runs without it
    (the last owed appender runs a sync itself; a wait that runs out is owed_timeouts)."""
    with open_s(tmp_path, durability="fsync", max_events=0) as h:
        h.append(START)
        start = threading.Barrier(4)

        def writer(k):
            start.wait()
            for i in range(10 * (k + 1)):
                h.append(msg(f"w{k} {i}"))

        join_all([threading.Thread(target=writer, args=(k,)) for k in range(4)],
                 "an appender hung waiting for one that had stopped")
        stats = h.stats()
        assert stats["owed_timeouts"] >= 1 and stats["owed_timeouts"] <= stats["owed_waits"]
        assert h.manifest["event_count"] == 101
    assert len(log_lines(tmp_path / "s")) == 101


def test_a_durability_wait_cut_short_by_an_exception_hands_on_its_part(tmp_path, monkeypatch):
    """The main thread waits for another thread's fdatasync (held here), three threads queue
    behind it, and a signal handler's exception ends the main thread's wait: its line stays
    committed, and the threads queued behind it, the held sync and later appends all go on
    (the sync's end wakes its waiters one by the other: one that left must not break the
    chain). The liveness lock is kept for the test's length: its release would wake them."""
    import signal

    class Interrupted(Exception):
        pass

    with open_s(tmp_path, durability="fsync", max_events=0, idle_release=3600) as h:
        h.append(START)
        held, running = threading.Event(), threading.Event()
        real = os.fdatasync

        def held_sync(fd):
            running.set()
            assert held.wait(30)
            real(fd)

        def committed():
            return h.manifest["event_count"]

        monkeypatch.setattr(os, "fdatasync", held_sync)
        first = threading.Thread(target=h.append, args=(msg("first"),))
        first.start()
        assert running.wait(30)  # its sync runs, held
        others = [threading.Thread(target=h.append, args=(msg(f"other {k}"),)) for k in range(3)]

        def queue_behind_main():
            wait_until(lambda: committed() == 3, "the main thread's line")
            for t in others:
                t.start()
            wait_until(lambda: committed() == 6, "the other threads' lines")
            os.kill(os.getpid(), signal.SIGALRM)

        def interrupt(signum, frame):
            raise Interrupted

        previous = signal.signal(signal.SIGALRM, interrupt)
        helper = threading.Thread(target=queue_behind_main)
        try:
            helper.start()
            with pytest.raises(Interrupted):
                h.append(msg("interrupted"))  # waits behind the held sync
        finally:
            helper.join(timeout=30)
            signal.signal(signal.SIGALRM, previous)
        monkeypatch.setattr(os, "fdatasync", real)
        held.set()
        join_all([first, *others], "a waiter was left behind", timeout=30)
        h.append(msg("after"))
        join_all([threading.Thread(target=h.append, args=(msg("after, from a thread"),))], "a later append hung")
        assert committed() == 8
    texts = [orjson.loads(line)["event"]["item"]["text"] for line in log_lines(tmp_path / "s")[1:]]
    assert sorted(texts) == sorted(["first", "other 0", "other 1", "other 2", "interrupted", "after",
                                    "after, from a thread"])


def test_append_many_shares_one_call(tmp_path):
    with open_s(tmp_path, durability="fsync") as h:
        assert h.append_many(turn("a", 5)) == 7
        with pytest.raises(ValidationError) as info:
            h.append_many([START, msg("ok"), b"not json", msg("never")])
        assert info.value.accepted == 2
        assert h.manifest["event_count"] == 9
    assert len(log_lines(tmp_path / "s")) == 9


def test_refused_lines_go_to_rejected_jsonl_only(tmp_path):
    sdir = tmp_path / "s"
    with open_s(tmp_path, max_line_bytes=200) as h:
        h.append(START)
        assert h.writes.last_refusal is None
        with pytest.raises(ValidationError, match='turn.failed: "message" must be a string'):
            h.append(env("turn.failed", message=3), pid=4242)
        assert h.writes.last_refusal == 'turn.failed: "message" must be a string'
        with pytest.raises(LineTooLong) as info:
            h.append(msg("y" * 300))
        assert info.value.errno_name == "EFBIG"
        with pytest.raises(ValidationError, match="not valid UTF-8"):
            h.append(b'{"type":"x","v":"\xff"}')
        assert h.manifest["event_count"] == 1
        assert h.turn_index[0]["event_count"] == 1
    assert log_lines(sdir) == [START]
    records = [orjson.loads(line) for line in (sdir / "rejected.jsonl").read_bytes().splitlines()]
    assert [r["errno"] for r in records] == ["EBADMSG", "EFBIG", "EBADMSG"]
    first = records[0]
    assert set(first) >= {"at", "reason", "errno", "bytes", "line", "pid"}
    assert first["reason"] == 'turn.failed: "message" must be a string'
    assert first["pid"] == 4242 and records[1]["pid"] == os.getpid()
    assert first["line"] == env("turn.failed", message=3).decode()
    assert first["bytes"] == len(env("turn.failed", message=3))
    assert records[2]["line"] == '{"type":"x","v":"\ufffd"}'  # lossy UTF-8


def test_validate_reject_and_append_records(tmp_path):
    with open_s(tmp_path) as h:
        records = [h.writes.validate(line) for line in turn("a")]
        with pytest.raises(ValidationError) as info:
            h.writes.validate(b"{}")
        assert not (tmp_path / "s" / "rejected.jsonl").exists()  # validation alone records nothing
        assert h.writes.last_refusal is None
        h.writes.reject(b"{}", info.value)
        assert h.writes.last_refusal == str(info.value)
        h.writes.append_records(records)
        assert h.manifest["turn_count"] == 1
    assert len((tmp_path / "s" / "rejected.jsonl").read_bytes().splitlines()) == 1


def test_reading_api(tmp_path):
    lines = [START, msg("a"), msg("b"), DONE]
    with open_s(tmp_path) as h:
        v0 = h.version
        h.append_many(lines)
        assert h.version != v0
        assert h.path == tmp_path / "s" and h.name == "s" and h.session_id == "s"
        data = h.read_bytes()
        assert data == b"".join(line + b"\n" for line in lines)
        assert h.read_bytes(len(lines[0]) + 1, len(lines[1])) == lines[1]
        assert h.read_bytes(10_000) == b""
        offsets = [0]
        for line in lines[:-1]:
            offsets.append(offsets[-1] + len(line) + 1)
        assert list(h.iter_lines()) == list(zip(offsets, lines))
        assert list(h.iter_lines(offsets[2])) == list(zip(offsets[2:], lines[2:]))
        assert list(h.iter_lines(0, offsets[2])) == list(zip(offsets[:2], lines[:2]))
        assert orjson.loads(h.reads.manifest_json()) == h.manifest
        assert orjson.loads(h.reads.turn_index_json()) == {"entries": h.turn_index}
        for n in (0, 2, -1):
            with pytest.raises(TurnNotFound):
                h.reconstruct_turn(n)
        with pytest.raises(TurnNotFound):
            h.turn_range(2)


def test_read_only_handles(tmp_path):
    with open_s(tmp_path) as h:
        h.append_many(turn("a"))
    ro = open_s(tmp_path, read_only=True)
    try:
        assert not memfs.is_live(tmp_path / "s")  # a read-only open takes no lock
        assert ro.read_only and ro.manifest["turn_count"] == 1
        assert len(ro.reconstruct_turn(1)) == 4
        with pytest.raises(ReadOnlySession):
            ro.append(START)
        with pytest.raises(ReadOnlySession):
            ro.flush()
        with open_s(tmp_path) as w:  # a writer may open alongside it
            w.append(START)
    finally:
        ro.close()
    with pytest.raises(FileNotFoundError):
        open_s(tmp_path, "missing", read_only=True)
    with pytest.raises(FileNotFoundError):
        open_s(tmp_path, "missing", create=False)


def test_closed_handle_refuses_use(tmp_path):
    h = open_s(tmp_path)
    h.close()
    h.close()  # idempotent
    with pytest.raises(SessionClosed):
        h.append(START)


def test_two_handles_in_one_process_share_one_state(tmp_path):
    sdir = tmp_path / "s"
    a = open_s(tmp_path)
    b = open_s(tmp_path, durability="fsync")
    a.append(START)
    b.append(msg("from b"))
    assert a.manifest["event_count"] == b.manifest["event_count"] == 2
    assert a.turn_index == b.turn_index
    ro = open_s(tmp_path, read_only=True)
    assert ro.manifest["event_count"] == 2  # shares the writable state of this process
    ro.close()
    a.close()
    assert memfs.is_live(sdir)  # b still holds it
    b.append(DONE)
    assert b.manifest["turn_count"] == 1
    b.close()
    assert not memfs.is_live(sdir)
    assert disk_manifest(sdir)["event_count"] == 3


HOLD = textwrap.dedent("""
    import sys, memfs
    h = memfs.open_session(sys.argv[1], "s", max_events=0, durability="write")
    h.append({"type": "turn.started"})  # the first change takes the lock
    print("ready", flush=True)
    sys.stdin.readline()
    h.append({"type": "turn.completed", "usage": {}})
    h.close()
""")

TRY_APPEND = textwrap.dedent("""
    import sys, memfs
    with memfs.open_session(sys.argv[1], "s", max_events=0) as h:  # never refused: opening is reading
        print("read", h.manifest["event_count"], flush=True)
        try:
            h.append({"type": "item.completed", "item": {"id": "x", "type": "agent_message", "text": "x"}})
            print("appended")
        except memfs.SessionBusy as exc:
            print("busy:", exc)
""")


def test_opening_takes_no_lock_the_first_append_does_and_close_releases_it(tmp_path):
    sdir = tmp_path / "s"
    with open_s(tmp_path, durability="write") as h:
        assert not memfs.is_live(sdir) and not h.stats()["writer"]
        assert h.manifest["event_count"] == 0  # reading locks nothing
        h.append(START)
        assert memfs.is_live(sdir) and h.stats()["writer"]
        holder = orjson.loads((sdir / "session.lock").read_bytes())
        assert holder["pid"] == os.getpid() and holder["host"]
        res = run_python(TRY_APPEND, str(tmp_path))
        assert res.stdout.splitlines()[0] == "read 1", res.stderr  # another process reads, unlocked
        assert res.stdout.splitlines()[1] == f"busy: session s is being written by process {os.getpid()}"
    assert not memfs.is_live(sdir)
    assert run_python(TRY_APPEND, str(tmp_path)).stdout.splitlines() == ["read 1", "appended"]
    assert log_lines(sdir)[0] == START and len(log_lines(sdir)) == 2


def test_a_writer_elsewhere_refuses_this_process_and_is_followed_when_it_leaves(tmp_path):
    import subprocess
    import sys

    open_s(tmp_path).close()
    reader = open_s(tmp_path)  # opened before the other writer starts: it must follow it
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        assert memfs.is_live(tmp_path / "s")
        with pytest.raises(SessionBusy, match=rf"being written by process {proc.pid}$"):
            reader.append(msg("refused"))
        assert reader.manifest["event_count"] == 1 and reader.manifest["in_turn"]  # followed, unlocked
        with open_s(tmp_path, read_only=True) as ro:  # never refused for the lock
            assert ro.manifest["event_count"] == 1
    finally:
        proc.communicate("\n", timeout=30)
    assert proc.returncode == 0
    assert not memfs.is_live(tmp_path / "s")
    # the takeover continues from what the other process wrote, not from this one's old state
    reader.append(START)
    reader.append(DONE)
    assert reader.manifest["event_count"] == 4 and reader.manifest["turn_count"] == 2
    reader.close()
    assert disk_manifest(tmp_path / "s")["turn_count"] == 2 and len(disk_index(tmp_path / "s")) == 2
    with open_s(tmp_path) as again:
        assert again.open_report.fast_path


def test_liveness_probe(tmp_path):
    sdir = tmp_path / "s"
    assert not memfs.is_live(sdir)  # no lock file
    h = open_s(tmp_path)
    assert not memfs.is_live(sdir)  # opening is reading
    h.append(START)  # the first change takes the lock
    assert memfs.is_live(sdir)
    assert memfs.is_live(sdir)  # a probe does not steal the lock
    h.close()
    assert (sdir / "session.lock").exists()
    assert not memfs.is_live(sdir)
    os.chmod(sdir / "session.lock", 0)
    if os.geteuid() != 0:
        assert memfs.is_live(sdir)  # cannot open: fail safe


def test_permissions_are_private_and_reasserted(tmp_path):
    root = tmp_path / "root"
    sdir = root / "s"
    with open_s(root) as h:
        h.append_many(turn("a"))
        with pytest.raises(ValidationError):
            h.append(b"nope")
    for d in (root, sdir, sdir / "index"):
        assert mode(d) == 0o700, d
    for f in ("events.jsonl", "manifest.json", "session.lock", "rejected.jsonl", "index/turns.json"):
        assert mode(sdir / f) == 0o600, f
    os.chmod(sdir, 0o755)
    os.chmod(sdir / "index", 0o755)
    for f in ("events.jsonl", "manifest.json", "rejected.jsonl", "index/turns.json", "session.lock"):
        os.chmod(sdir / f, 0o644)
    with open_s(root) as h:
        h.lock()  # becoming the writer re-asserts them
        assert h.open_report.fast_path
    for d in (sdir, sdir / "index"):
        assert mode(d) == 0o700, d
    for f in ("events.jsonl", "manifest.json", "rejected.jsonl", "index/turns.json", "session.lock"):
        assert mode(sdir / f) == 0o600, f
    assert not [p for p in sdir.rglob("*.tmp")]  # no temp files left by atomic replaces


def test_symlinked_session_dir_is_refused(tmp_path):
    real = tmp_path / "elsewhere"
    real.mkdir()
    root = tmp_path / "root"
    root.mkdir()
    os.symlink(real, root / "s")
    for kw in ({}, {"read_only": True}, {"create": False}):
        with pytest.raises(SymlinkRefused):
            open_s(root, **kw)
    assert list(real.iterdir()) == []


@pytest.mark.parametrize("name", ["manifest.json", "index/turns.json", "events.jsonl", "rejected.jsonl",
                                  "session.lock", "index/pending-cap-rewrite.json"])
def test_symlinked_file_in_the_session_is_refused(tmp_path, name):
    with open_s(tmp_path) as h:
        h.append_many(turn("a"))
    target = tmp_path / "target"
    target.write_bytes(b"precious")
    path = tmp_path / "s" / name
    if path.exists():
        path.unlink()
    os.symlink(target, path)
    with pytest.raises(SymlinkRefused):  # by the open (what it reads) or the first change
        with open_s(tmp_path) as h:
            h.append(START)
    assert target.read_bytes() == b"precious"
    assert os.path.islink(path)


def test_session_ids_are_sanitized_and_kept_raw_in_the_manifest(tmp_path):
    assert memfs.sanitize("a b/c:é.x-y_z") == "a_b_c__.x-y_z"
    assert memfs.sanitize("..hidden") == "hidden"
    assert memfs.sanitize("...") == "session"
    assert memfs.sanitize("") == "session"
    assert memfs.sanitize("😀") == "_"
    with open_s(tmp_path, "../escape attempt") as h:
        h.append(START)
        assert h.name == "_escape_attempt"
        assert h.path == tmp_path / "_escape_attempt"
        assert h.session_id == "../escape attempt"
    assert disk_manifest(tmp_path / "_escape_attempt")["session_id"] == "../escape attempt"
    assert not (tmp_path.parent / "escape attempt").exists()


@pytest.fixture
def full_disk(tmp_path):
    """A 1 MiB tmpfs, and a function that fills it: writes then fail as on a full disk."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    root = tmp_path / "tmpfs"
    root.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(root)], check=True)

    def fill() -> Path:
        filler = root / ".filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        finally:
            os.close(fd)
        return filler

    try:
        yield root, fill
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)


@pytest.mark.parametrize("durability", ["buffered", "write"])
def test_a_failed_write_takes_back_only_the_failing_line(full_disk, durability):
    root, fill = full_disk
    big_failure = env("turn.failed", message="x" * 6000)  # spans a page: a full tmpfs tears it
    with open_s(root, durability=durability) as h:
        h.append(START)
        h.append(msg("a"))
        before = (h.manifest, h.turn_index, h.version)
        filler = fill()
        with pytest.raises(OSError) as info:
            h.append(big_failure)  # a boundary: written now, in every mode
        assert info.value.errno == errno.ENOSPC and info.value.accepted == 0
        assert (h.manifest, h.turn_index) == before[:2]
        assert (root / "s" / "events.jsonl").stat().st_size == (0 if durability == "buffered" else h.file_len)
        filler.unlink()
        h.append(big_failure)
        assert h.manifest["turn_count"] == 1 and h.manifest["event_count"] == 3
    assert log_lines(root / "s") == [START, msg("a"), big_failure]


@pytest.mark.parametrize("durability", ["buffered", "write"])
def test_append_keeps_no_references(tmp_path, durability):
    """Accepting (bytes with and without a newline, text, dicts, one-line writes) and refusing
    lines many times leaves no memory behind."""

    bad = [b"not json", b'{"schema_version":"0.18.0","event":{"type":"turn.failed"}}', b"x" * 70000]
    with open_s(tmp_path, durability=durability, max_line_bytes=65536) as h:
        writer = LineAppender(h.writes, max_line_bytes=65536, pid=9)

        def churn():
            for i in range(2000):
                h.append(msg("bytes"))
                h.append(msg("newline") + b"\n", 7)
                h.append(msg("text").decode(), pid=8)
                h.append({"type": "item.completed", "item": {"id": "d", "type": "agent_message", "text": "dict"}})
                writer.write(msg("one-line write") + b"\n")
                try:
                    h.append(bad[i % len(bad)])
                except ValidationError:
                    pass
                try:
                    writer.write(bad[i % 2] + b"\n")
                except ValidationError:
                    pass
            h.flush()  # nothing pending: what stays is what leaked

        grown = bytes_kept(churn)
        assert h.manifest["event_count"] == 20000
    assert grown < 64 * 1024, f"{grown} bytes kept after 14,000 appends"
    assert len(log_lines(tmp_path / "s")) == 20000


def test_append_takes_its_arguments_as_a_method_does(tmp_path):
    with open_s(tmp_path) as h:
        h.append(line=msg("by keyword"), pid=3)
        with pytest.raises(TypeError):
            h.append()
        with pytest.raises(TypeError):
            h.append(msg("a"), 1, 2)
        with pytest.raises(TypeError):
            h.append(msg("a"), pidd=1)
        assert "Validate and append one event line" in memfs.SessionHandle.append.__doc__
        assert list(inspect.signature(memfs.SessionHandle.append).parameters) == ["self", "line", "pid", "sync"]
        assert "def append(self" in inspect.getsource(memfs.SessionHandle)  # a real method, for tools
    assert log_lines(tmp_path / "s") == [msg("by keyword")]


def test_atomic_write_makes_the_rename_durable(tmp_path, monkeypatch):
    """A metadata replace fsyncs the temp file, renames it, then fsyncs the directory."""
    calls = []
    real_fsync, real_rename = os.fsync, os.rename
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append(("fsync", os.path.isdir(f"/proc/self/fd/{fd}")))
                        or real_fsync(fd))
    monkeypatch.setattr(os, "rename", lambda a, b: calls.append(("rename", None)) or real_rename(a, b))
    paths.atomic_write(tmp_path / "f.json", b"{}")
    assert calls == [("fsync", False), ("rename", None), ("fsync", True)]
    assert (tmp_path / "f.json").read_bytes() == b"{}"


def test_background_pending_counts_work_until_it_ends():
    """``paths.background_pending()`` counts the in_background calls not finished yet (a test
    that fills a disk waits for it: a replaced log's close frees blocks)."""
    wait_until(lambda: paths.background_pending() == 0, "earlier tests' background work done")
    release = threading.Event()
    futures = [paths.in_background(release.wait, 10) for _ in range(3)]
    assert paths.background_pending() == 3
    release.set()
    assert all(f.result(10) for f in futures)
    wait_until(lambda: paths.background_pending() == 0, "background work done")


def test_the_commit_keeps_no_references(full_disk):
    """Accepted lines (single and batched, buffered and write mode, boundaries), refused lines
    in a batch, evictions (and failed ones: CapRewriteError) and failed writes (ENOSPC, rolled
    back) leave no memory behind."""
    root, fill = full_disk
    bad = [b"not json", b'{"schema_version":"0.18.0","event":{"type":"turn.failed"}}']
    big = env("turn.failed", message="x" * 6000)  # spans a page: a full tmpfs refuses it
    calls = [0]

    def hook(session_dir, session_id, events):  # every other eviction fails
        calls[0] += 1
        if calls[0] % 2:
            raise RuntimeError("no summary today")

    capped = open_s(root, "capped", durability="write", max_events=4, summary_hook=hook)
    buffered = open_s(root, "buffered", max_events=6, summary_hook=lambda *args: None)  # bounded
    failing = open_s(root, "failing", durability="write")
    outcomes = {"cap_errors": 0, "refused": 0, "write_errors": 0}  # over the three runs of churn

    def put(h, lines):
        """Append; an eviction that fails after a line was committed (which stops a batch
        there) is counted."""
        try:
            h.append(lines[0]) if len(lines) == 1 else h.append_many(lines)
        except memfs.CapRewriteError as exc:
            assert 1 <= exc.accepted <= len(lines)
            outcomes["cap_errors"] += 1

    def churn():
        for i in range(150):
            for h in (capped, buffered):
                put(h, [START])
                put(h, [msg("one")])
                put(h, [msg("two"), DONE])
                try:
                    h.append_many([START, bad[i % 2], msg("never")])
                except ValidationError as exc:
                    assert exc.accepted == 1
                    outcomes["refused"] += 1
                except memfs.CapRewriteError as exc:  # the batch stops there too
                    assert exc.accepted == 1
                    outcomes["cap_errors"] += 1
                put(h, [DONE])
        # the disk must stay full: wait for the rewrites' closes of replaced logs (they free
        # blocks) and for any persist that holds some
        wait_until(lambda: paths.background_pending() == 0 and all(
            h.stats()["persist_idle"] for h in (capped, buffered, failing)), "background work done")
        filler = fill()
        try:
            for i in range(500):
                try:
                    failing.append(big) if i % 2 else failing.append_many([msg("kept?"), big])
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC and exc.accepted == 0
                    outcomes["write_errors"] += 1
        finally:
            filler.unlink()
        buffered.flush()  # nothing pending: what stays is what leaked
        # a cap rewrite's metadata is written on the persister thread: wait until it has
        wait_until(lambda: all(h.stats()["persist_idle"] for h in (capped, buffered, failing)), "persister idle")

    try:
        grown = bytes_kept(churn, ignore=[pathlib.__file__], rounds=2)  # background persists: the least of two
        assert outcomes["cap_errors"] > 75 and outcomes["refused"] > 450 and outcomes["write_errors"] == 1500
        assert failing.stats()["appended"] == 0 and failing.manifest["event_count"] == 0
        assert capped.manifest["event_count"] <= 4 + 4
    finally:
        for h in (capped, buffered, failing):
            h.close()
    assert grown < 32 * 1024, f"{grown} bytes kept after the churn"


def test_a_failed_create_leaves_no_half_created_session(full_disk):
    """Creating writes the log, the index and the manifest, or removes what it made (SPEC §3.5):
    on a full disk the new folder goes again, and nothing lists as a session."""
    from memfs.store.root import Store
    from memfs.store.sessiondirs import session_names

    root, fill = full_disk
    open_s(root, "existing").close()
    fill()
    with pytest.raises(OSError) as err:
        Store(root).create("new")
    assert err.value.errno == errno.ENOSPC
    assert not (root / "new").exists()
    with pytest.raises(OSError):
        open_s(root, "other")
    assert not (root / "other").exists()
    assert session_names(root) == ["existing"]
