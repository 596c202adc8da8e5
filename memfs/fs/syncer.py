"""``fsync``-mode appends through the mount: the commit on the event loop, the ``fdatasync``
on a syncer thread, group-committed per session (SPEC §3.2, §6).

Before this, each ``write()`` of an ``fsync`` session ran its whole append (validation,
commit, ``fdatasync``) on a worker thread: per event, two thread hops that both compete with
the event loop for the interpreter lock. Now the append is committed on the loop with
``sync=False`` — in ``fsync`` mode a commit is one ``write()`` to the page cache, as in
``write`` mode; what may block (taking the lock, a cap rewrite, an inline persist) still hops,
see :meth:`SessionWrites.may_block_append <memfs.store.writing.SessionWrites.may_block_append>`
— and the reply waits for :meth:`Durability.durable`:

* the first waiter of a session with no sync in flight asks the log for a job
  (:meth:`SessionWrites.begin_sync <memfs.store.writing.SessionWrites.begin_sync>`: its
  descriptor and the position a sync now covers) and submits it to the :class:`Syncer`;
* every waiter whose bytes that sync covers waits for it; a waiter that arrived after it began
  waits for it to end, then the first of them to run starts the next one (group commit:
  appends arriving during a sync share the next one);
* the syncer runs ``fdatasync`` on a duplicate of the descriptor (a cap rewrite may replace
  the log meanwhile; the duplicate is made under the log's lock and handed over to the
  syncer, which closes it) on one of its threads — one session's slow sync never delays
  another's — and signals completions on an eventfd that :meth:`Durability.run` waits on; a
  waiter that has just submitted a job while others are in flight first delivers the
  completions already signalled (under load the loop is busy when a sync ends, and they would
  wait for a pass of the loop and a task switch into ``run``).

A failed ``fdatasync`` fails the ``write()`` with its errno; the lines are in the log, as when
:meth:`SessionHandle.append <memfs.store.session.SessionHandle.append>`'s own sync fails.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import queue
import threading
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from memfs.store.session import SessionHandle

# fdatasyncs in flight at once (of different sessions: one per session at a time). A few
# threads, not one per writer: with as many threads as writers each sync woke an idle thread of
# its own, while with fewer a thread that finishes a sync takes the next job without sleeping;
# too few leave syncs waiting (scripts/bench_durability.py, 8 writers into 8 sessions).
SYNC_THREADS = 4


class Syncer:
    """``fdatasync`` on threads, completions counted on an eventfd. ``submit(fd, tag)`` takes ``fd`` (a descriptor of the
    caller's own, e.g. a duplicate, which the caller does not close: the syncer does once it
    is synced; a descriptor that is not open is refused at once with ``EBADF``, and when
    ``submit`` raises ``fd`` is still the caller's); ``done()`` drains the eventfd and returns
    the ``(tag, errno)`` completions waiting (errno 0: synced); ``close()`` runs what is
    queued and stops."""

    def __init__(self, threads: int = SYNC_THREADS):
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._done: list[tuple[int, int]] = []
        self._lock = threading.Lock()
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name="memfs-sync", daemon=True) for _ in range(threads)]
        for thread in self._threads:
            thread.start()

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fd, tag = job
            try:
                os.fdatasync(fd)
                err = 0
            except OSError as exc:
                err = exc.errno or 5
            finally:
                os.close(fd)
            with self._lock:
                self._done.append((tag, err))
            os.eventfd_write(self._efd, 1)

    def submit(self, fd: int, tag: int) -> None:
        if self._closed:
            raise ValueError("Syncer is closed")
        fcntl.fcntl(fd, fcntl.F_GETFD)  # not open: OSError EBADF, and fd stays the caller's
        self._jobs.put((fd, tag))

    def fileno(self) -> int:
        return self._efd

    def done(self) -> list[tuple[int, int]]:
        try:
            os.eventfd_read(self._efd)
        except BlockingIOError:
            pass
        with self._lock:
            done, self._done = self._done, []
        return done

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._jobs.put(None)
        for thread in self._threads:
            thread.join()
        os.close(self._efd)


class _Job:
    """One ``fdatasync`` in flight: the tasks waiting for it are rescheduled when it ends (a
    list and ``trio.lowlevel`` rather than a ``trio.Event``: this runs once per ``write()``)."""

    __slots__ = ("goal", "waiting", "finished", "error")

    def __init__(self, goal: int):
        self.goal = goal
        self.waiting: list = []
        self.finished = False
        self.error = 0

    async def wait(self) -> None:
        if self.finished:
            return
        task = trio.lowlevel.current_task()
        self.waiting.append(task)

        def abort(_):
            self.waiting.remove(task)
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    def finish(self) -> None:
        self.finished = True
        for task in self.waiting:
            trio.lowlevel.reschedule(task)
        self.waiting = []


class Durability:
    """A mount's ``fsync``-mode waits (used on its event loop only; see the module docstring)."""

    def __init__(self, threads: int = SYNC_THREADS):
        self.syncer = Syncer(threads)
        self._tags = itertools.count(1)
        self._jobs: dict[object, _Job] = {}  # session opening -> the sync in flight
        self._by_tag: dict[int, tuple[object, _Job, SessionHandle]] = {}
        self.syncs = 0  # fdatasyncs run (for stats)

    async def run(self) -> None:
        """Deliver completions; runs for the mount's life (cancelled at unmount)."""
        fd = self.syncer.fileno()
        while True:
            await trio.lowlevel.wait_readable(fd)
            self._deliver()

    def _deliver(self) -> None:
        for tag, err in self.syncer.done():
            key, job, handle = self._by_tag.pop(tag)
            if self._jobs.get(key) is job:
                del self._jobs[key]
            if err:
                job.error = err
            else:
                handle.writes.end_sync(job.goal)
            job.finish()

    async def durable(self, handle) -> None:
        """Return once ``handle``'s session is durable up to what was written when called."""
        target = handle.writes.sync_position
        key = handle.reads.opening
        while True:
            job = self._jobs.get(key)
            if job is None:
                # a duplicate made under the log's lock (a cap rewrite on a worker thread may
                # close the log's descriptor meanwhile), handed over to the syncer, which closes it
                request = handle.writes.begin_sync(target)
                if request is None:
                    return
                fd, goal = request
                job = self._jobs[key] = _Job(goal)
                tag = next(self._tags)
                self._by_tag[tag] = (key, job, handle)
                try:
                    self.syncer.submit(fd, tag)
                except BaseException:
                    os.close(fd)  # refused: still ours
                    del self._jobs[key], self._by_tag[tag]
                    raise
                self.syncs += 1
            if len(self._by_tag) > 1:  # others' syncs may have ended: deliver them now, not a
                self._deliver()        # pass of the loop and a task switch later (run)
            await job.wait()
            if job.error:
                raise OSError(job.error, f"fdatasync: {os.strerror(job.error)}")
            if job.goal >= target:
                return

    def close(self) -> None:
        self.syncer.close()
