"""``derived/context.md``: a compact brief of the session for an agent's next prompt.

What an agent resuming the work needs, most important first, under a size budget::

    # Context: session sess-1

    **Title:** Make fetch() retry
    **Agent:** codex 0.171.0, model gpt-5
    **Goal:** Make fetch() retry
    **Progress:** 2 of 3 milestones done (67%), confidence 0.90, stalled since …
    **Session:** completed, 2 turns (1 completed, 1 failed), agent codex (thread `0199…`)

    ## Open todos
    - [ ] Run the tests

    ## Last summary
    Added a retry loop with exponential backoff to fetch(); tests still to run.

    ## Failures (newest first)
    - turn 2 (turn.failed): stream disconnected before completion

    ## Files touched (newest first)
    - `tests/test_net.py`

    ## Facts (newest first)
    - declined: git push origin main

Decisions (the spec leaves the view to memfs):

* The header begins with what ``index/about.json`` says (:mod:`memfs.views.header`; nothing
  without it), before the goal.
* The budget is in tokens, estimated at 4 bytes a token (:data:`BYTES_PER_TOKEN`); the default
  is :data:`DEFAULT_BUDGET` (2,000 tokens, 8,000 bytes) and the mount takes another as
  ``derived/context.md?budget=N`` (1 ≤ N ≤ :data:`MAX_BUDGET`). The brief never exceeds it.
* Sections are filled in the order above; when the budget runs out, what is left of the
  current section and every later one is dropped, and a section that lost entries says how
  many (``- … 12 earlier``). Within a section entries go newest first, so a cut drops the
  oldest. A line that does not fit whole is cut on a character boundary with ``…`` only when
  it is the header or the last summary (a truncated path or fact would mislead).
* Open todos are the milestones not ``done`` (plan or to-do list, see
  :mod:`memfs.views.progress`). The last summary is ``memory.json``'s ``summary`` (last closed
  turn's last agent message), else the latest agent message. Failures are the errors
  ``summary.md`` lists (the last 20). Facts leave out what other sections already say (file
  changes, failures, to-do lists) and the agent messages already quoted.
"""

from __future__ import annotations

from memfs.store.listing import status_of
from memfs.store.meta import ABANDONED, COMPLETED, FAILED, OPEN
from memfs.views.header import block
from memfs.views.progress import _MARK, DONE
from memfs.views.summary import agent_line

BYTES_PER_TOKEN = 4
DEFAULT_BUDGET = 2000
MAX_BUDGET = 1_000_000
_SKIPPED_FACTS = frozenset(("file_change", "turn.failed", "turn.blocked", "error", "todo_list", "evicted"))


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _cut(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` UTF-8 bytes, cut on a character boundary with ``…``."""
    data = text.encode()
    if len(data) <= limit:
        return text
    if limit < 3:
        return ""
    return data[:limit - 3].decode("utf-8", "ignore") + "…"


class _Brief:
    def __init__(self, limit: int):
        self.limit = limit
        self.parts: list[str] = []
        self.size = 0
        self.full = False

    def room(self) -> int:
        return self.limit - self.size

    def add(self, text: str, cut: bool = False) -> bool:
        """Add ``text`` whole (or cut to fit, when ``cut``); False (and full) when it did not fit."""
        if self.full:
            return False
        n = len(text.encode())
        if n > self.room():
            if not cut:
                self.full = True
                return False
            text = _cut(text.rstrip("\n"), self.room() - 1) + "\n"
            n = len(text.encode())
            self.full = True
            if n > self.room() or text == "\n":
                return False
        self.parts.append(text)
        self.size += n
        return True

    def section(self, title: str, entries: list[str], more_word: str = "earlier") -> None:
        """A titled list, newest entries first; where the budget stops it, a last line counts
        the entries left out (room for it is kept while entries are added)."""
        if not entries or self.full:
            return
        head = f"\n## {title}\n"
        if len(head.encode()) + len(f"- … {len(entries)} {more_word}\n".encode()) > self.room():
            self.full = True
            return
        self.add(head)
        for i, entry in enumerate(entries):
            rest = len(entries) - i - 1
            reserve = len(f"- … {rest} {more_word}\n".encode()) if rest else 0
            if len(entry.encode()) + reserve > self.room():
                self.add(f"- … {len(entries) - i} {more_word}\n")
                self.full = True
                return
            self.add(entry)


def render(session_id: str, fold, ledger: dict, budget: int = DEFAULT_BUDGET, about: dict | None = None) -> str:
    """The brief of a session's fold and its ``progress.json`` ledger, in ``budget`` tokens;
    ``about``: the session's ``index/about.json``."""
    brief = _Brief(budget * BYTES_PER_TOKEN)
    turns = fold.turns
    outcomes = bytes(turns.index.outcome)
    milestones = ledger["milestones"]
    done = sum(1 for m in milestones if m["status"] == DONE)
    if milestones:
        progress = f"{done} of {len(milestones)} milestones done ({round(100 * done / len(milestones))}%)"
    else:
        progress = "no tracked milestones"
    progress += f", confidence {ledger['confidence']:.2f}"
    if ledger["stalled_since"] is not None:
        progress += f", stalled since {ledger['stalled_since']}"
    status = status_of(about or {}, turns.status, turns.in_turn) + (f", turn {turns.index.last_ordinal} open" if turns.in_turn else "")
    closed = len(outcomes) - outcomes.count(OPEN)
    header = (f"# Context: session {_one_line(session_id)}\n\n{block(about or {})}"
              f"**Goal:** {_one_line(ledger['goal']) or '_none recorded_'}\n"
              f"**Progress:** {progress}\n"
              f"**Session:** {status}, {closed} turns ({outcomes.count(COMPLETED)} completed, "
              f"{outcomes.count(FAILED)} failed, {outcomes.count(ABANDONED)} abandoned), "
              f"agent {agent_line(fold.origin)}\n")
    brief.add(header, cut=True)

    brief.section("Open todos", [f"- {_MARK.get(m['status'], '[ ]')} {_one_line(m['description'])}\n"
                                 for m in milestones if m["status"] != DONE], "more")
    summary = fold.summary or fold.last_message or ""
    if summary.strip() and not brief.full and brief.add("\n## Last summary\n"):
        brief.add(summary.strip() + "\n", cut=True)

    failures = []
    for turn, etype, message in reversed(fold.recent_errors):
        where = f"turn {turn}" if turn is not None else "outside turns"
        failures.append(f"- {where} ({etype}): {_one_line(message)}\n")
    if fold.error_count > len(fold.recent_errors):
        failures.append(f"- … {fold.error_count - len(fold.recent_errors)} earlier not kept\n")
    brief.section("Failures (newest first)", failures)

    files: list[str] = []
    seen: set[str] = set()
    for rec in reversed(fold.records):
        for path in reversed(rec.files):
            if path not in seen:
                seen.add(path)
                files.append(f"- `{path}`\n")
    brief.section("Files touched (newest first)", files)

    quoted = {_one_line(summary)}
    facts = [f"- {f['fact']}\n" for f in reversed(fold.facts.facts)
             if f["type"] not in _SKIPPED_FACTS and f["fact"] not in quoted]
    brief.section("Facts (newest first)", facts)
    return "".join(brief.parts)
