"""The metadata persister: one daemon thread per process that writes the *coalesced* metadata
of every open session (SPEC §3.2), so that appends never wait for a persist's ``fdatasync``
and atomic writes.

A session asks for a persist with :func:`schedule` (at a turn boundary or after 64 KiB of
log, see :mod:`memfs.store.session`); the thread runs the persist once it is due. What a session
must provide (a :class:`memfs.store.session.Session`):

* ``closed`` — true once the session is shut down (it is then never scheduled again);
* ``name`` — for the log;
* ``persist_due()`` — the monotonic time before which a persist would come too soon (the
  coalescing interval after the last persist). A session popped earlier goes back into the
  schedule at that time, so a request may name any time;
* ``persist_coalesced()`` — persist now (it takes the session's lock only for a snapshot),
  raising ``OSError`` on failure.

A failing persist (``ENOSPC``, ``EIO``) never reaches an appender: it is logged at most once
every :data:`LOG_EVERY` seconds per session and retried :data:`RETRY_SECONDS` later. The
thread is a daemon, started on first use; a forked child starts with every :class:`Persister`
empty (the parent's thread is not there, and may have held its lock at the fork: a schedule
carried over would never run, and the lock never be free). At interpreter exit it
finishes the persist in flight (bounded wait) and starts no other. A session's own shutdown
does not wait here: :func:`cancel` only drops it from the schedule, and the session's persist
lock (held around every metadata write) makes its shutdown wait for a persist in flight.
"""

from __future__ import annotations

import atexit
import heapq
import itertools
import logging
import os
import threading
import time
import weakref

from memfs.pace import worker_started

log = logging.getLogger("memfs.store")

RETRY_SECONDS = 1.0  # a failed persist is tried again this much later
LOG_EVERY = 60.0  # a persist that keeps failing is logged this often per session
EXIT_WAIT_SECONDS = 10.0  # at interpreter exit, how long a persist in flight may take to finish
THREAD_NAME = "memfs-persister"

_monotonic = time.monotonic


_instances: weakref.WeakSet = weakref.WeakSet()  # every Persister of this process


class Persister:
    """The schedule (a heap of due times, with the due time in force per session) and the
    thread that works through it.

    Generic over the work: ``due(session)`` is the time before which running it would come too
    soon, ``work(session)`` runs it and returns a monotonic time to run again at (or None);
    ``what`` names it in the log. The metadata persister is one instance; the idle release of
    liveness locks (:mod:`memfs.store.session`) is another."""

    def __init__(self, thread_name: str = "memfs-persister", due=None, work=None,
                 what: str = "persisting metadata of") -> None:
        self._name, self._what = thread_name, what
        self._due_of = due or (lambda session: session.persist_due())
        self._work = work or (lambda session: session.persist_coalesced())
        self._cv = threading.Condition(threading.Lock())
        self._due: dict = {}  # session -> due time in force (heap entries not matching are stale)
        self._heap: list = []  # (due, tie-breaker, session)
        self._order = itertools.count()
        self._busy = None  # the session being persisted
        self._logged: dict = {}  # session -> when its failure was last logged
        self._stopping = False
        self._thread: threading.Thread | None = None
        _instances.add(self)  # (emptied in a forked child: _after_fork)

    def schedule(self, session, due: float) -> None:
        """Persist ``session`` at monotonic time ``due`` (or earlier, when already scheduled
        earlier). Cheap: called under the session's lock at every turn boundary."""
        with self._cv:
            if session.closed or self._stopping:
                return
            current = self._due.get(session)
            if current is not None and current <= due:
                return
            self._due[session] = due
            heapq.heappush(self._heap, (due, next(self._order), session))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            elif self._heap[0][2] is session:
                self._cv.notify()

    def cancel(self, session) -> None:
        """Drop ``session`` from the schedule (it is closing). A persist of it in flight goes on:
        the session waits for it through its persist lock."""
        with self._cv:
            self._due.pop(session, None)
            self._logged.pop(session, None)

    def scheduled(self, session) -> bool:
        with self._cv:
            return session in self._due

    def idle(self, session) -> bool:
        """Neither scheduled nor being persisted (for tests)."""
        with self._cv:
            return session not in self._due and self._busy is not session

    def stop(self, timeout: float | None = None) -> bool:
        """Start no other persist and wait for the one in flight; False on timeout."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
            return self._cv.wait_for(lambda: self._busy is None, timeout)

    def _next(self):
        """Wait for the first due session and take it from the schedule (under ``_cv``)."""
        while True:
            if self._stopping:
                return None
            heap = self._heap
            while heap and self._due.get(heap[0][2]) != heap[0][0]:
                heapq.heappop(heap)  # cancelled, or scheduled again for another time
            if not heap:
                self._cv.wait()
                continue
            due, _, session = heap[0]
            now = _monotonic()
            if due > now:
                self._cv.wait(due - now)
                continue
            heapq.heappop(heap)
            del self._due[session]
            not_before = self._due_of(session)
            if not_before > now:  # done meanwhile (a flush, a cap rewrite): not yet
                self._due[session] = not_before
                heapq.heappush(heap, (not_before, next(self._order), session))
                continue
            self._busy = session
            return session

    def _run(self) -> None:
        worker_started()  # (in the mount: below its event loop; memfs.pace)
        while True:
            with self._cv:
                session = self._next()
                if session is None:
                    return
            again = None
            try:
                again = self._work(session)
            except Exception as exc:
                self._failed(session, exc)
            finally:
                with self._cv:
                    self._busy = None
                    self._cv.notify_all()
            if again is not None:
                self.schedule(session, again)

    def _failed(self, session, exc: Exception) -> None:
        """Log (rarely) and retry later; nothing reaches the appenders."""
        now = _monotonic()
        with self._cv:
            quiet = now - self._logged.get(session, -LOG_EVERY) < LOG_EVERY
            if not quiet and not session.closed:
                self._logged[session] = now
        if not quiet and not session.closed:
            if isinstance(exc, OSError):
                log.warning("%s %s: %s (retrying)", self._what, session.name, exc)
            else:
                log.error("%s %s (retrying)", self._what, session.name, exc_info=exc)
        self.schedule(session, now + RETRY_SECONDS)

    def _after_fork(self) -> None:
        """In a forked child: the parent's thread is gone and its lock may be held."""
        Persister.__init__(self, self._name, self._due_of, self._work, self._what)


_persister = Persister()
schedule = _persister.schedule
cancel = _persister.cancel
scheduled = _persister.scheduled
idle = _persister.idle


def _at_exit() -> None:
    _persister.stop(EXIT_WAIT_SECONDS)


def _after_fork_in_child() -> None:
    for instance in list(_instances):
        instance._after_fork()


atexit.register(_at_exit)
os.register_at_fork(after_in_child=_after_fork_in_child)
