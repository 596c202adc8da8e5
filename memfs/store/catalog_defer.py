"""Notes of the store catalog gathered and read once (:func:`deferred`): an import's new session
is noted by its creation, its ``about.json`` merge, its last persist and its lock release, and
each note reads its folder again (:func:`memfs.store.catalog.noted`); within :func:`deferred`
this thread's notes are read once, at its end.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

_DEFERRED = threading.local()  # .dirs: the sessions noted meanwhile by this thread


@contextlib.contextmanager
def deferred():
    """Within it, this thread's :func:`memfs.store.catalog.noted` sessions are read once, at
    its end (nested: the outer one reads them)."""
    if getattr(_DEFERRED, "dirs", None) is not None:
        yield
        return
    dirs: dict[Path, None] = {}
    _DEFERRED.dirs = dirs
    try:
        yield
    finally:
        _DEFERRED.dirs = None
        from memfs.store.catalog import noted

        for session_dir in dirs:
            noted(session_dir)


def held(session_dir: Path) -> bool:
    """Whether a note of ``session_dir`` is held for the end of a :func:`deferred` of this thread."""
    dirs = getattr(_DEFERRED, "dirs", None)
    if dirs is None:
        return False
    dirs[session_dir] = None
    return True
