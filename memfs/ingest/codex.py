"""Codex output → this event family (SPEC §8).

Two sources:

* ``codex exec --json`` output is already this event family (Codex is its upstream): each line
  is passed through as it is, byte for byte; the store wraps bare events in the envelope.
  (:class:`ExecTranslator`.)
* Codex **rollout files**, ``~/.codex/sessions/YYYY/MM/DD/rollout-<time>-<uuid>.jsonl``: lines
  ``{"timestamp","type","payload"}`` of type ``session_meta``, ``response_item``,
  ``event_msg``, ``turn_context`` and ``compacted`` (:class:`RolloutTranslator`). Shapes
  followed: ``codex-rs/protocol`` (``RolloutLine``/``RolloutItem``, ``EventMsg``,
  ``ResponseItem``) as of Codex CLI 0.2x–0.128; older files without ``task_started`` lines
  are read too (a turn then opens at the first prompt or item).

The rollout mapping:

* ``session_meta`` → ``thread.started`` (``thread_id`` = the session's ``id``, ``"agent":
  "codex"``: :mod:`memfs.agents`).
* ``event_msg`` ``task_started``/``turn_started`` → ``turn.started`` (``context``: the turn
  id and the line's timestamp); ``task_complete``/``turn_complete`` → ``turn.completed`` with
  the turn's usage (the growth of ``token_count``'s ``total_token_usage`` over the turn) and
  ``completed_at``; ``turn_aborted`` → ``turn.failed`` ("aborted: <reason>"); ``error`` →
  an ``error`` event.
* ``user_message`` → a ``user_message`` item (the prompt); ``agent_message`` →
  ``agent_message``; ``agent_reasoning`` → ``reasoning``; ``exec_command_end`` →
  ``command_execution``; ``patch_apply_end`` → ``file_change``; ``mcp_tool_call_end`` →
  ``mcp_tool_call`` (``server``, ``tool``, ``arguments``, ``result``/``error``);
  ``web_search_end`` → ``web_search``; ``plan_update`` and the ``update_plan`` tool →
  ``todo_list``; a plan ``item_completed`` → ``plan``.
* ``response_item``: a rollout records most things twice, once as the model's history
  (``response_item``) and once as an event (``event_msg``), and which of the two is present
  depends on Codex's version and persistence mode. Each fact is appended once: assistant
  messages and reasoning are kept once per turn by their text, tool calls once by their
  ``call_id``. ``function_call`` + ``function_call_output`` (and the ``custom_tool_call``
  and ``local_shell_call`` forms) give ``command_execution`` (shell tools), ``file_change``
  (``apply_patch``: the paths of its ``*** Add/Update/Delete File:`` lines) or
  ``tool_invocation`` + ``tool_output``. User messages in ``response_item`` are skipped: they
  include Codex's environment context, and the prompt itself comes as ``user_message``.
* ``turn_context``, ``compacted``, ``token_count`` (beyond usage) and other event messages
  carry nothing the family has a place for.
"""

from __future__ import annotations

import shlex
from typing import Any

import orjson

from memfs.agents import CODEX
from memfs.ingest import dumps, parse_object, text_of

SHELL_TOOLS = ("shell", "container.exec", "exec_command", "local_shell", "shell_command")


class ExecTranslator:
    """``codex exec --json`` (and memfs's own event lines): passed through unchanged."""

    kind = "native"

    def feed(self, raw: bytes) -> list[bytes]:
        return [raw]

    def state(self) -> dict:
        return {}

    def restore(self, state: dict) -> None:
        pass


def _usage(u: Any) -> dict:
    out = {}
    if isinstance(u, dict):
        for key in ("input_tokens", "cached_input_tokens", "output_tokens"):
            v = u.get(key)
            if type(v) is int and v >= 0:
                out[key] = v
    return out


def _patch_changes(patch: str) -> list[dict]:
    changes = []
    for line in patch.splitlines():
        for prefix, kind in (("*** Add File: ", "add"), ("*** Update File: ", "update"), ("*** Delete File: ", "delete")):
            if line.startswith(prefix):
                changes.append({"path": line[len(prefix):].strip(), "kind": kind})
    return changes


