"""Writes give way to the other requests queued with them (issue 14: an idle session stays
fast while others write).

The kernel hands FUSE requests to the server in arrival order, one per read of ``/dev/fuse``
(pyfuse3's tasks read them). Agents append without pause: with four of them writing, the loop
is busy all the time, and a ``stat`` of an idle session waited in the kernel's queue behind
one ``write()`` of each writer, for each of the requests ``stat`` + ``cat`` make
(``scripts/bench_responsive.py``, (a)).

So a ``write()`` that finds requests waiting in the kernel (a ``poll`` of ``/dev/fuse``) while
requests other than writes were served in the last ``RECENT`` seconds waits for its turn at
the :class:`WriteGate`. The gate's task runs the waiting writes in arrival order on the event
loop, each once no request waits in the kernel, so that the requests read meanwhile — a
``lookup``, a ``getattr``, an ``open`` of a generated file — are served before it. After
``MAX_YIELDS`` passes that found requests waiting, the next write runs anyway: a stream of
requests cannot starve the writers.

Decisions recorded here:

* Only appends wait — the requests a busy agent sends without pause; an append that may wait
  for the disk goes to a worker thread as before (asked again when its turn comes: another
  write may have brought its session to the cap meanwhile).
* Writes alone are not gated: when only writes were served lately, the queued requests are
  other writers' writes, and letting them pass one another would only cost passes of the loop
  (concurrent writers lost much of their total rate that way). A write that finds
  the kernel's queue empty (one writer, an idle mount) goes at once; the gate costs it one
  ``poll`` at most.
* Nothing is lost or reordered within a writer: a ``write()`` is one request, answered after
  it ran; at unmount the gate runs every waiting write before it ends.
* Without ``/dev/fuse`` among the process's descriptors, nothing is gated. The mount's root
  reports how many writes waited as ``user.memfs.writes_gated``.
"""

from __future__ import annotations

import collections
import select
import time
from collections.abc import Callable

import outcome
import trio

MAX_YIELDS = 8  # passes a write lets go by while requests wait in the kernel
RECENT = 0.02  # seconds: requests other than writes were served lately, the gate is on


def requests_waiting(fd: int) -> Callable[[], bool]:
    """Whether a request waits in the kernel on ``fd`` (``/dev/fuse``), or the connection
    ended: a ``poll`` of timeout 0 (the gate's ``queued``)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    poll = poller.poll
    return lambda: bool(poll(0))


class WriteGate:
    """Writes run after the queued requests (see the module). :meth:`run` is a task of the
    server's nursery; a plain write handler asks :meth:`busy`, then awaits :meth:`turn`."""

    def __init__(self, queued=None):
        self.queued = queued  # whether requests wait in the kernel (requests_waiting; set at mount)
        self._waiting: collections.deque = collections.deque()  # (task, fn, args)
        self._parked = None  # the run() task, while nothing waits
        self._running = False
        self._other_at = -RECENT  # time.monotonic() of the last request other than a write
        self.gated = 0  # writes that waited for their turn (the mount's user.memfs.writes_gated)

    def note_other(self) -> None:
        """A request other than a write was served (a lookup, ``getattr``, ``open``…)."""
        self._other_at = time.monotonic()

    def busy(self) -> bool:
        """Whether a write should wait for its turn: writes wait already, or requests wait in
        the kernel while others than writes were served lately (writes alone keep their order)."""
        if not self._running:
            return False
        if self._waiting:
            return True
        return self.queued is not None and time.monotonic() - self._other_at < RECENT and self.queued()

    async def turn(self, fn, *args):
        """``fn(*args)`` on the event loop once the requests queued before it were read, in
        order with the other waiting writes; its result or exception. Not cancellable: the
        write is a request being served."""
        if not self._running:
            return fn(*args)
        self.gated += 1
        self._waiting.append((trio.lowlevel.current_task(), fn, args))
        if self._parked is not None:
            trio.lowlevel.reschedule(self._parked)
            self._parked = None
        return await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)

    async def run(self) -> None:
        """Run the waiting writes in order, each once no request waits in the kernel (or
        after ``MAX_YIELDS`` passes that found one); when cancelled (unmounting), run the
        rest at once."""
        self._running = True
        waiting, queued, yields = self._waiting, self.queued, 0
        try:
            while True:
                if not waiting:
                    self._parked = trio.lowlevel.current_task()

                    def abort(_):
                        self._parked = None
                        return trio.lowlevel.Abort.SUCCEEDED

                    await trio.lowlevel.wait_task_rescheduled(abort)
                    continue
                if yields < MAX_YIELDS and queued is not None and queued():
                    yields += 1
                    await trio.lowlevel.cancel_shielded_checkpoint()  # a pass: the loop reads them
                    continue
                yields = 0
                task, fn, args = waiting.popleft()
                trio.lowlevel.reschedule(task, outcome.capture(fn, *args))
        finally:
            self._running = False
            while waiting:
                task, fn, args = waiting.popleft()
                trio.lowlevel.reschedule(task, outcome.capture(fn, *args))
