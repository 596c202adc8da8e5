"""Codex's table (:data:`SHAPES`: tool names, the ``Process exited with code N`` wrapper of a
command's output, its ``TokenUsage``), used by :mod:`memfs.agents.codex.read` and
:mod:`memfs.agents.codex.write`, and small pure readers of rollout shapes used by the reader
(command lines, tool outputs and their exit codes, MCP results, prompts). Shapes of
``codex-rs/protocol`` as Codex CLI 0.171 writes them, older ones too."""

from __future__ import annotations

import re
import shlex
from typing import Any

import orjson

from memfs.agents import common
from memfs.agents.changes import patch_changes  # noqa: F401  (the Codex reader's name for it)
from memfs.agents.common import LineFormat, Shapes, UsageShape, read_usage
from memfs.formats import codex_rollout
from memfs.ingest import text_of

SHELL_TOOLS = ("shell", "container.exec", "exec_command", "local_shell", "shell_command")
# user-role text Codex writes itself: environment, instructions, notices (never the prompt)
NOT_PROMPT = ("<environment_context>", "<user_instructions>", "<INSTRUCTIONS>", "# AGENTS.md instructions",
              "<skills_instructions>", "<permissions instructions>", "<user_shell_command>", "<turn_aborted>",
              "<collaboration_mode>", "<personality", "<apps_instructions>")
SUMMARY_PREFIX = "Another language model started to solve this problem"
# 0.171 ``item_completed`` item types: a rollout that writes them has its answers there
V2_ITEMS = frozenset(("UserMessage", "AgentMessage", "Reasoning", "CommandExecution", "McpToolCall",
                      "FileChange", "WebSearch", "ContextCompaction", "Plan"))
USAGE_KEYS = ("input_tokens", "cached_input_tokens", "output_tokens")

def is_event(obj: dict) -> bool:
    """A line of this event family in its envelope (``event`` and ``schema_version``)."""
    return "event" in obj and "schema_version" in obj


def is_bare_event(obj: dict) -> bool:
    """A bare line of this event family (``exec --json``'s): a dotted ``type``, or ``error``."""
    kind = obj.get("type")
    return isinstance(kind, str) and ("." in kind or kind == "error")


def thread_id(obj: dict) -> str | None:
    """The thread a ``thread.started`` line (bare or in its envelope) names."""
    event = obj.get("event", obj)
    tid = event.get("thread_id") if isinstance(event, dict) and event.get("type") == "thread.started" else None
    return tid if isinstance(tid, str) and tid else None


def rollout_id(obj: dict) -> str | None:
    """The session a rollout's ``session_meta`` line names."""
    payload = obj.get("payload")
    sid = payload.get("id") if obj.get("type") == "session_meta" and isinstance(payload, dict) else None
    return sid if isinstance(sid, str) and sid else None


EXEC = "Codex exec --json / memfs events"
SHAPES = Shapes(
    name="codex",
    # this event family (memfs's own: ``exec --json`` writes it) is asked first in its envelope
    # and last bare (a dotted type); a rollout line has its envelope (memfs.formats.codex_rollout)
    formats=(LineFormat("native", EXEC, is_event, thread_id, rank=0, attributed=False),
             LineFormat("rollout", "a Codex rollout file", codex_rollout, rollout_id, rank=10),
             LineFormat("native", EXEC, is_bare_event, thread_id, rank=90, attributed=False)),
    command="codex",
    closes_by_signature=True,
    tools={**dict.fromkeys(SHELL_TOOLS, "command_execution"), "apply_patch": "file_change",
           "update_plan": "todo_list"},
    writes={"command_execution": "exec_command", "file_change": "apply_patch", "todo_list": "update_plan"},
    mcp_prefix="mcp__",
    exit_pattern=re.compile(r"^Process exited with code (-?\d{1,9})$", re.M),
    exit_format="Process exited with code {code}\nOutput:\n{output}",
    # input_tokens counts the cache reads; output_tokens the reasoning
    usage=UsageShape(tuple((key, key) for key in (*USAGE_KEYS, "reasoning_output_tokens"))),
)


def usage_of(u: Any) -> dict:
    """The token counters of a Codex ``TokenUsage`` this family has a place for, and its
    ``reasoning_output_tokens`` when there are any (part of output; memfs.usage reports them)."""
    return read_usage(SHAPES.usage, u)


def request_tokens(total: dict, before: dict) -> dict | None:
    """One model request's tokens from a ``token_count`` (:func:`usage_of` of its running
    ``total``; ``before``: the previous one): the total's growth (a repeated count adds nothing:
    None; a total that started again is its own), in memfs's disjoint form (Codex counts cache
    reads inside ``input_tokens``; reasoning is part of output)."""
    grew = {k: v - before.get(k, 0) for k, v in total.items()}
    if any(v < 0 for v in grew.values()):
        grew = dict(total)
    if not any(grew.values()):
        return None
    return common.request_tokens(SHAPES.usage, grew)


