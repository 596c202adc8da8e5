"""Coalesced metadata persists on the persister thread (memfs.store.persister, SPEC §3.2):
appends never wait for them, a stale snapshot never overwrites newer metadata, close waits
for a persist in flight, failures are logged once and retried.

Waiting for the thread is a bounded poll; no assertion is about speed.
"""

from __future__ import annotations

import errno
import os
import textwrap
import threading
import time

import memfs
import memfs.store.metadata as metadata_mod
import memfs.store.session as session_mod
import pytest
from memfs.events import Kind
from memfs.store import persister
from memfs.store.config import DEFAULT_METADATA_INTERVAL
from memfs.store.machine import TurnState, apply
from memfs.store.meta import Manifest

from store_helpers import DONE, START, disk_index, disk_manifest, msg, open_s, run_python, turn

DEFAULT = DEFAULT_METADATA_INTERVAL
WAIT = 10.0  # seconds a poll waits for the persister before the test fails


def eventually(cond, timeout: float = WAIT) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def caught_up(h, sdir) -> bool:
    """The metadata on disk is the live metadata."""
    return disk_manifest(sdir) == h.manifest and disk_index(sdir) == h.turn_index


def in_thread(fn, *args) -> threading.Thread:
    t = threading.Thread(target=fn, args=args, daemon=True)
    t.start()
    return t


class Park:
    """``os.fdatasync`` replaced: the persister thread's next call, once armed, waits for
    :meth:`release` (it is then inside the persist: snapshot taken, persist lock held)."""

    def __init__(self, real):
        self.real = real
        self.armed = False
        self.entered = threading.Event()
        self.released = threading.Event()
        self.calls: list[str] = []  # the threads that called fdatasync

    def __call__(self, fd):
        name = threading.current_thread().name
        self.calls.append(name)
        if self.armed and name == persister.THREAD_NAME:
            self.armed = False
            self.entered.set()
            self.released.wait(60)
        return self.real(fd)

    def arm(self) -> None:
        self.entered.clear()
        self.armed = True

    def release(self) -> None:
        self.released.set()


@pytest.fixture
def park(monkeypatch):
    parked = Park(os.fdatasync)
    monkeypatch.setattr(os, "fdatasync", parked)
    yield parked
    parked.release()  # never leave the thread parked for the next test


@pytest.mark.parametrize("durability", ["buffered", "write"])
def test_metadata_catches_up_after_a_boundary_without_another_call(tmp_path, park, durability):
    sdir = tmp_path / "s"
    with open_s(tmp_path, durability=durability, metadata_interval=DEFAULT) as h:
        park.calls.clear()
        lines = [line for t in range(20) for line in turn(f"t{t}", 5)]
        for line in lines:
            h.append(line)
        appended = threading.current_thread().name
        assert eventually(lambda: caught_up(h, sdir))
        assert disk_manifest(sdir)["turn_count"] == 20
        assert disk_manifest(sdir)["persisted_file_len"] == (sdir / "events.jsonl").stat().st_size
        # the log was made durable by the store's background threads, never by the appending
        # thread: the persister, or — when a slow persist (a loaded disk) stretched the
        # coalescing gap past idle_release — the idle release, which persists before it lets
        # the lock go (test_a_slow_persist_leaves_the_metadata_to_the_idle_release, below)
        assert park.calls and appended not in park.calls
        assert set(park.calls) <= {persister.THREAD_NAME, session_mod.IDLE_THREAD_NAME}


def test_a_slow_persist_leaves_the_metadata_to_the_idle_release(tmp_path, park, monkeypatch):
    """A persist's cost stretches the coalescing gap (PERSIST_SHARE times it); when the gap
    passes ``idle_release``, the idle release persists the metadata before it lets the lock go,
    so the metadata still catches up without another call."""
    monkeypatch.setattr(metadata_mod, "PERSIST_SHARE", 1e6)  # every persist looks slow, the creation's too
    sdir = tmp_path / "s"
    with open_s(tmp_path, durability="write", metadata_interval=DEFAULT, idle_release=0.3) as h:
        park.calls.clear()
        for line in turn("t0", 3):
            h.append(line)
        assert eventually(lambda: caught_up(h, sdir))  # the next persist was due hours away
        assert disk_manifest(sdir)["turn_count"] == 1
        assert session_mod.IDLE_THREAD_NAME in park.calls and persister.THREAD_NAME not in park.calls
        assert eventually(lambda: not memfs.is_live(sdir))  # and the lock is let go


