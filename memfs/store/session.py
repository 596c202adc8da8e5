"""Sessions of this process: :func:`open_session`, :class:`SessionHandle`, and the registry (SPEC §3).

All handles to one session inside one process share one :class:`Session`: one log file
(:class:`~memfs.store.writer.LogFile`), one metadata writer
(:class:`~memfs.store.metadata.MetadataWriter`), one turn state, one ``mutex``. It is built
from small parts, each in its own module:

* opening and recovery — :mod:`memfs.store.recovery`;
* the commit of appended lines — :mod:`memfs.store.writer` (the only commit path);
* metadata snapshot and persist — :mod:`memfs.store.metadata`, coalesced on the background
  thread of :mod:`memfs.store.persister`;
* the event cap — :mod:`memfs.store.evict`;
* the settings it runs with — :class:`~memfs.store.config.SessionConfig`.

Decisions recorded here:

* Persists are *coalesced*: a turn boundary only schedules one (one persist costs an
  ``fdatasync`` of the log plus three fsyncs, ~30 ms), which the persister thread runs once
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

import contextlib
import dataclasses
import itertools
import logging
import os
import threading
import time
from pathlib import Path
from typing import Iterable, Iterator

import orjson

from memfs.errors import ReadOnlySession, SessionBusy, SessionClosed, TurnNotFound, ValidationError
from memfs.events import Record, decode_stored, parse_line
from memfs.store import lock as liveness
from memfs.store import persister
from memfs.store.config import (BUFFER_LIMIT, DEFAULT_EVICT_TO, DEFAULT_IDLE_RELEASE, DEFAULT_MAX_EVENTS,
                                DEFAULT_MAX_LINE_BYTES, DEFAULT_METADATA_INTERVAL, SessionConfig, SummaryHook, check_line_size)
from memfs.store.lines import scan_lines
from memfs.store.meta import CACHE_MIN_ENTRIES, Manifest, format_rfc3339
from memfs.store.metadata import MetadataWriter
from memfs.store.catalog import is_session_dir
from memfs.store.paths import (CAP_MARKER, EVENTS, INDEX_DIR, MANIFEST, PIN, REJECTED, TURNS, TURNS_CACHE,
                               assert_private_file, ensure_private_dir, open_nofollow, refuse_symlink, remove_file,
                               remove_tree, sanitize)
from memfs.store.recovery import OpenReport, Recovered, recover, repair_torn_tail, scan_into
from memfs.store.turntimes import TurnTimes
from memfs.store.rejected import record_rejected
from memfs.store.writer import LogFile, commit_call

log = logging.getLogger("memfs.store")

_time = time.time
_monotonic = time.monotonic


class Session:
    """One session in this process, shared by all of its handles: a follower of the log on disk
    until it has to change it, its writer (holding the liveness lock) from then until it has
    been idle for ``idle_release`` seconds (SPEC §3.5).

    * Reading never takes the lock: a follower trusts the metadata on disk per §3.3 and folds
      the bytes appended since (by any process) into its state at the next read
      (:meth:`follow`), at the cost of the new bytes only.
    * The first change (an append, a cap rewrite, a repair) takes the lock (:meth:`acquire`;
      :class:`SessionBusy` names the holder when another process has it) and re-reads what is
      on disk before trusting it: another process may have written since.
    * The lock is released (:meth:`release_if_idle`, on the idle thread) once no handle claims
      to be writing (:meth:`SessionHandle.writing`), nothing is pending and the last change is
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
        self.refs = 1
        self.key: tuple[int, int] | None = None
        self.closed = False
        self.version = 0  # bumped on every change; a cheap staleness check for views
        self.appended = 0  # records this process added to the log, ever
        self.rewrites = 0  # the log was replaced (a cap rewrite): offsets before are not comparable
        self.evicting = None  # this append call's evictions, until its rewrite (memfs.store.evict.Eviction)
        self.last_change = _time()
        self.updated_for = 0.0
        self.last_refusal: str | None = None  # the reason of the last line refused in this process
        self.lock_file = None  # the liveness lock, while this process is the writer
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
            self._adopt(recover(self.dir, fd, session_id, writable=False), fd)
        except BaseException:
            if fd is not None:
                os.close(fd)
            raise
        self.meta.cache_on_disk = os.path.lexists(self.dir / TURNS_CACHE)

    def _adopt(self, found, fd: int | None) -> None:
        """Take the state an open (or a re-read) found, with the log open as ``fd``."""
        self.state, self.report = found.state, found.report
        self.session_id, self.created_at, self.updated_at = found.session_id, found.created_at, found.updated_at
        self.log.reopen(fd, found.file_len)
        self.persist_at = found.file_len + BUFFER_LIMIT
        self.version += 1
        self.updated_for = self.last_change  # ``updated_at`` is what the disk says, until a change

    # --- following and ownership -------------------------------------------------------------

    def follow(self) -> None:
        """A follower's catch-up with the log on disk (caller holds ``mutex``): fold the lines
        other processes appended since; re-read everything when the log was replaced (a cap
        rewrite elsewhere) or shrank. One ``fstat`` when nothing changed (and, once somebody
        read the turn times here, one more for ``index/turn-times.jsonl``: new times bump
        ``version`` too, so views refresh)."""
        if self.lock_file is not None or self.closed:
            return
        self._follow_log()
        if self.times.refresh_if_loaded():
            self.version += 1

    def _follow_log(self) -> None:
        log_file = self.log
        if log_file.fd is None:
            try:
                fd = open_nofollow(self.dir / EVENTS, os.O_RDONLY)
            except FileNotFoundError:
                return
            self._reread(fd)
            return
        st = os.fstat(log_file.fd)
        if st.st_nlink == 0 or st.st_size < log_file.flushed_len:
            self._reread(open_nofollow(self.dir / EVENTS, os.O_RDONLY))
        elif st.st_size > log_file.flushed_len:
            end = scan_into(self.state, log_file.fd, log_file.flushed_len, st.st_size)
            if end > log_file.flushed_len:
                log_file.flushed_len = end
                self.version += 1
                self.last_change = st.st_mtime

    def _reread(self, fd: int) -> None:
        """Recover the session afresh from disk, the log open as ``fd`` (a new file)."""
        try:
            found = recover(self.dir, fd, self.session_id, writable=False)
        except BaseException:
            os.close(fd)
            raise
        seen = self.log.flushed_len
        self._adopt(found, fd)
        if seen:  # offsets seen before mean nothing now
            self.rewrites += 1

    def acquire(self) -> None:
        """Become the session's writer (caller holds ``mutex``): take the liveness lock, then
        re-read what is on disk — every count continues from what another process wrote,
        never from a stale state of this one. Raises :class:`SessionBusy` naming the holder."""
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
                found = self._rescanned_state(fd) or recover(self.dir, fd, self.session_id, writable=True)
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
        self._adopt(found, fd)
        self.lock_file = lock_file
        self.times.became_writer(self.state)
        if found.report.fast_path:
            self.meta.persisted_version = self.version  # the metadata on disk describes this state
        else:
            try:
                self.persist()
            except OSError as exc:  # the log is whole; stale metadata only makes the next open rescan
                log.warning("%s: metadata not rebuilt (retried later): %s", self.name, exc)
                persister.schedule(self, _monotonic() + persister.RETRY_SECONDS)
        if found.marker:
            remove_file(self.dir / CAP_MARKER)
        self._schedule_release()

    def _rescanned_state(self, fd: int) -> Recovered | None:
        """What this process's own rescan found, when it still describes the log open as
        ``fd`` (the same file, nothing appended since, no cap rewrite pending; a torn tail is
        repaired first): a writer taking over a session whose metadata was stale need not read
        the whole log a second time. None when the log must be recovered afresh."""
        old = self.log
        if self.report.fast_path or old.fd is None or os.path.lexists(self.dir / CAP_MARKER):
            return None
        st = os.fstat(fd)
        if not os.path.samestat(os.fstat(old.fd), st) or st.st_size < old.flushed_len:
            return None
        report = dataclasses.replace(self.report, torn_tail_bytes=0)
        if repair_torn_tail(self.dir, fd, st.st_size, report) != old.flushed_len:
            return None  # lines arrived since the rescan: recover afresh
        return Recovered(self.state, old.flushed_len, self.session_id, self.created_at, self.updated_at, report,
                         False)

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

    @property
    def name(self) -> str:
        return self.dir.name

    # --- appending -------------------------------------------------------------------------

    def check_line(self, raw, pid: int | None, record: bool = True) -> Record:
        """Validate one line; a refused line raises, and goes to ``rejected.jsonl`` when
        ``record`` is true."""
        if self.closed:
            raise SessionClosed("session handle is closed")
        if type(raw) is not bytes:
            raw = _as_bytes(raw)
        try:
            if len(raw) > self.config.max_line_bytes:
                check_line_size(len(raw), self.config.max_line_bytes)
            return parse_line(raw)
        except ValidationError as err:
            if record:
                self.refuse(raw, err, pid)
            raise

    def refuse(self, raw: bytes, err: ValidationError, pid: int | None, stream_seq: int | None = None) -> None:
        """Record a refused line in ``rejected.jsonl`` (SPEC §3.8)."""
        reason = str(err)
        record_rejected(self.dir, raw, reason, err.errno_name, pid, stream_seq)
        self.last_refusal = reason

    def commit(self, records: Iterable[Record], sync: bool = True) -> int:
        """Append records (see :func:`memfs.store.writer.commit`), as the writer; return how many.
        ``sync`` False: return without the ``fdatasync`` of ``fsync`` mode (the caller makes
        the lines durable itself, see :meth:`SessionHandle.begin_sync`)."""
        with self.mutex:
            if self.lock_file is None:
                self.acquire()
            accepted, sync_target = commit_call(self, records)
        if sync_target and sync:
            self.log.sync_to(sync_target, appender=True)
        return accepted

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

