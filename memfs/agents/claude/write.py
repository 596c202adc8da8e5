"""A conversation as a Claude Code transcript (SPEC §11): the lines ``claude --resume <uuid>``
reads from ``~/.claude/projects/<cwd slug>/<uuid>.jsonl``. Shapes of Claude Code 2.1.332 (the
captured fixtures; docs/agents.md), read back by :mod:`memfs.agents.claude.read`.

Every line carries ``sessionId`` (= the file's name), ``cwd``, ``version``, ``timestamp``,
``uuid`` and ``parentUuid`` — the previous line's, so that the chain Claude Code follows back
from the last line reaches the first prompt. Per turn: the prompt (a ``user`` line, ``promptId``
= the turn's id), then assistant messages (one line each, a unique ``message.id``, at most one
tool call each so that the items keep their order; the turn's
usage on its last one, the others zero, so a re-import sums to the same), each tool call's
``tool_result`` right after the message that made it — every call is paired: a call with no
recorded result gets an ``is_error`` result saying so. Items map as the importer reads them
back: commands → ``Bash``, MCP calls → ``mcp__<server>__<tool>``, file changes → ``Edit`` /
``Write`` (one per path), to-do lists → ``TodoWrite``, web searches → ``WebSearch``, other
tools under their own names; reasoning, plans, decisions, summaries, a lone tool output are
folded into text blocks ("Reasoning: …", :func:`~memfs.agents.common.fold_text`) that
their line's ``memfs`` key names (:func:`~memfs.agents.claude.tools.fold_mark`), so that an import
restores them as they were (Claude Code ignores the key; a thinking block would need the model's
signature), API retries are ``system``/``api_error`` lines, and
a failed turn ends with Claude Code's own API-error message (``isApiErrorMessage``).
"""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path
from typing import Any

import orjson

from memfs import counts
from memfs.agents.claude.shapes import SHAPES
from memfs.agents.claude.tools import FOLDED, fold_mark, fold_text
from memfs.agents.common import NO_RESULT, exit_code, native_usage, with_exit
from memfs.export import Placement, jsonl, out_file, store_dir
from memfs.export.conversation import NAMESPACE, Clock, Conversation, Turn, parse_time

VERSION = "2.1.332"  # the Claude Code version these shapes were checked against
_RETRY = re.compile(r"\AAPI retry (\d{1,9})/(\d{1,9}|None): (.*)\Z", re.S)


def slug(cwd: str) -> str:
    """Claude Code's project directory name for ``cwd``: every character that is not an ASCII
    letter or digit becomes ``-``."""
    return re.sub(r"[^A-Za-z0-9]", "-", cwd)


def transcript_path(config_dir: Path, cwd: str, conversation_id: str) -> Path:
    return config_dir / "projects" / slug(cwd) / f"{conversation_id}.jsonl"


