"""Sessions of this process: :func:`open_session`, ownership of the liveness lock, and
:class:`SessionHandle` (SPEC §3); the registry of open sessions is :mod:`memfs.store.registry`.

All handles to one session inside one process share one :class:`Session`: one log file
(:class:`~memfs.store.writer.LogFile`), one metadata writer
(:class:`~memfs.store.metadata.MetadataWriter`), one turn state, one ``mutex``. A handle is
per caller: its reading half (:mod:`memfs.store.reading`) and its writing half
(:mod:`memfs.store.writing`). The rest is in small modules: opening, recovery and following
the tail — :mod:`memfs.store.recovery`; the commit — :mod:`memfs.store.writer` (the only
commit path); metadata — :mod:`memfs.store.metadata`, coalesced on the thread of
:mod:`memfs.store.persister`; the event cap — :mod:`memfs.store.evict`; settings —
:class:`~memfs.store.config.SessionConfig`.

Decisions recorded here:

* Persists are *coalesced*: a turn boundary only schedules one (a persist costs an
  ``fdatasync`` of the log plus three fsyncs), which the persister thread runs once
  ``metadata_interval`` (default 0.05 s) has passed since the previous one, holding the
  session's ``mutex`` only to write pending bytes and take a snapshot. A failing background
  persist is logged and retried; it never fails an append. ``flush``, close and cap rewrites
  persist synchronously, as does every boundary with ``metadata_interval=0``. A crash inside
  the window only makes the next open rescan (metadata always names the length it describes).
* ``close`` persists whenever the metadata on disk does not describe the log (also mid-turn in
  ``write`` mode), so a clean close always reopens on the fast path.
* ``updated_at`` is the time of the last append call (or cap rewrite) that changed the log.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from memfs.errors import SessionBusy, SessionClosed
from memfs.store import lock as liveness
from memfs.store import persister
from memfs.store.catalog import noted
from memfs.store.config import (
    BUFFER_LIMIT,
    DEFAULT_EVICT_TO,
    DEFAULT_IDLE_RELEASE,
    DEFAULT_MAX_EVENTS,
    DEFAULT_MAX_LINE_BYTES,
    DEFAULT_METADATA_INTERVAL,
    SessionConfig,
    SummaryHook,
)
from memfs.store.meta import CACHE_MIN_ENTRIES, Manifest, format_rfc3339
from memfs.store.metadata import MetadataWriter
from memfs.store.paths import (
    CAP_MARKER,
    EVENTS,
    INDEX_DIR,
    MANIFEST,
    PIN,
    REJECTED,
    TURNS,
    TURNS_CACHE,
    assert_private_file,
    ensure_private_dir,
    open_nofollow,
    refuse_symlink,
    remove_file,
    remove_tree,
    sanitize,
)
from memfs.store.reading import LogReader, SessionReads
from memfs.store.recovery import OpenReport, Recovered, recover, rescanned_state
from memfs.store.registry import Registry
from memfs.store.sessiondirs import is_session_dir
from memfs.store.turntimes import TurnTimes
from memfs.store.writer import LogFile
from memfs.store.writing import SessionWrites

log = logging.getLogger("memfs.store")

_time = time.time
_monotonic = time.monotonic


class Session:
    """One session in this process, shared by all of its handles: a follower of the log on disk
    until it has to change it, its writer (holding the liveness lock) from then until it has
    been idle for ``idle_release`` seconds (SPEC §3.5).

    * Reading never takes the lock: a follower trusts the metadata on disk per §3.3 and folds
      the bytes appended since (by any process) into its state at the next read
      (:func:`memfs.store.recovery.follow`), at the cost of the new bytes only.
    * The first change (an append, a cap rewrite, a repair) takes the lock (:meth:`acquire`;
      :class:`SessionBusy` names the holder when another process has it) and re-reads what is
      on disk before trusting it: another process may have written since.
    * The lock is released (:meth:`release_if_idle`, on the idle thread) once no handle claims
      to be writing (:meth:`SessionWrites.claim_writing`), nothing is pending and the last change is
      ``idle_release`` seconds old; the metadata is persisted first.
    """

    __slots__ = ("dir", "config", "writable_config", "mutex", "refs", "key", "closed", "log", "meta", "state",
                 "report", "session_id", "created_at", "updated_at", "updated_for", "version", "appended",
                 "rewrites", "last_change", "persist_at", "last_refusal", "lock_file", "writers",
                 "opening", "serial", "times", "evicting")

    def __init__(self, session_dir: Path, session_id: str, config: SessionConfig, *, writable: bool):
        self.dir = session_dir
        self.config = config
        self.writable_config = writable  # ``config`` is a writer's (else a reader's, replaced by the first writer's)
        self.mutex = threading.RLock()
        self.refs = 1  # the handles on it (under the registry's lock: memfs.store.registry)
        self.key: tuple[int, int] | None = None  # its key in the registry
        self.closed = False
        self.version = 0  # bumped on every change; a cheap staleness check for views
        self.appended = 0  # records this process added to the log, ever
        self.rewrites = 0  # the log was replaced (a cap rewrite): offsets before are not comparable
        self.evicting = None  # this append call's evictions, until its rewrite (memfs.store.evict.Eviction)
        self.last_change = _time()
        self.updated_for = 0.0
        self.last_refusal: str | None = None  # the reason of the last line refused in this process
        self.lock_file: BinaryIO | None = None  # the liveness lock, while this process is the writer
        self.writers = 0  # handles that claim to be writing: the lock is kept while any does
        self.opening = object()  # identifies this open of the session: with ``rewrites``, what offsets mean
        self.serial = next(_SERIALS)  # the same, as a number (``generation``)
        self.log = LogFile(None, 0)
        self.times = TurnTimes(self.dir)  # arrival times of turns (index/turn-times.jsonl)
        self.meta = MetadataWriter(self.dir, config.metadata_interval, False, self.times)
        refuse_symlink(self.dir / INDEX_DIR)
        try:
            fd = open_nofollow(self.dir / EVENTS, os.O_RDONLY)
        except FileNotFoundError:
            fd = None
        try:
            self.adopt(recover(self.dir, fd, session_id, writable=False), fd)
        except BaseException:
            if fd is not None:
                os.close(fd)
            raise
        self.meta.cache_on_disk = os.path.lexists(self.dir / TURNS_CACHE)

    def adopt(self, found: Recovered, fd: int | None) -> None:
        """Take the state an open (or a re-read) found, with the log open as ``fd``."""
        self.state, self.report = found.state, found.report
        self.session_id, self.created_at, self.updated_at = found.session_id, found.created_at, found.updated_at
        self.log.reopen(fd, found.file_len)
        self.persist_at = found.file_len + BUFFER_LIMIT
        self.version += 1
        self.updated_for = self.last_change  # ``updated_at`` is what the disk says, until a change

    # --- ownership ---------------------------------------------------------------------------

    def acquire(self, new_log_metadata: bool = True) -> None:
        """Become the session's writer (caller holds ``mutex``): take the liveness lock, then
        re-read what is on disk — every count continues from what another process wrote,
        never from a stale state of this one. Raises :class:`SessionBusy` naming the holder.
        ``new_log_metadata`` False: an empty log's metadata is not written now but by the next
        persist (a flush, the release, the close: the metadata on disk does not describe it)."""
        if self.lock_file is not None:
            return
        if self.closed:
            raise SessionClosed("session handle is closed")
        ensure_private_dir(self.dir)
        ensure_private_dir(self.dir / INDEX_DIR)
        try:
            lock_file = liveness.acquire(self.dir)
        except SessionBusy as exc:
            self.last_refusal = str(exc)  # the writer's one-line reason (user.memfs.last_error)
            raise
        try:
            for name in (MANIFEST, TURNS, TURNS_CACHE, REJECTED, CAP_MARKER, PIN):  # 0600, no symlinks (§1)
                assert_private_file(self.dir / name)
            fd = open_nofollow(self.dir / EVENTS, os.O_RDWR | os.O_APPEND | os.O_CREAT)
            try:
                found = rescanned_state(self, fd) or recover(self.dir, fd, self.session_id, writable=True)
            except BaseException:
                os.close(fd)
                raise
        except BaseException:
            liveness.release(lock_file)
            raise
        old = self.log
        replaced = old.flushed_len > 0 and (found.file_len < old.flushed_len or old.fd is None or
                                            not os.path.samestat(os.fstat(old.fd), os.fstat(fd)))
        if replaced:  # another process rewrote the log (a cap): offsets seen before mean nothing now
            self.rewrites += 1  # (before the new length: see LogReader)
        self.adopt(found, fd)
        self.lock_file = lock_file
        self.times.became_writer(self.state)
        if found.report.fast_path:
            self.meta.persisted_version = self.version  # the metadata on disk describes this state
        elif not new_log_metadata and not found.file_len and not found.marker:
            self.meta.last_persist = _monotonic()  # (coalescing counts from here, as after a persist)
        else:
            try:
                self.persist()
            except OSError as exc:  # the log is whole; stale metadata only makes the next open rescan
                log.warning("%s: metadata not rebuilt (retried later): %s", self.name, exc)
                persister.schedule(self, _monotonic() + persister.RETRY_SECONDS)
        if found.marker:
            remove_file(self.dir / CAP_MARKER)
        self._schedule_release()

    def _schedule_release(self) -> None:
        # (no flag of our own saying it is scheduled: a forked child's releaser starts empty)
        _releaser.schedule(self, _monotonic() + self.config.idle_release)

    def release_due(self) -> float:
        """For the idle thread: not before the last change is ``idle_release`` seconds old
        (a monotonic time; 0 when that is already so)."""
        wait = self.last_change + self.config.idle_release - _time()
        return _monotonic() + wait if wait > 0 else 0.0

    def release_if_idle(self) -> float | None:
        """The idle thread's work: persist and release the lock when nothing keeps it; else the
        monotonic time to look again (None: released, or nothing to release)."""
        with self.mutex:
            if self.lock_file is None or self.closed:
                return None
            if self.writers:  # a handle is open for writing: look again later
                return _monotonic() + self.config.idle_release
            wait = self.last_change + self.config.idle_release - _time()
            if wait > 0:
                return _monotonic() + wait
            self.release()
            return None

    def release(self) -> None:
        """Stop being the writer (caller holds ``mutex``): write what is pending, persist
        metadata when it does not describe the log, release the lock. The log stays open
        (read-only from now on: the next change takes the lock again)."""
        if self.lock_file is None:
            return
        self.meta.settle()
        if self.log.pending or self.version != self.meta.persisted_version:
            self.persist()
        persister.cancel(self)
        lock_file, self.lock_file = self.lock_file, None
        self.times.stopped_writing()
        liveness.release(lock_file)
        noted(self.dir)  # no longer live: the catalog's status of it may change

    @property
    def name(self) -> str:
        return self.dir.name

    # --- the cap rewrite (memfs.store.evict) ----------------------------------------------------

    def replace_log(self, fd: int, cut: int) -> None:
        """A cap rewrite replaced the log by its bytes from ``cut`` on (caller holds ``mutex``)."""
        self.rewrites += 1  # first: a lock-free reader (LogReader) sees the new generation before the new length
        self.log.replace(fd, cut)
        self.last_change = _time()
        self.version += 1

    # --- metadata --------------------------------------------------------------------------

    def request_persist(self) -> None:
        """Metadata should be persisted (a boundary, or 64 KiB; caller holds ``mutex``).
        ``metadata_interval`` 0: now, in this thread; otherwise on the persister thread once
        the coalescing interval after the last persist has passed."""
        self.persist_at = self.log.length + BUFFER_LIMIT
        if self.state.turn_count > self.times.closed_through:  # a turn closed: note when (turntimes)
            self.times.note_closed(self.state)
        if self.config.metadata_interval:
            persister.schedule(self, self.meta.due())
            return
        if self.evicting is not None:
            return  # the call's cap rewrite persists (until then the disk would be told of a log not there)
        self.log.write_pending()  # a failure here is the log's: it fails the append
        try:
            self.persist()
        except OSError as exc:
            # the lines are in the log; stale metadata only makes the next open rescan
            log.warning("%s: metadata not persisted (retried later): %s", self.name, exc)
            persister.schedule(self, _monotonic() + persister.RETRY_SECONDS)

    def persist_due(self) -> float:
        """For the persister: no coalesced persist before this monotonic time (none to wait
        for while a cap rewrite's marker awaits its metadata)."""
        return 0.0 if self.meta.marker_pending else self.meta.due()

    def persist_rewrite(self) -> None:
        """Step 6 of a cap rewrite (caller holds ``mutex``): its metadata, which deletes the
        marker. With a persister (``metadata_interval`` > 0) the write runs there, at once, and
        the appender goes on meanwhile: until it lands, an open finds the marker and rescans
        with its ``retained_turn_base`` (SPEC §3.7), as after a crash in step 6."""
        if self.config.metadata_interval:
            persister.schedule(self, 0.0)
        else:
            self.persist()

    def manifest(self) -> Manifest:
        s = self.state
        if self.version and self.updated_for != self.last_change:  # formatting costs more than a stat
            self.updated_at = format_rfc3339(self.last_change)
            self.updated_for = self.last_change
        return Manifest(self.session_id, self.created_at, self.updated_at, s.turn_count, s.event_count,
                        s.status, s.in_turn, self.log.length, s.index.base)

    def _snapshot(self):
        """Metadata of the state as it is now (caller holds ``mutex``, nothing is pending)."""
        self.persist_at = self.log.length + BUFFER_LIMIT
        index = self.state.index
        return self.meta.snapshot(self.version, self.log.position, index, self.manifest().to_json(),
                                  cache=len(index) >= CACHE_MIN_ENTRIES, times=self.times.snapshot(self.state))

    def persist(self) -> None:
        """Persist now, in this thread (caller holds ``mutex``): flush, then write the metadata.
        Waits for a persister-thread write in flight."""
        self.log.write_pending()
        self.meta.write(self._snapshot(), self.log.sync_to)

    def persist_coalesced(self) -> None:
        """The persister thread's persist: ``mutex`` is held only to write the pending bytes
        and take a snapshot. Raises ``OSError`` (the persister logs it and retries)."""
        with self.mutex:
            if self.closed or self.lock_file is None:
                return  # (a release persisted first)
            if self.version == self.meta.persisted_version and not self.log.pending:
                return  # a persist since the request (a flush, a cap rewrite) wrote this state
            self.log.write_pending()
            snapshot = self._snapshot()
        self.meta.write(snapshot, self.log.sync_to)

    # --- closing ---------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Last handle closed (caller holds ``mutex``): as the writer, flush and persist
        (whenever the metadata on disk does not describe the log) and release the lock; close
        the log."""
        try:
            self.release()
        finally:
            self.closed = True
            persister.cancel(self)
            _releaser.cancel(self)
            self.meta.retire()
            try:
                self.log.close()
            finally:
                if self.lock_file is not None:  # the release failed: never keep the lock
                    lock_file, self.lock_file = self.lock_file, None
                    liveness.release(lock_file)


#: The name of the idle release's thread (a second instance of the persister's scheduler
#: thread). Releasing a session's liveness lock persists its metadata first when the persister
#: has not yet (SPEC §3.5): after a slow persist has stretched the coalescing gap
#: (:data:`memfs.store.metadata.PERSIST_SHARE`) past ``idle_release``, it is this thread that
#: brings the metadata up to date.
IDLE_THREAD_NAME = "memfs-idle"
_releaser = persister.Persister(IDLE_THREAD_NAME, due=lambda s: s.release_due(), work=lambda s: s.release_if_idle(),
                                what="releasing the liveness lock of")

_REGISTRY = Registry()
_SERIALS = itertools.count(1)


class SessionHandle:
    """A handle on one session's log. Use as a context manager, or call :meth:`close`.

    Thread-safe; several handles in one process share one :class:`Session`. A handle is its
    two halves — :attr:`reads` (:class:`~memfs.store.reading.SessionReads`) and :attr:`writes`
    (:class:`~memfs.store.writing.SessionWrites`) — plus its own lifecycle; the methods here
    are the common ones of each half, the rest are reached through the half.
    """

    __slots__ = ("_s", "reads", "writes")

    def __init__(self, shared: Session, read_only: bool):
        self._s = shared
        self.reads = SessionReads(shared)
        self.writes = SessionWrites(shared, read_only)  # (holds ``read_only`` and ``closed``)

    # --- identity ---------------------------------------------------------------------------

    @property
    def path(self) -> Path:
        """The session directory."""
        return self._s.dir

    @property
    def name(self) -> str:
        """The session's directory name (sanitized id)."""
        return self._s.dir.name

    @property
    def session_id(self) -> str:
        return self._s.session_id

    @property
    def read_only(self) -> bool:
        return self.writes.read_only

    @property
    def writer(self) -> bool:
        """This process is the session's writer now (it holds the liveness lock): its appends
        here may not be on disk yet. No disk access."""
        return self._s.lock_file is not None

    @property
    def durability(self) -> str:
        """The durability mode in force (the strongest any open of this process asked for)."""
        return self._s.config.durability

    @property
    def open_report(self) -> OpenReport:
        """How the session was opened (fast path or rescan, and what the rescan found)."""
        return self._s.report

    # --- reading (see SessionReads) ---------------------------------------------------------

    @property
    def file_len(self) -> int:
        """Length of the log including bytes still buffered."""
        return self.reads.file_len

    @property
    def version(self) -> int:
        """A counter that changes whenever the log changes (see :attr:`SessionReads.version`)."""
        return self.reads.version

    @property
    def rewrites(self) -> int:
        """How often the log was replaced (see :attr:`SessionReads.rewrites`)."""
        return self.reads.rewrites

    @property
    def manifest(self) -> dict:
        """The live manifest: what ``manifest.json`` would say if persisted now."""
        return self.reads.manifest

    @property
    def turn_index(self) -> list[dict]:
        """The live turn index entries (``index/turns.json``'s ``entries``)."""
        return self.reads.turn_index

    def turn_range(self, n: int) -> tuple[int, int, str]:
        """``(start, end, outcome)`` of retained turn ``n``; :class:`TurnNotFound` otherwise."""
        return self.reads.turn_range(n)

    def turn_times(self) -> dict[int, tuple[str | None, str | None]]:
        """``{ordinal: (started_at, completed_at)}`` (see :meth:`SessionReads.turn_times`)."""
        return self.reads.turn_times()

    def stats(self) -> dict:
        """Public counters of the shared session (see :meth:`SessionReads.stats`)."""
        return self.reads.stats()

    def reader(self) -> LogReader:
        """A reader of the log as it is now (see :meth:`SessionReads.reader`)."""
        return self.reads.reader()

    def read_bytes(self, offset: int = 0, size: int = -1) -> bytes:
        """The log's bytes ``[offset, offset+size)`` (to the end when ``size`` < 0)."""
        return self.reads.read_bytes(offset, size)

    def iter_lines(self, start: int = 0, end: int | None = None) -> Iterator[tuple[int, bytes]]:
        """Stream ``(offset, line)`` over the log's complete lines (see :meth:`SessionReads.iter_lines`)."""
        return self.reads.iter_lines(start, end)

    def reconstruct_turn(self, n: int) -> list[dict]:
        """The decoded events of retained turn ``n`` (undecodable lines skipped)."""
        return self.reads.reconstruct_turn(n)

    # --- writing (see SessionWrites) --------------------------------------------------------

    def append(self, line: bytes | str | dict, pid: int | None = None, *, sync: bool = True) -> None:
        """Validate and append one event line (SPEC §2–§3); the contract is
        :meth:`SessionWrites.append <memfs.store.writing.SessionWrites.append>`'s."""
        self.writes.append(line, pid, sync=sync)

    def append_many(self, lines: Iterable[bytes | str | dict], *, pid: int | None = None) -> int:
        """Append lines in order; return how many were accepted (see :meth:`SessionWrites.append_many`)."""
        return self.writes.append_many(lines, pid=pid)

    def flush(self) -> None:
        """Write buffered bytes, make them durable and persist metadata (nothing to do unless
        this process is the session's writer)."""
        self.writes.flush()

    def lock(self) -> None:
        """Become the session's writer now (see :meth:`SessionWrites.lock`)."""
        self.writes.lock()

    # --- lifecycle --------------------------------------------------------------------------

    def unused(self) -> bool:
        """No other handle shares the session and no handle claims to be writing: closing
        this handle would disturb nobody (a writer only waiting for its idle release just
        persists and releases its lock early). Lock-free (it never waits for an append or a
        cap rewrite in progress), hence a hint that may be stale."""
        s = self._s
        return s.refs == 1 and not s.writers

    def share(self) -> SessionHandle:
        """Another handle on the same session (closed on its own; the session stays open
        while any handle is)."""
        if self.writes.closed:
            raise SessionClosed("session handle is closed")
        _REGISTRY.share(self._s)
        return SessionHandle(self._s, self.writes.read_only)

    def close(self) -> None:
        """Release this handle; the last one flushes, persists and drops the lock."""
        if self.writes.closed:
            return
        self.writes.closed = True
        s = self._s
        if _REGISTRY.release(s):
            with s.mutex:
                s.shutdown()

    def __enter__(self) -> SessionHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<SessionHandle {self.name!r} {'ro' if self.read_only else self._s.config.durability}>"


def open_session(root: str | os.PathLike, session_id: str, *, max_events: int = DEFAULT_MAX_EVENTS,
                 durability: str = "buffered", read_only: bool = False,
                 max_line_bytes: int = DEFAULT_MAX_LINE_BYTES, summary_hook: SummaryHook | None = None,
                 metadata_interval: float = DEFAULT_METADATA_INTERVAL, idle_release: float = DEFAULT_IDLE_RELEASE,
                 evict_to: float = DEFAULT_EVICT_TO, create: bool = True, stay_writer: bool = False) -> SessionHandle:
    """Open (creating the folder if needed) the session ``session_id`` under the sessions root
    ``root``.

    The directory is ``root/sanitize(session_id)`` (0700, files 0600, symlinks refused).
    Opening never takes the liveness lock (SPEC §3.5): the first change does
    (:class:`~memfs.errors.SessionBusy` then, naming the process that holds it), and it is
    released ``idle_release`` seconds after the last change (see :class:`Session`). A second
    open in the same process shares the first one's state; the strongest durability requested
    by a writable open wins. ``read_only`` handles cannot write. ``max_events`` 0 means no
    cap; over it, an eviction goes down to ``evict_to × max_events`` events (0.5–1.0, SPEC
    §3.7; ``ValueError`` outside). ``stay_writer``: an open that creates the session stays its
    writer (the caller appends at once: one lock, one recovery and one metadata write, not two
    of each), released when idle or on close as after any change; otherwise creating writes the
    empty session's metadata and releases the lock at once. ``summary_hook(session_dir, session_id, evicted_events)`` replaces the default
    eviction summary writer.
    """
    config = SessionConfig(durability, max_events, max_line_bytes, summary_hook, metadata_interval, idle_release,
                           evict_to)
    root = Path(root)
    session_dir = root / sanitize(session_id)
    made = False
    if read_only or not create:
        refuse_symlink(session_dir)
        if not session_dir.is_dir():
            raise FileNotFoundError(f"no session {session_id!r} in {root}")
    elif not is_session_dir(session_dir):
        ensure_private_dir(root)
        made = not os.path.lexists(session_dir)
        handle = None
        try:  # creating is a change: the log, the index and the manifest, written at once
            ensure_private_dir(session_dir)
            ensure_private_dir(session_dir / INDEX_DIR)
            handle = _open_registered(session_dir, session_id, config, read_only=False)
            handle.writes.lock(new_log_metadata=not stay_writer)
            if not stay_writer:
                handle.writes.unlock()
        except BaseException:
            if handle is not None:
                try:
                    handle.close()  # (releases the lock even when its last persist fails too)
                except OSError:
                    pass
            if made and os.path.isdir(session_dir):  # never leave a half-created session (EMFILE, ENOSPC)
                remove_tree(session_dir)
            raise
        return handle
    return _open_registered(session_dir, session_id, config, read_only)


def _open_registered(session_dir: Path, session_id: str, config: SessionConfig, read_only: bool) -> SessionHandle:
    """A handle on this process's one :class:`Session` of ``session_dir`` (made on first use,
    see :mod:`memfs.store.registry`)."""
    st = os.lstat(session_dir)
    shared, joined = _REGISTRY.acquire((st.st_dev, st.st_ino),
                                       lambda: Session(session_dir, session_id, config, writable=not read_only))
    return _joined(shared, config, read_only) if joined else SessionHandle(shared, read_only)


def _joined(shared: Session, config: SessionConfig, read_only: bool) -> SessionHandle:
    """A further handle on an open session (its ``refs`` already counts it): a writable open
    strengthens the durability, or brings the first writer's settings."""
    if not read_only:
        with shared.mutex:
            if shared.writable_config:
                shared.config = shared.config.strongest(config.durability)
            else:  # opened for reading first: the first writer's settings
                shared.config, shared.writable_config = config, True
    return SessionHandle(shared, read_only)
