"""A large store's root search index built in a process of its own (SPEC §14).

A mount whose store has no usable saved index (a first mount of a large history, a file of an
older format) would otherwise index every session in the server: minutes at 100,000 sessions, the
server's interpreter shared with that work, and its memory holding every fact as the live index
keeps it — more than the saved form it then writes. :class:`Build` runs
:func:`memfs.search.store_searcher` over the store (read-only, as ``memfs search`` opens it) in a
spawned process at nice 10, which saves the index in the store and exits; the server then loads
the file and catches up on what changed meanwhile from the catalog's change feed (the cursor is
saved with it). A store of fewer than :data:`ELSEWHERE_MIN` entries is indexed in the server
(sooner than a process starts); so is one whose build failed there (logged).

While the build runs, a root search waits up to :data:`WAIT` seconds for it, then is refused with
:class:`~memfs.errors.IndexBuilding` (``EAGAIN``); a session's own search is answered meanwhile.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

log = logging.getLogger("memfs.search")

ELSEWHERE_MIN = 1000  # entries of the root: fewer, and the server indexes them itself
WAIT = 5.0  # seconds a root search waits for a build in progress before it is refused
STOP_WAIT = 5.0  # seconds a stopped build's process is waited for


def wanted(root: str, label: str) -> bool:
    """Whether the index ``label`` of ``root`` should be built elsewhere: no current saved
    file, and at least :data:`ELSEWHERE_MIN` entries in the root."""
    from memfs.search.persist import current

    if current(root, label):
        return False
    try:
        return len(os.listdir(root)) >= ELSEWHERE_MIN
    except OSError:
        return False


class Build:
    """At most one build of a searcher's index in a spawned process: :meth:`claim` decides it,
    :meth:`run` runs it, :meth:`wait` waits for it, :meth:`stop` ends it (the server unmounting)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: Any = None  # (a spawned multiprocessing Process)
        self._stopped = False
        self._claimed = False
        self._done = threading.Event()  # set: no build in progress
        self._done.set()

    def claim(self, root: str, label: str) -> bool:
        """Whether this caller is the one to :meth:`run` the build: the first to ask, when the
        build is :func:`wanted`; the others :meth:`wait` for it from then on."""
        if self._claimed:
            return False
        with self._lock:
            if self._claimed:
                return False
            self._claimed = True
            if not wanted(root, label):
                return False
            self._done.clear()
            return True

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for a claimed build to end; whether it did within ``timeout`` seconds."""
        return self._done.wait(timeout)

    def run(self, root: str) -> bool:
        """:meth:`_run`, after which waiters go on."""
        try:
            return self._run(root)
        finally:
            self._done.set()

    def _run(self, root: str) -> bool:
        """Build and save the default root index of ``root`` in a spawned process; whether it
        was saved (False: it failed there, logged, or it was stopped)."""
        import multiprocessing

        started = time.monotonic()
        with self._lock:
            if self._stopped:
                return False
            process = self._process = multiprocessing.get_context("spawn").Process(
                target=_build_saved, args=(root,), daemon=True, name="memfs search index build")
            process.start()
        process.join()
        if self._stopped:
            return False
        if process.exitcode != 0:
            log.warning("search index of %s not built by a helper process (exit %s): indexed here", root,
                        process.exitcode)
            return False
        log.info("search index of %s built by a helper process in %.1f s", root, time.monotonic() - started)
        return True

    def stop(self) -> None:
        """End the build in progress, if any, and refuse any later one."""
        with self._lock:
            self._stopped = True
            process = self._process
        if process is not None and process.is_alive():
            process.kill()
            process.join(STOP_WAIT)


def _build_saved(root: str) -> None:
    """In the spawned process: index every session of ``root`` and save the index."""
    from memfs.search import store_searcher
    from memfs.search.changes import CatalogChanges
    from memfs.store.root import Store, StoreSettings

    os.nice(10)
    store = Store(root, StoreSettings(read_only=True))
    try:
        search = store_searcher(store, changes=CatalogChanges(store.root, background=False), persist="save")
        search.warm(search.warm(None))
        if not search.save(force=True):
            raise SystemExit(1)
    finally:
        store.close()
