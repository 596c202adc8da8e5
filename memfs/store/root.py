"""A sessions root as a whole: list, create, open and remove sessions (SPEC §1, §3.5, §6).

:class:`Store` keeps the handles a long-lived server (the filesystem) works with. Holding a
handle holds no lock (a session is read until it is written, see
:class:`memfs.store.session.Session`) but one descriptor, so at most ``max_open_sessions``
are kept: opening one more closes the least recently used handles whose session is idle (not
this process's to write, no file open on it), and so does :meth:`Store.trim` once sessions
opened past the bound while in use become idle; a session in use is never closed under its user.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from memfs.errors import AlreadyExists, NotEmpty, NotFound, SessionBusy
from memfs.store.catalog import catalog_of, forgotten
from memfs.store.config import DEFAULT_EVICT_TO, DEFAULT_IDLE_RELEASE, DEFAULT_MAX_EVENTS, DEFAULT_MAX_LINE_BYTES
from memfs.store.lock import is_live
from memfs.store.paths import EVENTS, REJECTED, ensure_private_dir, new_session_name_error, remove_tree
from memfs.store.session import SessionHandle, open_session
from memfs.store.sessiondirs import is_session_dir, session_names

DEFAULT_MAX_OPEN_SESSIONS = 256  # sessions a store keeps open (one descriptor each), SPEC §3.5

log = logging.getLogger("memfs.store")


def _close_idle(victims: list[SessionHandle]) -> None:
    """Close handles the bound took out, each whatever the others do (a failed persist is
    logged: the close still releases the lock and the log, and the next open rescans)."""
    for held in victims:
        try:
            held.close()
        except Exception as exc:
            log.warning("%s: closing an idle session: %s", held.name, exc)


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


class Store:
    """The sessions under one root, and the handles this process holds on them."""

    def __init__(self, root: str | os.PathLike, settings: StoreSettings = StoreSettings()):
        self.root = Path(root)
        self.settings = settings
        self._handles: OrderedDict[str, SessionHandle] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()  # guards _handles and _opening only: never held around disk work
        self._opening: dict[str, list] = {}  # name -> [lock of its open, waiters]: per-session opens
        if not settings.read_only:
            ensure_private_dir(self.root)

    def catalog(self):
        """The store catalog of this root (:mod:`memfs.store.catalog`)."""
        return catalog_of(self.root)

    def names(self) -> list[str]:
        """Session directory names, sorted, from the store catalog brought up to date (one
        ``stat`` of the root; a ``stat`` per session now and then, on a thread of its own:
        :meth:`~memfs.store.catalog.Catalog.maybe_verify`); from the folder names while a store
        without a catalog has it built (:mod:`memfs.store.catalog_build`). Symlinks and stray files
        are not sessions."""
        catalog = catalog_of(self.root)
        if not catalog.ready():  # a store without a catalog: listed from its folder names while it is built
            catalog.build_later()
            return session_names(self.root)
        return catalog.current(background=True).names()

    def exists(self, name: str) -> bool:
        return name in self._handles or is_session_dir(self.root / name)

    def held(self, name: str) -> SessionHandle | None:
        """The handle of session ``name`` if this store holds it open now, else None. Never
        touches the disk nor waits for another session's open: the event loop asks this first
        and opens (which may rescan) on a worker thread only when it answers None."""
        with self._lock:
            handle = self._handles.get(name)
            if handle is not None:
                self._handles.move_to_end(name)
            return handle

    def holds(self, name: str) -> bool:
        """Whether this store holds session ``name`` open now (no lock taken, not counted as a use)."""
        return name in self._handles

    def held_handles(self) -> list[tuple[str, SessionHandle]]:
        """``(name, handle)`` of every session this store holds open now: no disk access, and
        (unlike :meth:`held`) not counted as a use."""
        with self._lock:
            return list(self._handles.items())

    def open(self, name: str) -> SessionHandle:
        """The held handle of session ``name`` (opened on first use).

        Per-session open: the store-wide lock is held only to look up and insert handles,
        never around a session's open (which may rescan a large log); two opens of the same
        session wait for one another (the second gets the first one's handle), opens of
        different sessions run at once."""
        handle = self.held(name)
        if handle is not None:
            return handle
        with self._gate(name):
            handle = self.held(name)
            if handle is not None:
                return handle
            if not is_session_dir(self.root / name):
                raise NotFound(f"no session {name!r}")
            handle = self._open(name, create=False)  # outside the store lock: may rescan
            self._insert(name, handle)
            return handle

    @contextlib.contextmanager
    def _gate(self, name: str):
        """Hold session ``name``'s own lock (opening, creating, removing it), not the store's."""
        with self._lock:
            gate = self._opening.get(name)
            if gate is None:
                gate = self._opening[name] = [threading.Lock(), 0]
            gate[1] += 1
        try:
            with gate[0]:
                yield
        finally:
            with self._lock:
                gate[1] -= 1
                if not gate[1]:
                    del self._opening[name]

    def _insert(self, name: str, handle: SessionHandle) -> None:
        """Hold ``handle``, closing least recently used idle handles until it fits.

        Idle: nobody else holds a handle on it (an open file of the mount) and no handle claims
        to be writing. A session this process wrote a moment ago and only keeps the lock of
        until ``idle_release`` is idle too: its close persists what the metadata lacks and
        releases the lock early, so a burst of appends to many sessions stays within the bound.
        A session in use stays: the bound then gives way rather than break a user. The closes
        (a writer's may persist: fsyncs) run outside the store lock, in the caller's thread —
        a worker's, never the event loop's (the filesystem opens sessions off the loop)."""
        with self._lock:
            victims = self._pick_idle(1)
            self._handles[name] = handle
        _close_idle(victims)

    def trim(self) -> None:
        """Close least recently used idle handles while more than ``max_open_sessions`` are
        held. Call it when a session may have become idle (a file on it closed): sessions
        opened past the bound while all were in use must go once they are idle, not only when
        yet another one is opened. Cheap under the bound; closes run in the caller's thread."""
        if len(self._handles) <= self.settings.max_open_sessions:  # (a hint: checked again below)
            return
        with self._lock:
            victims = self._pick_idle(0)
        _close_idle(victims)

    def _pick_idle(self, room: int) -> list[SessionHandle]:
        """Take least recently used idle handles out until ``room`` more fit under the bound
        (caller holds ``_lock``); the caller closes them (outside it)."""
        victims = []
        excess = len(self._handles) + room - self.settings.max_open_sessions
        if excess > 0:
            for other, held in list(self._handles.items()):
                if excess <= 0:
                    break
                if held.unused():
                    del self._handles[other]
                    victims.append(held)
                    excess -= 1
        return victims

    def share(self, name: str) -> SessionHandle:
        """A handle of the caller's own on session ``name`` (opened if needed; the caller closes
        it): taken under the lock the bound picks its victims under, so never from a handle
        being closed as idle meanwhile (:meth:`trim`), and while it is open the session is not idle."""
        while True:
            handle = self.open(name)
            with self._lock:
                if self._handles.get(name) is handle:
                    return handle.share()

    def _open(self, name: str, create: bool) -> SessionHandle:
        s = self.settings
        return open_session(self.root, name, durability=s.durability, max_events=s.max_events,
                            max_line_bytes=s.max_line_bytes, read_only=s.read_only, idle_release=s.idle_release,
                            evict_to=s.evict_to, create=create)

    def create(self, name: str) -> SessionHandle:
        """Create session ``name``; it must already be in sanitized form and not exist."""
        error = new_session_name_error(name)
        if error is not None:
            raise error
        with self._gate(name):
            path = self.root / name
            if self.held(name) is not None or os.path.lexists(path):
                raise AlreadyExists(f"session {name!r} already exists")
            handle = self._open(name, create=True)  # whole on disk, or nothing (open_session)
            self._insert(name, handle)
            return handle

    def remove(self, name: str) -> None:
        """Delete an empty session: no events, no refused lines, not live elsewhere."""
        with self._gate(name):
            path = self.root / name
            if not is_session_dir(path):
                raise NotFound(f"no session {name!r}")
            handle = self.held(name)
            if handle is not None:
                if handle.manifest["event_count"] or handle.file_len:
                    raise NotEmpty(f"session {name!r} has events")
                with self._lock:
                    del self._handles[name]
                handle.close()
            if is_live(path):
                raise SessionBusy(f"session {name!r} is open by another process")
            for file in (EVENTS, REJECTED):
                try:
                    if os.lstat(path / file).st_size:
                        raise NotEmpty(f"session {name!r} is not empty ({file})")
                except FileNotFoundError:
                    pass
            remove_tree(path)
            forgotten(self.root, name)

    def close(self) -> None:
        """Close every held handle (flushing and persisting each)."""
        with self._lock:
            handles, self._handles = list(self._handles.values()), OrderedDict()
        errors = []
        for handle in handles:
            try:
                handle.close()
            except Exception as exc:  # close the others anyway
                errors.append(exc)
        if errors:
            raise errors[0]