_REGISTRY: dict[tuple[int, int], Session] = {}
_SERIALS = itertools.count(1)
_REGISTRY_LOCK = threading.Lock()  # guards _REGISTRY and _OPENING only: never held around disk work
_OPENING: dict[tuple[int, int], list] = {}  # key -> [lock of its first open, waiters]


class SessionHandle:
    """A handle on one session's log. Use as a context manager, or call :meth:`close`.

    Thread-safe; several handles in one process share one state.
    """

    __slots__ = ("_s", "_read_only", "_closed")

    def __init__(self, shared: Session, read_only: bool):
        self._s = shared
        self._read_only = read_only
        self._closed = False

    # identity and live state

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
        return self._read_only

    @property
    def durability(self) -> str:
        """The durability mode in force (the strongest any open of this process asked for)."""
        return self._s.config.durability

    @property
    def opening(self) -> object:
        """A token of this process's open of the session: byte offsets taken from the log are
        comparable while ``opening`` and :attr:`rewrites` stay the same (a closed and reopened
        session, or a log replaced by a cap rewrite, changes one of them)."""
        return self._s.opening

    @property
    def open_report(self) -> OpenReport:
        """How the session was opened (fast path or rescan, and what the rescan found)."""
        return self._s.report

    def _current(self) -> Session:
        """The shared session, caught up with the log on disk (caller holds its mutex)."""
        s = self._s
        if s.lock_file is None:
            s.follow()
        return s

    @property
    def file_len(self) -> int:
        """Length of the log including bytes still buffered."""
        with self._s.mutex:
            return self._current().log.length

    @property
    def version(self) -> int:
        """A counter that changes whenever the log changes (appends by any process, cap rewrites)."""
        with self._s.mutex:
            return self._current().version

    @property
    def rewrites(self) -> int:
        """How often the log was replaced (cap rewrites, here or seen from another process):
        offsets before one are not comparable."""
        with self._s.mutex:
            return self._current().rewrites

    @property
    def manifest(self) -> dict:
        """The live manifest: what ``manifest.json`` would say if persisted now."""
        with self._s.mutex:
            return self._current().manifest().to_dict()

    def manifest_json(self) -> bytes:
        with self._s.mutex:
            return self._current().manifest().to_json()

    @property
    def turn_index(self) -> list[dict]:
        """The live turn index entries (``index/turns.json``'s ``entries``)."""
        with self._s.mutex:
            return self._current().state.index.entries()

    def turn_index_json(self) -> bytes:
        with self._s.mutex:
            return self._current().state.index.to_json()

    def turn_times(self) -> dict[int, tuple[str | None, str | None]]:
        """``{ordinal: (started_at, completed_at)}``: when memfs received each turn's
        ``turn.started`` and its closing line (RFC 3339), for the turns a writer witnessed
        (see :mod:`memfs.store.turntimes`; a turn without times is absent or has nulls). The
        open turn has ``completed_at`` None. May include evicted turns' times, until a cap
        rewrite's persist compacts the sidecar (see :mod:`memfs.store.turntimes`)."""
        return self.turn_times_delta(None)[2]

    def turn_times_delta(self, token) -> tuple[tuple, bool, dict]:
        """``(token, whole, times)`` — :meth:`turn_times` incrementally: pass the previous
        call's ``token`` to get only the turns whose times changed since (``whole`` False),
        or everything (``whole`` True: the first call, or the times were re-read). The open
        turn's start, when known, is always included."""
        with self._s.mutex:
            s = self._current()
            if s.lock_file is not None and s.state.turn_count > s.times.closed_through:
                s.times.note_closed(s.state)  # a turn abandoned by the next turn.started (no boundary)
            token, whole, times = s.times.delta(token)
            opened = s.times.open_start(s.state) if s.lock_file is not None else None
            if opened is not None:
                known = times.get(opened[0])
                if known is None or known[0] is None:
                    times[opened[0]] = (opened[1], known[1] if known else None)
            return token, whole, times

    def turn_range(self, n: int) -> tuple[int, int, str]:
        """``(start, end, outcome)`` of retained turn ``n``; :class:`TurnNotFound` otherwise."""
        with self._s.mutex:
            index = self._current().state.index
            i = index.position(n)
            if i is None:
                raise TurnNotFound(f"turn {n} not found (retained turns: {index.base}..{index.last_ordinal})")
            entry = index.entry(i)
            return entry["start_offset"], entry["end_offset"], entry.get("outcome", "unknown")

    def stats(self) -> dict:
        """Public counters of the shared session, for tools and tests: ``appended`` (records
        this process added, ever), ``pending_bytes`` (accepted, not yet written),
        ``flushed_len``, ``synced`` (sync position known durable), ``version``, ``rewrites``,
        ``persisted_version`` (the ``version`` the metadata on disk describes),
        ``metadata_current`` (the metadata on disk describes the log as it is),
        ``metadata_writes`` (snapshots written), ``persist_scheduled``, ``persist_idle``
        (neither scheduled nor in flight on the persister thread), ``open`` (the log's
        descriptor is open), ``durability``, ``handles`` (open handles in this process),
        ``writer`` (this process holds the liveness lock),
        ``writing`` (handles claiming to be writing, see :meth:`writing`), ``syncs``
        (``fdatasync`` calls of ``fsync``-mode group commit in this process), ``owed_waits``
        and ``owed_timeouts`` (of those syncs, how many first waited for the appenders the
        previous one covered, and how many of those waits ran out: see
        :meth:`memfs.store.writer.LogFile.sync_to`)."""
        s = self._s
        with s.mutex:
            self._current()
            log_file, meta = s.log, s.meta
            written = meta.written_seq
            return {
                "appended": s.appended,
                "pending_bytes": len(log_file.pending),
                "flushed_len": log_file.flushed_len,
                "synced": log_file.synced,
                "version": s.version,
                "rewrites": s.rewrites,
                "persisted_version": meta.persisted_version,
                "metadata_current": meta.persisted_version == s.version and not log_file.pending,
                "metadata_writes": 0 if written == float("inf") else written,
                "persist_scheduled": persister.scheduled(s),
                "persist_idle": persister.idle(s),
                "open": log_file.fd is not None,
                "durability": s.config.durability,
                "handles": s.refs,
                "writer": s.lock_file is not None,
                "writing": s.writers,
                "syncs": log_file.syncs,
                "owed_waits": log_file.owed_waits,
                "owed_timeouts": log_file.owed_timeouts,
            }

    def free(self) -> bool:
        """No other thread holds the session's mutex now (an append, a cap rewrite, a rescan):
        an event loop may take it without waiting. A hint — it can change the next instant —
        for deciding whether a request is served inline or on a worker thread."""
        mutex = self._s.mutex
        if mutex.acquire(False):
            mutex.release()
            return True
        return False

    @property
    def generation(self) -> tuple[int, int]:
        """Which version of the log file is current: it changes when the log is replaced (a cap
        rewrite here or seen from another process) and when the session is opened afresh. The
        filesystem gives each generation its own inode number (SPEC §3.7). Lock-free."""
        s = self._s
        return s.serial, s.rewrites

    def reader(self) -> LogReader:
        """A reader of the log as it is now: it keeps reading this version (its own descriptor)
        across cap rewrites, and never returns a fragment of a line (SPEC §3.7)."""
        with self._s.mutex:
            log_file = self._current().log
            log_file.write_pending()
            fd = os.dup(log_file.fd) if log_file.fd is not None else None
            return LogReader(self, fd, self.generation)

    def unused(self) -> bool:
        """No other handle shares the session and no handle claims to be writing: closing
        this handle would disturb nobody (a writer only waiting for its idle release just
        persists and releases its lock early). Lock-free (it never waits for an append or a
        cap rewrite in progress), hence a hint that may be stale."""
        s = self._s
        return s.refs == 1 and not s.writers

    # appending

    def _writable(self) -> Session:
        if self._closed:
            raise SessionClosed("session handle is closed")
        if self._read_only:
            raise ReadOnlySession("session is open read-only")
        return self._s

    def append(self, line: bytes | str | dict, pid: int | None = None, *, sync: bool = True) -> None:
        """Validate and append one event line (SPEC §2–§3).

        ``line`` is the raw JSON bytes or text (an envelope or a bare event; a trailing newline
        is optional) or a dict to serialize. A refused line raises :class:`ValidationError`
        carrying the reason and is recorded in ``rejected.jsonl``; it never reaches
        ``events.jsonl``. If the event cap cannot be enforced, :class:`CapRewriteError`
        (``accepted`` 1) is raised *after* the event was accepted. A failed write raises
        ``OSError`` (``accepted`` 0: the line was taken back). ``pid`` is the writer's,
        recorded with a refused line (default: this process). ``sync`` False: in ``fsync``
        mode, return before the line is durable — the caller then waits for it through
        :meth:`begin_sync` (the filesystem does, with the ``fdatasync`` off its event loop).
        """
        if self._closed or self._read_only:
            self._writable()  # raises the reason
        s = self._s
        record = s.check_line(line, pid)
        mutex = s.mutex
        mutex.acquire()  # not ``with``: its machinery costs a fifth of a commit
        try:
            if s.lock_file is None:
                s.acquire()  # (raises SessionClosed on a closed session)
            sync_target = commit_call(s, (record,))[1]
        finally:
            mutex.release()
        if sync_target and sync:
            s.log.sync_to(sync_target, appender=True)

    def may_block_append(self, nbytes: int, nlines: int = 1, *, sync: bool = True) -> bool:
        """Whether appending ``nbytes`` in at most ``nlines`` lines may wait for the disk — a
        cheap, lock-free and conservative answer for an event loop that must never wait
        (SPEC §6): the caller runs such an append on a worker thread, any other inline.

        True when this process is not the session's writer yet (taking the lock re-reads the
        log and may rescan), in ``fsync`` mode (every append waits for ``fdatasync``), when
        metadata is persisted inline (``metadata_interval`` 0), when the lines may exceed the
        event cap (a cap rewrite), and in ``buffered`` mode when the pending bytes would reach
        the 64 KiB at which they are written. False for a closed or read-only handle (the
        append is refused at once) and for the common ``write``-mode append: one ``write()``
        to the page cache. Read without the session's mutex: a concurrent append of another
        thread can only make the answer stale by the lines it adds, so callers that may
        append to one session from several threads at once count those lines in ``nlines``.
        ``sync`` False: for an append with ``sync=False`` (``fsync`` mode's wait is the
        caller's own)."""
        s = self._s
        if self._closed or self._read_only or s.closed:
            return False
        if s.lock_file is None or not self.free():
            return True
        config = s.config
        if (config.syncs and sync) or not config.metadata_interval:
            return True
        if config.max_events and s.state.event_count + nlines > config.max_events:
            return True
        return not config.writes_through and len(s.log.pending) + nbytes >= BUFFER_LIMIT

    def append_many(self, lines: Iterable[bytes | str | dict], *, pid: int | None = None) -> int:
        """Append lines in order; return how many were accepted.

        Stops at the first refused line: the lines before it stay committed and the raised
        :class:`ValidationError` has ``accepted`` set to their count. A failed write raises
        ``OSError`` with ``accepted`` set to the lines that reached the file (the others are
        taken back). In ``fsync`` mode the whole batch shares one ``fdatasync``.
        """
        s = self._writable()
        check = s.check_line
        return s.commit(check(line, pid) for line in lines)

    def validate(self, line: bytes) -> Record:
        """Validate one line without appending or recording it (for callers that decide
        later whether a refusal is reported, like the filesystem's short writes)."""
        return self._writable().check_line(line, None, record=False)

    def reject(self, line: bytes, error: ValidationError, *, pid: int | None = None,
               stream_seq: int | None = None) -> None:
        """Record a refused line in ``rejected.jsonl`` (``stream_seq``: a cluster stream's line)."""
        self._s.refuse(line, error, pid, stream_seq)

    @property
    def last_refusal(self) -> str | None:
        """The reason of the last line of this session refused in this process, if any (or
        of the last append that failed, see :meth:`note_failure`)."""
        return self._s.last_refusal

    def note_failure(self, reason: str) -> None:
        """An append of this session failed above the store (cluster mode: no quorum, a
        session not replicated): ``reason`` becomes :attr:`last_refusal`, the writer's one-line
        reason (``user.memfs.last_error``)."""
        self._s.last_refusal = reason

    def append_records(self, records: Iterable[Record], *, sync: bool = True) -> int:
        """Append records that :meth:`validate` accepted, as one append call; return how many.

        A failed write raises ``OSError`` whose ``accepted`` counts the records that reached
        the file (the rest are taken back); a :class:`CapRewriteError` likewise carries
        ``accepted`` (those records are committed, the cap is retried after the next append).
        ``sync`` as for :meth:`append`.
        """
        return self._writable().commit(records, sync)

    # --- durability run by the caller (sync=False appends) ---------------------------------

    @property
    def sync_position(self) -> int:
        """The sync position of the bytes written so far: what :meth:`begin_sync` takes as
        its ``target`` right after an append (lock-free)."""
        return self._s.log.position

    def begin_sync(self, target: int) -> tuple[int, int] | None:
        """For a caller that runs ``fdatasync`` itself (off an event loop): None when the log
        is durable up to sync position ``target``; else ``(fd, goal)`` — ``fd`` a duplicate of
        the log's descriptor (made where no cap rewrite can close the log meanwhile), the
        caller's to sync and close — then call :meth:`end_sync` with ``goal``. The group
        commit (several waiters sharing one sync) is the caller's; the log only keeps the
        position known to be durable, shared with :meth:`append`'s own syncs."""
        return self._s.log.begin_sync(target)

    def end_sync(self, goal: int) -> None:
        """An ``fdatasync`` from :meth:`begin_sync` returned: the log is durable up to ``goal``."""
        self._s.log.end_sync(goal)

    def flush(self) -> None:
        """Write buffered bytes, make them durable and persist metadata (nothing to do unless
        this process is the session's writer)."""
        s = self._writable()
        with s.mutex:
            if s.lock_file is not None:
                s.persist()

    def lock(self) -> None:
        """Become the session's writer now, before any change: take the liveness lock (kept
        until the session is idle, see :class:`Session`) and repair what the open found
        (a torn tail, metadata to rebuild). :class:`~memfs.errors.SessionBusy` names the
        process that holds it."""
        s = self._writable()
        with s.mutex:
            s.acquire()

    def unlock(self) -> None:
        """Stop being the session's writer now rather than when idle (pending bytes written
        and metadata persisted first); the next change takes the lock again."""
        s = self._writable()
        with s.mutex:
            if s.writers:
                raise RuntimeError("a handle of this process is still writing")
            s.release()

    def claim_writing(self, lock: bool = False) -> None:
        """Claim to be writing until :meth:`end_writing` (a file open for writing, an agent
        being recorded): the liveness lock, once taken by a change (or at once with
        ``lock=True``), is not released while any claim is open. See :meth:`writing`."""
        s = self._writable()
        with s.mutex:
            s.writers += 1
            try:
                if lock:
                    s.acquire()
            except BaseException:
                s.writers -= 1
                raise

    def end_writing(self) -> None:
        """End a claim of :meth:`claim_writing`; the lock goes once the session is idle."""
        s = self._s
        with s.mutex:
            s.writers -= 1
            if s.lock_file is not None:
                s._schedule_release()

    @property
    def writers(self) -> int:
        """How many claims of :meth:`claim_writing` are open (files open for writing, agents
        being recorded) on this session in this process."""
        return self._s.writers

    @contextlib.contextmanager
    def writing(self, lock: bool = False):
        """:meth:`claim_writing` for the duration of a ``with`` block."""
        self.claim_writing(lock)
        try:
            yield self
        finally:
            self.end_writing()

    def share(self) -> SessionHandle:
        """Another handle on the same session (closed on its own; the session stays open
        while any handle is)."""
        if self._closed:
            raise SessionClosed("session handle is closed")
        with _REGISTRY_LOCK:
            self._s.refs += 1
        return SessionHandle(self._s, self._read_only)

    # reading

    def read_bytes(self, offset: int = 0, size: int = -1) -> bytes:
        """The log's bytes ``[offset, offset+size)`` (to the end when ``size`` < 0)."""
        with self._s.mutex:
            log_file = self._current().log
            log_file.write_pending()  # (a reader of this process sees its buffered appends)
            end = log_file.flushed_len if size < 0 else min(log_file.flushed_len, offset + size)
            if log_file.fd is None or offset >= end:
                return b""
            return os.pread(log_file.fd, end - offset, offset)

    def reconstruct_turn(self, n: int) -> list[dict]:
        """The decoded events of retained turn ``n`` (undecodable lines skipped)."""
        with self._s.mutex:  # range and bytes from one version of the log
            start, end, _ = self.turn_range(n)
            data = self.read_bytes(start, end - start)
        events = []
        for line in data.split(b"\n"):
            decoded = decode_stored(line) if line else None
            if decoded is not None:
                events.append(decoded[1])
        return events

    def hold(self) -> threading.RLock:
        """A context manager under which the log does not change: other threads' appends and
        cap rewrites wait until it exits. A reader's last resort against a log rewritten at
        nearly every append (a small cap under many writers); keep it short."""
        return self._s.mutex

    def iter_lines(self, start: int = 0, end: int | None = None) -> Iterator[tuple[int, bytes]]:
        """Stream ``(offset, line)`` over the log's complete lines from ``start``.

        The pending buffer is written first; lines appended while iterating are not seen. The
        iterator reads through its own descriptor, so a cap rewrite meanwhile cannot make it
        read another file: it goes on reading the log as it was (compare :attr:`rewrites`).
        """
        with self._s.mutex:
            log_file = self._current().log
            log_file.write_pending()
            limit = log_file.flushed_len if end is None else min(end, log_file.flushed_len)
            if log_file.fd is None:
                return iter(())
            fd = os.dup(log_file.fd)
        lines = _closing_lines(fd, start, limit)
        next(lines)
        return lines

    # closing

    def close(self) -> None:
        """Release this handle; the last one flushes, persists and drops the lock."""
        if self._closed:
            return
        self._closed = True
        s = self._s
        with _REGISTRY_LOCK:
            s.refs -= 1
            last = s.refs == 0
            if last and s.key is not None:
                _REGISTRY.pop(s.key, None)
        if last:
            with s.mutex:
                s.shutdown()

    def __enter__(self) -> SessionHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<SessionHandle {self.name!r} {'ro' if self._read_only else self._s.config.durability}>"


