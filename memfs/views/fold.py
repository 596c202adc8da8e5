"""The fold: one pass over a log's lines feeds every view's state.

:class:`Fold` is what the views know about a session; :meth:`Fold.feed` takes the log's
``(offset, line)`` pairs in order, from the first byte or from where the previous feed
stopped, so an append costs only its own bytes. Lines are decoded with the rescan's acceptance
rules (:func:`memfs.events.decode_stored`) and their turn ordinal comes from the one turn state
machine (:func:`memfs.store.machine.apply`), seeded with the log's first retained ordinal.

Everything here is a pure function of the lines (and of the eviction-summary facts the owner
loads first, and the command results ``index/about.json`` notes, :func:`command_notes`): no
clock, no I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from memfs import counts
from memfs.agents import CODEX, HEAD_BYTES, Origin
from memfs.events import Kind, decode_stored
from memfs.facts import event_facts, failure_message, mcp_call, todo_entries
from memfs.store.machine import TurnState, apply
from memfs.store.meta import ABANDONED, COMPLETED, FAILED, TurnIndex
from memfs.usage import calls
from memfs.views.goal import GoalTracker
from memfs.views.memory import FactList
from memfs.views.progress import Ledger
from memfs.views.trajectory import TurnRecord, add_usage

RECENT_ERRORS = 20

_TURN_STARTED = Kind.TURN_STARTED
_TURN_COMPLETED = Kind.TURN_COMPLETED
_TURN_FAILED = Kind.TURN_FAILED
_ERROR_EVENTS = frozenset(("turn.failed", "turn.blocked", "error"))
_ITEM_EVENTS = frozenset(("item.started", "item.updated"))
_PROGRESS_ITEMS = frozenset(("plan", "todo_list"))


def command_notes(about: dict) -> dict:
    """What ``about.json``'s ``item_notes`` add to stored ``command_execution`` items: ``{id:
    {"exit_code": int, "status": str}}`` (a later capture of the conversation knew the result
    the first one lacked — Gemini CLI's stream-json has no exit code, its chat file has)."""
    notes = about.get("item_notes")
    out: dict = {}
    if type(notes) is dict:
        for iid, note in notes.items():
            if type(note) is dict and type(note.get("exit_code")) is int:
                status = note.get("status")
                out[iid] = {"exit_code": note["exit_code"], **({"status": status} if type(status) is str else {})}
    return out


_EXTRA_COUNTS = ("cache_write_input_tokens", "reasoning_output_tokens")


def _tokens(usage) -> tuple[list[int], str | None]:
    """A Usage object's counters plus reasoning (see :meth:`Fold._turn_usage`), and the reason
    one was refused (:mod:`memfs.counts`, the one validator), else None."""
    acc = [0, 0, 0, 0, 0]
    refused = add_usage(acc, usage)
    (write, reasoning), extra = counts.read(usage, _EXTRA_COUNTS)
    if not acc[2] and write > 0:
        acc[2] = write
    if reasoning > 0:
        acc[4] = reasoning
    return acc, refused or extra


def prompt_text(item: dict) -> str | None:
    """The text of a ``user_message`` item (the user's prompt): its ``text``, or the text
    parts of its ``content`` list (``[{"type": "text", "text": …}]``, Codex app-server's
    shape), joined by blank lines; None when it has none."""
    text = item.get("text")
    if type(text) is str:
        return text if text.strip() else None
    content = item.get("content")
    if type(content) is list:
        parts = [c["text"] for c in content if type(c) is dict and type(c.get("text")) is str]
        joined = "\n\n".join(parts)
        return joined if joined.strip() else None
    return None


class Fold:
    """All view state of one session, folded from its retained log."""

    def __init__(self, base: int = 1, item_notes: dict | None = None):
        self.item_notes = item_notes or {}  # :func:`command_notes`, applied to the items they name
        self.turns = TurnState(TurnIndex(base), base - 1)
        self.records: list[TurnRecord] = []  # records[i] is index entry i
        self.facts = FactList()
        self.touched: set[str] = set()
        self.touched_changes = 0  # bumps when ``touched`` grows (render cache key)
        self.summary = ""  # last agent message of the last closed turn
        self.last_message: str | None = None  # latest agent message anywhere
        self.usage = [0, 0, 0, 0]  # summed over turns
        self.error_count = 0
        self.recent_errors: deque = deque(maxlen=RECENT_ERRORS)  # (turn|None, type, message)
        self.ledger = Ledger()
        self.goal = GoalTracker()
        self.origin = Origin()  # which agent wrote the log, its thread id
        self.prompt: str | None = None  # first user prompt of the latest turn that has one
        self.thread: str | None = None  # the latest thread.started's thread id
        self.thread_totals: dict = {}  # thread id -> its running token total (Codex), see _turn_usage
        self.item_started: dict[str, str] = {}  # tool call id -> its item.started's timestamp (durations)
        self.agent_cost: float | None = None  # the agent's own cost (thread.completed total_cost_usd)
        self._cost_run = 0.0  # the last total_cost_usd seen
        self._prompt_turn: int | None = 0  # the turn it came from (None: outside turns)
        self.lines = 0
        self.skipped = 0

    # --- the per-line fold -----------------------------------------------------------------

    def feed(self, lines: Iterable[tuple[int, bytes]]) -> int:
        """Fold ``(offset, line)`` pairs; return the offset just past the last line (or -1)."""
        turns = self.turns
        records = self.records
        add_fact = self.facts.add
        origin = self.origin
        notes = self.item_notes
        end = -1
        n = skipped = 0
        for offset, line in lines:
            n += 1
            end = offset + len(line) + 1
            decoded = decode_stored(line)
            if decoded is None:
                skipped += 1
                continue
            kind, event = decoded
            was_in = turns.in_turn
            apply(turns, kind, offset, end, "")
            if kind is _TURN_STARTED:
                if was_in:
                    self._closed(records[-1], ABANDONED, event)
                rec = self._opened(turns.index.last_ordinal, event)
            else:
                rec = records[-1] if was_in else None
            etype = event["type"]
            if offset < HEAD_BYTES and not origin.settled:
                origin.feed(event)
            if etype == "item.completed":  # the bulk of a log: kept on the shortest path
                item = event.get("item")
                if type(item) is dict:
                    if notes and item.get("type") == "command_execution" and item.get("exit_code") is None:
                        note = notes.get(item.get("id"))
                        if note is not None:
                            item = {**item, **note}
                            event = {**event, "item": item}
                    facts = event_facts(event)
                    if facts:
                        turn = rec.ordinal if rec is not None else None
                        for ftype, text in facts:
                            add_fact(text, turn, offset, ftype)
                    self._completed_item(item, rec)
            elif etype in _ITEM_EVENTS:
                item = event.get("item")
                if type(item) is dict:
                    if item.get("type") in _PROGRESS_ITEMS:
                        self._plan(item, rec)
                    if etype == "item.started" and type(item.get("context")) is dict:
                        self._call_started(item)
            elif etype in _ERROR_EVENTS or etype == "turn.completed":
                if etype != "turn.completed":
                    turn = rec.ordinal if rec is not None else None
                    for ftype, text in event_facts(event):
                        add_fact(text, turn, offset, ftype)
                if etype == "error":
                    self._error(rec, etype, failure_message(event))
                else:
                    self._lifecycle(etype, event, rec, was_in and (kind is _TURN_COMPLETED or kind is _TURN_FAILED))
            elif etype.startswith("goal."):
                self.goal.apply(event, offset, self._stamp(event, rec))
            elif etype == "thread.started" and type(event.get("thread_id")) is str:
                self.thread = event["thread_id"]
            elif etype == "thread.completed":
                self._reported_cost(event, rec if rec is not None else (records[-1] if records else None))
        self.lines += n
        self.skipped += skipped
        return end

    # --- helpers ---------------------------------------------------------------------------

    @staticmethod
    def _stamp(event: dict, rec: TurnRecord | None):
        """When an event happened, as far as the log says (see ``memfs.views.progress``)."""
        at = event.get("completed_at")
        if type(at) is str:
            return at
        if rec is None:
            return None
        return rec.started_at if rec.started_at is not None else rec.ordinal

    def _opened(self, ordinal: int, event: dict) -> TurnRecord:
        context = event.get("context")
        started_at = context.get("timestamp") if type(context) is dict else None
        rec = TurnRecord(ordinal, started_at if type(started_at) is str else None, self.ledger.done)
        self.records.append(rec)
        prompt = context.get("prompt") if type(context) is dict else None
        if type(prompt) is str and prompt.strip():  # the ingest's turn.started.context.prompt
            self.prompt, self._prompt_turn = prompt, ordinal
        return rec

    def _closed(self, rec: TurnRecord, outcome: int, event: dict) -> None:
        """A turn closed (``outcome`` from the state machine): summary and progress effects."""
        self.summary = rec.last_message or ""
        if outcome == COMPLETED:
            if self.ledger.done - rec.done_at_start:
                self.ledger.advance(self._stamp(event, rec))
        elif outcome == FAILED and not rec.stalled:
            rec.stalled = True
            self.ledger.stall(self._stamp(event, rec))

    def _error(self, rec: TurnRecord | None, etype: str, message) -> None:
        if type(message) is not str:
            return
        self.error_count += 1
        self.recent_errors.append((rec.ordinal if rec is not None else None, etype, message))
        if rec is not None:
            rec.errors.append(message)

    def _lifecycle(self, etype: str, event: dict, rec: TurnRecord | None, closes: bool) -> None:
        usage = event.get("usage")
        if usage is not None:
            tokens, refused = self._turn_usage(event, usage)
            if rec is not None:
                if refused is not None and rec.usage_error is None:
                    rec.usage_error = refused
                for i in range(4):
                    rec.usage[i] += tokens[i]
                    self.usage[i] += tokens[i]
                rec.reasoning += tokens[4]
            self.goal.add_tokens(tokens[0] + tokens[3])
        if rec is not None:
            if type(event.get("model")) is str and event["model"]:
                rec.model = event["model"]
            if type(event.get("agent")) is str and event["agent"]:
                rec.agent = event["agent"]
            if type(event.get("requests")) is list:
                rec.requests = event["requests"]
        if etype != "turn.completed":
            self._error(rec, etype, failure_message(event))
        if etype == "turn.blocked" and rec is not None and not rec.stalled:
            rec.stalled = True
            self.ledger.stall(self._stamp(event, rec))
        if closes:
            at = event.get("completed_at")
            rec.completed_at = at if type(at) is str else None
            self._closed(rec, COMPLETED if etype == "turn.completed" else FAILED, event)

    def _turn_usage(self, event: dict, usage) -> tuple[list[int], str | None]:
        """A close's own usage. Codex counts a thread's tokens cumulatively, across a resumed
        conversation too: ``exec --json``'s ``turn.completed`` usage is that running total, and
        a translated rollout's close carries it as ``thread_usage`` beside the usage it saw
        grow (which, on a later page of a paginated rollout, is the whole total again). Either
        way the turn's own is the total's growth since the thread's previous close, when that
        is known and no counter went down (else: the close's own ``usage``). Five counters: the
        Usage fields, then reasoning tokens (Codex ``reasoning_output_tokens``, part of output);
        Codex's ``cache_write_input_tokens`` stands for ``cache_creation_tokens``. With them, the
        reason a count was refused (:mod:`memfs.counts`): in the close's usage, or in the running
        total the turn's own is differenced from (this one or the previous)."""
        tokens, refused = _tokens(usage)
        total = event.get("thread_usage")
        if type(total) is dict:
            current, total_refused = _tokens(total)
        elif self.origin.agent == CODEX:
            current, total_refused = tokens[:], refused
        else:
            return tokens, refused
        before = self.thread_totals.get(self.thread)
        self.thread_totals[self.thread] = (current, total_refused)
        if before is not None and all(n >= b for n, b in zip(current, before[0])):
            return [n - b for n, b in zip(current, before[0])], refused or total_refused or before[1]
        return tokens, refused

    def _call_started(self, item: dict) -> None:
        at = calls.item_time(item)
        iid = item.get("id")
        if at is not None and type(iid) is str and item.get("type") in calls.TOOL_ITEMS:
            if len(self.item_started) > 1024:  # started and never completed: forget the oldest
                del self.item_started[next(iter(self.item_started))]
            self.item_started.setdefault(iid, at)

    def _reported_cost(self, event: dict, rec: TurnRecord | None) -> None:
        """Claude's ``total_cost_usd`` is the conversation's running cost (a resumed run carries
        it on): the turn's is its growth; a smaller one starts a new count (a run that did not)."""
        usd = event.get("total_cost_usd")
        if type(usd) in (int, float) and usd >= 0:
            before = self._cost_run
            own = usd - before if usd >= before else usd
            self._cost_run = usd
            self.agent_cost = (self.agent_cost or 0.0) + own
            if rec is not None:
                rec.agent_cost = (rec.agent_cost or 0.0) + own

    def _plan(self, item: dict, rec: TurnRecord | None) -> None:
        """A ``plan`` or ``todo_list`` item: the milestones, whichever came last."""
        context = item.get("context")
        at = context.get("timestamp") if type(context) is dict else None
        stamp = at if type(at) is str else self._stamp({}, rec)
        if item.get("type") == "todo_list":
            if type(item.get("items")) is list:
                self.ledger.set_todos(todo_entries(item), stamp)
            return
        text = item.get("text")
        if type(text) is str:
            self.ledger.set_plan(text, stamp)

    def _prompt(self, item: dict, rec: TurnRecord | None) -> None:
        turn = rec.ordinal if rec is not None else None
        if self.prompt is not None and turn == self._prompt_turn:
            return  # the turn's first prompt stands
        text = prompt_text(item)
        if text is not None:
            self.prompt, self._prompt_turn = text, turn

    def goal_text(self, about: dict | None = None) -> str:
        """The goal of ``progress.json`` (see :mod:`memfs.views.progress`); ``about``: the
        session's ``index/about.json``, whose ``turn_notes`` hold the prompts of turns a later
        capture repeated (the stored turn, captured first from a stream, lacked them)."""
        return self.goal.objective or self._latest_prompt(about or {}) or self.ledger.title

    def _latest_prompt(self, about: dict) -> str:
        """The first prompt of the latest turn that has one, in the log or in the turn's note,
        else the conversation's ``first_prompt``."""
        prompt, turn = self.prompt, self._prompt_turn or 0
        notes = about.get("turn_notes")
        if type(notes) is dict:
            for key, note in notes.items():
                text = note.get("prompt") if type(note) is dict else None
                if type(text) is str and text.strip() and key.isdigit() and (prompt is None or int(key) > turn):
                    prompt, turn = text, int(key)
        if prompt is None:
            first = about.get("first_prompt")
            prompt = first if type(first) is str and first.strip() else None
        return prompt or ""

    def _completed_item(self, item: dict, rec: TurnRecord | None) -> None:
        itype = item.get("type")
        if type(itype) is not str:
            return
        if rec is not None:
            rec.item_types[itype] = rec.item_types.get(itype, 0) + 1
            if itype in calls.TOOL_ITEMS:
                iid = item.get("id")
                calls.note(rec.tools, item, self.item_started.pop(iid, None) if type(iid) is str else None)
        if itype == "agent_message":
            text = item.get("text")
            if type(text) is str:
                self.last_message = text
                if rec is not None:
                    rec.last_message = text
        elif itype == "file_change":
            changes = item.get("changes")
            if type(changes) is list:
                for change in changes:
                    path = change.get("path") if type(change) is dict else None
                    if type(path) is str:
                        if path not in self.touched:
                            self.touched.add(path)
                            self.touched_changes += 1
                        if rec is not None:
                            rec.files[path] = None
        elif itype == "command_execution":
            command = item.get("command")
            if rec is not None and type(command) is str:
                code, status = item.get("exit_code"), item.get("status")
                rec.commands.append({"command": command,
                                     "exit_code": code if type(code) is int else None,
                                     "status": status if type(status) is str else None})
        elif itype in _PROGRESS_ITEMS:
            self._plan(item, rec)
        elif itype == "error":
            self._error(rec, "error", item.get("message"))
        elif itype == "mcp_tool_call":
            name, error = mcp_call(item)
            if error is not None:
                self._error(rec, "mcp_tool_call", f"{name or 'MCP tool'} failed: {error}")
        elif itype == "user_message":
            self._prompt(item, rec)
