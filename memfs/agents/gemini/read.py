"""Gemini CLI chat files and ``--output-format stream-json`` → this event family (SPEC §10).

Shapes followed: Gemini CLI 0.61 (``chatRecordingService.ts``, ``chatRecordingTypes.ts``,
``output/types.ts``; the fixtures in ``tests/fixtures/agents/gemini``); which lines are whose:
:func:`memfs.agents.gemini.shapes.shape`. One translator reads both:

* **stream-json**: ``init``, ``message`` (the user's prompt; the model's text in ``delta``
  pieces), ``tool_use``/``tool_result`` (``tool_id``), ``error``, ``result`` (``status``,
  ``stats``, ``error``). A turn closes at ``result`` (``status: error`` → ``turn.failed``).
* **chat file** ``~/.gemini/tmp/<project>/chats/session-*.jsonl``: a metadata line, message
  records (``id``, ``type``, ``content``; a gemini record with ``thoughts``, ``tokens``,
  ``model``, and ``toolCalls`` once they completed — the same record written again with the
  same ``id``), ``{"$set": …}`` patches and ``{"$rewindTo": id}``. A sub-agent's chat is
  ``chats/<parent id>/<sub id>.jsonl``. No line ends a turn: a turn closes at the next
  prompt, at a new metadata line (a new run writing to the file; ``$set sessionId`` is no
  such mark: the CLI writes it when it compresses mid-turn too), when a ``$set messages``
  takes its prompt back out of the history (the request failed: ``turn.failed``), at a
  sub-agent's ``$set summary``, or at the end of an import when its last record is the
  model's answer (:meth:`GeminiTranslator.finish`); it completed when its last record is the
  model's answer, else it failed. A ``$set messages`` that replaces
  history by new records is the automatic compression: ``thread.compact_boundary``, and its
  ``<state_snapshot>`` summary as a ``harness`` item (a fact); what a ``$set`` carries is never
  imported again.

Items: text → ``agent_message``, thoughts → ``reasoning``, ``run_shell_command`` →
``command_execution`` (the exit code only the chat file has: the stream says ``success`` for
a command that exits 1), ``write_file``/``replace`` → ``file_change``, ``mcp_<server>_<tool>``
→ ``mcp_tool_call``, ``write_todos`` → ``todo_list``, ``google_web_search`` → ``web_search``,
a sub-agent's ``complete_task`` → ``agent_message``, other tools → ``tool_invocation`` with
its ``output`` (``invoke_agent``'s names the sub-agent's session: ``child_session``). A
prompt opens a turn: ``context`` with ``origin`` user, the prompt, its timestamp and, from a
chat file, ``turn_id`` = the prompt's record id (the stream has no id but the tools').

**Ids**, the same from either capture: a tool item's is the call's id (it starts at the call
and completes at the result); a text's is ``<K>:<n>:<text hash>`` (``K`` hashes the session
id and the prompt, ``~k`` added for its k-th repeat in one capture; ``n`` counts the turn's
texts); a failed turn with no item gets an ``error`` item ``<K>:failed``; a thought's (chat
file only) ``<record id>:t<n>``, appended after a shared item, so that a turn's first item is
one both captures have. Metadata (``self.meta``) never goes into the log.
"""

from __future__ import annotations

from typing import Any

from memfs.agents.changes import gemini_change
from memfs.agents.common import mcp_outcome
from memfs.agents.gemini.shapes import (
    AGENT,
    EXITED,
    FINAL_STATUSES,
    IGNORED_PROMPTS,
    SHELL_TOOL,
    WORKSPACE,
    add_usages,
    call_item,
    child_name,
    disjoint,
    function_responses,
    kind_of,
    parts_text,
    response_text,
    shape,
    shell_result,
    short_hash,
    stats_usage,
    usage_of,
)
from memfs.ingest import VarsState, bounded_output, bounded_prompt, dumps, parse_object, request_entry, stamp_close

ROLLED_BACK = "the request failed: Gemini CLI took the turn back out of its history"
ENDED_EARLY = "the run ended before Gemini answered"


