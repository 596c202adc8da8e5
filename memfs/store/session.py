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

import logging
import os
import threading
import time
from pathlib import Path
from typing import Iterable, Iterator

import orjson

from memfs.errors import ReadOnlySession, SessionClosed, TurnNotFound, ValidationError
from memfs.events import Record, decode_stored, parse_line
from memfs.store import lock as liveness
from memfs.store import persister
from memfs.store.config import (BUFFER_LIMIT, DEFAULT_MAX_EVENTS, DEFAULT_MAX_LINE_BYTES, DEFAULT_METADATA_INTERVAL,
                                SessionConfig, SummaryHook, check_line_size)
from memfs.store.lines import scan_lines
from memfs.store.meta import CACHE_MIN_ENTRIES, Manifest, format_rfc3339
from memfs.store.metadata import MetadataWriter
from memfs.store.paths import (CAP_MARKER, EVENTS, INDEX_DIR, MANIFEST, PIN, REJECTED, TURNS, TURNS_CACHE,
                               assert_private_file, ensure_private_dir, open_nofollow, refuse_symlink, remove_file,
                               sanitize)
from memfs.store.recovery import OpenReport, recover
from memfs.store.rejected import record_rejected
from memfs.store import writer
from memfs.store.writer import LogFile, commit

log = logging.getLogger("memfs.store")

_time = time.time
_monotonic = time.monotonic


class Session:
    """One open session in this process, shared by all of its handles."""

    __slots__ = ("dir", "read_only", "config", "mutex", "refs", "key", "closed", "log", "meta", "state", "report",
                 "session_id", "created_at", "updated_at", "updated_for", "version", "appended", "rewrites",
                 "last_change", "persist_at", "last_refusal", "lock_file")

    def __init__(self, session_dir: Path, session_id: str, config: SessionConfig, *, read_only: bool):
        self.dir = session_dir
        self.read_only = read_only
        self.config = config
        self.mutex = threading.RLock()
        self.refs = 1
        self.key: tuple[int, int] | None = None
        self.closed = False
        self.version = 0  # bumped on every change; a cheap staleness check for views
        self.appended = 0  # records this process added to the log, ever
        self.rewrites = 0  # cap rewrites by this process: offsets before one are not comparable
        self.last_change = _time()
        self.updated_for = 0.0
        self.last_refusal: str | None = None  # the reason of the last line refused in this process
        self.log = LogFile(None, 0)
        self.lock_file = None if read_only else liveness.acquire(session_dir)
        try:
            self._open(session_id)
        except BaseException:
            self._release_files()
            raise

    def _open(self, session_id: str) -> None:
        events = self.dir / EVENTS
        refuse_symlink(self.dir / INDEX_DIR)
        fd = None
        if self.read_only:
            try:
                fd = open_nofollow(events, os.O_RDONLY)
            except FileNotFoundError:
                pass
        else:
            for name in (MANIFEST, TURNS, TURNS_CACHE, REJECTED, CAP_MARKER, PIN):  # 0600, no symlinks (§1)
                assert_private_file(self.dir / name)
            fd = open_nofollow(events, os.O_RDWR | os.O_APPEND | os.O_CREAT)
        self.log.fd = fd
        found = recover(self.dir, fd, session_id, writable=not self.read_only)
        self.state, self.report = found.state, found.report
        self.session_id, self.created_at, self.updated_at = found.session_id, found.created_at, found.updated_at
        self.log = LogFile(fd, found.file_len)
        self.persist_at = found.file_len + BUFFER_LIMIT
        self.meta = MetadataWriter(self.dir, self.config.metadata_interval, os.path.lexists(self.dir / TURNS_CACHE))
        if not self.read_only:
            if not found.report.fast_path:
                self.persist()
            if found.marker:
                remove_file(self.dir / CAP_MARKER)

    @property
    def name(self) -> str:
        return self.dir.name

    # --- appending -------------------------------------------------------------------------

    def check_line(self, raw, pid: int | None, record: bool = True) -> Record:
        """Validate one line; a refused line raises, and goes to ``rejected.jsonl`` when
        ``record`` is true."""
        if self.read_only:
            raise ReadOnlySession("session is open read-only")
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

    def refuse(self, raw: bytes, err: ValidationError, pid: int | None) -> None:
        """Record a refused line in ``rejected.jsonl`` (SPEC §3.8)."""
        reason = str(err)
        record_rejected(self.dir, raw, reason, err.errno_name, pid)
        self.last_refusal = reason

    def commit(self, records: Iterable[Record]) -> int:
        """Append records (see :func:`memfs.store.writer.commit`); return how many."""
        with self.mutex:
            if self.closed:
                raise SessionClosed("session handle is closed")
            accepted, sync_target = commit(self, records)
        if sync_target:
            self.log.sync_to(sync_target)
        return accepted

    def replace_log(self, fd: int, cut: int) -> None:
        """A cap rewrite replaced the log by its bytes from ``cut`` on (caller holds ``mutex``)."""
        self.log.replace(fd, cut)
        self.last_change = _time()
        self.version += 1
        self.rewrites += 1

    # --- metadata --------------------------------------------------------------------------

    def request_persist(self) -> None:
        """Metadata should be persisted (a boundary, or 64 KiB; caller holds ``mutex``).
        ``metadata_interval`` 0: now, in this thread; otherwise on the persister thread once
        the coalescing interval after the last persist has passed."""
        self.persist_at = self.log.length + BUFFER_LIMIT
        if self.config.metadata_interval:
            persister.schedule(self, self.meta.due())
            return
        self.log.write_pending()  # a failure here is the log's: it fails the append
        try:
            self.persist()
        except OSError as exc:
            # the lines are in the log; stale metadata only makes the next open rescan
            log.warning("%s: metadata not persisted (retried later): %s", self.name, exc)
            persister.schedule(self, _monotonic() + persister.RETRY_SECONDS)

    def persist_due(self) -> float:
        """For the persister: no coalesced persist before this monotonic time."""
        return self.meta.due()

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
                                  cache=len(index) >= CACHE_MIN_ENTRIES)

    def persist(self) -> None:
        """Persist now, in this thread (caller holds ``mutex``): flush, then write the metadata.
        Waits for a persister-thread write in flight."""
        self.log.write_pending()
        self.meta.write(self._snapshot(), self.log.sync_to)

    def persist_coalesced(self) -> None:
        """The persister thread's persist: ``mutex`` is held only to write the pending bytes
        and take a snapshot. Raises ``OSError`` (the persister logs it and retries)."""
        with self.mutex:
            if self.closed or self.log.fd is None:
                return
            if self.version == self.meta.persisted_version and not self.log.pending:
                return  # a persist since the request (a flush, a cap rewrite) wrote this state
            self.log.write_pending()
            snapshot = self._snapshot()
        self.meta.write(snapshot, self.log.sync_to)

    # --- closing ---------------------------------------------------------------------------

    def _release_files(self) -> None:
        try:
            self.log.close()
        finally:
            if self.lock_file is not None:
                lock_file, self.lock_file = self.lock_file, None
                liveness.release(lock_file)

    def shutdown(self) -> None:
        """Last handle closed (caller holds ``mutex``): flush, persist (whenever the metadata
        on disk does not describe the log), leave the persister's schedule, release the files
        and the lock."""
        try:
            if not self.read_only and self.log.fd is not None:
                self.meta.settle()  # a persister write in flight lands first: it may make this one moot
                if self.log.pending or self.version != self.meta.persisted_version:
                    self.persist()
        finally:
            self.closed = True
            if not self.read_only:
                persister.cancel(self)
                self.meta.retire()
            self._release_files()


