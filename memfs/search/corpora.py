"""The indexes and filters behind the search options of SPEC §5.1, for :mod:`memfs.search.searcher`.

* :class:`Corpus` — one :class:`~memfs.search.SearchIndex` per analysis (``stem``,
  ``stopwords``) and corpus kind (facts only, or facts, outputs and prompts), made on the
  first query that asks for it and then kept in step with the logs like the default one (only
  appended facts and outputs are indexed). ``in=facts`` is answered by the facts-only index,
  ``in=output`` and ``in=all`` by the other (``output`` keeps the output entries, ``all``
  every entry — facts, outputs and the user's prompts: one ``N``, one ``avgdl``).
* :func:`turn_table` / :func:`allowed_turns` — the ``status``, ``since`` and ``until``
  filters: which turns of a session are the corpus.
* :func:`sessions_matching` — the ``agent`` and ``project`` filters, with the listing's own
  semantics (:class:`memfs.store.listing.Filter`, as ``memfs sessions --agent/--project``).

Decisions recorded here:

* Filters restrict the corpus *before* scoring: ``N``, ``avgdl`` and ``df`` are those of the
  documents that pass (SPEC §5.1), so a filtered score is the formula over that corpus.
* A turn's time is the trajectory's ``started_at`` (the turn's own clock when its record has
  one, else when memfs received it), else its ``completed_at``; a turn with neither never
  passes ``since``/``until``. ``status`` is the turn's outcome (``open``, ``completed``,
  ``failed``; ``abandoned`` turns pass none of them).
* A document outside any turn (before the first, an eviction summary's or an imported fact)
  has no status and no time: it is dropped by ``status``, ``since`` and ``until``.
"""

from __future__ import annotations

import os

from memfs.search.analysis import analyzer
from memfs.search.index import SearchIndex
from memfs.search.numpy_once import np
from memfs.search.options import SearchOptions
from memfs.search.outputs import OutputLog
from memfs.store.meta import parse_rfc3339


class Corpus:
    """One index of the store's sessions: an analysis and whether outputs are in it.

    ``seen`` is the searcher's freshness record of each session indexed here, ``pending`` the
    sessions to check at its next root query (see :func:`memfs.search.store_searcher`)."""

    __slots__ = ("key", "index", "outputs", "seen", "pending")

    def __init__(self, stem: str = "none", stopwords: str = "none", outputs: bool = False):
        self.key = (stem, stopwords, outputs)
        self.outputs = outputs
        self.index = SearchIndex(self.analyzer())
        self.seen: dict[str, tuple] = {}
        self.pending: set[str] = set()

    @property
    def label(self) -> str:
        """``<stem>/<stopwords>/<facts|facts+output>`` (its stats' key)."""
        return "/".join((self.key[0], self.key[1], "facts+output" if self.key[2] else "facts"))

    def analyzer(self):
        """The analyzer its index was made with (None: SPEC §5's tokenizer)."""
        stem, stopwords, _ = self.key
        return None if stem == "none" and stopwords == "none" else analyzer(stem, stopwords)

    @staticmethod
    def key_of(options: SearchOptions) -> tuple[str, str, bool]:
        return options.stem, options.stopwords, options.corpus != "facts"

    @staticmethod
    def sources_of(options: SearchOptions) -> tuple[str, ...] | None:
        """The index entries an ``in=`` value searches (None: all of them)."""
        return ("output",) if options.corpus == "output" else None

    def sync(self, handle, created_at: float | None, outputs: OutputLog | None) -> None:
        """Bring ``handle``'s session up to date here: its facts, and its outputs if this
        corpus holds them (``outputs``: the session's shared :class:`OutputLog`)."""
        from memfs.views import memory_facts  # floor 3 sibling; imported late so search loads alone

        facts, (generation, _count) = memory_facts(handle)
        self.index.sync_session(handle.name, handle.session_id, created_at, facts, generation=generation)
        if self.outputs and outputs is not None:
            docs, out_generation = outputs.sync(handle)
            self.index.sync_session(handle.name, handle.session_id, created_at, docs,
                                    generation=out_generation, source="output")
            prompts, prompt_generation = outputs.sync_prompts(handle)
            self.index.sync_session(handle.name, handle.session_id, created_at, prompts,
                                    generation=prompt_generation, source="prompt")


def turn_table(handle) -> dict[int, tuple[str | None, float | None]]:
    """``{turn: (outcome, time)}`` of the session's retained turns (see the module docstring)."""
    from memfs.views import trajectory

    table = {}
    for t in trajectory(handle):
        turn = t.get("turn")
        if type(turn) is not int:
            continue
        when = None
        for key in ("started_at", "completed_at"):
            if type(t.get(key)) is str:
                when = parse_rfc3339(t[key])
                if when is not None:
                    break
        outcome = t.get("outcome")
        table[turn] = (outcome if type(outcome) is str else None, when)
    return table


def allowed_turns(table: dict[int, tuple[str | None, float | None]], options: SearchOptions) -> np.ndarray:
    """The turns of ``table`` that pass ``options``' ``status``, ``since`` and ``until``."""
    status, since, until = options.status, options.since, options.until
    keep = [turn for turn, (outcome, when) in table.items()
            if (status is None or outcome == status)
            and (since is None or (when is not None and when >= since))
            and (until is None or (when is not None and when <= until))]
    return np.array(keep, dtype=np.int32)


def sessions_matching(root: str | os.PathLike, options: SearchOptions) -> set[str]:
    """The names of the sessions that pass ``options``' ``agent`` and ``project`` (the store
    catalog's rows, filtered as ``memfs sessions`` filters)."""
    from memfs.store.catalog import catalog_of

    rows = catalog_of(root).current(background=True).rows(agent=options.agent, project=options.project)
    return {row.name for row in rows}
