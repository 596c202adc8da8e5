"""This process's open sessions: one shared :class:`~memfs.store.session.Session` per session
directory, keyed by the directory's ``(st_dev, st_ino)`` and counted by the handles on it
(its ``refs``). :func:`memfs.store.session.open_session` takes a reference, a handle's
``close`` drops it; the last one removes the session from the registry.

The registry's lock guards the maps and every session's ``refs`` only: it is never held
around disk work. A session's first open (which may rescan a large log) holds only that
session's own gate, so opening one session never waits for another's open, and two threads
opening the same session at once share the one the first made.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memfs.store.session import Session

Key = tuple[int, int]  # (st_dev, st_ino) of the session directory


class Registry:
    """The shared sessions of this process (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: dict[Key, Session] = {}
        self._opening: dict[Key, list] = {}  # key -> [lock of its first open, waiters]

    def acquire(self, key: Key, make: Callable[[], Session]) -> tuple[Session, bool]:
        """The session of ``key`` with a reference taken for the caller, made by ``make()`` (its
        ``refs`` already 1) when it is not open; the flag says it was (a further handle)."""
        with self._lock:
            shared = self._sessions.get(key)
            if shared is None:
                gate = self._opening.get(key)
                if gate is None:
                    gate = self._opening[key] = [threading.Lock(), 0]
                gate[1] += 1
            else:
                shared.refs += 1
        if shared is not None:
            return shared, True
        try:
            with gate[0]:
                with self._lock:
                    shared = self._sessions.get(key)
                    if shared is not None:
                        shared.refs += 1
                if shared is not None:  # opened meanwhile by another thread
                    return shared, True
                shared = make()  # may rescan
                shared.key = key
                with self._lock:
                    self._sessions[key] = shared
                return shared, False
        finally:
            with self._lock:
                gate[1] -= 1
                if not gate[1]:
                    del self._opening[key]

    def share(self, shared: Session) -> None:
        """One more reference to an open session."""
        with self._lock:
            shared.refs += 1

    def release(self, shared: Session) -> bool:
        """Drop a reference; True for the last one (the session has left the registry)."""
        with self._lock:
            shared.refs -= 1
            last = shared.refs == 0
            if last and shared.key is not None:
                self._sessions.pop(shared.key, None)
        return last
