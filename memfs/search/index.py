"""An incremental in-memory BM25 index over the grounded facts of many sessions (SPEC §5).

:class:`SearchIndex` holds every session's facts as documents and answers a query over one
session (that session's own ``N``, ``avgdl`` and ``df``), over several, or over all of them,
with the scores of :mod:`memfs.search.bm25` — not an engine's own.

Layout (one global document space):

* every fact gets a global document id (``gid``) when it is added; three int32 columns indexed
  by gid hold its length in tokens, its session slot (``-1`` once removed) and its index in the
  session's ``grounded_facts``;
* the vocabulary maps a token to one ``array('i')`` of interleaved ``(gid, tf)`` pairs in gid
  order; appending a fact appends to the arrays of its distinct tokens — O(tokens of the fact);
* a query copies the posting arrays of its distinct tokens into numpy (one memcpy each), keeps
  the documents of the searched sessions (which also yields ``df``), and evaluates the formula
  on whole columns. ``N``, ``avgdl`` and ``df`` are computed at query time from counters kept
  per session, so an append never rewrites anything already indexed;
* replacing or removing a session marks its documents dead; when dead documents outnumber the
  live ones (and there are more than a few thousand), or dead session slots pile up, the
  index is compacted in one pass.

Engine choice (``scripts/bench_search.py`` compares them; ``docs/performance.md``): numpy over
flat posting columns. A dict-of-dicts scored in Python is fine for one session but slow when a
root query holds a common token. SQLite FTS5 only finds candidates — its ``bm25()`` is another
formula without recency, so every candidate would still be scored here, and for common tokens
that is every row. ``bm25s`` and ``rank_bm25`` have no recency factor and are slower on a whole
store; tantivy is not a dependency of the project. The fact texts are shared with the memory
views that produced them, so the index holds only the vocabulary, postings and document columns.

Decisions recorded here:

* ``created_at`` is kept exactly as given (unix seconds; manifests carry milliseconds) and
  the recency factor is computed from it; results report it as an ``int`` when it is a whole
  number of seconds, else as the float, so a result's score can be recomputed from its fields.
* ``snippet`` is the fact text unchanged: §4.1 already normalizes facts and caps them at
  512 UTF-8 bytes, so there is nothing to trim.
* ``path`` is ``sessions/<name>/derived/memory.json`` — the mount path of the view the fact
  is the ``grounded_facts`` entry of (the ``chunk_id``'s index).
* A fact with no tokens is still a document: it counts in ``N`` and in ``avgdl``, as every
  grounded fact is part of the corpus, but it can never match.
* Unknown session names in ``sessions=[…]`` are ignored (an unknown session has no facts).
* ``max_results`` is capped at :data:`MAX_RESULTS`, so one name cannot ask for a gigabyte of
  results; queries are cut to :data:`~memfs.search.tokenize.MAX_QUERY_TOKENS` tokens.
* The index is thread-safe: one lock around every update and query.

The options of SPEC §5.1 (:mod:`memfs.search.corpora` drives them) use four hooks, none of
which changes the default search: an ``analyzer`` (stemming, stopwords: the documents' and
the queries' tokens), a ``source`` per session entry (``"session"``: grounded facts,
``"output"``: command outputs, chunk ids ``<name>:out:<n>``; ``"prompt"``: the user's prompts,
``<name>:prompt:<n>``; so one index can hold them as one corpus), ``turns`` (only the documents of these turns of these sessions are the corpus: ``N``,
``avgdl`` and ``df`` are the restricted corpus's) and ``distinct`` (a session's best only,
ranked by its session's score): :mod:`memfs.search.sessions`.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from memfs.pace import pace
from memfs.search.bm25 import idf, recency_factors, term_score
from memfs.search.numpy_once import np
from memfs.search.sessions import TurnFilter, per_session
from memfs.search.tokenize import query_tokens, tokenize

DEFAULT_MAX_RESULTS = 6
DEFAULT_MIN_SCORE = 0.0
MAX_RESULTS = 1000
_COMPACT_MIN_DEAD = 4096


class _Column:
    """A growable int32 numpy column (doubling capacity; O(1) amortized per value)."""

    __slots__ = ("data", "n")

    def __init__(self, capacity: int = 1024):
        self.data = np.zeros(capacity, dtype=np.int32)
        self.n = 0

    def extend(self, values) -> None:
        values = np.asarray(values, dtype=np.int32)
        end = self.n + len(values)
        if end > len(self.data):
            grown = np.zeros(max(end, 2 * len(self.data)), dtype=np.int32)
            grown[: self.n] = self.data[: self.n]
            self.data = grown
        self.data[self.n: end] = values
        self.n = end

    def view(self) -> np.ndarray:
        return self.data[: self.n]

    def replace(self, values: np.ndarray) -> None:
        """Hold ``values`` (a loaded or compacted column: room for an eighth more before it grows)."""
        self.data = np.zeros(len(values) + max(1024, len(values) // 8), dtype=np.int32)
        self.data[: len(values)] = values
        self.n = len(values)


@dataclass(slots=True)
class _Session:
    name: str
    session_id: str
    created_at: int | float | None
    slot: int
    generation: object = None
    source: str = "session"  # "session": grounded facts; "output": command outputs (SPEC §5.1)
    facts: list = field(default_factory=list)  # (text, turn, offset) by grounded_facts index (loaded: a SavedFacts)
    gids: array = field(default_factory=lambda: array("i"))  # grounded_facts index → gid
    total_len: int = 0
    turn_groups: tuple | None = None  # (documents, its turn groups): memfs.search.sessions


def _unix_seconds(created_at: float | None) -> int | float | None:
    if created_at is None:
        return None
    value = float(created_at)
    if not math.isfinite(value):
        return None
    return int(value) if value.is_integer() else value


class SearchIndex:
    """BM25 over the grounded facts of many sessions, updated incrementally.

    A session is keyed by its directory ``name`` (the ``chunk_id`` prefix). ``facts`` are the
    memory view's ``grounded_facts`` in order: mappings with ``"fact"`` (text), ``"turn"`` and
    ``"offset"`` (``int`` or ``None``); other keys are ignored.
    """

    def __init__(self, analyzer: Any = None) -> None:
        """``analyzer`` (a :class:`memfs.search.analysis.Analyzer`): the documents' and queries'
        tokens; None: SPEC §5's tokenizer."""
        self._lock = threading.Lock()
        self._doc_tokens = tokenize if analyzer is None else analyzer.doc
        self._query_tokens = query_tokens if analyzer is None else analyzer.query
        self._vocab: dict[str, array] = {}
        self._doc_len = _Column()
        self._doc_slot = _Column()
        self._doc_local = _Column()
        self._doc_turn = _Column()  # the document's turn, -1 when it has none
        self._sessions: dict[str, _Session] = {}
        self._slots: list[_Session | None] = []
        self._slot_session = _Column()  # slot → its session's id (a name's sources share one)
        self._session_ids: dict[str, int] = {}
        self._live_docs = 0
        self._live_len = 0
        self._dead_docs = 0
        self._created: np.ndarray | None = None  # each slot's created_at (NaN: unknown), made at a query

    # --- updates ---------------------------------------------------------------------------

    def set_session(self, name: str, session_id: str, created_at: float | None,
                    facts: Iterable[Mapping], *, generation: object = None, source: str = "session") -> None:
        """Index ``facts`` as the whole content of session ``name``, replacing what it had
        (of that ``source``)."""
        key = _key(name, source)
        with self._lock:
            old = self._sessions.get(key)
            if old is not None:
                self._drop(old)
            s = _Session(name, session_id, _unix_seconds(created_at), len(self._slots), generation, source)
            self._slots.append(s)
            self._created = None
            self._slot_session.extend([self._session_ids.setdefault(name, len(self._session_ids))])
            self._sessions[key] = s
            self._add_facts(s, facts)
            self._maybe_compact()

    def extend_session(self, name: str, new_facts: Iterable[Mapping], *, source: str = "session") -> None:
        """Append facts to session ``name``; their indices continue after the existing ones.

        ``KeyError`` when the session is not indexed (use :meth:`set_session` first).
        """
        with self._lock:
            self._add_facts(self._sessions[_key(name, source)], new_facts)

    def remove_session(self, name: str) -> None:
        """Forget session ``name``, every source of it (no error when it is not indexed)."""
        with self._lock:
            dropped = False
            for key in (_key(name, source) for source in SOURCES):
                s = self._sessions.get(key)
                if s is not None:
                    self._drop(s)
                    dropped = True
            if dropped:
                self._maybe_compact()

    def sync_session(self, name: str, session_id: str, created_at: float | None,
                     facts: Sequence[Mapping], *, generation: object = None, source: str = "session") -> None:
        """Bring session ``name`` up to date with its current ``facts`` at the lowest cost.

        The memory view only ever appends facts while a log grows: under the same
        ``generation`` (e.g. the handle's ``rewrites`` count), when ``facts`` is at least as
        long as what is indexed and its last indexed fact is unchanged, only the new tail is
        indexed — O(new facts). A new generation (a cap rewrite moved byte offsets) whose
        texts still start with the indexed ones refreshes the stored ``turn``/``offset`` without
        re-tokenizing — O(facts), no index change. Anything else re-indexes the session.
        """
        with self._lock:
            s = self._sessions.get(_key(name, source))
            n = len(s.facts) if s is not None else 0
            if s is None or len(facts) < n:
                reindex = True
            elif s.generation == generation and (not n or facts[n - 1].get("fact") == s.facts[n - 1][0]):
                reindex = False
            elif all(facts[i].get("fact") == s.facts[i][0] for i in range(n)):
                s.facts = [(f["fact"], f.get("turn"), f.get("offset")) for f in facts[:n]]
                s.generation = generation
                reindex = False
            else:
                reindex = True
            if not reindex:
                s.session_id = session_id
                if s.created_at != _unix_seconds(created_at):
                    s.created_at = _unix_seconds(created_at)
                    self._created = None
                if len(facts) > n:
                    self._add_facts(s, facts[n:])
        if reindex:
            self.set_session(name, session_id, created_at, facts, generation=generation, source=source)

    def _add_facts(self, s: _Session, facts: Iterable[Mapping]) -> None:
        vocab = self._vocab
        doc_tokens = self._doc_tokens
        first_gid = gid = self._doc_len.n
        first_local = len(s.facts)
        if type(s.facts) is not list:  # (a loaded index's facts, read from its file: memfs.search.persist)
            s.facts = list(s.facts)
        lengths, turns = [], []
        for fact in facts:
            if not (gid - first_gid) & 511:
                pace()  # (background work gives way to the event loop: memfs.pace)
            text = fact["fact"]
            tokens = doc_tokens(text)
            turn = fact.get("turn")
            s.facts.append((text, turn, fact.get("offset")))
            lengths.append(len(tokens))
            turns.append(turn if type(turn) is int and 0 <= turn < 2**31 else -1)
            counts: dict[str, int] = {}
            for t in tokens:
                counts[t] = counts.get(t, 0) + 1
            for t, tf in counts.items():
                postings = vocab.get(t)
                if postings is None:
                    vocab[t] = postings = array("i")
                postings.extend((gid, tf))
            gid += 1
        added, total = len(lengths), sum(lengths)
        s.gids.extend(range(first_gid, gid))
        self._doc_len.extend(lengths)
        self._doc_slot.extend([s.slot] * added)
        self._doc_local.extend(range(first_local, first_local + added))
        self._doc_turn.extend(turns)
        s.total_len += total
        self._live_docs += added
        self._live_len += total

    def _drop(self, s: _Session) -> None:
        del self._sessions[_key(s.name, s.source)]
        self._slots[s.slot] = None
        if s.gids:
            self._doc_slot.view()[np.frombuffer(s.gids, dtype=np.int32)] = -1
        self._live_docs -= len(s.facts)
        self._live_len -= s.total_len
        self._dead_docs += len(s.facts)

    def _maybe_compact(self) -> None:
        if (self._dead_docs > max(self._live_docs, _COMPACT_MIN_DEAD)
                or len(self._slots) > 2 * len(self._sessions) + _COMPACT_MIN_DEAD):
            self._compact()

    def _compact(self) -> None:
        """Drop dead documents and empty session slots; renumber gids and slots densely."""
        slot_map = np.full(len(self._slots) + 1, -1, dtype=np.int32)
        live_slots = [s for s in self._slots if s is not None]
        for new, s in enumerate(live_slots):
            slot_map[s.slot] = new
            s.slot = new
        doc_slot = self._doc_slot.view()
        alive = doc_slot >= 0
        new_gid = (np.cumsum(alive, dtype=np.int64) - 1).astype(np.int32)
        for token, postings in list(self._vocab.items()):
            pairs = np.array(postings, dtype=np.int32).reshape(-1, 2)
            pairs = pairs[alive[pairs[:, 0]]]
            if len(pairs) == 0:
                del self._vocab[token]
                continue
            pairs[:, 0] = new_gid[pairs[:, 0]]
            fresh = array("i")
            fresh.frombytes(pairs.tobytes())
            self._vocab[token] = fresh
        self._doc_len.replace(self._doc_len.view()[alive])
        self._doc_local.replace(self._doc_local.view()[alive])
        self._doc_turn.replace(self._doc_turn.view()[alive])
        self._doc_slot.replace(slot_map[doc_slot[alive]])
        for s in live_slots:
            remapped = array("i")
            if s.gids:
                remapped.frombytes(new_gid[np.frombuffer(s.gids, dtype=np.int32)].tobytes())
            s.gids = remapped
        self._slots = live_slots
        self._created = None
        self._session_ids = {}
        self._slot_session.replace(np.array([self._session_ids.setdefault(s.name, len(self._session_ids))
                                             for s in live_slots], dtype=np.int32))
        self._dead_docs = 0

    # --- queries ---------------------------------------------------------------------------

    def search(self, query: str, *, sessions: Iterable[str] | None = None,
               max_results: int = DEFAULT_MAX_RESULTS, min_score: float = DEFAULT_MIN_SCORE,
               now: float | None = None, sources: Iterable[str] | None = None,
               turns: Mapping[str, Any] | None = None, distinct: bool = False) -> list[dict]:
        """The best facts for ``query``, as SPEC §5 result dicts, best first.

        ``sessions=None`` searches every session as one corpus; a list of names searches those
        sessions as one corpus (a single name, or a bare string: that session's own
        statistics). ``now`` (unix seconds, default the current time) is what the recency
        factor measures age from. ``sources`` (None: every source indexed) keeps the session
        entries of those sources; ``turns`` (``{name: turn ordinals}``) makes the corpus only the
        documents of those turns of those sessions; ``distinct`` keeps each session's best, with
        its session's score (:func:`memfs.search.sessions.per_session`).
        """
        tokens = self._query_tokens(query)
        max_results = min(int(max_results), MAX_RESULTS)
        if isinstance(sessions, str):
            sessions = [sessions]
        if not tokens or max_results <= 0:
            return []
        multiplicity: dict[str, int] = {}
        for t in tokens:
            multiplicity[t] = multiplicity.get(t, 0) + 1
        if now is None:
            now = time.time()
        with self._lock:
            chosen = self._chosen(sessions, None if sources is None else frozenset(sources))
            results = self._search(multiplicity, chosen, turns, max_results, float(min_score), float(now),
                                   distinct)
        return results

    def _chosen(self, sessions: Iterable[str] | None, sources: frozenset | None) -> list[_Session] | None:
        """The session entries searched; None: every live entry (the fast path)."""
        if sessions is None:
            if sources is None:
                return None
            return [s for s in self._slots if s is not None and s.source in sources]
        keys = [_key(n, src) for n in dict.fromkeys(sessions) for src in sorted(sources or SOURCES)]
        return [self._sessions[k] for k in keys if k in self._sessions]

    def _search(self, multiplicity: dict[str, int], chosen: list[_Session] | None,
                turns: Mapping[str, Any] | None, max_results: int, min_score: float, now: float,
                distinct: bool) -> list[dict]:
        doc_slot = self._doc_slot.view()
        doc_len = self._doc_len.view()
        keep_slot = by_turn = None
        if chosen is None:
            if turns is not None:
                by_turn = TurnFilter([s for s in self._slots if s is not None], turns, self._slot_session.view(), len(self._session_ids),
                                     self._doc_turn.view(), doc_len)
                n_docs, total_len = by_turn.n_docs, by_turn.total_len
            else:
                n_docs, total_len = self._live_docs, self._live_len
        elif turns is not None:
            by_turn = TurnFilter(chosen, turns, self._slot_session.view(), len(self._session_ids),
                                     self._doc_turn.view(), doc_len)
            n_docs, total_len = by_turn.n_docs, by_turn.total_len
        else:
            n_docs = sum(len(s.facts) for s in chosen)
            total_len = sum(s.total_len for s in chosen)
            keep_slot = np.zeros(len(self._slots) + 1, dtype=bool)  # index -1 (dead) → False
            for s in chosen:
                keep_slot[s.slot] = True
        if n_docs == 0:
            return []
        avgdl = total_len / n_docs

        parts: list[tuple[np.ndarray, np.ndarray]] = []
        for token, mult in multiplicity.items():
            postings = self._vocab.get(token)
            if postings is None:
                continue
            pairs = np.frombuffer(postings, dtype=np.int32).copy()  # no export left on the array
            gids, tfs = pairs[0::2], pairs[1::2]
            if by_turn is not None:
                mask = by_turn.keep(gids, doc_slot, self._doc_turn.view())
            elif keep_slot is not None:
                mask = keep_slot[doc_slot[gids]]
            elif self._dead_docs:
                mask = doc_slot[gids] >= 0
            else:
                mask = None
            if mask is not None:
                gids, tfs = gids[mask], tfs[mask]
            df = len(gids)
            if df == 0:
                continue
            contrib = term_score(idf(n_docs, df), tfs.astype(np.float64),
                                 doc_len[gids].astype(np.float64), avgdl)
            if mult > 1:
                contrib = contrib * mult
            parts.append((gids, contrib))
        if not parts:
            return []
        cand, scores = _accumulate(parts, len(doc_slot))

        positive = scores > 0.0
        cand, scores = cand[positive], scores[positive]
        if self._created is None:
            self._created = np.array([np.nan if s is None or s.created_at is None else float(s.created_at)
                                      for s in self._slots] + [np.nan])
        scores = scores * recency_factors(self._created[doc_slot[cand]], now)
        passing = scores >= min_score
        cand, scores = cand[passing], scores[passing]
        if distinct:
            cand, scores = per_session(cand, scores, self._slot_session.view()[doc_slot[cand]],
                                       len(self._session_ids), max_results)
        if len(cand) > max_results:
            kth = np.partition(scores, len(scores) - max_results)[len(scores) - max_results]
            top = scores >= kth  # keeps every tie of the k-th score; chunk ids decide below
            cand, scores = cand[top], scores[top]

        doc_local = self._doc_local.view()
        ranked = []
        for gid, score in zip(cand.tolist(), scores.tolist()):
            s = self._slots[doc_slot[gid]]
            local = int(doc_local[gid])
            ranked.append((-score, _chunk_id(s, local), s, local))
        ranked.sort(key=lambda r: (r[0], r[1]))
        if distinct:  # exact ties within a session: its smallest chunk id
            firsts: dict[str, tuple] = {}
            for r in ranked:
                firsts.setdefault(r[2].name, r)
            ranked = list(firsts.values())
        return [_result(chunk_id, s, local, -neg) for neg, chunk_id, s, local in ranked[:max_results]]

    # --- persistence (the file format is memfs.search.persist's) -----------------------------

    def snapshot(self) -> dict:
        """The index's state for a save (:func:`memfs.search.persist.write`), taken under its
        lock: the document columns copied; what only grows — each token's postings, each slot's
        facts and gids — referenced with its length now (an update appends past it; a compaction
        or a re-index puts new objects in its place), so no posting or fact is copied.
        ``slots`` holds a column per field with a row per slot (``live`` 0: a removed slot)."""
        with self._lock:
            n = len(self._slots)
            live, source = np.zeros(n, dtype=np.int8), np.zeros(n, dtype=np.int8)
            created, total, count = np.full(n, np.nan), np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
            names: list = [""] * n
            sids: list = [""] * n
            facts: list = [None] * n
            gids: list = [None] * n
            for i, s in enumerate(self._slots):
                if s is not None:
                    live[i], source[i], total[i], count[i] = 1, SOURCES.index(s.source), s.total_len, len(s.facts)
                    if s.created_at is not None:
                        created[i] = s.created_at
                    names[i], sids[i], facts[i], gids[i] = s.name, s.session_id, s.facts, s.gids
            columns = {name: getattr(self, f"_{name}").view().copy()
                       for name in ("doc_len", "doc_slot", "doc_local", "doc_turn", "slot_session")}
            return {"tokens": list(self._vocab), "postings": [(p, len(p)) for p in self._vocab.values()],
                    "columns": columns, "session_ids": list(self._session_ids), "live_docs": self._live_docs,
                    "live_len": self._live_len, "dead_docs": self._dead_docs,
                    "slots": {"live": live, "source": source, "created": created, "total": total, "n": count,
                              "names": names, "sids": sids, "facts": facts, "gids": gids}}

    @classmethod
    def from_snapshot(cls, state: dict, analyzer: Any = None) -> SearchIndex:
        """An index holding ``state`` as a saved file is read (:func:`memfs.search.persist.decode`:
        tokens with their postings concatenated, the columns, and per slot None or its entry, its
        facts a sequence of ``(text, turn, offset)``). Restored sessions have no view generation:
        their first sync compares texts (:meth:`sync_session`)."""
        index = cls(analyzer)
        postings = memoryview(state["postings"])
        start = 0
        for token, end in zip(state["tokens"], state["token_ends"].tolist()):
            arr = array("i")
            arr.frombytes(postings[4 * start: 4 * end])
            index._vocab[token] = arr
            start = end
        for name, column in state["columns"].items():
            getattr(index, f"_{name}").replace(np.asarray(column, dtype=np.int32))
        index._session_ids = {name: i for i, name in enumerate(state["session_ids"])}
        for slot, entry in enumerate(state["slots"]):
            if entry is None:
                index._slots.append(None)
                continue
            name, session_id, created_at, source, total_len, facts, gids = entry
            s = _Session(name, session_id, created_at, slot, None, source, facts, array("i", gids), total_len)
            index._slots.append(s)
            index._sessions[_key(name, source)] = s
        index._live_docs, index._live_len, index._dead_docs = state["live_docs"], state["live_len"], state["dead_docs"]
        return index

    # --- introspection ---------------------------------------------------------------------

    def sessions(self) -> list[str]:
        """Names of the indexed sessions."""
        with self._lock:
            return list(dict.fromkeys(s.name for s in self._sessions.values()))

    def session_fact_count(self, name: str) -> int:
        """How many facts of session ``name`` are indexed (0 when it is not)."""
        with self._lock:
            s = self._sessions.get(name)
            return len(s.facts) if s is not None else 0

    def stats(self) -> dict:
        """Sizes, and the bytes the index structures hold (``index_bytes``: vocabulary, postings,
        document columns, per-session id maps; ``fact_bytes``: the stored fact texts and their
        tuples, which are shared with the caller when it keeps its facts)."""
        with self._lock:
            postings = sum(len(p) for p in self._vocab.values()) // 2
            index_bytes = sys.getsizeof(self._vocab)
            index_bytes += sum(sys.getsizeof(t) + sys.getsizeof(p) for t, p in self._vocab.items())
            index_bytes += sum(c.data.nbytes for c in (self._doc_len, self._doc_slot, self._doc_local,
                                                          self._doc_turn, self._slot_session))
            fact_bytes = 0
            for s in self._sessions.values():
                index_bytes += sys.getsizeof(s.gids)
                fact_bytes += sys.getsizeof(s.facts)
                fact_bytes += sum(sys.getsizeof(f) + sys.getsizeof(f[0]) for f in s.facts)
            return {"sessions": len(self._sessions), "docs": self._live_docs,
                    "dead_docs": self._dead_docs, "tokens": self._live_len,
                    "vocabulary": len(self._vocab), "postings": postings,
                    "index_bytes": index_bytes, "fact_bytes": fact_bytes}


