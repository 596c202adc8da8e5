"""What a listing of ``sessions/`` needs of the store catalog, kept in memory: each session's
name and ``updated_at`` (a session folder's time, SPEC §6), not its whole row (SPEC §14).

A server lists and stats its sessions many times; holding every row as an object for that costs
memory in proportion to the store (the rows' JSON, about.json, usage). :class:`Listing` holds
a name and a number per session and follows the catalog's change feed
(:meth:`memfs.store.catalog.Catalog.changes_since`'s cursor, indexed by ``seq``): at most once
per :data:`memfs.store.catalog.FRESH_SECONDS` it asks SQLite for the rows changed since its
cursor, so another process's change costs a read of that change only, and a catalog rebuilt
(another generation) is read again whole. Whole rows are asked of SQLite when needed
(:meth:`memfs.store.catalog.Catalog.row`).
"""

from __future__ import annotations

import logging
import sqlite3
import sys
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memfs.store.catalog import Catalog

log = logging.getLogger("memfs.store")
_NONE: dict[str, int] = {}


class Listing:
    """The names and listing times of one catalog's sessions (thread-safe)."""

    def __init__(self, catalog: Catalog):
        self.catalog = catalog
        self._lock = threading.Lock()
        self._cursor = 0
        self._updated: dict[str, int] = {}  # name -> updated_at in ns since the epoch (-1: none readable)
        self._sorted: list[str] | None = None  # the names, sorted (None: to sort again)
        self._looked = 0.0  # when the feed was last asked (monotonic)
        self._own = -1  # the catalog's count of this process's changes at that time

    def times(self) -> dict[str, int]:
        """``{name: updated_at}`` of every session, in ns since the epoch (-1: its row has no
        readable time); the same dict until something changes (do not modify). Empty until the
        catalog is built: a row a writer noted before then may be stale (a hand edit, a copy),
        so every session is then read from its folder."""
        from memfs.store.catalog import FRESH_SECONDS

        catalog = self.catalog
        if not catalog.ready():  # rows noted by writers before the first build: not checked against the disk
            return _NONE
        now = time.monotonic()
        if now - self._looked < FRESH_SECONDS and self._own == catalog.own_changes:  # (no lock: the common case)
            return self._updated
        with self._lock:
            if now - self._looked < FRESH_SECONDS and self._own == catalog.own_changes:
                return self._updated
            own = catalog.own_changes
            try:
                cursor, rows, removed = catalog.feed(self._cursor, ("name", "updated_at"), _named)
            except sqlite3.Error as exc:  # (busy past the timeout): what it said last, rather than fail a reader
                log.warning("store catalog of %s not read: %s", catalog.root, exc)
                return self._updated
            if removed is None:  # a first read, or the catalog rebuilt: every row
                self._updated = dict(rows)
                self._sorted = None
            else:
                updated = dict(self._updated)  # (a new dict: a reader may hold the old one)
                for name, when in rows:
                    if name not in updated:
                        self._sorted = None
                    updated[name] = when
                for name in removed:
                    if updated.pop(name, None) is not None:
                        self._sorted = None
                self._updated = updated
            self._cursor, self._looked, self._own = cursor, now, own
            return self._updated

    def names(self) -> list[str]:
        """The session names, sorted."""
        self.times()
        with self._lock:
            if self._sorted is None:
                self._sorted = sorted(self._updated)
            return list(self._sorted)

    def updated(self, name: str) -> int | None:
        """Session ``name``'s ``updated_at`` as its row has it, in ns (-1: none readable; None: no row)."""
        return self.times().get(name)


def _named(rows) -> list[tuple[str, int]]:
    """Feed rows ``(name, updated_at)`` as ``(interned name, ns)`` (one str per name: see catalog.py)."""
    return [(sys.intern(name), _ns(when)) for name, when in rows]


def _ns(when: str | None) -> int:
    from memfs.store.meta import parse_rfc3339

    seconds = parse_rfc3339(when) if when else None
    return -1 if seconds is None else int(seconds * 1_000_000_000)