def _command(value: Any) -> str:
    if isinstance(value, list):
        parts = [str(p) for p in value]
        if len(parts) == 3 and parts[0] in ("bash", "sh", "zsh", "/bin/bash", "/bin/sh") and parts[1] in ("-lc", "-c"):
            return parts[2]
        return shlex.join(parts)
    return value if isinstance(value, str) else ""


class RolloutTranslator:
    kind = "rollout"

    def __init__(self) -> None:
        self.thread_id: str | None = None
        self.in_turn = False
        self.lazy = False  # the open turn was opened by its prompt or an item, not task_started
        self.turn_id: str | None = None
        self.total: dict = {}  # latest total_token_usage
        self.total_at_start: dict = {}
        self.seen_calls: list[str] = []  # call ids appended this turn
        self.seen_texts: list[str] = []  # message/reasoning texts appended this turn
        self.pending: dict[str, dict] = {}  # call_id -> {name, arguments}
        self.n = 0

    def state(self) -> dict:
        return dict(vars(self))

    def restore(self, state: dict) -> None:
        for key, value in state.items():
            if key in vars(self):
                setattr(self, key, value)

    def _id(self, hint: Any = None) -> str:
        self.n += 1
        return hint if isinstance(hint, str) and hint else f"codex-{self.n}"

    def _open(self, ts: Any, out: list, turn_id: Any = None, lazy: bool = True) -> None:
        if self.in_turn:
            return
        self.in_turn = True
        self.lazy = lazy
        self.turn_id = turn_id if isinstance(turn_id, str) else None
        self.total_at_start = dict(self.total)
        self.seen_calls, self.seen_texts = [], []
        context = {}
        if self.turn_id:
            context["turn_id"] = self.turn_id
        if isinstance(ts, str):
            context["timestamp"] = ts
        out.append(dumps({"type": "turn.started", "context": context} if context else {"type": "turn.started"}))

    def _close(self, ts: Any, out: list, failed: str | None = None) -> None:
        if not self.in_turn:
            return
        self.in_turn = False
        usage = {k: max(0, v - self.total_at_start.get(k, 0)) for k, v in self.total.items()}
        event: dict = {"type": "turn.failed", "message": failed} if failed is not None else {"type": "turn.completed"}
        event["usage"] = usage
        if isinstance(ts, str):
            event["completed_at"] = ts
        out.append(dumps(event))

    def _item(self, out: list, item: dict, ts: Any, started: bool = False) -> None:
        self._open(ts, out)
        out.append(dumps({"type": "item.started" if started else "item.completed", "item": item}))

    def _text(self, out: list, kind: str, text: Any, ts: Any) -> None:
        if not isinstance(text, str) or not text.strip():
            return
        if text in self.seen_texts:
            return
        self.seen_texts.append(text)
        self._item(out, {"id": self._id(), "type": kind, "text": text}, ts)

    def _once(self, call_id: Any) -> bool:
        """True the first time a call id is seen this turn."""
        if not isinstance(call_id, str) or not call_id:
            return True
        if call_id in self.seen_calls:
            return False
        self.seen_calls.append(call_id)
        return True

    def feed(self, raw: bytes) -> list[bytes]:
        obj = parse_object(raw, "codex rollout")
        kind, payload, ts = obj.get("type"), obj.get("payload"), obj.get("timestamp")
        out: list[bytes] = []
        if not isinstance(payload, dict):
            return out
        if kind == "session_meta":
            sid = payload.get("id")
            if isinstance(sid, str) and sid and self.thread_id is None:
                self.thread_id = sid
                out.append(dumps({"type": "thread.started", "thread_id": sid, "agent": CODEX}))
        elif kind == "event_msg":
            self._event(payload, ts, out)
        elif kind == "response_item":
            self._response(payload, ts, out)
        return out

    def _event(self, p: dict, ts: Any, out: list) -> None:
        t = p.get("type")
        if t in ("task_started", "turn_started"):
            if self.in_turn and self.lazy:  # opened by this turn's prompt: the same turn
                self.lazy = False
                self.turn_id = p.get("turn_id") if isinstance(p.get("turn_id"), str) else self.turn_id
                return
            self._close(ts, out, failed="superseded by a new turn")
            self._open(ts, out, p.get("turn_id"), lazy=False)
        elif t in ("task_complete", "turn_complete"):
            if not self.in_turn:
                self._open(ts, out, p.get("turn_id"))
            self._close(ts, out)
        elif t == "turn_aborted":
            if not self.in_turn:
                self._open(ts, out, p.get("turn_id"))
            self._close(ts, out, failed=f"aborted: {p.get('reason') or 'unknown reason'}")
        elif t == "token_count":
            info = p.get("info")
            if isinstance(info, dict):
                total = _usage(info.get("total_token_usage"))
                if total:
                    self.total = total
        elif t == "error":
            message = p.get("message")
            out.append(dumps({"type": "error", "message": message if isinstance(message, str) else "error"}))
        elif t == "user_message":
            message = p.get("message")
            if isinstance(message, str) and message.strip():
                self._item(out, {"id": self._id(), "type": "user_message", "text": message}, ts)
        elif t == "agent_message":
            self._text(out, "agent_message", p.get("message"), ts)
        elif t == "agent_reasoning":
            self._text(out, "reasoning", p.get("text"), ts)
        elif t == "exec_command_end" and self._once(p.get("call_id")):
            self.pending.pop(p.get("call_id"), None)
            exit_code = p.get("exit_code")
            status = p.get("status") if isinstance(p.get("status"), str) else \
                ("completed" if exit_code == 0 else "failed")
            item = {"id": self._id(p.get("call_id")), "type": "command_execution", "command": _command(p.get("command")),
                    "status": status, "aggregated_output": text_of(p.get("aggregated_output") or p.get("stdout") or "")}
            if type(exit_code) is int:
                item["exit_code"] = exit_code
            self._item(out, item, ts)
        elif t == "patch_apply_end" and self._once(p.get("call_id")):
            call = self.pending.pop(p.get("call_id"), None)
            changes = []
            if isinstance(p.get("changes"), dict):
                for path, change in p["changes"].items():
                    ctype = change.get("type") if isinstance(change, dict) else None
                    changes.append({"path": str(path), "kind": ctype if ctype in ("add", "delete", "update") else "update"})
            elif call is not None:
                changes = _patch_changes(call.get("arguments") or "")
            self._item(out, {"id": self._id(p.get("call_id")), "type": "file_change", "changes": changes,
                             "status": "completed" if p.get("success") is not False else "failed"}, ts)
        elif t == "mcp_tool_call_end" and self._once(p.get("call_id")):
            self.pending.pop(p.get("call_id"), None)
            inv = p.get("invocation") if isinstance(p.get("invocation"), dict) else {}
            server, tool = str(inv.get("server", "")), str(inv.get("tool", ""))
            result = p.get("result")
            item = {"id": self._id(p.get("call_id")), "type": "mcp_tool_call", "tool_name": f"{server}.{tool}",
                    "server": server, "tool": tool, "arguments": inv.get("arguments"), "result": None, "error": None}
            if isinstance(result, dict) and "Err" in result:
                item["error"] = {"message": str(result["Err"])}
                item["status"] = "failed"
            else:
                ok = result.get("Ok") if isinstance(result, dict) and "Ok" in result else result
                if isinstance(ok, dict):
                    item["result"] = {"content": ok.get("content") if isinstance(ok.get("content"), list) else [],
                                      "structured_content": ok.get("structured_content", ok.get("structuredContent"))}
                item["status"] = "failed" if isinstance(ok, dict) and ok.get("is_error", ok.get("isError")) else "completed"
            self._item(out, item, ts)
        elif t == "web_search_end" and self._once(p.get("call_id")):
            query = p.get("query")
            if isinstance(query, str) and query not in self.seen_texts:
                self.seen_texts.append(query)
                self._item(out, {"id": self._id(p.get("call_id")), "type": "web_search", "query": query}, ts)
        elif t == "plan_update":
            self._todo(p, ts, out)
        elif t == "item_completed":
            item = p.get("item")
            if isinstance(item, dict) and str(item.get("type", "")).lower() == "plan":
                self._text(out, "plan", item.get("text"), ts)

    def _todo(self, args: dict, ts: Any, out: list) -> None:
        plan = args.get("plan")
        if not isinstance(plan, list):
            return
        items = [{"text": str(s.get("step", "")), "completed": s.get("status") == "completed"}
                 for s in plan if isinstance(s, dict)]
        self._item(out, {"id": self._id(), "type": "todo_list", "items": items}, ts)

    def _response(self, p: dict, ts: Any, out: list) -> None:
        t = p.get("type")
        if t == "message" and p.get("role") == "assistant":
            self._text(out, "agent_message", text_of(p.get("content")), ts)
        elif t == "reasoning":
            self._text(out, "reasoning", text_of(p.get("summary")), ts)
        elif t in ("function_call", "custom_tool_call"):
            call_id = p.get("call_id")
            name = p.get("name") if isinstance(p.get("name"), str) else "tool"
            arguments = p.get("arguments") if t == "function_call" else p.get("input")
            if name == "update_plan":
                try:
                    args = orjson.loads(arguments) if isinstance(arguments, str) else arguments
                except orjson.JSONDecodeError:
                    args = None
                if isinstance(args, dict):
                    self._todo(args, ts, out)
                return
            if isinstance(call_id, str):
                self.pending[call_id] = {"name": name, "arguments": arguments}
        elif t == "local_shell_call":
            action = p.get("action") if isinstance(p.get("action"), dict) else {}
            call_id = p.get("call_id")
            if isinstance(call_id, str):
                self.pending[call_id] = {"name": "local_shell", "arguments": orjson.dumps(action).decode()}
        elif t in ("function_call_output", "custom_tool_call_output"):
            self._output(p, ts, out)
        elif t == "web_search_call":
            action = p.get("action") if isinstance(p.get("action"), dict) else {}
            query = action.get("query") or action.get("url")
            if isinstance(query, str) and query not in self.seen_texts:
                self.seen_texts.append(query)
                self._item(out, {"id": self._id(p.get("id")), "type": "web_search", "query": query}, ts)

    def _output(self, p: dict, ts: Any, out: list) -> None:
        call_id = p.get("call_id")
        call = self.pending.pop(call_id, None) if isinstance(call_id, str) else None
        if call is None or not self._once(call_id):
            return
        output = p.get("output")
        exit_code = None
        if isinstance(output, dict):  # {content, success} in some versions
            text = text_of(output.get("content"))
            success = output.get("success")
        else:
            text, success = text_of(output), None
            try:
                decoded = orjson.loads(text) if text.startswith("{") else None
            except orjson.JSONDecodeError:
                decoded = None
            if isinstance(decoded, dict) and "output" in decoded:  # {"output", "metadata": {"exit_code"}}
                text = text_of(decoded.get("output"))
                meta = decoded.get("metadata")
                if isinstance(meta, dict) and type(meta.get("exit_code")) is int:
                    exit_code = meta["exit_code"]
        name, arguments = call["name"], call.get("arguments")
        failed = success is False or (exit_code is not None and exit_code != 0)
        status = "failed" if failed else "completed"
        if name in SHELL_TOOLS:
            try:
                args = orjson.loads(arguments) if isinstance(arguments, str) else arguments
            except orjson.JSONDecodeError:
                args = {"command": arguments}
            args = args if isinstance(args, dict) else {}
            item = {"id": self._id(call_id), "type": "command_execution",
                    "command": _command(args.get("command") or args.get("cmd")), "status": status,
                    "aggregated_output": text}
            if exit_code is not None:
                item["exit_code"] = exit_code
        elif name == "apply_patch":
            patch = arguments if isinstance(arguments, str) else ""
            if patch.startswith("{"):
                try:
                    patch = text_of(orjson.loads(patch).get("input", ""))
                except (orjson.JSONDecodeError, AttributeError):
                    pass
            item = {"id": self._id(call_id), "type": "file_change", "changes": _patch_changes(patch), "status": status}
        else:
            try:
                args = orjson.loads(arguments) if isinstance(arguments, str) else arguments
            except orjson.JSONDecodeError:
                args = arguments
            self._item(out, {"id": self._id(call_id), "type": "tool_invocation", "tool_name": name,
                             "status": "completed", "arguments": args}, ts)
            item = {"id": f"{call_id}:out", "type": "tool_output", "call_id": call_id, "status": status, "output": text}
        self._item(out, item, ts)
