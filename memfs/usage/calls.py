"""Tool calls of a turn, by tool (SPEC §12): count, failures, durations where the log dates them.

Pure functions over ``item.completed`` items, called by the views' fold
(:class:`memfs.views.fold.Fold`) for each completed item of a turn. A tool call is an item of
:data:`TOOL_ITEMS`; its tool is the agent's own name when the item keeps it (``tool_name``; MCP
``server.tool``), else the item's type (``command_execution`` for a shell command, which Claude
calls Bash and Codex ``exec_command``). It failed when its status is ``failed``, its exit code
is not 0, or its MCP error is set. Its duration is the item's ``duration_ms``, else the time
between the ``context.timestamp`` of its ``item.started`` and of its ``item.completed``; calls
without either have no duration (the median is over the calls that have one).
"""

from __future__ import annotations

from memfs.facts import mcp_call
from memfs.store.meta import parse_rfc3339

TOOL_ITEMS = frozenset(("command_execution", "tool_invocation", "mcp_tool_call", "file_change", "web_search",
                        "todo_list"))


def item_time(item: dict) -> str | None:
    """The item's own ``context.timestamp``, if any."""
    context = item.get("context")
    at = context.get("timestamp") if type(context) is dict else None
    return at if type(at) is str else None


def tool_of(item: dict) -> str:
    itype = item["type"]
    if itype == "mcp_tool_call":
        name, _ = mcp_call(item)
        return name or "mcp_tool_call"
    name = item.get("tool_name")
    return name if type(name) is str and name else itype


def failed(item: dict) -> bool:
    if item.get("status") == "failed":
        return True
    code = item.get("exit_code")
    if type(code) is int and code != 0:
        return True
    return item.get("type") == "mcp_tool_call" and mcp_call(item)[1] is not None


def duration_ms(item: dict, started_at: str | None) -> float | None:
    ms = item.get("duration_ms")
    if type(ms) in (int, float) and ms >= 0:
        return float(ms)
    end = item_time(item)
    if started_at is None or end is None:
        return None
    a, b = parse_rfc3339(started_at), parse_rfc3339(end)
    if a is None or b is None or b < a:
        return None
    return round((b - a) * 1000, 3)


def note(tools: dict, item: dict, started_at: str | None) -> None:
    """Count ``item`` (a completed tool call) in ``tools``: ``{tool: [count, failures, [ms…]]}``."""
    entry = tools.get(name := tool_of(item))
    if entry is None:
        entry = tools[name] = [0, 0, []]
    entry[0] += 1
    if failed(item):
        entry[1] += 1
    ms = duration_ms(item, started_at)
    if ms is not None:
        entry[2].append(ms)


def merge(into: dict, tools: dict) -> None:
    for name, (count, fails, times) in tools.items():
        entry = into.get(name)
        if entry is None:
            entry = into[name] = [0, 0, []]
        entry[0] += count
        entry[1] += fails
        entry[2].extend(times)


def render(tools: dict) -> dict:
    """``{tool: {"count", "failures", "median_ms"}}``, tools sorted by name."""
    out = {}
    for name in sorted(tools):
        count, fails, times = tools[name]
        out[name] = {"count": count, "failures": fails, "median_ms": _median(times)}
    return out


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else round((s[mid - 1] + s[mid]) / 2, 3)