class _Writer:
    def __init__(self, conv: Conversation, cwd: str) -> None:
        self.conv = conv
        self.sid = conv.conversation_id
        about = conv.about
        version = about.get("agent_version") if conv.agent == "claude" else None
        self.common: dict[str, Any] = {"userType": "external", "entrypoint": "sdk-cli", "cwd": cwd,
                                       "sessionId": self.sid, "version": version or VERSION}
        if isinstance(about.get("git_branch"), str):
            self.common["gitBranch"] = about["git_branch"]
        first = next((t.started_at for t in conv.turns if t.started_at), None)
        self.clock = Clock(parse_time(first) or parse_time(about.get("started_at")))
        self.lines: list[dict] = []
        self.parent: str | None = None
        self.used_ids: set[str] = set()
        self.n = 0

    def _uuid(self, what: str) -> str:
        self.n += 1
        return str(uuid.uuid5(NAMESPACE, f"{self.sid}/{self.n}/{what}"))

    def _line(self, line: dict, at: Any = None) -> dict:
        uid = self._uuid(line["type"])
        out = {"parentUuid": self.parent, "isSidechain": False, **line, "uuid": uid,
               "timestamp": self.clock.at(at), **self.common}
        self.parent = uid
        self.lines.append(out)
        return out

    def _mid(self, turn: Turn, hint: str | None) -> str:
        if hint and hint.startswith("msg_") and hint not in self.used_ids:
            self.used_ids.add(hint)
            return hint
        mid = "msg_memfs_" + uuid.uuid5(NAMESPACE, f"{self.sid}/{turn.number}/{len(self.used_ids)}").hex[:24]
        self.used_ids.add(mid)
        return mid

    # --- a turn ------------------------------------------------------------------------------

    def turn(self, turn: Turn) -> None:
        prompt = turn.prompt
        if prompt is None and not self.lines:  # the conversation must open with a user message
            first = self.conv.about.get("first_prompt")
            prompt = first if isinstance(first, str) and first else f"(turn {turn.number}: no prompt was recorded)"
        self.prompt_id = turn.turn_id
        if prompt is not None:  # a turn without one (a /compact, …) opens at its first message
            line: dict = {"type": "user", "message": {"role": "user", "content": prompt}}
            if turn.turn_id:
                line["promptId"] = turn.turn_id
            self._line(line, turn.started_at)
        blocks: list[dict] = []  # the assistant message being built
        results: list[tuple[dict, dict | None]] = []  # its tool_use blocks' (result block, extra)
        hint: str | None = None
        retries: list[dict] = []
        last_assistant: dict | None = None
        for item in turn.items:
            kind = item.get("type")
            if kind == "error":
                if blocks:
                    last_assistant = self._flush(turn, blocks, results, hint)
                    blocks, results, hint = [], [], None
                retries.append(item)
                continue
            if retries:
                for r in retries:
                    self._retry(r)
                retries = []
            text = _text_block(item)
            iid = item.get("id") if isinstance(item.get("id"), str) else ""
            mid = iid.rsplit(":", 1)[0] if ":" in iid else None
            if text is not None:
                if results or (blocks and mid != hint):  # a text after calls starts the next message
                    last_assistant = self._flush(turn, blocks, results, hint)
                    blocks, results = [], []
                if not blocks:
                    hint = mid
                blocks.append(text)
                continue
            for use, result, extra in _tool_blocks(item):  # one call per message: the order survives
                if results:
                    last_assistant = self._flush(turn, blocks, results, hint)
                    blocks, results = [], []
                if not blocks:
                    hint = None
                blocks.append(use)
                results.append((result, extra))
        if blocks:
            last_assistant = self._flush(turn, blocks, results, hint)
        for r in retries:
            self._retry(r)
        failed_retries = retries
        if last_assistant is not None:
            usage = last_assistant["message"]["usage"]
            usage.update(native_usage(SHAPES.usage, turn.disjoint_usage()))
            if turn.usage_error is not None:  # memfs's own marker: a re-import keeps the turn's usage refused
                usage[counts.ERROR] = turn.usage_error
        if turn.outcome == "failed":
            anchor = next((str(r["id"]).rsplit(":retry", 1)[0] for r in reversed(failed_retries)
                           if ":retry" in str(r.get("id"))), None)
            self._line({"type": "assistant", "message": {
                "id": self._mid(turn, anchor), "type": "message", "role": "assistant", "model": "<synthetic>",
                "content": [{"type": "text", "text": turn.failure or "failed"}], "stop_reason": "stop_sequence",
                "stop_sequence": "", "usage": _zero()}, "isApiErrorMessage": True, "error": "unknown"},
                turn.completed_at)
        elif turn.outcome == "completed":
            if last_assistant is not None and last_assistant is self.lines[-1]:  # a text-only last message
                last_assistant["message"]["stop_reason"] = "end_turn"
                last_assistant["timestamp"] = self.clock.at(turn.completed_at)
            else:
                self._line({"type": "system", "subtype": "turn_duration", "durationMs": 0, "isMeta": False,
                            "level": "info"}, turn.completed_at)

    def _flush(self, turn: Turn, blocks: list[dict], results: list, hint: str | None) -> dict:
        mid = self._mid(turn, hint)
        model = turn.model or self.conv.model or "claude-opus-5-5"
        stop = "tool_use" if results else None  # the turn's last message ends it (see turn())
        folded = {k: block.pop(_FOLDED_ITEM) for k, block in enumerate(blocks) if _FOLDED_ITEM in block}
        entry: dict = {"type": "assistant", "message": {
            "id": mid, "type": "message", "role": "assistant", "model": model, "content": blocks,
            "stop_reason": stop, "stop_sequence": None, "usage": _zero()}, "requestId": "req_" + mid[4:]}
        if folded:
            entry[FOLDED] = {"folded": fold_mark(folded)}
        line = self._line(entry)
        for result, extra in results:
            out: dict = {"type": "user", "message": {"role": "user", "content": [result]}}
            if self.prompt_id:
                out["promptId"] = self.prompt_id
            if extra is not None:
                out["toolUseResult"] = extra
            out["sourceToolAssistantUUID"] = line["uuid"]
            self._line(out)
        return line

    def _retry(self, item: dict) -> None:
        message = item.get("message") if isinstance(item.get("message"), str) else "error"
        m = _RETRY.match(message)
        attempt, limit, what = (int(m.group(1)), m.group(2), m.group(3)) if m else (1, "1", message)
        self._line({"type": "system", "subtype": "api_error", "level": "error",
                    "error": {"message": what, "formatted": what}, "retryAttempt": attempt,
                    "maxRetries": int(limit) if limit.isdigit() else None, "retryInMs": 0})


