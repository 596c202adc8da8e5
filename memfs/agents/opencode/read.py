"""OpenCode's store → sessions (SPEC §10, fourth agent): ``memfs import`` of its database.

The database is read through :mod:`memfs.agents.opencode.store` (read-only SQLite, one short
transaction per session). One memfs session per OpenCode session: the session holding its id
as ``conversation_id`` (agent ``opencode``), else a new one named by the id; a sub-agent's
session (``parent_id`` set: the ``task`` tool) becomes the child ``<parent session>.<its id>``
(``parent_session``, and one of the parent's ``children``).

**Meaning.** A user message opens a turn (``turn.started``, ``context``: ``origin`` user, the
prompt = its text parts less synthetic ones, ``turn_id`` = the message id, its time); the
assistant messages answering it (``parentID``) give its items, each part once, by its part id:
``text`` → ``agent_message``, ``reasoning`` → ``reasoning``, tool parts by tool — ``bash`` →
``command_execution`` (``exit_code`` from ``state.metadata.exit``; ``status: failed`` when it is
not 0 or the tool erred; output bounded), ``todowrite`` → ``todo_list``, file tools →
``file_change``, ``task`` → ``tool_invocation`` naming the sub-agent's session
(``child_session``), a name outside OpenCode's built-ins → ``mcp_tool_call`` (``<server>_<tool>``,
split at the first ``_``), others → ``tool_invocation``. The turn closes with ``turn.completed``
or, when an assistant message has an ``error``, ``turn.failed`` with its message (``API Error:
400 …``; an aborted run: ``interrupted``) and no item of its own (the stream has no id for it:
the identity layer pairs the two captures' failed closes). A user message holding a
``compaction`` part (OpenCode's automatic or ``/compact`` summary) is a turn without a prompt:
``thread.compact_boundary``, then the summary as a ``harness`` ``compact_summary`` item (a
fact), its request's usage on its close; the synthetic "Continue…" message after it is a turn
without a prompt either (synthetic text is never a prompt nor an answer). The close carries the turn's usage (its
``step-finish`` parts: one per request, summed; :func:`opencode_shapes.usage_of`), the model,
``requests`` (each request's model, time and tokens, as every agent's close gives them:
:func:`memfs.ingest.request_entry`); when OpenCode priced it, a ``thread.completed`` after the close carries OpenCode's own running cost as ``total_cost_usd`` (kept beside memfs's,
as Claude's is). A last turn still going (no error, its last
assistant message not completed: still running, or the process was killed — the record does
not say which) stays open, less the parts of its unfinished message still being written (a text
without its end, a tool not done: an item is taken once, so it waits until final); the next
import goes on with it (its new items and its close: the
open turn is remembered in the session's ``index/import-sources.json``, key ``opencode:<id>``). An
earlier unfinished turn failed ("the run ended before OpenCode answered").

**Each thing once.** Turn ids and item ids are OpenCode's own message and part ids, so a
second import (or one after OpenCode resumed the session with ``run --session``) drops what the
session holds (:class:`memfs.ingest.identity.Dedupe`) and appends only new turns.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

from memfs.agents.common import mcp_outcome, request_tokens
from memfs.agents.opencode.shapes import BUILTIN_TOOLS, SHAPES
from memfs.agents.opencode.store import (
    AGENT,
    DEFAULT_TITLE,
    StoreError,
    error_message,
    is_store,
    iso,
    list_sessions,
    read_session,
    usage_of,
)
from memfs.ingest import (
    VarsState,
    bounded_output,
    bounded_prompt,
    child_session_name,
    conversations,
    dumps,
    identity,
    request_entry,
)
from memfs.ingest.inputs import real_dir
from memfs.store.batch import append_tolerant
from memfs.store.config import DEFAULT_EVICT_TO
from memfs.store.meta import now_rfc3339
from memfs.store.session import open_session
from memfs.store.sessiondirs import is_session_dir

ENDED_EARLY = "the run ended before OpenCode answered"
TITLE_CHARS = 80


def _str(v: Any) -> str:
    return v if isinstance(v, str) else ""


def _add(total: dict, usage: dict) -> None:
    for k, v in usage.items():
        total[k] = total.get(k, 0) + v


def tool_item(part: dict, children: dict[str, str]) -> dict | None:
    """The item of a ``tool`` part (None while it is still pending)."""
    pid, name = part["id"], _str(part.get("tool")) or "tool"
    state = part.get("state") if isinstance(part.get("state"), dict) else {}
    status = _str(state.get("status"))
    args = state.get("input") if isinstance(state.get("input"), dict) else {}
    meta = state.get("metadata") if isinstance(state.get("metadata"), dict) else {}
    output = _str(state.get("output")) or _str(state.get("error"))
    failed = status == "error"
    done = "failed" if failed else "completed" if status == "completed" else "in_progress"
    kind = SHAPES.tools.get(name)
    if kind == "command_execution":
        exit_code = meta.get("exit") if type(meta.get("exit")) is int else None
        item = {"id": pid, "type": "command_execution", "command": _str(args.get("command")),
                "aggregated_output": bounded_output(output or _str(meta.get("output"))),
                "status": "failed" if failed or (exit_code not in (None, 0)) else done}
        if exit_code is not None:
            item["exit_code"] = exit_code
        return item
    if kind == "todo_list":
        todos = args.get("todos") if isinstance(args.get("todos"), list) else []
        return {"id": pid, "type": "todo_list", "items": [
            {"text": _str(t.get("content")), "completed": t.get("status") == "completed", "status": _str(t.get("status"))}
            for t in todos if isinstance(t, dict)]}
    if kind == "file_change":
        path = _str(args.get("filePath") or args.get("path"))
        return {"id": pid, "type": "file_change", "changes": [{"path": path, "kind": "add" if name == "write" else "update"}],
                "status": done}
    if name not in BUILTIN_TOOLS and "_" in name.strip("_"):
        server, _, tool = name.partition("_")
        item = {"id": pid, "type": "mcp_tool_call", "tool_name": name, "server": server, "tool": tool,
                "arguments": args, "status": done}
        item["result"], item["error"] = mcp_outcome(output, failed)
        return item
    item = {"id": pid, "type": "tool_invocation", "tool_name": name, "status": done, "arguments": args,
            "output": bounded_output(output)}
    child = meta.get("sessionId") or meta.get("sessionID")
    if name == "task" and isinstance(child, str) and child in children:
        item["child_session"] = children[child]
    return item


def _final(part: dict, message: dict) -> bool:
    """A part of a running turn that will not change any more: its message completed, or a
    text or reasoning part ended, a tool part done."""
    if type((message.get("time") or {}).get("completed")) in (int, float):
        return True
    kind = part.get("type")
    if kind in ("text", "reasoning"):
        return type((part.get("time") or {}).get("end")) in (int, float)
    if kind == "tool":
        state = part.get("state")
        return isinstance(state, dict) and state.get("status") in ("completed", "error")
    return True


class Translation:
    """One OpenCode session's messages and parts as event lines (see the module docstring);
    ``meta``: what it says of the conversation (``memfs.store.about`` keys)."""

    def __init__(self, session: dict, children: dict[str, str] | None = None):
        self.session = session
        self.children = children or {}
        self.cost = 0.0
        title = _str(session.get("title"))
        self.meta: dict = {"agent": AGENT, "conversation_id": session["id"]}
        for key, value in (("agent_version", session.get("version")), ("cwd", session.get("directory")),
                           ("started_at", iso(session.get("time_created")))):
            if isinstance(value, str) and value:
                self.meta[key] = value
        if title and not title.startswith(DEFAULT_TITLE):
            self.meta["title"] = title

    def lines(self, messages: list[dict], parts: dict[str, list[dict]], open_turn: str | None = None,
              skip: frozenset = frozenset(), thread: bool = True) -> list[bytes]:
        """The session's events; ``open_turn``: the turn a previous import left open (its
        ``turn.started`` is not repeated: its new items and its close go on from it); ``skip``:
        the user messages whose turns the memfs session already holds (``memfs resume --in
        opencode`` exported them); ``thread``: start with ``thread.started``."""
        self.open_turn, self.open = open_turn, None
        self.seen: list[dict] = []  # the messages before the turn being translated
        self.turns = 0
        out = [dumps({"type": "thread.started", "thread_id": self.session["id"], "agent": AGENT})] if thread else []
        users = [m for m in messages if m.get("role") == "user"]
        answers: dict[str, list[dict]] = {}
        for m in messages:
            if m.get("role") == "assistant" and isinstance(m.get("parentID"), str):
                answers.setdefault(m["parentID"], []).append(m)
        position = {id(m): n for n, m in enumerate(messages)}
        for n, user in enumerate(users):
            last = n == len(users) - 1
            self.seen = messages[:position[id(user)]]
            if last and not parts.get(user["id"]) and not answers.get(user["id"]):
                continue  # (its parts not written yet: OpenCode writes the message first)
            if user["id"] not in skip:
                self._turn(out, user, answers.get(user["id"], []), parts, last)
        return out

    def _turn(self, out: list, user: dict, replies: list[dict], parts: dict[str, list[dict]], last: bool) -> None:
        failed = next((error_message(m.get("error")) for m in replies if m.get("error")), None)
        final = replies[-1] if replies else None
        completed = final is not None and isinstance((final.get("time") or {}).get("completed"), (int, float)) \
            and final.get("finish") not in (None, "tool-calls")
        going = failed is None and not completed and last  # (or killed: the record does not say)
        if failed is None and not completed and not last:
            failed = ENDED_EARLY
        prompt = "\n".join(_str(p.get("text")) for p in parts.get(user["id"], [])
                           if p.get("type") == "text" and not p.get("synthetic")).strip()
        context: dict = {"turn_id": user["id"]}
        compaction = next((p for p in parts.get(user["id"], []) if p.get("type") == "compaction"), None)
        if prompt:
            context.update(origin="user", prompt=bounded_prompt(prompt))
            self.meta.setdefault("first_prompt", bounded_prompt(prompt))
            self.meta.setdefault("title", prompt.splitlines()[0][:TITLE_CHARS])
        at = iso((user.get("time") or {}).get("created") if isinstance(user.get("time"), dict) else user.get("time"))
        if at:
            context["timestamp"] = at
        if user["id"] != self.open_turn:
            out.append(dumps({"type": "turn.started", "context": context}))
            if compaction is not None:  # OpenCode's compaction: a request for a summary, in a turn of its own
                history = sum(1 for m in self.seen if m.get("role") in ("user", "assistant"))
                out.append(dumps({"type": "thread.compact_boundary", "thread_id": self.session["id"],
                                  "trigger": "auto" if compaction.get("auto") else "manual", "mode": "summary",
                                  "original_message_count": history, "compacted_message_count": 1}))
        usage: dict = {}
        requests = []
        model = None
        for reply in replies:
            model = _str(reply.get("modelID")) or model
            cost = reply.get("cost")
            if type(cost) in (int, float) and cost >= 0:
                self.cost += cost
            for part in parts.get(reply["id"], []):
                kind = part.get("type")
                if going and not _final(part, reply):
                    continue  # (still being written: taken once it is final, as an item is taken once)
                if kind == "text" and _str(part.get("text")).strip() and not part.get("synthetic"):
                    item = {"id": part["id"], "type": "agent_message", "text": part["text"]}
                    if compaction is not None or reply.get("summary") is True:  # the summary, as a fact
                        item = {"id": part["id"], "type": "harness", "event": "compact_summary",
                                "message": bounded_output(part["text"].strip())}
                    out.append(dumps({"type": "item.completed", "item": item}))
                elif kind == "reasoning" and _str(part.get("text")).strip():
                    out.append(dumps({"type": "item.completed", "item": {
                        "id": part["id"], "type": "reasoning", "text": part["text"]}}))
                elif kind == "tool":
                    item = tool_item(part, self.children)
                    if item is not None:
                        out.append(dumps({"type": "item.completed", "item": item}))
                elif kind == "step-finish":
                    step = usage_of(part.get("tokens"))
                    _add(usage, step)
                    done = (reply.get("time") or {}).get("completed") if isinstance(reply.get("time"), dict) else None
                    requests.append(request_entry(model, request_tokens(SHAPES.usage, step), iso(done)))
        if model:
            self.meta["model"] = model
        if going:
            self.open = user["id"]
            self.meta["status"] = "running"
            return
        event: dict = {"type": "turn.failed", "message": failed} if failed is not None else {"type": "turn.completed"}
        event["usage"] = usage
        if model:
            event["model"] = model
        if requests:
            event["requests"] = requests
        times = [t for r in replies for t in ((r.get("time") or {}).get("completed"),) if type(t) in (int, float)]
        end = iso(max(times)) if times else at
        if end:
            event["completed_at"] = end
            self.meta["ended_at"] = end
        out.append(dumps(event))
        self.meta["status"] = "failed" if failed is not None else "completed"
        self.turns += 1
        if self.cost:  # OpenCode's own running cost, as Claude's result carries it (memfs.views.fold)
            done = {"type": "thread.completed", "thread_id": self.session["id"], "session_id": self.session["id"],
                    "subtype": "error_during_execution" if failed is not None else "success",
                    "outcome_code": "error" if failed is not None else "completed", "num_turns": self.turns,
                    "usage": usage, "total_cost_usd": round(self.cost, 10)}
            if end:
                done["completed_at"] = end
            out.append(dumps(done))


# --- the runner ------------------------------------------------------------------------------------


def split_stores(paths) -> tuple[list[Path], list[Path]]:
    """``(OpenCode databases, the other paths)`` of the paths given to ``memfs import``: a file
    ``opencode.db`` or a directory holding one (its data directory) is a store; a home
    directory (``.local/share/opencode/``) or a data directory (``opencode/``) holding one adds
    that store and is still searched for the other agents' files."""
    stores, rest = [], []
    for p in map(Path, paths):
        db = is_store(p)
        if db is None:
            rest.append(p)
            nested = next((d for d in (p / ".local" / "share" / "opencode", p / "opencode")
                           if all(real_dir(p / part) for part in (*d.relative_to(p).parents[:-1], d.relative_to(p)))  # (no link)
                           and is_store(d) is not None), None)
            db = is_store(nested) if nested is not None else None
        if db is not None and db not in stores:
            stores.append(db)
    return stores, rest


