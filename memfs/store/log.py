"""The session log (SPEC §3): one append-only ``events.jsonl`` and the state it implies.

:func:`open_session` returns a :class:`SessionHandle`. All handles to one session inside one
process share one :class:`_Shared` (one file descriptor, one buffer, one lock, one state);
the liveness lock is released when the last handle closes.

Durability (§3.2):

* ``buffered`` — lines collect in memory until a turn boundary, 64 KiB, any read, a cap
  rewrite, ``flush`` or ``close``;
* ``write`` — each append's lines are written to the file before it returns;
* ``fsync`` — each append returns after ``fdatasync``; concurrent appends from several threads
  share one ``fdatasync`` (group commit).

Metadata (manifest + turn index) is persisted at turn boundaries, after every 64 KiB flush
(``buffered`` mode), on ``flush``, ``close`` and cap rewrites, in the §3.2 order. Decisions
recorded here:

* In ``write`` and ``fsync`` mode there is no 64 KiB flush (every line reaches the file on its
  own), so a long turn is not persisted midway: metadata on disk matters only to the next open,
  and after a crash any append since the last persist makes that open rescan anyway.
* Because one persist costs an ``fdatasync`` of the log plus three fsyncs (measured: ~30 ms at
  200,000 appends/s, ~90% of it the ``fdatasync``), persists are *coalesced* and run off the
  appending thread: a request only schedules the session with :mod:`memfs.store.persister`,
  one daemon thread per process shared by all sessions, which persists it once
  ``metadata_interval`` seconds (default 0.05) have passed since its previous persist. The
  thread holds the session's ``mutex`` only to write pending bytes and take a snapshot (sync
  target, index, manifest, a sequence number), then makes the log durable and writes the files
  with the mutex released, so appends go on meanwhile. All metadata writers of a session
  serialize on its ``persist_lock``, and a snapshot older than the metadata on disk (a
  ``flush`` or cap rewrite persisted in between) is dropped. The interval also stretches to
  ten times the last persist's duration, so a session whose index is huge (a persist rewrites
  ``turns.json`` whole) keeps the thread and the disk busy at most about a tenth of the time.
  Log bytes are never delayed by this, and a crash inside the window only makes the next open
  rescan (metadata always carries the file length it describes). A failing background persist
  is logged (once a minute per session) and retried; it never fails an append. ``flush``,
  ``close`` and cap rewrites persist synchronously, as does every boundary with
  ``metadata_interval=0`` (whatever it costs).
* ``close`` persists whenever the metadata on disk does not describe the log (also mid-turn
  in ``write`` mode), so a clean close always reopens on the fast path. It first waits for a
  background persist of the session in flight (which may make its own moot), and drops the
  session from the persister's schedule before the log is closed.
* ``updated_at`` is the time of the last append call (or cap rewrite) that changed the log.

A failed write of log bytes (``ENOSPC``, ``EIO``) takes back exactly the lines that did not
reach the file: the file is truncated to the last complete write (no torn line stays for the
next append to merge into), and the state returns to where it was before those lines —
a single :meth:`~SessionHandle.append` writes its line before applying it whenever it has to
write at all, and a batch call returns to its mark, taken at the start of the call and after
every write of the pending bytes — so a line reported as failed is never committed later.
Lines written before the failure stay committed; the raised ``OSError`` carries their count
as ``accepted``. A failed *metadata* persist at a turn boundary does not fail the append (its
lines are in the log): it is logged and retried, and until then the next open rescans.
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import orjson

from memfs.errors import CapRewriteError, LineTooLong, ReadOnlySession, SessionClosed, SymlinkRefused, TurnNotFound, ValidationError
from memfs.events import Kind, Record, decode_stored, parse_line
from memfs.store import _append
from memfs.store import lock as liveness
from memfs.store import persister
from memfs.store.evict import enforce_cap
from memfs.store.lines import CHUNK, scan_chunks, scan_lines
from memfs.store.machine import TurnState, apply, renumber
from memfs.store.meta import (CACHE_MIN_ENTRIES, CapMarker, IndexSnapshot, Manifest, ManifestRead, TurnIndex,
                              file_key, format_rfc3339, now_rfc3339, read_manifest)
from memfs.store.paths import (
    assert_private_file,
    CAP_MARKER,
    EVENTS,
    INDEX_DIR,
    MANIFEST,
    PIN,
    REJECTED,
    TURNS,
    TURNS_CACHE,
    atomic_write,
    ensure_private_dir,
    open_nofollow,
    read_fd,
    read_file,
    refuse_symlink,
    remove_file,
    sanitize,
    write_all,
)
from memfs.store.rejected import record_rejected

DURABILITY_MODES = ("buffered", "write", "fsync")
BUFFER_LIMIT = 64 * 1024
DEFAULT_MAX_EVENTS = 10_000
DEFAULT_MAX_LINE_BYTES = 16 * 1024 * 1024
DEFAULT_METADATA_INTERVAL = 0.05
PERSIST_SHARE = 10  # the coalescing interval is at least this many times the last persist's cost

TORN_TAIL = "torn-tail"  # the reason rejected.jsonl gives for an unterminated last line (§3.3)

SummaryHook = Callable[[Path, str, list], None]

log = logging.getLogger("memfs.store")

_BUFFERED, _WRITE, _FSYNC = range(3)
_MODE_CODES = {mode: i for i, mode in enumerate(DURABILITY_MODES)}
_TURN_STARTED = Kind.TURN_STARTED
# kinds whose line is a turn boundary whatever the state (SPEC §3.1), by Kind value
_BOUNDARY = tuple(k in (Kind.THREAD_COMPLETED, Kind.TURN_COMPLETED, Kind.TURN_FAILED) for k in Kind)
_time = time.time
_monotonic = time.monotonic
_write = os.write


@dataclass(slots=True)
class OpenReport:
    """How a session was opened: what fsck and the tests look at."""

    fast_path: bool = True
    reason: str = ""  # why a rescan was needed
    scanned_bytes: int = 0
    scanned_lines: int = 0
    skipped_lines: int = 0
    torn_tail_bytes: int = 0
    stale_marker: bool = False
    recovered_marker: bool = False
    index_source: str = ""  # fast path: "turns.json", or "turns.cache" (see memfs.store.meta)


def rescan(fd: int, file_len: int, report: OpenReport, status: str = "active") -> TurnState:
    """Rebuild the turn state from the log's bytes ``[0, file_len)``, numbering turns from 1.

    ``status`` is the session's status before the log's first line: it stands when no line of
    the log sets one (an open passes the old manifest's: the event that set it may have been
    evicted). Never fails on content: lines :func:`decode_stored` refuses are skipped (their
    bytes still advance offsets). Streams the file a chunk at a time: memory stays bounded by
    the chunk, the longest line and a few bytes per turn.
    """
    state = TurnState(status=status)
    ts = now_rfc3339()
    decode = decode_stored
    scanned = skipped = 0
    for offset, lines in scan_chunks(fd, 0, file_len):
        scanned += len(lines)
        for line in lines:
            end = offset + len(line) + 1
            decoded = decode(line)
            if decoded is None:
                skipped += 1
            else:
                apply(state, decoded[0], offset, end, ts)
            offset = end
    report.scanned_lines += scanned
    report.skipped_lines += skipped
    report.scanned_bytes = file_len
    return state


def _rescan_base(state: TurnState, old: ManifestRead | None, old_index: TurnIndex | None,
                 marker: CapMarker | None, file_len: int) -> int:
    """The ordinal of the first turn a rescan found, keeping ordinals stable (SPEC §3.7).

    In order of trust: a matching cap marker names it; else the rescan's first turn is looked
    up in the old index (by offset, shifted when the log is shorter than the manifest
    described — a cap rewrite whose marker was lost); else the old manifest's
    ``retained_turn_base``; else 1. In every case ``turn_count`` never decreases, so an emptied
    log continues at ``turn_count + 1``.
    """
    closed = len(state.index) - (1 if state.in_turn else 0)
    manifest = old.manifest if old is not None else None
    base = None
    if marker is not None and marker.matches(file_len):
        base = marker.retained_turn_base
    elif len(state.index) and old_index is not None and len(old_index):
        shift = 0
        if manifest is not None and file_len < manifest.persisted_file_len:
            shift = manifest.persisted_file_len - file_len
        first = state.index.start[0] + shift
        i = bisect.bisect_left(old_index.start, first)
        if i < len(old_index) and old_index.start[i] == first:
            base = old_index.base + i
    if base is None and old is not None and old.has_base:
        base = manifest.retained_turn_base
    if base is None:
        base = 1
    if old is not None and old.has_turn_count:
        base = max(base, manifest.turn_count - closed + 1)
    return max(base, 1)


def _closing_lines(fd: int, start: int, end: int) -> Iterator[tuple[int, bytes]]:
    """scan_lines over a private ``fd`` that is closed when the iteration ends, is closed or
    is collected (primed once by its creator, so even an unused iterator closes it)."""
    try:
        yield None  # type: ignore[misc]
        yield from scan_lines(fd, start, end)
    finally:
        os.close(fd)


class _Shared:
    """One open session in this process, shared by all of its handles."""

    __slots__ = ("dir", "read_only", "durability", "mode", "max_events", "max_line_bytes", "summary_hook",
                 "metadata_interval", "persist_gap", "mutex", "refs", "key", "pending", "persist_lock",
                 "snapshots", "written_seq", "last_persist", "last_change", "closed", "version",
                 "persisted_version", "appended", "call_start", "in_batch", "mark_at", "rewrites", "dropped",
                 "cache_on_disk", "_sync_cv", "_syncing", "fd", "lock_file", "report", "session_id",
                 "created_at", "updated_at", "state", "flushed_len", "synced", "persist_at", "updated_for", "last_refusal")

    def __init__(self, session_dir: Path, session_id: str, *, read_only: bool, durability: str,
                 max_events: int, max_line_bytes: int, summary_hook: SummaryHook | None,
                 metadata_interval: float):
        self.dir = session_dir
        self.read_only = read_only
        self.durability = durability
        self.max_events = max_events
        self.max_line_bytes = max_line_bytes
        self.summary_hook = summary_hook
        self.mode = _MODE_CODES[durability]
        self.metadata_interval = metadata_interval
        self.persist_gap = metadata_interval  # the coalescing interval in force (see module doc)
        self.mutex = threading.RLock()
        self.refs = 1
        self.key: tuple[int, int] | None = None
        self.pending = bytearray()
        # Metadata writers (a persist under ``mutex``, or the persister thread's after its
        # snapshot) hold ``persist_lock`` from the log's fdatasync to the manifest's rename.
        # Lock order: ``mutex``, then ``persist_lock``, then ``_sync_cv`` — never the reverse.
        self.persist_lock = threading.Lock()
        self.snapshots = 0  # metadata snapshots taken (under ``mutex``): their sequence numbers
        self.written_seq = 0  # the newest snapshot on disk (under ``persist_lock``); _RETIRED once closed
        self.last_persist = 0.0
        self.last_change = _time()
        self.updated_for = 0.0
        self.last_refusal: str | None = None  # the reason of the last line refused in this process
        self.closed = False
        self.version = 0  # bumped on every change; a cheap staleness check for views
        self.persisted_version = 0  # ``version`` the metadata on disk describes (set under ``persist_lock``)
        self.appended = 0  # records added by this process, ever (counts what a mark covers)
        self.call_start = 0  # ``appended`` when the current batch call began
        self.in_batch = False  # a batch call is running: writes re-mark (see :meth:`mark`)
        self.mark_at: tuple = ()  # the state a failed write returns to (see :meth:`mark`)
        self.rewrites = 0  # bumped when the file is rewritten (cap): offsets changed meaning
        self.dropped = 0  # bytes cut from the front by this process's cap rewrites
        self.cache_on_disk = False
        self._sync_cv = threading.Condition(threading.Lock())
        self._syncing = False
        self.fd: int | None = None
        self.lock_file = None if read_only else liveness.acquire(session_dir)
        try:
            self._open(session_id)
        except BaseException:
            self._release_files()
            raise

    # --- opening ---------------------------------------------------------------------------

    def _open(self, session_id: str) -> None:
        events = self.dir / EVENTS
        refuse_symlink(self.dir / INDEX_DIR)
        if self.read_only:
            try:
                self.fd = open_nofollow(events, os.O_RDONLY)
            except FileNotFoundError:
                self.fd = None
        else:
            self._assert_private_files()
            self.fd = open_nofollow(events, os.O_RDWR | os.O_APPEND | os.O_CREAT)
        file_len = os.fstat(self.fd).st_size if self.fd is not None else 0
        report = self.report = OpenReport()
        if not self.read_only:
            file_len = self._repair_torn_tail(file_len)

        old = old_index = marker = None
        try:
            old = read_manifest(read_file(self.dir / MANIFEST), session_id)
        except FileNotFoundError:
            pass
        try:
            marker = CapMarker.parse(read_file(self.dir / CAP_MARKER))
            if marker is None:
                marker = CapMarker(-1, -1, 1)  # unreadable: stale
        except FileNotFoundError:
            pass
        self.cache_on_disk = os.path.lexists(self.dir / TURNS_CACHE)
        old_index = self._read_index(prefer_cache=old is not None and old.complete)

        manifest = old.manifest if old is not None else None
        reason = ""
        if old is None:
            reason = "manifest missing or unreadable"
        elif not old.complete:
            reason = "manifest incomplete"
        elif old_index is None:
            reason = "turn index missing or unreadable"
        elif manifest.persisted_file_len != file_len:
            reason = f"log is {file_len} bytes, metadata describes {manifest.persisted_file_len}"
        elif not old_index.consistent_with(manifest, file_len):
            reason = "turn index inconsistent with manifest"
        elif marker is not None and marker.matches(file_len):
            reason = "cap rewrite was in flight"

        now = now_rfc3339()
        self.session_id = manifest.session_id if manifest is not None else session_id
        self.created_at = manifest.created_at if manifest is not None else now
        self.updated_at = manifest.updated_at if manifest is not None else now

        if not reason:
            if manifest.in_turn:
                old_index.mark_last_open()
            elif not len(old_index):  # an empty index does not say where numbering goes on
                old_index.rebase(manifest.retained_turn_base)
            self.state = TurnState(old_index, manifest.turn_count, manifest.event_count,
                                   manifest.status, manifest.in_turn)
        else:
            report.fast_path = False
            report.reason = reason
            report.index_source = ""
            status = manifest.status if manifest is not None else "active"
            state = rescan(self.fd, file_len, report, status) if self.fd is not None else TurnState(status=status)
            if marker is not None and marker.matches(file_len):
                report.recovered_marker = True
            renumber(state, _rescan_base(state, old, old_index, marker, file_len))
            self.state = state
        self.flushed_len = self.synced = file_len
        self.persist_at = file_len + BUFFER_LIMIT
        if not self.read_only:
            if reason:
                self.persist()
            if marker is not None:
                report.stale_marker = not report.recovered_marker
                remove_file(self.dir / CAP_MARKER)

    def _assert_private_files(self) -> None:
        """Re-assert 0600 on the session's files and refuse any that is a symlink (§1)."""
        for name in (MANIFEST, TURNS, TURNS_CACHE, REJECTED, CAP_MARKER, PIN):
            assert_private_file(self.dir / name)

    def _read_index(self, prefer_cache: bool) -> TurnIndex | None:
        """The turn index on disk: from ``turns.cache`` when it was written after the current
        ``turns.json``, else by parsing ``turns.json``; None when neither is usable."""
        path = self.dir / TURNS
        if prefer_cache and self.cache_on_disk:
            index = None
            try:
                st = refuse_symlink(path)
                if st is not None:
                    key = file_key(st)
                    index = TurnIndex.from_cache(read_file(self.dir / TURNS_CACHE), key)
            except FileNotFoundError:
                pass
            if index is not None:
                index.set_json_source(lambda: _read_if_unchanged(path, key))
                self.report.index_source = "turns.cache"
                return index
        try:
            index = TurnIndex.parse(read_file(path))
        except FileNotFoundError:
            return None
        self.report.index_source = "turns.json"
        return index

    def _repair_torn_tail(self, file_len: int) -> int:
        """Move an unterminated last line to ``rejected.jsonl`` and truncate it away."""
        if file_len == 0 or os.pread(self.fd, 1, file_len - 1) == b"\n":
            return file_len
        pos = file_len
        while pos > 0:
            lo = max(0, pos - CHUNK)
            nl = os.pread(self.fd, pos - lo, lo).rfind(b"\n")
            if nl >= 0:
                pos = lo + nl + 1
                break
            pos = lo
        tail = os.pread(self.fd, file_len - pos, pos)
        record_rejected(self.dir, tail, TORN_TAIL, "EIO")
        os.ftruncate(self.fd, pos)
        os.fsync(self.fd)
        self.report.torn_tail_bytes = len(tail)
        return pos

    # --- appending -------------------------------------------------------------------------

    @property
    def file_len(self) -> int:
        return self.flushed_len + len(self.pending)

    def check_line(self, raw: bytes, pid: int | None, record: bool = True) -> Record:
        """Validate one line; a refused line raises, and goes to ``rejected.jsonl`` when
        ``record`` is true."""
        if self.read_only:
            raise ReadOnlySession("session is open read-only")
        if self.closed:
            raise SessionClosed("session handle is closed")
        if type(raw) is not bytes:
            raw = _as_bytes(raw)
        if len(raw) > self.max_line_bytes:
            err: ValidationError = LineTooLong(
                f"line is {len(raw)} bytes, over the limit of {self.max_line_bytes} (max_line_bytes)")
        else:
            try:
                return parse_line(raw)
            except ValidationError as exc:
                err = exc
        if record:
            self.refuse(raw, err, pid)
        raise err

    def refuse(self, raw: bytes, err: ValidationError, pid: int | None) -> None:
        """Record a refused line in ``rejected.jsonl`` (SPEC §3.8)."""
        reason = str(err)
        record_rejected(self.dir, raw, reason, err.errno_name, pid)
        self.last_refusal = reason

    def add(self, record: Record) -> None:
        """Add one record of a batch call (caller holds ``mutex`` and called :meth:`begin`);
        bytes go to ``pending`` and are written at boundaries, 64 KiB and :meth:`commit`."""
        line = record[0]
        pending = self.pending
        offset = self.flushed_len + len(pending)
        end = offset + len(line) + 1
        pending += line
        pending += b"\n"
        self.appended += 1
        kind = record[3]
        boundary = apply(self.state, kind, offset, end, now_rfc3339() if kind is _TURN_STARTED else "")
        self.version += 1
        if boundary or len(pending) >= BUFFER_LIMIT:
            self.write_pending()
            self.request_persist()
        elif end >= self.persist_at and not self.mode:  # (64 KiB: buffered mode only)
            self.request_persist()

    def commit(self) -> int:
        """End of one batch call: honour the durability mode; return the offset to sync to
        (``fsync`` mode) or 0."""
        mode = self.mode
        if mode == _BUFFERED:
            return 0
        self.write_pending()
        return self.dropped + self.flushed_len if mode == _FSYNC else 0

    def write_pending(self) -> None:
        """Write the buffered bytes; on failure cut the file back to what it held before."""
        if self.pending:
            self._write_out(self.pending)
            self.pending = bytearray()
        if self.in_batch:
            self.mark()

    def _write_out(self, data: bytes | bytearray) -> None:
        """Append ``data`` to the file whole, or raise with the file as it was."""
        try:
            n = _write(self.fd, data)
            if n != len(data):
                write_all(self.fd, memoryview(data)[n:])
        except OSError:
            # part of the bytes may be in the file: cut them, so the next append cannot
            # merge into a torn line (O_APPEND writes at the file's real end)
            os.ftruncate(self.fd, self.flushed_len)
            raise
        self.flushed_len += len(data)

    def durable(self) -> None:
        """Write the buffered bytes and return once the whole log is on disk."""
        self.write_pending()
        self.sync_to(self.dropped + self.flushed_len)

    def mark(self) -> None:
        """Remember the state as it is now (the log's bytes and ``pending`` describe it
        exactly): :meth:`rollback` returns here. O(1): ``apply`` only adds index entries and
        changes the last one, and a cap rewrite marks again once it has shifted the state."""
        s, index = self.state, self.state.index
        n = len(index)
        last = (index.end[-1], index.count[-1], index.outcome[-1]) if n else (0, 0, 0)
        self.mark_at = (len(self.pending), self.appended, s.turn_count, s.event_count, s.status, s.in_turn,
                        index.base, n, last)

    def rollback(self) -> int:
        """After a failed write: forget the lines added since the last mark (they are not in
        the file); return how many records of the current call the mark covers."""
        pending_len, appended, turn_count, event_count, status, in_turn, base, n, last = self.mark_at
        self.pending = self.pending[:pending_len]  # a copy: the failed write may still hold a view
        s, index = self.state, self.state.index
        if index.base != base or len(index) < n:  # cannot happen: a rewrite marks again
            raise RuntimeError("session state changed shape since its last mark")
        for column in (index.start, index.end, index.count, index.ts, index.outcome):
            del column[n:]
        if n:
            index.end[-1], index.count[-1], index.outcome[-1] = last
        s.turn_count, s.event_count, s.status, s.in_turn = turn_count, event_count, status, in_turn
        self.version += 1
        return appended - self.call_start

    def begin(self) -> None:
        """Start of one batch call (caller holds ``mutex``); :meth:`end` must follow."""
        if self.closed:
            raise SessionClosed("session handle is closed")
        self.last_change = _time()
        self.call_start = self.appended
        self.in_batch = True
        self.mark()

    def end(self) -> None:
        self.in_batch = False

    def sync_to(self, target: int) -> None:
        """Return once the file is durable up to ``target`` — a position counted from the
        session's first byte in this process, so that a cap rewrite in between (which makes
        everything durable) does not move it. Group commit: one caller runs ``fdatasync``
        while the others wait for it and share its result."""
        cv = self._sync_cv
        with cv:
            while self.synced < target:
                if self._syncing:
                    cv.wait()
                    continue
                self._syncing = True
                goal, fd = self.dropped + self.flushed_len, self.fd
                cv.release()
                try:
                    os.fdatasync(fd)
                finally:
                    cv.acquire()
                    self._syncing = False
                    cv.notify_all()
                self.synced = max(self.synced, goal)

    def replace_log(self, fd: int, cut: int) -> None:
        """A cap rewrite replaced the log by its bytes from ``cut`` on, durable and open as
        ``fd`` (caller holds ``mutex``; nothing is pending)."""
        with self._sync_cv:
            while self._syncing:  # a group-commit fdatasync may still use the old descriptor
                self._sync_cv.wait()
            old, self.fd = self.fd, fd
            self.dropped += cut
            self.flushed_len -= cut
            self.synced = max(self.synced, self.dropped + self.flushed_len)
        os.close(old)
        self.last_change = _time()
        self.version += 1
        self.rewrites += 1

    # --- metadata --------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.dir.name

    def request_persist(self) -> None:
        """Metadata should be persisted (a boundary, or 64 KiB since the last request; caller
        holds ``mutex``). ``metadata_interval`` 0: now, in this thread. Otherwise the persister
        thread does it, once the coalescing interval after the last persist has passed."""
        self.persist_at = self.file_len + BUFFER_LIMIT
        if self.metadata_interval:
            persister.schedule(self, self.last_persist + self.persist_gap)
            return
        self.write_pending()  # a failure here is the log's: it fails the append
        try:
            self.persist()
        except OSError as exc:
            # the lines are in the log; stale metadata only makes the next open rescan
            log.warning("%s: metadata not persisted (retried later): %s", self.dir.name, exc)
            persister.schedule(self, _monotonic() + persister.RETRY_SECONDS)

    def persist_due(self) -> float:
        """For the persister: no coalesced persist before this monotonic time."""
        return self.last_persist + self.persist_gap

    def manifest(self) -> Manifest:
        s = self.state
        if self.version and self.updated_for != self.last_change:  # formatting costs more than a stat
            self.updated_at = format_rfc3339(self.last_change)
            self.updated_for = self.last_change
        return Manifest(self.session_id, self.created_at, self.updated_at, s.turn_count, s.event_count,
                        s.status, s.in_turn, self.file_len, s.index.base)

    def persist(self) -> None:
        """Persist now, in this thread (caller holds ``mutex``): flush, then write the metadata
        (see :meth:`_write_metadata`). Waits for a persister-thread write in flight."""
        self.write_pending()
        self._write_metadata(self._snapshot())

    def persist_coalesced(self) -> None:
        """The persister thread's persist: ``mutex`` is held only to write the pending bytes
        and take a snapshot; the fdatasync and the atomic writes run after it is released, so
        appends go on meanwhile. Raises ``OSError`` (the persister logs it and retries)."""
        with self.mutex:
            if self.closed or self.fd is None:
                return
            if self.version == self.persisted_version and not self.pending:
                return  # a persist since the request (a flush, a cap rewrite) wrote this state
            self.write_pending()
            snapshot = self._snapshot()
        self._write_metadata(snapshot)

    def _snapshot(self) -> _Snapshot:
        """What the metadata of the state as it is now says (caller holds ``mutex``, nothing
        is pending). Cheap: the index's closed entries are not copied (see IndexSnapshot)."""
        self.snapshots += 1
        self.persist_at = self.file_len + BUFFER_LIMIT
        index = self.state.index
        return _Snapshot(self.snapshots, self.version, self.dropped + self.flushed_len, _monotonic(),
                         index.snapshot(cache=len(index) >= CACHE_MIN_ENTRIES), self.manifest().to_json())

    def _write_metadata(self, snap: _Snapshot) -> bool:
        """§3.2 order: the log durable up to the snapshot's length, then the index (and its
        cache), then the manifest that names the length they describe. Under ``persist_lock``,
        so writers of one session never interleave; a snapshot older than the metadata on disk
        (a persist under ``mutex`` came in between) is dropped, and so is every snapshot once
        the session is closed. Returns whether it wrote."""
        with self.persist_lock:
            if snap.seq <= self.written_seq:
                return False
            self.sync_to(snap.sync_target)
            ensure_private_dir(self.dir / INDEX_DIR)
            pieces = snap.index.json_pieces
            atomic_write(self.dir / TURNS, lambda fd: [write_all(fd, piece) for piece in pieces()])
            if snap.index.has_cache:
                data = snap.index.cache_bytes(file_key(os.lstat(self.dir / TURNS)))
                if data is not None:
                    atomic_write(self.dir / TURNS_CACHE, data)
                    self.cache_on_disk = True
            elif self.cache_on_disk:
                remove_file(self.dir / TURNS_CACHE)
                self.cache_on_disk = False
            atomic_write(self.dir / MANIFEST, snap.manifest)
            self.written_seq = snap.seq
            self.persisted_version = snap.version
            self.last_persist = now = _monotonic()
            if self.metadata_interval:
                self.persist_gap = max(self.metadata_interval, PERSIST_SHARE * (now - snap.taken))
        return True

    # --- closing ---------------------------------------------------------------------------

    def _release_files(self) -> None:
        try:
            if self.fd is not None:
                with self._sync_cv:
                    while self._syncing:
                        self._sync_cv.wait()
                    fd, self.fd = self.fd, None
                os.close(fd)
        finally:
            if self.lock_file is not None:
                lock_file, self.lock_file = self.lock_file, None
                liveness.release(lock_file)

    def shutdown(self) -> None:
        """Last handle closed (caller holds ``mutex``): flush, persist (whenever the metadata
        on disk does not describe the log), leave the persister's schedule, wait for its
        persist in flight, release the files and the lock."""
        try:
            if not self.read_only and self.fd is not None:
                with self.persist_lock:
                    pass  # a persister write in flight lands first: it may make this one moot
                if self.pending or self.version != self.persisted_version:
                    self.persist()
        finally:
            self.closed = True
            if not self.read_only:
                persister.cancel(self)
                with self.persist_lock:  # no metadata write of this session after this one
                    self.written_seq = _RETIRED
            self._release_files()


