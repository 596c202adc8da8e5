"""``derived/trajectory.jsonl`` (SPEC §4.2): one compact JSON line per retained turn.

A line::

    {"turn":3,"outcome":"completed","start_offset":87,"end_offset":330,"event_count":5,
     "started_at":null,"completed_at":null,
     "usage":{"input_tokens":0,"cached_input_tokens":0,"cache_creation_tokens":0,"output_tokens":0},
     "item_types":{"agent_message":1},"commands":[{"command":"make","exit_code":0,"status":"completed"}],
     "files":["src/net.py"],"errors":["boom"]}

Decisions recorded here where the spec is silent:

* ``outcome``, offsets and ``event_count`` come from the one turn state machine.
* ``usage`` sums the ``usage`` of the turn's ``turn.completed`` / ``turn.failed`` /
  ``turn.blocked`` events (missing or malformed counters read 0).
* ``item_types``, ``commands`` and ``files`` count ``item.completed`` events only (an item is
  usually started, updated and completed: counting all three would triple it). ``files`` are
  the paths of file changes, unique, in first-touch order.
* ``errors`` are the messages of ``turn.failed`` (``message`` or Codex's ``error.message``),
  ``turn.blocked`` and ``error`` events, of ``error`` items, and of failed MCP calls
  (``<server>.<tool> failed: <message>``), in log order. A command the approval policy refused
  is in ``commands`` with ``"status": "declined"``; it is not an error.
* ``started_at`` is the ``turn.started`` event's ``context.timestamp``, ``completed_at`` the
  closing event's ``completed_at`` (null when absent).

A closed turn's line never changes, so :class:`Trajectory` renders each one once.
"""

from __future__ import annotations

import orjson

from memfs.store.machine import TurnState
from memfs.store.meta import OPEN, OUTCOME_NAMES

USAGE_FIELDS = ("input_tokens", "cached_input_tokens", "cache_creation_tokens", "output_tokens")


def add_usage(acc: list[int], usage) -> None:
    """Add a Usage object's counters to ``acc`` (4 ints); anything malformed reads 0."""
    if type(usage) is not dict:
        return
    for i, name in enumerate(USAGE_FIELDS):
        v = usage.get(name)
        if type(v) is int and v > 0:
            acc[i] += v


def usage_dict(acc: list[int]) -> dict:
    return dict(zip(USAGE_FIELDS, acc))


class TurnRecord:
    """What the views accumulate about one turn beyond the state machine's index entry."""

    __slots__ = ("ordinal", "usage", "item_types", "commands", "files", "errors", "last_message",
                 "started_at", "completed_at", "stalled", "done_at_start")

    def __init__(self, ordinal: int, started_at: str | None, done_at_start: frozenset):
        self.ordinal = ordinal
        self.usage = [0, 0, 0, 0]
        self.item_types: dict[str, int] = {}
        self.commands: list[dict] = []
        self.files: dict[str, None] = {}  # an ordered set
        self.errors: list[str] = []
        self.last_message: str | None = None
        self.started_at = started_at
        self.completed_at: str | None = None
        self.stalled = False  # progress: this turn already counted as a stall
        self.done_at_start = done_at_start  # progress: milestones done when it opened


def turn_line(state: TurnState, i: int, rec: TurnRecord) -> bytes:
    """The trajectory line (with ``\\n``) of index entry ``i``."""
    index = state.index
    return orjson.dumps({
        "turn": rec.ordinal,
        "outcome": OUTCOME_NAMES[index.outcome[i]] or "unknown",
        "start_offset": index.start[i],
        "end_offset": index.end[i],
        "event_count": index.count[i],
        "started_at": rec.started_at,
        "completed_at": rec.completed_at,
        "usage": usage_dict(rec.usage),
        "item_types": rec.item_types,
        "commands": rec.commands,
        "files": list(rec.files),
        "errors": rec.errors,
    }) + b"\n"


class Trajectory:
    """The rendered ``trajectory.jsonl``: closed turns' lines cached, the open one redone."""

    __slots__ = ("_closed", "_n")

    def __init__(self) -> None:
        self._closed = bytearray()
        self._n = 0

    def render(self, state: TurnState, records: list[TurnRecord]) -> bytes:
        index = state.index
        n = len(records)
        closed = n - 1 if n and index.outcome[n - 1] == OPEN else n
        for i in range(self._n, closed):
            self._closed += turn_line(state, i, records[i])
        self._n = max(self._n, closed)
        if closed < n:
            return bytes(self._closed) + turn_line(state, n - 1, records[n - 1])
        return bytes(self._closed)
