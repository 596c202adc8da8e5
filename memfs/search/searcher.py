"""Search over a sessions root: keep a :class:`SearchIndex` in step with the memory views.

:func:`store_searcher` is what the mount uses (one long-lived index, brought up to date before
each query); :func:`search_store` is what ``memfs search`` uses (a read-only store, indexed for
this one query). Both index lazily: a session's facts are read only when a query needs them,
so opening a store or mounting it does no search work.

Decisions recorded here:

* A query with no tokens (``""``, ``"???"``) raises :class:`~memfs.errors.NotFound` — the
  mount answers ``ENOENT`` for it, as for an empty name.
* A session's ``created_at`` comes from its manifest. A session opened read-only without a
  readable ``manifest.json`` has no known creation time (the live manifest would report
  the open time), so its recency factor is 1.0.
* A session's memory view is asked again only when its log changed on disk (inode, size,
  mtime: one ``lstat``) or, while this store holds it open, its handle's ``version`` or
  ``rewrites`` moved since the last query; a session the store's LRU closed is not reopened
  for a query unless its log changed, so a root query over 100,000 sessions opens only the
  changed ones. Within one view ``generation`` the fact list only grows, so only
  the new facts are indexed; a new generation (cap rewrite, reopen) refreshes offsets or
  re-indexes that session (see :meth:`SearchIndex.sync_session`).
* A search over the whole store leaves out (and logs) a session that cannot be opened — a
  symlink planted in it, an unreadable file — rather than failing for every session; what was
  indexed of it is dropped. A search of that one session fails with its error.
* The same query asked again while no session changed (the index was not touched by the
  refresh every query makes) returns the results it got last time, for up to
  :data:`MEMO_SECONDS`: one ``cat`` of a search file asks three times (lookup, ``fstat``,
  ``open``), and only the first pays for the scoring. The bound keeps the recency factor
  from going stale.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from memfs.errors import MemfsError, NotFound
from memfs.search.index import DEFAULT_MAX_RESULTS, DEFAULT_MIN_SCORE, SearchIndex
from memfs.search.tokenize import query_tokens
from memfs.store.meta import parse_rfc3339
from memfs.store.paths import EVENTS, MANIFEST
from memfs.store.root import Store, StoreSettings
from memfs.store.session import SessionHandle

Searcher = Callable[[str, "str | None", "int | None", "float | None"], list]

log = logging.getLogger("memfs.search")

MEMO_SECONDS = 1.0  # how long an unchanged index may answer a repeated query from memory
MEMO_ENTRIES = 64  # queries remembered at most (all forgotten when full)


def created_at_of(handle: SessionHandle) -> float | None:
    """The session's ``created_at`` in unix seconds, or None when it is not known."""
    if handle.read_only and not os.path.lexists(handle.path / MANIFEST):
        return None
    return parse_rfc3339(handle.manifest.get("created_at") or "")


def _log_key(path: str) -> tuple | None:
    """What changes when a log changes on disk: an append (size, mtime), a rewrite (inode)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def sync_from_handle(index: SearchIndex, handle: SessionHandle) -> None:
    """Bring ``handle``'s session in ``index`` up to date with its memory view."""
    from memfs.views import memory_facts  # floor 3 sibling; imported late so search loads alone

    facts, (generation, _count) = memory_facts(handle)
    index.sync_session(handle.name, handle.session_id, created_at_of(handle), facts,
                       generation=generation)


