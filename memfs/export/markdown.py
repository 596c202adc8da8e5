"""A session as Markdown, for people (SPEC §11 ``--to markdown``; ``derived/transcript.md``).

:func:`render` gives the whole text: a header from the session's metadata
(``index/about.json``: title, agent, model, project, branch, times, status, what it was forked
from), then each turn under ``## Turn N — outcome`` with its prompt (the ``turn.started``
context's, else what a later capture noted), messages, reasoning, plans, commands and tool
calls with their arguments and results, file changes (with their diff or written content when
the record has it, :mod:`memfs.agents.changes`), todo lists, errors and failures (shown,
never dropped), and the turn's token usage when the record has it. Records outside turns
(a compaction, the thread's end) appear where they are in the log. A long output or argument
is cut to its first and last 2 KiB with a marker saying how much was left out. Text from the
session stays text (:mod:`memfs.export.markdown_text`: no HTML, no link, no heading or turn of
its own, no code block left open) and its control characters are shown (:func:`memfs.text.visible`).

:class:`Transcript` renders the same text incrementally: the log is cut into segments (each
turn, and the records between turns) and a segment is rendered once, until its bytes or its
turn's notes change; a cap rewrite or a new opening of the session starts over. Used by the
``transcript.md`` view (:mod:`memfs.views.transcript`).
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from memfs.events import decode_stored
from memfs.export.markdown_text import code_span, labeled, md_block, md_inline
from memfs.facts import OUTPUT_HEAD, OUTPUT_TAIL
from memfs.store import about as about_file
from memfs.text import one_line, visible

_FENCE = re.compile(r"`{3,}")
_MAX_KEPT = OUTPUT_HEAD + OUTPUT_TAIL


def cut(text: str) -> str:
    """``text`` whole when it is at most 4 KiB of UTF-8, else its first and last 2 KiB (on
    character boundaries) around a line ``… [N bytes cut] …``."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= _MAX_KEPT:
        return text
    head = data[:OUTPUT_HEAD].decode("utf-8", "ignore")
    tail = data[-OUTPUT_TAIL:].decode("utf-8", "ignore")
    gone = len(data) - len(head.encode("utf-8", "surrogatepass")) - len(tail.encode("utf-8", "surrogatepass"))
    return f"{head}\n… [{gone} bytes cut] …\n{tail}"


def fenced(text: str, lang: str = "text") -> str:
    """``text`` in a code block whose fence is longer than any backtick run inside it."""
    longest = max((len(m) for m in _FENCE.findall(text)), default=2)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{lang}\n{text.rstrip(chr(10))}\n{fence}\n"


def _one_line(value: Any, limit: int = 200) -> str:
    text = one_line(str(value))
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _inline(value: Any, limit: int = 200) -> str:
    """A value on one line as Markdown text (:func:`memfs.export.markdown_text.md_inline`)."""
    return md_inline(_one_line(value, limit))


def _code(value: Any, limit: int = 200) -> str:
    return code_span(_one_line(value, limit))


def _json_text(value: Any) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()
    except TypeError:
        return str(value)


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _quote(text: str) -> str:
    """A message's text (:func:`md_block`) in a block quote."""
    return "\n".join("> " + line if line else ">" for line in md_block(text).split("\n")) + "\n"


def _usage(usage: Any) -> str | None:
    if not isinstance(usage, dict):
        return None
    parts = []
    for key, label in (("input_tokens", "input"), ("cached_input_tokens", "cached input"),
                       ("cache_creation_tokens", "cache creation"), ("output_tokens", "output"),
                       ("reasoning_output_tokens", "reasoning")):
        value = usage.get(key)
        if type(value) is int and value:
            parts.append(f"{label} {value:,}")
    return "_Usage: " + " · ".join(parts) + "_\n" if parts else None


# --- the header --------------------------------------------------------------------------------


