"""The reading half of a session handle (:attr:`SessionHandle.reads
<memfs.store.session.SessionHandle.reads>`), and :class:`LogReader`.

Reading never takes the liveness lock (SPEC §3.5): each read first catches the shared
:class:`~memfs.store.session.Session` up with the log on disk
(:func:`memfs.store.recovery.follow`) unless this process is the writer, then answers from
its state under the session's ``mutex``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from memfs.errors import TurnNotFound
from memfs.events import decode_stored
from memfs.store import persister
from memfs.store.lines import scan_lines, split_lines
from memfs.store.recovery import follow

if TYPE_CHECKING:
    from memfs.store.session import Session


def is_free(s: Session) -> bool:
    """No thread holds ``s``'s mutex now (see :meth:`SessionReads.free`)."""
    mutex = s.mutex
    if mutex.acquire(False):
        mutex.release()
        return True
    return False


class SessionReads:
    """What a handle reads: the live manifest, turn index and turn times, the log's bytes and
    lines, and readers that keep one version of the log. Thread-safe; shared state is the
    :class:`~memfs.store.session.Session`'s."""

    __slots__ = ("_s",)

    def __init__(self, shared: Session):
        self._s = shared

    def _current(self) -> Session:
        """The shared session, caught up with the log on disk (caller holds its mutex)."""
        s = self._s
        if s.lock_file is None:
            follow(s)
        return s

    # --- the log's live state --------------------------------------------------------------

    @property
    def opening(self) -> object:
        """A token of this process's open of the session: byte offsets taken from the log are
        comparable while ``opening`` and :attr:`rewrites` stay the same (a closed and reopened
        session, or a log replaced by a cap rewrite, changes one of them)."""
        return self._s.opening

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
    def generation(self) -> tuple[int, int]:
        """Which version of the log file is current: it changes when the log is replaced (a cap
        rewrite here or seen from another process) and when the session is opened afresh. The
        filesystem gives each generation its own inode number (SPEC §3.7). Lock-free."""
        s = self._s
        return s.serial, s.rewrites

    @property
    def manifest(self) -> dict:
        """The live manifest: what ``manifest.json`` would say if persisted now."""
        with self._s.mutex:
            return self._current().manifest().to_dict()

    def manifest_json(self) -> bytes:
        """:attr:`manifest` as ``manifest.json``'s bytes."""
        with self._s.mutex:
            return self._current().manifest().to_json()

    @property
    def turn_index(self) -> list[dict]:
        """The live turn index entries (``index/turns.json``'s ``entries``)."""
        with self._s.mutex:
            return self._current().state.index.entries()

    def turn_index_json(self) -> bytes:
        """:attr:`turn_index` as ``index/turns.json``'s bytes."""
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
        ``writing`` (handles claiming to be writing, see
        :meth:`~memfs.store.writing.SessionWrites.writing`), ``syncs``
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
        return is_free(self._s)

    def hold(self) -> threading.RLock:
        """A context manager under which the log does not change: other threads' appends and
        cap rewrites wait until it exits. A reader's last resort against a log rewritten at
        nearly every append (a small cap under many writers); keep it short."""
        return self._s.mutex

    # --- the log's bytes -------------------------------------------------------------------

    def reader(self) -> LogReader:
        """A reader of the log as it is now: it keeps reading this version (its own descriptor)
        across cap rewrites, and never returns a fragment of a line (SPEC §3.7)."""
        with self._s.mutex:
            log_file = self._current().log
            log_file.write_pending()
            fd = os.dup(log_file.fd) if log_file.fd is not None else None
            return LogReader(self, fd, self.generation)

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
        for line in split_lines(data)[0]:
            decoded = decode_stored(line) if line else None
            if decoded is not None:
                events.append(decoded[1])
        return events

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


class LogReader:
    """One reader's view of the log (:meth:`SessionReads.reader`): its own descriptor of the
    version current when it was made. While that version is current, reads stop at the bytes
    the writer has completely written (never a fragment of a line); once a cap rewrite
    replaced it, the old version is immutable and is read to its end (a reader reopens the
    name to see the new version, as ``tail -F`` does). Close it."""

    __slots__ = ("reads", "fd", "generation")

    def __init__(self, reads: SessionReads, fd: int | None, generation: tuple[int, int]):
        self.reads, self.fd, self.generation = reads, fd, generation

    @property
    def current(self) -> bool:
        """This reader's version is the session's current log."""
        return self.reads.generation == self.generation

    def may_block(self) -> bool:
        """Whether :meth:`read` may wait: while its version is current, when bytes of this
        process are still buffered (written first), when the log's end is to be learnt from
        disk (this process is not the writer: another may have appended), or when another
        thread holds the session (a cap rewrite, say). An old version never waits."""
        if not self.current:
            return False
        s = self.reads._s
        return s.lock_file is None or bool(s.log.pending) or not is_free(s)

    def read(self, offset: int, size: int) -> bytes:
        """Bytes ``[offset, offset+size)`` of this version; whole lines only while it is current."""
        if self.fd is None:
            return b""
        s = self.reads._s
        end = -1
        if self.current:
            if s.lock_file is None or s.log.pending:
                with s.mutex:
                    self.reads._current().log.write_pending()
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
        yield None  # (the priming item: consumed by the creator, never by a reader)
        yield from scan_lines(fd, start, end)
    finally:
        os.close(fd)
