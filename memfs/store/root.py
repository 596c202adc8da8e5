"""A sessions root as a whole: list, create, open and remove sessions (SPEC §1, §3.5, §6).

:class:`Store` keeps the handles a long-lived server (the filesystem) works with. Holding a
handle holds no lock (a session is read until it is written, see
:class:`memfs.store.session.Session`) but one descriptor, so at most ``max_open_sessions``
are kept: opening one more closes the least recently used handles whose session is idle (not
this process's to write, no file open on it); a session in use is never closed under its user.
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from memfs.errors import AlreadyExists, InvalidName, NotEmpty, NotFound, SessionBusy
from memfs.store.lock import is_live
from memfs.store.catalog import is_session_dir, session_names
from memfs.store.config import (DEFAULT_EVICT_TO, DEFAULT_IDLE_RELEASE, DEFAULT_MAX_EVENTS, DEFAULT_MAX_LINE_BYTES,
                                SessionConfig)

log = logging.getLogger("memfs.store")

DEFAULT_MAX_OPEN_SESSIONS = 256  # sessions a store keeps open (one descriptor each), SPEC §3.5
from memfs.store.paths import EVENTS, REJECTED, ensure_private_dir, new_session_name_problem, remove_tree
from memfs.store.session import SessionHandle, open_session


@dataclass(frozen=True, slots=True)
class StoreSettings:
    """How sessions of a store are opened."""

    durability: str = "write"
    max_events: int = DEFAULT_MAX_EVENTS
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    read_only: bool = False
    idle_release: float = DEFAULT_IDLE_RELEASE
    max_open_sessions: int = DEFAULT_MAX_OPEN_SESSIONS
    evict_to: float = DEFAULT_EVICT_TO

    @property
    def session_config(self) -> SessionConfig:
        """The config each session of the store is opened with."""
        return SessionConfig(self.durability, self.max_events, self.max_line_bytes, idle_release=self.idle_release,
                             evict_to=self.evict_to)


class Store:
    """The sessions under one root, and the handles this process holds on them."""

    def __init__(self, root: str | os.PathLike, settings: StoreSettings = StoreSettings()):
        self.root = Path(root)
        self.settings = settings
        self._handles: OrderedDict[str, SessionHandle] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()
        self._closer: ThreadPoolExecutor | None = None  # closes evicted writers (see _make_room)
        if not settings.read_only:
            ensure_private_dir(self.root)

    def names(self) -> list[str]:
        """Session directory names, sorted. Symlinks and stray files are not sessions."""
        return session_names(self.root)

    def exists(self, name: str) -> bool:
        return name in self._handles or is_session_dir(self.root / name)

    def open(self, name: str) -> SessionHandle:
        """The held handle of session ``name`` (opened on first use)."""
        with self._lock:
            handle = self._handles.get(name)
            if handle is not None:
                self._handles.move_to_end(name)
                return handle
            if not is_session_dir(self.root / name):
                raise NotFound(f"no session {name!r}")
            self._make_room()
            handle = self._open(name, create=False)
            self._handles[name] = handle
            return handle

    def held(self, name: str) -> SessionHandle | None:
        """The handle of session ``name`` if this store holds it open now, else None: never
        opens one, nor changes which are least recently used (a cheap freshness check)."""
        with self._lock:
            return self._handles.get(name)

    def _make_room(self) -> None:
        """Close least recently used idle handles until one more fits (caller holds ``_lock``).

        Idle: nobody else holds a handle on it (an open file of the mount) and no handle
        claims to be writing. A session this process wrote a moment ago and only keeps the
        lock of until ``idle_release`` is idle too: when its metadata on disk is current and
        nothing is pending, closing it just releases the lock early; else its close (a
        persist: fsyncs) is handed to a background thread, so the caller — the mount's event
        loop — never waits for the disk, and a burst of appends to many sessions stays within
        the bound (give or take the closes in flight). A session in use stays: the bound then
        gives way rather than break a user."""
        excess = len(self._handles) + 1 - self.settings.max_open_sessions
        if excess <= 0:
            return
        for name, handle in list(self._handles.items()):
            stats = handle.stats()
            if stats["handles"] != 1 or stats["writing"]:
                continue
            del self._handles[name]
            if stats["writer"] and (stats["pending_bytes"] or not stats["metadata_current"]
                                    or not stats["persist_idle"]):
                self._close_later(handle)
            else:
                handle.close()
            excess -= 1
            if not excess:
                return

    def _close_later(self, handle: SessionHandle) -> None:
        """Close ``handle`` on the store's closing thread (a writer's close persists)."""
        if self._closer is None:
            self._closer = ThreadPoolExecutor(1, thread_name_prefix="memfs-close")
        self._closer.submit(self._close_quietly, handle)

    @staticmethod
    def _close_quietly(handle: SessionHandle) -> None:
        try:
            handle.close()
        except Exception:  # the log is whole; stale metadata only makes the next open rescan
            log.exception("closing session %s", handle.name)

    def open_count(self) -> int:
        """How many sessions this store holds open now."""
        with self._lock:
            return len(self._handles)

    def _open(self, name: str, create: bool) -> SessionHandle:
        s = self.settings
        return open_session(self.root, name, durability=s.durability, max_events=s.max_events,
                            max_line_bytes=s.max_line_bytes, read_only=s.read_only, idle_release=s.idle_release,
                            evict_to=s.evict_to, create=create)

    def create(self, name: str) -> SessionHandle:
        """Create session ``name``; it must already be in sanitized form and not exist."""
        problem = new_session_name_problem(name)
        if problem:
            raise InvalidName(problem)
        with self._lock:
            path = self.root / name
            if name in self._handles or os.path.lexists(path):
                raise AlreadyExists(f"session {name!r} already exists")
            self._make_room()
            handle = self._open(name, create=True)  # whole on disk, or nothing (open_session)
            self._handles[name] = handle
            return handle

    def remove(self, name: str) -> None:
        """Delete an empty session: no events, no refused lines, not live elsewhere."""
        with self._lock:
            path = self.root / name
            if not is_session_dir(path):
                raise NotFound(f"no session {name!r}")
            handle = self._handles.get(name)
            if handle is not None:
                if handle.manifest["event_count"] or handle.file_len:
                    raise NotEmpty(f"session {name!r} has events")
                handle.close()
                del self._handles[name]
            if is_live(path):
                raise SessionBusy(f"session {name!r} is open by another process")
            for file in (EVENTS, REJECTED):
                try:
                    if os.lstat(path / file).st_size:
                        raise NotEmpty(f"session {name!r} is not empty ({file})")
                except FileNotFoundError:
                    pass
            remove_tree(path)

    def close(self) -> None:
        """Close every held handle (flushing and persisting each)."""
        with self._lock:
            handles, self._handles = list(self._handles.values()), OrderedDict()
            closer, self._closer = self._closer, None
        if closer is not None:
            closer.shutdown(wait=True)  # evicted writers closed (persisted, unlocked) first
        errors = []
        for handle in handles:
            try:
                handle.close()
            except Exception as exc:  # close the others anyway
                errors.append(exc)
        if errors:
            raise errors[0]