def import_stores(root: Path, stores: list[Path], **kw) -> list:
    """:func:`import_store` of each store, the items in order."""
    return [item for db in stores for item in import_store(root, db, **kw)]


def import_store(root: Path, db: Path, *, dry_run: bool = False, max_events: int = 0,
                 evict_to: float = DEFAULT_EVICT_TO, only: str | Collection[str] | None = None,
                 into: str | None = None) -> list:
    """Import every session of OpenCode's database ``db`` (``only``: that one, or those —
    ``import --follow``, :mod:`memfs.agents.opencode.follow`; ``into``: into that memfs session,
    whose conversation it continues — ``memfs resume --in opencode``); one :class:`ImportItem`
    per session (``source``: ``<db>#<session id>``)."""
    from memfs.ingest.importer import ImportItem

    root = Path(root)
    try:
        sessions = list_sessions(db)
    except (StoreError, OSError) as exc:
        return [ImportItem(str(db), status="error", reason=str(exc))]
    names: dict[str, str] = {}  # OpenCode session id -> memfs session
    items = []
    wanted = None if only is None else {only} if isinstance(only, str) else set(only)
    parents = {s["parent_id"] for s in sessions if wanted is None or s["id"] in wanted}
    for s in sessions:
        sid = s["id"]
        if wanted is not None and sid not in wanted:
            if sid in parents and not into:  # (a sub-agent's parent left out: its name, for the child's)
                names[sid] = conversations.find_conversation(root, sid, AGENT, write=not dry_run) or \
                    conversations.new_session_name(root, sid)
            continue
        item = ImportItem(f"{db}#{sid}", format=AGENT)
        items.append(item)
        try:
            _import_one(root, db, s, names, item, dry_run=dry_run, max_events=max_events, evict_to=evict_to,
                        into=into)
        except (StoreError, OSError, ValueError) as exc:
            item.status, item.reason = "error", str(exc)
    return items


