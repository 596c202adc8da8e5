"""Claude Code's table (:class:`memfs.agents.common.Shapes`): its tool names, how a command's
output states its exit code, its usage object — read by :mod:`memfs.agents.claude.read` and
:mod:`memfs.agents.claude.tools`, written by :mod:`memfs.agents.claude.write`."""

from __future__ import annotations

import re
from pathlib import Path

from memfs.agents.common import LineFormat, Shapes, Subagent, UsageShape
from memfs.formats import CLAUDE_METADATA_TYPES, CLAUDE_STREAM_TYPES, CLAUDE_TRANSCRIPT_TYPES

FILE_TOOLS = ("Edit", "Write", "MultiEdit", "NotebookEdit")
WEB_TOOLS = ("WebSearch", "WebFetch")
AGENT_TOOLS = ("Agent", "Task")  # the sub-agent tool (``stream-json`` ``init`` names it ``Task``)
TASK_TOOLS = ("TaskCreate", "TaskUpdate")

LINE_TYPES = CLAUDE_STREAM_TYPES | CLAUDE_TRANSCRIPT_TYPES | CLAUDE_METADATA_TYPES


def is_claude(obj: dict) -> bool:
    """A ``stream-json`` or transcript line: a ``type`` of :data:`LINE_TYPES`, or a ``sessionId``
    (asked after the other agents', whose lines may have such a type)."""
    kind = obj.get("type")
    return isinstance(kind, str) and (kind in LINE_TYPES or "sessionId" in obj)


def session_id(obj: dict) -> str | None:
    sid = obj.get("session_id") or obj.get("sessionId")
    return sid if isinstance(sid, str) and sid else None


def subagent(path: Path, sid: str) -> Subagent | None:
    """A sub-agent's transcript ``agent-<id>.jsonl`` (it names its parent's session id):
    conversation ``<parent id>.agent-<id>``, session ``<parent session>.agent-<id>``."""
    return Subagent(sid, f"{sid}.{path.stem}", path.stem) if path.stem.startswith("agent-") else None


SHAPES = Shapes(
    name="claude",
    formats=(LineFormat("claude", "Claude Code stream-json or transcript", is_claude, session_id, rank=40),),
    command="claude",
    line="a Claude Code message",
    subagent=subagent,
    tools={"Bash": "command_execution", **dict.fromkeys(FILE_TOOLS, "file_change"),
           **dict.fromkeys(WEB_TOOLS, "web_search"), "TodoWrite": "todo_list",
           **dict.fromkeys(TASK_TOOLS, "tasks"), **dict.fromkeys(AGENT_TOOLS, "agent")},
    writes={"command_execution": "Bash", "file_change": "Edit", "file_change.add": "Write",
            "web_search": "WebSearch", "web_search.open_page": "WebFetch", "todo_list": "TodoWrite"},
    mcp_prefix="mcp__",
    # a failed Bash result begins with its exit code (a successful one says none: 0)
    exit_pattern=re.compile(r"\AExit code (\d{1,9})\b"),
    exit_format="Exit code {code}\n{output}",
    # disjoint: input_tokens without cache reads and writes; output_tokens with thinking
    usage=UsageShape((("input_tokens", "input_tokens"), ("cache_read_input_tokens", "cached_input_tokens"),
                      ("cache_creation_input_tokens", "cache_creation_tokens"), ("output_tokens", "output_tokens")),
                     cache_in_input=False, recorded_disjoint=True),
)
