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
* The options of SPEC §5.1 (:mod:`memfs.search.options`) pick one of several indexes
  (:class:`~memfs.search.corpora.Corpus`: an analysis, with or without outputs), each made
  by the first query that asks for it and kept in step by the same freshness checks; the
  filters restrict the corpus before scoring (:mod:`memfs.search.corpora`). A ``session=``
  option in a session's own ``search/`` naming another session is :class:`BadQuery`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol, cast

from memfs.errors import BadQuery, MemfsError, NotFound
from memfs.search.analysis import analyzer
from memfs.search.corpora import Corpus, allowed_turns, sessions_matching, turn_table
from memfs.search.index import DEFAULT_MAX_RESULTS, DEFAULT_MIN_SCORE, SearchIndex
from memfs.search.options import SearchOptions, parse_options
from memfs.search.outputs import OutputLog
from memfs.search.tokenize import query_tokens
from memfs.store.meta import parse_rfc3339
from memfs.store.paths import EVENTS, MANIFEST, sanitize
from memfs.store.root import Store, StoreSettings
from memfs.store.session import SessionHandle

Searcher = Callable[..., list]  # (query, session, k, min_score, options=None) -> results


class StoreSearcher(Protocol):
    """What :func:`store_searcher` returns: the search, and what the mount and tests look at."""

    index: SearchIndex  # the default index (SPEC §5's analysis, facts only)
    warm: Callable[[list[str]], None]  # index these sessions ahead of the first whole-store query
    stats: Callable[[], dict]  # per index made so far: its sizes

    def __call__(self, query: str, session: str | None = None, k: int | None = None,
                 min_score: float | None = None, options: Any = None) -> list[dict]: ...

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
                   min_score: float = DEFAULT_MIN_SCORE,
                   defaults: SearchOptions | Mapping[str, str] | None = None) -> StoreSearcher:
    """A thread-safe ``searcher(query, session, k, min_score, options=None) -> [result]`` over
    ``store``.

    ``session`` None searches every session of the store as one corpus; ``k`` and
    ``min_score`` None take the options' (else the defaults given here). ``options`` is a
    :class:`~memfs.search.options.SearchOptions` or the ``{name: text}`` parameters of SPEC
    §5.1, laid over ``defaults`` by :func:`~memfs.search.options.parse_options`
    (:class:`~memfs.errors.BadQuery` for a bad one); ``defaults`` given as parameters (the
    config's ``[search]``) are parsed at each query, so an age (``since="7d"``) moves with
    time. Sessions that vanished from the store are dropped from the index.
    """
    default = Corpus()
    corpora: dict[tuple, Corpus] = {default.key: default}  # made on first use (SPEC §5.1)
    outputs: dict[str, OutputLog] = {}  # each session's output documents, shared by the corpora
    turn_tables: dict[str, tuple] = {}  # name → (freshness, turn_table) for the turn filters
    # per corpus, name → (the log's key on disk, (handle, version, rewrites)) when last indexed:
    # a session is fresh while its log is unchanged on disk and, if this store holds it open, its
    # handle's key is too (buffered appends not yet on disk); one the LRU closed is not
    # reopened — so a root query does not reopen every session of a large store (SPEC §3.5:
    # at most max_open_sessions are open)
    sync_lock = threading.Lock()
    left_out: dict[str, str] = {}  # sessions that could not be opened → why (logged once)
    changes = 0  # bumped (under sync_lock) whenever a refresh changes an index
    memo: dict[tuple, tuple[int, float, list[dict]]] = {}  # query args → (changes, when, results)
    root = os.fspath(store.root)

    def fresh(name: str, last: tuple | None) -> tuple[bool, tuple | None]:
        """Whether a session recorded as ``last`` is unchanged, and its log's key now."""
        on_disk = _log_key(f"{root}/{name}/{EVENTS}")
        held = store.held(name)
        return (last is not None and last[0] == on_disk
                and (held is None or last[1] == (id(held), held.version, held.rewrites))), on_disk

    def refresh(corpus: Corpus, names: list[str], whole_store: bool) -> None:
        """Index ``names``; across the whole store, a session that cannot be opened or read
        (a hostile file in it) is left out and logged once: it never costs the others."""
        nonlocal changes
        seen = corpus.seen
        for name in names:
            try:
                unchanged, on_disk = fresh(name, seen.get(name))
                if unchanged:
                    left_out.pop(name, None)
                    continue
                handle = store.open(name)
                key = (id(handle), handle.version, handle.rewrites)
                out = outputs.setdefault(name, OutputLog()) if corpus.outputs else None
                corpus.sync(handle, created_at_of(handle), out)
                seen[name] = (on_disk, key)
                changes += 1
            except (MemfsError, OSError) as exc:
                if not whole_store:
                    raise
                if left_out.get(name) != str(exc):  # once, not at every query
                    left_out[name] = str(exc)
                    log.warning("search: session %s left out: %s", name, exc)
                if seen.pop(name, None) is not None:
                    corpus.index.remove_session(name)
                    changes += 1
                continue
            left_out.pop(name, None)

    def forget(gone: set[str]) -> None:
        nonlocal changes
        for name in gone:
            outputs.pop(name, None)
            turn_tables.pop(name, None)
            for corpus in corpora.values():
                if corpus.seen.pop(name, None) is not None:
                    corpus.index.remove_session(name)
                    changes += 1

    def turns_of(corpus: Corpus, names: list[str], options: SearchOptions) -> dict:
        """``{name: allowed turn ordinals}`` for the turn filters; a session's turn table is
        read again only when the refresh just now found its log changed (its record in
        ``corpus.seen`` moved)."""
        allowed = {}
        for name in names:
            state = corpus.seen.get(name)
            if state is None:
                continue  # left out of the index (logged by the refresh)
            known = turn_tables.get(name)
            if known is None or known[0] != state:
                try:
                    turn_tables[name] = known = (state, turn_table(store.open(name)))
                except (MemfsError, OSError):
                    continue
            allowed[name] = allowed_turns(known[1], options)
        return allowed

    def resolve(session: str | None, k: int | None, min_score_: float | None,
                options: SearchOptions | Mapping[str, str] | None) -> tuple[SearchOptions, str | None, int, float]:
        if isinstance(options, SearchOptions):
            opts = options
        else:
            base = defaults if isinstance(defaults, SearchOptions) else parse_options(defaults or {})
            opts = parse_options(options or {}, base)
        if opts.session is not None:
            wanted = sanitize(opts.session)
            if session is not None and wanted != session:
                raise BadQuery(f"session={opts.session!r} in the search of session {session!r}")
            session = wanted
        k = k if k is not None else opts.k if opts.k is not None else max_results
        min_score_ = min_score_ if min_score_ is not None else (
            opts.min_score if opts.min_score is not None else min_score)
        return opts, session, k, min_score_

    def searcher(query: str, session: str | None = None, k: int | None = None,
                 min_score_: float | None = None, options: SearchOptions | Mapping[str, str] | None = None
                 ) -> list[dict]:
        opts, session, k, min_score_ = resolve(session, k, min_score_, options)
        corpus_key = Corpus.key_of(opts)
        if not (query_tokens(query) if corpus_key == default.key else analyzer(*opts.analysis).query(query)):
            raise NotFound(f"no search terms in {query!r}")
        args = (query, session, k, min_score_, opts)
        with sync_lock:
            corpus = corpora.get(corpus_key)
            if corpus is None:
                corpus = corpora[corpus_key] = Corpus(*corpus_key)
            if session is None:
                names = store.names()
                forget(set(corpus.seen) - set(names))
            else:
                if not store.exists(session):
                    raise NotFound(f"no session {session!r}")
                names = [session]
            if opts.agent is not None or opts.project is not None:
                matching = sessions_matching(root, opts)
                names = [n for n in names if n in matching]
            refresh(corpus, names, whole_store=session is None)
            turns = turns_of(corpus, names, opts) if opts.turn_filtered else None
            state, now = changes, time.monotonic()
            hit = memo.get(args)
            if hit is not None and hit[0] == state and now - hit[1] < MEMO_SECONDS and turns is None:
                return [dict(r) for r in hit[2]]
        whole = session is None and opts.agent is None and opts.project is None
        results = corpus.index.search(query, sessions=None if whole else names, max_results=k,
                                      min_score=min_score_, sources=Corpus.sources_of(opts), turns=turns,
                                      distinct=opts.distinct == "session")
        with sync_lock:
            if len(memo) >= MEMO_ENTRIES:
                memo.clear()
            memo[args] = (state, now, results)
        return [dict(r) for r in results]

    def warm(names: list[str]) -> None:
        """Index these sessions now (the mount warms the default index in the background at
        start, so the first whole-store query does not pay for building it)."""
        with sync_lock:
            refresh(default, names, whole_store=True)

    def stats() -> dict:
        """Per index made so far (``"<stem>/<stopwords>/<facts|facts+output>"``): its sizes."""
        with sync_lock:
            made = list(corpora.values())
        return {"/".join((c.key[0], c.key[1], "facts+output" if c.key[2] else "facts")): c.index.stats()
                for c in made}

    made = cast(StoreSearcher, searcher)
    made.index = default.index  # for introspection (stats, tests)
    made.warm = warm
    made.stats = stats
    return made


def search_store(root: str | os.PathLike, query: str, *, session: str | None = None,
                 k: int | None = None, min_score: float | None = None,
                 options: SearchOptions | Mapping[str, str] | None = None) -> list[dict]:
    """One search over the sessions root ``root``, opening sessions read-only (``memfs search``).

    ``session`` is a session directory name; :class:`~memfs.errors.NotFound` when it does not
    exist or when the query has no tokens; ``options`` as :func:`store_searcher` takes them
    (its ``k``/``min_score`` win over ``options``').
    """
    store = Store(root, StoreSettings(read_only=True))
    try:
        return store_searcher(store)(query, session, k, min_score, options)
    finally:
        store.close()
