"""The store catalog (SPEC §14): which sessions a sessions root holds, and what they are.

What a session directory is: a direct child directory of the sessions root that is a real
directory (never a symlink), whose name is not hidden (``sanitize`` strips leading dots, and
``memfs migrate`` assembles sessions in hidden folders), and that holds a log or a manifest.

:class:`Catalog` keeps one :class:`Row` per session — name, §10 metadata (agent, project, cwd,
model, title), the listing's status, first and last record time, turns, events, the log's
size, mtime and inode — in SQLite (:mod:`memfs.store.catalog_db`); a session's usage (tokens,
cost) is its contribution beside it (:mod:`memfs.store.catalog_usage`). Who keeps it current:

* every metadata persist of a session (:class:`memfs.store.metadata.MetadataWriter`, the end of
  the one commit path: create, append, import, record, the cluster applier, fork) and the
  release of a writer's lock call :func:`noted`; an ``about.json`` merge, a pin and ``memfs gc``'s
  sweep too; a removal calls :func:`forgotten`;
* :meth:`Catalog.sync` (every read; one ``stat``): the root's mtime changed → the names are
  listed again and the added and removed sessions noted (a session copied in, a folder deleted);
* :meth:`Catalog.verify` (rarely: a command every :data:`VERIFY_SECONDS`, a server on a thread
  of its own as often as its cost allows, see :meth:`Catalog.maybe_verify`): the names listed again, and an
  ``lstat`` of each session's log, manifest and ``about.json``; a session whose log or
  metadata another process or a copy changed is read again.

A cache: delete it and the next reader rebuilds it from the folders (manifests, about.json,
the logs' heads). Readers: the mount's ``sessions/``, ``memfs sessions``, MCP ``list_sessions``,
the usage aggregates, and the root search's feed (:meth:`Catalog.changes_since`).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from memfs.store import catalog_defer
from memfs.store.catalog_build import build, build_elsewhere, racy, scan, stale_rows
from memfs.store.catalog_db import differences
from memfs.store.sessiondirs import session_names

if TYPE_CHECKING:
    from memfs.store.catalog_listing import Listing

log = logging.getLogger("memfs.store")


# --- the catalog ------------------------------------------------------------------------------

_GENERATION = 1 << 40  # a cursor is generation × this + seq (a rebuilt catalog has another generation)
VERIFY_SECONDS = 300.0  # a reader (a command) checks every session when the last check is older than this
BACKGROUND_VERIFY_SECONDS = 30.0  # a server checks at least this often, on a thread of its own…
BACKGROUND_VERIFY_MIN = 1.0  # …and at most this often…
BACKGROUND_VERIFY_DUTY = 0.1  # …its check taking at most this share of the time between two
RACY_RELIST = 0.1  # a racy root mtime (catalog_build.racy), while it does not move, is listed again at most this often (seconds)
FRESH_SECONDS = 0.05  # rows read are trusted this long before asking SQLite whether another process wrote


_U64 = (1 << 64) - 1
_MTIME_BIAS = 1 << 63  # (an mtime before 1970 is negative)


def pack_key(ino: int, size: int, mtime_ns: int) -> int:
    """A log's key — its inode, size and mtime, what tells that it changed — as one int (one
    object per session where a search index keeps 100,000 of them, not four)."""
    return (ino << 128) | (size << 64) | (mtime_ns + _MTIME_BIAS)


def unpack_key(key: int) -> tuple[int, int, int]:
    """``(inode, size, mtime_ns)`` of a :func:`pack_key` key."""
    return key >> 128, (key >> 64) & _U64, (key & _U64) - _MTIME_BIAS


@dataclass(slots=True)
class Row:
    """One session as the catalog has it (the columns of :data:`memfs.store.catalog_db.COLUMNS`).

    Times are seconds since the epoch: ``first_ts``/``last_ts`` are the first and last record
    times (:func:`memfs.store.sessioninfo.record_times`), ``updated_ts`` the store's last
    activity. ``status`` is the listing's (:func:`memfs.store.listing.status`),
    ``manifest_status`` the manifest's ``active``/``completed``. ``about`` is JSON text; use
    :attr:`about_dict`."""

    name: str
    session_id: str
    agent: str
    project: str | None
    cwd: str | None
    model: str | None
    title: str | None
    status: str
    manifest_status: str
    first_ts: float
    last_ts: float
    created_at: str
    updated_at: str
    updated_ts: float
    turns: int
    events: int
    in_turn: int
    readable: int
    imported: int
    pinned: int
    live: int
    thread_id: str | None
    about: str
    log_size: int  # -1: no log
    log_mtime_ns: int
    log_ino: int
    about_key: str | None  # the (inode, size, mtime_ns) of about.json, JSON
    manifest_key: str | None  # the same of manifest.json
    seq: int

    @property
    def about_dict(self) -> dict:
        return orjson.loads(self.about) if self.about else {}

    @property
    def stamp(self) -> tuple:
        """``(log length, about.json identity)`` — the stamp :mod:`memfs.usage.reporting` keys
        a session's usage with."""
        about = orjson.loads(self.about_key) if self.about_key else None
        return (self.log_size if self.log_size >= 0 else None), (tuple(about) if about else None)

    def info(self):
        """The row as a :class:`memfs.store.sessioninfo.SessionInfo` (what :mod:`memfs.store.listing`
        shows); its ``updated_ts`` is the last record time (the listing sorts and filters on it)."""
        from memfs.store.sessioninfo import SessionInfo

        return SessionInfo(self.name, self.session_id, self.manifest_status, self.turns, self.events,
                           self.created_at, self.updated_at, self.last_ts, bool(self.readable),
                           imported=bool(self.imported), pinned=bool(self.pinned), live=bool(self.live),
                           agent=self.agent, thread_id=self.thread_id, in_turn=bool(self.in_turn),
                           about=self.about_dict, first_ts=self.first_ts, last_ts=self.last_ts)


