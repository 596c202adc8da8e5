"""Which agent wrote a session, and its thread id — told from the log itself (SPEC §2).

The same event family is written by VT Code, by Codex ``exec --json`` (its upstream) and, once
translated by ``memfs record``/``memfs import``, by Claude Code. :class:`Origin` is fed a log's
decoded events in order and settles on the first decisive sign:

1. an explicit ``agent`` string on ``thread.started`` (a memfs extension, ignored by other
   readers: ``"codex"``, ``"vtcode"``, ``"claude"``, ``"gemini"``, ``"opencode"``, or any other name). The ingest
   writes it for the streams it translates, since a translated stream has no shape of its own.
   Older memfs versions wrote ``"claude-code"``: it reads as ``"claude"`` (:func:`agent_name`);
2. a shape only Codex writes: its item ids (``item_0``, ``item_1``, … — Codex numbers the items
   of a run), ``turn.failed`` with ``error`` and no ``message``, an ``mcp_tool_call`` with
   ``tool`` and no ``tool_name``, a ``todo_list`` item, a ``declined`` command, a ``web_search``
   with an ``action`` → ``"codex"``;
3. a shape only VT Code writes: the event types Codex does not have (``thread.completed``,
   ``turn.blocked``, ``permission.*``, ``plan.*``, ``context.reset``, …), a ``turn.started``
   with ``context`` or ``token_breakdown``, an item with ``context`` or of a VT Code-only type
   (``harness``, ``decision``, ``tool_invocation``, ``tool_output``), an ``mcp_tool_call`` with
   ``tool_name`` → ``"vtcode"``.

Until then the agent reads ``"unknown"``. The thread id is the first ``thread.started``'s
``thread_id`` (Codex repeats it when a thread is resumed). Both are read from the lines that
start in the first :data:`HEAD_BYTES` of the retained log only — by the views (``summary.md``)
and by :func:`memfs.store.retention.list_sessions` alike, so the two always agree and neither
pays for it past the head (a listing of 100,000 sessions must not read their logs). A session
whose opening lines were evicted by the event cap reads what its new head says.

No I/O here.
"""

from __future__ import annotations

HEAD_BYTES = 64 * 1024
UNKNOWN = "unknown"
CODEX = "codex"
VTCODE = "vtcode"
CLAUDE = "claude"
CLAUDE_CODE = CLAUDE  # the former constant's name (its value was "claude-code")
_ALIASES = {"claude-code": CLAUDE}  # names older writers used -> the name today


def agent_name(name: str) -> str:
    """The agent's name today for a name a log or ``about.json`` gives (``claude-code`` →
    ``claude``); any other name as it is."""
    return _ALIASES.get(name, name)

_VTCODE_EVENTS = frozenset((
    "thread.completed", "thread.compact_boundary", "context.reset", "turn.blocked",
    "permission.requested", "permission.resolved", "interjected", "plan.delta",
    "plan.approval.requested", "plan.approval.resolved", "matrix.updated",
))
_VTCODE_ITEMS = frozenset(("harness", "decision", "tool_invocation", "tool_output"))
_ITEM_EVENTS = frozenset(("item.started", "item.updated", "item.completed"))


def run_local_id(iid: object) -> bool:
    """An item id Codex ``exec --json`` numbers per run (``item_0``, ``item_1``, …): it names
    an item of one run only, never the same thing across captures."""
    return type(iid) is str and iid.startswith("item_") and iid[5:].isdigit() and iid[5:].isascii()


def _codex_item(item: dict) -> bool:
    itype = item.get("type")
    if run_local_id(item.get("id")):
        return True
    if itype == "todo_list":
        return True
    if itype == "mcp_tool_call":
        return "tool" in item and "tool_name" not in item
    if itype == "command_execution":
        return item.get("status") == "declined"
    if itype == "web_search":
        return "action" in item
    return False


def _vtcode_item(item: dict) -> bool:
    itype = item.get("type")
    return (itype in _VTCODE_ITEMS or "context" in item
            or (itype == "mcp_tool_call" and "tool_name" in item))


class Origin:
    """The agent and thread id of one log, folded from its events."""

    __slots__ = ("agent", "thread_id")

    def __init__(self) -> None:
        self.agent = UNKNOWN
        self.thread_id: str | None = None

    @property
    def settled(self) -> bool:
        """Nothing more to learn: feeding further events changes nothing."""
        return self.agent != UNKNOWN and self.thread_id is not None

    def feed(self, event: dict) -> None:
        etype = event.get("type")
        if etype == "thread.started":
            if self.thread_id is None and type(event.get("thread_id")) is str:
                self.thread_id = event["thread_id"]
            agent = event.get("agent")
            if type(agent) is str and agent and self.agent == UNKNOWN:
                self.agent = agent_name(agent)
            return
        if self.agent != UNKNOWN:
            return
        if etype in _ITEM_EVENTS:
            item = event.get("item")
            if type(item) is dict:
                if _codex_item(item):
                    self.agent = CODEX
                elif _vtcode_item(item):
                    self.agent = VTCODE
        elif etype == "turn.failed":
            if "error" in event and "message" not in event:
                self.agent = CODEX
        elif etype in _VTCODE_EVENTS:
            self.agent = VTCODE
        elif etype == "turn.started":
            if "context" in event or "token_breakdown" in event:
                self.agent = VTCODE

    def to_dict(self) -> dict:
        return {"agent": self.agent, "thread_id": self.thread_id}
