"""How the event loop takes requests from the kernel: at once, when one is already waiting.

pyfuse3 reads FUSE requests in worker tasks. Before each read, its task takes a lock and parks
until the loop's ``epoll`` reports ``/dev/fuse`` readable — also when requests are queued
already, which is the rule while agents append without pause. Each request so cost a pass of
the loop, an ``epoll_ctl`` to re-arm the descriptor and the lock's hand-off to the next reading
task, and the loop's CPU per write is what bounds many writers (``scripts/bench_durability.py``).

:class:`RequestReader` wraps the function those tasks await before each read
(``pyfuse3._wait_fuse_readable``: pyfuse3 3.3 to 3.5 look it up by name in their read loop;
:meth:`RequestReader.install` says whether it could). A task that comes back for a request
passes one checkpoint (other tasks run: the loop stays fair), then asks the kernel with a
``poll`` of timeout 0, and if a request waits it reads it at once. Otherwise it waits as
pyfuse3 does — the lock, ``epoll`` — and asks the kernel again when that returns: another task
may have taken the request meanwhile, and a read of ``/dev/fuse`` with nothing queued would
block the loop. (A request the kernel withdraws between the ``poll`` and the read — its caller
killed before the server saw it — would block it too, until the next request; that window was
already there between pyfuse3's ``epoll`` and its read, and is narrower here.)

pyfuse3 keeps its own pool of tasks by a count of those waiting in the function wrapped: after
each read it starts another task if none waits there, and a task that finds more than
``min_tasks`` waiting ends. A task that reads at once leaves one waiting there, so it never makes
pyfuse3 start a task; the task that waited for ``epoll`` does, when it leaves alone. So while
pyfuse3 has fewer than ``pool`` tasks (the mount's ``MIN_TASKS``, 16), one task waiting there is
enough for the others to read at once, and under load the pool grows to ``pool``; from then on
two must wait there (the second in the lock's queue), so that the one that waited for ``epoll``
leaves alone, and pyfuse3 starts a task, only when every other task is busy — as without the
reader. Without this bound the pool grew to pyfuse3's limit of 99 tasks under load, each
with a receive buffer as large as the largest request it read, so a stream of large writes with
a few readers grew the server by one buffer per task (``tests/test_reliability_hardening.py``
bounds the growth).

Ending is pyfuse3's: the tasks waiting in its function leave when ``pyfuse3.terminate()`` or the
kernel ends the session, and a task coming back from a request stops before it asks again. (One
that passed that check and reaches the checkpoint when ``terminate()`` runs may still read and
serve a queued request, as a task in the middle of a request does.) Where pyfuse3 has no such
function, nothing is wrapped and pyfuse3 reads as before; the root's
``user.memfs.requests_read_at_once`` then stays 0 (a test fails on it).
"""

from __future__ import annotations

import os
import select
import weakref

import trio


def fuse_device_fd() -> int | None:
    """This process's descriptor of ``/dev/fuse`` (its FUSE session's), or None if it has none."""
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == "/dev/fuse":
                return int(name)
        except OSError:  # (the listing's own descriptor, closed meanwhile)
            continue
    return None


class RequestReader:
    """Takes requests from ``fd`` (``/dev/fuse``) for pyfuse3's tasks (see the module); under
    load, reads at once grow pyfuse3's pool of tasks up to ``pool`` tasks and no further."""

    def __init__(self, fd: int, pool: int) -> None:
        self.pool = pool
        self._tasks = weakref.WeakSet()  # pyfuse3's tasks (those alive: a task that ended is dropped)
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        self._poll = poller.poll
        self._wait_readable = None  # pyfuse3's own wait, once installed
        self._waiting = 0  # tasks in it (as pyfuse3 counts them: its idle readers)
        self.read_at_once = 0  # requests read without a wait (user.memfs.requests_read_at_once)
        self.read_after_wait = 0  # ... after pyfuse3's wait for epoll (requests_read_after_wait)

    def queued(self) -> bool:
        """Whether a request waits in the kernel (or the connection ended)."""
        return bool(self._poll(0))

    def install(self) -> bool:
        """Make pyfuse3's tasks wait here before each read; whether pyfuse3 has the hook."""
        import pyfuse3

        wait = getattr(pyfuse3, "_wait_fuse_readable", None)
        if not callable(wait):
            return False
        self._wait_readable = wait
        pyfuse3._wait_fuse_readable = self.wait
        return True

    async def wait(self) -> bool:
        """True when a request can be read without blocking; False when pyfuse3's task should
        end (pyfuse3's own wait says the session ended)."""
        await trio.lowlevel.checkpoint()
        self._tasks.add(trio.lowlevel.current_task())
        if self._waiting >= (2 if len(self._tasks) >= self.pool else 1) and self._poll(0):
            self.read_at_once += 1
            return True
        self._waiting += 1
        try:
            while await self._wait_readable():
                if self._poll(0):  # (nothing yields between this and the read)
                    self.read_after_wait += 1
                    return True
            return False
        finally:
            self._waiting -= 1
