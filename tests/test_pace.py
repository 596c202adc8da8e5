"""Background work gives way to a busy event loop (memfs/pace.py), without a mount: a thread
that burns CPU stands for the loop, another runs as background work and calls pace()."""

from __future__ import annotations

import threading
from contextlib import contextmanager

import pytest
from memfs.pace import STEP, Pacer, background, pace

from store_helpers import wait_until as wait_for


class Loop:
    """A thread the pacer watches; it uses CPU until told to idle (it then sleeps on an event,
    still alive) or to stop."""

    def __init__(self, pacer: Pacer):
        self.stop = threading.Event()
        self.idling = threading.Event()
        watching = threading.Event()

        def run():
            pacer.watch()
            watching.set()
            while not self.stop.is_set():
                if self.idling.is_set():
                    self.stop.wait()
                else:
                    sum(range(200))

        self.thread = threading.Thread(target=run)
        self.thread.start()
        assert watching.wait(30)

    def end(self):
        self.stop.set()
        self.thread.join(30)


def in_background(pacer: Pacer, passed: threading.Event, waits: int = 1) -> threading.Thread:
    """Background work that calls pace() until it has given way (the pacer counted ``waits``
    waits), then sets ``passed``. (A look that finds the loop used little CPU since the
    previous look, as when the machine is busy, is idle: so it looks again.)"""
    def work():
        with background(pacer):
            while pacer.waits < waits:
                pace()
            passed.set()

    thread = threading.Thread(target=work)
    thread.start()
    return thread


def test_background_work_waits_while_the_loop_is_busy_and_goes_on_when_it_is_idle():
    pacer = Pacer()
    loop = Loop(pacer)
    passed = threading.Event()
    try:
        worker = in_background(pacer, passed)
        wait_for(lambda: pacer.waits == 1, "the background thread to give way")
        loop.idling.set()
        assert passed.wait(30)  # an idle step of the loop lets it go on
        worker.join(30)
        assert pacer.waits == 1 and pacer.waited_ns >= STEP * 1e9  # it slept a step at least
        assert loop.thread.is_alive()
    finally:
        loop.end()


@contextmanager
def loop_hop(pacer: Pacer):
    """A request on a worker thread, counted by :meth:`Pacer.hop` on this thread, as the loop does."""
    with pacer.hop():
        assert pacer.hops == 1
        yield
    assert pacer.hops == 0


@contextmanager
def thread_hop(pacer: Pacer):
    """A request on a worker thread that another thread than the loop waits for: counted by
    :meth:`Pacer.hop` on that other thread."""
    in_hop, leave = threading.Event(), threading.Event()

    def other_thread():
        with pacer.hop():
            in_hop.set()
            leave.wait(30)

    hopper = threading.Thread(target=other_thread)
    hopper.start()
    assert in_hop.wait(30)
    try:
        assert pacer.hops == 1
        yield
    finally:
        leave.set()
        hopper.join(30)
    assert pacer.hops == 0


@pytest.mark.parametrize("hop", [loop_hop, thread_hop], ids=["loop", "thread"])
def test_a_request_on_a_worker_thread_or_unmounting_ends_the_wait(hop):
    """A request served on a worker thread may wait for what the background work holds: while
    one is (``Pacer.hop``, on the loop or on another thread), nothing gives way;
    after close() (unmounting) neither."""
    pacer = Pacer()
    loop = Loop(pacer)
    try:
        passed = threading.Event()
        worker = in_background(pacer, passed)
        wait_for(lambda: pacer.waits == 1, "the background thread to give way")
        with hop(pacer):
            assert passed.wait(30)
            worker.join(30)
            passed.clear()
            with background(pacer):  # while the request is served: no wait at all
                for _ in range(100):
                    pace()
            assert pacer.waits == 1
        passed.clear()
        worker = in_background(pacer, passed, waits=2)
        wait_for(lambda: pacer.waits == 2, "the background thread to give way again")
        pacer.close()
        assert passed.wait(30)
        worker.join(30)
    finally:
        loop.end()


def test_pace_does_nothing_outside_background_work():
    pacer = Pacer()
    loop = Loop(pacer)
    try:
        pace()  # this thread is not background work: no wait, whatever the loop does
        assert pacer.waits == 0
    finally:
        loop.end()


def test_an_unwatched_pacer_never_waits():
    pacer = Pacer()  # (a store used without a mount: no loop to give way to)
    with background(pacer):
        pace()
    assert pacer.waits == 0


def test_worker_threads_lower_their_own_priority_once_and_only_when_asked():
    import os

    from memfs.pace import WORKER_POLICY, lower_workers, worker_started

    me = threading.get_native_id()
    policy = os.sched_getscheduler(me)

    def started(nested: bool = False) -> tuple[int, int]:
        """A worker's nice value and policy once it called worker_started; ``nested``: of a
        worker started by a worker (it inherits the first one's nice value and policy)."""
        out = []

        def run(outer: bool = False):
            worker_started()
            worker_started()  # (once per thread: a second call lowers nothing more)
            if outer:
                inner = threading.Thread(target=run)
                inner.start()
                inner.join(30)
                return
            tid = threading.get_native_id()
            out.append((os.getpriority(os.PRIO_PROCESS, tid), os.sched_getscheduler(tid)))

        t = threading.Thread(target=run, args=(nested,))
        t.start()
        t.join(30)
        return out[0]

    base = os.getpriority(os.PRIO_PROCESS, me)
    assert started() == (base, policy)  # nothing asked: a library process's threads keep theirs
    lower_workers(3)
    try:
        lowered = (min(19, base + 3), WORKER_POLICY if WORKER_POLICY is not None else policy)
        assert started() == lowered
        assert started(nested=True) == lowered  # lowered once, not by 3 more
        assert (os.getpriority(os.PRIO_PROCESS, me), os.sched_getscheduler(me)) == (base, policy)  # the caller's stay
    finally:
        lower_workers(0)
    assert started() == (base, policy)
