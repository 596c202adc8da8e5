"""The mount's root ``usage/`` (SPEC §12): ``daily``, ``by-model``, ``by-project``, ``by-agent``,
each as ``.json`` (what :func:`memfs.usage.report` gives) and ``.md``.

The sums are the store catalog's (:mod:`memfs.usage.utcdays`: SQLite groups the sessions'
day-and-model rows kept there), so the mount holds the files it rendered, never the store's
contributions. :class:`Aggregator` keeps those rows current:

* on the first read of a ``usage/`` file, every session's contribution missing or stale in the
  catalog is read or computed (:func:`memfs.usage.reporting.up_to_date`);
* the filesystem calls :meth:`Aggregator.touch` for a session written through this mount (or
  created or removed); the next read recomputes the sessions touched since from their open
  handles (the views' fold is incremental) and keeps them in the catalog;
* sessions changed by another process (``memfs record``, ``import --follow``, another mount) are
  found in the store catalog's change feed (:meth:`memfs.store.catalog.Catalog.feed`): a read
  more than :data:`FEED` seconds after the last look asks it for the sessions changed since (one
  indexed query) and recomputes those whose contribution no longer matches their log and
  ``index/about.json`` (:func:`memfs.store.catalog_usage.stale_among`).

A file is rendered again once the catalog's usage tables changed (by anyone: the mount's mark
kept among the catalog's answers, :func:`memfs.store.catalog_usage.keep`, is gone), and then its
``mtime`` moves. Safe from any thread; one lock guards the refreshes.
"""

from __future__ import annotations

import logging
import os
import threading
import time

import orjson

from memfs.errors import MemfsError
from memfs.store import catalog_usage
from memfs.usage import utcdays
from memfs.usage.reporting import Contribution, contribution, markdown, up_to_date, usage_key

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
        self._loaded = False
        self._dirty: set[str] = set()
        self._generation = 0  # moves when the catalog's usage tables changed
        self._rendered: dict[str, tuple[int, bytes]] = {}
        self._fed = 0.0  # when the change feed was last asked (monotonic)
        self._cursor = 0  # the change feed's cursor then
        self.mtime_ns = time.time_ns()  # when the sums last changed
        self.refreshed = 0  # sessions recomputed since the first load (tests, benchmarks)
        # the answer this mount keeps in the catalog while its files are current (_check): its own,
        # another mount of the same store keeps another
        self._mark = f"usage/ of mount {os.getpid()}:{id(self)}:{time.time_ns()}"

    # --- what the filesystem calls -------------------------------------------------------------

    def touch(self, session: str) -> None:
        """``session`` changed through this mount (an append, a mkdir, an rmdir)."""
        self._dirty.add(session)

    def current(self, name: str) -> bool:
        """Whether reading ``usage/<name>`` now needs no query (no I/O): serve it inline."""
        cached = self._rendered.get(name)
        return (self._loaded and not self._dirty and time.monotonic() - self._fed < FEED and cached is not None
                and cached[0] == self._generation)

    def content(self, name: str) -> bytes:
        """The bytes of ``usage/<name>`` (one of :data:`NAMES`) now."""
        stem, _, ext = name.rpartition(".")
        if stem not in FILES or ext not in ("json", "md"):
            raise FileNotFoundError(f"no usage file {name!r}")
        with self._lock:
            catalog = self.store.catalog()
            due = time.monotonic() - self._fed >= FEED
            looked = not self._loaded or due or bool(self._dirty)
            if not self._loaded:
                self._load_all()
            elif due:
                self._follow(catalog)
            if self._dirty:
                self._refresh(catalog, self._take_dirty())
            if looked:
                self._check(catalog)
            cached = self._rendered.get(name)
            if cached is not None and cached[0] == self._generation:
                return cached[1]
            doc = utcdays.document(catalog, FILES[stem])
            data = (orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n" if ext == "json"
                    else markdown(doc, TITLES[stem]).encode())
            self._rendered[name] = (self._generation, data)
            return data

    # --- keeping the catalog's rows current ----------------------------------------------------

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

    def _refresh(self, catalog, names) -> None:
        done: list[Contribution] = []
        gone: list[str] = []
        for name in names:
            c = self._session(name)
            if c is None:
                gone.append(name)
            else:
                done.append(c)
            self.refreshed += 1
        try:
            catalog_usage.put(catalog, done, usage_key())
            catalog_usage.forget(catalog, gone)
        except Exception:  # a cache: the next change, or the next mount's first read, computes them again
            log.exception("usage: the store catalog did not take %d sessions' usage", len(names))

    def _load_all(self) -> None:
        self._cursor = self.store.catalog().cursor()  # (before the sums: a change meanwhile comes again)
        self._fed = time.monotonic()
        up_to_date(self.store.root, write=not self.store.settings.read_only, background=True)
        self._loaded = True

    def _check(self, catalog) -> None:
        """Render the files again if the catalog's usage tables changed since they were rendered."""
        try:
            if catalog_usage.answer(catalog, self._mark) is not None:
                return
            catalog_usage.keep(catalog, self._mark, b"")  # (before the files are rendered: a change after it removes it)
        except Exception:
            log.exception("usage: the store catalog's mark failed")
        self._generation += 1
        self.mtime_ns = max(time.time_ns(), self.mtime_ns + 1)

    # --- other processes' changes ---------------------------------------------------------------

    def _follow(self, catalog) -> None:
        """Mark dirty the sessions the catalog's change feed says changed since the last look
        and whose contribution no longer matches (call under the lock)."""
        self._fed = time.monotonic()
        try:
            catalog.current(background=True)  # (its checks of the disk: on a thread)
            self._cursor, names, removed = catalog.feed(self._cursor, ("name",), lambda rows: [r[0] for r in rows])
            stale = catalog_usage.stale_among(catalog, usage_key(), names) if names else []
            if removed is None or stale is None:  # (a catalog made again, or prices changed: all of it)
                self._loaded = False
                self._load_all()
                return
            self._dirty.update(stale)
            if removed:
                catalog_usage.forget(catalog, removed)
        except Exception:  # a cache's feed: the next read asks again
            log.exception("usage: the store catalog's change feed failed")