@pytest.mark.parametrize("durability", ["buffered", "write"])
def test_appends_go_on_while_a_background_persist_is_in_fdatasync(tmp_path, park, durability):
    sdir = tmp_path / "s"
    with open_s(tmp_path, durability=durability, metadata_interval=DEFAULT) as h:
        park.arm()
        for line in turn("first"):
            h.append(line)
        assert park.entered.wait(WAIT)  # the persister holds the turn's snapshot, in fdatasync
        assert disk_manifest(sdir)["turn_count"] == 0

        def more():
            for t in range(3):
                for line in turn(f"more{t}", 20):
                    h.append(line)
            h.append(START)
            h.append(msg("open turn"))

        writer = in_thread(more)
        writer.join(WAIT)
        assert not writer.is_alive()  # 70 appends with 3 boundaries, none waited for the sync
        assert not park.released.is_set()
        assert h.manifest["turn_count"] == 4 and h.manifest["in_turn"] is True
        assert disk_manifest(sdir)["turn_count"] == 0  # still parked: nothing written yet
        park.release()
        assert eventually(lambda: caught_up(h, sdir))
        assert disk_manifest(sdir)["in_turn"] is True


def test_a_flush_during_a_background_persist_leaves_the_newest_metadata(tmp_path, park):
    sdir = tmp_path / "s"
    with open_s(tmp_path, durability="write", metadata_interval=DEFAULT) as h:
        park.arm()
        for line in turn("first"):
            h.append(line)
        assert park.entered.wait(WAIT)
        for line in turn("second") + [START, msg("third, open")]:
            h.append(line)
        flusher = in_thread(h.flush)  # waits for the persist lock the parked persist holds
        park.release()
        flusher.join(WAIT)
        assert not flusher.is_alive()
        assert caught_up(h, sdir)  # the flush wrote last: the older snapshot did not win
        assert eventually(lambda: h.stats()["persist_idle"])
        assert caught_up(h, sdir) and disk_manifest(sdir)["turn_count"] == 2


def test_a_snapshot_older_than_the_metadata_on_disk_is_dropped(tmp_path):
    """MetadataWriter: of two snapshots, the one taken first never replaces the other."""
    (tmp_path / "index").mkdir()
    writer = metadata_mod.MetadataWriter(tmp_path, interval=DEFAULT, cache_on_disk=False)
    state = TurnState()
    synced: list[int] = []

    def snapshot(turn_count: int, length: int):
        apply(state, Kind.TURN_STARTED, length - 10, length, "ts")  # a line ending at ``length``
        manifest = Manifest("s", "c", "u", turn_count, state.event_count, "active", True, length, 1)
        return writer.snapshot(turn_count, length, state.index, manifest.to_json(), cache=False)

    old = snapshot(1, 100)
    fresh = snapshot(2, 200)
    assert writer.write(fresh, synced.append) is True
    newer = disk_manifest(tmp_path)
    assert writer.write(old, synced.append) is False  # stale: nothing written, nothing synced
    assert disk_manifest(tmp_path) == newer and newer["persisted_file_len"] == 200
    assert len(disk_index(tmp_path)) == 2 and synced == [200]
    assert writer.persisted_version == 2
    writer.retire()
    assert writer.write(snapshot(3, 300), synced.append) is False  # closed: no write after retire


def test_close_waits_for_the_background_persist_and_reopens_on_the_fast_path(tmp_path, park, caplog):
    sdir = tmp_path / "s"
    h = open_s(tmp_path, durability="buffered", metadata_interval=DEFAULT)
    park.arm()
    for line in turn("a"):
        h.append(line)
    assert park.entered.wait(WAIT)
    for line in turn("b") + [START, msg("open")]:
        h.append(line)
    live = h.manifest
    closer = in_thread(h.close)
    closer.join(0.3)
    assert closer.is_alive()  # waiting for the persist in flight (the log's fd is still open)
    park.release()
    closer.join(WAIT)
    assert not closer.is_alive()
    assert h.stats()["persist_idle"] and not h.stats()["open"]
    assert disk_manifest(sdir) == live
    assert "persisting metadata" not in caplog.text  # the persist in flight did not fail
    with open_s(tmp_path) as again:
        assert again.open_report.fast_path
        assert again.manifest["turn_count"] == 2 and again.manifest["in_turn"] is True


