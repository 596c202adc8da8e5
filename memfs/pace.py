"""Background work gives way to the event loop (issue 14, (b): an idle session stays fast while
the mount's warm-up rescans and folds a large stale session).

The mount's warm-up (opening every session and indexing its memory view for search) is Python
work on a worker thread: a rescan and a fold of a large log hold the GIL for seconds of CPU.
The event loop shares the GIL with it, and every system call a request makes (reading
``/dev/fuse``, an ``lstat``, the reply) hands the GIL to the worker for up to the switch
interval, so requests slowed down while the warm-up ran (``scripts/bench_responsive.py`` (b)).
No switch interval, thread priority or sleep *inside* the requests' window fixes that on two
cores; the worker has to be off the GIL while requests are served.

So long loops call :func:`pace` between chunks of their work (:func:`memfs.store.lines.scan_chunks`
once per 256 KiB chunk — every rescan, tail and fold goes through it; the search index every
512 facts). On a thread that runs inside :func:`background`, it asks the thread's
:class:`Pacer`, which gives way while the foreground is busy; everywhere else it does nothing.

Decisions recorded here:

* **Busy** means the event loop's thread used CPU (``pthread_getcpuclockid``: its own CPU
  clock, read without touching the request path) since the pacer last looked, at least
  ``BUSY_NS``. Giving way, the background thread sleeps in steps of ``STEP`` and goes on after
  the first step the loop was idle. A loop serving requests without pause therefore holds
  background work back for as long as it does: the warm-up is idle-priority work, and what it
  has not done yet a request does itself when it needs it (the first search indexes the
  sessions it reads, as without a warm-up).
* **No priority inversion:** background work never gives way while a request is being served on
  a worker thread (:attr:`Pacer.hops`, counted by :meth:`Pacer.hop` on the thread that waits for
  it, the event loop). Such a request may be waiting
  for what the background thread holds — the session's open, its views' state, the search
  index — and must not wait for the loop to fall idle.
* After :meth:`Pacer.close` (unmounting) nothing gives way.
* The mount reports how often and how long background work gave way as the root's
  ``user.memfs.background_waits`` and ``user.memfs.background_waited_ms``.

**Worker threads run below the event loop** (:func:`lower_workers`, which the mount calls).
Pacing keeps background work off the GIL; it cannot keep disk work off the CPU, and some work
cannot give way, because a writer waits for it: with agents driving sessions through cap
rewrites, the rewrites' and persists' threads take CPU, mostly in the kernel, and on two cores
the event loop then waited for a CPU, not for the GIL (``bench_responsive.py`` (a)). So in the mount each worker thread lowers its own CPU priority by ``WORKER_NICE`` nice
levels (Linux: ``setpriority`` of a thread id affects that thread only) once, before its first
piece of work (:func:`worker_started`): request hops (``Operations.off_loop``), the warm-up,
the metadata persister and the store's background pool
(:func:`memfs.store.paths.in_background`). The loop then gets the CPU first when both want it,
and the workers still get what the loop leaves. Each also switches itself to Linux's
``SCHED_BATCH`` policy (:data:`WORKER_POLICY`): a batch thread that wakes does not preempt the
thread running on its CPU (the thread holding the interpreter lock, or just handed it, then
no longer waits in a queue behind other woken workers while the loop waits for the lock). The
writers make somewhat fewer turns (their rewrites' threads get less CPU: the trade is the
point). The nice level is absolute
(:func:`lower_workers` takes the event loop's and adds ``WORKER_NICE``): a worker started by a
lowered worker inherits its nice value, and lowering that again had put some at 19. Not lowered:
``fsync`` mode's syncer threads, which spend their time in ``fdatasync`` and whose wakeup is a
write's reply (as batch threads, ``fsync`` writers lost throughput). Raising a priority back needs a privilege, so a lowered thread
stays lowered; no process other than the mount lowers anything.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager

STEP = 0.001  # seconds a background thread sleeps between looks while it gives way
BUSY_NS = 20_000  # the loop used this much CPU since the last look: it is serving requests

WORKER_NICE = 10  # nice levels the mount's worker threads run below its event loop
WORKER_POLICY = getattr(os, "SCHED_BATCH", None)  # their scheduling policy (None: unchanged)

_local = threading.local()
_worker_level: int | None = None  # the nice value worker threads take (None: they keep theirs)


class Pacer:
    """When background threads give way: while :meth:`watch`'s thread (the event loop) is busy
    and no request is served on a worker thread. One per mount."""

    def __init__(self) -> None:
        self.clock: int | None = None  # the watched thread's CPU-time clock
        self.hops = 0  # requests being served on worker threads (changed under _lock: see hop)
        self._lock = threading.Lock()
        self.closed = False
        self.waits = 0  # times background work gave way
        self._waited_ns = 0  # for how long in all, the wait going on now left out
        self._since = 0  # time.monotonic_ns() when the wait going on now began (0: none)
        self._seen = 0  # the watched thread's CPU time at the last look

    def watch(self) -> None:
        """Watch the calling thread (the event loop's) from now on."""
        clock = time.pthread_getcpuclockid(threading.get_ident())
        self._seen = time.clock_gettime_ns(clock)
        self.clock = clock

    def close(self) -> None:
        self.closed = True

    @contextmanager
    def hop(self):
        """A request served on a worker thread while the calling thread (the event loop, or any
        other) waits for it: background work does not give way meanwhile."""
        with self._lock:
            self.hops += 1
        try:
            yield
        finally:
            with self._lock:
                self.hops -= 1

    def _busy(self) -> bool:
        try:
            cpu = time.clock_gettime_ns(self.clock)
        except OSError:  # (the watched thread ended: nothing to give way to)
            return False
        busy, self._seen = cpu - self._seen >= BUSY_NS, cpu
        return busy

    def give_way(self) -> None:
        """Return at once while the loop is idle; else sleep until it was idle for a step."""
        if self.clock is None or not self._busy() or self.closed or self.hops:
            return
        self._since = start = time.monotonic_ns()
        self.waits += 1
        while not self.closed and not self.hops:
            time.sleep(STEP)
            if not self._busy():
                break
        self._since = 0
        self._waited_ns += time.monotonic_ns() - start

    @property
    def waited_ns(self) -> int:
        """For how long background work gave way in all, the wait going on now included."""
        since = self._since
        return self._waited_ns + (time.monotonic_ns() - since if since else 0)


@contextmanager
def background(pacer: Pacer):
    """Run the body as background work of ``pacer`` on this thread: its :func:`pace` calls
    give way to the foreground."""
    _local.pacer = pacer
    try:
        yield
    finally:
        _local.pacer = None


def pace() -> None:
    """A point where long work may give way (see the module); nothing outside :func:`background`."""
    pacer = getattr(_local, "pacer", None)
    if pacer is not None:
        pacer.give_way()


def lower_workers(increment: int = WORKER_NICE) -> None:
    """From now on, worker threads run ``increment`` nice levels below the caller's priority
    (the event loop's; each when it calls :func:`worker_started`); see the module. The level is
    absolute: a thread started by a lowered thread inherits its nice value and is not lowered
    twice."""
    global _worker_level
    _worker_level = (min(19, os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) + increment)
                     if increment else None)


def worker_started() -> None:
    """Called by a worker thread before its work: lower this thread's CPU priority as
    :func:`lower_workers` asked, and switch it to :data:`WORKER_POLICY`, once per thread (a
    failure is ignored: the priority or the policy stays)."""
    level = _worker_level
    if level is None or getattr(_local, "lowered", False):
        return
    _local.lowered = True
    tid = threading.get_native_id()
    try:
        if os.getpriority(os.PRIO_PROCESS, tid) < level:
            os.setpriority(os.PRIO_PROCESS, tid, level)
    except OSError:
        pass
    if WORKER_POLICY is not None:
        try:
            if os.sched_getscheduler(tid) == os.SCHED_OTHER:  # (a real-time or idle thread stays as it is)
                os.sched_setscheduler(tid, WORKER_POLICY, os.sched_param(0))  # (Linux: this thread; its nice stays)
        except OSError:
            pass


def as_worker(fn, *args):
    """``fn(*args)`` after :func:`worker_started`: what a worker thread runs."""
    worker_started()
    return fn(*args)
