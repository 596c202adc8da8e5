"""The store catalog's first build (SPEC §14): a store without a catalog (never made, deleted, or
found unreadable) has every session read from its folder once.

At 10,000 sessions that is seconds of work, so:

* the build commits its rows as it goes (:data:`CHUNK` sessions per transaction): a reader sees
  the rows made so far, and another process building at the same time reads only what is not
  there yet;
* one build per process at a time (:meth:`memfs.store.catalog.Catalog.sync` holds the catalog's
  build lock around it; a second caller waits for the first and finds it built);
* a server has it built by its helper process (:func:`build_elsewhere`: another interpreter
  lock, another CPU), and follows the rows as they are committed; built in the server's own
  process (no helper), on a background thread it gives way to requests (:func:`memfs.pace.pace`);
* a server does not wait for it (:meth:`memfs.store.catalog.Catalog.build_later`: on a thread
  of its own): ``sessions/`` is listed from the folder names meanwhile
  (:meth:`memfs.store.root.Store.names`), a session not catalogued yet is stat'ed from its
  folder (:func:`memfs.store.sessioninfo.updated_at_of`), and what needs every row (usage
  totals, a search's corpus) waits for the build — never a partial answer.

A catalog built from scratch is checked as it is read, so its first check is the build itself
(its ``verified`` time is the build's start); rows found already there (another process's
build, cut short) are checked at once (:meth:`memfs.store.catalog.Catalog.verify`).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from memfs.pace import pace
from memfs.store.catalog_db import differences
from memfs.store.paths import EVENTS, MANIFEST

if TYPE_CHECKING:
    from memfs.store.catalog import Catalog

log = logging.getLogger("memfs.store")

CHUNK = 256  # sessions read per transaction
ELSEWHERE_MIN = 1000  # entries in the root from which a server builds in its helper process


RACY_NS = 20_000_000  # a root mtime younger than this may be shared by a later change (see racy)…
RACY_WHOLE_SECONDS_NS = 2_000_000_000  # …or than this, on a filesystem keeping whole seconds


def racy(mtime: int) -> bool:
    """Whether the root's mtime ``mtime``, read before a listing that just ended, may also be the
    mtime of a change made after it: the kernel stamps a change with its coarse clock, at most one
    tick (≤ 10 ms) behind the fine one, so an mtime older than two ticks cannot be shared by a
    later change. An mtime of whole seconds says the filesystem keeps no more (FAT, some network
    filesystems): then two seconds. A racy mtime is not trusted: the next read lists the root again."""
    if mtime < 0:
        return False
    window = RACY_WHOLE_SECONDS_NS if mtime % 1_000_000_000 == 0 else RACY_NS
    return time.time_ns() - mtime < window


def build(catalog: Catalog, mtime: int) -> None:
    """Read every session of ``catalog``'s root that it has no row of, forget the rows of
    sessions gone, and note the root's mtime (``mtime``, -2: no root) as listed."""
    from memfs.store.sessiondirs import session_names

    started = time.time()
    db, root = catalog.db, catalog.root
    names = session_names(root) if mtime != -2 else []
    new, gone = db.query("SELECT name FROM sessions ORDER BY name", (), lambda rows: differences(names, rows))
    # rows writers noted before this first listing are checked against the disk as a verify
    # does, before the catalog reads as built (a hand edit or a copy meanwhile)
    todo = new + stale_rows(db, root)
    for i in range(0, len(todo), CHUNK):
        rows = []
        for name in todo[i:i + CHUNK]:
            pace()  # (on a mount's background thread: requests first)
            row = scan(root, name)
            if row is not None:
                rows.append(row)
        if rows:
            db.put(rows)
            catalog.note_own_change()
    meta: dict[str, float] = {"root_mtime_ns": -3 if racy(mtime) else mtime, "verified": started}
    db.put([], gone, meta)
    catalog.note_own_change()
    log.info("store catalog of %s built: %d sessions read in %.1f s", root, len(todo), time.time() - started)


