"""What every agent folder shares (issue 53): the form of an agent's table (:class:`Shapes`,
one per agent, in ``memfs/agents/<agent>/shapes.py``) and the helpers that read and write by
it — token counts (:func:`read_usage`, :func:`request_tokens`, :func:`native_usage`), tool
names (:func:`kind_of`), a command's exit code in its output (:func:`exit_code`,
:func:`with_exit`), an MCP call's cut result (:func:`mcp_outcome`), what a writer folds into
text (:func:`fold_text`, :data:`NO_RESULT`) and times (:func:`parse_time`, :func:`iso`,
:func:`iso_ms`, :func:`ms_of`). The reader and the writer of an agent use the same table, so a
name, a pattern or a token field is said once; no agent folder imports another. Pure; no I/O.

Token counts (SPEC §10, §12). memfs's *disjoint form* — a close's ``requests``, the usage view —
counts ``input`` without cache reads and writes, ``cached_input``, ``cache_creation`` and
``output`` with reasoning in it. A close's ``usage`` keeps the agent's own sense of
``input_tokens``: cache included (Codex, Gemini, OpenCode once read, the native family) unless
the agent's table says it records it disjoint (Claude: :func:`recorded_disjoint`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from memfs import counts
from memfs.facts import bounded_output


@dataclass(frozen=True)
class UsageShape:
    """An agent's usage object: ``fields`` maps its keys (``a.b``: key ``b`` of object ``a``) to
    memfs's Usage keys (``input_tokens``, ``cached_input_tokens``, ``cache_creation_tokens`` or
    ``cache_write_input_tokens``, ``output_tokens``, ``reasoning_output_tokens``)."""

    fields: tuple[tuple[str, str], ...]
    cache_in_input: bool = True  # the agent's input count includes the cache reads (and writes)
    reasoning_in_output: bool = True  # the agent's output count includes the reasoning
    recorded_disjoint: bool = False  # memfs records its input as the agent gives it, cache apart


@dataclass(frozen=True)
class LineFormat:
    """One format of an agent's records, as ``memfs import`` and ``memfs record`` tell formats
    apart (:func:`memfs.ingest.classify`): every agent's formats are asked in ``rank`` order
    (lower first: a line two tests take goes to the lower), ``test`` a decoded line."""

    kind: str  # its translator (a key of the agent's ``read.TRANSLATORS``)
    name: str  # what a refusal calls it
    test: Callable[[dict], bool]  # a decoded line is in this format
    session_id: Callable[[dict], str | None]  # the conversation id a line of it names, if any
    rank: int = 50
    attributed: bool = True  # a session read from it is the agent's (False: memfs's own event family)


class Subagent(NamedTuple):
    """A sub-agent's record file, as its path says (the importer's session ``<parent>.<leaf>``)."""

    parent: str  # the parent conversation's id
    conversation: str  # the sub-agent's conversation id
    leaf: str  # the last part of its session's name


@dataclass(frozen=True)
class Shapes:
    """One agent's table, read by its reader and its writer alike."""

    name: str
    tools: Mapping[str, str]  # the agent's tool name -> the item kind its call becomes
    writes: Mapping[str, str]  # an item kind (``kind`` or ``kind.variant``) -> the tool name an export writes
    usage: UsageShape
    mcp_prefix: str | None = None  # a tool name starting so is an MCP tool's
    exit_pattern: re.Pattern | None = None  # a command's exit code in its output (group 1)
    exit_format: str | None = None  # a command's output with its exit code, as the agent writes it
    times: str = "rfc3339"  # how its record gives times: "rfc3339", or "ms" (ms since the epoch)
    stream_usage: UsageShape | None = None  # its stream's usage object, when that is another shape
    formats: tuple[LineFormat, ...] = ()  # its records' formats, which ``memfs import`` reads
    command: str | None = None  # its command's name: ``memfs record <command> …`` knows the agent by it
    line: str | None = None  # what ``--format <name>`` calls a line; one of no format is refused so (None: kept)
    subagent: Callable[[Path, str], Subagent | None] | None = None  # a sub-agent's file, by its path and id
    # the identity layer (memfs.ingest.identity.Dedupe): a turn known only by its close is matched by
    # the thread's running token total (Codex's exec --json); a failed close with no item pairs with
    # another capture's (OpenCode's stream and store)
    closes_by_signature: bool = False
    pairs_failed: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)