def store_searcher(store: Store, *, max_results: int = DEFAULT_MAX_RESULTS,
                   min_score: float = DEFAULT_MIN_SCORE) -> Searcher:
    """A thread-safe ``searcher(query, session, k, min_score) -> [result]`` over ``store``.

    ``session`` None searches every session of the store as one corpus; ``k`` and
    ``min_score`` None take the defaults given here. Sessions that vanished from the store are
    dropped from the index.
    """
    index = SearchIndex()
    # name → (the log's key on disk, (handle, version, rewrites)) when last indexed: a session
    # is fresh while its log is unchanged on disk and, if this store holds it open, its
    # handle's key is too (buffered appends not yet on disk); one the LRU closed is not
    # reopened — so a root query does not reopen every session of a large store (SPEC §3.5:
    # at most max_open_sessions are open)
    seen: dict[str, tuple[tuple | None, tuple[int, int, int]]] = {}
    sync_lock = threading.Lock()
    left_out: dict[str, str] = {}  # sessions that could not be opened → why (logged once)
    changes = 0  # bumped (under sync_lock) whenever a refresh changes the index
    memo: dict[tuple, tuple[int, float, list[dict]]] = {}  # query args → (changes, when, results)

    def refresh(names: list[str], whole_store: bool) -> None:
        """Index ``names``; across the whole store, a session that cannot be opened or read
        (a hostile file in it) is left out and logged once: it never costs the others."""
        nonlocal changes
        root = os.fspath(store.root)
        for name in names:
            try:
                on_disk = _log_key(f"{root}/{name}/{EVENTS}")
                last = seen.get(name)
                held = store.held(name)
                if last is not None and last[0] == on_disk and (
                        held is None or last[1] == (id(held), held.version, held.rewrites)):
                    left_out.pop(name, None)
                    continue
                handle = store.open(name)
                key = (id(handle), handle.version, handle.rewrites)
                sync_from_handle(index, handle)
                seen[name] = (on_disk, key)
                changes += 1
            except (MemfsError, OSError) as exc:
                if not whole_store:
                    raise
                if left_out.get(name) != str(exc):  # once, not at every query
                    left_out[name] = str(exc)
                    log.warning("search: session %s left out: %s", name, exc)
                if seen.pop(name, None) is not None:
                    index.remove_session(name)
                    changes += 1
                continue
            left_out.pop(name, None)

    def searcher(query: str, session: str | None = None, k: int | None = None,
                 min_score_: float | None = None) -> list[dict]:
        nonlocal changes
        if not query_tokens(query):
            raise NotFound(f"no search terms in {query!r}")
        args = (query, session, k, min_score_)
        with sync_lock:
            if session is None:
                names = store.names()
                for gone in set(seen) - set(names):
                    index.remove_session(gone)
                    del seen[gone]
                    changes += 1
            else:
                if not store.exists(session):
                    raise NotFound(f"no session {session!r}")
                names = [session]
            refresh(names, whole_store=session is None)
            state, now = changes, time.monotonic()
            hit = memo.get(args)
            if hit is not None and hit[0] == state and now - hit[1] < MEMO_SECONDS:
                return [dict(r) for r in hit[2]]
        results = index.search(query, sessions=None if session is None else [session],
                               max_results=max_results if k is None else k,
                               min_score=min_score if min_score_ is None else min_score_)
        with sync_lock:
            if len(memo) >= MEMO_ENTRIES:
                memo.clear()
            memo[args] = (state, now, results)
        return [dict(r) for r in results]

    def warm(names: list[str]) -> None:
        """Index these sessions now (the mount warms the index in the background at start,
        so the first whole-store query does not pay for building it)."""
        with sync_lock:
            refresh(names, whole_store=True)

    searcher.index = index  # for introspection (stats, tests)
    searcher.warm = warm
    return searcher


def search_store(root: str | os.PathLike, query: str, *, session: str | None = None,
                 k: int = DEFAULT_MAX_RESULTS, min_score: float = DEFAULT_MIN_SCORE) -> list[dict]:
    """One search over the sessions root ``root``, opening sessions read-only (``memfs search``).

    ``session`` is a session directory name; :class:`~memfs.errors.NotFound` when it does not
    exist or when the query has no tokens.
    """
    store = Store(root, StoreSettings(read_only=True))
    try:
        return store_searcher(store)(query, session, k, min_score)
    finally:
        store.close()