def stale_rows(db, root) -> list[str]:
    """The sessions whose row the disk contradicts: their log's size, mtime or inode, their
    ``about.json`` or manifest changed, or shown as running (a writer may have died)."""
    stale = []
    top = os.fspath(root)
    after = ""
    while page := db.query("SELECT name, log_size, log_mtime_ns, log_ino, about_key, manifest_key, live FROM sessions "
                           "WHERE name > ? ORDER BY name LIMIT ?", (after, CHUNK)):  # (a page at a time: 100,000 rows at once cost ~40 MiB)
        for name, size, mtime, ino, about_key, manifest_key, live in page:
            d = os.path.join(top, name)
            st = _lstat(os.path.join(d, EVENTS))
            now = (st.st_size, st.st_mtime_ns, st.st_ino) if st is not None else (-1, 0, 0)
            if live or now != (size, mtime, ino) or _json_key(os.path.join(d, "index", "about.json")) != about_key \
                    or _json_key(os.path.join(d, MANIFEST)) != manifest_key:
                stale.append(name)
        after = page[-1][0]
    return stale


# --- a row read from a session's folder ---------------------------------------------------------

def _key(st: os.stat_result | None) -> list[int] | None:
    return [st.st_ino, st.st_size, st.st_mtime_ns] if st is not None else None


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def _json_key(path: str) -> str | None:
    st = _lstat(path)
    return orjson.dumps(_key(st)).decode() if st is not None else None


def scan(root: Path, name: str) -> tuple | None:
    """The row of session ``name`` read from its folder now (a tuple in column order, ``seq``
    0), or None when it is not a session."""
    from memfs.store import listing
    from memfs.store.sessiondirs import is_session_dir
    from memfs.store.sessioninfo import info_of

    path = root / name
    if name.startswith(".") or not is_session_dir(path):  # (a hidden folder is never a session: a migration's)
        return None
    top = os.fspath(path)
    log_st, about_st = _lstat(os.path.join(top, EVENTS)), _lstat(os.path.join(top, "index", "about.json"))
    manifest_st = _lstat(os.path.join(top, MANIFEST))
    info = info_of(path)
    about = info.about
    model = about.get("model")
    return (name, info.session_id, info.agent, listing.project(info), _text(about.get("cwd")),
            model if type(model) is str else None, listing.title(info), listing.status(info), info.status,
            info.first_ts, info.last_ts, info.created_at, info.updated_at, info.updated_ts, info.turn_count,
            info.event_count, int(info.in_turn), int(info.readable), int(info.imported), int(info.pinned),
            int(info.live), info.thread_id, orjson.dumps(about).decode(),
            log_st.st_size if log_st is not None else -1, log_st.st_mtime_ns if log_st is not None else 0,
            log_st.st_ino if log_st is not None else 0,
            orjson.dumps(_key(about_st)).decode() if about_st is not None else None,
            orjson.dumps(_key(manifest_st)).decode() if manifest_st is not None else None, 0)


def _text(value) -> str | None:
    return value if type(value) is str and value else None


# --- the build in the server's helper process --------------------------------------------------

def build_elsewhere(catalog: Catalog) -> bool:
    """Build ``catalog``'s file in this process's helper process
    (:class:`memfs.store.rescanner.RescanHelper`, a server's: its own interpreter lock, so the
    server's requests do not share theirs with the build, nice 10); whether it did (False: no
    helper, a catalog kept in memory, a store of fewer than :data:`ELSEWHERE_MIN` entries, or
    the build failed there — the caller builds in-process)."""
    from memfs.store import rescanner

    helper = rescanner.current()
    if helper is None or catalog.db.path is None:
        return False
    try:  # a small store is built here sooner than a helper process starts
        if len(os.listdir(catalog.root)) < ELSEWHERE_MIN:
            return False
    except OSError:
        return False
    failed = helper.call(build_root, os.fspath(catalog.root))
    if failed:
        log.warning("store catalog of %s not built by the helper process (%s): built here", catalog.root, failed)
    return failed == ""


def build_root(root: str) -> str:
    """In the helper process: build the catalog of ``root``; "" or why it failed."""
    from memfs.store.catalog import catalog_of

    try:
        catalog_of(root).sync()
    except Exception as exc:  # noqa: BLE001 — said to the caller, which builds in-process then
        return f"{type(exc).__name__}: {exc}"
    return ""