_RETIRED = float("inf")  # ``written_seq`` of a closed session: every snapshot is stale


@dataclass(slots=True)
class _Snapshot:
    """The metadata of one state of a session, taken under its ``mutex``, written after."""

    seq: int  # orders snapshots of one session: only a newer one may replace metadata on disk
    version: int  # the session's ``version`` it describes
    sync_target: int  # the log is made durable up to here first (``dropped + flushed_len``)
    taken: float  # monotonic time, to measure what the persist cost
    index: IndexSnapshot
    manifest: bytes


def _read_if_unchanged(path: Path, key: list[int]) -> bytes | None:
    """The bytes of ``path`` if it is still the file ``key`` identifies, else None."""
    try:
        fd = open_nofollow(path, os.O_RDONLY)
    except (OSError, SymlinkRefused):
        return None
    try:
        return read_fd(fd) if file_key(os.fstat(fd)) == key else None
    finally:
        os.close(fd)


_REGISTRY: dict[tuple[int, int], _Shared] = {}
_REGISTRY_LOCK = threading.Lock()
_STRENGTH = {mode: i for i, mode in enumerate(DURABILITY_MODES)}


class SessionHandle:
    """A handle on one session's log. Use as a context manager, or call :meth:`close`.

    Thread-safe; several handles in one process share one state.
    """

    __slots__ = ("_s", "_read_only", "_closed")  # read by append, which is compiled

    def __init__(self, shared: _Shared, read_only: bool):
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
    def open_report(self) -> OpenReport:
        """How the session was opened (fast path or rescan, and what the rescan found)."""
        return self._s.report

    @property
    def file_len(self) -> int:
        """Length of the log including bytes still buffered."""
        return self._s.file_len

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

    # appending

    def _writable(self) -> _Shared:
        if self._closed:
            raise SessionClosed("session handle is closed")
        if self._read_only:
            raise ReadOnlySession("session is open read-only")
        return self._s

    # append(line, pid=None): validate and append one event line (SPEC §2–§3). Every single
    # append of the library and of the filesystem runs it, so it is compiled: the rules it
    # follows are documented above and in memfs/store/_append.c, which calls back into this
    # module (and the one state machine) for everything but the straight path. It is
    # installed by _append.configure() at the end of this module.

    def append_many(self, lines: Iterable[bytes | str | dict], *, pid: int | None = None) -> int:
        """Append lines in order; return how many were accepted.

        Stops at the first refused line: the lines before it stay committed and the raised
        :class:`ValidationError` has ``accepted`` set to their count. A failed write raises
        ``OSError`` with ``accepted`` set to the lines that reached the file (the others are
        taken back). In ``fsync`` mode the whole batch shares one ``fdatasync``.
        """
        s = self._writable()
        accepted = 0
        sync_target = 0
        try:
            with s.mutex:
                s.begin()
                try:
                    try:
                        for line in lines:
                            record = s.check_line(line, pid)
                            s.add(record)
                            accepted += 1
                            if s.max_events and s.state.event_count > s.max_events:
                                enforce_cap(s)
                    finally:
                        if accepted:
                            sync_target = s.commit()
                except OSError as exc:
                    exc.accepted = accepted = s.rollback()
                    sync_target = s.commit() if accepted else 0
                    raise
                finally:
                    s.end()
        except (ValidationError, CapRewriteError) as exc:
            exc.accepted = accepted
            raise
        finally:
            if sync_target:
                s.sync_to(sync_target)
        return accepted

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

    def append_records(self, records: Iterable[Record]) -> None:
        """Append records that :meth:`validate` accepted, as one append call.

        A failed write raises ``OSError`` whose ``accepted`` counts the records that reached
        the file (the rest are taken back); a :class:`CapRewriteError` likewise carries
        ``accepted`` (those records are committed, the cap is retried after the next append).
        """
        s = self._writable()
        sync_target = 0
        try:
            with s.mutex:
                s.begin()
                try:
                    try:
                        for record in records:
                            s.add(record)
                            if s.max_events and s.state.event_count > s.max_events:
                                enforce_cap(s)
                    finally:
                        sync_target = s.commit()
                except OSError as exc:
                    exc.accepted = s.rollback()
                    sync_target = s.commit() if exc.accepted else 0
                    raise
                except CapRewriteError as exc:
                    exc.accepted = s.appended - s.call_start
                    raise
                finally:
                    s.end()
        finally:
            if sync_target:
                s.sync_to(sync_target)

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
            if not s.read_only:
                s.write_pending()
            end = s.flushed_len if size < 0 else min(s.flushed_len, offset + size)
            if s.fd is None or offset >= end:
                return b""
            return os.pread(s.fd, end - offset, offset)

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
            if not s.read_only:
                s.write_pending()
            limit = s.flushed_len if end is None else min(end, s.flushed_len)
            if s.fd is None:
                return iter(())
            fd = os.dup(s.fd)
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
        return f"<SessionHandle {self.name!r} {'ro' if self._read_only else self._s.durability}>"


