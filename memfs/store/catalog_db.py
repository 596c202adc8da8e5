"""The store catalog's file: one SQLite database (stdlib ``sqlite3``, WAL) per sessions root, at
``<root>/.memfs/catalog.sqlite`` (SPEC §14; the decision is in ``docs/design.md``, "The store
catalog").

A cache: deleting it loses nothing (:mod:`memfs.store.catalog` rebuilds it from the sessions'
folders). A file that cannot be read — corrupt, another schema, not a database — is deleted and
made again. Several processes write it: every write is one short ``BEGIN IMMEDIATE``
transaction with a busy timeout, and nothing is held between calls. A store that cannot be
written (a read-only mount of someone else's store) gets a catalog in memory, built once per
process.

Rows carry ``seq``, the value of a counter bumped by every change of the catalog: the change
feed (:meth:`CatalogDB.changes_since`) is the rows and removals with a ``seq`` past a cursor.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from memfs.store.paths import ensure_private_dir

log = logging.getLogger("memfs.store")

DIR = ".memfs"  # hidden: never a session name
FILE = "catalog.sqlite"
SCHEMA = 5  # (5: a session's usage rows in a table of their own, memfs.store.catalog_usage)
BUSY_MS = 5000  # how long a writer waits for another process's transaction
WAL_PAGES = 32  # the WAL is checkpointed (and cut back) past this many pages

#: The columns of a row, in order (``about`` is JSON text; a session's usage is in the tables of
#: :mod:`memfs.store.catalog_usage`).
COLUMNS = ("name", "session_id", "agent", "project", "cwd", "model", "title", "status", "manifest_status",
           "first_ts", "last_ts", "created_at", "updated_at", "updated_ts", "turns", "events", "in_turn",
           "readable", "imported", "pinned", "live", "thread_id", "about", "log_size", "log_mtime_ns", "log_ino",
           "about_key", "manifest_key", "seq")

_DDL = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value);
CREATE TABLE IF NOT EXISTS sessions (
  name TEXT PRIMARY KEY, session_id TEXT, agent TEXT, project TEXT, cwd TEXT, model TEXT, title TEXT,
  status TEXT, manifest_status TEXT, first_ts REAL, last_ts REAL, created_at TEXT, updated_at TEXT,
  updated_ts REAL, turns INTEGER, events INTEGER, in_turn INTEGER, readable INTEGER, imported INTEGER,
  pinned INTEGER, live INTEGER, thread_id TEXT, about TEXT, log_size INTEGER, log_mtime_ns INTEGER,
  log_ino INTEGER, about_key TEXT, manifest_key TEXT, seq INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS sessions_last ON sessions (last_ts);
CREATE INDEX IF NOT EXISTS sessions_project ON sessions (project);
CREATE INDEX IF NOT EXISTS sessions_agent ON sessions (agent);
CREATE INDEX IF NOT EXISTS sessions_seq ON sessions (seq);
CREATE TABLE IF NOT EXISTS removed (name TEXT PRIMARY KEY, seq INTEGER NOT NULL);
INSERT OR IGNORE INTO meta VALUES ('schema', {SCHEMA}), ('seq', 0), ('root_mtime_ns', -1), ('verified', 0),
  ('generation', 1 + abs(random()) % 1000000000);
"""

_UPSERT = (f"INSERT OR REPLACE INTO sessions ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})")


