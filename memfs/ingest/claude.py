"""Claude Code ``stream-json`` output and Claude Code transcripts → this event family (SPEC §8).

Shapes followed (see the README, "Formats memfs ingests"): ``claude -p --output-format
stream-json --verbose`` of Claude Code 1.x–2.x (``system``/``init``, ``assistant`` and ``user``
messages carrying Anthropic API content blocks, a final ``result``), and the transcripts Claude
Code 1.x–2.x writes to ``~/.claude/projects/<project>/<session-uuid>.jsonl`` (``user``,
``assistant``, ``system``, ``summary`` lines with ``uuid``, ``parentUuid``, ``sessionId``,
``timestamp``, ``message``). Both are read by one translator: they share the message shapes.

The mapping:

* ``system``/``init`` (or, in a transcript, the first line naming a ``sessionId``) →
  ``thread.started`` with the session id as ``thread_id`` and ``"agent": "claude-code"``
  (:mod:`memfs.agents`).
* A prompt (a ``user`` line with text, not a tool result and not ``isMeta``) closes the open
  turn and opens a new one: ``turn.started`` (with the line's ``timestamp`` in ``context``),
  then an ``item.completed`` of type ``user_message`` (an item type this family leaves open)
  carrying the prompt, so views can fall back to it for the goal. ``stream-json`` output of
  ``claude -p`` does not repeat the prompt: its turn opens at the first message.
* ``text`` → ``agent_message``; ``thinking`` → ``reasoning``; ``tool_use`` + its
  ``tool_result`` → ``command_execution`` (Bash), ``file_change`` (Edit, Write, MultiEdit,
  NotebookEdit), ``mcp_tool_call`` (``mcp__server__tool``: ``server``, ``tool``,
  ``arguments``, ``result``/``error``), ``web_search`` (WebSearch, WebFetch), ``todo_list``
  (TodoWrite, emitted at the call: the list is in its input), else ``tool_invocation`` (at the
  call) and ``tool_output`` (at the result). A command, MCP call or search is ``item.started``
  (``in_progress``) at the call and ``item.completed`` at its result, so an agent that dies
  mid-call leaves the call on record; a file change is recorded once, at its result. A
  ``tool_result`` with ``is_error`` makes the item ``failed``.
* ``result`` → ``turn.completed`` with its ``usage``, or ``turn.failed`` (its reason: the
  result text, the errors, or the subtype) when ``is_error``; then ``thread.completed``
  (``subtype``, ``num_turns``, ``total_cost_usd``, ``usage``, ``result``). Usage maps
  ``cache_read_input_tokens`` → ``cached_input_tokens`` and ``cache_creation_input_tokens`` →
  ``cache_creation_tokens``.
* A transcript has no ``result``: a turn closes (``turn.completed``, with the usage of its
  assistant messages, each message counted once although a transcript repeats it on every
  content block) at the next prompt, at an assistant message whose ``stop_reason`` ends the
  turn (``end_turn``, ``stop_sequence``, ``max_tokens``, ``refusal``), or as
  ``turn.failed`` ("interrupted by user") at Claude Code's ``[Request interrupted by user…]``
  line. A transcript whose last turn shows none of these leaves that turn open: it may be
  still running, and ``import --follow`` goes on appending to it.
* ``summary``, ``file-history-snapshot``, other ``system`` subtypes and unknown line types
  carry nothing the event family has a place for and translate to nothing.
"""

from __future__ import annotations

from typing import Any

from memfs.agents import CLAUDE_CODE
from memfs.ingest import dumps, parse_object, text_of

FILE_TOOLS = ("Edit", "Write", "MultiEdit", "NotebookEdit")
WEB_TOOLS = ("WebSearch", "WebFetch")
TURN_ENDING_STOPS = ("end_turn", "stop_sequence", "max_tokens", "refusal")
INTERRUPTED = "[Request interrupted by user"


def usage_of(u: Any) -> dict:
    """A Claude usage object as this family's Usage."""
    if not isinstance(u, dict):
        return {}
    out = {}
    for src, dst in (("input_tokens", "input_tokens"), ("cache_read_input_tokens", "cached_input_tokens"),
                     ("cache_creation_input_tokens", "cache_creation_tokens"), ("output_tokens", "output_tokens")):
        v = u.get(src)
        if type(v) is int and v >= 0:
            out[dst] = v
    return out


def _add_usage(total: dict, u: dict) -> None:
    for k, v in u.items():
        total[k] = total.get(k, 0) + v


def _kind(name: str) -> str:
    if name == "Bash":
        return "command_execution"
    if name in FILE_TOOLS:
        return "file_change"
    if name.startswith("mcp__"):
        return "mcp_tool_call"
    if name in WEB_TOOLS:
        return "web_search"
    if name == "TodoWrite":
        return "todo_list"
    return "tool"


