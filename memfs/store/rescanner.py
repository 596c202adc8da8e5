"""Rescans of large logs in a helper process (SPEC §6: a request to one session never waits
behind another session's disk work; ``scripts/bench_responsive.py`` (c)); a store catalog's
first build runs there too (:func:`memfs.store.catalog_build.build_elsewhere`).

A rescan is Python work — a ``decode_stored`` and a state-machine step per line, long for a
large log — and in a mount it shares the interpreter lock with the event loop: every system
call a request makes hands the lock to the rescanning thread for up to the switch interval, so
while a request opened a large stale session, requests about idle sessions slowed down. The
warm-up's rescans give way to requests (:mod:`memfs.pace`), but a request's own
rescan cannot: its client waits for it.

So a process that serves others (the mount) installs a :class:`RescanHelper` with :func:`use`,
and :func:`memfs.store.recovery.recover` hands the full rescan of a log of at least
``MIN_BYTES`` to it: a worker process, started on first use, runs the same
:func:`~memfs.store.recovery.scan_into` over the same open file (``/proc/<pid>/fd/<fd>``: the
descriptor this process opened, whatever has been renamed since) and returns the turn state,
which is small (a few numbers per turn). The calling thread waits without the interpreter
lock.

Decisions recorded here:

* **Smaller logs are rescanned in-process** (under ``MIN_BYTES``): their rescan is short, and
  the hand-off and the result's transfer have a cost of their own.
* **The worker runs at nice 10**: a separate process shares no lock with the server, so a
  lower CPU priority cannot invert; on a busy machine the event loop and its clients get the
  CPUs first. One worker: rescans of large logs are rare (a stale or foreign session, once).
* **Any failure of the helper falls back to rescanning in-process**, logged once: a ``/proc``
  that hides other processes' descriptors, a worker killed by the OOM killer. The rescan's
  result does not depend on where it ran (``tests/test_store_rescanner.py``).
* The worker is spawned (a fresh interpreter: never a ``fork`` of the server's threads) on
  first use; :meth:`RescanHelper.close` stops it at unmount, and nothing of it is left.
* Only the open's full rescan goes there: following a tail reads new bytes only, and the views'
  fold keeps its state in this process (the warm-up's fold gives way to requests instead).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from concurrent.futures import ProcessPoolExecutor

log = logging.getLogger("memfs.store")

MIN_BYTES = 16 << 20  # logs this large or larger are rescanned by the helper
FD_PATH = "/proc/{pid}/fd/{fd}"  # how the worker opens the caller's descriptor

_helper: RescanHelper | None = None


def use(helper: RescanHelper | None) -> None:
    """Install ``helper`` for this process's opens (None: rescan in-process again)."""
    global _helper
    _helper = helper


def current() -> RescanHelper | None:
    return _helper


def _lower_priority() -> None:
    os.nice(10)


def _scan(path: str, file_len: int, status: str):
    """In the worker: the full rescan of the log open at ``path`` (the caller's descriptor)."""
    from memfs.store.machine import TurnState
    from memfs.store.recovery import OpenReport, scan_into

    fd = os.open(path, os.O_RDONLY)
    try:
        state = TurnState(status=status)
        report = OpenReport()
        end = scan_into(state, fd, 0, file_len, report)
    finally:
        os.close(fd)
    return state, end, report.scanned_lines, report.skipped_lines


class RescanHelper:
    """A worker process for full rescans of large logs (see the module)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None  # made on first use
        self._closed = False
        self.broken: str | None = None  # why the helper is no longer used (logged once)
        self.rescans = 0  # rescans it ran

    def scan(self, fd: int, file_len: int, status: str):
        """``(state, end, scanned_lines, skipped_lines)`` of the full rescan of ``fd``'s first
        ``file_len`` bytes, run by the worker; None when the helper cannot (the caller then
        rescans in-process)."""
        got = self.call(_scan, FD_PATH.format(pid=os.getpid(), fd=fd), file_len, status)
        if got is not None:
            with self._lock:
                self.rescans += 1
        return got

    def call(self, fn, *args):
        """``fn(*args)`` run by the worker (``fn`` a module-level function, its arguments and
        result small and picklable; it must not raise); None when the helper cannot."""
        if self.broken is not None or self._closed:
            return None
        try:
            with self._lock:
                if self._closed:  # (closed since the check above: no new worker)
                    return None
                if self._pool is None:
                    import multiprocessing
                    from concurrent.futures import ProcessPoolExecutor

                    self._pool = ProcessPoolExecutor(max_workers=1, initializer=_lower_priority,
                                                     mp_context=multiprocessing.get_context("spawn"))
                pool = self._pool
            got = pool.submit(fn, *args).result()
        except Exception as exc:  # noqa: BLE001 — whatever it was, the rescan goes on in-process
            if self.broken is None and not self._closed:
                self.broken = f"{type(exc).__name__}: {exc}"
                log.warning("rescans of large logs run in-process from now on: the helper failed (%s)",
                            self.broken)
            return None
        return got

    def close(self) -> None:
        """Stop the worker (a rescan in flight completes first); later scans run in-process."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
