"""Codex output → this event family (SPEC §8, §10). Checked against Codex CLI 0.171.0 (the
captured fixtures, ``tests/fixtures/agents/codex/``) and older rollouts (0.2x–0.128).

Two sources:

* ``codex exec --json`` output is already this event family (Codex is its upstream): each line
  is passed through as it is, byte for byte (:class:`ExecTranslator`); only its ``meta`` is
  learnt from it. Its item ids (``item_0``, ``item_1``, …) are numbered per run, and its
  ``turn.completed`` usage is the *thread's* running total (a resumed run counts the earlier
  turns again): the views take per-turn usage as the difference (:mod:`memfs.views.fold`).
* Codex **rollout files**, ``~/.codex/sessions/YYYY/MM/DD/rollout-<time>-<uuid>.jsonl``: lines
  ``{"timestamp","type","payload"}`` of type ``session_meta``, ``turn_context``,
  ``response_item``, ``event_msg`` and ``compacted`` (:class:`RolloutTranslator`), shapes of
  ``codex-rs/protocol`` (``RolloutItem``, ``EventMsg``, ``ResponseItem``, ``TurnItem``).

The rollout mapping:

* ``session_meta`` → ``thread.started`` (``agent: "codex"``) and ``meta`` (id, cwd,
  ``cli_version`` → ``agent_version``, originator, git branch, start); ``turn_context`` → the
  model (and cwd).
* ``task_started`` opens a turn; its ``turn.started`` waits for the turn's prompt (a
  ``user_message`` event, a ``UserMessage`` item, or a ``response_item`` of role user that is
  not environment context or instructions) and carries it in ``context`` (``origin: "user"``,
  ``turn_id``, ``prompt`` (first 4 KiB), ``timestamp``). Anything else of the turn that comes
  first opens it without a prompt. Later prompts of a turn are ``user_message`` items.
* ``task_complete`` closes it: ``turn.failed`` when it carries an ``error`` (0.171) or follows
  an ``error`` event (or a ``stream_error`` after which the model produced nothing), else
  ``turn.completed``; ``turn_aborted`` → ``turn.failed`` with the reason (``interrupted``).
  The close carries ``usage`` = the growth of ``token_count``'s running total over the turn
  (never the total itself), ``thread_usage`` = that total (a memfs extension: what
  ``exec --json`` reports as the turn's usage, see :func:`turn_signature`) and
  ``completed_at``. A ``stream_error`` (a retry) is an ``error`` item.
* Items: commands (``exec_command_end``, a ``CommandExecution`` item, a shell
  ``function_call`` + output) → ``command_execution`` with status, ``exit_code`` and the
  output bounded (first and last 2 KiB); MCP calls (``mcp_tool_call_end``, ``McpToolCall``,
  a ``function_call`` with ``namespace: "mcp__<server>"`` or named ``mcp__<server>__<tool>``)
  → ``mcp_tool_call`` as ``exec --json`` writes it (``server``, ``tool``, ``arguments``,
  ``result``/``error``, ``status``); ``update_plan`` / ``plan_update`` → one ``todo_list`` item
  per turn (started, updated at each change, completed at the close, as ``exec`` does);
  patches → ``file_change``; messages and reasoning → ``agent_message`` / ``reasoning``; web
  searches → ``web_search``; other tools → ``tool_invocation`` + ``tool_output``.
* A rollout records most things twice (``response_item`` history and ``event_msg`` events,
  and in 0.171 also ``item_completed`` items): each is appended once — calls by ``call_id``,
  texts once per turn. Once a rollout writes ``item_completed`` items, assistant messages
  come from them only (a ``response_item`` message without one is not an answer: e.g. the
  compaction's summary).
* ``compacted`` → ``thread.compact_boundary`` (``trigger: "auto"``: a rollout does not say)
  and the summary as a ``harness`` item ``compact_summary`` (a fact); the replacement history
  it carries is not imported again.

Ids (shared contract): a call's item id is its ``call_id``; a message, reasoning, error or
summary item is ``<turn id>:<n>`` (n counts those items in the turn); the to-do list of a turn
is named by its first ``update_plan`` call. The shapes' small readers are in
:mod:`memfs.agents.codex.shapes`.
"""

