"""The one commit path (SPEC §3.1–§3.2): validated records → state machine → bytes → durability.

Every append — one line from the library, a ``write()`` through the mount, a batch from the
CLI — goes through :func:`commit_call` (:func:`commit`, then the call's cap rewrite), under the
session's ``mutex``. For each record :func:`commit`

1. adds the line to the pending buffer (:class:`LogFile`), at the offset it will have;
2. folds it into the turn state with :func:`memfs.store.machine.apply`, the one state
   machine, which also says whether the line is a turn boundary;
3. at a boundary writes the pending bytes and asks for a metadata persist; at 64 KiB of
   pending bytes writes them (and, in ``buffered`` mode, asks for a persist);
4. when the cap is exceeded, decides and summarizes an eviction (:mod:`memfs.store.evict`);
   :func:`commit_call` rewrites the log for the call's evictions once, when the call ends.

At the end of the call the pending bytes are written unless the session is ``buffered``; in
``fsync`` mode the caller then waits for :meth:`LogFile.sync_to` *after* releasing the mutex,
so appends of several threads share one ``fdatasync`` (group commit).

Failures, one strategy for one line and for many:

* A failed write of log bytes (``ENOSPC``, ``EIO``): the file is cut back to its last complete
  write (:meth:`LogFile.write_pending`), and the state returns to the last *mark* — taken at the
  start of the call and after every successful write — so exactly the lines that did not
  reach the file are taken back, and a line reported as failed is never committed later. The
  ``OSError`` carries ``accepted``: the lines of this call that are in the log.
* A refused line (the records are validated lazily, so a batch stops at the first refusal):
  the lines before it stay committed; the ``ValidationError`` carries ``accepted``.
* A failed eviction after the lines were committed raises :class:`CapRewriteError` with
  ``accepted`` set; the log is untouched and the cap is tried again after the next append.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from _thread import LockType
from _thread import allocate_lock as _new_lock
from collections.abc import Iterable

from memfs.errors import CapRewriteError, ValidationError
from memfs.events import Kind, Record
from memfs.store.config import BUFFER_LIMIT
from memfs.store.evict import apply_evictions, enforce_cap
from memfs.store.machine import apply
from memfs.store.meta import now_rfc3339
from memfs.store.paths import in_background, syncs_deferred, syncs_kept, write_all

_log = logging.getLogger(__name__)
_TURN_STARTED = Kind.TURN_STARTED
_time = time.time
_write = os.write
_clock = time.perf_counter
_get_ident = threading.get_ident

#: The longest a sync waits for the appenders the last one covered (:meth:`LogFile.sync_to`),
#: in seconds; never longer than :data:`OWED_WAIT_SYNCS` times the last ``fdatasync`` either.
OWED_WAIT_MAX = 0.002
#: The wait for the owed appenders, in units of the last ``fdatasync``'s duration. Twice, so
#: that on a disk whose sync outlasts the appenders' turns the wait does not run out during
#: the sync that ends it (see :meth:`LogFile.sync_to`).
OWED_WAIT_SYNCS = 2.0


class LogFile:
    """The log as this process writes it: one descriptor, the pending bytes, durability.

    Positions come in two kinds: offsets in the current file (``flushed_len``, ``length``),
    and *sync positions* counted from the session's first byte in this process
    (``dropped + offset``), which a cap rewrite (cutting ``dropped`` bytes from the front)
    does not move.
    """

    __slots__ = ("fd", "flushed_len", "pending", "synced", "dropped", "syncs", "owed_waits", "owed_timeouts",
                 "_lock", "_cv", "_idle_waits", "_syncing", "_waiters", "_baton", "_owed", "_owed_wait", "_last_sync")

    def __init__(self, fd: int | None, length: int):
        self.fd = fd
        self.flushed_len = length  # bytes in the file
        self.pending = bytearray()  # accepted bytes not yet written (buffered mode, or mid-call)
        self.synced = length  # sync position known to be on disk
        self.dropped = 0  # bytes cut from the front by this process's cap rewrites
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)  # replace() waits on it for a sync to end
        self._idle_waits = 0  # threads waiting on _cv (notified only then: a sync ends once per fdatasync)
        self._syncing = False
        self._waiters: list = []  # (target, a held lock its sync_to caller waits to acquire)
        self._baton: list = []  # covered callers' locks, released one by one (the last first)
        self._owed: set = set()  # appenders' threads the next sync waits for (sync_to)
        self._owed_wait: LockType | None = None  # the lock of the waiter that times the wait for the owed appenders
        self._last_sync = 0.0  # seconds the last fdatasync of sync_to took
        self.syncs = 0  # fdatasyncs run by sync_to
        self.owed_waits = 0  # of them, how many waited for owed appenders first
        self.owed_timeouts = 0  # ... and how many of those waits ran out

    @property
    def length(self) -> int:
        """The log's length including pending bytes."""
        return self.flushed_len + len(self.pending)

    @property
    def position(self) -> int:
        """The sync position of the bytes written so far."""
        return self.dropped + self.flushed_len

    def write_pending(self) -> None:
        """Write the pending bytes to the file whole; on failure the file is cut back to what
        it held (no torn line stays for the next append to merge into: ``O_APPEND`` writes at
        the file's real end) and the bytes stay pending."""
        data = self.pending
        if not data:
            return
        try:
            n = _write(self.fd, data)
            if n != len(data):
                write_all(self.fd, memoryview(data)[n:])
        except OSError:
            os.ftruncate(self.fd, self.flushed_len)
            raise
        self.flushed_len += len(data)
        self.pending = bytearray()

    def sync_to(self, target: int, appender: bool = False) -> None:
        """Return once the file is durable up to sync position ``target``. Group commit: one
        caller runs ``fdatasync`` while the others wait for it and share its result. When it
        ends, only the callers it covered are woken, and one more to run the next sync (the
        others sleep on: waking every waiter made each take the interpreter lock in turn
        only to wait again). The covered callers are woken one by the other, oldest first
        (each, once it runs, wakes the next): woken at once, they queued for the interpreter
        lock together with the next sync's caller.

        ``appender``: the caller has just committed lines (:meth:`SessionHandle.append
        <memfs.store.session.SessionHandle.append>` and its kin) and is likely to append
        again soon. The appenders a sync covers, its own caller among them, are *owed*: the
        next sync waits for each of them to commit its next line, so that it covers them
        too, and the last of them to come runs it — at once, on the thread already running.
        The first appender to wait for the owed ones waits at most twice the last
        ``fdatasync``'s duration (:data:`OWED_WAIT_SYNCS`; never more than
        :data:`OWED_WAIT_MAX` seconds), then runs the sync without whoever has not come.
        That first waiter is usually the last sync's caller, back with its next line while
        the others are still coming; the sync the last of them runs covers its line and
        wakes it. A bound of once the last sync's duration could run out during that sync,
        waking the waiter only to wait again (a wakeup in the middle of each ``fdatasync``).
        Without the wait the threads fall into two groups that alternate — the one the last
        sync woke commits while the other one's sync runs — and each ``fdatasync`` covers
        about half of them. A lone appender owes nothing to itself and never waits; an
        appender that stops costs the next sync one bounded wait. Other callers (a persist,
        a cap rewrite, :meth:`durable`) never wait for the owed. The last owed appender runs
        the sync itself rather than waking a waiter that claimed it: that wake was a large
        part of a cycle. ``scripts/groupcommit_ref.c`` runs the same algorithm in C
        (``docs/performance.md``)."""
        lock = self._lock
        me = _get_ident()
        with lock:
            owed = self._owed
            if appender and me in owed:
                owed.discard(me)
            waited = False  # this caller's bounded wait for the owed appenders ran out
            while self.synced < target:
                if self._syncing or (appender and self._owed and not waited):
                    timed = not self._syncing and self._owed_wait is None  # the first to wait for the owed
                    waiter = _new_lock()
                    waiter.acquire()
                    if timed:
                        self._owed_wait = waiter
                        self.owed_waits += 1
                    entry = (target, waiter, me if appender else None)
                    self._waiters.append(entry)
                    lock.release()
                    try:  # released by _wake, or by the caller woken before
                        woken = waiter.acquire(True, min(self._last_sync * OWED_WAIT_SYNCS, OWED_WAIT_MAX)
                                               if timed else -1)
                        while not woken:  # ran out; while the last owed appender's sync runs, wait on for it
                            with lock:
                                if not self._syncing or entry not in self._waiters:
                                    break
                            woken = waiter.acquire()
                    except BaseException:
                        lock.acquire()
                        self._leave(entry)
                        raise
                    lock.acquire()
                    if self._owed_wait is waiter:
                        self._owed_wait = None
                    if not woken and not self._withdraw(entry):
                        waited = True
                    elif self._baton:  # wake the next caller the last sync covered
                        self._baton.pop().release()
                    continue
                self._syncing = True
                self._owed_wait = None  # the next sync's wait for its owed is timed afresh
                if waited and self._owed:  # whoever has not come is owed no longer
                    self.owed_timeouts += 1
                    self._owed = set()
                goal, fd = self.position, self.fd
                lock.release()
                try:
                    start = _clock()
                    if not syncs_deferred():  # (else: the deferred_sync's one sync covers it)
                        os.fdatasync(fd)
                    took = _clock() - start
                except BaseException:
                    lock.acquire()
                    self._syncing = False
                    self._wake(everyone=True)  # each tries for itself (and none is owed)
                    raise
                lock.acquire()
                self._syncing = False
                self._last_sync = took
                self.syncs += 1
                self.synced = max(self.synced, goal)
                self._wake(leader=me if appender else None)

    def _withdraw(self, entry: tuple) -> bool:
        """A waiter's bounded wait ran out (caller holds the lock): take it off the waiters and
        return False — or True when it was woken all the same (then it wakes the next one the
        baton holds, as a woken waiter does)."""
        try:
            self._waiters.remove(entry)
            return False
        except ValueError:
            pass
        if entry[1] in self._baton:
            self._baton.remove(entry[1])
        return True

    def _leave(self, entry: tuple) -> None:
        """A waiter leaves on an exception (caller holds the lock): what it would have done
        is handed on — waking the next covered caller, and timing or running the next sync
        (the first waiter is woken to see to it)."""
        if self._owed_wait is entry[1]:
            self._owed_wait = None
        if self._withdraw(entry) and self._baton:
            self._baton.pop().release()
        if self._waiters and not self._syncing:
            self._waiters.pop(0)[1].release()

    def _wake(self, everyone: bool = False, leader: int | None = None) -> None:
        """Wake the waiters the sync position covers, and the first of the rest to run the
        next sync unless one runs (caller holds the lock). After a sync of :meth:`sync_to`
        (``leader`` its caller's thread when it is an appender), the covered appenders are
        owed."""
        if self._idle_waits:
            self._cv.notify_all()  # replace() waiting for the sync to end
        waiters = self._waiters
        owed = {leader} if leader is not None else set()
        if not waiters:
            self._owed = owed
            return
        synced, keep, next_one = self.synced, [], self._syncing
        covered = []
        for target, waiter, ident in waiters:
            if everyone or target <= synced:
                covered.append(waiter)
                if ident is not None:
                    owed.add(ident)
            elif not next_one:
                waiter.release()
                next_one = True
            else:
                keep.append((target, waiter, ident))
        self._waiters = keep
        self._owed = owed if not everyone else set()
        if everyone:
            covered += self._baton
            self._baton = []
            for waiter in covered:
                waiter.release()
        elif covered:
            covered.reverse()  # popped from the end: the oldest first
            covered.pop().release()
            self._baton = covered + self._baton if self._baton else covered

    def begin_sync(self, target: int) -> tuple[int, int] | None:
        """None when durable up to sync position ``target``; else ``(fd, goal)`` for a caller
        that syncs ``fd`` itself and then calls :meth:`end_sync` (see
        :meth:`SessionWrites.begin_sync <memfs.store.writing.SessionWrites.begin_sync>`).
        ``fd`` is a duplicate, made under the lock :meth:`replace` takes before it closes the
        descriptor it replaces (so it is the log's), and the caller's to close."""
        with self._lock:
            if self.synced >= target or self.fd is None:
                return None
            return os.dup(self.fd), self.position

    def end_sync(self, goal: int) -> None:
        with self._lock:
            if goal > self.synced:
                self.synced = goal
                self._wake()

    def _wait_idle(self) -> None:
        """Wait until no ``fdatasync`` of :meth:`sync_to` runs (caller holds the lock)."""
        while self._syncing:
            self._idle_waits += 1
            try:
                self._cv.wait()
            finally:
                self._idle_waits -= 1

    def durable(self) -> None:
        """Write the pending bytes and return once the whole log is on disk."""
        self.write_pending()
        self.sync_to(self.position)

    def replace(self, fd: int, cut: int) -> None:
        """The log was replaced by its bytes from ``cut`` on, durable and open as ``fd``
        (caller holds the session's mutex; nothing is pending)."""
        with self._lock:
            self._wait_idle()  # a group-commit fdatasync may still use the old descriptor
            old, self.fd = self.fd, fd
            self.dropped += cut
            self.flushed_len -= cut
            self.synced = max(self.synced, self.position)
            if self._waiters:  # all of them covered now
                self._wake()
        in_background(os.close, old)  # the replaced file's last descriptor: closing it frees its blocks

    def reopen(self, fd: int | None, length: int) -> None:
        """The log is (again) the file open as ``fd``, ``length`` bytes long — read afresh from
        disk, as another process may have written it (nothing is pending). Sync positions keep
        growing: none of its bytes counts as synced by this process yet."""
        with self._lock:
            self._wait_idle()
            old, self.fd = self.fd, fd
            self.dropped = self.synced = self.dropped + self.flushed_len
            self.flushed_len = length
            if self._waiters:  # all of them covered now
                self._wake()
        if old is not None and old != fd:
            os.close(old)

    def close(self) -> None:
        """Close the descriptor once no ``fdatasync`` uses it."""
        if self.fd is None:
            return
        with self._lock:
            self._wait_idle()
            fd, self.fd = self.fd, None
        os.close(fd)


