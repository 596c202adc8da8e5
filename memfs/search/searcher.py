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

from memfs.errors import BadQuery, IndexBuilding, MemfsError, NotFound
from memfs.search import elsewhere as elsewhere_file
from memfs.search import persist as persist_file
from memfs.search.analysis import analyzer
from memfs.search.changes import CatalogChanges, ChangeSource, LogKey, log_key
from memfs.search.corpora import Corpus, allowed_turns, sessions_matching, turn_table
from memfs.search.index import DEFAULT_MAX_RESULTS, DEFAULT_MIN_SCORE, SearchIndex
from memfs.search.options import SearchOptions, parse_options
from memfs.search.outputs import OutputLog
from memfs.search.tokenize import query_tokens
from memfs.store.meta import parse_rfc3339
from memfs.store.paths import MANIFEST, sanitize
from memfs.store.root import Store, StoreSettings
from memfs.store.session import SessionHandle

Searcher = Callable[..., list]  # (query, session, k, min_score, options=None) -> results


class StoreSearcher(Protocol):
    """What :func:`store_searcher` returns: the search, and what the mount and tests look at."""

    index: SearchIndex  # the default index (SPEC §5's analysis, facts only)
    warm: Callable[..., list[str]]  # index these sessions ahead of the first whole-store query
    stats: Callable[[], dict]  # per index made so far: its sizes
    counters: Callable[[], dict]  # what it did: queries, sessions checked, re-indexed, loaded, saves
    notice: Callable[[str], None]  # a session written, created or removed through this process
    maintain: Callable[[], float]  # background upkeep (sweep, save); seconds until the next
    save: Callable[..., bool]  # save the default index in the store if it changed
    close: Callable[[], None]  # save what changed (persist="save")

    def __call__(self, query: str, session: str | None = None, k: int | None = None,
                 min_score: float | None = None, options: Any = None) -> list[dict]: ...

log = logging.getLogger("memfs.search")

MEMO_SECONDS = 1.0  # how long an unchanged index may answer a repeated query from memory
MEMO_ENTRIES = 64  # queries remembered at most (all forgotten when full)
SAVE_EVERY = 30.0  # seconds between two background saves of a changing index, at least


def created_at_of(handle: SessionHandle) -> float | None:
    """The session's ``created_at`` in unix seconds, or None when it is not known."""
    if handle.read_only and not os.path.lexists(handle.path / MANIFEST):
        return None
    return parse_rfc3339(handle.manifest.get("created_at") or "")


def sync_from_handle(index: SearchIndex, handle: SessionHandle) -> None:
    """Bring ``handle``'s session in ``index`` up to date with its memory view."""
    from memfs.views import memory_facts  # floor 3 sibling; imported late so search loads alone

    facts, (generation, _count) = memory_facts(handle)
    index.sync_session(handle.name, handle.session_id, created_at_of(handle), facts,
                       generation=generation)