def test_a_closed_session_leaves_the_schedule(tmp_path):
    h = open_s(tmp_path, durability="write", metadata_interval=3600)
    for line in turn("a"):
        h.append(line)
    assert h.stats()["persist_scheduled"]  # due in an hour
    h.close()
    assert not h.stats()["persist_scheduled"]
    assert disk_manifest(tmp_path / "s")["turn_count"] == 1  # close persisted it


def test_a_failing_background_persist_is_retried_logged_once_and_never_fails_appends(
        tmp_path, monkeypatch, caplog):
    sdir = tmp_path / "s"
    real = metadata_mod.atomic_write
    failures = []
    full = threading.Event()

    def atomic_write(path, data):
        if full.is_set():
            failures.append(path.name)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, data)

    monkeypatch.setattr(metadata_mod, "atomic_write", atomic_write)
    monkeypatch.setattr(persister, "RETRY_SECONDS", 0.02)
    with open_s(tmp_path, durability="write", metadata_interval=DEFAULT) as h:
        h.lock()  # (becoming the writer of a new session persisted its metadata already)
        full.set()
        for t in range(5):
            for line in turn(f"t{t}"):
                h.append(line)  # never raises
        assert eventually(lambda: len(failures) >= 4)  # retried, again and again
        assert h.manifest["turn_count"] == 5
        assert caplog.text.count("persisting metadata of s: ") == 1  # logged once, not per retry
        assert "No space left on device" in caplog.text
        full.clear()
        assert eventually(lambda: caught_up(h, sdir))
    with open_s(tmp_path) as again:
        assert again.open_report.fast_path


def test_a_failing_synchronous_persist_is_retried_by_the_persister(tmp_path, monkeypatch, caplog):
    """``metadata_interval=0``: the boundary persists in the appending thread; when that fails
    the append still succeeds and the persister retries."""
    sdir = tmp_path / "s"
    real = metadata_mod.atomic_write
    full = threading.Event()

    def atomic_write(path, data):
        if full.is_set():
            raise OSError(errno.EIO, "Input/output error")
        return real(path, data)

    monkeypatch.setattr(metadata_mod, "atomic_write", atomic_write)
    monkeypatch.setattr(persister, "RETRY_SECONDS", 0.02)
    with open_s(tmp_path, durability="write", metadata_interval=0) as h:
        h.lock()
        full.set()
        for line in turn("a"):
            h.append(line)
        assert "metadata not persisted" in caplog.text
        assert disk_manifest(sdir)["turn_count"] == 0
        full.clear()
        assert eventually(lambda: caught_up(h, sdir))
        assert disk_manifest(sdir)["turn_count"] == 1


def test_metadata_interval_zero_persists_in_the_appending_thread(tmp_path, park):
    sdir = tmp_path / "s"
    with open_s(tmp_path, durability="write", metadata_interval=0) as h:
        for line in turn("a"):
            h.append(line)
            if line is DONE:
                assert caught_up(h, sdir)  # at the boundary itself, no waiting
        assert not h.stats()["persist_scheduled"]
        assert persister.THREAD_NAME not in park.calls


EXIT = textwrap.dedent("""
    import os, sys, threading
    import memfs
    from memfs.store import persister
    from store_helpers import turn
    root, hang = sys.argv[1], sys.argv[2] == "hang"
    real = os.fdatasync
    entered = threading.Event()

    def fdatasync(fd):
        if hang and threading.current_thread().name == persister.THREAD_NAME:
            entered.set()
            threading.Event().wait()  # a disk that never answers
        return real(fd)

    os.fdatasync = fdatasync
    persister.EXIT_WAIT_SECONDS = 0.2
    h = memfs.open_session(root, "s", durability="write", max_events=0)
    for t in range(50):
        for line in turn(f"t{t}"):
            h.append(line)
    if hang:
        assert entered.wait(10)
    # no close: the interpreter exits with the persister thread alive
""")


@pytest.mark.parametrize("hang", ["hang", "busy"])
def test_process_exit_does_not_hang_on_the_persister(tmp_path, hang):
    res = run_python(EXIT, str(tmp_path), hang, timeout=30,
                     env={**os.environ, "PYTHONPATH": os.path.dirname(__file__)})
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""
    if hang == "busy":  # exit let the persist in flight finish: no temp file left behind
        assert not [p for p in (tmp_path / "s").rglob("*") if p.name.endswith(".tmp")]
