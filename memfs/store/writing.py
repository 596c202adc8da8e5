"""The writing half of a session handle (:attr:`SessionHandle.writes
<memfs.store.session.SessionHandle.writes>`).

Appending validates each line (a refusal goes to ``rejected.jsonl``, SPEC §3.8), then commits
through :func:`memfs.store.writer.commit_call`, the one commit path, as the session's writer:
the first change takes the liveness lock (:meth:`Session.acquire
<memfs.store.session.Session.acquire>`). Claims of :meth:`SessionWrites.claim_writing` keep
that lock while a file is open for writing; callers that run ``fdatasync`` off an event loop
use :meth:`SessionWrites.begin_sync` / :meth:`SessionWrites.end_sync`.

The half also holds the handle's permissions: ``read_only``, and ``closed`` once the handle
was closed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import orjson

from memfs.errors import ReadOnlySession, SessionClosed, ValidationError
from memfs.events import Record, parse_line
from memfs.store.config import BUFFER_LIMIT, check_line_size
from memfs.store.lines import LongLine
from memfs.store.reading import is_free
from memfs.store.rejected import record_rejected
from memfs.store.writer import commit_call

if TYPE_CHECKING:
    from memfs.store.session import Session


class SessionWrites:
    """What a handle changes: appends, refusals, caller-run durability and the claims that
    keep the liveness lock. Thread-safe; shared state is the
    :class:`~memfs.store.session.Session`'s."""

    __slots__ = ("_s", "read_only", "closed")

    def __init__(self, shared: Session, read_only: bool):
        self._s = shared
        self.read_only = read_only
        self.closed = False  # the handle was closed

    def _writable(self) -> Session:
        if self.closed:
            raise SessionClosed("session handle is closed")
        if self.read_only:
            raise ReadOnlySession("session is open read-only")
        return self._s

    @property
    def name(self) -> str:
        """The session's folder name (what a writer's log messages name)."""
        return self._s.name

    # --- appending -------------------------------------------------------------------------

    def check_line(self, raw, pid: int | None, record: bool = True) -> Record:
        """Validate one line; a refused line raises, and goes to ``rejected.jsonl`` when
        ``record`` is true."""
        s = self._s
        if s.closed:
            raise SessionClosed("session handle is closed")
        if type(raw) is not bytes:
            raw = _as_bytes(raw)
        try:
            if len(raw) > s.config.max_line_bytes:
                check_line_size(len(raw), s.config.max_line_bytes)
            return parse_line(raw)
        except ValidationError as err:
            if record:
                self.reject(raw, err, pid=pid)
            raise

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
        if self.closed or self.read_only:
            self._writable()  # raises the reason
        s = self._s
        record = self.check_line(line, pid)
        mutex = s.mutex
        mutex.acquire()  # not ``with``: its machinery is a noticeable part of a commit
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
        if self.closed or self.read_only or s.closed:
            return False
        if s.lock_file is None or not is_free(s):
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
        self._writable()
        check = self.check_line
        return self._commit(check(line, pid) for line in lines)

    def validate(self, line: bytes) -> Record:
        """Validate one line without appending or recording it (for callers that decide
        later whether a refusal is reported, like the filesystem's short writes)."""
        self._writable()
        return self.check_line(line, None, record=False)

    def append_records(self, records: Iterable[Record], *, sync: bool = True) -> int:
        """Append records that :meth:`validate` accepted, as one append call; return how many.

        A failed write raises ``OSError`` whose ``accepted`` counts the records that reached
        the file (the rest are taken back); a :class:`CapRewriteError` likewise carries
        ``accepted`` (those records are committed, the cap is retried after the next append).
        ``sync`` as for :meth:`append`.
        """
        self._writable()
        return self._commit(records, sync)

    def _commit(self, records: Iterable[Record], sync: bool = True) -> int:
        """Append records (see :func:`memfs.store.writer.commit`), as the writer; return how many.
        ``sync`` False: return without the ``fdatasync`` of ``fsync`` mode (the caller makes
        the lines durable itself, see :meth:`begin_sync`)."""
        s = self._s
        with s.mutex:
            if s.lock_file is None:
                s.acquire()
            accepted, sync_target = commit_call(s, records)
        if sync_target and sync:
            s.log.sync_to(sync_target, appender=True)
        return accepted

    # --- refusals --------------------------------------------------------------------------

    def reject(self, line: bytes | LongLine, error: ValidationError, *, pid: int | None = None,
               stream_seq: int | None = None) -> None:
        """Record a refused line in ``rejected.jsonl`` (SPEC §3.8; ``stream_seq``: a cluster
        stream's line; a :class:`~memfs.store.lines.LongLine`: one streamed past, not held)."""
        reason = str(error)
        record_rejected(self._s.dir, line, reason, error.errno_name, pid, stream_seq)
        self._s.last_refusal = reason

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

    # --- the liveness lock (SPEC §3.5) -----------------------------------------------------

    def lock(self, new_log_metadata: bool = True) -> None:
        """Become the session's writer now, before any change: take the liveness lock (kept
        until the session is idle, see :class:`~memfs.store.session.Session`) and repair what
        the open found (a torn tail, metadata to rebuild). :class:`~memfs.errors.SessionBusy`
        names the process that holds it. ``new_log_metadata`` False: an empty log's metadata
        is left to the first persist (the caller appends at once)."""
        s = self._writable()
        with s.mutex:
            s.acquire(new_log_metadata)

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
    def writing(self, lock: bool = False) -> Iterator[SessionWrites]:
        """:meth:`claim_writing` for the duration of a ``with`` block."""
        self.claim_writing(lock)
        try:
            yield self
        finally:
            self.end_writing()


def _as_bytes(line: bytes | str | dict) -> bytes:
    if isinstance(line, (bytes, bytearray, memoryview)):
        return bytes(line)
    if isinstance(line, str):
        return line.encode("utf-8", "surrogatepass")
    if isinstance(line, dict):
        return orjson.dumps(line)
    raise TypeError(f"append takes bytes, str or dict, not {type(line).__name__}")