def command_text(value: Any) -> str:
    """A command as one line: ``[bash, -lc, X]`` is ``X``; other argv lists shell-joined."""
    if isinstance(value, list):
        parts = [str(p) for p in value]
        if len(parts) == 3 and parts[0] in ("bash", "sh", "zsh", "/bin/bash", "/bin/sh", "/bin/zsh") \
                and parts[1] in ("-lc", "-c"):
            return parts[2]
        return shlex.join(parts)
    return value if isinstance(value, str) else ""


def json_or_text(value: Any) -> Any:
    """A JSON string decoded; anything else (or invalid JSON) as it is."""
    if not isinstance(value, str):
        return value
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:
        return value


def prompt_text(content: Any) -> str | None:
    """The prompt in a user message's content: its text blocks that are not Codex's own
    (environment context, instructions); None when none is left."""
    blocks = content if isinstance(content, list) else [content]
    parts = [t for t in (text_of([b]) for b in blocks) if t.strip() and not t.lstrip().startswith(NOT_PROMPT)]
    text = "\n".join(parts)
    return text if text.strip() else None


def harness_made(payload: dict) -> bool:
    """A 0.171 message Codex wrote itself (its content's provenance is ``harness``)."""
    meta = payload.get("internal_chat_message_metadata_passthrough")
    marks = meta.get("content_item_metadata") if isinstance(meta, dict) else None
    return isinstance(marks, list) and any(
        isinstance(m, dict) and isinstance(m.get("provenance"), dict) and m["provenance"].get("type") == "harness"
        for m in marks)


def tool_output(output: Any) -> tuple[str, int | None, bool | None]:
    """``(text, exit code, success)`` of a ``function_call_output``'s ``output``: Codex's
    ``{content, success}``, its JSON ``{"output", "metadata": {"exit_code"}}``, or its text
    ``…Process exited with code N…\\nOutput:\\n<text>`` (0.1xx unified exec)."""
    if isinstance(output, dict):
        success = output.get("success")
        return text_of(output.get("content")), None, success if type(success) is bool else None
    text = text_of(output)
    if text.startswith("{"):
        decoded = json_or_text(text)
        if isinstance(decoded, dict) and "output" in decoded:
            meta = decoded.get("metadata")
            code = meta.get("exit_code") if isinstance(meta, dict) else None
            return text_of(decoded.get("output")), code if type(code) is int else None, None
    code = None
    head, sep, rest = text.partition("\nOutput:\n")
    if sep and len(head) < 1024:
        code = common.exit_code(SHAPES, head)
        text = rest
    return text, code, None


def mcp_result(result: Any) -> tuple[dict | None, dict | None, str]:
    """``(result, error, status)`` of an MCP call's result as ``exec --json`` writes them, from
    ``mcp_tool_call_end``'s ``{"Ok": …}``/``{"Err": …}`` or an item's ``CallToolResult``."""
    if isinstance(result, dict) and "Err" in result:
        return None, {"message": text_of(result["Err"]) or str(result["Err"])}, "failed"
    ok = result.get("Ok") if isinstance(result, dict) and "Ok" in result else result
    if not isinstance(ok, dict):
        return None, None, "completed"
    content = ok.get("content") if isinstance(ok.get("content"), list) else []
    out = {"content": content, "structured_content": ok.get("structured_content", ok.get("structuredContent"))}
    failed = ok.get("is_error", ok.get("isError")) is True
    return out, ({"message": text_of(content) or "error"} if failed else None), "failed" if failed else "completed"


def mcp_name(name: str, namespace: Any) -> tuple[str, str] | None:
    """``(server, tool)`` of a function call that is an MCP tool's, else None."""
    if isinstance(namespace, str) and namespace.startswith("mcp__") and len(namespace) > 5:
        return namespace[5:].rstrip("_"), name
    if name.startswith("mcp__"):
        server, sep, tool = name[5:].partition("__")
        if sep and server and tool:
            return server, tool
    return None

def turn_signature(event: dict) -> tuple | None:
    """What identifies a Codex turn's close across captures of one thread (memfs.ingest.identity):
    ``("failed", message)`` for a failed turn; ``("completed", input, cached, output)`` — the
    thread's running token total at the turn's end — for a completed one. ``exec --json``'s
    ``turn.completed`` reports that total as its ``usage``; a rollout's close carries it as
    ``thread_usage`` (its ``usage`` being the turn's own). None for other events."""
    etype = event.get("type")
    if etype == "turn.failed":
        message = event.get("message")
        if type(message) is not str:
            error = event.get("error")
            message = error.get("message") if type(error) is dict else None
        return ("failed", message if type(message) is str else "")
    if etype == "turn.completed":
        total = event.get("thread_usage", event.get("usage"))
        total = total if type(total) is dict else {}
        return ("completed", *(total.get(k) if type(total.get(k)) is int else 0 for k in USAGE_KEYS))
    return None