def _mark(s, accepted: int) -> tuple:
    """The state as it is now (the file's bytes and ``pending`` describe it exactly), and how
    many records of the call it covers: :func:`_rollback` returns here. O(1): ``apply`` only
    adds index entries and changes the last one."""
    state = s.state
    index = state.index
    n = len(index.start)
    last = (index.end[-1], index.count[-1], index.outcome[-1]) if n else None
    return (accepted, len(s.log.pending), state.turn_count, state.event_count, state.status, state.in_turn,
            index.base, n, last, s.last_change)


def _rollback(s, mark: tuple) -> int:
    """Forget the lines added since ``mark`` (they are not in the file); return how many
    records of the call the mark covers."""
    accepted, pending_len, turn_count, event_count, status, in_turn, base, n, last, s.last_change = mark
    s.log.pending = s.log.pending[:pending_len]  # a copy: the failed write may still hold a view
    state, index = s.state, s.state.index
    if index.base != base or len(index) < n:  # cannot happen: an eviction marks again
        raise RuntimeError("session state changed shape since its last mark")
    for column in (index.start, index.end, index.count, index.ts, index.outcome):
        del column[n:]
    if n:
        index.end[-1], index.count[-1], index.outcome[-1] = last
    state.turn_count, state.event_count, state.status, state.in_turn = turn_count, event_count, status, in_turn
    return accepted