def _accumulate(parts: list[tuple[np.ndarray, np.ndarray]], n_gids: int) -> tuple[np.ndarray, np.ndarray]:
    """Sum the per-token contributions per document → (gids, scores).

    Within one part a gid occurs once. Many postings: a dense accumulator over the gid space
    (O(gids), no sort); few postings against a large space: sort-based grouping.
    """
    if len(parts) == 1:
        return parts[0]
    touched = sum(len(g) for g, _ in parts)
    if touched * 16 >= n_gids:
        acc = np.zeros(n_gids)
        for gids, contrib in parts:
            acc[gids] += contrib
        cand = np.flatnonzero(acc)
        return cand, acc[cand]
    gids = np.concatenate([g for g, _ in parts])
    contrib = np.concatenate([c for _, c in parts])
    cand, inverse = np.unique(gids, return_inverse=True)
    return cand, np.bincount(inverse, weights=contrib, minlength=len(cand))


SOURCES = ("session", "output", "prompt")  # a session entry's sources, in the order a saved index numbers them


_TAGS = {"output": "out", "prompt": "prompt"}  # a source's chunk id infix


def _key(name: str, source: str) -> str:
    """A session entry's key: its name for the facts, ``<name>:<source>`` for another source
    (``:`` never appears in a session directory name)."""
    if source == "session":
        return name
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}")
    return f"{name}:{source}"


def _chunk_id(s: _Session, local: int) -> str:
    return f"{s.name}:{local}" if s.source == "session" else f"{s.name}:{_TAGS[s.source]}:{local}"


def _result(chunk_id: str, s: _Session, local: int, score: float) -> dict:
    text, turn, offset = s.facts[local]
    path = f"sessions/{s.name}/derived/memory.json" if s.source == "session" else f"sessions/{s.name}/events.jsonl"
    return {"chunk_id": chunk_id, "session_id": s.session_id, "score": score, "snippet": text,
            "path": path, "start_line": 0, "end_line": 0,
            "source": s.source, "created_at": s.created_at, "turn": turn, "offset": offset}
