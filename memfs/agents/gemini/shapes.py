"""Gemini CLI's shapes (SPEC §10): its table (:data:`SHAPES`: tool names, the stream's exit
code wording, its two usage objects), which lines are Gemini CLI's, and what a record, a tool
call and its result say. Pure; used by :mod:`memfs.agents.gemini.read` (the translator) and by
:func:`memfs.ingest.classify`. memfs writes no Gemini format yet, so this folder has no
``write.py`` and :data:`SHAPES` no ``writes``.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import orjson

from memfs import counts
from memfs.agents import common
from memfs.agents.common import LineFormat, Shapes, Subagent, UsageShape, read_usage, request_tokens
from memfs.formats import GEMINI_RECORD_TYPES, GEMINI_STREAM_TYPES, gemini_shape
from memfs.ingest import child_session_name

AGENT = "gemini"
STREAM_TYPES, RECORD_TYPES = GEMINI_STREAM_TYPES, GEMINI_RECORD_TYPES
SHELL_TOOL = "run_shell_command"
FILE_TOOLS = ("write_file", "replace")
FINAL_STATUSES = ("success", "error", "cancelled")
IGNORED_PROMPTS = ("<session_context>", "<hook_context>")  # the CLI's own context, not a prompt
WORKSPACE = re.compile(r"Workspace Directories:\*{0,2}\n\s*- ([^\n]+)")  # in <session_context>
_TRAILERS = ("Error", "Exit Code", "Signal", "Background PIDs", "Process Group PGID")
_MCP_DISPLAY = re.compile(r"\A(.+) \((.+) MCP Server\)\Z")


shape = gemini_shape  # (memfs.formats: the one home of other agents' line shapes)


def is_gemini(obj: dict) -> bool:
    return gemini_shape(obj) is not None


def session_id(obj: dict) -> str | None:
    """The conversation id a Gemini line names: ``init``'s ``session_id``, the metadata line's
    ``sessionId`` (a sub-agent's own id: see :func:`subagent_parent`)."""
    sid = obj.get("session_id") if obj.get("type") == "init" else \
        obj.get("sessionId") if "projectHash" in obj and "type" not in obj else None
    return sid if isinstance(sid, str) and sid else None


def subagent_parent(path, sid: str | None) -> str | None:
    """The parent's session id of a sub-agent chat file ``chats/<parent id>/<sid>.jsonl``
    (the file does not name its parent; its directory does), else None."""
    if not sid or path.stem != sid or path.parent.parent.name != "chats":
        return None
    return path.parent.name or None


def subagent(path: Path, sid: str) -> Subagent | None:
    """A sub-agent's chat ``chats/<parent id>/<sid>.jsonl``: session ``<parent session>.<sid>``."""
    parent = subagent_parent(path, sid)
    return Subagent(parent, sid, sid) if parent else None


SHAPES = Shapes(
    name=AGENT,
    formats=(LineFormat("gemini", "Gemini CLI stream-json or chat file", is_gemini, session_id, rank=20),),
    command="gemini",
    line="a Gemini CLI stream-json or chat line",
    subagent=subagent,
    tools={SHELL_TOOL: "command_execution", **dict.fromkeys(FILE_TOOLS, "file_change"), "write_todos": "todo_list",
           "google_web_search": "web_search", "complete_task": "report"},
    writes={},  # (no write.py yet: see the module docstring)
    mcp_prefix="mcp_",
    exit_pattern=re.compile(r"\ACommand exited with code: (-?\d{1,9})\Z"),  # the stream's output of a silent failure
    # a chat record's ``tokens``: ``input`` includes ``cached``; ``thoughts`` are output, counted apart
    usage=UsageShape((("input", "input_tokens"), ("cached", "cached_input_tokens"), ("output", "output_tokens"),
                      ("thoughts", "reasoning_output_tokens")), reasoning_in_output=False),
    # the stream ``result``'s ``stats`` (the whole run: in ``-p`` mode, one turn)
    stream_usage=UsageShape((("input_tokens", "input_tokens"), ("cached", "cached_input_tokens"),
                             ("output_tokens", "output_tokens"))),
)
EXITED = SHAPES.exit_pattern


def child_name(parent: str | None, child: Any) -> str | None:
    """The session name of sub-agent ``child``'s chat in conversation ``parent``
    (``<parent>.<sub id>``, as the importer names a sub-agent's chat file), or None when that
    is not a valid session name."""
    return child_session_name(parent, child) if isinstance(child, str) else None


def usage_of(tokens: Any) -> dict:
    """A chat record's ``tokens`` as a Usage (:data:`SHAPES`)."""
    return read_usage(SHAPES.usage, tokens)


def disjoint(usage: dict) -> dict:
    """A :func:`usage_of` result in memfs's disjoint form (``input`` without the cached part)."""
    return request_tokens(SHAPES.usage, usage)


def stats_usage(stats: Any) -> dict:
    """The stream ``result``'s ``stats`` as a Usage."""
    assert SHAPES.stream_usage is not None
    return read_usage(SHAPES.stream_usage, stats)


def add_usages(usages) -> dict:
    total: dict = {}
    for u in usages:
        counts.add(total, u)
    return total


def parts_text(content: Any) -> str:
    """The text of a Gemini ``PartListUnion``: a string, a part, or a list of them (thought
    parts left out)."""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        content = [content]
    if not isinstance(content, list):
        return ""
    texts = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict) and isinstance(part.get("text"), str) and part.get("thought") is not True:
            texts.append(part["text"])
    return "".join(texts)


