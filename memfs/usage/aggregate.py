"""The mount's root ``usage/`` (SPEC §12): ``daily``, ``by-model``, ``by-project``, ``by-agent``,
each as ``.json`` (what ``memfs usage --by … --json`` prints) and ``.md``.

:class:`Aggregator` holds every session's contribution (:class:`memfs.usage.reporting.Contribution`)
and the sums of each grouping (:class:`memfs.usage.reporting.Groups`). It is built on the first
read of a ``usage/`` file (:func:`memfs.usage.reporting.contributions`: the store-level index, each
session's current ``derived/usage.json`` copy, or its log where both are stale). After that a changed session is re-read alone and its old
contribution swapped for its new one in every grouping — a cost of that session's new bytes
(the views' fold is incremental) and of its few day-and-model rows, never a rescan of the store:

* the filesystem calls :meth:`Aggregator.touch` for a session written through this mount (or
  created or removed); the next read of a ``usage/`` file refreshes the sessions touched since;
* sessions changed by another process (``memfs record``, ``import --follow``, another mount) are
  found in the store catalog's change feed (:meth:`memfs.store.catalog.Catalog.changes_since`:
  every writer's commit moves its session's row, the catalog's checks against the disk catch the
  rest): a read of a ``usage/`` file more than :data:`FEED` seconds after the last look asks the
  feed for the rows changed since (one indexed query) and refreshes those whose stamp (the log's
  length, ``index/about.json``'s identity) is not their contribution's.

Safe from any thread; one lock guards the sums (held while a touched session is refreshed).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

import orjson

from memfs.errors import MemfsError
from memfs.usage.reporting import Contribution, Groups, contribution, contributions, markdown

log = logging.getLogger("memfs.usage")

FILES = {"daily": "day", "by-model": "model", "by-project": "project", "by-agent": "agent"}
TITLES = {"daily": "Usage by day (UTC)", "by-model": "Usage by model", "by-project": "Usage by project",
          "by-agent": "Usage by agent"}
NAMES = tuple(f"{stem}.{ext}" for stem in FILES for ext in ("json", "md"))
FEED = 0.25  # seconds a read trusts the sums before asking the catalog's change feed again


class Aggregator:
    """The ``usage/`` files of a mount over ``store`` (a :class:`memfs.store.root.Store`)."""

    def __init__(self, store):
        self.store = store
        self._lock = threading.Lock()
        self._contrib: dict[str, Contribution] = {}
        self._groups = {stem: Groups(by) for stem, by in FILES.items()}
        self._loaded = False
        self._dirty: set[str] = set()
        self._generation = 0
        self._rendered: dict[str, tuple[int, bytes]] = {}
        self._fed = 0.0  # when the change feed was last asked (monotonic)
        self._cursor = 0  # the change feed's cursor then
        self.mtime_ns = time.time_ns()  # when the sums last changed
        self.refreshed = 0  # sessions re-read since the first load (tests, benchmarks)

    # --- what the filesystem calls -------------------------------------------------------------

    def touch(self, session: str) -> None:
        """``session`` changed through this mount (an append, a mkdir, an rmdir)."""
        self._dirty.add(session)

    def current(self) -> bool:
        """Whether reading a file now needs no refresh (no I/O): serve it inline."""
        return self._loaded and not self._dirty and time.monotonic() - self._fed < FEED

    def content(self, name: str) -> bytes:
        """The bytes of ``usage/<name>`` (one of :data:`NAMES`) now."""
        stem, _, ext = name.rpartition(".")
        if stem not in FILES or ext not in ("json", "md"):
            raise FileNotFoundError(f"no usage file {name!r}")
        with self._lock:
            if not self._loaded:
                self._load_all()
            elif time.monotonic() - self._fed >= FEED:
                self._follow()
            if self._dirty:
                self._refresh(self._take_dirty())
            cached = self._rendered.get(name)
            if cached is not None and cached[0] == self._generation:
                return cached[1]
            doc = self._groups[stem].to_dict()
            data = (orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n" if ext == "json"
                    else markdown(doc, TITLES[stem]).encode())
            self._rendered[name] = (self._generation, data)
            return data

    # --- keeping the sums ---------------------------------------------------------------------

    def _take_dirty(self) -> list[str]:
        names = list(self._dirty)
        self._dirty.difference_update(names)
        return names

    def _session(self, name: str) -> Contribution | None:
        """The session's contribution now (None: it is gone or cannot be read)."""
        from memfs.usage import session_usage

        if not self.store.exists(name):
            return None
        try:
            return contribution(name, session_usage(self.store.held(name) or self.store.open(name)))
        except (MemfsError, OSError) as exc:
            log.warning("%s: usage not counted: %s", name, exc)
            return None

    def _replace(self, name: str, new: Contribution | None) -> None:
        old = self._contrib.pop(name, None)
        if new is not None:  # (kept without its dated turns and listed total: the sums need neither)
            new = self._contrib[name] = dataclasses.replace(new, uses=(), total=None)
        if old is not None and new is not None and (old.agent, old.project, old.rows) == (new.agent, new.project,
                                                                                          new.rows):
            return  # same sums (a turn opened, a message came): nothing to redo
        for groups in self._groups.values():
            if old is not None:
                groups.add(old, -1)
            if new is not None:
                groups.add(new, 1)
        self._generation += 1
        self.mtime_ns = max(time.time_ns(), self.mtime_ns + 1)

    def _refresh(self, names) -> None:
        for name in names:
            self._replace(name, self._session(name))
            self.refreshed += 1

    def _load_all(self) -> None:
        catalog = self.store.catalog().current(background=True)
        self._cursor = catalog.cursor()  # (before the contributions: a change meanwhile comes again)
        self._fed = time.monotonic()
        for name, c in contributions(self.store.root, write=not self.store.settings.read_only, uses=False).items():
            self._replace(name, c)
        self._loaded = True

    # --- other processes' changes ---------------------------------------------------------------

    def _follow(self) -> None:
        """Mark dirty the sessions the catalog's change feed says changed since the last look
        (call under the lock)."""
        self._fed = time.monotonic()
        try:
            catalog = self.store.catalog().current(background=True)  # (its checks of the disk: on a thread)
            self._cursor, rows, removed = catalog.changes_since(self._cursor)
        except Exception:  # a cache's feed: the next read asks again
            log.exception("usage: the store catalog's change feed failed")
            return
        for row in rows:
            c = self._contrib.get(row.name)
            if c is None or c.stamp != row.stamp:
                self._dirty.add(row.name)
        if removed is None:  # (a catalog made again: every row came; what it lacks is gone)
            names = {row.name for row in rows}
            self._dirty.update(n for n in self._contrib if n not in names)
        else:
            self._dirty.update(n for n in removed if n in self._contrib)