def store_searcher(store: Store, *, max_results: int = DEFAULT_MAX_RESULTS,
                   min_score: float = DEFAULT_MIN_SCORE,
                   defaults: SearchOptions | Mapping[str, str] | None = None,
                   changes: ChangeSource | None = None, persist: str = "none",
                   elsewhere: bool = False) -> StoreSearcher:
    """A thread-safe ``searcher(query, session, k, min_score, options=None) -> [result]`` over
    ``store``.

    ``session`` None searches every session of the store as one corpus; ``k`` and
    ``min_score`` None take the options' (else the defaults given here). ``options`` is a
    :class:`~memfs.search.options.SearchOptions` or the ``{name: text}`` parameters of SPEC
    §5.1, laid over ``defaults`` by :func:`~memfs.search.options.parse_options`
    (:class:`~memfs.errors.BadQuery` for a bad one); ``defaults`` given as parameters (the
    config's ``[search]``) are parsed at each query, so an age (``since="7d"``) moves with
    time. Sessions that vanished from the store are dropped from the index.

    ``changes`` tells a root query which sessions changed since the last one (default: a
    :class:`~memfs.search.changes.CatalogChanges`: the store catalog's change feed). ``persist``:
    ``"none"`` (the index lives in memory only), ``"load"`` (it starts from the one saved in
    the store, :mod:`memfs.search.persist`), ``"save"`` (and saves it: from :meth:`maintain`,
    at most every :data:`SAVE_EVERY` seconds while it changes, and at :meth:`close`).
    ``elsewhere`` (a server's, with ``"save"``): a large store without a usable saved index has it
    built and saved by a process of its own at the first :meth:`warm` (:mod:`memfs.search.elsewhere`).
    """
    if persist not in ("none", "load", "save"):
        raise ValueError(f"persist must be none, load or save, not {persist!r}")
    source: ChangeSource = changes if changes is not None else CatalogChanges(store.root)
    default = Corpus()
    corpora: dict[tuple, Corpus] = {default.key: default}  # made on first use (SPEC §5.1)
    outputs: dict[str, OutputLog] = {}  # each session's output documents, shared by the corpora
    turn_tables: dict[str, tuple] = {}  # name → (freshness, turn_table) for the turn filters
    # per corpus, name → (the log's key when last indexed, (handle, version, rewrites)): a session
    # is fresh while the change source reports no new key for it and, if this store holds it
    # open, its handle's key is unchanged too (buffered appends not yet on disk); one the LRU
    # closed is not reopened — a root query opens only changed sessions (SPEC §3.5, §14)
    known: dict[str, LogKey | None] = {}  # every session the change source reported, its log key
    sync_lock = threading.Lock()
    left_out: dict[str, str] = {}  # sessions that could not be opened → why (logged once)
    changes_made = 0  # bumped (under sync_lock) whenever a refresh changes an index
    memo: dict[tuple, tuple[int, float, list[dict]]] = {}  # query args → (changes, when, results)
    root = os.fspath(store.root)
    builder = elsewhere_file.Build()
    state: dict[str, Any] = {"cursor": 0, "started": False, "saved_changes": 0, "saved_at": 0.0, "saved_feed": None}
    activity = {"root_queries": 0, "checked_last": 0, "checked": 0, "reindexed": 0, "loaded": 0,
                "saves": 0}

    def fresh(corpus: Corpus, name: str) -> bool:
        last = corpus.seen.get(name)
        held = store.held(name)
        return (last is not None and name in known and last[0] == known[name]
                and (held is None or last[1] == (id(held), held.version, held.rewrites)))

    def refresh(corpus: Corpus, names, whole_store: bool) -> None:
        """Index ``names``; across the whole store, a session that cannot be opened or read
        (a hostile file in it) is left out and logged once: it never costs the others."""
        nonlocal changes_made
        seen = corpus.seen
        for name in names:
            try:
                if fresh(corpus, name):
                    left_out.pop(name, None)
                    continue
                if name not in known:  # held open here, not reported (yet) by the change source
                    if not store.exists(name):
                        forget({name})
                        continue
                    known[name] = log_key(root, name)
                handle = store.open(name)
                key = (id(handle), handle.version, handle.rewrites)
                out = outputs.setdefault(name, OutputLog()) if corpus.outputs else None
                corpus.sync(handle, created_at_of(handle), out)
                seen[name] = (known[name], key)
                changes_made += 1
                activity["reindexed"] += 1
            except NotFound:
                if not whole_store:
                    raise
                forget({name})
                continue
            except (MemfsError, OSError) as exc:
                if not whole_store:
                    raise
                if left_out.get(name) != str(exc):  # once, not at every query
                    left_out[name] = str(exc)
                    log.warning("search: session %s left out: %s", name, exc)
                if seen.pop(name, None) is not None:
                    corpus.index.remove_session(name)
                    changes_made += 1
                continue
            left_out.pop(name, None)

    def forget(gone: set[str]) -> None:
        nonlocal changes_made
        for name in gone:
            known.pop(name, None)
            outputs.pop(name, None)
            turn_tables.pop(name, None)
            for corpus in corpora.values():
                corpus.pending.discard(name)
                if corpus.seen.pop(name, None) is not None:
                    corpus.index.remove_session(name)
                    changes_made += 1

    def catch_up() -> None:
        """Take what changed since the last root query (under ``sync_lock``): the first time,
        the saved index and every session's key; then only the change source's news, and the
        sessions this process writes whose handle moved (no listing, no ``stat`` of every one)."""
        if not state["started"]:
            state["started"] = True
            loaded = persist_file.load(root, default.label.replace("/", "-")) if persist != "none" else None
            if loaded is not None:
                default.index, keys, feed = loaded
                state["saved_feed"] = feed
                made.index = default.index
                default.seen = {name: (key, None) for name, key in keys.items()}
                activity["loaded"] = len(keys)
                log.info("search: %d sessions' index loaded from the store", len(keys))
                resume = getattr(source, "resume", None)
                if feed is not None and resume is not None:  # only what changed since it was saved
                    state["cursor"] = resume(feed, keys)
                    known.update(keys)
        cursor, changed, removed = source.changes_since(state["cursor"])
        if not state["cursor"]:  # every session: what is not in it is gone
            removed = set(removed) | {n for c in corpora.values() for n in c.seen if n not in changed}
        state["cursor"] = cursor
        forget(set(removed))
        for name, key in changed.items():
            known[name] = key
            for corpus in corpora.values():
                last = corpus.seen.get(name)
                if last is None or last[0] != key:
                    corpus.pending.add(name)
        for name, handle in store.held_handles():
            if not handle.writer:  # what others write reaches the change source through the disk
                continue
            try:  # (this process's writes through the store, noticed or not, buffered or not)
                moved = (id(handle), handle.version, handle.rewrites)
            except (MemfsError, OSError):
                continue  # its log gone or unreadable: the change source reports it
            for corpus in corpora.values():
                last = corpus.seen.get(name)
                if last is None or last[1] != moved:
                    corpus.pending.add(name)

    def turns_of(corpus: Corpus, names, options: SearchOptions) -> dict:
        """``{name: allowed turn ordinals}`` for the turn filters; a session's turn table is
        read again only when the refresh just now found its log changed (its record in
        ``corpus.seen`` moved)."""
        allowed = {}
        for name in names:
            record = corpus.seen.get(name)
            if record is None:
                continue  # left out of the index (logged by the refresh)
            known_table = turn_tables.get(name)
            if known_table is None or known_table[0] != record:
                try:
                    turn_tables[name] = known_table = (record, turn_table(store.open(name)))
                except (MemfsError, OSError):
                    continue
            allowed[name] = allowed_turns(known_table[1], options)
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

    def corpus_for(key: tuple) -> Corpus:
        corpus = corpora.get(key)
        if corpus is None:  # a new index: every session is to be read into it
            corpus = corpora[key] = Corpus(*key)
            corpus.pending = set(known)
        return corpus

    def searcher(query: str, session: str | None = None, k: int | None = None,
                 min_score_: float | None = None, options: SearchOptions | Mapping[str, str] | None = None
                 ) -> list[dict]:
        opts, session, k, min_score_ = resolve(session, k, min_score_, options)
        corpus_key = Corpus.key_of(opts)
        if not (query_tokens(query) if corpus_key == default.key else analyzer(*opts.analysis).query(query)):
            raise NotFound(f"no search terms in {query!r}")
        args = (query, session, k, min_score_, opts)
        if session is None and build_decided():  # (the first root query, before the warm-up)
            threading.Thread(target=builder.run, args=(root,), daemon=True, name="memfs search index build").start()
        if session is None and not builder.wait(elsewhere_file.WAIT):
            raise IndexBuilding(f"the search index of {root} is being built; ask again shortly")
        with sync_lock:
            if session is None:
                catch_up()
            corpus = corpus_for(corpus_key)
            if session is None:
                checked = sorted(corpus.pending)
                corpus.pending.clear()
                refresh(corpus, checked, whole_store=True)
                activity["root_queries"] += 1
                activity["checked_last"] = len(checked)
                activity["checked"] += len(checked)
                names = list(known)
            else:
                if not store.exists(session):
                    raise NotFound(f"no session {session!r}")
                known[session] = log_key(root, session)  # one session: its own key, now
                corpus.pending.discard(session)
                refresh(corpus, [session], whole_store=False)
                names = [session]
            if opts.agent is not None or opts.project is not None:
                matching = sessions_matching(root, opts)
                names = [n for n in names if n in matching]
            turns = turns_of(corpus, names, opts) if opts.turn_filtered else None
            current, now = changes_made, time.monotonic()
            hit = memo.get(args)
            if hit is not None and hit[0] == current and now - hit[1] < MEMO_SECONDS and turns is None:
                return [dict(r) for r in hit[2]]
        whole = session is None and opts.agent is None and opts.project is None
        results = corpus.index.search(query, sessions=None if whole else names, max_results=k,
                                      min_score=min_score_, sources=Corpus.sources_of(opts), turns=turns,
                                      distinct=opts.distinct == "session")
        with sync_lock:
            if len(memo) >= MEMO_ENTRIES:
                memo.clear()
            memo[args] = (current, now, results)
        return [dict(r) for r in results]

    def build_decided() -> bool:
        """Whether this call is the one to have the index built elsewhere (once: a large store
        with no usable saved index, for a server that has not loaded one)."""
        return (elsewhere and persist == "save" and not state["started"]
                and builder.claim(root, default.label.replace("/", "-")))

    def warm(names: list[str] | None = None) -> list[str]:
        """Index these sessions now; None: load the saved index and learn what changed since
        (the first catch-up), and return the sessions still to index — the mount warms the
        default index in the background at start, so the first root query does not build it."""
        if names is None:  # (outside the lock: a session's own search goes on meanwhile)
            if build_decided():
                builder.run(root)
            builder.wait()
        with sync_lock:
            if names is None:
                catch_up()
                return sorted(default.pending)
            names = [n for n in names if n in default.pending]
            default.pending.difference_update(names)
            refresh(default, names, whole_store=True)
            return []

    def save(force: bool = False) -> bool:
        """Save the default index in the store if it changed since the last save (and, unless
        ``force``, that was :data:`SAVE_EVERY` seconds ago); whether it was written. A session
        not re-read yet keeps the log key it was indexed at: the next load re-reads it."""
        if persist != "save" or not state["started"]:
            return False
        with sync_lock:
            position = getattr(source, "position", None)  # (every change up to it is in keys: nothing left to read)
            feed = position() if position is not None and not default.pending and not left_out else None
            if changes_made == state["saved_changes"] and feed in (None, state["saved_feed"]):
                return False  # (the same index; saved again for a newer cursor: a shorter catch-up next time)
            if not force and time.monotonic() - state["saved_at"] < SAVE_EVERY:
                return False
            snapshot = default.index.snapshot()
            keys = {name: record[0] for name, record in default.seen.items()}
            state["saved_changes"], state["saved_at"], state["saved_feed"] = changes_made, time.monotonic(), feed
        try:
            persist_file.save(root, default.label.replace("/", "-"), snapshot, keys, feed)
        except (OSError, MemfsError, ValueError) as exc:
            log.warning("search: the index was not saved in the store: %s", exc)
            return False
        activity["saves"] += 1
        return True

    def maintain() -> float:
        """Background upkeep (the mount calls it on a worker thread, then again after the
        seconds it returns): a sweep for other processes' changes, when the change source
        sweeps, and a save when one is due."""
        sweep = getattr(source, "sweep", None)
        if sweep is not None:
            sweep()
        save()
        interval = getattr(source, "interval", None)
        return interval() if interval is not None else SAVE_EVERY

    def notice(name: str) -> None:
        """Session ``name`` was written, created or removed through this process."""
        note = getattr(source, "notice", None)
        if note is not None:
            note(name)

    def close() -> None:
        """End a build elsewhere in progress; save the index if it changed (``persist="save"``)."""
        builder.stop()
        save(force=True)

    def stats() -> dict:
        """Per index made so far (``"<stem>/<stopwords>/<facts|facts+output>"``): its sizes."""
        with sync_lock:
            made_ = list(corpora.values())
        return {c.label: c.index.stats() for c in made_}

    def counters() -> dict:
        """What the searcher did: root queries, sessions the last one checked (``checked_last``)
        and all did, sessions (re)indexed, loaded from the saved index, saves written."""
        with sync_lock:
            return dict(activity)

    made = cast(StoreSearcher, searcher)
    made.index = default.index  # for introspection (stats, tests)
    made.warm = warm
    made.stats = stats
    made.counters = counters
    made.notice = notice
    made.maintain = maintain
    made.save = save
    made.close = close
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
        search = store_searcher(store, changes=CatalogChanges(store.root, background=False),  # (a thread would die with us)
                                persist="none" if session is not None else "save" if os.access(root, os.W_OK) else "load")
        try:
            return search(query, session, k, min_score, options)
        finally:
            search.close()
    finally:
        store.close()
