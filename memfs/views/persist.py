"""Copying refreshed views into the backing store (``<session>/derived/``), write-behind.

A refreshed view is written with the store's one atomic-replace helper
(:func:`memfs.store.paths.atomic_write`: temp file, fsync, rename; 0600). That costs an fsync —
10–20 ms for a multi-megabyte ``memory.json`` — which must not sit between an append and the
next ``cat``, so writes go to one background thread. Jobs are coalesced per target file: if a
view is refreshed twice before the thread gets to it, only the newer bytes are written. The
store therefore shows the same content as the mount within moments, never a torn file;
:func:`flush` waits for the queue to drain (tests, clean shutdown; also run at exit).

Set ``memfs.views.persist.WRITE_BEHIND = False`` to write synchronously in the caller.

A job for a session directory that no longer exists (removed by ``rmdir``/``gc``) is dropped:
writing a view must never recreate a deleted session.
"""

from __future__ import annotations

import atexit
import logging
import os
import stat
import threading
from pathlib import Path

from memfs.store.paths import DERIVED_DIR, atomic_write, ensure_private_dir, remove_file

log = logging.getLogger(__name__)

WRITE_BEHIND = True

_DELETE = None


class _Writer:
    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._jobs: dict[tuple[Path, str], bytes | None] = {}
        self._busy = False
        self._thread: threading.Thread | None = None
        self.writes = 0  # files written or removed, for tests and benchmarks

    def submit(self, session_dir: Path, rel: str, data: bytes | None) -> None:
        if not WRITE_BEHIND:
            self._apply(session_dir, rel, data)
            return
        with self._cv:
            self._jobs.pop((session_dir, rel), None)  # re-queue at the end: newest bytes win
            self._jobs[(session_dir, rel)] = data
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="memfs-views-writer", daemon=True)
                self._thread.start()
            self._cv.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every submitted job is done; False on timeout."""
        with self._cv:
            return self._cv.wait_for(lambda: not self._jobs and not self._busy, timeout)

    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._jobs)
                key = next(iter(self._jobs))
                data = self._jobs.pop(key)
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
        except Exception:  # a view copy must never take its caller (or the thread) down
            log.exception("could not write derived view %s/%s", session_dir, rel)


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
