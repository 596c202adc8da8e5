"""Which sessions changed since a cursor: what keeps the root search's index current (SPEC §14).

A root query never lists the store nor stats every session: it asks a :class:`ChangeSource`
for the sessions changed since its last query and refreshes only those. The question is one
method, :meth:`ChangeSource.changes_since`; :class:`CatalogChanges` answers it from the store
catalog's change feed (:meth:`memfs.store.catalog.Catalog.changes_since`: every writer's commit
moves its session's row, and the catalog's own checks against the directory find what was changed
without memfs), so a query costs one indexed read — for the mount, ``memfs search`` and the MCP
server alike. The mount also notices its own writes (:meth:`CatalogChanges.notice`), which reach
the catalog only with the metadata's write-behind.

A session's **log key** is ``(st_ino, st_size, st_mtime_ns)`` of its ``events.jsonl`` (an
append moves size and mtime, a cap rewrite the inode), None when it has none.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Protocol

from memfs.store.catalog import pack_key
from memfs.store.paths import EVENTS
from memfs.store.sessiondirs import is_session_dir

LogKey = int  # a log's (inode, size, mtime_ns), packed (memfs.store.catalog.pack_key)


class ChangeSource(Protocol):
    """What the searcher asks."""

    def changes_since(self, cursor: int) -> tuple[int, dict[str, LogKey | None], set[str]]:
        """``(cursor now, {name: log key} of the sessions changed since cursor, names removed
        since cursor)``. Cursor 0: every session, nothing removed (the caller drops what it
        knows that is not in the answer)."""
        ...


def log_key(root: str, name: str) -> LogKey | None:
    """The log key of session ``name`` under ``root`` now (None: no log)."""
    try:
        st = os.lstat(f"{root}/{name}/{EVENTS}")
    except OSError:
        return None
    return pack_key(st.st_ino, st.st_size, st.st_mtime_ns)


class CatalogChanges:
    """A :class:`ChangeSource` answered by the store catalog (SPEC §14): the rows changed since
    the last query, with their log keys, and the names removed. The catalog is kept by every
    writer's commit and checked against the directory now and then (on a thread of its own:
    :meth:`memfs.store.catalog.Catalog.current`), so a query lists nothing and stats nothing but
    the root. :meth:`notice` adds this process's own writes at once (a catalog row follows the
    metadata's write-behind), each at the cost of one ``lstat``.

    One reader: the searcher passes back the cursor it was given; any other cursor is answered
    as 0 (every session)."""

    def __init__(self, root: str | os.PathLike, background: bool = True):
        from memfs.store.catalog import catalog_of

        self.root = os.fspath(root)
        self.background = background  # the catalog's checks of the disk on a thread (a server), else inline (a command)
        self.catalog = catalog_of(self.root)
        self._lock = threading.Lock()
        self._feed = 0  # the catalog's cursor after the last answer
        self._seq = 0  # ours: the cursor last returned
        self._noticed: set[str] = set()
        self._known: set[str] = set()  # every name reported and not removed since
        self.noticed = 0  # notices taken (stats)

    def notice(self, name: str) -> None:
        """Session ``name`` was written, created or removed by this process."""
        with self._lock:
            self._noticed.add(name)
            self.noticed += 1

    def changes_since(self, cursor: int) -> tuple[int, dict[str, LogKey | None], set[str]]:
        with self._lock:
            full = cursor <= 0 or cursor != self._seq
            noticed, self._noticed = self._noticed, set()
            feed_cursor = 0 if full else self._feed
        catalog = self.catalog.current(background=self.background)
        feed, changed, removed = catalog.log_keys_since(feed_cursor)
        with self._lock:
            gone = set(removed) if removed is not None else self._known - changed.keys()
            for name in noticed - changed.keys():  # (its row may not have been written yet)
                key = log_key(self.root, name)
                if key is not None or is_session_dir(Path(self.root, name)):
                    changed[name] = key
                else:
                    gone.add(name)
            gone -= changed.keys()
            self._known -= gone
            self._known.update(changed)
            if full or changed or gone or feed != self._feed:
                self._seq += 1  # (nothing since: the same cursor)
            self._feed = feed
            return self._seq, changed, set() if full else gone

    def position(self) -> int:
        """The catalog's cursor the last answer reached (what a saved index records)."""
        with self._lock:
            return self._feed

    def resume(self, feed: int, names) -> int:
        """Go on from catalog cursor ``feed`` (a saved index's), where sessions ``names`` were
        known: returns the cursor to pass to :meth:`changes_since`, whose answer is then the
        sessions changed since ``feed`` (every one, and those of ``names`` it lacks as removed,
        when the catalog was made again since)."""
        with self._lock:
            self._feed = feed
            self._known = set(names)
            self._seq += 1
            return self._seq

    def stats(self) -> dict:
        """Sessions known and notices taken."""
        with self._lock:
            return {"known": len(self._known), "noticed": self.noticed}
