"""Writing ``events.jsonl`` through the mount: the one route of a ``write()`` (SPEC §6).

``Operations.write`` → :meth:`WritePath.write` → the handle's line splitter
(:class:`memfs.store.appender.LineAppender`) → :func:`memfs.store.writer.commit_call` (validate,
state machine, bytes, durability) → the count written. What differs between modes is only
*where* that step runs, decided once per ``write()``:

* on the event loop, the common case (a ``write``/``buffered``-mode append: a ``write()`` to
  the page cache);
* after its turn at the :class:`memfs.fs.gate.WriteGate`, when other requests wait in the kernel;
* on a worker thread when the store says the append may wait for the disk
  (:meth:`SessionWrites.may_block_append <memfs.store.writing.SessionWrites.may_block_append>`:
  taking the lock, a cap rewrite, an inline persist, a busy session);
* in cluster mode the splitter appends through the cluster session, which publishes with the
  fence and waits for JetStream's ack before the local commit — on a worker thread, except
  for one whole line per ``write()`` (the usual agent's append), which the loop publishes on
  its own NATS connection (:mod:`memfs.cluster.wire`) and, once acknowledged, appends through
  the same splitter with no other thread involved (:class:`PublishedTarget`).

In ``fsync`` mode the step commits without the sync, then the reply waits for the syncer
(:mod:`memfs.fs.syncer`).

Decisions recorded here (see also :mod:`memfs.fs.ops`): a pending fragment is validated at
``flush`` (each ``close()``), so the closing process sees ``EBADMSG``; when the log cannot take
it (``ENOSPC``) that ``close()`` fails and the fragment stays with the handle for a later
``close()`` of a duplicate descriptor, but ``release`` drops it (logged): a line reported as
failed is never appended later. A fragment ``release`` finds without a failed ``flush`` is
committed there.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, cast

from memfs.errors import MemfsError, ValidationError
from memfs.fs.errors import fail, log
from memfs.store.appender import LineAppender
from memfs.store.lines import LongLine
from memfs.store.session import SessionHandle

if TYPE_CHECKING:
    from memfs.fs.ops import OpenFile, Operations

# where a write()'s append runs (WritePath.write)
_LOOP, _GATE, _THREAD, _PUBLISH = range(4)


class _NotAcked(Exception):
    """The line the loop published was not acknowledged as the stream's next: the worker path
    sends it again (same fence and id: a publish that was in fact stored is deduplicated)."""


class PublishedTarget:
    """Cluster mode: what a handle's line splitter appends through — the cluster session
    (publish with the fence, wait for the ack, commit locally), except for the line the event
    loop has just published and had acknowledged (:meth:`WritePath._publish`), whose append
    commits that ack (:meth:`memfs.cluster.node.ClusterNode.finish_fast`). Like the cluster
    session, it ignores ``sync``."""

    __slots__ = ("cluster", "session", "inner", "acked")

    def __init__(self, cluster: Any, session: SessionHandle):
        self.cluster = cluster
        self.session = session
        self.inner = cluster.session(session)
        self.acked: tuple | None = None  # (replica, record, ack) of the line published on the loop

    @property
    def name(self) -> str:
        return self.session.name

    def validate(self, line: bytes) -> Any:
        return self.inner.validate(line)

    def reject(self, line: bytes | LongLine, error: ValidationError, *, pid: int | None = None) -> None:
        self.inner.reject(line, error, pid=pid)

    def append(self, line: bytes, pid: int | None = None, *, sync: bool = True) -> None:
        acked = self.acked
        if acked is None:
            self.inner.append(line, pid)
            return
        self.acked = None
        rep, record, ack = acked
        if not self.cluster.finish_fast(rep, self.session, record, ack):
            raise _NotAcked

    def append_records(self, records: Any, *, sync: bool = True) -> int:
        return self.inner.append_records(records)

    def drop_ack(self) -> None:
        """Release the claim of a published line that was not appended (nothing committed)."""
        acked, self.acked = self.acked, None
        if acked is not None:
            self.cluster.finish_fast(acked[0], self.session, acked[1], None)


class WritePath:
    """The writing side of the open files of a mount's :class:`~memfs.fs.ops.Operations`."""

    def __init__(self, ops: Operations):
        self.ops = ops  # its cluster, NATS connection, durability and gate are set at mount

    def open(self, handle: OpenFile, session: SessionHandle, flags: int, pid: int) -> None:
        """Make ``handle`` a writer of ``session`` (its session handle, opened for it)."""
        ops = self.ops
        session.writes.claim_writing()  # the lock, once taken, stays while this file is open
        handle.writing = True
        ops.ticks.untick(session.name)  # (after the claim: no new tick from now on)
        target: Any = session.writes
        limit, limit_name = ops.store.settings.max_line_bytes, "max_line_bytes"
        cluster = ops.cluster
        if cluster is not None:  # publish with the fence first, then the local commit
            target = PublishedTarget(cluster, session)
            if cluster.max_line < limit:  # a longer line, refused at once (no publish)
                limit, limit_name = cluster.max_line, cluster.limit_name
        # fsync mode: the loop commits, the syncer syncs (memfs.fs.syncer)
        deferred = ops.durability is not None and cluster is None and session.durability == "fsync"
        handle.appender = LineAppender(target, max_line_bytes=limit, pid=pid, sync=not deferred,
                                       limit_name=limit_name)
        handle.append_mode = bool(flags & os.O_APPEND)
        handle.next_off = session.file_len

    def write(self, handle: OpenFile, off: int, buf: bytes) -> Any:
        """The count of ``buf`` taken, or a coroutine that returns it (see the module)."""
        appender = handle.appender
        if appender is None:
            raise fail("EBADF")
        if self.ops.cluster is not None:
            where = _PUBLISH
        elif appender.sync and self.ops.gate.busy():  # other requests wait: they go first
            where = _GATE
        elif handle.session.writes.may_block_append(len(buf), buf.count(b"\n") + 1, sync=appender.sync):
            where = _THREAD
        elif appender.sync:
            return self._append(handle, off, buf)  # the common write: on the loop, no coroutine
        else:
            where = _LOOP
        return self._append_later(where, handle, off, buf)

    async def _append_later(self, where: int, handle: OpenFile, off: int, buf: bytes) -> int:
        n = None
        if where is _PUBLISH:
            n = await self._publish(handle, off, buf)
        elif where is _GATE:
            n = await self.ops.gate.turn(self._append_unless_waiting, handle, off, buf)
        elif where is _LOOP:
            n = self._append(handle, off, buf)
        if n is None:
            n = await self.ops.off_loop(self._append, handle, off, buf)
        if not handle.appender.sync:
            await self.ops.durability.durable(handle.session)
        return n

    def _append_unless_waiting(self, handle: OpenFile, off: int, buf: bytes) -> int | None:
        """:meth:`_append` on the loop, or None when it may wait for the disk (asked again at
        the gate's turn: another write may have brought the session to the cap meanwhile)."""
        if handle.session.writes.may_block_append(len(buf), buf.count(b"\n") + 1):
            return None
        return self._append(handle, off, buf)

    def _append(self, handle: OpenFile, off: int, buf: bytes) -> int:
        """The step every ``write()`` takes: the offset rule, then the handle's line splitter."""
        appender = handle.appender
        if handle.append_mode:
            return appender.write(buf)
        if off != handle.next_off and off != handle.session.file_len + len(appender.partial):
            raise fail("EPERM")  # only appending at the handle's own end or the log's; no overwrite
        n = appender.write(buf)
        handle.next_off = off + n
        return n

    async def _publish(self, handle: OpenFile, off: int, buf: bytes) -> int | None:
        """Cluster mode: one whole line at the handle's end, published on the loop's own NATS
        connection, then appended through the splitter, which commits the ack. None — nothing
        published, or nothing acknowledged, claim released — for anything unusual (no
        connection, the session held by the applier or another writer, a line to refuse, a
        commit that may block, a fence refusal, a timeout): the worker path handles it."""
        session, cluster, nats = handle.session, self.ops.cluster, self.ops.nats
        appender = handle.appender
        if (appender.partial or buf.find(b"\n") != len(buf) - 1 or not (handle.append_mode or off == handle.next_off)
                or nats is None or not nats.ready or len(buf) > cluster.max_line
                or session.writes.may_block_append(len(buf), 1)):  # (a longer line: refused on the worker path)
            return None
        rep = cluster.claim_fast(session.name)
        if rep is None:
            return None
        record = None
        ack = None
        try:  # under the replica's lock: against the state the fence names
            record = session.writes.validate(buf[:-1])
            ack = await nats.request(*cluster.fast_request(rep, record[0]))
        except ValidationError:  # refused: the worker path records and reports it
            pass
        finally:
            if ack is None:  # no reply in time, no connection, refused, or cancelled: only release
                cluster.finish_fast(rep, session, record, None)
        if ack is None:
            return None
        target = cast(PublishedTarget, appender.handle)  # (cluster mode: see open)
        target.acked = (rep, record, ack)
        try:
            return self._append(handle, off, buf)
        except _NotAcked:
            return None
        finally:
            target.drop_ack()

    async def flush(self, handle: OpenFile) -> None:
        """A ``close()``: commit the pending fragment as the final line (see the module)."""
        appender = handle.appender
        if appender is None or not appender.partial:
            return
        try:
            if self.ops.cluster is not None or handle.session.writes.may_block_append(len(appender.partial),
                                                                                      sync=appender.sync):
                await self.ops.off_loop(appender.close)
            else:
                appender.close()
        except OSError:
            handle.close_failed = bool(appender.partial)  # reported to the closing process
            raise
        handle.close_failed = False
        if not appender.sync:
            await self.ops.durability.durable(handle.session)

    def finish_fragment(self, handle: OpenFile) -> None:
        """At ``release`` (maybe on a worker thread): commit the last fragment, or drop it when
        its ``close()`` failed."""
        appender = handle.appender
        if appender is not None and appender.partial:
            if handle.close_failed:
                log.warning("release: final line of %s (%d bytes) dropped: its close() failed",
                            handle.session.name, len(appender.partial))
                appender.partial = bytearray()
            else:
                try:
                    appender.close()
                except MemfsError:
                    pass  # recorded in rejected.jsonl; nobody is left to tell
                except OSError as exc:  # release is not guarded: an escaping error ends the mount
                    log.warning("release: final line of %s lost: %s", handle.session.name, exc)