def commit(s, records: Iterable[Record]) -> tuple[int, int]:
    """Append ``records`` to session ``s`` (caller holds ``s.mutex``); return ``(accepted,
    sync_target)`` — the caller must :meth:`LogFile.sync_to` ``sync_target`` (when not 0)
    after releasing the mutex. See the module docstring for what a failure leaves."""
    log, state, config = s.log, s.state, s.config
    max_events, writes_through = config.max_events, config.writes_through
    accepted = 0
    mark = _mark(s, 0)
    s.last_change = _time()  # before any persist of this call: updated_at is its time
    refused: ValidationError | CapRewriteError | None = None
    try:
        for record in records:
            line, kind = record[0], record[3]
            pending = log.pending
            offset = log.flushed_len + len(pending)
            end = offset + len(line) + 1
            pending += line
            pending += b"\n"
            accepted += 1
            s.version += 1
            if apply(state, kind, offset, end, now_rfc3339() if kind is _TURN_STARTED else ""):
                log.write_pending()
                mark = _mark(s, accepted)
                s.request_persist()
            elif len(pending) >= BUFFER_LIMIT:
                log.write_pending()
                mark = _mark(s, accepted)
                if not writes_through:  # the spec's 64 KiB persist is buffered mode's
                    s.request_persist()
            elif end >= s.persist_at and not writes_through:
                s.request_persist()  # 64 KiB since the last request, flushed by reads
            if max_events and state.event_count > max_events:
                log.write_pending()
                mark = _mark(s, accepted)
                try:
                    _enforce_cap(s)
                finally:
                    mark = _mark(s, accepted)
        if writes_through and accepted:
            log.write_pending()
    except (ValidationError, CapRewriteError) as exc:
        refused = exc  # the lines before it stay committed
        if writes_through and accepted:
            try:
                log.write_pending()
            except OSError as err:
                _failed_write(s, mark, err)
                raise
    except OSError as exc:
        _failed_write(s, mark, exc)
        raise
    s.appended += accepted
    if refused is not None:
        refused.accepted = accepted
        raise refused
    return accepted, (log.dropped + log.flushed_len if config.syncs and accepted else 0)


