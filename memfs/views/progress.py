"""``derived/progress.json`` + ``progress.md`` (SPEC §4.3): the ProgressLedger, from the log.

Rules (the spec's, and the decisions taken where it is silent):

* Milestones come from the latest ``plan`` item or Codex ``todo_list`` item, whichever is later
  in the log — carried by ``item.started``, ``item.updated`` or ``item.completed`` (the latest
  wins, so a plan ticked off mid-turn shows at once). A to-do list gives one milestone per
  entry, ``done`` when ``completed``, else ``pending``. A plan gives one
  milestone per checklist line: ``- [x]`` done, ``- [~]`` in progress, ``- [!]`` blocked,
  ``- [ ]`` pending (``[X]`` too; the bullet may be ``-``, ``*`` or ``+``, or a number), and a
  numbered line (``1.`` / ``1)``) without a box is pending. Other lines are ignored. Ids are
  the 1-based positions (``"1"``, ``"2"``, …), as VT Code numbers tracker items.
* Confidence starts at 1.0 (VT Code's fresh ledger) and is rounded to 2 decimals after each
  change, so repeated ±0.05/0.1 steps do not drift (0.7, not 0.7000000000000001).
* An **advance** is a turn closed by ``turn.completed`` during which a milestone became done
  (a description done at the close that was not done when the turn opened).
* A **stall** is a turn closed by ``turn.failed``, or a turn containing ``turn.blocked`` — at
  most one stall per turn, applied at the first of those events. Events outside any turn
  neither advance nor stall.
* ``goal`` is the GoalTracker's current objective. When no ``goal.created`` names one, it is
  the first user prompt of the latest turn that has one (``turn.started``'s ``context.prompt``
  or a ``user_message`` item, see :mod:`memfs.views.fold`, or the prompt ``index/about.json``
  notes for a turn captured first from a stream that lacked it, ``turn_notes``), else the
  conversation's ``first_prompt`` there, else the title of the plan or to-do list that drives
  the milestones (:func:`plan_title`: a Codex stream carries no prompt line), else ``""``.
* Timestamps (``stalled_since``, ``updated_at``) come from the log where it has them, so the
  view does not change when it is merely regenerated: the causing event's ``completed_at`` (a
  plan item's ``context.timestamp``), else the turn's ``turn.started`` ``context.timestamp``,
  else the turn's ``ts`` in the turn index (when the store saw the turn open; a rescan
  re-stamps it), else the session's ``created_at``. ``updated_at`` is the time of the last
  change (plan, advance, stall), or the session's ``created_at`` before any.
* ``previous_session_id``, ``handoff_summary``, ``known_issues``, ``git_checkpoint`` have no
  event to come from yet: null / ``[]``.
"""

from __future__ import annotations

import math
import re

import orjson

PENDING, IN_PROGRESS, DONE, BLOCKED = "pending", "in_progress", "done", "blocked"
_BOX = {" ": PENDING, "x": DONE, "X": DONE, "~": IN_PROGRESS, "!": BLOCKED}
_MARK = {DONE: "[x]", IN_PROGRESS: "[~]", BLOCKED: "[!]", PENDING: "[ ]"}

_CHECKBOX = re.compile(r"^(?:[-*+]|\d+[.)])?\s*\[([ xX~!])\]\s*(.*)$")
_NUMBERED = re.compile(r"^\d+[.)]\s+(.*)$")


def parse_milestones(text: str) -> list[dict]:
    """Milestones of a plan's text: ``[{"id", "description", "status"}]`` in line order."""
    out: list[dict] = []
    for raw in text.splitlines():
        line = raw.strip()
        m = _CHECKBOX.match(line)
        if m is not None:
            status, desc = _BOX[m.group(1)], m.group(2).strip()
        else:
            m = _NUMBERED.match(line)
            if m is None:
                continue
            status, desc = PENDING, m.group(1).strip()
        if desc:
            out.append({"id": str(len(out) + 1), "description": desc, "status": status})
    return out


MAX_TITLE = 300


def plan_title(text: str) -> str:
    """What a plan is about: its first line that is not a milestone (``#`` marks stripped),
    else its milestones' descriptions joined with ``; ``; at most ~300 characters."""
    milestones = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if _CHECKBOX.match(line) or _NUMBERED.match(line):
            milestones.append(line)
            continue
        title = line.lstrip("#").strip().rstrip(":").strip()
        if title:
            return _cut(title)
    return todo_title([(m["description"], False) for m in parse_milestones(text)])


def todo_title(entries: list[tuple[str, bool]]) -> str:
    """A to-do list's title: its entries joined with ``; ``."""
    return _cut("; ".join(" ".join(text.split()) for text, _ in entries if text.strip()))


def _cut(text: str) -> str:
    return text if len(text) <= MAX_TITLE else text[:MAX_TITLE - 1].rstrip() + "…"