def kind_of(shapes: Shapes, name: str) -> str:
    """The item kind of a call of the agent's tool ``name`` (``tool``: one memfs has no kind for)."""
    kind = shapes.tools.get(name)
    if kind is not None:
        return kind
    if shapes.mcp_prefix and name.startswith(shapes.mcp_prefix):
        return "mcp_tool_call"
    return "tool"


def exit_code(shapes: Shapes, output: str) -> int | None:
    """The exit code a command's output states in the agent's words, or None."""
    m = shapes.exit_pattern.search(output) if shapes.exit_pattern is not None else None
    return int(m.group(1)) if m else None


def with_exit(shapes: Shapes, code: int, output: str) -> str:
    """A command's output with its exit code, in the agent's words."""
    assert shapes.exit_format is not None
    return shapes.exit_format.format(code=code, output=output)


MCP_CONTENT_BYTES = 4096  # an agent's own MCP content blocks are kept while its text is no longer


def mcp_outcome(output: str, failed: bool, content: Any = None) -> tuple[dict | None, dict | None]:
    """An MCP call's ``(result, error)`` as ``exec --json`` writes them, from the call's output
    text cut to its first and last 2 KiB (:func:`memfs.facts.bounded_output`); the agent's own
    ``content`` blocks instead when it gives a list and the text is at most
    :data:`MCP_CONTENT_BYTES`."""
    if failed:
        return None, {"message": bounded_output(output)}
    if not isinstance(content, list) or len(output.encode()) > MCP_CONTENT_BYTES:
        content = [{"type": "text", "text": bounded_output(output)}]
    return {"content": content, "structured_content": None}, None


# --- what a writer cannot express -----------------------------------------------------------------

NO_RESULT = "memfs: no result was recorded for this call (the session ended before it finished)"
REASONING = "Reasoning: "  # the text a folded reasoning block begins with


def fold_text(item: dict) -> str | None:
    """What an item the target has no shape for says, as text (None: the item is a message or
    a tool call, which the targets express). Every writer folds so; Claude's marks the fold so
    that its reader restores the item (:func:`memfs.agents.claude.tools.unfold`)."""
    kind = item.get("type")
    if kind == "reasoning":
        return f"{REASONING}{item.get('text') or ''}"
    if kind == "plan":
        return f"Plan: {item.get('text') or ''}"
    if kind == "decision":
        return f"Decision: {item.get('summary') or ''} ({item.get('rationale') or ''})"
    if kind == "harness":
        return f"[{item.get('event') or 'harness'}] {item.get('message') or ''}".rstrip()
    if kind == "user_message":
        return f"User: {item.get('text') or ''}"
    if kind == "tool_output":
        return f"Output of tool call {item.get('call_id') or '?'}: {item.get('output') or ''}"
    if kind in ("agent_message", "command_execution", "mcp_tool_call", "file_change", "todo_list",
                "web_search", "tool_invocation", "error"):
        return None
    return f"[{kind}] {orjson.dumps({k: v for k, v in item.items() if k != 'id'}).decode()}"


# --- token counts ---------------------------------------------------------------------------------


def _flat(source: dict, fields: tuple[tuple[str, str], ...]) -> dict:
    """``source`` with each nested field ``a.b`` lifted to a key of its own."""
    out = dict(source)
    for src, _ in fields:
        outer, dot, inner = src.partition(".")
        if dot and type(source.get(outer)) is dict and inner in source[outer]:
            out[src] = source[outer][inner]
    return out