class GeminiTranslator(VarsState):
    kind = "gemini"

    def __init__(self) -> None:
        self.sid: str | None = None
        self.subagent = False
        self.started = False  # thread.started emitted
        self.turn: dict | None = None  # the open turn (see _open)
        self.repeats: dict[str, int] = {}  # prompt hash -> times seen in this capture
        self.current: list[str] = []  # chat: ids of the CLI's history as the file says it
        self.text: dict | None = None  # stream: assistant text being streamed {"text", "ts"}
        self.meta: dict = {}
        self.file_meta: dict = {}  # chat: what the file says before its first turn (a file
        # holding no turn, like the one a resume leaves behind, says nothing of the session)

    # --- turns ---------------------------------------------------------------------------------

    def _note(self, key: str, value: Any, first: bool = False) -> None:
        """Metadata from a chat file's metadata or patches (held until the file has a turn)."""
        meta = self.meta if self.started else self.file_meta
        if first:
            meta.setdefault(key, value)
        else:
            meta[key] = value

    def _thread(self, out: list) -> None:
        if not self.started and self.sid:
            self.started = True
            for key, value in self.file_meta.items():
                self.meta.setdefault(key, value)
            self.file_meta = {}
            out.append(dumps({"type": "thread.started", "thread_id": self.sid, "agent": AGENT}))

    def _open(self, out: list, prompt: str = "", ts: Any = None, turn_id: str | None = None) -> dict:
        self._close(out)
        self._thread(out)
        prompt = prompt.strip()
        h = short_hash(self.sid or "", prompt)
        k = self.repeats[h] = self.repeats.get(h, 0) + 1
        key = f"g-{h}" + (f"~{k}" if k > 1 else "")
        context: dict = {}
        if prompt:
            context["origin"] = "user"
            context["prompt"] = bounded_prompt(prompt)
            self.meta.setdefault("first_prompt", bounded_prompt(prompt))
        if turn_id:
            context["turn_id"] = turn_id
        if isinstance(ts, str):
            context["timestamp"] = ts
        out.append(dumps({"type": "turn.started", "context": context} if context else {"type": "turn.started"}))
        self.turn = {"key": key, "prompt_id": turn_id, "msgs": 0, "shared": False, "held": [], "usage": {},
                     "tools": {}, "records": {}, "last": "prompt", "error": None, "ts": ts}
        self.meta["status"] = "running"
        return self.turn

    def _shared(self, out: list, event: dict) -> None:
        """Append an item both captures have; then the held chat-only items."""
        out.append(dumps(event))
        if not self.turn["shared"]:
            self.turn["shared"] = True
            out.extend(h.encode() for h in self.turn["held"])
            self.turn["held"] = []

    def _own(self, out: list, event: dict) -> None:
        """An item only this kind of capture has: held until the turn has a shared item."""
        if self.turn["shared"]:
            out.append(dumps(event))
        else:
            self.turn["held"].append(dumps(event).decode())

    def _close(self, out: list, failed: str | None = None, ts: Any = None, usage: dict | None = None) -> None:
        if self.turn is None:
            return
        self._flush_text(out)
        turn, self.turn = self.turn, None
        if failed is not None and not turn["shared"]:
            out.append(dumps({"type": "item.completed", "item": {
                "id": f"{turn['key']}:failed", "type": "error", "message": failed}}))
        out.extend(h.encode() for h in turn["held"])
        event: dict = {"type": "turn.failed", "message": failed} if failed is not None else {"type": "turn.completed"}
        event["usage"] = add_usages(turn["usage"].values()) if usage is None else usage
        ts = ts if isinstance(ts, str) else turn["ts"]
        if isinstance(ts, str):
            event["completed_at"] = ts
            if ts > self.meta.get("ended_at", ""):
                self.meta["ended_at"] = ts
        stamp_close(event, AGENT, [request_entry(model, disjoint(turn["usage"][rid]), at)
                                    for rid, (model, at) in turn.get("models", {}).items() if rid in turn["usage"]],
                    self.meta.get("model"))
        out.append(dumps(event))
        self.meta["status"] = "failed" if failed is not None else "completed"

    def _close_chat(self, out: list) -> None:
        """Close the open chat turn as its last record says (see the module docstring)."""
        if self.turn is None:
            return
        last = self.turn["last"]
        if last == "answer":
            self._close(out)
        elif last == "error":
            self._close(out, failed=self.turn["error"] or "error")
        else:
            self._close(out, failed=ENDED_EARLY)

    def finish(self) -> list[bytes]:
        """At the end of a one-shot import: close a chat file's last turn when its last record
        is the model's answer. A turn that ends otherwise stays open (the run may still be
        going: a later import goes on with it), as does a stream's turn without ``result``."""
        out: list[bytes] = []
        if self.turn is not None and self.turn.get("chat") and self.turn["last"] == "answer":
            self._close(out)
        return out

    def _message(self, out: list, text: str, ts: Any) -> str | None:
        """An ``agent_message`` (its id: see the module docstring)."""
        if not text.strip():
            return None
        if self.turn is None:
            self._open(out, ts=ts)
        iid = f"{self.turn['key']}:{self.turn['msgs']}:{short_hash(text.strip(), n=8)}"
        self.turn["msgs"] += 1
        self._shared(out, {"type": "item.completed", "item": {"id": iid, "type": "agent_message", "text": text}})
        return iid

    # --- tools ---------------------------------------------------------------------------------

    def _tool_call(self, out: list, tid: str, name: str, args: dict, display: Any = None) -> None:
        """A call seen before its result: its item starts (``in_progress``); todos and reports
        are whole at the call; a file change waits for its result."""
        kind = kind_of(name)
        item = call_item(tid, name, args, "in_progress", display)
        if kind in ("todo_list", "report"):
            self._shared(out, {"type": "item.completed", "item": item})
        elif kind != "file_change":
            self._shared(out, {"type": "item.started", "item": item})
        self.turn["tools"][tid] = {"name": name, "args": args, "done": False}

    def _tool_done(self, out: list, tid: str, name: str, args: dict, *, failed: bool, output: str,
                   exit_code: int | None = None, display: Any = None, extra: dict | None = None,
                   new_file: bool = False, result: Any = None) -> None:
        """A call's result: complete its item (the call's item first when it was not seen);
        ``result``: the chat file's ``resultDisplay`` (a file change's ``fileDiff``)."""
        tools = self.turn["tools"]
        entry = tools.get(tid)
        if entry is not None and entry["done"]:
            return
        kind = kind_of(name)
        if entry is None and kind in ("todo_list", "report"):
            self._tool_call(out, tid, name, args, display)
        tools[tid] = {"name": name, "args": args, "done": True}
        if kind in ("todo_list", "report"):
            return
        item = call_item(tid, name, args, "failed" if failed else "completed", display)
        if extra:
            item.update(extra)
        if kind == "command_execution":
            item["aggregated_output"] = bounded_output(output)
            if exit_code is not None:
                item["exit_code"] = exit_code
        elif kind == "file_change":
            if new_file:
                item["changes"][0]["kind"] = "add"
            gemini_change(item["changes"][0], args, result)
        elif kind == "mcp_tool_call":
            item["result"], item["error"] = mcp_outcome(output, failed)
        elif kind == "tool":
            item["output"] = bounded_output(output)
        self._shared(out, {"type": "item.completed", "item": item})

    # --- lines ---------------------------------------------------------------------------------

    def feed(self, raw: bytes) -> list[bytes]:
        obj = parse_object(raw, "gemini")
        out: list[bytes] = []
        which = shape(obj)
        if which == "stream":
            self._stream(obj, out)
        elif which == "chat":
            self._chat(obj, out)
        return out

    # stream-json

    def _flush_text(self, out: list) -> None:
        pending, self.text = self.text, None
        if pending and self.turn is not None:
            self._message(out, pending["text"], pending["ts"])

    def _stream(self, obj: dict, out: list) -> None:
        kind, ts = obj.get("type"), obj.get("timestamp")
        if kind == "message" and obj.get("role") == "assistant":
            text = obj.get("content") if isinstance(obj.get("content"), str) else ""
            if self.turn is None:
                self._open(out, ts=ts)
            if self.text is None:
                self.text = {"text": "", "ts": ts}
            self.text["text"] += text
            if obj.get("delta") is not True:
                self._flush_text(out)
            return
        self._flush_text(out)
        if kind == "init":
            if self.sid is None:
                self.sid = obj["session_id"]
                self.meta.update(conversation_id=self.sid, agent=AGENT)
                if isinstance(ts, str):
                    self.meta.setdefault("started_at", ts)
            if isinstance(obj.get("model"), str) and obj["model"]:
                self.meta["model"] = obj["model"]
        elif kind == "message":
            prompt = obj.get("content") if isinstance(obj.get("content"), str) else ""
            self._open(out, prompt, ts)
        elif kind == "tool_use":
            if self.turn is None:
                self._open(out, ts=ts)
            tid, name = str(obj.get("tool_id")), str(obj.get("tool_name"))
            args = obj.get("parameters") if isinstance(obj.get("parameters"), dict) else {}
            if tid not in self.turn["tools"]:
                self._tool_call(out, tid, name, args)
        elif kind == "tool_result":
            if self.turn is None:
                self._open(out, ts=ts)
            tid = str(obj.get("tool_id"))
            call = self.turn["tools"].get(tid) or {"name": "tool", "args": {}}
            failed = obj.get("status") == "error"
            error = obj.get("error") if isinstance(obj.get("error"), dict) else {}
            output = obj.get("output") if isinstance(obj.get("output"), str) else ""
            if failed and isinstance(error.get("message"), str):
                output = output + ("\n" if output else "") + error["message"]
            exit_code = None
            if call["name"] == SHELL_TOOL:
                m = EXITED.match(output)
                if m:
                    exit_code, failed = int(m.group(1)), failed or m.group(1) != "0"
            self._tool_done(out, tid, call["name"], call["args"], failed=failed, output=output, exit_code=exit_code)
        elif kind == "error":
            message = obj.get("message") if isinstance(obj.get("message"), str) else "error"
            if self.turn is None:
                out.append(dumps({"type": "error", "message": message}))
                return
            n = self.turn["errors"] = self.turn.get("errors", 0) + 1
            self._own(out, {"type": "item.completed", "item": {
                "id": f"{self.turn['key']}:error:{n}", "type": "error", "message": message}})
            if obj.get("severity") == "error":
                self.turn["error"] = message
        elif kind == "result":
            if self.turn is None:
                self._open(out, ts=ts)
            usage = stats_usage(obj.get("stats"))
            if obj.get("status") == "error":
                error = obj.get("error") if isinstance(obj.get("error"), dict) else {}
                message = error.get("message") if isinstance(error.get("message"), str) else None
                self._close(out, failed=message or self.turn["error"] or "error", ts=ts, usage=usage)
            else:
                self._close(out, ts=ts, usage=usage)

    # chat file

    def _chat(self, obj: dict, out: list) -> None:
        patch = obj.get("$set")
        if isinstance(patch, dict):
            self._patch(patch, out)
        elif isinstance(obj.get("$rewindTo"), str):
            self._rewind(obj["$rewindTo"], out)
        elif "type" not in obj:
            self._metadata(obj, out)
        else:
            self._record(obj, out)

    def _metadata(self, obj: dict, out: list) -> None:
        if self.turn is not None:  # a new run writing to the same file: the last one ended
            self._close_chat(out)
        if self.sid is None:
            self.sid = obj["sessionId"]
            self.subagent = obj.get("kind") == "subagent"
            for key, value in (("conversation_id", self.sid), ("agent", AGENT),
                               ("project_hash", obj.get("projectHash")), ("started_at", obj.get("startTime"))):
                if isinstance(value, str):
                    self._note(key, value, first=True)
        self._patch({k: v for k, v in obj.items() if k in ("lastUpdated", "summary", "directories", "messages")},
                    out, legacy=True)

    def _patch(self, patch: dict, out: list, legacy: bool = False) -> None:
        if isinstance(patch.get("lastUpdated"), str):
            self._note("ended_at", patch["lastUpdated"])
        dirs = patch.get("directories")
        if isinstance(dirs, list) and dirs and isinstance(dirs[0], str):
            self._note("cwd", dirs[0], first=True)
        summary = patch.get("summary")
        if isinstance(summary, str) and summary.strip():
            if self.subagent:  # the sub-agent's result: it is done
                if self.turn is not None:
                    self.turn["last"] = "answer"
                    self._close_chat(out)
            else:
                self._note("title", summary.strip()[:200])
                self._note("title_source", "agent")
        messages = patch.get("messages")
        if isinstance(messages, list):
            records = [m for m in messages if isinstance(m, dict) and isinstance(m.get("id"), str)]
            if legacy:  # a whole conversation on the metadata line (older CLIs)
                for m in records:
                    self._record(m, out)
            else:
                self._history(records, out, patch.get("lastUpdated"))

    def _history(self, records: list[dict], out: list, ts: Any = None) -> None:
        """A ``$set messages``: the CLI's history replaced (resume, rollback, compression)."""
        for m in records:
            self._context(m)
        ids = [m["id"] for m in records]
        new = set(ids)
        known = set(self.current)
        gone = [i for i in self.current if i not in new]
        fresh = [m for m in records if m["id"] not in known and not function_responses(m.get("content"))
                 and not m["id"].endswith("_response")]
        if gone and fresh:  # compression: history replaced by a summary and re-recorded messages
            snapshot = next((m for m in fresh if m.get("type") == "user"
                             and "<state_snapshot>" in parts_text(m.get("content"))), None)
            out.append(dumps({"type": "thread.compact_boundary", "thread_id": self.sid or "", "trigger": "auto",
                              "mode": "summary" if snapshot else "truncation",
                              "original_message_count": len(self.current), "compacted_message_count": len(ids)}))
            if snapshot is not None:  # the summary, as a fact
                text = parts_text(snapshot.get("content")).strip()
                text = text.removeprefix("<state_snapshot>").removesuffix("</state_snapshot>").strip()
                item = {"type": "item.completed", "item": {"id": snapshot["id"], "type": "harness",
                                                           "event": "compact_summary", "message": bounded_output(text)}}
                if self.turn is not None:
                    self._own(out, item)
                else:
                    out.append(dumps(item))
        elif self.turn is not None and self.turn["prompt_id"] and self.turn["prompt_id"] not in new \
                and self.turn["prompt_id"] in known:
            self._close(out, failed=self.turn["error"] or ROLLED_BACK, ts=ts)  # the request failed
        self.current = ids

    def _rewind(self, target: str, out: list) -> None:
        if target in self.current:
            cut = self.current.index(target)
            if self.turn is not None and self.turn["prompt_id"] in self.current[cut:]:
                self._close(out, failed="rewound by the user")
            self.current = self.current[:cut]

    def _context(self, record: dict) -> None:
        """Metadata from the CLI's ``<session_context>`` message (the workspace)."""
        if record.get("type") != "user":
            return
        text = parts_text(record.get("content"))
        if text.lstrip().startswith("<session_context>"):
            m = WORKSPACE.search(text)
            if m:
                self._note("cwd", m.group(1).strip(), first=True)

    def _record(self, rec: dict, out: list) -> None:
        rid, rtype, ts = rec["id"], rec.get("type"), rec.get("timestamp")
        if rid not in self.current:
            self.current.append(rid)
        if rtype == "user":
            self._user(rec, out)
        elif rtype == "gemini":
            self._gemini(rec, out)
        elif rtype == "error":
            text = parts_text(rec.get("content")).strip() or "error"
            if self.turn is None:
                out.append(dumps({"type": "error", "message": text}))
                return
            if rid not in self.turn["records"]:
                self.turn["records"][rid] = {}
                self._own(out, {"type": "item.completed", "item": {"id": rid, "type": "error", "message": text}})
            self.turn.update(last="error", error=text, ts=ts if isinstance(ts, str) else self.turn["ts"])

    def _user(self, rec: dict, out: list) -> None:
        self._context(rec)
        content = rec.get("content")
        responses = function_responses(content)
        if responses:  # tool results: the call's record usually has them already
            if self.turn is None:
                return
            for fr in responses:
                tid = fr.get("id")
                entry = self.turn["tools"].get(tid) if isinstance(tid, str) else None
                if entry is not None and not entry["done"]:
                    text, error = response_text([{"functionResponse": fr}])
                    self._chat_tool_done(out, {"id": tid, "name": entry["name"], "args": entry["args"],
                                               "status": "error" if error else "success"}, text)
            self.turn["last"] = "tool_response"
            if isinstance(rec.get("timestamp"), str):
                self.turn["ts"] = rec["timestamp"]
            return
        text = parts_text(rec.get("displayContent")) or parts_text(content)
        if not text.strip() or text.lstrip().startswith(IGNORED_PROMPTS):
            return
        if self.turn is not None and self.turn["prompt_id"] == rec["id"]:
            return  # the prompt written again
        self._close_chat(out)
        self._open(out, text, rec.get("timestamp"), turn_id=rec["id"])
        self.turn["chat"] = True

    def _gemini(self, rec: dict, out: list) -> None:
        rid, ts = rec["id"], rec.get("timestamp")
        if self.turn is None:
            self._open(out, ts=ts)["chat"] = True
        turn = self.turn
        seen = turn["records"].setdefault(rid, {"text": None, "thoughts": 0})
        if isinstance(rec.get("model"), str) and rec["model"]:
            self.meta["model"] = rec["model"]
        usage = usage_of(rec.get("tokens"))
        if usage:
            turn["usage"][rid] = usage
            turn.setdefault("models", {}).setdefault(rid, [rec.get("model"), ts])
        text = parts_text(rec.get("content"))
        if seen["text"] is None and text.strip():
            seen["text"] = self._message(out, text, ts)
        calls = [c for c in rec.get("toolCalls") or [] if isinstance(c, dict) and isinstance(c.get("id"), str)]
        for call in calls:
            self._chat_call(out, call)
        thoughts = rec.get("thoughts") if isinstance(rec.get("thoughts"), list) else []
        for i in range(seen["thoughts"], len(thoughts)):
            t = thoughts[i] if isinstance(thoughts[i], dict) else {}
            body = "\n".join(str(t.get(k)).strip() for k in ("subject", "description") if t.get(k))
            if body:
                self._own(out, {"type": "item.completed", "item": {"id": f"{rid}:t{i}", "type": "reasoning",
                                                                   "text": body}})
        seen["thoughts"] = max(seen["thoughts"], len(thoughts))
        if calls:
            turn["last"] = "tools"
        elif text.strip() or thoughts:
            turn["last"] = "answer"
        if isinstance(ts, str):
            turn["ts"] = ts

    def _chat_call(self, out: list, call: dict) -> None:
        tid, name = call["id"], str(call.get("name") or "tool")
        args = call.get("args") if isinstance(call.get("args"), dict) else {}
        entry = self.turn["tools"].get(tid)
        if call.get("status") not in FINAL_STATUSES:
            if entry is None:
                self._tool_call(out, tid, name, args, call.get("displayName"))
            return
        if entry is not None and entry["done"]:
            return
        text, error = response_text(call.get("result"))
        self._chat_tool_done(out, call, text, error)

    def _chat_tool_done(self, out: list, call: dict, text: str, error: bool = False) -> None:
        tid, name = call["id"], str(call.get("name") or "tool")
        args = call.get("args") if isinstance(call.get("args"), dict) else {}
        display = call.get("resultDisplay")
        failed = error or call.get("status") in ("error", "cancelled")
        exit_code, extra, new_file = None, None, False
        output = text
        if name == SHELL_TOOL:
            output, exit_code, shell_failed = shell_result(text)
            failed = failed or shell_failed
        elif kind_of(name) == "file_change" and isinstance(display, dict):
            new_file = display.get("isNewFile") is True or ("originalContent" in display
                                                            and display["originalContent"] is None)
        child = child_name(self.sid, call.get("agentId"))
        if child:
            extra = {"child_session": child}
            children = self.meta.setdefault("children", [])
            if child not in children:
                children.append(child)
        self._tool_done(out, tid, name, args, failed=failed, output=output, exit_code=exit_code,
                        display=call.get("displayName"), extra=extra, new_file=new_file, result=display)


TRANSLATORS = {"gemini": GeminiTranslator}  # (memfs.agents.reader: kind -> translator)