# A stamp is a timestamp string from the log, a turn ordinal (resolved at render through the
# turn index), or None (the session's created_at).
Stamp = str | int | None


class Ledger:
    """The ProgressLedger state folded from the log."""

    __slots__ = ("milestones", "done", "confidence", "stalled", "stalled_since", "updated", "title")

    def __init__(self) -> None:
        self.milestones: list[dict] = []
        self.done: frozenset[str] = frozenset()  # descriptions of done milestones
        self.confidence = 1.0
        self.stalled = False  # a flag beside the stamp: a stall whose stamp is None still shows
        self.stalled_since: Stamp = None
        self.updated: Stamp = None
        self.title = ""  # of the plan or to-do list the milestones come from

    def set_plan(self, text: str, stamp: Stamp) -> None:
        self._set(parse_milestones(text), plan_title(text), stamp)

    def set_todos(self, entries: list[tuple[str, bool]], stamp: Stamp) -> None:
        """Milestones from a Codex ``todo_list``: ``[(text, completed)]``."""
        milestones = [{"id": str(i), "description": " ".join(text.split()), "status": DONE if done else PENDING}
                      for i, (text, done) in enumerate(entries, 1)]
        self._set(milestones, todo_title(entries), stamp)

    def _set(self, milestones: list[dict], title: str, stamp: Stamp) -> None:
        self.milestones = milestones
        self.done = frozenset(m["description"] for m in milestones if m["status"] == DONE)
        self.title = title
        self.updated = stamp

    def advance(self, stamp: Stamp) -> None:
        self.stalled = False
        self.stalled_since = None
        self.confidence = round(min(self.confidence + 0.05, 1.0), 2)
        self.updated = stamp

    def stall(self, stamp: Stamp) -> None:
        if not self.stalled:
            self.stalled = True
            self.stalled_since = stamp
        self.confidence = round(max(self.confidence - 0.1, 0.0), 2)
        self.updated = stamp

    def completion_ratio(self) -> float:
        if not self.milestones:
            return 1.0
        return sum(1 for m in self.milestones if m["status"] == DONE) / len(self.milestones)

    def to_dict(self, session_id: str, goal: str, resolve) -> dict:
        """The ``progress.json`` object; ``resolve(stamp) -> str`` turns stamps into times."""
        return {
            "session_id": session_id,
            "goal": goal,
            "milestones": self.milestones,
            "confidence": self.confidence,
            "stalled_since": resolve(self.stalled_since) if self.stalled else None,
            "updated_at": resolve(self.updated),
            "previous_session_id": None,
            "handoff_summary": None,
            "known_issues": [],
            "git_checkpoint": None,
        }


def render_json(ledger: dict) -> bytes:
    """``progress.json``: compact JSON and a newline."""
    return orjson.dumps(ledger) + b"\n"


def render_markdown(ledger: dict) -> str:
    """``progress.md``, VT Code's layout::

        # Session Progress

        **Goal:** …
        **Completion:** 33%
        **Confidence:** 0.90
        **Stalled since:** …        (only when stalled)
        **Updated:** …

        ## Milestones

        [x] 1 — design
        [ ] 2 — build

    or ``_No tracked milestones yet._`` in place of the milestones section. Handoff lines and
    ``## Known Issues`` appear only when those fields are set.
    """
    ms = ledger["milestones"]
    ratio = (sum(1 for m in ms if m["status"] == DONE) / len(ms)) if ms else 1.0
    # Rust's f32::round (half away from zero), not Python's banker's rounding
    percent = math.floor(ratio * 100 + 0.5)
    out = ["# Session Progress\n\n",
           f"**Goal:** {ledger['goal']}\n",
           f"**Completion:** {percent}%\n",
           f"**Confidence:** {ledger['confidence']:.2f}\n"]
    if ledger["stalled_since"] is not None:
        out.append(f"**Stalled since:** {ledger['stalled_since']}\n")
    out.append(f"**Updated:** {ledger['updated_at']}\n\n")
    if ledger["previous_session_id"] is not None:
        out.append(f"**Handed off from:** {ledger['previous_session_id']}\n")
    if ledger["handoff_summary"] is not None:
        out.append(f"**Handoff summary:** {ledger['handoff_summary']}\n")
    if ledger["git_checkpoint"] is not None:
        out.append(f"**Git checkpoint:** `{ledger['git_checkpoint']}`\n")
    if ledger["known_issues"]:
        out.append("\n## Known Issues\n\n")
        out.extend(f"- {issue}\n" for issue in ledger["known_issues"])
    if not ms:
        out.append("\n_No tracked milestones yet._\n")
    else:
        out.append("\n## Milestones\n\n")
        out.extend(f"{_MARK.get(m['status'], '[ ]')} {m['id']} — {m['description']}\n" for m in ms)
    return "".join(out)