class ClaudeTranslator:
    kind = "claude"

    def __init__(self) -> None:
        self.thread_id: str | None = None
        self.started = False  # thread.started emitted
        self.in_turn = False
        self.turns = 0
        self.turn_usage: dict[str, dict] = {}  # message id -> usage, this turn
        self.pending: dict[str, dict] = {}  # tool_use id -> {name, input}
        self.n = 0  # counter for ids a line does not give

    # state for resuming (import --follow)

    def state(self) -> dict:
        return {"thread_id": self.thread_id, "started": self.started, "in_turn": self.in_turn,
                "turns": self.turns, "turn_usage": self.turn_usage, "pending": self.pending, "n": self.n}

    def restore(self, state: dict) -> None:
        for key, value in state.items():
            if key in ("thread_id", "started", "in_turn", "turns", "turn_usage", "pending", "n"):
                setattr(self, key, value)

    # helpers

    def _id(self, hint: Any = None) -> str:
        self.n += 1
        return f"{hint}" if isinstance(hint, str) and hint else f"claude-{self.n}"

    def _thread(self, obj: dict, out: list) -> None:
        sid = obj.get("session_id") or obj.get("sessionId")
        if isinstance(sid, str) and sid and self.thread_id is None:
            self.thread_id = sid
        if not self.started and self.thread_id:
            self.started = True
            out.append(dumps({"type": "thread.started", "thread_id": self.thread_id, "agent": CLAUDE_CODE}))

    def _open(self, obj: dict, out: list) -> None:
        if self.in_turn:
            return
        self.in_turn = True
        self.turn_usage = {}
        event: dict = {"type": "turn.started"}
        ts = obj.get("timestamp")
        if isinstance(ts, str):
            event["context"] = {"timestamp": ts}
        out.append(dumps(event))

    def _turn_usage(self) -> dict:
        total: dict = {}
        for u in self.turn_usage.values():
            _add_usage(total, u)
        return total

    def _close(self, obj: dict, out: list, failed: str | None = None, usage: dict | None = None) -> None:
        if not self.in_turn:
            return
        self.in_turn = False
        self.turns += 1
        event: dict = {"type": "turn.failed", "message": failed} if failed is not None else {"type": "turn.completed"}
        event["usage"] = self._turn_usage() if usage is None else usage
        ts = obj.get("timestamp")
        if isinstance(ts, str):
            event["completed_at"] = ts
        out.append(dumps(event))
        self.turn_usage = {}

    # lines

    def feed(self, raw: bytes) -> list[bytes]:
        obj = parse_object(raw, "claude")
        kind = obj.get("type")
        out: list[bytes] = []
        if kind == "system":
            if obj.get("subtype") == "init":
                self._thread(obj, out)
            elif obj.get("subtype") == "turn_duration":
                self._close(obj, out)
        elif kind == "user":
            self._thread(obj, out)
            self._user(obj, out)
        elif kind == "assistant":
            self._thread(obj, out)
            self._assistant(obj, out)
        elif kind == "result":
            self._thread(obj, out)
            self._result(obj, out)
        return out

    def _user(self, obj: dict, out: list) -> None:
        message = obj.get("message")
        if not isinstance(message, dict) or obj.get("isMeta"):
            return
        content = message.get("content")
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}] \
            if isinstance(content, str) else []
        results = [b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result"]
        if results:
            self._open(obj, out)
            for block in results:
                self._tool_result(block, obj, out)
            return
        text = text_of([b for b in blocks if isinstance(b, dict) and b.get("type") == "text"])
        if not text:
            return
        if text.startswith(INTERRUPTED):
            self._close(obj, out, failed="interrupted by user")
            return
        self._close(obj, out)
        self._open(obj, out)
        out.append(dumps({"type": "item.completed",
                          "item": {"id": self._id(obj.get("uuid")), "type": "user_message", "text": text}}))

    def _assistant(self, obj: dict, out: list) -> None:
        message = obj.get("message")
        if not isinstance(message, dict):
            return
        self._open(obj, out)
        mid = message.get("id")
        usage = usage_of(message.get("usage"))
        if usage:
            self.turn_usage[mid if isinstance(mid, str) else f"#{len(self.turn_usage)}"] = usage
        content = message.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        base = obj.get("uuid") or mid
        for i, block in enumerate(content if isinstance(content, list) else []):
            if not isinstance(block, dict):
                continue
            btype = block.get("type")
            bid = f"{base}:{i}" if isinstance(base, str) else None
            if btype == "text" and isinstance(block.get("text"), str) and block["text"].strip():
                out.append(dumps({"type": "item.completed",
                                  "item": {"id": self._id(bid), "type": "agent_message", "text": block["text"]}}))
            elif btype == "thinking" and isinstance(block.get("thinking"), str) and block["thinking"].strip():
                out.append(dumps({"type": "item.completed",
                                  "item": {"id": self._id(bid), "type": "reasoning", "text": block["thinking"]}}))
            elif btype == "tool_use":
                self._tool_use(block, out)
        if message.get("stop_reason") in TURN_ENDING_STOPS and "session_id" not in obj:
            self._close(obj, out)  # a transcript's turn-ending message (stream-json waits for result)

    def _tool_use(self, block: dict, out: list) -> None:
        name = block.get("name") if isinstance(block.get("name"), str) else "tool"
        tid = self._id(block.get("id"))
        args = block.get("input") if isinstance(block.get("input"), dict) else {}
        kind = _kind(name)
        item = self._item(kind, tid, name, args, "in_progress")
        self.pending[tid] = {"name": name, "input": args}
        if kind == "todo_list":  # the list is in the call; its result only says "modified"
            out.append(dumps({"type": "item.completed", "item": item}))
            return
        if kind == "tool":
            item["status"] = "completed"
            out.append(dumps({"type": "item.completed", "item": item}))
        elif kind != "file_change":
            out.append(dumps({"type": "item.started", "item": item}))

    def _item(self, kind: str, tid: str, name: str, args: dict, status: str) -> dict:
        if kind == "command_execution":
            command = args.get("command")
            return {"id": tid, "type": kind, "command": command if isinstance(command, str) else str(command),
                    "status": status}
        if kind == "file_change":
            path = args.get("file_path") or args.get("notebook_path") or args.get("path") or ""
            return {"id": tid, "type": kind, "changes": [{"path": str(path), "kind": "update"}], "status": status}
        if kind == "mcp_tool_call":
            server, _, tool = name[len("mcp__"):].partition("__")
            return {"id": tid, "type": kind, "tool_name": name, "server": server, "tool": tool or server,
                    "arguments": args, "status": status}
        if kind == "web_search":
            query = args.get("query") if name == "WebSearch" else args.get("url")
            item = {"id": tid, "type": kind, "query": query if isinstance(query, str) else ""}
            if name == "WebFetch":
                item["action"] = {"type": "open_page", "url": item["query"]}
            return item
        if kind == "todo_list":
            todos = args.get("todos") if isinstance(args.get("todos"), list) else []
            return {"id": tid, "type": kind, "items": [
                {"text": str(t.get("content", "")), "completed": t.get("status") == "completed"}
                for t in todos if isinstance(t, dict)]}
        return {"id": tid, "type": "tool_invocation", "tool_name": name, "status": status, "arguments": args}

    def _tool_result(self, block: dict, obj: dict, out: list) -> None:
        tid = block.get("tool_use_id")
        call = self.pending.pop(tid, None) if isinstance(tid, str) else None
        failed = block.get("is_error") is True
        status = "failed" if failed else "completed"
        output = text_of(block.get("content"))
        if call is None:  # a result whose call we never saw (a resumed transcript's first lines)
            out.append(dumps({"type": "item.completed", "item": {
                "id": self._id(f"{tid}:out" if isinstance(tid, str) else None), "type": "tool_output",
                "call_id": tid if isinstance(tid, str) else "", "status": status, "output": output}}))
            return
        name, args = call["name"], call["input"]
        kind = _kind(name)
        if kind == "todo_list":
            return
        item = self._item(kind, tid, name, args, status)
        if kind == "command_execution":
            item["aggregated_output"] = output
        elif kind == "file_change":
            extra = obj.get("toolUseResult")
            if name == "Write" and isinstance(extra, dict) and extra.get("type") == "create":
                item["changes"][0]["kind"] = "add"
        elif kind == "mcp_tool_call":
            if failed:
                item["error"] = {"message": output}
                item["result"] = None
            else:
                content = block.get("content")
                item["result"] = {"content": content if isinstance(content, list) else [{"type": "text", "text": output}],
                                  "structured_content": None}
                item["error"] = None
        elif kind == "tool":
            out.append(dumps({"type": "item.completed", "item": {
                "id": f"{tid}:out", "type": "tool_output", "call_id": tid, "status": status, "output": output}}))
            return
        out.append(dumps({"type": "item.completed", "item": item}))

    def _result(self, obj: dict, out: list) -> None:
        self._open(obj, out)
        usage = usage_of(obj.get("usage"))
        if obj.get("is_error") is True:
            reason = obj.get("result") if isinstance(obj.get("result"), str) and obj.get("result") else None
            if reason is None and isinstance(obj.get("errors"), list) and obj["errors"]:
                reason = "; ".join(str(e) for e in obj["errors"])
            self._close(obj, out, failed=reason or str(obj.get("subtype") or "error"), usage=usage)
        else:
            self._close(obj, out, usage=usage)
        subtype = obj.get("subtype") if isinstance(obj.get("subtype"), str) else "success"
        num_turns = obj.get("num_turns")
        event: dict = {"type": "thread.completed", "thread_id": self.thread_id or "", "session_id": self.thread_id or "",
                       "subtype": subtype, "outcome_code": "error" if obj.get("is_error") is True else "completed",
                       "usage": usage, "num_turns": num_turns if type(num_turns) is int and num_turns >= 0 else self.turns}
        if isinstance(obj.get("result"), str):
            event["result"] = obj["result"]
        cost = obj.get("total_cost_usd")
        if isinstance(cost, (int, float)) and not isinstance(cost, bool):
            event["total_cost_usd"] = cost
        out.append(dumps(event))