def read_usage(shape: UsageShape, raw: Any) -> dict:
    """The agent's usage object ``raw`` as memfs's Usage (a close's ``usage``): each count
    checked (:func:`memfs.counts.translate`: a refused one is named under ``usage_error``);
    reasoning the agent counts apart added to ``output_tokens``; a disjoint agent's cache
    added to ``input_tokens`` unless memfs records it disjoint. ``reasoning_output_tokens``
    and ``cache_write_input_tokens`` only when not zero."""
    if type(raw) is not dict:
        return {}
    out = counts.translate(_flat(raw, shape.fields), shape.fields)
    reasoning = out.get("reasoning_output_tokens", 0)
    if not shape.reasoning_in_output and reasoning:
        out["output_tokens"] = out.get("output_tokens", 0) + reasoning
    if not shape.cache_in_input and not shape.recorded_disjoint:
        cache = out.get("cached_input_tokens", 0) + out.get("cache_write_input_tokens", 0)
        out["input_tokens"] = out.get("input_tokens", 0) + cache
        out.setdefault("cached_input_tokens", 0)
        out.setdefault("output_tokens", 0)
    for key in ("cache_write_input_tokens", "reasoning_output_tokens"):
        if not out.get(key):
            out.pop(key, None)
    return out


def own_input(recorded_disjoint: bool, inp: int, cached: int, creation: int) -> int:
    """The input not read from or written to the cache, from a recorded ``input_tokens``."""
    return inp if recorded_disjoint else max(inp - cached - creation, 0)


def request_tokens(shape: UsageShape, usage: dict) -> dict:
    """A Usage (:func:`read_usage`) in memfs's disjoint form, as a close's ``requests`` entry
    takes it (:func:`memfs.ingest.request_entry`)."""
    cached = usage.get("cached_input_tokens", 0)
    creation = usage.get("cache_creation_tokens", 0) or usage.get("cache_write_input_tokens", 0)
    return {"input": own_input(shape.recorded_disjoint, usage.get("input_tokens", 0), cached, creation),
            "cached_input": cached, "cache_creation": creation, "output": usage.get("output_tokens", 0),
            "reasoning": usage.get("reasoning_output_tokens", 0)}


def native_usage(shape: UsageShape, own: dict) -> dict:
    """Counts in memfs's disjoint form (Usage names: ``input_tokens`` without the cache) as the
    agent's usage object — the inverse of :func:`read_usage` (reasoning inside output: 0 apart)."""
    cached, creation = own.get("cached_input_tokens", 0), own.get("cache_creation_tokens", 0)
    values = {"input_tokens": own.get("input_tokens", 0) + (cached + creation if shape.cache_in_input else 0),
              "cached_input_tokens": cached, "cache_creation_tokens": creation, "cache_write_input_tokens": creation,
              "output_tokens": own.get("output_tokens", 0), "reasoning_output_tokens": 0}
    out: dict = {}
    for src, dst in shape.fields:
        outer, dot, inner = src.partition(".")
        if dot:
            out.setdefault(outer, {})[inner] = values[dst]
        else:
            out[src] = values[dst]
    return out


# --- times ----------------------------------------------------------------------------------------

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def parse_time(text: Any) -> datetime | None:
    """An ISO 8601 time (``Z`` or an offset) as an aware datetime, or None."""
    if not isinstance(text, str) or not text:
        return None
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def iso(value: datetime) -> str:
    """``2026-12-03T07:58:54.967Z`` (milliseconds, UTC), as the agents write times."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"


def iso_ms(ms: Any) -> str | None:
    """A time in ms since the epoch (OpenCode's) as :func:`iso` writes it, or None."""
    if type(ms) not in (int, float) or ms <= 0:
        return None
    try:
        return iso(EPOCH + timedelta(milliseconds=ms))  # (exact: no float seconds in between)
    except (OverflowError, ValueError):
        return None


def ms_of(text: Any) -> int | None:
    """An ISO 8601 time in ms since the epoch, or None — the inverse of :func:`iso_ms`."""
    value = parse_time(text)
    return (value - EPOCH) // timedelta(milliseconds=1) if value is not None else None