def header(name: str, session_id: str, meta: dict) -> str:
    """The title line and the session's metadata as a list."""
    title = _inline(_str(meta.get("title")) or session_id or name, 120)
    lines = [f"# {title}", ""]
    ident = _code(name) + (f" (id {_code(session_id, 120)})" if session_id and session_id != name else "")
    lines.append(f"- **Session:** {ident}")
    agent = _str(meta.get("agent"))
    if agent:
        version = _str(meta.get("agent_version"))
        lines.append(f"- **Agent:** {_inline(agent)}" + (f" {_inline(version)}" if version else ""))
    for key, label in (("model", "Model"), ("project", "Project"), ("cwd", "Working directory"),
                       ("git_branch", "Branch"), ("conversation_id", "Conversation"),
                       ("started_at", "Started"), ("ended_at", "Ended"), ("status", "Status"),
                       ("parent_session", "Parent session"), ("pr_link", "Pull request")):
        value = _str(meta.get(key))
        if value and not (key == "cwd" and value == meta.get("project")) and \
                not (key == "conversation_id" and value in (name, session_id)):
            lines.append(f"- **{label}:** {_inline(value)}")
    source = _str(meta.get("forked_from"))
    if source:
        at = meta.get("forked_at_turn")
        lines.append(f"- **Forked from:** {_code(source)}" + (f" at turn {at}" if type(at) is int else ""))
    return "\n".join(lines) + "\n"


# --- events ------------------------------------------------------------------------------------


def _tool_block(title: str, arguments: Any, result: str | None, error: str | None) -> str:
    out = [title + "\n"]
    if arguments not in (None, "", {}, []):
        text = arguments if isinstance(arguments, str) else _json_text(arguments)
        out.append("\nArguments:\n\n" + fenced(cut(text), "" if isinstance(arguments, str) else "json"))
    if error:
        out.append("\n" + labeled("**Error:**", cut(error)))
    if result:
        out.append("\nResult:\n\n" + fenced(cut(result)))
    return "".join(out)


def _status(item: dict, extra: str = "") -> str:
    status = _str(item.get("status"))
    text = (_inline(status) if status else "") + extra
    if status == "failed":
        text = "**FAILED**" + extra
    elif status == "declined":
        text = "**DECLINED**" + extra
    return f" — {text}" if text else ""


def _mcp_result(result: Any) -> str | None:
    if not isinstance(result, dict):
        return None if result is None else _json_text(result)
    texts = [block.get("text") for block in result.get("content") or []
             if isinstance(block, dict) and isinstance(block.get("text"), str)]
    if texts:
        return "\n".join(texts)
    structured = result.get("structured_content")
    return _json_text(structured) if structured is not None else None


def item_markdown(item: dict) -> str:
    """One ``ThreadItem`` (its last state) as Markdown."""
    kind = item.get("type")
    if kind == "agent_message":
        return md_block(_str(item.get("text")) or "") + "\n"
    if kind == "reasoning":
        return "_Reasoning:_\n\n" + _quote(cut(_str(item.get("text")) or ""))
    if kind == "plan":
        return "**Plan:**\n\n" + md_block(_str(item.get("text")) or "") + "\n"
    if kind == "decision":
        out = labeled("**Decision:**", _str(item.get("summary")) or "")
        rationale = _str(item.get("rationale"))
        return out + (f"\n{md_block(rationale)}\n" if rationale else "")
    if kind == "command_execution":
        code = item.get("exit_code")
        title = f"**Command** {_code(item.get('command') or '', 300)}" + _status(
            item, f" (exit {code})" if type(code) is int else "")
        return _tool_block(title, item.get("arguments"), _str(item.get("aggregated_output")), None)
    if kind == "mcp_tool_call":
        server, tool = _str(item.get("server")), _str(item.get("tool"))
        name = f"{server}.{tool}" if server and tool else (_str(item.get("tool_name")) or tool or "?")
        error = item.get("error")
        message = _str(error.get("message")) if isinstance(error, dict) else _str(error)
        return _tool_block(f"**MCP tool** {_code(name)}" + _status(item), item.get("arguments"),
                           _mcp_result(item.get("result")), message)
    if kind == "tool_invocation":
        output = item.get("output")
        return _tool_block(f"**Tool** {_code(item.get('tool_name') or '?')}" + _status(item),
                           item.get("arguments"), output if isinstance(output, str) else
                           (None if output is None else _json_text(output)), _str(item.get("error")))
    if kind == "tool_output":
        output = item.get("output")
        return _tool_block(f"**Tool output** for {_code(item.get('call_id') or '?')}" + _status(item), None,
                           output if isinstance(output, str) else (None if output is None else _json_text(output)),
                           None)
    if kind == "file_change":
        parts = []
        for change in (c for c in item.get("changes") or [] if isinstance(c, dict)):
            parts.append(f"- {_inline(change.get('kind') or '?')} {_code(change.get('path') or '?', 300)}\n")
            diff, content = _str(change.get("diff")), _str(change.get("content"))
            if diff or content:  # what it changed (memfs.agents.changes)
                parts.append("\n" + fenced(cut(diff or content or ""), "diff" if diff else "text") + "\n")
        return "**Files changed**" + _status(item) + ":\n\n" + "".join(parts).rstrip("\n") + "\n"
    if kind == "todo_list":
        lines = []
        for entry in item.get("items") or []:
            if isinstance(entry, dict):
                lines.append(f"- [{'x' if entry.get('completed') else ' '}] {_inline(entry.get('text') or '')}")
        return "**Todo list:**\n\n" + "\n".join(lines) + "\n"
    if kind == "web_search":
        return f"**Web search:** {_inline(item.get('query') or '')}\n"
    if kind == "harness":
        message = _str(item.get("message"))
        return f"_{_inline(item.get('event') or 'harness')}_" + (f": {_inline(message, 500)}" if message else "") + "\n"
    if kind == "error":
        return labeled("**Error:**", cut(_str(item.get('message')) or ''))
    return f"_{_inline(kind)} item_\n\n" + fenced(cut(_json_text(item)), "json")


