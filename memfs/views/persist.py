"""Copying refreshed views into the backing store (``<session>/derived/``), write-behind.

A refreshed view is written with the store's one atomic-replace helper
(:func:`memfs.store.paths.atomic_write`: temp file, fsync, rename; 0600). That costs an fsync —
long for a multi-megabyte ``memory.json``, and a journal commit that stalls the appends
of other writers on the same file system meanwhile — which must not sit between an append and
the next ``cat``. So copies go to one background thread, and each target file is written at
most once per :data:`DELAY` seconds: the first refresh of a file schedules its copy
``DELAY`` seconds later, and refreshes until then only replace the bytes to write (the newest
win; a file refreshed continuously is still copied every ``DELAY`` seconds), so ``cat
memory.json`` right after an append does not wait for a copy.

The store therefore shows what the mount shows within ``DELAY`` seconds, never a torn file.
:func:`flush` writes everything pending at once and waits for it (clean shutdown, tests; also
run at interpreter exit). Set ``WRITE_BEHIND = False`` to write synchronously in the caller.

A job for a session directory that no longer exists (removed by ``rmdir``/``gc``) is dropped:
writing a view must never recreate a deleted session.
"""

from __future__ import annotations

import atexit
import logging
import os
import stat
import threading
import time
from pathlib import Path

from memfs.errors import SymlinkRefused
from memfs.store.paths import DERIVED_DIR, atomic_write, ensure_private_dir, remove_file

log = logging.getLogger(__name__)

WRITE_BEHIND = True
DELAY = 0.5  # seconds between two copies of one file

_DELETE = None


class _Writer:
    def __init__(self) -> None:
        self._cv = threading.Condition()
        # target → [bytes or _DELETE, monotonic time the copy is due]; dict order = due order
        self._jobs: dict[tuple[Path, str], list] = {}
        self._busy = False
        self._flushing = 0  # flush() callers waiting: everything is due now
        self._thread: threading.Thread | None = None
        self.writes = 0  # files written or removed, for tests and benchmarks

    def submit(self, session_dir: Path, rel: str, data: bytes | None) -> None:
        if not WRITE_BEHIND:
            self._apply(session_dir, rel, data)
            return
        with self._cv:
            job = self._jobs.get((session_dir, rel))
            if job is not None:
                job[0] = data  # keeps its due time: newest bytes, no starvation
                return
            self._jobs[(session_dir, rel)] = [data, time.monotonic() + DELAY]
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="memfs-views-writer", daemon=True)
                self._thread.start()
            self._cv.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Write every pending copy now and wait until done; False on timeout."""
        with self._cv:
            self._flushing += 1
            self._cv.notify_all()
            try:
                return self._cv.wait_for(lambda: not self._jobs and not self._busy, timeout)
            finally:
                self._flushing -= 1

    def _next_due(self) -> float | None:
        """Seconds until the first job is due (≤ 0: now), None when there is none."""
        if not self._jobs:
            return None
        if self._flushing:
            return 0.0
        return next(iter(self._jobs.values()))[1] - time.monotonic()

    def _run(self) -> None:
        while True:
            with self._cv:
                while (wait := self._next_due()) is None or wait > 0:
                    self._cv.wait(wait)
                key = next(iter(self._jobs))
                data = self._jobs.pop(key)[0]
                self._busy = True
            try:
                self._apply(*key, data)
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()

    def _apply(self, session_dir: Path, rel: str, data: bytes | None) -> None:
        try:
            st = os.lstat(session_dir)
            if not stat.S_ISDIR(st.st_mode):
                return
            path = session_dir / DERIVED_DIR / rel
            if data is _DELETE:
                remove_file(path)
            else:
                _make_dir(session_dir / DERIVED_DIR)
                if path.parent.name != DERIVED_DIR:
                    _make_dir(path.parent)
                atomic_write(path, data)
            self.writes += 1
        except FileNotFoundError:
            pass  # the session went away meanwhile
        except SymlinkRefused as exc:
            log.warning("session %s: derived view %s not copied: %s", session_dir.name, rel, exc)
        except Exception:  # a view copy must never take its caller (or the thread) down
            log.exception("session %s: could not write derived view %s (%s)", session_dir.name, rel, session_dir)


def _make_dir(path: Path) -> None:
    """Create one private directory level; never its parents (a deleted session stays deleted)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    ensure_private_dir(path)  # refuses a symlink, re-asserts 0700


_writer = _Writer()


def submit(session_dir: Path, rel: str, data: bytes) -> None:
    """Queue ``data`` to replace ``<session_dir>/derived/<rel>``."""
    _writer.submit(session_dir, rel, data)


def remove(session_dir: Path, rel: str) -> None:
    """Queue the removal of ``<session_dir>/derived/<rel>`` (an evicted turn's copy)."""
    _writer.submit(session_dir, rel, _DELETE)


def flush(timeout: float | None = None) -> bool:
    """Wait until the backing store holds every view refreshed so far; False on timeout."""
    return _writer.flush(timeout)


def writes() -> int:
    """How many derived files the writer has written or removed in this process."""
    return _writer.writes


atexit.register(flush, 10.0)