RESUMED = "opencode-resume"  # import-sources.json key: the OpenCode session a memfs session was imported into
# OpenCode as (memfs resume --in opencode); the conversation map points that OpenCode session's
# id to the memfs session, so a plain import of OpenCode's store continues it as resume does


def resumed_as(session_dir: Path) -> str | None:
    """The OpenCode session id ``session_dir`` was resumed as, if any."""
    from memfs.ingest.importer import read_sources

    sid = (read_sources(session_dir).get(RESUMED) or {}).get("session")
    return sid if isinstance(sid, str) else None


def _import_one(root: Path, db: Path, s: dict, names: dict[str, str], item, *, dry_run: bool,
                max_events: int, evict_to: float, into: str | None = None) -> None:
    sid = s["id"]
    found = into or conversations.find_conversation(root, sid, AGENT, write=not dry_run)
    if found and not into and resumed_as(root / found) == sid:
        into = found  # (a session resumed in OpenCode: its new turns come back to it, as resume brings them)
    parent = names.get(s.get("parent_id")) if s.get("parent_id") and not into else None
    extra = {"parent_session": parent} if parent else {}
    name = found or (child_session_name(parent, sid) if parent else None) or conversations.new_session_name(root, sid)
    names[sid] = name
    item.session = name
    messages, parts = read_session(db, sid)
    children = {}  # sub-agent sessions started from this one, by their OpenCode id (named below)
    for m in messages:
        for p in parts.get(m["id"], []):
            meta = (p.get("state") or {}).get("metadata") if isinstance(p.get("state"), dict) else None
            child = meta.get("sessionId") if isinstance(meta, dict) else None
            if p.get("tool") == "task" and isinstance(child, str):
                children[child] = child_session_name(name, child) or child
    from memfs.ingest.importer import read_sources, write_sources

    key = f"opencode:{sid}"  # (the conversation's, wherever its database is read from)
    existed = is_session_dir(root / name)
    entry = read_sources(root / name).get(key) if existed else None
    entry = entry or {}
    tr = Translation(s, children)
    skip = frozenset(i for i in entry.get("skip") or () if isinstance(i, str))
    lines = tr.lines(messages, parts, entry.get("open_turn"), skip, thread=not into)
    if into:  # the session keeps its own conversation (the one exported to OpenCode)
        tr.meta.pop("conversation_id", None)
    item.lines = len(messages)
    if len(lines) <= (0 if into else 1):  # a thread.started only: nothing finished to import yet
        item.status, item.reason = "empty", "no finished turn in it yet"
        return
    capture = identity.Capture(root, agent=AGENT, conversation_id=None if into else sid, extra=extra, parent=parent)
    if dry_run:
        if existed:
            handle = open_session(root, name, read_only=True)
            try:
                capture.attach(handle)
                lines = capture.filter(lines, tr.meta) + capture.finish()
            finally:
                handle.close()
        item.appended = len(lines)
        item.duplicates = capture.dropped
        item.status = "imported" if lines else "up-to-date"
        return
    handle = open_session(root, name, durability="buffered", max_events=max_events, evict_to=evict_to)
    try:
        capture.attach(handle)
        for batch in (capture.filter(lines, tr.meta), capture.finish()):
            if batch:
                a, r = append_tolerant(handle, batch)
                item.appended, item.refused = item.appended + a, item.refused + r
                capture.appended(batch, a)
        handle.flush()
        capture.after(handle, tr.meta)
        sources = read_sources(handle.path)
        sources[key] = {**entry, "path": str(db.resolve()), "format": AGENT, "open_turn": tr.open, "messages": len(messages),
                        "updated_at": now_rfc3339()}
        write_sources(handle.path, sources)
    finally:
        handle.close()
    item.duplicates = capture.dropped
    if not item.appended and not item.refused:
        item.status = "up-to-date"