def commit_call(s, records: Iterable[Record]) -> tuple[int, int]:
    """One append call (caller holds ``s.mutex``): :func:`commit`, then one rewrite of the log
    for the evictions the call made (:func:`memfs.store.evict.apply_evictions`), also when the
    call ends in an error after one. A failed rewrite raises :class:`CapRewriteError` with
    ``accepted`` (the lines are committed; the cap is tried again after the next append), or
    is logged when the call already fails for another reason."""
    try:
        result = commit(s, records)
    except BaseException:
        if s.evicting is not None:
            try:
                with syncs_kept():
                    apply_evictions(s)
            except OSError as err:
                _log.warning("%s: event cap not applied: %s", s.dir.name, err)
        raise
    if s.evicting is not None:
        try:
            with syncs_kept():  # (its crash safety is the order of its own syncs: never deferred)
                apply_evictions(s)
        except OSError as exc:
            failure = CapRewriteError(f"event cap not applied: {exc}")
            failure.accepted = result[0]
            raise failure from exc
    return result


def _enforce_cap(s) -> None:
    """The cap, after the lines were committed: a failure is :class:`CapRewriteError`."""
    try:
        with syncs_kept():
            enforce_cap(s)
    except OSError as exc:
        raise CapRewriteError(f"event cap not applied: {exc}") from exc


def _failed_write(s, mark: tuple, exc: OSError) -> None:
    """A write of log bytes failed: take back what is not in the file; ``exc.accepted`` is what
    is (made durable first in ``fsync`` mode: it is acknowledged)."""
    accepted = exc.accepted = _rollback(s, mark)  # type: ignore[attr-defined]  # (module doc: OSError carries it)
    s.version += 1
    if accepted:
        s.appended += accepted
        if s.config.syncs:
            s.log.sync_to(s.log.position)
