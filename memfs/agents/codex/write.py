"""A conversation as a Codex rollout (SPEC §11): the lines ``codex exec resume <uuid>`` reads
from ``$CODEX_HOME/sessions/YYYY/MM/DD/rollout-<time>-<uuid>.jsonl``. Shapes of
``codex-rs/protocol`` (``RolloutLine``: ``{timestamp, type, payload}``) as Codex CLI 0.171.0
reads them (the captured fixtures; docs/agents.md), read back by :mod:`memfs.agents.codex.read`.

The first line is ``session_meta`` whose ``id`` is the file name's UUID. ``model_provider`` is
the provider the target Codex is configured with (``provider``), or absent: Codex refuses to
resume a thread recorded under another provider, so an export never pins one the user does not
use. Per turn: ``task_started``, the prompt (a user ``message`` item, which Codex sends back to
the model, and its ``user_message`` event), then the items in order — what Codex sends to the
model is the ``response_item`` history: assistant ``message``s, and each tool call as a
``function_call`` followed by its ``function_call_output`` (every call paired: one with no
recorded result gets an output saying so) — then ``token_count`` (the running total, so a
re-import finds each turn's own usage), an ``error`` event for a failed turn, and
``task_complete``. Commands are ``exec_command`` (output ``Process exited with code N`` /
``Output:``), MCP calls ``mcp__<server>__<tool>`` (plus ``mcp_tool_call_end`` with the whole
result), file changes ``apply_patch`` (the files' headers), to-do lists ``update_plan``, web
searches ``web_search_call``; reasoning is an ``agent_reasoning`` event (shown, not resent:
the model's own reasoning cannot be replayed without its encrypted content); what Codex has no
shape for is folded into an assistant message's text.
"""

from __future__ import annotations

import os
import tomllib
import uuid
from pathlib import Path
from typing import Any

import orjson

from memfs import counts
from memfs.agents.codex.shapes import SHAPES
from memfs.agents.common import NO_RESULT, fold_text, native_usage, with_exit
from memfs.export import Placement, jsonl, out_file, store_dir
from memfs.export.conversation import NAMESPACE, Clock, Conversation, Turn, parse_time

VERSION = "0.171.0"  # the Codex CLI version these shapes were checked against
_CODEX_USAGE = ("input_tokens", "cached_input_tokens", "output_tokens", "reasoning_output_tokens", "total_tokens")


def rollout_path(codex_home: Path, conversation_id: str, started: str) -> Path:
    """``sessions/YYYY/MM/DD/rollout-YYYY-MM-DDThh-mm-ss-<uuid>.jsonl`` for a start time
    ``started`` (ISO 8601, UTC as Codex names files with TZ=UTC)."""
    when = parse_time(started)
    assert when is not None
    stamp = when.strftime("%Y-%m-%dT%H-%M-%S")
    return codex_home / "sessions" / when.strftime("%Y/%m/%d") / f"rollout-{stamp}-{conversation_id}.jsonl"


