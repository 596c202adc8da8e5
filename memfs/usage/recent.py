"""The status line's summary of the store's usage: ``<store>/.memfs/usage-recent.sqlite``.

``memfs statusline`` runs at every redraw and needs, of a store of any size, only this
conversation's cost, today's and the active billing block's. The summary holds just that:

* ``sessions``: per session its priced cost, its dated turns and how many of them are priced
  (a model without a price took part when fewer);
* ``recent``: ``(at, cost)`` of every dated turn of the store from the first turn of the billing
  block that holds ``min(local midnight, written - 5 h)`` on (or all of them): cutting the
  sorted turns at a block's first turn leaves the blocks after it as they were
  (:func:`memfs.usage.windows.split` decides each block from its own turns), and the block active
  at any later time starts after ``written - 5 h``, so today's turns and the active block's are
  all there until the store changes;
* ``meta``: the usage index's key (view version, index format, prices: JSON), the shipped price
  table's ``(size, mtime_ns)``, the store catalog's cursor when the turns were read, and the
  root's mtime after the usage index was written.

It is current while the catalog's cursor and the root's mtime are what it recorded (every
writer moves the first, a session folder made or deleted by hand the second): one ``stat``, a
lookup by name and the recent turns, whatever the store's size. In ``.memfs/`` beside the
catalog, so writing it does not move the root's mtime; written whole and renamed into place by
:func:`memfs.usage.reporting.contributions` (with the usage index) whenever it is not current.
A cache: deleting it costs the next status line one pass over the usage index.

Imported by the status line: the standard library only, until something is written.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Sequence

FILE = os.path.join(".memfs", "usage-recent.sqlite")
FORMAT = 1
BLOCK = 5 * 3600  # memfs.usage.windows.BLOCK (not imported: the status line loads nothing else)
_TABLE = os.path.join(os.path.dirname(__file__), "prices.toml")  # memfs.usage.prices.TABLE_FILE


def catalog_cursor(root: str | os.PathLike) -> list[int] | None:
    """The store catalog's cursor, ``[generation, seq]`` (None: no catalog, or it cannot be
    read), read without loading the catalog's module."""
    path = os.path.join(root, ".memfs", "catalog.sqlite")
    if not os.path.exists(path):
        return None
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=0.5)
        try:
            meta = dict(conn.execute("SELECT key, value FROM meta WHERE key IN ('seq', 'generation')").fetchall())
        finally:
            conn.close()
        return [meta["generation"], meta["seq"]]
    except (sqlite3.Error, KeyError, TypeError):
        return None


def _table_stamp() -> list[int] | None:
    try:
        st = os.stat(_TABLE)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns]


def read(root: str | os.PathLike, session: str | None = None) -> tuple[str, list | None, list] | None:
    """``(the usage index key as JSON text, session's [priced cost, turns, priced turns] or None,
    the recent [at, cost] turns)`` when the summary is current, else None. The caller checks
    the key against the prices in force."""
    path = os.path.join(root, FILE)
    if not os.path.exists(path):
        return None
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
        try:
            meta = dict(conn.execute("SELECT k, v FROM meta").fetchall())
            if meta.get("format") != FORMAT or meta.get("table") != repr(_table_stamp()) or \
                    os.stat(root).st_mtime_ns != meta.get("root_mtime_ns") or \
                    repr(catalog_cursor(root)) != meta.get("cursor"):
                return None
            found = conn.execute("SELECT priced, turns, n_priced FROM sessions WHERE name = ?",
                                 (session,)).fetchone() if session is not None else None
            recent = [list(r) for r in conn.execute("SELECT at, cost FROM recent ORDER BY rowid")]
        finally:
            conn.close()
        return meta["key"], list(found) if found else None, recent
    except (OSError, sqlite3.Error, KeyError, TypeError):
        return None


def build(uses: dict[str, Sequence], now: float | None = None) -> tuple[dict[str, list], list[list]]:
    """``({session: [priced cost, turns, priced turns]}, the recent [at, cost] turns, sorted)`` of
    ``{session: [[at, model, tokens, cost, …], …]}`` (see the module docstring; ``now=None``:
    every turn)."""
    from memfs.usage.windows import split

    sessions = {}
    for name, us in uses.items():
        priced = [u[3] for u in us if u[3] is not None]
        sessions[name] = [sum(priced), len(us), len(priced)]
    every = sorted(([u[0], u[3]] for us in uses.values() for u in us), key=lambda u: u[0])
    if now is None:
        return sessions, every
    local = time.localtime(now)
    midnight = time.mktime((local.tm_year, local.tm_mon, local.tm_mday, 0, 0, 0, 0, 0, -1))
    bound = min(midnight, now - BLOCK)
    first = 0
    for start, begin, _stop, gap in split([u[0] for u in every]):
        if not gap and start <= bound:
            first = begin
    return sessions, every[first:]


def write(root: str | os.PathLike, uses: dict[str, Sequence], key: str, cursor: list[int] | None,
          now: float | None = None) -> None:
    """Replace the summary with that of ``{session: [[at, model, tokens, cost, …], …]}`` (the
    usage index's turns, read at the catalog's ``cursor``; ``key``: the index's key as JSON).
    A cache: a failure is left for the next writer."""
    if cursor is None or not os.access(root, os.W_OK):
        return
    now = time.time() if now is None else now
    sessions, every = build(uses, now)
    path = os.path.join(root, FILE)
    part = f"{path}.{os.getpid()}.part"
    try:
        if os.path.lexists(part):
            os.unlink(part)
        os.close(os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))  # the store's mode
        conn = sqlite3.connect(part)
        try:
            conn.executescript("CREATE TABLE meta (k TEXT PRIMARY KEY, v);"
                               "CREATE TABLE sessions (name TEXT PRIMARY KEY, priced REAL, turns INTEGER, "
                               "n_priced INTEGER);"
                               "CREATE TABLE recent (at REAL, cost REAL);")
            conn.executemany("INSERT INTO sessions VALUES (?, ?, ?, ?)", [(n, *e) for n, e in sessions.items()])
            conn.executemany("INSERT INTO recent VALUES (?, ?)", every)
            conn.executemany("INSERT INTO meta VALUES (?, ?)", [
                ("format", FORMAT), ("key", key), ("table", repr(_table_stamp())), ("cursor", repr(cursor)),
                ("written", now), ("root_mtime_ns", os.stat(root).st_mtime_ns)])
            conn.commit()
        finally:
            conn.close()
        os.replace(part, path)
    except (OSError, sqlite3.Error):
        try:
            os.unlink(part)
        except OSError:
            pass
