"""OpenCode's table (:class:`memfs.agents.common.Shapes`): its tool names, its token counts and
its times — read by :mod:`memfs.agents.opencode.read` (through :mod:`memfs.agents.opencode.store`)
and written by :mod:`memfs.agents.opencode.write`. A command's exit code is a field of its own
(``state.metadata.exit``), never a wording in its output."""

from __future__ import annotations

from memfs.agents.common import LineFormat, Shapes, UsageShape

# OpenCode's built-in tools; any other name is an MCP tool, named ``<server>_<tool>``
BUILTIN_TOOLS = frozenset((
    "bash", "read", "write", "edit", "multiedit", "patch", "apply_patch", "glob", "grep", "list", "ls",
    "task", "todowrite", "todoread", "webfetch", "websearch", "codesearch", "skill", "question", "lsp",
    "batch", "invalid", "plan_enter", "plan_exit",
))
FILE_TOOLS = frozenset(("write", "edit", "multiedit", "patch", "apply_patch"))

def is_stream(obj: dict) -> bool:
    """An ``opencode run --format json`` line: a ``sessionID`` and a ``part`` (or an ``error``)."""
    return type(obj.get("sessionID")) is str and (type(obj.get("part")) is dict or obj.get("type") == "error")


def session_id(obj: dict) -> str | None:
    sid = obj.get("sessionID")
    return sid if isinstance(sid, str) and sid else None


SHAPES = Shapes(
    name="opencode",
    # (its store is a database, which memfs.agents.opencode.read finds by its path)
    formats=(LineFormat("opencode", "opencode run --format json", is_stream, session_id, rank=30),),
    command="opencode",
    pairs_failed=True,
    line="an opencode run --format json line",
    tools={"bash": "command_execution", "todowrite": "todo_list", **dict.fromkeys(sorted(FILE_TOOLS), "file_change")},
    writes={"command_execution": "bash"},
    # disjoint: ``input`` excludes the cache reads and writes, ``output`` excludes ``reasoning``;
    # memfs records input with the cache and output with the reasoning, as for Codex
    usage=UsageShape((("input", "input_tokens"), ("cache.read", "cached_input_tokens"), ("output", "output_tokens"),
                      ("cache.write", "cache_write_input_tokens"), ("reasoning", "reasoning_output_tokens")),
                     cache_in_input=False, reasoning_in_output=False),
    times="ms",
)
