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
  ``turn.blocked`` events (missing counters read 0); a counter that is not an integer in
  0..2^53 (:mod:`memfs.counts`) is refused: it adds nothing and the line's ``usage_error``
  (present only then) gives the first such reason.
* ``item_types``, ``commands`` and ``files`` count ``item.completed`` events only (an item is
  usually started, updated and completed: counting all three would triple it). ``files`` are
  the paths of file changes, unique, in first-touch order.
* ``errors`` are the messages of ``turn.failed`` (``message`` or Codex's ``error.message``),
  ``turn.blocked`` and ``error`` events, of ``error`` items, and of failed MCP calls
  (``<server>.<tool> failed: <message>``), in log order. A command the approval policy refused
  is in ``commands`` with ``"status": "declined"``; it is not an error.
* ``started_at`` is the ``turn.started`` event's ``context.timestamp``, ``completed_at`` the
  closing event's ``completed_at`` — the agent's own clock, when it sends one (imports of
  transcripts carry the original times). Otherwise they are the arrival times memfs recorded
  itself (``index/turn-times.jsonl``, :mod:`memfs.store.turntimes`): when the writer received
  the ``turn.started`` line and the line that closed the turn (for an abandoned turn, the next
  ``turn.started``). A turn nobody timed — recovered by a rescan, written before memfs
  recorded times, or by a writer that died before persisting them — has null.

A closed turn's line changes only when its recorded times arrive (a follower sees the writer's
sidecar a persist after the log), so :class:`Trajectory` renders each closed line once and
again only for the turns whose times changed.
"""

from __future__ import annotations

import orjson

from memfs import counts
from memfs.store.machine import TurnState
from memfs.store.meta import OPEN, OUTCOME_NAMES

USAGE_FIELDS = ("input_tokens", "cached_input_tokens", "cache_creation_tokens", "output_tokens")


def add_usage(acc: list[int], usage) -> str | None:
    """Add a Usage object's counters to ``acc`` (4 ints); returns the reason a count was refused
    (:func:`memfs.counts.read`: the one validator; a refused count adds nothing), else None."""
    values, refused = counts.read(usage, USAGE_FIELDS)
    for i, v in enumerate(values):
        acc[i] += v
    return refused


def usage_dict(acc: list[int]) -> dict:
    return dict(zip(USAGE_FIELDS, acc))


class TurnRecord:
    """What the views accumulate about one turn beyond the state machine's index entry."""

    __slots__ = ("ordinal", "usage", "item_types", "commands", "files", "errors", "last_message",
                 "started_at", "completed_at", "stalled", "done_at_start", "reasoning", "model", "tools",
                 "agent_cost", "agent", "requests", "usage_error")

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
        self.reasoning = 0  # usage (memfs.usage): reasoning tokens, part of output
        self.model: str | None = None  # the model its events name, if any
        self.tools: dict[str, list] = {}  # tool calls by tool (memfs.usage.calls)
        self.agent_cost: float | None = None  # the agent's own cost (Claude total_cost_usd)
        self.agent: str | None = None  # the agent its close names (SPEC §10 per-turn facts)
        self.requests: list | None = None  # its close's model requests (memfs.events REQUEST), if any
        self.usage_error: str | None = None  # why a token count of its usage was refused (memfs.counts)


def turn_line(state: TurnState, i: int, rec: TurnRecord, times: tuple | None = None) -> bytes:
    """The trajectory line (with ``\\n``) of index entry ``i``; ``times`` the recorded
    ``(started_at, completed_at)`` of the turn, used where its events carry no clock."""
    index = state.index
    started, completed = rec.started_at, rec.completed_at
    if times is not None:
        started = started if started is not None else times[0]
        completed = completed if completed is not None else times[1]
    line = {
        "turn": rec.ordinal,
        "outcome": OUTCOME_NAMES[index.outcome[i]] or "unknown",
        "start_offset": index.start[i],
        "end_offset": index.end[i],
        "event_count": index.count[i],
        "started_at": started,
        "completed_at": completed,
        "usage": usage_dict(rec.usage),
        "item_types": rec.item_types,
        "commands": rec.commands,
        "files": list(rec.files),
        "errors": rec.errors,
    }
    if rec.usage_error is not None:
        line["usage_error"] = rec.usage_error
    return orjson.dumps(line) + b"\n"


class Trajectory:
    """The rendered ``trajectory.jsonl``: closed turns' lines cached (redone when their recorded
    times change), the open one redone."""

    __slots__ = ("_lines", "_token", "_times")

    def __init__(self) -> None:
        self._lines: list[bytes] = []
        self._token = None
        self._times: dict[int, tuple] = {}

    def render(self, state: TurnState, records: list[TurnRecord], times_delta=None) -> bytes:
        """``times_delta``: :meth:`SessionReads.turn_times_delta
        <memfs.store.reading.SessionReads.turn_times_delta>` of the session (None: no times)."""
        index = state.index
        base = index.base
        lines, times = self._lines, self._times
        if times_delta is not None:
            self._token, whole, changed = times_delta(self._token)
            if whole:
                times.clear()
                del lines[:]
            times.update(changed)
            if not whole:
                for ordinal in changed:  # closed lines whose recorded times arrived late
                    i = ordinal - base
                    if 0 <= i < len(lines):
                        lines[i] = turn_line(state, i, records[i], times.get(ordinal))
        n = len(records)
        closed = n - 1 if n and index.outcome[n - 1] == OPEN else n
        for i in range(len(lines), closed):
            lines.append(turn_line(state, i, records[i], times.get(base + i)))
        if closed < n:
            return b"".join(lines) + turn_line(state, n - 1, records[n - 1], times.get(base + n - 1))
        return b"".join(lines)
