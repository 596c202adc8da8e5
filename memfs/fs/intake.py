"""Who reads the mount's requests from ``/dev/fuse``: threads of the intake, or pyfuse3's loop.

In an ``fsync``-mode mount, threads of the intake (``memfs/fs/_intake.c``) read every FUSE
request. A ``write()`` — in memfs only ``events.jsonl`` is ever open for writing — is served
on the thread that read it, through :meth:`Operations.write_now
<memfs.fs.ops.Operations.write_now>`: the commit under the interpreter lock, then, without it,
the ``fdatasync`` and the reply, with no pass of the event loop (a write that may wait for a
cap rewrite or the session's lock runs on a lowered worker thread, the intake's thread
waiting). Writes that wait for the interpreter lock together are committed by one thread,
which holds it for all of them (*combining*, in ``_intake.c``): handing the lock from thread
to thread had cost 8 writers into 8 sessions ~190 µs of waiting per write, against ~20 µs of
commit; side by side, 8×8 went 1.12–1.25× (three runs), one writer 1.01–1.09×. Every other
request is queued for the event loop, where pyfuse3 serves it as before (it waits on the
queue's eventfd instead of ``/dev/fuse``). A thread that takes a write while
no other thread is left waiting in ``/dev/fuse`` starts another, so a slow write never holds
up other requests, and the event loop never waits for the disk (SPEC §6).

Decision: only ``fsync``-mode mounts use it. Each request queued for the loop costs one more
thread wakeup than when the loop reads it itself: a quiet ``stat`` + read of a manifest took
p50 0.93 ms against 0.70–0.73 through the loop. In ``fsync`` mode a write costs an
``fdatasync`` and one writer gains 1.5× (``docs/fsync.md`` has the figures); in ``write``
mode single appends gained too (2.4× with a thread polling ``/dev/fuse`` for 50 µs after each
write), but side by side with the loop's reading the ``stat`` probes of
``scripts/bench_responsive.py`` lost: with 4 writers through cap rewrites p99 2.1 → 6.4 ms,
while the warm-up rescans 0.9 → 3.0 ms. ``write``-mode mounts therefore keep pyfuse3's own
reading.

That reading is also the twin: every request on the event loop, ``fsync``-mode syncs on the
syncer's threads (:mod:`memfs.fs.syncer`), cap rewrites and first opens hopped to worker
threads. It runs in ``write`` and ``buffered`` mounts, when ``MEMFS_IMPL=py`` (as the store's
twins), when the compiled module is missing, in cluster mode (appends are published from the
event loop's own NATS connection, ``memfs.cluster.wire``), and when pyfuse3 was loaded before
this module — the intake takes pyfuse3's read by defining the two libfuse functions its loop
calls, which only works when it is loaded first, with ``RTLD_GLOBAL``; every module of
``memfs.fs`` that imports pyfuse3 imports this one before it. :func:`took` tells whether it
took; :func:`stats` is what the mount's root reports (``user.memfs.intake_*``).

The compiled module also answers ``open`` for pyfuse3 (:func:`noflush_opens`): a handle opened
read-only gets ``FOPEN_NOFLUSH``, which pyfuse3's ``FileInfo`` cannot ask for, so a reader's
``close()`` waits for no ``FLUSH`` (one of the five requests ``stat f; cat f`` waited for).
"""

from __future__ import annotations

import os
import sys


def _load():
    if os.environ.get("MEMFS_IMPL") == "py" or "pyfuse3" in sys.modules:
        return None
    flags = sys.getdlopenflags()
    sys.setdlopenflags(flags | os.RTLD_GLOBAL)  # its two libfuse functions must come first
    try:
        from memfs.fs import _intake
    except ImportError:
        return None
    finally:
        sys.setdlopenflags(flags)
    return _intake


_intake = _load()
THREADS = 2  # readers started with the mount; more start while writes wait (see the module)


def arm() -> int | None:
    """Before ``pyfuse3.init``: make pyfuse3 wait on the intake's queue. Returns the queue's
    descriptor, or None when the intake is not available."""
    return _intake.arm() if _intake is not None else None


def took() -> bool:
    """After ``pyfuse3.init``: whether pyfuse3 asked the intake for its descriptor (it did not
    when it had bound libfuse's own functions). If not, the intake is disarmed."""
    if _intake is None:
        return False
    if _intake.stats()["fd_calls"]:
        return True
    _intake.disarm()
    return False


def start(fuse_fd: int, write_now) -> None:
    """Start reading ``fuse_fd`` (the session's ``/dev/fuse``); writes go to ``write_now(fh,
    offset, data, may_hop)`` (:meth:`Operations.write_now <memfs.fs.ops.Operations.write_now>`
    says what it returns)."""
    _intake.start(fuse_fd, write_now, THREADS)


def stop() -> None:
    """End the readers (a write in progress is finished and answered first)."""
    if _intake is not None:
        _intake.stop()


def stats() -> dict:
    """``writes`` served on the intake's threads (``combined``: of them, those another thread
    committed, see ``_intake.c``), requests ``forwarded`` to the event loop, ``threads`` now and
    at most (``peak_threads``); ``noflush``: opens answered with ``FOPEN_NOFLUSH`` (see below)."""
    return _intake.stats() if _intake is not None else {}


def noflush_opens() -> int | None:
    """How many read-only opens were answered with ``FOPEN_NOFLUSH`` (the kernel then sends no
    ``FLUSH`` at their ``close()``: a reader has nothing to flush; ``opendir`` shares the reply,
    so directories count too, where it changes nothing); None when the module is not
    loaded (or was built against a libfuse before 3.11, which cannot say it) — its twin,
    pyfuse3's own reply, lets every ``close()`` send one, which the mount's
    ``flush`` answers at once. ``_intake.c`` sets it in every mount it is loaded in, whoever
    reads the requests."""
    opens = _intake.stats()["noflush"] if _intake is not None else -1
    return opens if opens >= 0 else None  # (-1: built against a libfuse older than 3.11)
