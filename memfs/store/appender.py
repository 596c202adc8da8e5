"""A byte stream to validated appends: the write semantics of ``events.jsonl`` (SPEC §6).

One :class:`LineAppender` per writer (an open file handle of the filesystem, or the CLI's
input). A write may carry several lines and may end mid-line: the fragment is kept until its
``\\n`` arrives, so lines from two writers never interleave. Each complete line is validated;
the valid lines before the first invalid one are committed and the write reports only their
bytes (a short write). The caller's retry of the remainder then starts with the bad line,
which is refused (recorded in ``rejected.jsonl`` once, when the refusal is reported) — so
``cat`` and ``tee`` report "Bad message".

Failures of the store itself (decisions recorded here):

* A failed write of the log (``ENOSPC``, ``EIO``) takes nothing: the write raises that
  ``OSError`` and the fragment kept from earlier writes stays kept, so the writer's retry of
  the same bytes (once space is free) appends each line exactly once. When some lines of the
  write reached the log before the failure, the write is short instead, covering exactly
  those lines, and the retry of the remainder reports the error.
* A failed cap eviction after the lines were committed (the summary hook failed, or the
  rewrite hit ``ENOSPC``) does not fail the write: its lines are in the log and a retry would
  duplicate them. It is logged; the cap is tried again after the next append.
* A refused line whose refusal cannot be recorded (``rejected.jsonl`` unwritable) raises that
  ``OSError`` and takes nothing, like a failed log write.
"""

from __future__ import annotations

import logging
from typing import Protocol

from memfs.errors import CapRewriteError, ValidationError
from memfs.events import Record
from memfs.store.config import check_line_size
from memfs.store.lines import LongLine, split_lines

log = logging.getLogger("memfs.store")


class AppendTarget(Protocol):
    """What a :class:`LineAppender` appends through: a session handle's
    :attr:`~memfs.store.session.SessionHandle.writes`, or the cluster's session
    (:class:`memfs.cluster.node.ClusterSession`)."""

    @property
    def name(self) -> str: ...

    def validate(self, line: bytes) -> Record: ...

    def reject(self, line: bytes | LongLine, error: ValidationError, *, pid: int | None = None) -> None: ...

    def append(self, line: bytes, pid: int | None = None, *, sync: bool = True) -> None: ...

    def append_records(self, records: list[Record], *, sync: bool = True) -> int: ...


class LineAppender:
    """Splits written bytes into lines and appends them to ``handle`` (an :class:`AppendTarget`)."""

    __slots__ = ("handle", "max_line_bytes", "limit_name", "pid", "partial", "sync")

    def __init__(self, handle: AppendTarget, *, max_line_bytes: int, pid: int | None = None, sync: bool = True,
                 limit_name: str = "max_line_bytes"):
        self.handle = handle
        self.max_line_bytes = max_line_bytes
        self.limit_name = limit_name  # where ``max_line_bytes`` comes from, for the reason of a refusal
        self.pid = pid
        self.sync = sync  # False: in ``fsync`` mode, the caller waits for durability (SessionWrites.begin_sync)
        self.partial = bytearray()  # an unterminated line: earlier writes' bytes

    def write(self, data: bytes) -> int:
        """Append the complete lines of ``partial + data``; return how many bytes of ``data``
        were taken (all of them unless a line was refused or the log could not take more).

        Raises the :class:`ValidationError` when the first line it would commit is refused;
        that line (with the fragment before it) is recorded and dropped. The common write,
        exactly one whole line with no fragment held, is the handle's single append (same
        rules, less work than splitting and batching); every other write is
        :meth:`_write_lines`.
        """
        if not self.partial and data and data.find(b"\n") == len(data) - 1:
            try:
                self.handle.append(data[:-1], self.pid, sync=self.sync)
            except (OSError, CapRewriteError) as exc:
                if not getattr(exc, "accepted", 0):
                    raise
                # a failure after the line was accepted: a retry would duplicate it
                log.warning("%s: line appended, then: %s", self.handle.name, exc)
            return len(data)
        return self._write_lines(data)

    def _write_lines(self, data: bytes) -> int:
        """:meth:`write` for any write but one whole line with no fragment held."""
        if b"\n" not in data:  # a fragment: kept in place (linear), never past the limit
            size = len(self.partial) + len(data)
            if size > self.max_line_bytes:
                long = LongLine(self.partial)  # (its first 4 KiB, length and hash: the refusal's record)
                long.update(data)
                try:
                    check_line_size(size, self.max_line_bytes, self.limit_name)
                except ValidationError as exc:
                    self._refuse(long, exc)
            self.partial += data
            return len(data)
        buf = bytes(self.partial) + data if self.partial else data
        carried = len(self.partial)
        lines, cut = split_lines(buf)

        records: list[Record] = []
        ends: list[int] = []  # where each validated line ends in ``buf`` (its \n included)
        end = 0
        for line in lines:
            try:
                records.append(self.handle.validate(line))
            except ValidationError as exc:
                if records:
                    break  # a short write: the retry will report this line
                self._refuse(line, exc)
            end += len(line) + 1
            ends.append(end)
        taken = self._commit(records, ends)
        if taken < cut or len(buf) - cut > self.max_line_bytes:
            self.partial = bytearray()  # a short write: the writer's retry brings the rest
            return taken - carried
        self.partial = bytearray(buf[cut:])
        return len(data)

    def close(self) -> None:
        """Validate a pending fragment as the final line; raise if it is refused (or if the
        log cannot take it: then it stays pending, and a later close may retry)."""
        if not self.partial:
            return
        fragment = bytes(self.partial)
        try:
            record = self.handle.validate(fragment)
        except ValidationError as exc:
            self._refuse(fragment, exc)
        self._commit([record], [len(fragment)])
        self.partial = bytearray()

    def _commit(self, records: list[Record], ends: list[int]) -> int:
        """Append ``records``; return the bytes of the buffer that are now committed."""
        try:
            self.handle.append_records(records, sync=self.sync)
        except (OSError, CapRewriteError) as exc:
            accepted = getattr(exc, "accepted", 0)
            if not accepted:
                raise
            log.warning("%s: %d of %d line(s) appended, then: %s", self.handle.name, accepted, len(records), exc)
            return ends[accepted - 1]
        return ends[-1]

    def _refuse(self, line: bytes | LongLine, error: ValidationError) -> None:
        """Record the refused line, drop the fragment it included, raise ``error``."""
        self.handle.reject(line, error, pid=self.pid)  # an OSError here keeps the fragment
        self.partial = bytearray()
        raise error