_REGISTRY: dict[tuple[int, int], Session] = {}
_REGISTRY_LOCK = threading.Lock()


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
    def open_report(self) -> OpenReport:
        """How the session was opened (fast path or rescan, and what the rescan found)."""
        return self._s.report

    @property
    def file_len(self) -> int:
        """Length of the log including bytes still buffered."""
        return self._s.log.length

    @property
    def version(self) -> int:
        """A counter that changes whenever the log changes (appends and cap rewrites)."""
        return self._s.version

    @property
    def rewrites(self) -> int:
        """How many cap rewrites this process made: offsets before one are not comparable."""
        return self._s.rewrites

    @property
    def manifest(self) -> dict:
        """The live manifest: what ``manifest.json`` would say if persisted now."""
        with self._s.mutex:
            return self._s.manifest().to_dict()

    def manifest_json(self) -> bytes:
        with self._s.mutex:
            return self._s.manifest().to_json()

    @property
    def turn_index(self) -> list[dict]:
        """The live turn index entries (``index/turns.json``'s ``entries``)."""
        with self._s.mutex:
            return self._s.state.index.entries()

    def turn_index_json(self) -> bytes:
        with self._s.mutex:
            return self._s.state.index.to_json()

    def turn_range(self, n: int) -> tuple[int, int, str]:
        """``(start, end, outcome)`` of retained turn ``n``; :class:`TurnNotFound` otherwise."""
        with self._s.mutex:
            index = self._s.state.index
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
        ``impl`` (which twin of the commit runs: ``"c"`` or ``"py"``, see
        :mod:`memfs.store.writer`)."""
        s = self._s
        with s.mutex:
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
                "impl": writer.IMPL,
            }

    # appending

    def _writable(self) -> Session:
        if self._closed:
            raise SessionClosed("session handle is closed")
        if self._read_only:
            raise ReadOnlySession("session is open read-only")
        return self._s

    def append(self, line: bytes | str | dict, pid: int | None = None) -> None:
        """Validate and append one event line (SPEC §2–§3).

        ``line`` is the raw JSON bytes or text (an envelope or a bare event; a trailing newline
        is optional) or a dict to serialize. A refused line raises :class:`ValidationError`
        carrying the reason and is recorded in ``rejected.jsonl``; it never reaches
        ``events.jsonl``. If the event cap cannot be enforced, :class:`CapRewriteError`
        (``accepted`` 1) is raised *after* the event was accepted. A failed write raises
        ``OSError`` (``accepted`` 0: the line was taken back). ``pid`` is the writer's,
        recorded with a refused line (default: this process).
        """
        if self._closed or self._read_only:
            self._writable()  # raises the reason
        s = self._s
        record = s.check_line(line, pid)
        mutex = s.mutex
        mutex.acquire()  # not ``with``: its machinery costs a fifth of a commit
        try:
            if s.closed:
                raise SessionClosed("session handle is closed")
            sync_target = commit(s, (record,))[1]
        finally:
            mutex.release()
        if sync_target:
            s.log.sync_to(sync_target)

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

    def reject(self, line: bytes, error: ValidationError, *, pid: int | None = None) -> None:
        """Record a refused line in ``rejected.jsonl``."""
        self._s.refuse(line, error, pid)

    @property
    def last_refusal(self) -> str | None:
        """The reason of the last line of this session refused in this process, if any."""
        return self._s.last_refusal

    def append_records(self, records: Iterable[Record]) -> int:
        """Append records that :meth:`validate` accepted, as one append call; return how many.

        A failed write raises ``OSError`` whose ``accepted`` counts the records that reached
        the file (the rest are taken back); a :class:`CapRewriteError` likewise carries
        ``accepted`` (those records are committed, the cap is retried after the next append).
        """
        return self._writable().commit(records)

    def flush(self) -> None:
        """Write buffered bytes, make them durable and persist metadata."""
        s = self._writable()
        with s.mutex:
            s.persist()

    # reading

    def read_bytes(self, offset: int = 0, size: int = -1) -> bytes:
        """The log's bytes ``[offset, offset+size)`` (to the end when ``size`` < 0)."""
        s = self._s
        with s.mutex:
            log_file = s.log
            if not s.read_only:
                log_file.write_pending()
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
        s = self._s
        with s.mutex:
            log_file = s.log
            if not s.read_only:
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
                 metadata_interval: float = DEFAULT_METADATA_INTERVAL, create: bool = True) -> SessionHandle:
    """Open (creating if needed) the session ``session_id`` under the sessions root ``root``.

    The directory is ``root/sanitize(session_id)`` (0700, files 0600, symlinks refused).
    A writable open takes the liveness lock: :class:`~memfs.errors.SessionBusy` when another
    process holds it. A second open in the same process shares the first one's state; the
    strongest durability requested wins. ``read_only`` opens take no lock, repair nothing and
    share a writable state of this process when there is one. ``max_events`` 0 means no cap.
    ``summary_hook(session_dir, session_id, evicted_events)`` replaces the default eviction
    summary writer.
    """
    config = SessionConfig(durability, max_events, max_line_bytes, summary_hook, metadata_interval)
    root = Path(root)
    session_dir = root / sanitize(session_id)
    if read_only or not create:
        refuse_symlink(session_dir)
        if not session_dir.is_dir():
            raise FileNotFoundError(f"no session {session_id!r} in {root}")
        if not read_only:
            ensure_private_dir(session_dir)
            ensure_private_dir(session_dir / INDEX_DIR)
    else:
        ensure_private_dir(root)
        ensure_private_dir(session_dir)
        ensure_private_dir(session_dir / INDEX_DIR)
    st = os.lstat(session_dir)
    key = (st.st_dev, st.st_ino)
    with _REGISTRY_LOCK:
        shared = _REGISTRY.get(key)
        if shared is not None:
            shared.refs += 1
            if not read_only:
                shared.config = shared.config.strongest(durability)
            return SessionHandle(shared, read_only)
        if read_only:
            return SessionHandle(Session(session_dir, session_id, SessionConfig(durability, 0, max_line_bytes, None,
                                                                                metadata_interval), read_only=True),
                                 True)
        shared = Session(session_dir, session_id, config, read_only=False)
        shared.key = key
        _REGISTRY[key] = shared
        return SessionHandle(shared, False)