def event_markdown(event: dict) -> str | None:
    """An event that is not an item, a turn's start or its close, as Markdown (None: nothing
    worth showing)."""
    kind = event.get("type")
    if kind == "thread.completed":
        parts = [_inline(p) for p in (_str(event.get("subtype")), _str(event.get("outcome_code"))) if p]
        num = event.get("num_turns")
        cost = event.get("total_cost_usd")
        if type(num) is int:
            parts.append(f"{num} turn{'s' if num != 1 else ''}")
        if isinstance(cost, (int, float)) and not isinstance(cost, bool):
            parts.append(f"cost ${cost:.4f}")
        failed = event.get("subtype") not in (None, "success")
        return ("**Thread ended — FAILED:** " if failed else "_Thread ended: ") + ", ".join(parts) + \
            ("" if failed else "_") + "\n"
    if kind == "thread.compact_boundary":
        return f"_— context compacted ({_inline(event.get('trigger') or '?')}) —_\n"
    if kind == "context.reset":
        return f"_— context reset ({_inline(event.get('trigger') or '?')}) —_\n"
    if kind == "error":
        return labeled("**Error:**", cut(_str(event.get('message')) or ''))
    if kind == "turn.blocked":
        return labeled("**Turn blocked:**", cut(_str(event.get('message')) or ''))
    if kind == "permission.requested":
        return f"_Permission requested for {_code(event.get('tool_name') or '?')}_\n"
    if kind == "permission.resolved":
        return f"_Permission for {_code(event.get('tool_name') or '?')}: {_inline(event.get('decision') or '?')}_\n"
    if kind in ("thread.started", "plan.delta", "item.updated") or not isinstance(kind, str):
        return None
    if kind.startswith("goal."):
        detail = _str(event.get("objective")) or _str(event.get("reason"))
        return f"_{_inline(kind)}_" + (f": {_inline(detail, 500)}" if detail else "") + "\n"
    return f"_{_inline(kind)}_\n"


def _failed_message(event: dict) -> str:
    error = event.get("error")
    return (_str(event.get("message")) or (_str(error.get("message")) if isinstance(error, dict) else None)
            or "(no message)")