class Catalog:
    """The catalog of one sessions root (one per root and process: :func:`catalog_of`).
    Thread-safe; every method may be called from any thread."""

    def __init__(self, root: str | os.PathLike):
        from memfs.store.catalog_db import CatalogDB

        self.root = Path(root)
        self.db = CatalogDB(self.root)
        self._rows: dict[str, Row] | None = None  # the rows as last read, by name
        self._read_key: tuple | None = None
        self._own = 0  # this process's changes (data_version counts only the others')
        self._looked = 0.0  # when _all last asked SQLite whether another process changed it (monotonic)
        self._lock = threading.RLock()
        self.dropped = False  # deleted (its store was left empty): catalog_of makes a new one
        self._verifier: threading.Thread | None = None
        self._verify_work = 0.0  # seconds the last check took (a server's pace of checks)
        self._building = threading.RLock()  # held around the first build (memfs.store.catalog_build)
        self._builder: threading.Thread | None = None
        self._ready = False  # built: its first listing of the root is done
        self._checked = True  # False while a server's first check of a kept catalog runs (check_later)
        self._relisted = (0.0, -1)  # when sync last listed the root (monotonic), and the root's mtime then
        self._listing: Listing | None = None  # made on first use

    # --- keeping it current ----------------------------------------------------------------

    def _guarded(self, work):
        """Run ``work()``; a catalog that fails under use as a file that is not (or no longer) a
        database is deleted, rebuilt, and ``work`` run again. Other errors (a lock held past
        the busy timeout, a full disk) are raised: the file is fine."""
        try:
            return work()
        except sqlite3.OperationalError:
            raise
        except sqlite3.DatabaseError:
            with self._lock:
                self.db.reset()
                self._rows, self._ready = None, False
                self._own += 1
            self.sync()
            return work()

    def run(self, work):
        """``work()`` guarded as the catalog's own reads are (:mod:`memfs.store.catalog_usage`)."""
        return self._guarded(work)

    def refresh(self, names) -> None:
        """Read sessions ``names`` from their folders again (a session that is gone is forgotten)."""
        names = list(names)
        if not names:
            return

        def work() -> None:
            with self._lock:  # (this process's notes of one session never race each other)
                changes()

        def changes() -> None:
            old = {n: self._db_row(n) for n in names}
            rows, gone = [], []
            for name in names:
                was = old[name]
                row = scan(self.root, name)
                if row is None:
                    if was is not None:
                        gone.append(name)
                elif was is None or row[:-1] != astuple(was)[:-1]:  # (unchanged: no write, no new seq)
                    rows.append(row)
            if rows or gone:
                self.db.put(rows, gone)
            self._changed()

        self._guarded(work)

    def forget(self, names) -> None:
        """Sessions ``names`` were removed."""
        names = list(names)

        def work() -> None:
            self.db.put([], names)
            self._changed()

        self._guarded(work)
        if not self._guarded(lambda: self.db.query("SELECT 1 FROM sessions LIMIT 1")) and not session_names(self.root):
            with _CATALOGS_LOCK:  # the store is left empty: so is the catalog (made again by the next session)
                if _CATALOGS.get(os.path.realpath(self.root)) is self:
                    del _CATALOGS[os.path.realpath(self.root)]
                self.dropped = True
                self.db.drop()

    def sync(self, force: bool = False) -> bool:
        """The cheap check (one ``stat`` of the root): when the root's mtime moved (or
        ``force``), list its names again and note the sessions added and removed. A catalog
        never checked (new or rebuilt) is also verified. Returns whether it looked at the names."""
        def work() -> bool:
            try:
                mtime = os.stat(self.root).st_mtime_ns
            except FileNotFoundError:
                mtime = -2
            stored = self.db.meta("root_mtime_ns")
            if (stored == mtime or stored == -3 and self._relisted[1] == mtime  # (racy, but listed here a moment ago)
                    and time.monotonic() - self._relisted[0] < RACY_RELIST) and not force:
                return False
            if stored == -1:  # never listed: built (one build at a time; a second caller finds it built)
                with self._building:
                    if self.db.meta("root_mtime_ns") == -1 and not build_elsewhere(self):
                        build(self, mtime)
                    self._changed()
                return True
            names = session_names(self.root) if mtime != -2 else []
            new, gone = self.db.query("SELECT name FROM sessions ORDER BY name", (), lambda rows: differences(names, rows))
            rows = [row for n in new if (row := scan(self.root, n)) is not None]
            # a root mtime this recent may be shared by a later change: not trusted, so the
            # next read lists the names again
            self._relisted = (time.monotonic(), mtime)
            self.db.put(rows, gone, {"root_mtime_ns": -3 if racy(mtime) else mtime})
            self._changed()
            return True

        return self._guarded(work)

    def verify(self) -> int:
        """List the root's names again (a folder that became a session after the last listing:
        a copy in progress then), stat each session's log, manifest and ``about.json`` and read
        again the sessions whose stat differs from the row's (another process's or a copy's
        change), and those shown as running (a writer may have died); returns how many were
        read again."""
        started = time.perf_counter()
        self.sync(force=True)

        def work() -> int:
            stale = stale_rows(self.db, self.root)
            self.db.put([], [], {"verified": time.time()})
            self.refresh(stale)
            return len(stale)

        try:
            return self._guarded(work)
        finally:
            self._verify_work = time.perf_counter() - started

    def maybe_verify(self, every: float | None = None, background: bool = False) -> None:
        """:meth:`verify` when the last one (of any process) is older than ``every`` seconds
        (default :data:`VERIFY_SECONDS`; with ``background``, on a thread of its own so that a
        server's request does not wait for it, as often as its cost allows: its work at most
        :data:`BACKGROUND_VERIFY_DUTY` of the time, between :data:`BACKGROUND_VERIFY_MIN` and
        :data:`BACKGROUND_VERIFY_SECONDS` apart — a small store's hand-made changes are seen
        within seconds, a large one's within half a minute)."""
        if every is None:
            every = min(BACKGROUND_VERIFY_SECONDS, max(BACKGROUND_VERIFY_MIN, self._verify_work / BACKGROUND_VERIFY_DUTY)) \
                if background else VERIFY_SECONDS
        last = self._guarded(lambda: self.db.meta("verified")) or 0
        if time.time() - last < every:
            return
        if not background:
            self.verify()
            return
        with self._lock:
            if self._verifier is not None and self._verifier.is_alive():
                return
            self._verifier = threading.Thread(target=self._verify_quietly, name="memfs-catalog-verify", daemon=True)
            self._verifier.start()

    def _verify_quietly(self, what=None) -> None:
        from memfs.pace import worker_started

        worker_started()  # (in a mount: below the event loop)
        try:
            (what or self.verify)()
        except Exception:  # a check of a cache: the next one tries again
            log.exception("store catalog check of %s failed", self.root)

    def ready(self) -> bool:
        """Whether the catalog is built (its first listing of the root done, by any process) and
        not being checked for the first time by this server (:meth:`check_later`)."""
        if self.checking():
            return False
        if not self._ready:
            self._ready = self._guarded(lambda: self.db.meta("root_mtime_ns")) != -1
        return self._ready

    def check_later(self) -> None:
        """A server's first check of a catalog kept from before (what changed while no server
        watched: a copy, a hand edit), on a thread of its own: until it is done the catalog
        reads as not built, so listings read the folders, as while a missing one is built."""
        with self._lock:
            if self._builder is not None and self._builder.is_alive():
                return
            self._checked = False
            self._builder = threading.Thread(target=self._check_first, name="memfs-catalog-check", daemon=True)
            self._builder.start()

    def checking(self) -> bool:
        """Whether this server's first check of the catalog (:meth:`check_later`) is under way."""
        return not self._checked

    def _check_first(self) -> None:
        try:
            self._verify_quietly()
        finally:
            self._checked = True

    def build_later(self) -> None:
        """Build the catalog on a thread of its own unless it is built or being built (a
        server's first listing does not wait for it: :mod:`memfs.store.catalog_build`)."""
        with self._lock:
            if self.ready() or (self._builder is not None and self._builder.is_alive()):
                return
            self._builder = threading.Thread(target=self._verify_quietly, args=(self.sync,),
                                             name="memfs-catalog-build", daemon=True)
            self._builder.start()

    def _changed(self) -> None:
        with self._lock:
            self._own += 1

    note_own_change = _changed

    @property
    def own_changes(self) -> int:
        """How many changes this process made (SQLite's ``data_version`` counts the others')."""
        return self._own

    # --- reading -------------------------------------------------------------------------

    def _db_row(self, name: str) -> Row | None:
        from memfs.store.catalog_db import COLUMNS

        rows = self.db.query(f"SELECT {', '.join(COLUMNS)} FROM sessions WHERE name = ?", (name,))
        return Row(*rows[0]) if rows else None

    def _all(self) -> dict[str, Row]:
        """Every row, read again only when the catalog changed since (this process's changes,
        or another's: SQLite's ``data_version``)."""
        from memfs.store.catalog_db import COLUMNS

        def work() -> dict[str, Row]:
            with self._lock:
                now = time.monotonic()
                if self._rows is not None and self._read_key is not None and now - self._looked < FRESH_SECONDS \
                        and self._read_key[1] == self._own:
                    return self._rows
                self._looked = now
                key = (self.db.data_version(), self._own, id(self.db.conn))
                if self._rows is None or key != self._read_key:
                    rows = self.db.query(f"SELECT {', '.join(COLUMNS)} FROM sessions")
                    self._rows = {r[0]: Row(*r) for r in rows}
                    self._read_key = key
                return self._rows

        try:
            return self._guarded(work)
        except sqlite3.Error as exc:  # (busy past the timeout): what it said last, rather than fail a reader
            log.warning("store catalog of %s not read: %s", self.root, exc)
            return self._rows or {}

    def current(self, verify: bool = True, background: bool = False) -> Catalog:
        """:meth:`sync`, and :meth:`maybe_verify` unless ``verify`` is false (on a thread of its
        own with ``background``); returns itself."""
        self.sync()
        if verify:
            self.maybe_verify(background=background)
        return self

    def names(self) -> list[str]:
        """The session names, sorted (as the catalog has them: call :meth:`sync` first)."""
        return self.listing().names()

    def listing(self) -> Listing:
        """The names and ``updated_at`` of the sessions, without the rest of the rows
        (:class:`memfs.store.catalog_listing.Listing`: what a server's listing keeps)."""
        if self._listing is None:
            from memfs.store.catalog_listing import Listing

            with self._lock:
                if self._listing is None:
                    self._listing = Listing(self)
        return self._listing

    def row(self, name: str) -> Row | None:
        return self._all().get(name)

    def recent_rows(self, since: float) -> tuple[int, list[Row]]:
        """``(how many rows there are, the rows whose last record is at or after since)``, most
        recent first: asked of the file (its index on the last record time), not read whole — a
        command's ``--since`` (a server's repeated reads keep every row: :meth:`rows`)."""
        from memfs.store.catalog_db import COLUMNS

        def work() -> tuple[int, list[Row]]:
            with self.db._lock:
                every = self.db.query("SELECT count(*) FROM sessions")[0][0]
                rows = self.db.query(f"SELECT {', '.join(COLUMNS)} FROM sessions WHERE last_ts >= ?", (since,))
            out = [Row(*r) for r in rows]
            out.sort(key=lambda r: r.name)
            out.sort(key=lambda r: r.last_ts, reverse=True)
            return every, out

        return self._guarded(work)

    def rows(self, agent: str | None = None, project: str | None = None, since: float | None = None,
             until: float | None = None, status: str | None = None) -> list[Row]:
        """The rows, most recent last record first (ties by name), filtered as ``memfs sessions``
        filters (:class:`memfs.store.listing.Filter`; ``until`` bounds the last record time)."""
        from memfs.store import listing

        keep = listing.Filter(agent, project, status, since)
        out = []
        for r in self._all().values():
            if until is not None and r.last_ts > until:
                continue
            if since is not None and r.last_ts < since:
                continue
            if (agent is not None or project is not None or status is not None) and not keep(r.info()):
                continue
            out.append(r)
        out.sort(key=lambda r: r.name)
        out.sort(key=lambda r: r.last_ts, reverse=True)
        return out

    def changes_since(self, cursor: int) -> tuple[int, list[Row], list[str] | None]:
        """The change feed: ``(new_cursor, rows changed since cursor, names removed since)``.
        Start with cursor 0; pass the returned cursor next time. A session removed and made again
        comes back as changed only. When ``cursor`` is not of this catalog (0, or the catalog was
        deleted and rebuilt since), every row comes as changed and ``removed`` is None: drop
        whatever is not among them."""
        from memfs.store.catalog_db import COLUMNS

        return self.feed(cursor, COLUMNS, lambda rows: [Row(*r) for r in rows])

    def log_keys_since(self, cursor: int) -> tuple[int, dict[str, int | None], list[str] | None]:
        """:meth:`changes_since` with each changed session's log key (:func:`pack_key`; None: no
        log) instead of its row: what a search index needs, read without the rest."""
        return self.feed(cursor, ("name", "log_ino", "log_size", "log_mtime_ns"),
                         lambda rows: {sys.intern(n): pack_key(ino, size, mtime) if size is not None and ino else None
                                       for n, ino, size, mtime in rows})

    def cursor(self) -> int:
        """The change feed's cursor now (what :meth:`changes_since` would answer), read without a row."""
        def work() -> int:
            with self.db._lock:
                return self.db.meta("generation") * _GENERATION + self.db.meta("seq")

        return self._guarded(work)

    def feed(self, cursor: int, columns, make: Callable[[Iterable[tuple]], Any] = list) -> tuple[int, Any, list[str] | None]:
        """:meth:`changes_since` with the ``columns`` asked (tuples), not rows; ``make``: what
        is made of them as they are read (:meth:`memfs.store.catalog_db.CatalogDB.query`)."""
        def work():
            with self.db._lock:
                seq, generation = self.db.meta("seq"), self.db.meta("generation")
                since = cursor - generation * _GENERATION if cursor // _GENERATION == generation else None
                rows = self.db.query(f"SELECT {', '.join(columns)} FROM sessions WHERE seq > ? AND seq <= ? "
                                     "ORDER BY seq", (since or 0, seq), make)
                removed = self.db.query("SELECT name FROM removed WHERE seq > ? AND seq <= ? ORDER BY seq",
                                        (since, seq)) if since is not None else None
            return generation * _GENERATION + seq, rows, [r[0] for r in removed] if removed is not None else None

        return self._guarded(work)

    def close(self) -> None:
        self.db.close()