class LogReader:
    """One reader's view of the log (:meth:`SessionHandle.reader`): its own descriptor of the
    version current when it was made. While that version is current, reads stop at the bytes
    the writer has completely written (never a fragment of a line); once a cap rewrite
    replaced it, the old version is immutable and is read to its end (a reader reopens the
    name to see the new version, as ``tail -F`` does). Close it."""

    __slots__ = ("handle", "fd", "generation")

    def __init__(self, handle: SessionHandle, fd: int | None, generation: tuple[int, int]):
        self.handle, self.fd, self.generation = handle, fd, generation

    @property
    def current(self) -> bool:
        """This reader's version is the session's current log."""
        return self.handle.generation == self.generation

    def may_block(self) -> bool:
        """Whether :meth:`read` may wait: while its version is current, when bytes of this
        process are still buffered (written first), when the log's end is to be learnt from
        disk (this process is not the writer: another may have appended), or when another
        thread holds the session (a cap rewrite, say). An old version never waits."""
        if not self.current:
            return False
        s = self.handle._s
        return s.lock_file is None or bool(s.log.pending) or not self.handle.free()

    def read(self, offset: int, size: int) -> bytes:
        """Bytes ``[offset, offset+size)`` of this version; whole lines only while it is current."""
        if self.fd is None:
            return b""
        s = self.handle._s
        end = -1
        if self.current:
            if s.lock_file is None or s.log.pending:
                with s.mutex:
                    self.handle._current().log.write_pending()
            if self.current:
                end = s.log.flushed_len  # every byte before it is a whole line
                if not self.current:  # replaced meanwhile: the old version is whole
                    end = -1
        if end < 0:
            end = os.fstat(self.fd).st_size
        stop = min(offset + size, end)
        if stop <= offset:
            return b""
        return os.pread(self.fd, stop - offset, offset)

    def size(self) -> int:
        """This version's length now (what ``fstat`` of an old generation reports)."""
        return os.fstat(self.fd).st_size if self.fd is not None else 0

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _closing_lines(fd: int, start: int, end: int) -> Iterator[tuple[int, bytes]]:
    """scan_lines over a private ``fd`` that is closed when the iteration ends, is closed or
    is collected (primed once by its creator, so even an unused iterator closes it)."""
    try:
        yield None  # type: ignore[misc]
        yield from scan_lines(fd, start, end)
    finally:
        os.close(fd)


