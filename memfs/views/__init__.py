"""Floor 3: derived views (SPEC §4) — pure functions of a session's log, folded incrementally.

``derived/`` holds ``memory.json``, ``trajectory.jsonl``, ``summary.md``, ``progress.json``,
``progress.md``, ``goal.json``, ``context.md`` (a brief for the next prompt, under a token
budget), ``transcript.md`` (the session as Markdown, :mod:`memfs.views.transcript`),
``turns/<n>.jsonl`` and the stored ``eviction-summary-*.json``.
:func:`render_view` gives the bytes of any of them for an open session handle; views are
regenerated only when read after the log changed, folding only the bytes appended since, and
copied into the backing store's ``derived/`` (atomically, 0600, write-behind: see
:mod:`memfs.views.persist`).

Sessions made by ``memfs migrate`` (SPEC §7) keep their imported views: the import's source
of truth is the verbatim copy in ``<session>/imported/``. While the log has no events,
``memory.json`` / ``trajectory.jsonl`` are the imported file byte for byte; once it has,
they are computed from the log with the imported data first (imported grounded facts before
eviction-summary facts and the log's, imported trajectory lines before the log's turns), and
the imported facts feed search from the start. The copies written to ``derived/`` therefore
always hold the imported data, and ``imported/`` is never written. Details and the fact
mapping: :mod:`memfs.views.imported`.

Module map: :mod:`~memfs.views.fold` (the one pass over the log), :mod:`~memfs.views.cache`
(per-session state and refresh), one module per view (:mod:`~memfs.views.memory`,
:mod:`~memfs.views.trajectory`, :mod:`~memfs.views.summary`, :mod:`~memfs.views.progress`,
:mod:`~memfs.views.goal`, :mod:`~memfs.views.context`), :mod:`~memfs.views.imported` (migrated sessions' imported files),
:mod:`~memfs.views.api` (these functions).
"""

from memfs.views.api import (
    context_markdown,
    goal,
    list_names,
    list_turns,
    memory_facts,
    memory_view,
    progress,
    progress_markdown,
    render_view,
    summary_markdown,
    trajectory,
)
from memfs.views.cache import VIEW_NAMES, forget, is_current, stats
from memfs.views.persist import flush

__all__ = [
    "VIEW_NAMES",
    "context_markdown",
    "flush",
    "forget",
    "goal",
    "is_current",
    "list_names",
    "list_turns",
    "memory_facts",
    "memory_view",
    "progress",
    "progress_markdown",
    "render_view",
    "stats",
    "summary_markdown",
    "trajectory",
]
