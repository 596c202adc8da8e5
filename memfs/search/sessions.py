"""Per-session pieces of :class:`memfs.search.SearchIndex` queries (SPEC §5.1): the turn
filter and one result per session.

* :class:`TurnFilter` — the ``status``/``since``/``until`` corpus: the documents of the
  allowed turns of the chosen sessions. ``N`` and the total length come from per-session
  ``turn → (documents, tokens)`` groups cached on the session entry (recomputed only when the
  entry gained documents); the filter is then applied only to the postings a query scores,
  never to the whole document space.
* :func:`per_session` — ``distinct=session``: each session's best document, ranked by the
  session's score: its best document's score plus half its second's plus a quarter of its
  third's (a rank-discounted sum, so a session with several matching documents ranks above
  one with a single equal match, while one document still decides most of it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memfs.search.numpy_once import np

SESSION_WEIGHTS = (1.0, 0.5, 0.25)  # a session's score: its top documents' scores, so weighted


def turn_groups(s: Any, doc_turn: np.ndarray, doc_len: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(turns, documents, tokens)`` of session entry ``s`` (cached on it by document count)."""
    cached = s.turn_groups
    if cached is not None and cached[0] == len(s.gids):
        return cached[1]
    gids = np.frombuffer(s.gids, dtype=np.int32)
    turns, where = np.unique(doc_turn[gids], return_inverse=True)
    groups = (turns.astype(np.int64), np.bincount(where, minlength=len(turns)),
              np.bincount(where, weights=doc_len[gids], minlength=len(turns)))
    s.turn_groups = (len(s.gids), groups)
    return groups


class TurnFilter:
    """The documents of ``chosen`` whose turn is in ``turns[name]`` (a session absent from
    ``turns`` contributes nothing): ``n_docs``, ``total_len`` and :meth:`keep`.

    One flat table of allowed turns: session id ``i``'s turn ``t`` is ``table[base[i] + t]``
    for ``0 ≤ t ≤ top[i]`` (``slot_session``: each slot's session id, ``n_ids`` of them)."""

    __slots__ = ("base", "top", "table", "chosen_slot", "slot_session", "n_docs", "total_len")

    def __init__(self, chosen: list, turns: Mapping[str, Any], slot_session: np.ndarray, n_ids: int,
                 doc_turn: np.ndarray, doc_len: np.ndarray):
        self.slot_session = slot_session
        self.chosen_slot = np.zeros(len(slot_session) + 1, dtype=bool)  # index -1 (dead) → False
        named: dict[str, int] = {}
        allowed, ids, slots, g_turns, g_counts, g_lens, g_ids, g_sizes = [], [], [], [], [], [], [], []
        for s in chosen:
            wanted = turns.get(s.name)
            if wanted is None or not len(wanted) or not s.gids:
                continue
            sid = named.get(s.name)
            if sid is None:
                named[s.name] = sid = int(slot_session[s.slot])
                allowed.append(wanted)
                ids.append(sid)
            slots.append(s.slot)
            t, c, n = turn_groups(s, doc_turn, doc_len)
            g_turns.append(t)
            g_counts.append(c)
            g_lens.append(n)
            g_ids.append(sid)
            g_sizes.append(len(t))
        self.top = np.full(n_ids + 1, -1, dtype=np.int64)
        self.base = np.zeros(n_ids + 1, dtype=np.int64)
        self.n_docs, self.total_len = 0, 0
        if not allowed:
            self.table = np.zeros(0, dtype=bool)
            return
        self.chosen_slot[slots] = True
        lengths = np.array([len(a) for a in allowed])
        vals = np.concatenate(allowed).astype(np.int64)
        owner = np.repeat(np.array(ids, dtype=np.int64), lengths)
        starts = np.r_[0, np.cumsum(lengths)[:-1]]
        self.top[ids] = np.maximum(np.maximum.reduceat(vals, starts), -1)
        sizes = self.top + 1
        self.base[:] = np.r_[0, np.cumsum(sizes)[:-1]]
        self.table = np.zeros(int(sizes.sum()), dtype=bool)
        ok = vals >= 0
        self.table[self.base[owner[ok]] + vals[ok]] = True
        inside = self._member(np.repeat(np.array(g_ids, dtype=np.int64), g_sizes), np.concatenate(g_turns))
        self.n_docs = int(np.concatenate(g_counts)[inside].sum())
        self.total_len = int(np.concatenate(g_lens)[inside].sum())

    def _member(self, sid: np.ndarray, turn: np.ndarray) -> np.ndarray:
        ok = (turn >= 0) & (turn <= self.top[sid])
        out = np.zeros(len(turn), dtype=bool)
        out[ok] = self.table[self.base[sid[ok]] + turn[ok]]
        return out

    def keep(self, gids: np.ndarray, doc_slot: np.ndarray, doc_turn: np.ndarray) -> np.ndarray:
        """Which of ``gids`` (postings about to be scored) are in the filtered corpus."""
        slot = doc_slot[gids]
        at = np.flatnonzero(self.chosen_slot[slot])
        out = np.zeros(len(gids), dtype=bool)
        out[at] = self._member(self.slot_session[slot[at]].astype(np.int64), doc_turn[gids[at]].astype(np.int64))
        return out


def per_session(cand: np.ndarray, scores: np.ndarray, session_of: np.ndarray, n_ids: int,
                k: int) -> tuple[np.ndarray, np.ndarray]:
    """``distinct=session``: the candidates scoring their session's best (several only on an
    exact tie), each with its session's score (see the module docstring), for the top ``k``
    sessions at least. ``session_of`` maps each candidate to its session's id (< ``n_ids``).

    A session's score is at least its best document's and at most ``sum(SESSION_WEIGHTS)``
    times it, so only the sessions whose bound reaches the ``k``-th best document score are
    ranked exactly (the others cannot be in the top ``k``)."""
    if not len(cand):
        return cand, scores
    best = np.full(n_ids, -np.inf)
    np.maximum.at(best, session_of, scores)
    present = best[best > -np.inf]
    if len(present) > k:
        kth = np.partition(present, len(present) - k)[len(present) - k]
        hopeful = best[session_of] * (sum(SESSION_WEIGHTS) * (1 + 1e-9)) >= kth  # (rounding)
        cand, scores, session_of = cand[hopeful], scores[hopeful], session_of[hopeful]
    # the session's top documents, one score value at a time (ties count once per document)
    reach = np.r_[0.0, np.cumsum(SESSION_WEIGHTS)]  # reach[j]: the weight of a session's first j
    total, taken = np.zeros(n_ids), np.zeros(n_ids, dtype=np.int64)
    level, left = best, scores < best[session_of]
    for _ in SESSION_WEIGHTS:
        ties = np.bincount(session_of, weights=scores == level[session_of], minlength=n_ids).astype(np.int64)
        has = ties > 0
        upto = np.minimum(taken + ties, len(SESSION_WEIGHTS))
        total[has] += level[has] * (reach[upto[has]] - reach[np.minimum(taken[has], len(SESSION_WEIGHTS))])
        taken += ties
        if not left.any():
            break
        level = np.full(n_ids, -np.inf)
        np.maximum.at(level, session_of[left], scores[left])
        left &= scores < level[session_of]
    top = scores >= best[session_of]
    return cand[top], total[session_of[top]]