class _Writer:
    def __init__(self, conv: Conversation, cwd: str, provider: str | None) -> None:
        self.conv = conv
        self.cwd = cwd
        self.provider = provider
        first = next((t.started_at for t in conv.turns if t.started_at), None)
        self.clock = Clock(parse_time(first) or parse_time(conv.about.get("started_at")))
        self.lines: list[dict] = []
        self.total = dict.fromkeys(_CODEX_USAGE, 0)

    def _line(self, kind: str, payload: dict, at: Any = None) -> None:
        self.lines.append({"timestamp": self.clock.at(at), "type": kind, "payload": payload})

    def _event(self, payload: dict, at: Any = None) -> None:
        self._line("event_msg", payload, at)

    def _item(self, payload: dict) -> None:
        self._line("response_item", payload)

    def meta(self) -> None:
        about = self.conv.about
        payload: dict = {"id": self.conv.conversation_id, "timestamp": "", "cwd": self.cwd,
                         "originator": "codex_exec", "cli_version": VERSION, "source": "exec"}
        if self.provider:
            payload["model_provider"] = self.provider
        if isinstance(about.get("git_branch"), str):
            payload["git"] = {"branch": about["git_branch"]}
        first = self.conv.turns[0].started_at if self.conv.turns else None
        self._line("session_meta", payload, about.get("started_at") or first)
        payload["timestamp"] = self.lines[-1]["timestamp"]

    def turn(self, turn: Turn) -> None:
        tid = turn.turn_id or str(uuid.uuid5(NAMESPACE, f"{self.conv.conversation_id}/turn/{turn.number}"))
        self._event({"type": "task_started", "turn_id": tid, "model_context_window": None}, turn.started_at)
        if turn.prompt is not None:  # a turn without one (a compaction, …) opens at its first item
            self._item({"type": "message", "role": "user", "content": [{"type": "input_text", "text": turn.prompt}]})
            self._event({"type": "user_message", "message": turn.prompt, "images": []})
        last_text: str | None = None
        for item in turn.items:
            last_text = self._one(item) or last_text
        # (Codex counts cache reads, and writes, which it has no field for, in input)
        turn_usage = native_usage(SHAPES.usage, turn.disjoint_usage())
        turn_usage["total_tokens"] = turn_usage["input_tokens"] + turn_usage["output_tokens"]
        if turn.outcome == "open":
            return
        for key in _CODEX_USAGE:
            self.total[key] += turn_usage[key]
        last: dict = dict(turn_usage)
        if turn.usage_error is not None:  # memfs's own marker: a re-import keeps the turn's usage refused
            last[counts.ERROR] = turn.usage_error
        self._event({"type": "token_count", "info": {"total_token_usage": dict(self.total),
                                                     "last_token_usage": last, "model_context_window": None},
                     "rate_limits": None})
        if turn.outcome == "failed":
            self._event({"type": "error", "message": turn.failure or "failed"})
            last_text = None
        self._event({"type": "task_complete", "turn_id": tid, "last_agent_message": last_text}, turn.completed_at)

    def _text(self, text: str) -> str:
        self._item({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]})
        self._event({"type": "agent_message", "message": text})
        return text

    def _call(self, call_id: str, name: str, arguments: Any, output: str) -> None:
        self._item({"type": "function_call", "name": name, "arguments": orjson.dumps(arguments).decode(),
                    "call_id": call_id})
        self._item({"type": "function_call_output", "call_id": call_id, "output": output})

    def _one(self, item: dict) -> str | None:
        """Write one item; the text of an assistant message, else None."""
        kind, iid = item.get("type"), str(item.get("id"))
        status = item.get("status")
        if kind == "agent_message":
            return self._text(str(item.get("text") or ""))
        if kind == "reasoning":
            self._event({"type": "agent_reasoning", "text": str(item.get("text") or "")})
        elif kind == "user_message":
            text = str(item.get("text") or "")
            self._item({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
            self._event({"type": "user_message", "message": text, "images": []})
        elif kind == "error":
            self._event({"type": "stream_error", "message": str(item.get("message") or "error")})
        elif kind == "command_execution":
            output = item.get("aggregated_output") if isinstance(item.get("aggregated_output"), str) else ""
            code = item.get("exit_code")
            if status == "in_progress":
                text = NO_RESULT
            elif type(code) is int:
                text = with_exit(SHAPES, code, output)
            elif status == "failed":
                text = with_exit(SHAPES, 1, output)
            else:
                text = output
            self._call(iid, SHAPES.writes["command_execution"], {"cmd": str(item.get("command") or "")}, text)
        elif kind == "mcp_tool_call":
            self._mcp(item, iid)
        elif kind == "file_change":
            changes = [c for c in item.get("changes") or [] if isinstance(c, dict)]
            heads = {"add": "Add", "delete": "Delete"}
            patch = "\n".join(["*** Begin Patch", *(f"*** {heads.get(str(c.get('kind')), 'Update')} File: {c.get('path')}"
                                                     for c in changes), "*** End Patch"])
            output = with_exit(SHAPES, 1, "patch failed") if status == "failed" else "Success."
            self._call(iid, SHAPES.writes["file_change"], {"input": patch}, output)
        elif kind == "todo_list":
            plan = [{"step": str(t.get("text", "")), "status": "completed" if t.get("completed") is True else "pending"}
                    for t in item.get("items") or [] if isinstance(t, dict)]
            self._call(iid, SHAPES.writes["todo_list"], {"plan": plan}, "Plan updated")
        elif kind == "web_search":
            action = item.get("action") if isinstance(item.get("action"), dict) else {}
            query = str(item.get("query") or "")
            act = {"type": "open_page", "url": query} if action.get("type") == "open_page" else \
                {"type": "search", "query": query}
            self._item({"type": "web_search_call", "id": iid, "status": "completed", "action": act})
        elif kind == "tool_invocation":
            paired = item.get("result") if isinstance(item.get("result"), dict) else None
            output = paired.get("output") if paired is not None else item.get("output")
            if output is None and paired is None and status != "completed":
                output = NO_RESULT
            name = item.get("tool_name") if isinstance(item.get("tool_name"), str) and item.get("tool_name") else "tool"
            args = item.get("arguments") if item.get("arguments") is not None else {}
            self._call(iid, name, args, output if isinstance(output, str) else orjson.dumps(output).decode())
        else:
            return self._text(fold_text(item) or "")
        return None

    def _mcp(self, item: dict, iid: str) -> None:
        server, tool = str(item.get("server") or ""), str(item.get("tool") or "")
        if not tool and isinstance(item.get("tool_name"), str):
            server, _, tool = item["tool_name"].removeprefix(SHAPES.mcp_prefix or "").partition("__")
        args = item.get("arguments") if isinstance(item.get("arguments"), dict) else {}
        error = item.get("error") if isinstance(item.get("error"), dict) else None
        result = item.get("result") if isinstance(item.get("result"), dict) else None
        name = f"{SHAPES.mcp_prefix}{server}__{tool}"
        self._item({"type": "function_call", "name": name, "arguments": orjson.dumps(args).decode(), "call_id": iid})
        end: dict = {"type": "mcp_tool_call_end", "call_id": iid,
                     "invocation": {"server": server, "tool": tool, "arguments": args},
                     "duration": {"secs": 0, "nanos": 0}}
        if error is not None:
            text = str(error.get("message") or "error")
            end["result"] = {"Err": text}
        elif result is not None:
            content = [b for b in result.get("content") or [] if isinstance(b, dict)]
            end["result"] = {"Ok": {"content": content, "structured_content": result.get("structured_content"),
                                    "is_error": False}}
            text = "\n".join(str(b.get("text")) for b in content if isinstance(b.get("text"), str))
        else:
            text = NO_RESULT
            end["result"] = {"Err": text}
        self._event(end)
        self._item({"type": "function_call_output", "call_id": iid, "output": text})


def render(conv: Conversation, cwd: str, provider: str | None) -> list[dict]:
    """The rollout's lines (JSON objects), first to last."""
    writer = _Writer(conv, cwd, provider)
    writer.meta()
    for turn in conv.turns:
        writer.turn(turn)
    return writer.lines


def place(conv: Conversation, out: Path | None, home: Path | None, cwd: str) -> Placement:
    """Where the rollout goes (:class:`memfs.export.Placement`): Codex's store (``$CODEX_HOME``
    or ``.codex`` under ``home``, or the one ``out`` names) at
    ``sessions/YYYY/MM/DD/rollout-<time>-<uuid>.jsonl``, naming the store's provider, else
    ``out`` (that file name in a directory)."""
    uid = conv.conversation_id
    argv = ["codex", "exec", "resume", uid]
    store = store_dir(out, home, ".codex", ("sessions", "config.toml"), os.environ.get("CODEX_HOME"))
    if store is None:
        lines = render(conv, cwd, None)
        return Placement(out_file(out, rollout_path(Path("."), uid, lines[0]["timestamp"]).name), jsonl(lines),
                         uid, argv)
    lines = render(conv, cwd, _provider(store))
    taken = sorted(p for d in ("sessions", "archived_sessions") if (store / d).is_dir()
                   for p in (store / d).rglob(f"rollout-*-{uid}.jsonl*"))
    return Placement(rollout_path(store, uid, lines[0]["timestamp"]), jsonl(lines), uid, argv, taken, in_store=True)


def _provider(codex_home: Path) -> str | None:
    """The model provider the Codex in ``codex_home`` is configured with (its ``config.toml``
    ``model_provider``), or None — then the rollout names none, which Codex resumes under
    whatever provider it runs with (a rollout naming another one is refused)."""
    try:
        with open(codex_home / "config.toml", "rb") as f:
            provider = tomllib.load(f).get("model_provider")
    except (OSError, tomllib.TOMLDecodeError):
        return None
    return provider if isinstance(provider, str) and provider else None
