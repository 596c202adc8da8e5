"""Claude Code ``stream-json`` output and Claude Code transcripts → this event family (SPEC §8, §10).

Shapes followed (checked against Claude Code 2.1.332, see docs/agents.md; older 1.x–2.x shapes
kept working): ``claude -p --output-format stream-json --verbose`` (``system``/``init``,
``assistant`` and ``user`` messages carrying Anthropic API content blocks, a final ``result``),
and the transcripts Claude Code writes to ``~/.claude/projects/<project>/<session>.jsonl``
(``user``, ``assistant``, ``system`` lines with ``uuid``, ``sessionId``, ``timestamp``,
``message``, and many metadata lines), sub-agents' transcripts
(``<session>/subagents/agent-<id>.jsonl``) included. One translator reads both: they share the
message shapes and the ids, so a run read from its stream and from its transcript gives the
same item ids (SPEC §10 "Identity"; the ingest drops what a session already holds).

The mapping:

* Ids: a tool call's item is the ``tool_use.id`` (its result completes that same item, see
  :mod:`memfs.agents.claude.tools`); a text or thinking block is ``<message.id>:<n>``, ``n``
  counting the blocks of that API message across the lines it is split over (a text block that
  memfs's export folded from an item Claude has no shape for — reasoning, a plan, a harness
  event, … — named in its line's ``memfs`` mark, is that item again); an API retry is
  ``<message.id>:retry<attempt>`` of the message that followed it.
* ``thread.started`` (``"agent": "claude"``) with the session id as ``thread_id`` (a
  sub-agent's transcript: ``<session>.agent-<id>``) opens at the first line that opens a turn:
  a transcript of metadata lines only translates to nothing.
* A prompt (a ``user`` text that is not ``isMeta``, not a command caveat
  ``<command-…>``/``<local-command-…>``, not a tool result, not a compaction summary) closes the
  open turn and opens a new one: ``turn.started`` with ``context`` ``{origin: "user", turn_id:
  promptId (else the line's uuid), prompt (first 4 KiB), timestamp}``. ``stream-json`` does not
  repeat the prompt: its turn opens at the first message, without a prompt.
* A turn closes with ``turn.completed`` (usage of its API messages, each counted once however
  many lines repeat it; ``stream-json``: the ``result``'s usage) at the next prompt, at a
  transcript message whose ``stop_reason`` ends the turn, at ``system/turn_duration``, at a
  local command's output; with ``turn.failed`` at Claude Code's ``[Request interrupted by
  user…]`` ("interrupted by user"), at an API error message (``isApiErrorMessage``, or a
  ``<synthetic>`` message with an ``error``: its text, plus ``(HTTP n)`` when the status is not
  in it), at a ``result`` with ``is_error`` (its text, errors or subtype), at a transcript
  ``system/api_error`` with no retry left. ``system/api_retry`` (stream) and retrying
  ``system/api_error`` (transcript) lines are ``error`` items ("API retry 1/2: …").
* ``result`` → the turn's close (when the run's turn is still open; a successful run with
  ``num_turns: 0`` and no turn, a local command, has none) and ``thread.completed``
  (``subtype`` ``error_during_execution`` when ``is_error`` says a ``success`` failed).
* ``system/compact_boundary`` → ``thread.compact_boundary`` (a manual ``/compact`` is a turn
  of its own); the ``isCompactSummary`` user message → a ``harness`` item (``compact_summary``)
  whose message, the summary, is a fact.
* A sub-agent's lines in its parent's record (``stream-json`` lines with a
  ``parent_tool_use_id``, transcript lines with ``isSidechain``) are not the parent's: they
  are skipped; the parent's ``Agent``/``Task`` call item names the child session
  (``child_session``). A sub-agent's own transcript is a session of its own, with
  ``parent_session`` in its metadata.
* Metadata: :attr:`ClaudeTranslator.meta` holds what the record says of the conversation
  (:mod:`memfs.store.about` keys: model, cwd, git branch, version, title from
  ``custom-title``/``ai-title``/``summary`` lines, PR link, first prompt, times, status). Every
  other line type (``queue-operation``, ``attachment``, ``last-prompt``, ``api-request*``,
  ``mode``, ``file-history-snapshot``, …) translates to nothing.
* ``cost-state`` (the transcript's record of Claude Code's bill: ``totalCostUSD``, the
  conversation's running cost, carried on across a resume, written when a run's turn is done)
  → ``thread.completed`` with that ``total_cost_usd``, as the stream's ``result`` gives it — so
  either capture keeps the agent's own cost, and the views give each turn the growth. Only
  outside a turn, once the conversation has one, and not again for the same total.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from memfs import counts
from memfs.agents import CLAUDE
from memfs.agents.claude.shapes import SHAPES
from memfs.agents.claude.tools import (
    apply_task,
    call_item,
    child_session,
    kind_of,
    result_item,
    result_output,
    todo_item,
    unfold,
)
from memfs.agents.common import read_usage, request_tokens
from memfs.ingest import bounded_prompt, dumps, parse_object, request_entry, stamp_close, text_of

TURN_ENDING_STOPS = ("end_turn", "stop_sequence", "max_tokens", "refusal")
INTERRUPTED = "[Request interrupted by user"
SYNTHETIC = "<synthetic>"
TITLE_CHARS = 200
_NOT_PROMPTS = ("<command-", "<local-command-caveat", "<system-reminder>", "<bash-input>", "<bash-stdout>",
                "<bash-stderr>", "<user-memory-input>")
_LOCAL_OUTPUT = ("<local-command-stdout>", "<local-command-stderr>")
_CONTINUED = "This session is being continued from a previous conversation"
_TITLES = {"summary": ("summary", 1), "ai-title": ("aiTitle", 2), "custom-title": ("customTitle", 3)}
_STATE = ("thread_id", "session_id", "started", "in_turn", "turns", "run_closed", "turn_usage", "turn_models",
          "pending", "msg",
          "retries", "tasks", "sidechain", "agent_id", "children", "meta", "title_rank", "n", "cost_seen")


def usage_of(u: Any) -> dict:
    """A Claude usage object as this family's Usage (:data:`SHAPES`: disjoint, kept so)."""
    return read_usage(SHAPES.usage, u)