def _zero() -> dict:
    return native_usage(SHAPES.usage, {})


def _text_block(item: dict) -> dict | None:
    """The text block an item is, or None for a tool call. A folded item carries itself under
    a key no API block has, which :meth:`_Writer._flush` moves to the line's mark."""
    kind = item.get("type")
    if kind == "agent_message":
        return {"type": "text", "text": str(item.get("text") or "")}
    folded = fold_text(item)
    if folded is None:
        return None
    return {"type": "text", "text": folded, _FOLDED_ITEM: item}


_FOLDED_ITEM = "\x00item"  # a key no API block has, removed before the line is written



def _tool_blocks(item: dict) -> list[tuple[dict, dict, dict | None]]:
    """``(tool_use, tool_result, toolUseResult)`` for a tool call item (several for a file
    change of several paths)."""
    kind, iid = item.get("type"), tool_id(item.get("id"))
    status = item.get("status")
    if kind == "command_execution":
        command = str(item.get("command") or "")
        output = item.get("aggregated_output") if isinstance(item.get("aggregated_output"), str) else ""
        code = item.get("exit_code")
        failed = status == "failed" or (type(code) is int and code != 0)
        if status == "in_progress":
            output, failed = NO_RESULT, True
        elif failed and type(code) is int and exit_code(SHAPES, output) is None:
            output = with_exit(SHAPES, code, output)
        use = {"type": "tool_use", "id": iid, "name": SHAPES.writes["command_execution"], "input": {"command": command}}
        extra = {"stdout": output, "stderr": "", "interrupted": False, "isImage": False}
        return [(use, _result(iid, output, failed), extra)]
    if kind == "mcp_tool_call":
        server, tool = str(item.get("server") or ""), str(item.get("tool") or "")
        prefix = SHAPES.mcp_prefix or ""
        name = item.get("tool_name") if isinstance(item.get("tool_name"), str) and \
            str(item.get("tool_name")).startswith(prefix) else f"{prefix}{server}__{tool}"
        args = item.get("arguments") if isinstance(item.get("arguments"), dict) else {}
        error = item.get("error") if isinstance(item.get("error"), dict) else None
        result = item.get("result") if isinstance(item.get("result"), dict) else None
        content: Any
        if error is not None:
            content, failed = str(error.get("message") or "error"), True
        elif result is not None and isinstance(result.get("content"), list):
            content, failed = [b for b in result["content"] if isinstance(b, dict)], False
        else:
            content, failed = NO_RESULT if status == "in_progress" else "", status in ("failed", "in_progress")
        use = {"type": "tool_use", "id": iid, "name": name, "input": args}
        return [(use, _result(iid, content, failed), None)]
    if kind == "file_change":
        changes = [c for c in item.get("changes") or [] if isinstance(c, dict)] or [{"path": "", "kind": "update"}]
        failed = status == "failed"
        out = []
        for k, change in enumerate(changes):
            cid = iid if k == 0 else f"{iid}_{k}"
            add = change.get("kind") == "add"
            name = SHAPES.writes["file_change.add" if add else "file_change"]
            text = f"{'Deleted' if change.get('kind') == 'delete' else 'Changed'} {change.get('path')}"
            use = {"type": "tool_use", "id": cid, "name": name, "input": {"file_path": str(change.get("path"))}}
            out.append((use, _result(cid, "failed" if failed else text, failed), {"type": "create"} if add else None))
        return out
    if kind == "todo_list":
        todos = [{"content": str(t.get("text", "")), "activeForm": str(t.get("text", "")),
                  "status": "completed" if t.get("completed") is True else "pending"}
                 for t in item.get("items") or [] if isinstance(t, dict)]
        use = {"type": "tool_use", "id": iid, "name": SHAPES.writes["todo_list"], "input": {"todos": todos}}
        return [(use, _result(iid, "Todos have been modified successfully.", False), None)]
    if kind == "web_search":
        action = item.get("action") if isinstance(item.get("action"), dict) else {}
        if action.get("type") == "open_page":
            use = {"type": "tool_use", "id": iid, "name": SHAPES.writes["web_search.open_page"],
                   "input": {"url": str(item.get("query") or "")}}
        else:
            use = {"type": "tool_use", "id": iid, "name": SHAPES.writes["web_search"],
                   "input": {"query": str(item.get("query") or "")}}
        return [(use, _result(iid, "(the results were not recorded)", False), None)]
    # tool_invocation (its result: an ``output`` of its own, or the paired tool_output)
    name = item.get("tool_name") if isinstance(item.get("tool_name"), str) and item.get("tool_name") else "tool"
    args = item.get("arguments") if isinstance(item.get("arguments"), dict) else \
        ({} if item.get("arguments") is None else {"input": item.get("arguments")})
    paired = item.get("result") if isinstance(item.get("result"), dict) else None
    output = paired.get("output") if paired is not None else item.get("output")
    failed = (paired or item).get("status") == "failed"
    if not isinstance(output, str):
        output, failed = (NO_RESULT, True) if output is None and paired is None and status != "completed" \
            else (orjson.dumps(output).decode() if output is not None else "", failed)
    use = {"type": "tool_use", "id": iid, "name": name, "input": args}
    return [(use, _result(iid, output, failed), None)]