_CATALOGS: dict[str, Catalog] = {}
_CATALOGS_LOCK = threading.Lock()


_BY_PATH: dict[str, Catalog] = {}  # the same, by the path as given (no realpath per call)


def catalog_of(root: str | os.PathLike) -> Catalog:
    """This process's :class:`Catalog` of the sessions root ``root``."""
    given = os.fspath(root)
    found = _BY_PATH.get(given)
    if found is not None and not found.dropped:
        return found
    key = os.path.realpath(root)
    with _CATALOGS_LOCK:
        found = _CATALOGS.get(key)
        if found is None:
            found = _CATALOGS[key] = Catalog(root)
        _BY_PATH[given] = found
        return found


def noted(session_dir: Path) -> None:
    """Session ``session_dir`` changed (a commit's metadata persist, a lock release, an
    about.json merge, a pin): its row is read again. Never fails its caller: a catalog that
    cannot be written is only a slower listing (the next check reads the folder)."""
    if session_dir.name.startswith("."):
        return  # not a session (memfs migrate assembles one in a hidden folder): its rename into place is seen
    if catalog_defer.held(session_dir):
        return
    try:
        catalog_of(session_dir.parent).refresh([session_dir.name])
    except Exception as exc:  # a cache: nothing of the caller's depends on it
        log.debug("store catalog not updated for %s: %s", session_dir, exc)


def forgotten(root: str | os.PathLike, name: str) -> None:
    """Session ``name`` was removed from ``root``."""
    try:
        catalog_of(root).forget([name])
    except Exception as exc:
        log.debug("store catalog not updated for %s/%s: %s", root, name, exc)


def list_sessions(root: str | os.PathLike):
    """Every session of the store as :class:`memfs.store.sessioninfo.SessionInfo`, most recent
    last record first (ties by name), from the catalog brought up to date (:meth:`Catalog.current`)."""
    return [r.info() for r in catalog_of(root).current().rows()]


def _after_fork_in_child() -> None:
    global _CATALOGS_LOCK
    _CATALOGS.clear()
    _BY_PATH.clear()  # the parent's connections are not this process's to use
    _CATALOGS_LOCK = threading.Lock()  # (the parent may have held it at the fork)


os.register_at_fork(after_in_child=_after_fork_in_child)