def _as_bytes(line: bytes | str | dict) -> bytes:
    if isinstance(line, (bytes, bytearray, memoryview)):
        return bytes(line)
    if isinstance(line, str):
        return line.encode("utf-8", "surrogatepass")
    if isinstance(line, dict):
        return orjson.dumps(line)
    raise TypeError(f"append takes bytes, str or dict, not {type(line).__name__}")


def open_session(root: str | os.PathLike, session_id: str, *, max_events: int = DEFAULT_MAX_EVENTS,
                 durability: str = "buffered", read_only: bool = False,
                 max_line_bytes: int = DEFAULT_MAX_LINE_BYTES, summary_hook: SummaryHook | None = None,
                 metadata_interval: float = DEFAULT_METADATA_INTERVAL, idle_release: float = DEFAULT_IDLE_RELEASE,
                 evict_to: float = DEFAULT_EVICT_TO, create: bool = True) -> SessionHandle:
    """Open (creating the folder if needed) the session ``session_id`` under the sessions root
    ``root``.

    The directory is ``root/sanitize(session_id)`` (0700, files 0600, symlinks refused).
    Opening never takes the liveness lock (SPEC §3.5): the first change does
    (:class:`~memfs.errors.SessionBusy` then, naming the process that holds it), and it is
    released ``idle_release`` seconds after the last change (see :class:`Session`). A second
    open in the same process shares the first one's state; the strongest durability requested
    by a writable open wins. ``read_only`` handles cannot write. ``max_events`` 0 means no
    cap; over it, an eviction goes down to ``evict_to × max_events`` events (0.5–1.0, SPEC
    §3.7; ``ValueError`` outside). ``summary_hook(session_dir, session_id, evicted_events)`` replaces the default
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
            handle.lock()
            handle.unlock()
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
    """A handle on this process's one :class:`Session` of ``session_dir`` (made on first use).

    The registry's lock is held only to look up and insert: a session's first open (which
    may rescan a large log) holds only that session's own gate, so opening one session
    never waits for another's open."""
    st = os.lstat(session_dir)
    key = (st.st_dev, st.st_ino)
    with _REGISTRY_LOCK:
        shared = _REGISTRY.get(key)
        if shared is None:
            gate = _OPENING.get(key)
            if gate is None:
                gate = _OPENING[key] = [threading.Lock(), 0]
            gate[1] += 1
        else:
            shared.refs += 1
    if shared is not None:
        return _joined(shared, config, read_only)
    try:
        with gate[0]:
            with _REGISTRY_LOCK:
                shared = _REGISTRY.get(key)
                if shared is not None:
                    shared.refs += 1
            if shared is not None:  # opened meanwhile by another thread
                return _joined(shared, config, read_only)
            shared = Session(session_dir, session_id, config, writable=not read_only)  # may rescan
            shared.key = key
            with _REGISTRY_LOCK:
                _REGISTRY[key] = shared
            return SessionHandle(shared, read_only)
    finally:
        with _REGISTRY_LOCK:
            gate[1] -= 1
            if not gate[1]:
                del _OPENING[key]


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