from __future__ import annotations

from typing import Any

import orjson

from memfs import counts
from memfs.agents import CODEX, UNKNOWN, Origin
from memfs.agents.changes import event_changes
from memfs.agents.codex import shapes
from memfs.agents.codex.shapes import turn_signature  # noqa: F401  (identity's name for it)
from memfs.ingest import (
    VarsState,
    bounded_output,
    bounded_prompt,
    dumps,
    parse_object,
    request_entry,
    stamp_close,
    text_of,
)


class ExecTranslator:
    """``codex exec --json`` (and memfs's own event lines): passed through unchanged; ``meta``
    learns the agent (as :class:`memfs.agents.Origin` tells it), the thread id and the status."""

    kind = "native"

    def __init__(self) -> None:
        self.meta: dict = {}
        self.origin = Origin()

    def feed(self, raw: bytes) -> list[bytes]:
        if b'"thread.started"' in raw or b'"turn.' in raw or (not self.origin.settled and b'"item.' in raw):
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError:
                return [raw]
            event = obj.get("event", obj) if type(obj) is dict else None
            if type(event) is dict:
                self._learn(event)
        return [raw]

    def _learn(self, event: dict) -> None:
        if not self.origin.settled:
            self.origin.feed(event)
            if self.origin.agent != UNKNOWN:
                self.meta["agent"] = self.origin.agent
            if self.origin.thread_id:
                self.meta.setdefault("conversation_id", self.origin.thread_id)
        etype = event.get("type")
        if etype == "turn.started":
            self.meta["status"] = "running"
        elif etype in ("turn.completed", "turn.failed"):
            self.meta["status"] = "completed" if etype == "turn.completed" else "failed"

    def state(self) -> dict:
        return {"meta": self.meta, "origin": self.origin.to_dict()}

    def restore(self, state: dict) -> None:
        self.meta = dict(state.get("meta") or {})
        origin = state.get("origin") or {}
        self.origin.agent = origin.get("agent") or UNKNOWN
        self.origin.thread_id = origin.get("thread_id")