def _boot_id() -> str | None:
    """This boot's id (Linux), None when unknown."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            return f.read().strip().decode("ascii") or None
    except (OSError, UnicodeDecodeError):
        return None


def differences(listed: list[str], rows: Iterable[tuple]) -> tuple[list[str], list[str]]:
    """``(names listed without a row, rows' names not listed)``: ``listed`` sorted and ``rows``
    (``(name,)``) in name order (SQLite's ``BINARY`` order of UTF-8 is the code points' order),
    walked together — no set of either at 100,000 sessions."""
    new: list[str] = []
    gone: list[str] = []
    i, n = 0, len(listed)
    for (name,) in rows:
        while i < n and listed[i] < name:
            new.append(listed[i])
            i += 1
        if i < n and listed[i] == name:
            i += 1
        else:
            gone.append(name)
    new.extend(listed[i:])
    return new, gone


class CatalogDB:
    """One connection to a root's catalog, shared by this process's threads (a lock serializes
    them; SQLite serializes the processes)."""

    def __init__(self, root: Path):
        self.root = root
        self.path: Path | None = root / DIR / FILE
        self._lock = threading.RLock()
        self.conn = self._connect()

    # --- opening -------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        try:
            return self._open_file()
        except (sqlite3.DatabaseError, OSError) as exc:
            if self.path is not None and not isinstance(exc, PermissionError) and os.access(self.root, os.W_OK):
                log.warning("store catalog %s unreadable (%s): rebuilt", self.path, exc)
                self._delete_files()
                try:
                    return self._open_file()
                except (sqlite3.DatabaseError, OSError) as again:
                    exc = again
            log.info("store catalog of %s kept in memory: %s", self.root, exc)
            self.path = None
            conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
            conn.executescript(_DDL)
            return conn

    def _open_file(self) -> sqlite3.Connection:
        assert self.path is not None
        if not os.access(self.root, os.W_OK):
            raise PermissionError(f"{self.root} is not writable")
        ensure_private_dir(self.path.parent)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        os.close(fd)
        conn = sqlite3.connect(self.path, timeout=BUSY_MS / 1000, check_same_thread=False, isolation_level=None)
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_MS}")
            if conn.execute("PRAGMA journal_mode = WAL").fetchone()[0].lower() != "wal":
                raise sqlite3.DatabaseError("WAL mode refused")
            conn.execute("PRAGMA synchronous = OFF")  # a cache: no fsync (a file a crash spoiled is deleted and rebuilt)
            conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_PAGES}")  # a small WAL: the store's disk is the logs'
            conn.execute(f"PRAGMA journal_size_limit = {WAL_PAGES * 4096}")
            try:  # (a catalog already made is opened without a write: another process may hold the lock)
                schema = conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()[0]
            except (sqlite3.OperationalError, TypeError):  # no table, no row: a new file
                conn.executescript(_DDL)
                schema = conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()[0]
            if schema != SCHEMA:
                raise sqlite3.DatabaseError(f"schema {schema}, not {SCHEMA}")
            boot = _boot_id()
            if boot is None or conn.execute("SELECT value FROM meta WHERE key = 'checked_boot'").fetchone() != (boot,):
                # the only crash synchronous=OFF can spoil a file by is the system's (or the file came
                # from elsewhere): checked once per boot; a page found bad under use is caught then
                # (Catalog._guarded: deleted and rebuilt)
                if conn.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                    raise sqlite3.DatabaseError("quick_check failed")
                if boot is not None:  # (another process holding the write lock: checked again next open)
                    with contextlib.suppress(sqlite3.OperationalError):
                        conn.execute("INSERT OR REPLACE INTO meta VALUES ('checked_boot', ?)", (boot,))
        except BaseException:
            conn.close()
            raise
        return conn

    def _delete_files(self) -> None:
        assert self.path is not None
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{self.path}{suffix}")

    def reset(self) -> None:
        """The file failed under use (corrupt): delete it and start empty (the caller rebuilds)."""
        with self._lock:
            with contextlib.suppress(sqlite3.Error):
                self.conn.close()
            if self.path is not None:
                log.warning("store catalog %s failed: rebuilt", self.path)
                self._delete_files()
            self.conn = self._connect()

    def close(self) -> None:
        with self._lock, contextlib.suppress(sqlite3.Error):
            self.conn.close()

    def drop(self) -> None:
        """Close and delete the catalog (its store has no session left: a store left empty
        holds nothing of memfs's)."""
        with self._lock:
            self.close()
            if self.path is not None:
                self._delete_files()
                with contextlib.suppress(FileNotFoundError):  # the status line's usage summary (memfs.usage.recent)
                    os.unlink(os.path.join(self.path.parent, "usage-recent.sqlite"))
                with contextlib.suppress(OSError):
                    os.rmdir(self.path.parent)

    # --- reading -------------------------------------------------------------------------

    def query(self, sql: str, args: tuple = (), make: Callable[[Iterable[tuple]], Any] = list) -> Any:
        """``make`` of the rows (a list by default), made as they are read: a caller that keeps
        less than the rows (a set of names, a dict) never holds every row at once."""
        with self._lock:
            return make(self.conn.execute(sql, args))

    def meta(self, key: str):
        rows = self.query("SELECT value FROM meta WHERE key = ?", (key,))
        return rows[0][0] if rows else None

    def data_version(self) -> int:
        """Changes when another connection (process) committed since the last call."""
        with self._lock:
            return self.conn.execute("PRAGMA data_version").fetchone()[0]

    # --- writing -------------------------------------------------------------------------

    @contextlib.contextmanager
    def transaction(self):
        """One short write transaction; yields a function giving the next ``seq``."""
        with self._lock:
            conn = self.conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                seq = [conn.execute("SELECT value FROM meta WHERE key = 'seq'").fetchone()[0]]

                def next_seq() -> int:
                    seq[0] += 1
                    return seq[0]

                yield next_seq
                conn.execute("UPDATE meta SET value = ? WHERE key = 'seq'", (seq[0],))
                conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise

    def put(self, rows: list[tuple], removed: list[str] | tuple = (), meta: dict | None = None) -> None:
        """Store ``rows`` (tuples in :data:`COLUMNS` order, ``seq`` last and replaced) and forget
        the sessions ``removed``, in one transaction."""
        with self.transaction() as next_seq:
            conn = self.conn
            for row in rows:
                conn.execute(_UPSERT, (*row[:-1], next_seq()))
                conn.execute("DELETE FROM removed WHERE name = ?", (row[0],))
            for name in removed:
                if conn.execute("DELETE FROM sessions WHERE name = ?", (name,)).rowcount:
                    conn.execute("INSERT OR REPLACE INTO removed VALUES (?, ?)", (name, next_seq()))
            for key, value in (meta or {}).items():
                conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))