# SessionHandle.append (compiled) works on the slots of both classes and calls back into these.
_append.configure(SessionHandle, _Shared, type(threading.RLock()), parse_line, apply, enforce_cap, now_rfc3339,
                  ValidationError, SessionClosed, CapRewriteError, _TURN_STARTED, _BOUNDARY, BUFFER_LIMIT, _FSYNC)


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
    if durability not in DURABILITY_MODES:
        raise ValueError(f"durability must be one of {', '.join(DURABILITY_MODES)}")
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
            if not read_only and _STRENGTH[durability] > _STRENGTH[shared.durability]:
                shared.durability, shared.mode = durability, _MODE_CODES[durability]
            return SessionHandle(shared, read_only)
        if read_only:
            shared = _Shared(session_dir, session_id, read_only=True, durability=durability,
                             max_events=0, max_line_bytes=max_line_bytes, summary_hook=None,
                             metadata_interval=metadata_interval)
            return SessionHandle(shared, True)
        shared = _Shared(session_dir, session_id, read_only=False, durability=durability,
                         max_events=max_events, max_line_bytes=max_line_bytes, summary_hook=summary_hook,
                         metadata_interval=metadata_interval)
        shared.key = key
        _REGISTRY[key] = shared
        return SessionHandle(shared, False)