def _with_status(text: str, status: Any) -> str:
    """An error text that names its HTTP status."""
    if type(status) is int and str(status) not in text:
        return f"{text} (HTTP {status})"
    return text


def _summary_of(text: str) -> str:
    """The summary in a compaction's continuation message (the whole text when it has no
    ``Summary:`` part)."""
    _, found, rest = text.partition("Summary:\n")
    if found:
        for end in ("\n\nIf you need specific details", "\nContinue the conversation from where"):
            rest = rest.split(end, 1)[0]
        text = rest
    return bounded_prompt(text.strip())


def subagent_meta(text: str | None) -> dict:
    """What a sub-agent's ``agent-<id>.meta.json`` says (``memfs.store.about`` keys): its task's
    description as the title, its model."""
    try:
        data = orjson.loads(text) if text else None
    except orjson.JSONDecodeError:
        return {}
    if not isinstance(data, dict):
        return {}
    out = {}
    if isinstance(data.get("description"), str) and data["description"].strip():
        out["title"], out["title_source"] = " ".join(data["description"].split())[:TITLE_CHARS], "agent"
    if isinstance(data.get("model"), str) and data["model"]:
        out["model"] = data["model"]
    return out


class ClaudeTranslator:
    """One Claude Code record (stream or transcript) → events; see the module docstring.
    ``reader`` (set by the runner: :class:`memfs.ingest.sidefiles.SideReader`) reads the
    ``tool-results/`` files a transcript names."""

    kind = "claude"

    def __init__(self, reader: Callable[[str], str | None] | None = None) -> None:
        self.reader = reader
        self.thread_id: str | None = None
        self.session_id: str | None = None  # the conversation id the lines give
        self.started = False  # thread.started emitted
        self.in_turn = False
        self.turns = 0
        self.run_closed = False  # a turn closed since this run's init (its result opens none)
        self.turn_usage: dict[str, dict] = {}  # API message id -> usage, this turn
        self.turn_models: dict[str, list] = {}  # API message id -> [model, time of its first line], this turn
        self.pending: dict[str, dict] = {}  # tool_use id -> {name, input}
        self.msg: list = ["", 0]  # the API message being read, its next block index
        self.retries: list[list] = []  # [attempt, text] of API retries not yet placed
        self.tasks: list[dict] = []  # TaskCreate/TaskUpdate list: [{id, subject, status}]
        self.sidechain: bool | None = None  # a sub-agent's own transcript (told by its first line)
        self.agent_id: str | None = None
        self.children: dict[str, str] = {}  # tool_use id -> child session (stream task_started)
        self.meta: dict = {"agent": CLAUDE}
        self.title_rank = 0
        self.n = 0  # counter for ids a line does not give
        self.cost_seen: list = [0, None]  # [turns, total] at the last cost-state translated

    # state for resuming (import --follow)

    def state(self) -> dict:
        return {key: getattr(self, key) for key in _STATE}

    def restore(self, state: dict) -> None:
        for key, value in state.items():
            if key in _STATE:
                setattr(self, key, value)

    # helpers

    def _id(self) -> str:
        self.n += 1
        return f"claude-{self.n}"

    def _thread(self, obj: dict, out: list) -> None:
        if self.session_id is None:
            sid = obj.get("session_id") or obj.get("sessionId")
            if isinstance(sid, str) and sid:
                self.session_id = sid
        if self.started or not self.session_id:
            return
        self.started = True
        self.thread_id = self.session_id
        if self.sidechain:
            child = child_session(self.session_id, self.agent_id)
            self.thread_id = child or f"{self.session_id}.sidechain"
            self.meta["parent_session"] = self.session_id
            if child and self.reader is not None:
                self.meta.update(subagent_meta(self.reader(f"{self.session_id}/subagents/agent-{self.agent_id}.meta.json")))
        self.meta["conversation_id"] = self.thread_id
        out.append(dumps({"type": "thread.started", "thread_id": self.thread_id, "agent": CLAUDE}))

    def _ours(self, obj: dict) -> bool:
        """False for a sub-agent's line in its parent's record."""
        if obj.get("parent_tool_use_id"):
            return False
        side = obj.get("isSidechain")
        if self.sidechain is None and type(side) is bool:
            self.sidechain = side
            agent = obj.get("agentId")
            self.agent_id = agent if isinstance(agent, str) else None
        return not (side is True and self.sidechain is False)

    def _context(self, obj: dict) -> None:
        meta = self.meta
        for src, dst in (("cwd", "cwd"), ("gitBranch", "git_branch"), ("version", "agent_version")):
            value = obj.get(src)
            if isinstance(value, str) and value:
                meta[dst] = value
        ts = obj.get("timestamp")
        if isinstance(ts, str) and ts:
            meta.setdefault("started_at", ts)
            meta["ended_at"] = ts

    def _open(self, obj: dict, out: list, prompt: str | None = None, turn_id: Any = None) -> None:
        if self.in_turn:
            return
        self._thread(obj, out)
        self.in_turn = True
        self.turn_usage, self.turn_models = {}, {}
        self.meta["status"] = "running"
        context: dict = {}
        if prompt is not None:
            tid = obj.get("promptId") or obj.get("uuid")
            context["origin"] = "user"
            if isinstance(tid, str) and tid:
                context["turn_id"] = tid
            context["prompt"] = bounded_prompt(prompt)
        elif isinstance(turn_id, str) and turn_id:
            context["turn_id"] = turn_id
        ts = obj.get("timestamp")
        if isinstance(ts, str):
            context["timestamp"] = ts
        event: dict = {"type": "turn.started"}
        if context:
            event["context"] = context
        out.append(dumps(event))

    def _close(self, obj: dict, out: list, failed: str | None = None, usage: dict | None = None) -> None:
        if not self.in_turn:
            return
        self._place_retries(out, None)
        self.in_turn = False
        self.run_closed = True
        self.turns += 1
        event: dict = {"type": "turn.failed", "message": failed} if failed is not None else {"type": "turn.completed"}
        if usage is None:
            usage = {}
            for u in self.turn_usage.values():
                counts.add(usage, u)
        event["usage"] = usage
        ts = obj.get("timestamp")
        if isinstance(ts, str):
            event["completed_at"] = ts
        stamp_close(event, CLAUDE, self._requests(), self.meta.get("model"))
        out.append(dumps(event))
        self.turn_usage, self.turn_models = {}, {}
        self.meta["status"] = "failed" if failed is not None else "completed"

    def _requests(self) -> list[dict]:
        """The turn's API requests (one per message id, its usage counted once), in order."""
        out = []
        for mid, u in self.turn_usage.items():
            model, at = self.turn_models.get(mid) or (None, None)
            out.append(request_entry(model, request_tokens(SHAPES.usage, u), at))
        return out

    def _retry(self, obj: dict, out: list, attempt: Any, text: str) -> None:
        self._open(obj, out)
        self.retries.append([attempt if type(attempt) is int else len(self.retries) + 1, text])

    def _place_retries(self, out: list, anchor: str | None) -> None:
        """The pending API retries as ``error`` items, before the message that followed them."""
        for attempt, text in self.retries:
            iid = f"{anchor}:retry{attempt}" if anchor else self._id()
            out.append(dumps({"type": "item.completed", "item": {"id": iid, "type": "error", "message": text}}))
        self.retries = []

    # lines

    def feed(self, raw: bytes) -> list[bytes]:
        obj = parse_object(raw, "claude")
        kind = obj.get("type")
        out: list[bytes] = []
        if kind in ("user", "assistant", "system", "result"):
            if self._ours(obj):
                self._context(obj)
                getattr(self, "_" + kind)(obj, out)
        elif kind in _TITLES:
            key, rank = _TITLES[kind]
            title = obj.get(key)
            if isinstance(title, str) and title.strip() and rank >= self.title_rank:
                self.title_rank = rank
                self.meta["title"] = " ".join(title.split())[:TITLE_CHARS]
                self.meta["title_source"] = "agent"
        elif kind == "attachment":  # the model the session runs on (messages then name the one used)
            att = obj.get("attachment")
            ident = att.get("identity") if isinstance(att, dict) and att.get("type") == "model" else None
            model = ident.get("modelId") if isinstance(ident, dict) else None
            if isinstance(model, str) and model and not obj.get("isSidechain"):
                self.meta.setdefault("model", model)
        elif kind == "cost-state":
            self._cost_state(obj, out)
        elif kind == "pr-link":
            url, repo, number = obj.get("prUrl") or obj.get("url"), obj.get("prRepository"), obj.get("prNumber")
            if isinstance(url, str) and url:
                self.meta["pr_link"] = url[:1024]
            elif isinstance(repo, str) and type(number) is int:
                self.meta["pr_link"] = f"{repo}#{number}"[:1024]
        return out

    def _cost_state(self, obj: dict, out: list) -> None:
        cost = obj.get("totalCostUSD")
        if type(cost) not in (int, float) or cost < 0 or self.in_turn or not self.started or self.sidechain \
                or self.cost_seen == [self.turns, cost]:
            return
        self.cost_seen = [self.turns, cost]
        failed = self.meta.get("status") == "failed"
        out.append(dumps({"type": "thread.completed", "thread_id": self.thread_id or "",
                          "session_id": self.thread_id or "", "subtype": "error_during_execution" if failed else "success",
                          "outcome_code": "error" if failed else "completed", "usage": {}, "num_turns": self.turns,
                          "total_cost_usd": cost}))

    def _system(self, obj: dict, out: list) -> None:
        sub = obj.get("subtype")
        if sub == "init":
            self.run_closed = False
            self._thread(obj, out)
            for src, dst in (("model", "model"), ("claude_code_version", "agent_version")):
                if isinstance(obj.get(src), str) and obj[src]:
                    self.meta[dst] = obj[src]
        elif sub == "api_retry":  # stream-json
            status = obj.get("error_status")
            text = f"API retry {obj.get('attempt')}/{obj.get('max_retries')}: {obj.get('error') or 'error'}"
            self._retry(obj, out, obj.get("attempt"), _with_status(text, status))
        elif sub == "api_error":  # transcript
            error = obj.get("error") if isinstance(obj.get("error"), dict) else {}
            what = error.get("formatted") or error.get("message") or obj.get("content") or "API error"
            what = _with_status(str(what), error.get("status"))
            if type(obj.get("retryAttempt")) is int:
                self._retry(obj, out, obj["retryAttempt"],
                            f"API retry {obj['retryAttempt']}/{obj.get('maxRetries')}: {what}")
            else:
                self._open(obj, out)
                self._close(obj, out, failed=f"API Error: {what}")
        elif sub == "compact_boundary":
            meta = obj.get("compactMetadata") or obj.get("compact_metadata")
            meta = meta if isinstance(meta, dict) else {}
            trigger = meta.get("trigger") if isinstance(meta.get("trigger"), str) else "auto"
            if trigger == "manual":  # /compact: a turn of its own
                self._close(obj, out)
            self._open(obj, out, turn_id=obj.get("uuid"))
            event = {"type": "thread.compact_boundary", "thread_id": self.thread_id or "", "trigger": trigger,
                     "mode": "summary", "original_message_count": 0, "compacted_message_count": 0}
            for src, alt, dst in (("preTokens", "pre_tokens", "pre_tokens"), ("postTokens", "post_tokens", "post_tokens")):
                value = meta.get(src, meta.get(alt))
                if type(value) is int and value >= 0:
                    event[dst] = value
            out.append(dumps(event))
        elif sub == "turn_duration":
            self._close(obj, out)
        elif sub == "task_started":  # stream-json: a sub-agent started for a tool call
            child = child_session(self.session_id, obj.get("task_id"))
            if child and isinstance(obj.get("tool_use_id"), str):
                self.children[obj["tool_use_id"]] = child

    def _user(self, obj: dict, out: list) -> None:
        message = obj.get("message")
        if not isinstance(message, dict) or obj.get("isMeta") is True:
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
        if not text.strip():
            return
        head = text.lstrip()
        if obj.get("isCompactSummary") is True or head.startswith(_CONTINUED):
            self._open(obj, out)
            uuid = obj.get("uuid")
            out.append(dumps({"type": "item.completed", "item": {
                "id": uuid if isinstance(uuid, str) and uuid else self._id(), "type": "harness",
                "event": "compact_summary", "message": _summary_of(text)}}))
            return
        if obj.get("isVisibleInTranscriptOnly") is True or head.startswith(_NOT_PROMPTS):
            return
        if head.startswith(INTERRUPTED):
            self._close(obj, out, failed="interrupted by user")
            return
        if head.startswith(_LOCAL_OUTPUT):  # a local command (/compact, …) ran: its turn is over
            self._close(obj, out)
            return
        self._close(obj, out)
        self._open(obj, out, prompt=text)
        self.meta.setdefault("first_prompt", bounded_prompt(text))

    def _assistant(self, obj: dict, out: list) -> None:
        message = obj.get("message")
        if not isinstance(message, dict):
            return
        mid = message.get("id") if isinstance(message.get("id"), str) and message["id"] else obj.get("uuid")
        mid = mid if isinstance(mid, str) and mid else None
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else \
            content if isinstance(content, list) else []
        model = message.get("model")
        if obj.get("isApiErrorMessage") is True or obj.get("is_api_error_message") is True or (
                model == SYNTHETIC and isinstance(obj.get("error"), str)):
            text = text_of(blocks).strip() or f"API Error: {obj.get('error') or 'unknown'}"
            self._open(obj, out)
            self._place_retries(out, mid)
            self._close(obj, out, failed=_with_status(text, obj.get("apiErrorStatus", obj.get("api_error_status"))))
            return
        if model == SYNTHETIC:  # Claude Code's own placeholder ("No response requested."), not the model's
            return
        if isinstance(model, str) and model:
            self.meta["model"] = model
        self._open(obj, out)
        self._place_retries(out, mid)
        usage = usage_of(message.get("usage"))
        if usage:
            key = mid or f"#{len(self.turn_usage)}"
            self.turn_usage[key] = usage
            if key not in self.turn_models:
                self.turn_models[key] = [model if isinstance(model, str) and model else None, obj.get("timestamp")]
        if mid is None or mid != self.msg[0]:
            self.msg = [mid or "", 0]
        folded = unfold(obj, blocks)  # what memfs's export folded into text, restored
        for position, block in enumerate(blocks):
            index = self.msg[1]
            self.msg[1] += 1
            if not isinstance(block, dict):
                continue
            btype = block.get("type")
            bid = f"{mid}:{index}" if mid else None
            if position in folded:
                out.append(self._unfolded(folded[position], bid))
            elif btype == "text" and isinstance(block.get("text"), str) and block["text"].strip():
                out.append(dumps({"type": "item.completed",
                                  "item": {"id": bid or self._id(), "type": "agent_message", "text": block["text"]}}))
            elif btype == "thinking" and isinstance(block.get("thinking"), str) and block["thinking"].strip():
                out.append(dumps({"type": "item.completed",
                                  "item": {"id": bid or self._id(), "type": "reasoning", "text": block["thinking"]}}))
            elif btype == "tool_use":
                self._tool_use(block, out)
        if message.get("stop_reason") in TURN_ENDING_STOPS and "session_id" not in obj:
            self._close(obj, out)  # a transcript's turn-ending message (stream-json waits for result)

    def _unfolded(self, item: dict, bid: str | None) -> bytes:
        """The line of an item memfs's export folded into text: the item, or the compaction
        boundary its note stands for."""
        boundary = item.get("boundary")
        if item.get("type") == "harness" and item.get("event") == "compact_boundary" and isinstance(boundary, dict):
            event = {k: v for k, v in boundary.items() if k in ("trigger", "mode") and isinstance(v, str)
                     or type(v) is int and v >= 0}
            return dumps({"trigger": "auto", "mode": "summary", "original_message_count": 0,
                          "compacted_message_count": 0, **event,
                          "type": "thread.compact_boundary", "thread_id": self.thread_id or ""})
        return dumps({"type": "item.completed", "item": {"id": bid or self._id(), **item}})

    def _tool_use(self, block: dict, out: list) -> None:
        name = block.get("name") if isinstance(block.get("name"), str) else "tool"
        tid = block.get("id") if isinstance(block.get("id"), str) and block["id"] else self._id()
        args = block.get("input") if isinstance(block.get("input"), dict) else {}
        kind = kind_of(name)
        self.pending[tid] = {"name": name, "input": args}
        if kind == "todo_list":  # the whole list is in the call; its result only says "modified"
            out.append(dumps({"type": "item.completed", "item": call_item(kind, tid, name, args, "completed")}))
        elif kind not in ("file_change", "tasks"):  # those are recorded at their result
            out.append(dumps({"type": "item.started", "item": call_item(kind, tid, name, args, "in_progress")}))

    def _tool_result(self, block: dict, obj: dict, out: list) -> None:
        tid = block.get("tool_use_id")
        call = self.pending.pop(tid, None) if isinstance(tid, str) else None
        extra = obj.get("toolUseResult", obj.get("tool_use_result"))
        output = result_output(block, extra, self.session_id, self.reader)
        if call is None:  # a result whose call we never saw (a resumed transcript's first lines)
            out.append(dumps({"type": "item.completed", "item": {
                "id": tid if isinstance(tid, str) and tid else self._id(), "type": "tool_output",
                "call_id": tid if isinstance(tid, str) else "",
                "status": "failed" if block.get("is_error") is True else "completed", "output": output}}))
            return
        kind = kind_of(call["name"])
        if kind == "todo_list":
            return
        if kind == "tasks":
            if block.get("is_error") is not True and apply_task(self.tasks, call["name"], call["input"], output, extra):
                out.append(dumps({"type": "item.completed", "item": todo_item(tid, self.tasks)}))
            return
        item = result_item(call, tid, block, extra, output)
        if kind == "agent":
            child = child_session(self.session_id, extra.get("agentId") if isinstance(extra, dict) else None) \
                or self.children.pop(tid, None)
            if child:
                item["child_session"] = child
                self.meta["children"] = sorted(set(self.meta.get("children") or []) | {child})
        out.append(dumps({"type": "item.completed", "item": item}))

    def _result(self, obj: dict, out: list) -> None:
        failed = obj.get("is_error") is True
        usage = usage_of(obj.get("usage"))
        # a run that asked no model (a local command such as /model in -p mode: num_turns 0) opens no turn,
        # as its transcript has none
        local = not self.in_turn and not failed and obj.get("num_turns") == 0
        if self.in_turn or (not self.run_closed and not local):
            self._open(obj, out)
            reason = None
            if failed:
                reason = obj.get("result") if isinstance(obj.get("result"), str) and obj["result"].strip() else None
                if reason is None and isinstance(obj.get("errors"), list) and obj["errors"]:
                    reason = "; ".join(str(e) for e in obj["errors"])
                reason = _with_status(reason or str(obj.get("subtype") or "error"), obj.get("api_error_status"))
            self._close(obj, out, failed=reason, usage=usage)
        elif failed:
            self.meta["status"] = "failed"
        subtype = obj.get("subtype") if isinstance(obj.get("subtype"), str) else "success"
        if failed and subtype == "success":
            subtype = "error_during_execution"
        num_turns = obj.get("num_turns")
        event: dict = {"type": "thread.completed", "thread_id": self.thread_id or "", "session_id": self.thread_id or "",
                       "subtype": subtype, "outcome_code": "error" if failed else "completed",
                       "usage": usage, "num_turns": num_turns if type(num_turns) is int and num_turns >= 0 else self.turns}
        if isinstance(obj.get("result"), str):
            event["result"] = obj["result"]
        if isinstance(obj.get("stop_reason"), str):
            event["stop_reason"] = obj["stop_reason"]
        cost = obj.get("total_cost_usd")
        if isinstance(cost, (int, float)) and not isinstance(cost, bool):
            event["total_cost_usd"] = cost
        out.append(dumps(event))


TRANSLATORS = {"claude": ClaudeTranslator}  # (memfs.agents.reader: kind -> translator)
