"""The turn-lifecycle state machine (SPEC §3.1) — the only one.

Append, rescan and the views all drive :func:`apply` with the same inputs: the event's
:class:`~memfs.events.Kind` and the byte range of its line. Ordinals are implicit: the index
holds turns ``base .. base+len-1`` contiguously, so opening a turn always creates
``turn_count + 1``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memfs.events import Kind
from memfs.store.meta import ABANDONED, COMPLETED, FAILED, TurnIndex


@dataclass(slots=True)
class TurnState:
    """Counters and index that the log's lines imply."""

    index: TurnIndex = field(default_factory=TurnIndex)
    turn_count: int = 0
    event_count: int = 0
    status: str = "active"
    in_turn: bool = False


_OTHER, _THREAD_STARTED, _THREAD_COMPLETED, _TURN_STARTED, _TURN_COMPLETED = (
    Kind.OTHER, Kind.THREAD_STARTED, Kind.THREAD_COMPLETED, Kind.TURN_STARTED, Kind.TURN_COMPLETED)


def apply(state: TurnState, kind: Kind, offset: int, end: int, ts: str) -> bool:
    """Fold one accepted line ``[offset, end)`` into ``state``; True at a turn boundary.

    ``ts`` stamps a newly opened index entry.
    """
    state.event_count += 1
    if kind is _OTHER:  # by far the most common line: first, and with the least work
        if state.in_turn:
            index = state.index
            index.end[-1] = end
            index.count[-1] += 1
        return False
    index = state.index
    if kind is _THREAD_STARTED:
        state.status = "active"
        if state.in_turn:
            index.end[-1] = end
            index.count[-1] += 1
        return False
    if kind is _TURN_STARTED:
        state.status = "active"
        if state.in_turn:  # memfs rule: the open turn is abandoned so ordinals stay contiguous
            index.outcome[-1] = ABANDONED
            state.turn_count = index.last_ordinal
        index.open_turn(offset, end, ts)
        state.in_turn = True
        return False
    if kind is _THREAD_COMPLETED:
        state.status = "completed"
        if state.in_turn:  # the open turn stays open
            index.end[-1] = end
            index.count[-1] += 1
        return True
    # TURN_COMPLETED / TURN_FAILED
    if state.in_turn:
        index.end[-1] = end
        index.count[-1] += 1
        index.outcome[-1] = COMPLETED if kind is _TURN_COMPLETED else FAILED
        state.turn_count = index.last_ordinal
        state.in_turn = False
    return True


def renumber(state: TurnState, base: int) -> None:
    """Give the state's turns ordinals starting at ``base`` (rescans number from 1 first).

    ``turn_count`` becomes the ordinal of the last closed turn, or ``base - 1``.
    """
    closed = len(state.index) - (1 if state.in_turn else 0)
    state.index.rebase(base)
    state.turn_count = base - 1 + closed
