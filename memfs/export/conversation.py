"""A session's log read back as a conversation (SPEC §11): its turns, each with its prompt,
its items in the order they began (an item's last state wins), its outcome and its own usage.
The writers (:mod:`memfs.agents.claude.write`, :mod:`memfs.agents.codex.write`) render this, never the log.

* An item's place is where it first appeared (``item.started`` of a tool call), its content
  what it last said (``item.completed``). A ``tool_output`` whose ``call_id`` names a
  ``tool_invocation`` of the same turn is that call's result (``result`` on the call), not an
  item of its own; an unmatched one stays an item (the writers fold it into text).
* A turn's usage is its close's ``usage``; for Codex, whose counts run over the whole thread,
  it is the growth of the running total (``thread_usage``, or the close's usage in a log Codex
  ``exec --json`` wrote) since the previous close, as the views count it.
* ``thread.compact_boundary`` and a top-level ``error`` are kept in the turn they fall in (or
  the next one) as ``harness`` / ``error`` items, so nothing of the log is dropped silently.
* A turn still open at the end of the log has outcome ``open``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from memfs import counts
from memfs.agents import CODEX, UNKNOWN, Origin, agent_name, recorded_disjoint, run_local_id
from memfs.agents.common import iso, own_input, parse_time  # noqa: F401  (the writers' names for them)

USAGE_KEYS = ("input_tokens", "cached_input_tokens", "cache_creation_tokens", "output_tokens")
NAMESPACE = uuid.UUID("6f1c2a52-8d0e-4d8e-9c1e-6d656d667321")  # uuid5 namespace of memfs exports


@dataclass
class Turn:
    """One turn: ``items`` are ThreadItem dicts (a call's result, when separate, in ``result``)."""

    number: int
    prompt: str | None = None
    turn_id: str | None = None
    started_at: str | None = None
    completed_at: str | None = None
    outcome: str = "open"  # completed, failed, open
    failure: str | None = None
    usage: dict = field(default_factory=dict)
    items: list[dict] = field(default_factory=list)
    model: str | None = None  # the model its close names (the last request's)
    agent: str | None = None  # the agent whose counts its usage is in (its close's, else the session's)

    def disjoint_usage(self) -> dict:
        """The turn's usage in memfs's disjoint form, Usage names (``input_tokens`` without cache
        reads and writes): Claude reports it so; Codex, Gemini and native logs count the cache
        inside ``input_tokens`` (as :func:`memfs.usage.view.normal_tokens` reads them)."""
        out = {k: v for k, v in zip(USAGE_KEYS, counts.read(self.usage, USAGE_KEYS)[0])}
        out["input_tokens"] = own_input(recorded_disjoint(self.agent), out["input_tokens"], out["cached_input_tokens"],
                                        out["cache_creation_tokens"])
        return out
    usage_error: str | None = None  # a refused token count's reason (memfs.counts): the writers carry it on


@dataclass
class Conversation:
    """A session as the writers see it: ``about`` is :mod:`memfs.store.about` metadata."""

    name: str
    agent: str
    about: dict
    turns: list[Turn]
    thread_id: str | None = None

    @property
    def conversation_id(self) -> str:
        """The UUID the target CLI resumes: the agent's own id when it is a UUID (a Claude
        session id, a Codex thread id), else a UUID derived from the session's name (the same
        for every export of it). A fork's log names its source's thread (its lines are the
        source's): a fork with no id of its own (one made before ``memfs fork`` gave forks
        their own) takes the name's UUID, never the source's."""
        thread = None if self.about.get("forked_from") else self.thread_id
        for candidate in (self.about.get("conversation_id"), thread, self.name):
            if isinstance(candidate, str):
                try:
                    return str(uuid.UUID(candidate))
                except ValueError:
                    continue
        return str(uuid.uuid5(NAMESPACE, self.name))

    @property
    def model(self) -> str | None:
        model = self.about.get("model")
        return model if isinstance(model, str) and model else None


_BOUNDARY_KEYS = ("trigger", "mode", "original_message_count", "compacted_message_count", "pre_tokens", "post_tokens")


def read_conversation(name: str, lines: Iterable[bytes], about: dict,
                      turn_times: dict[int, tuple[str | None, str | None]] | None = None,
                      first_turn: int = 1) -> Conversation:
    """The conversation of session ``name`` from its log ``lines`` (envelopes or bare events);
    ``first_turn``: the number of the log's first retained turn (the numbers ``turn_times``
    and ``about``'s ``turn_notes`` use). A turn without a prompt or turn id of its own takes
    the one a later capture noted for it (``turn_notes``); an item id Codex ``exec --json``
    numbers per run (``item_0``…) is made unique by its turn (``t<n>.item_0``)."""
    origin = Origin()
    turns: list[Turn] = []
    current: Turn | None = None
    waiting: list[dict] = []  # items met outside a turn: they go to the next one
    places: dict[str, int] = {}  # item id -> index in current.items
    calls: dict[str, dict] = {}  # tool_invocation id -> its item (this turn)
    thread_id: str | None = None
    total_before: list[int] | None = None
    total_refused: str | None = None  # the previous running total had a refused count
    for raw in lines:
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        event = obj.get("event", obj) if type(obj) is dict else None
        if type(event) is not dict:
            continue
        origin.feed(event)
        etype = event.get("type")
        if etype == "thread.started":
            if thread_id is None and isinstance(event.get("thread_id"), str):
                thread_id = event["thread_id"]
        elif etype == "turn.started":
            if current is not None:  # a turn never closed: it stays open, the new one begins
                turns.append(current)
            current = Turn(number=first_turn + len(turns))
            context = event.get("context") if type(event.get("context")) is dict else {}
            for key, attr in (("prompt", "prompt"), ("turn_id", "turn_id"), ("timestamp", "started_at")):
                if isinstance(context.get(key), str) and context[key]:
                    setattr(current, attr, context[key])
            places, calls = {}, {}
            for item in waiting:
                _place(current, item, places, calls)
            waiting = []
        elif etype in ("item.started", "item.updated", "item.completed"):
            item = event.get("item")
            if type(item) is dict and isinstance(item.get("id"), str):
                if run_local_id(item["id"]):
                    item = {**item, "id": f"t{first_turn + len(turns)}.{item['id']}"}
                if current is None:
                    waiting.append(item)
                else:
                    _place(current, item, places, calls)
        elif etype in ("turn.completed", "turn.failed", "turn.blocked") and current is not None:
            usage = event.get("usage") if type(event.get("usage")) is dict else {}
            own, refused = counts.read(usage, USAGE_KEYS)  # the one validator, as the views read it
            total = event.get("thread_usage")
            if type(total) is dict or origin.agent == CODEX:
                now, now_refused = counts.read(total if type(total) is dict else usage, USAGE_KEYS)
                if total_before is not None and all(n >= b for n, b in zip(now, total_before)):
                    own = [n - b for n, b in zip(now, total_before)]
                    refused = refused or now_refused or total_refused
                total_before, total_refused = now, now_refused
            current.usage = {k: v for k, v in zip(USAGE_KEYS, own) if v}
            current.usage_error = refused
            current.outcome = "completed" if etype == "turn.completed" else "failed"
            if etype != "turn.completed":
                current.failure = _failure(event)
            if isinstance(event.get("completed_at"), str):
                current.completed_at = event["completed_at"]
            if isinstance(event.get("model"), str) and event["model"]:
                current.model = event["model"]
            if isinstance(event.get("agent"), str) and event["agent"]:
                current.agent = agent_name(event["agent"])
            turns.append(current)
            current = None
        elif etype == "thread.compact_boundary":
            note: dict[str, Any] = {"id": f"compact-{len(turns) + 1}", "type": "harness", "event": "compact_boundary",
                    "message": f"(the conversation was compacted here: {event.get('trigger') or 'auto'})",
                    "boundary": {k: event[k] for k in _BOUNDARY_KEYS if k in event}}  # for a marked fold
            (waiting.append(note) if current is None else _place(current, note, places, calls))
        elif etype == "error" and isinstance(event.get("message"), str):
            note = {"id": f"error-{len(turns) + 1}-{len(waiting)}", "type": "error", "message": event["message"]}
            (waiting.append(note) if current is None else _place(current, note, places, calls))
    if current is not None:
        turns.append(current)
    elif waiting:  # items after the last turn: a turn of their own, open
        orphan = Turn(number=first_turn + len(turns))
        for item in waiting:
            _place(orphan, item, {}, {})
        turns.append(orphan)
    notes = about.get("turn_notes") if type(about.get("turn_notes")) is dict else {}
    for turn in turns:
        note = notes.get(str(turn.number))
        if type(note) is dict:
            if turn.prompt is None and isinstance(note.get("prompt"), str) and note["prompt"]:
                turn.prompt = note["prompt"]
            if turn.turn_id is None and isinstance(note.get("turn_id"), str) and note["turn_id"]:
                turn.turn_id = note["turn_id"]
        start, end = (turn_times or {}).get(turn.number, (None, None))
        turn.started_at = turn.started_at or start
        turn.completed_at = turn.completed_at or end
    agent = about.get("agent") if isinstance(about.get("agent"), str) else origin.agent
    for turn in turns:
        turn.agent = turn.agent or (agent_name(agent) if agent else None)
    return Conversation(name=name, agent=agent or UNKNOWN, about=about, turns=turns, thread_id=thread_id)


def _place(turn: Turn, item: dict, places: dict[str, int], calls: dict[str, dict]) -> None:
    iid = item["id"]
    if item.get("type") == "tool_output":
        call = calls.get(item.get("call_id")) if isinstance(item.get("call_id"), str) else None
        if call is not None:
            call["result"] = item
            return
    if iid in places:
        old = turn.items[places[iid]]
        merged = {**old, **item}
        if "result" in old:
            merged["result"] = old["result"]
        turn.items[places[iid]] = merged
        if merged.get("type") == "tool_invocation":
            calls[iid] = merged
        return
    places[iid] = len(turn.items)
    turn.items.append(dict(item))
    if item.get("type") == "tool_invocation":
        calls[iid] = turn.items[-1]


def _failure(event: dict) -> str:
    message = event.get("message")
    if isinstance(message, str) and message:
        return message
    error = event.get("error")
    if type(error) is dict and isinstance(error.get("message"), str):
        return error["message"]
    return "failed"


# --- time --------------------------------------------------------------------------------------


class Clock:
    """Timestamps for the lines of an export: each turn's recorded start and end, the lines in
    between a millisecond apart, never going back (a line without a time of its own gets the
    one after the previous line's)."""

    def __init__(self, fallback: datetime | None = None) -> None:
        self.last = fallback or datetime.now(UTC)
        self.first: datetime | None = None

    def at(self, text: Any = None) -> str:
        value = parse_time(text)
        step = self.last + timedelta(milliseconds=1) if self.first is not None else self.last
        self.last = value if value is not None and value >= step else step
        if self.first is None:
            self.first = self.last
        return iso(self.last)