def function_responses(content: Any) -> list[dict]:
    """The ``functionResponse`` parts of a content."""
    if isinstance(content, dict):
        content = [content]
    if not isinstance(content, list):
        return []
    return [p["functionResponse"] for p in content
            if isinstance(p, dict) and isinstance(p.get("functionResponse"), dict)]


def _unwrap(text: str) -> str:
    body = text.strip()
    if body.startswith("<untrusted_context>") and body.endswith("</untrusted_context>"):
        return body[len("<untrusted_context>"):-len("</untrusted_context>")].strip("\n")
    return text


def response_text(result: Any) -> tuple[str, bool]:
    """``(text, is_error)`` of a tool call's result parts (``functionResponse.response``'s
    ``output`` or ``error``)."""
    texts, error = [], False
    for fr in function_responses(result):
        resp = fr.get("response")
        if isinstance(resp, dict):
            if isinstance(resp.get("output"), str):
                texts.append(_unwrap(resp["output"]))
            elif isinstance(resp.get("error"), str):
                texts.append(resp["error"])
                error = True
            else:
                texts.append(orjson.dumps(resp).decode())
        elif isinstance(resp, str):
            texts.append(resp)
    return "\n".join(texts), error


def shell_result(text: str) -> tuple[str, int | None, bool]:
    """``(output, exit code, failed)`` of ``run_shell_command``'s model-facing result
    (``Output: …`` then ``Error:``/``Exit Code:``/``Signal:``/``Background PIDs:``/
    ``Process Group PGID:`` lines, each when it applies); exit 0 when none says otherwise."""
    if not text.startswith("Output: "):
        return text, None, False
    lines = text[len("Output: "):].split("\n")
    fields: dict = {}
    for name in reversed(_TRAILERS):
        if len(lines) > 1 and lines[-1].startswith(name + ": "):
            fields[name] = lines.pop()[len(name) + 2:]
    output = "\n".join(lines)
    if output == "(empty)":
        output = ""
    code = fields.get("Exit Code")
    exit_code = int(code) if code is not None and re.fullmatch(r"-?\d{1,9}", code) else None
    failed = exit_code not in (None, 0) or "Error" in fields or "Signal" in fields
    if exit_code is None and not failed:
        exit_code = 0
    return output, exit_code, failed


def kind_of(name: str) -> str:
    """The item kind of a call of tool ``name`` (:data:`SHAPES`)."""
    return common.kind_of(SHAPES, name)


def mcp_names(name: str, display: Any = None) -> tuple[str, str]:
    """``(server, tool)`` of an MCP tool: from the chat file's ``displayName`` ("lookup (notes
    MCP Server)") when given, else split as Gemini CLI does (``mcp_<server>_<tool>``)."""
    m = _MCP_DISPLAY.match(display) if isinstance(display, str) else None
    if m:
        return m.group(2), m.group(1)
    server, _, tool = name[len(SHAPES.mcp_prefix or ""):].partition("_")
    return server, tool or server


def short_hash(*parts: str, n: int = 16) -> str:
    return hashlib.sha256("\0".join(parts).encode("utf-8", "surrogatepass")).hexdigest()[:n]


def call_item(tid: str, name: str, args: dict, status: str, display: Any = None) -> dict:
    """The item a call of tool ``name`` with ``args`` is, in ``status``."""
    kind = kind_of(name)
    if kind == "command_execution":
        command = args.get("command")
        return {"id": tid, "type": kind, "command": command if isinstance(command, str) else "", "status": status}
    if kind == "file_change":
        path = args.get("file_path") or args.get("path") or ""
        return {"id": tid, "type": kind, "changes": [{"path": str(path), "kind": "update"}], "status": status}
    if kind == "mcp_tool_call":
        server, tool = mcp_names(name, display)
        return {"id": tid, "type": kind, "tool_name": name, "server": server, "tool": tool,
                "arguments": args, "status": status}
    if kind == "todo_list":
        todos = args.get("todos") if isinstance(args.get("todos"), list) else []
        return {"id": tid, "type": kind, "items": [
            {"text": str(t.get("description", "")), "completed": t.get("status") == "completed",
             "status": str(t.get("status", ""))} for t in todos if isinstance(t, dict)]}
    if kind == "web_search":
        query = args.get("query")
        return {"id": tid, "type": kind, "query": query if isinstance(query, str) else ""}
    if kind == "report":
        result = args.get("result")
        text = result.get("response") if isinstance(result, dict) else result
        if not isinstance(text, str):
            text = orjson.dumps(result).decode()
        return {"id": tid, "type": "agent_message", "text": text}
    return {"id": tid, "type": "tool_invocation", "tool_name": name, "status": status, "arguments": args}
