"""``derived/summary.md`` (SPEC §4.2): a short human-readable digest of the session.

Layout (the bold lines after the title: what ``index/about.json`` says, see
:mod:`memfs.views.header`; none without it)::

    # Session sess-1

    **Title:** Add retries to fetch()
    **Agent:** codex 0.171.0, model gpt-5

    - **Status:** completed
    - **Agent:** codex (thread `0199a213-81c0-7800-8aa1-bbab2a035a53`)
    - **Turns:** 3 closed (2 completed, 1 failed, 0 abandoned)
    - **Events:** 14 (2034 bytes)
    - **Tokens:** 1200 input (800 cached, 0 cache creation), 95 output
    - **Created:** 2026-01-01T00:00:00.123+00:00

    ## Files touched (1)

    - `src/net.py`

    ## Errors (1)

    - turn 2 (turn.failed): tests failed

    ## Last agent message

    Added the retry loop.

Decisions recorded here where the spec is silent: the agent and thread id are told from the
log as :mod:`memfs.agents` says (``unknown``, ``no thread id`` when it cannot tell); the status
is the one ``memfs sessions`` shows (:func:`memfs.store.listing.status_of` on about.json and the
fold's state, never live: a view is a function of the records); counts come from the fold of the
retained log (an open turn adds "turn N open" to the status; evicted turns add "turns 1–K
evicted"); tokens sum the retained turns' usage; at most the first 50 files (sorted) and the
last 20 errors are listed, with a count of the rest; the last agent message is the latest one
in the log, open turn included (``memory.json``'s ``summary`` is the last *closed* turn's).
"""

from __future__ import annotations

from memfs.store.listing import status_of
from memfs.store.meta import ABANDONED, COMPLETED, FAILED, OPEN
from memfs.views.fold import Fold
from memfs.views.header import block

MAX_FILES = 50


def agent_line(origin) -> str:
    thread = f"thread `{origin.thread_id}`" if origin.thread_id is not None else "no thread id"
    return f"{origin.agent} ({thread})"


def render(session_id: str, fold: Fold, events_len: int, created_at: str, about: dict | None = None) -> str:
    """The digest; ``about``: the session's ``index/about.json`` (its block comes first)."""
    turns = fold.turns
    index = turns.index
    outcomes = bytes(index.outcome)
    n_open = outcomes.count(OPEN)
    completed, failed, abandoned = outcomes.count(COMPLETED), outcomes.count(FAILED), outcomes.count(ABANDONED)
    closed = len(index) - n_open
    status = status_of(about or {}, turns.status, turns.in_turn)
    if turns.in_turn:
        status += f", turn {index.last_ordinal} open"
    head = block(about or {})
    out = [f"# Session {session_id}\n\n", f"{head}\n" if head else "",
           f"- **Status:** {status}\n",
           f"- **Agent:** {agent_line(fold.origin)}\n",
           f"- **Turns:** {closed} closed ({completed} completed, {failed} failed, {abandoned} abandoned)"]
    if index.base > 1:
        out.append(f"; turns 1–{index.base - 1} evicted")
    inp, cached, creation, output = fold.usage
    out += ["\n",
            f"- **Events:** {turns.event_count} ({events_len} bytes)\n",
            f"- **Tokens:** {inp} input ({cached} cached, {creation} cache creation), {output} output\n",
            f"- **Created:** {created_at}\n",
            f"\n## Files touched ({len(fold.touched)})\n\n"]
    files = sorted(fold.touched)
    if files:
        out.extend(f"- `{path}`\n" for path in files[:MAX_FILES])
        if len(files) > MAX_FILES:
            out.append(f"- … and {len(files) - MAX_FILES} more\n")
    else:
        out.append("_None._\n")
    out.append(f"\n## Errors ({fold.error_count})\n\n")
    if fold.error_count > len(fold.recent_errors):
        out.append(f"- … {fold.error_count - len(fold.recent_errors)} earlier\n")
    for turn, etype, message in fold.recent_errors:
        where = f"turn {turn}" if turn is not None else "outside turns"
        out.append(f"- {where} ({etype}): {' '.join(message.split())}\n")
    if not fold.error_count:
        out.append("_None._\n")
    out.append("\n## Last agent message\n\n")
    out.append(f"{fold.last_message}\n" if fold.last_message else "_None yet._\n")
    return "".join(out)