def segment_markdown(events: list[dict], turn: int | None, note: dict | None, outcome: str | None = None) -> str:
    """A segment's events as Markdown: turn ``turn`` (its ``turn_notes`` entry ``note``; its
    ``outcome`` as the turn index says, else as its closing event says), or records between
    turns (``turn`` None). An item shows its last state at the place of its first event."""
    last: dict[str, dict] = {}
    for event in events:
        item = event.get("item")
        if isinstance(item, dict) and isinstance(item.get("id"), str) and str(event.get("type")).startswith("item."):
            last[item["id"]] = item
    note = note or {}
    blocks: list[str] = []
    shown: set[str] = set()
    closed = None
    for event in events:
        kind = event.get("type")
        if kind == "turn.started":
            ctx = event.get("context") if isinstance(event.get("context"), dict) else {}
            prompt = _str(ctx.get("prompt")) or _str(note.get("prompt"))
            if prompt:
                origin = _str(ctx.get("origin")) or "user"
                when = _str(ctx.get("timestamp"))
                blocks.append(f"**Prompt** ({_inline(origin)}" + (f", {_inline(when)}" if when else "") + "):\n\n"
                              + _quote(cut(prompt)))
            continue
        if kind in ("turn.completed", "turn.failed"):
            closed = event
            if kind == "turn.failed":
                blocks.append(labeled("**Turn failed:**", cut(_failed_message(event))))
            usage = _usage(event.get("usage")) or _usage(note.get("usage"))
            if usage:
                blocks.append(usage)
            continue
        item = event.get("item")
        if isinstance(kind, str) and kind.startswith("item.") and isinstance(item, dict):
            iid = item.get("id")
            if isinstance(iid, str):
                if iid in shown:
                    continue
                shown.add(iid)
                item = last[iid]
            blocks.append(item_markdown(item))
            continue
        text = event_markdown(event)
        if text:
            blocks.append(text)
    if turn is None:
        return "".join(b + "\n" for b in blocks)
    if closed is not None:
        outcome = "failed" if closed.get("type") == "turn.failed" else "completed"
    shown_outcome = "FAILED" if outcome == "failed" else (outcome or "open")
    return f"## Turn {turn} — {shown_outcome}\n\n" + "".join(b + "\n" for b in blocks)


# --- a whole session ---------------------------------------------------------------------------


class Transcript:
    """The Markdown of one session, kept between calls: see the module docstring."""

    def __init__(self) -> None:
        self.opening: object = None  # the session's opening and its rewrites count the cached segments belong to
        self.rewrites = -1
        self.segments: dict[tuple, str] = {}  # (start, end, turn, note) -> Markdown

    def render(self, handle) -> str:
        meta = about_file.read(handle.path)
        notes = meta.get("turn_notes") if isinstance(meta.get("turn_notes"), dict) else {}
        with handle.reads.hold():  # the index, the length and the lines from one version of the log
            opening, rewrites = handle.reads.opening, handle.rewrites
            same = opening is self.opening and rewrites == self.rewrites
            end = handle.file_len
            index = handle.turn_index
            plan = self._plan(index, end, notes)
            todo = [seg for seg in plan if not same or seg not in self.segments]
            lines = handle.iter_lines(todo[0][0], todo[-1][1]) if todo else None
        if not same:
            self.opening, self.rewrites, self.segments = opening, rewrites, {}
        if lines is not None:
            wanted = iter(todo)
            seg = next(wanted)
            events: list[dict] = []
            try:
                for offset, line in lines:
                    while offset >= seg[1]:
                        self.segments[seg] = visible(self._segment(events, seg))
                        seg, events = next(wanted), []
                    if offset >= seg[0]:
                        decoded = decode_stored(line) if line else None
                        if decoded is not None:
                            events.append(decoded[1])
            finally:
                lines.close()
            self.segments[seg] = visible(self._segment(events, seg))
            for seg in wanted:
                self.segments[seg] = visible(self._segment([], seg))
        self.segments = {seg: self.segments[seg] for seg in plan}  # (only what the log still has)
        body = "".join(self.segments[seg] for seg in plan)
        return visible(header(handle.name, handle.session_id, meta)) + "\n" + (body or "_No events yet._\n")

    @staticmethod
    def _segment(events: list[dict], seg: tuple) -> str:
        note = orjson.loads(seg[3]) if seg[3] else None
        return segment_markdown(events, seg[2], note, seg[4])

    @staticmethod
    def _plan(index: list[dict], end: int, notes: dict) -> list[tuple]:
        """The log's segments ``(start, end, turn or None, note JSON or b"", outcome)`` in order."""
        plan: list[tuple] = []
        pos = 0
        for entry in index:
            start, stop, n = entry["start_offset"], entry["end_offset"], entry["turn_number"]
            if start > pos:
                plan.append((pos, start, None, b"", None))
            note = notes.get(str(n))
            outcome = entry.get("outcome")
            plan.append((start, stop, n, orjson.dumps(note) if isinstance(note, dict) else b"",
                         outcome if isinstance(outcome, str) and outcome != "unknown" else None))
            pos = stop
        if end > pos:
            plan.append((pos, end, None, b"", None))
        return plan


def render(handle) -> str:
    """The session of ``handle`` as Markdown (see the module docstring)."""
    return Transcript().render(handle)