# --- opencode run --format json -------------------------------------------------------------------


class StreamTranslator(VarsState):
    """``opencode run --format json`` stdout → events (``memfs record`` and ``memfs import`` of a
    saved stream). One run is one turn: it opens at the first line and closes at a
    ``step_finish`` whose ``reason`` is not ``tool-calls`` (``turn.completed``) or at an
    ``error`` line (``turn.failed``). The stream names no prompt and no model (the store does:
    importing the store too adds them, never a second turn: the items carry the same part ids).
    Lines of other sessions (none in 1.18) are left out."""

    kind = "opencode"

    def __init__(self) -> None:
        self.sid: str | None = None
        self.open = False
        self.usage: dict = {}
        self.requests: list = []
        self.meta: dict = {}

    def _close(self, out: list, failed: str | None, ts: Any) -> None:
        event: dict = {"type": "turn.failed", "message": failed} if failed is not None else {"type": "turn.completed"}
        event["usage"], self.usage = self.usage, {}
        if self.requests:
            event["requests"] = self.requests
        self.requests = []
        at = iso(ts)
        if at:
            event["completed_at"] = at
            self.meta["ended_at"] = at
        out.append(dumps(event))
        self.open = False
        self.meta["status"] = "failed" if failed is not None else "completed"

    def feed(self, raw: bytes) -> list[bytes]:
        from memfs.ingest import parse_object

        obj = parse_object(raw, "opencode")
        sid, ts = obj.get("sessionID"), obj.get("timestamp")
        if not isinstance(sid, str) or not sid or (self.sid is not None and sid != self.sid):
            return []
        out: list[bytes] = []
        if self.sid is None:
            self.sid = sid
            self.meta.update(agent=AGENT, conversation_id=sid)
            out.append(dumps({"type": "thread.started", "thread_id": sid, "agent": AGENT}))
        if not self.open:
            self.open = True
            at = iso(ts)
            out.append(dumps({"type": "turn.started", "context": {"timestamp": at}} if at else {"type": "turn.started"}))
            self.meta["status"] = "running"
            if at:
                self.meta.setdefault("started_at", at)
        part = obj.get("part") if isinstance(obj.get("part"), dict) else {}
        kind = obj.get("type")
        pid = part.get("id")
        if kind == "error":  # (no item: the store has no id for it either; the close pairs: identity.py)
            self._close(out, error_message(obj.get("error")) or "error", ts)
        elif not isinstance(pid, str) or not pid:
            return out
        elif kind == "text" and _str(part.get("text")).strip() and not part.get("synthetic"):
            out.append(dumps({"type": "item.completed", "item": {"id": pid, "type": "agent_message",
                                                                 "text": part["text"]}}))
        elif kind == "reasoning" and _str(part.get("text")).strip():
            out.append(dumps({"type": "item.completed", "item": {"id": pid, "type": "reasoning",
                                                                 "text": part["text"]}}))
        elif kind == "tool_use":
            item = tool_item(part, {})
            if item is not None:
                out.append(dumps({"type": "item.completed", "item": item}))
        elif kind == "step_finish":
            step = usage_of(part.get("tokens"))
            _add(self.usage, step)
            self.requests.append(request_entry(None, request_tokens(SHAPES.usage, step), iso(ts)))
            if part.get("reason") != "tool-calls":
                self._close(out, None, ts)
        return out


TRANSLATORS = {"opencode": StreamTranslator}  # (memfs.agents.reader: kind -> translator)