def tool_id(iid: Any) -> str:
    """A tool call's id as the Messages API takes it (letters, digits, ``_``, ``-``)."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", str(iid or "")) or "toolu_memfs"


def _result(tid: str, content: Any, failed: bool) -> dict:
    return {"tool_use_id": tid, "type": "tool_result", "content": content, "is_error": failed}


def render(conv: Conversation, cwd: str) -> list[dict]:
    """The transcript's lines (JSON objects), first to last."""
    writer = _Writer(conv, cwd)
    for turn in conv.turns:
        writer.turn(turn)
    return writer.lines


def place(conv: Conversation, out: Path | None, home: Path | None, cwd: str) -> Placement:
    """Where the transcript goes (:class:`memfs.export.Placement`): Claude Code's store
    (``$CLAUDE_CONFIG_DIR`` or ``.claude`` under ``home``, or the one ``out`` names) at
    ``projects/<cwd slug>/<uuid>.jsonl``, else ``out`` (``<uuid>.jsonl`` in a directory)."""
    uid = conv.conversation_id
    argv = ["claude", "--resume", uid]
    data = jsonl(render(conv, cwd))
    store = store_dir(out, home, ".claude", ("projects",), os.environ.get("CLAUDE_CONFIG_DIR"))
    if store is None:
        return Placement(out_file(out, f"{uid}.jsonl"), data, uid, argv)
    taken = sorted((store / "projects").glob(f"*/{uid}.jsonl")) if (store / "projects").is_dir() else []
    return Placement(transcript_path(store, cwd, uid), data, uid, argv, taken, in_store=True)