class RolloutTranslator(VarsState):
    kind = "rollout"

    def __init__(self) -> None:
        self.thread_id: str | None = None
        self.meta: dict = {}
        self.in_turn = False
        self.pending: list | None = None  # [turn id, timestamp]: task_started seen, turn.started not yet written
        self.lazy = False  # the open turn was opened by an item, not task_started (older rollouts)
        self.early_prompt: str | None = None  # a prompt before its task_started (older rollouts)
        self.turn_id: str | None = None
        self.turns = 0
        self.n = 0  # message/reasoning/error items in the turn
        self.answered = False  # the turn has an agent message
        self.error: str | None = None  # an ``error`` event's message: the turn fails with it
        self.soft_error: str | None = None  # a ``stream_error`` not followed by model output
        self.deferred: list[dict] = []  # items that came before the turn's prompt
        self.todo: list | None = None  # [item id, items] of the turn's to-do list
        self.total: dict = {}  # latest total_token_usage
        self.total_at_start: dict = {}
        self.requests: list[dict] = []  # this turn's model requests (close ``requests``), see _token_count
        self.marked: str | None = None  # the usage_error memfs's export left on this turn's last_token_usage
        self.seen_calls: list[str] = []  # call ids appended this turn
        self.seen_texts: list[str] = []  # message/reasoning texts appended this turn
        self.calls: dict[str, dict] = {}  # call_id -> {name, arguments, namespace}
        self.v2 = False  # the rollout writes ``item_completed`` items (0.171)
        self.history = 0  # response items since the thread started or was compacted

    # --- the turn ------------------------------------------------------------------------------

    def _key(self) -> str:
        return self.turn_id or f"{self.thread_id or 'codex'}#{self.turns}"

    def _next_id(self) -> str:
        self.n += 1
        return f"{self._key()}:{self.n - 1}"

    def _reset(self, turn_id: Any) -> None:
        self.turns += 1
        self.turn_id = turn_id if isinstance(turn_id, str) and turn_id else None
        self.n, self.answered = 0, False
        self.error = self.soft_error = self.todo = None
        self.seen_calls, self.seen_texts, self.deferred = [], [], []
        self.total_at_start = dict(self.total)
        self.requests = []

    def _start(self, out: list, prompt: str | None, ts: Any) -> None:
        """Write the turn's ``turn.started`` (then what waited for it)."""
        context: dict = {}
        if prompt is not None:
            context["origin"] = "user"
            self.seen_texts.append(prompt)
        if self.turn_id:
            context["turn_id"] = self.turn_id
        if prompt is not None:
            context["prompt"] = bounded_prompt(prompt)
        if isinstance(ts, str):
            context["timestamp"] = ts
        out.append(dumps({"type": "turn.started", "context": context} if context else {"type": "turn.started"}))
        self.in_turn, self.pending = True, None
        self.meta["status"] = "running"
        for event in self.deferred:
            out.append(dumps(event))
        self.deferred = []

    def _open(self, out: list, ts: Any) -> None:
        """Make sure a turn is open before an item: the pending one, or (older rollouts) one
        opened by the item itself."""
        if self.in_turn:
            return
        if self.pending is not None:
            self._start(out, None, self.pending[1])
            return
        self._reset(None)
        self.lazy = True
        prompt, self.early_prompt = self.early_prompt, None
        self._start(out, prompt, ts)

    def _begin(self, turn_id: Any, ts: Any, out: list) -> None:
        """``task_started``."""
        if self.in_turn and self.lazy:  # opened by this turn's items: the same turn
            self.lazy = False
            if isinstance(turn_id, str) and turn_id:
                self.turn_id = turn_id
            return
        if self.in_turn or self.pending is not None:
            self._close(ts, out, self.error or self.soft_error or "superseded by a new turn")
        self._reset(turn_id)
        self.lazy = False
        self.pending = [self.turn_id, ts]
        if self.early_prompt is not None:
            prompt, self.early_prompt = self.early_prompt, None
            self._start(out, prompt, ts)

    def _close(self, ts: Any, out: list, failed: str | None = None, last_message: Any = None) -> None:
        if not self.in_turn:
            if self.pending is None:
                return
            self._start(out, None, self.pending[1])
        if not self.answered and isinstance(last_message, str) and last_message.strip() and failed is None:
            self._text(out, "agent_message", last_message, ts)
        if self.todo is not None:
            out.append(dumps({"type": "item.completed",
                              "item": {"id": self.todo[0], "type": "todo_list", "items": self.todo[1]}}))
        total, before = counts.counts_of(self.total), counts.counts_of(self.total_at_start)
        if any(total.get(k, 0) < v for k, v in before.items()):
            usage = dict(self.total)  # the running total started again: it is this turn's
        else:
            usage = {k: v - before.get(k, 0) for k, v in total.items()}
            if counts.ERROR in self.total:  # a refused count in the running total: the turn's is unknown
                usage[counts.ERROR] = self.total[counts.ERROR]
        if self.marked is not None:
            usage.setdefault(counts.ERROR, self.marked)
            self.marked = None
        event: dict = {"type": "turn.failed", "message": failed} if failed is not None else {"type": "turn.completed"}
        event["usage"] = usage
        event["thread_usage"] = dict(self.total)
        if isinstance(ts, str):
            event["completed_at"] = ts
            self.meta["ended_at"] = ts
        stamp_close(event, CODEX, self.requests, self.meta.get("model"))
        self.requests = []
        out.append(dumps(event))
        self.meta["status"] = "failed" if failed is not None else "completed"
        self.in_turn = self.lazy = False
        self.pending = self.todo = None
        self.total_at_start = dict(self.total)

    def _request(self, total: dict, ts: Any) -> None:
        tokens = shapes.request_tokens(total, self.total)
        if tokens:
            self.requests.append(request_entry(self.meta.get("model"), tokens, ts))

    def _item(self, out: list, item: dict, ts: Any, etype: str = "item.completed") -> None:
        event = {"type": etype, "item": item}
        if not self.in_turn and self.pending is not None:
            self.deferred.append(event)  # the prompt may still come: it opens the turn
            return
        self._open(out, ts)
        out.append(dumps(event))

    def _progress(self) -> None:
        """The model produced something: a retry before it is no failure."""
        self.soft_error = None

    def _text(self, out: list, kind: str, text: Any, ts: Any) -> None:
        if not isinstance(text, str) or not text.strip() or text in self.seen_texts:
            return
        self.seen_texts.append(text)
        self._progress()
        if kind == "agent_message":
            self.answered = True
        self._item(out, {"id": self._next_id(), "type": kind, "text": text}, ts)

    def _prompt(self, text: str | None, ts: Any, out: list) -> None:
        if text is None:
            return
        self.meta.setdefault("first_prompt", bounded_prompt(text))
        if self.pending is not None and not self.in_turn:
            self._start(out, text, self.pending[1])
        elif self.in_turn:
            if text not in self.seen_texts:  # said again in the same turn: a later message
                self.seen_texts.append(text)
                self._item(out, {"id": self._next_id(), "type": "user_message", "text": text}, ts)
        elif self.early_prompt is None:
            self.early_prompt = text
        elif text != self.early_prompt:
            self._open(out, ts)
            self._prompt(text, ts, out)

    def _once(self, call_id: Any) -> bool:
        """True the first time a call id is seen this turn."""
        if not isinstance(call_id, str) or not call_id:
            return True
        if call_id in self.seen_calls:
            return False
        self.seen_calls.append(call_id)
        return True

    def _call_id(self, call_id: Any) -> str:
        return call_id if isinstance(call_id, str) and call_id else self._next_id()

    # --- lines ---------------------------------------------------------------------------------

    def feed(self, raw: bytes) -> list[bytes]:
        obj = parse_object(raw, "codex rollout")
        kind, payload, ts = obj.get("type"), obj.get("payload"), obj.get("timestamp")
        out: list[bytes] = []
        if not isinstance(payload, dict):
            return out
        if kind == "session_meta":
            self._session_meta(payload, ts, out)
        elif kind == "turn_context":
            for key in ("model", "cwd"):
                if isinstance(payload.get(key), str) and payload[key]:
                    self.meta[key] = payload[key] if key == "model" else self.meta.get(key, payload[key])
        elif kind == "event_msg":
            self._event(payload, ts, out)
        elif kind == "response_item":
            self.history += 1
            self._response(payload, ts, out)
        elif kind == "compacted":
            self._compacted(payload, ts, out)
        return out

    def _session_meta(self, p: dict, ts: Any, out: list) -> None:
        sid = p.get("id")
        if not isinstance(sid, str) or not sid or self.thread_id is not None:
            return
        self.thread_id = sid
        out.append(dumps({"type": "thread.started", "thread_id": sid, "agent": CODEX}))
        meta = self.meta
        meta.update(agent=CODEX, conversation_id=sid)
        git = p.get("git") if isinstance(p.get("git"), dict) else {}
        for key, value in (("agent_version", p.get("cli_version")), ("cwd", p.get("cwd")),
                           ("originator", p.get("originator")), ("git_branch", git.get("branch")),
                           ("started_at", p.get("timestamp") if isinstance(p.get("timestamp"), str) else ts)):
            if isinstance(value, str) and value:
                meta[key] = value

    def _compacted(self, p: dict, ts: Any, out: list) -> None:
        message = p.get("message") if isinstance(p.get("message"), str) else ""
        history = p.get("replacement_history")
        kept = len(history) if isinstance(history, list) else 0
        out.append(dumps({"type": "thread.compact_boundary", "thread_id": self.thread_id or "",
                          "trigger": "auto", "mode": "summary" if message.strip() else "remote",
                          "original_message_count": self.history, "compacted_message_count": kept}))
        self.history = kept
        summary = message
        if message.startswith(shapes.SUMMARY_PREFIX) and "\n" in message:  # Codex's preamble, then the summary
            summary = message.split("\n", 1)[1]
        if summary.strip():
            self._item(out, {"id": self._next_id(), "type": "harness", "event": "compact_summary",
                             "message": summary.strip()}, ts)

    def _event(self, p: dict, ts: Any, out: list) -> None:
        t = p.get("type")
        if t in ("task_started", "turn_started"):
            self._begin(p.get("turn_id"), ts, out)
        elif t in ("task_complete", "turn_complete"):
            error = p.get("error")
            message = error.get("message") if isinstance(error, dict) else error
            reason = message if isinstance(message, str) and message else (self.error or self.soft_error)
            if not self.in_turn and self.pending is None:
                self._open(out, ts)
            self._close(ts, out, reason, p.get("last_agent_message"))
        elif t == "turn_aborted":
            if not self.in_turn and self.pending is None:
                self._open(out, ts)
            reason = p.get("reason")
            self._close(ts, out, reason if isinstance(reason, str) and reason else "aborted")
        elif t == "token_count":
            info = p.get("info")
            total = shapes.usage_of(info.get("total_token_usage")) if isinstance(info, dict) else {}
            if total:
                self._request(total, ts)
                self.total = total
            last = info.get("last_token_usage") if isinstance(info, dict) else None
            marked = last.get(counts.ERROR) if isinstance(last, dict) else None
            if isinstance(marked, str) and marked:
                self.marked = marked
        elif t in ("error", "stream_error"):
            message = p.get("message") if isinstance(p.get("message"), str) and p.get("message") else t
            if t == "stream_error":
                self.soft_error = message
                self._item(out, {"id": self._next_id(), "type": "error", "message": message}, ts)
            elif self.in_turn or self.pending is not None:
                self.error = message
            else:
                out.append(dumps({"type": "error", "message": message}))
        elif t == "user_message":
            message = p.get("message")
            self._prompt(message if isinstance(message, str) and message.strip() else None, ts, out)
        elif t == "agent_message":
            self._text(out, "agent_message", p.get("message"), ts)
        elif t == "agent_reasoning":
            self._text(out, "reasoning", p.get("text"), ts)
        elif t == "exec_command_end":
            self._command(p.get("call_id"), p.get("command"), p.get("exit_code"), p.get("status"),
                          p.get("aggregated_output") or p.get("formatted_output") or p.get("stdout") or "", ts, out)
        elif t == "patch_apply_end" and self._once(p.get("call_id")):
            call = self.calls.pop(p.get("call_id"), None) if isinstance(p.get("call_id"), str) else None
            changes = self._changes(p.get("changes"))
            if not changes and call is not None:
                changes = shapes.patch_changes(call.get("arguments") or "")
            self._progress()
            self._item(out, {"id": self._call_id(p.get("call_id")), "type": "file_change", "changes": changes,
                             "status": "completed" if p.get("success") is not False else "failed"}, ts)
        elif t == "mcp_tool_call_end":
            inv = p.get("invocation") if isinstance(p.get("invocation"), dict) else {}
            self._mcp(p.get("call_id"), inv.get("server"), inv.get("tool"), inv.get("arguments"),
                      *shapes.mcp_result(p.get("result")), ts, out)
        elif t == "web_search_end":
            self._search(p.get("call_id"), p.get("query"), ts, out)
        elif t == "plan_update":
            self._todo(p, None, ts, out)
        elif t == "item_completed" and isinstance(p.get("item"), dict):
            self._turn_item(p["item"], ts, out)

    def _turn_item(self, item: dict, ts: Any, out: list) -> None:
        """A 0.171 ``item_completed`` (``TurnItem``)."""
        itype = item.get("type")
        if itype in shapes.V2_ITEMS:
            self.v2 = True
        iid = item.get("id")
        if itype == "UserMessage":
            self._prompt(shapes.prompt_text(item.get("content")), ts, out)
        elif itype == "AgentMessage":
            self._text(out, "agent_message", text_of(item.get("content")), ts)
        elif itype == "Reasoning":
            summary = item.get("summary_text")
            self._text(out, "reasoning", "\n".join(s for s in summary if isinstance(s, str))
                       if isinstance(summary, list) else None, ts)
        elif itype == "Plan" or str(itype).lower() == "plan":
            self._text(out, "plan", item.get("text"), ts)
        elif itype == "CommandExecution":
            output = item.get("aggregated_output", item.get("aggregatedOutput")) or ""
            self._command(iid, item.get("command"), item.get("exit_code", item.get("exitCode")),
                          item.get("status"), output, ts, out)
        elif itype == "McpToolCall":
            result, error, status = shapes.mcp_result(item.get("result"))
            if isinstance(item.get("error"), dict):
                error = {"message": text_of(item["error"].get("message")) or "error"}
            if error is not None:
                status = "failed"
            elif isinstance(item.get("status"), str):
                status = item["status"]
            self._mcp(iid, item.get("server"), item.get("tool"), item.get("arguments"), result, error, status, ts, out)
        elif itype == "FileChange" and self._once(iid):
            self._progress()
            status = item.get("status")
            self._item(out, {"id": self._call_id(iid), "type": "file_change",
                             "changes": self._changes(item.get("changes")),
                             "status": status if isinstance(status, str) else "completed"}, ts)
        elif itype == "WebSearch":
            self._search(iid, item.get("query"), ts, out)

    @staticmethod
    def _changes(changes: Any) -> list[dict]:
        return event_changes(changes)  # (with each change's diff or content: memfs.agents.changes)

    def _command(self, call_id: Any, command: Any, exit_code: Any, status: Any, output: Any, ts: Any,
                 out: list) -> None:
        if not self._once(call_id):
            return
        if isinstance(call_id, str):
            self.calls.pop(call_id, None)
        code = exit_code if type(exit_code) is int else None
        if not isinstance(status, str) or status in ("", "in_progress", "inProgress"):
            status = "in_progress" if code is None else ("completed" if code == 0 else "failed")
        elif code not in (None, 0) and status == "completed":
            status = "failed"
        item = {"id": self._call_id(call_id), "type": "command_execution",
                "command": shapes.command_text(command), "status": status,
                "aggregated_output": bounded_output(text_of(output))}
        if code is not None:
            item["exit_code"] = code
        self._progress()
        self._item(out, item, ts)

    def _mcp(self, call_id: Any, server: Any, tool: Any, arguments: Any, result: dict | None, error: dict | None,
             status: str, ts: Any, out: list) -> None:
        if not self._once(call_id):
            return
        if isinstance(call_id, str):
            self.calls.pop(call_id, None)
        self._progress()
        self._item(out, {"id": self._call_id(call_id), "type": "mcp_tool_call", "server": str(server or ""),
                         "tool": str(tool or ""), "arguments": arguments, "result": result, "error": error,
                         "status": status}, ts)

    def _search(self, call_id: Any, query: Any, ts: Any, out: list) -> None:
        if not isinstance(query, str) or not query or query in self.seen_texts or not self._once(call_id):
            return
        self.seen_texts.append(query)
        self._progress()
        self._item(out, {"id": self._call_id(call_id), "type": "web_search", "query": query}, ts)

    def _todo(self, args: dict, call_id: Any, ts: Any, out: list) -> None:
        """``update_plan``: the turn's one to-do list, with the whole current list."""
        plan = args.get("plan")
        if not isinstance(plan, list):
            return
        items = [{"text": str(s.get("step", "")), "completed": s.get("status") == "completed"}
                 for s in plan if isinstance(s, dict)]
        self._progress()
        if self.todo is None:
            self.todo = [self._call_id(call_id), items]
            self._item(out, {"id": self.todo[0], "type": "todo_list", "items": items}, ts, "item.started")
        else:
            self.todo[1] = items
            self._item(out, {"id": self.todo[0], "type": "todo_list", "items": items}, ts, "item.updated")

    def _response(self, p: dict, ts: Any, out: list) -> None:
        t = p.get("type")
        if t == "message":
            role = p.get("role")
            if role == "user" and not shapes.harness_made(p):
                self._prompt(shapes.prompt_text(p.get("content")), ts, out)
            elif role == "assistant" and not self.v2:
                self._text(out, "agent_message", text_of(p.get("content")), ts)
        elif t == "reasoning" and not self.v2:
            self._text(out, "reasoning", text_of(p.get("summary")), ts)
        elif t in ("function_call", "custom_tool_call"):
            call_id = p.get("call_id")
            name = p.get("name") if isinstance(p.get("name"), str) else "tool"
            arguments = p.get("arguments") if t == "function_call" else p.get("input")
            self._progress()
            if shapes.SHAPES.tools.get(name) == "todo_list":
                args = shapes.json_or_text(arguments)
                if isinstance(args, dict):
                    self._todo(args, call_id, ts, out)
                return
            if isinstance(call_id, str):
                self.calls[call_id] = {"name": name, "arguments": arguments, "namespace": p.get("namespace")}
        elif t == "local_shell_call":
            action = p.get("action") if isinstance(p.get("action"), dict) else {}
            call_id = p.get("call_id")
            if isinstance(call_id, str):
                self.calls[call_id] = {"name": "local_shell", "arguments": action}
        elif t in ("function_call_output", "custom_tool_call_output"):
            self._output(p, ts, out)
        elif t == "web_search_call":
            action = p.get("action") if isinstance(p.get("action"), dict) else {}
            self._search(p.get("id"), action.get("query") or action.get("url"), ts, out)

    def _output(self, p: dict, ts: Any, out: list) -> None:
        call_id = p.get("call_id")
        call = self.calls.pop(call_id, None) if isinstance(call_id, str) else None
        if call is None or call_id in self.seen_calls:
            return
        text, code, success = shapes.tool_output(p.get("output"))
        name, arguments = call["name"], call.get("arguments")
        failed = success is False or (code is not None and code != 0)
        status = "failed" if failed else "completed"
        mcp = shapes.mcp_name(name, call.get("namespace"))
        if shapes.SHAPES.tools.get(name) == "command_execution":
            args = shapes.json_or_text(arguments)
            args = args if isinstance(args, dict) else {"command": arguments}
            self._command(call_id, args.get("command") or args.get("cmd"), code,
                          status if code is not None or success is not None else "completed", text, ts, out)
        elif mcp is not None:
            content = [{"type": "text", "text": text}]
            structured = shapes.json_or_text(text.strip())
            result = {"content": content, "structured_content": structured if isinstance(structured, dict) else None}
            self._mcp(call_id, mcp[0], mcp[1], shapes.json_or_text(arguments), None if failed else result,
                      {"message": text} if failed else None, status, ts, out)
        elif shapes.SHAPES.tools.get(name) == "file_change":
            self._once(call_id)
            patch = arguments if isinstance(arguments, str) else ""
            if patch.startswith("{"):
                decoded = shapes.json_or_text(patch)
                patch = text_of(decoded.get("input", "")) if isinstance(decoded, dict) else patch
            self._progress()
            self._item(out, {"id": call_id, "type": "file_change", "changes": shapes.patch_changes(patch),
                             "status": status}, ts)
        else:
            self._once(call_id)
            self._progress()
            self._item(out, {"id": call_id, "type": "tool_invocation", "tool_name": name,
                             "status": "completed", "arguments": shapes.json_or_text(arguments)}, ts)
            self._item(out, {"id": f"{call_id}:out", "type": "tool_output", "call_id": call_id, "status": status,
                             "output": bounded_output(text)}, ts)


TRANSLATORS = {"native": ExecTranslator, "rollout": RolloutTranslator}  # (memfs.agents.reader: kind -> translator)
