"""Grounded facts (SPEC §4.1): the short, searchable statements an event contributes.

A pure function of one decoded event. Used by the memory view, by search (through the view)
and by the eviction-summary hook, so evicted history keeps its facts.

Decisions recorded here where the spec is silent:

* Items contribute only through ``item.completed``; ``item.started``/``item.updated`` carry
  partial text that would otherwise be indexed again at every update.
* A command execution without an ``exit_code`` reads ``ran <command>``; one the approval
  policy refused (Codex's ``declined``) reads ``declined: <command>``.
* Both dialects of SPEC §2 are read: an MCP call reads ``called <server>.<tool>`` (Codex) or
  ``called <tool_name>`` (VT Code), plus `` failed: <message>`` when it carries an error
  (`` failed`` alone for a ``failed`` status without one); a failed turn's reason is its
  ``message`` or Codex's ``error.message`` (:func:`failure_message`); a web search reads
  ``web search: <query>``; an ``error`` item its message; a to-do list
  ``todo: [x] first; [ ] second``.
"""

from __future__ import annotations

MAX_FACT_BYTES = 512
_CUT_BYTES = MAX_FACT_BYTES - len("…".encode())


OUTPUT_HEAD = OUTPUT_TAIL = 2048  # bytes of a long tool output kept from its start and its end


def bounded_output(text: str) -> str:
    """A tool's output as stored in an item (``aggregated_output``, an output): whole when it
    is at most :data:`OUTPUT_HEAD` + :data:`OUTPUT_TAIL` UTF-8 bytes, else its first and last
    2 KiB (cut on character boundaries) joined by ``"\n…\n"``."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= OUTPUT_HEAD + OUTPUT_TAIL:
        return text
    return (data[:OUTPUT_HEAD].decode("utf-8", "ignore") + "\n…\n"
            + data[-OUTPUT_TAIL:].decode("utf-8", "ignore"))


def normalize_fact(text: str) -> str:
    """Collapse whitespace runs to one space, trim, and cut to ≤ 512 UTF-8 bytes with ``…``."""
    text = " ".join(text.split())
    encoded = text.encode()
    if len(encoded) <= MAX_FACT_BYTES:
        return text
    return encoded[:_CUT_BYTES].decode("utf-8", "ignore") + "…"


def failure_message(event: dict) -> str | None:
    """The reason of a ``turn.failed`` / ``turn.blocked`` / ``error`` event: its ``message``,
    or Codex's ``{"error": {"message": …}}``; None when it has neither as a string."""
    message = event.get("message")
    if type(message) is str:
        return message
    error = event.get("error")
    if type(error) is dict and type(error.get("message")) is str:
        return error["message"]
    return None


def mcp_call(item: dict) -> tuple[str | None, str | None]:
    """``(name, error message)`` of an ``mcp_tool_call`` item in either dialect: the name is
    ``server.tool`` (Codex; ``tool`` alone without a server) or ``tool_name`` (VT Code)."""
    tool, server = item.get("tool"), item.get("server")
    if type(tool) is str:
        name = f"{server}.{tool}" if type(server) is str and server else tool
    else:
        name = item.get("tool_name") if type(item.get("tool_name")) is str else None
    error = item.get("error")
    message = error.get("message") if type(error) is dict else None
    return name, message if type(message) is str else None


def todo_entries(item: dict) -> list[tuple[str, bool]]:
    """``[(text, completed)]`` of a ``todo_list`` item; malformed entries are skipped."""
    items = item.get("items")
    if type(items) is not list:
        return []
    return [(e["text"], e.get("completed") is True) for e in items
            if type(e) is dict and type(e.get("text")) is str]


def _item_facts(item: dict) -> list[tuple[str, str]]:
    itype = item.get("type")
    if itype in ("agent_message", "plan"):
        return [(itype, item.get("text"))]
    if itype == "decision":
        return [(itype, item.get("summary"))]
    if itype == "file_change":
        out = []
        for change in item.get("changes") or ():
            if isinstance(change, dict) and isinstance(change.get("path"), str):
                out.append((itype, f"file {change.get('kind')}: {change['path']}"))
        return out
    if itype == "command_execution":
        command = item.get("command")
        if not isinstance(command, str):
            return []
        if item.get("status") == "declined":
            return [(itype, f"declined: {command}")]
        code = item.get("exit_code")
        return [(itype, f"ran {command}" if code is None else f"ran {command} (exit {code})")]
    if itype in ("harness", "error"):
        return [(itype, item.get("message"))]
    if itype == "mcp_tool_call":
        name, error = mcp_call(item)
        if name is None:
            return []
        if error is not None:
            return [(itype, f"called {name} failed: {error}")]
        return [(itype, f"called {name} failed" if item.get("status") == "failed" else f"called {name}")]
    if itype == "web_search":
        query = item.get("query")
        return [(itype, f"web search: {query}")] if type(query) is str and query.strip() else []
    if itype == "todo_list":
        entries = todo_entries(item)
        if not entries:
            return []
        return [(itype, "todo: " + "; ".join(("[x] " if done else "[ ] ") + text for text, done in entries))]
    return []


def event_facts(event: dict) -> list[tuple[str, str]]:
    """Return ``[(fact_type, normalized_text), ...]`` for one event; empty facts are dropped.

    Duplicates are not removed here: that is a property of a whole list of facts.
    """
    etype = event.get("type")
    if etype == "item.completed":
        item = event.get("item")
        raw = _item_facts(item) if isinstance(item, dict) else []
    elif etype in ("turn.failed", "turn.blocked", "error"):
        raw = [(etype, failure_message(event))]
    else:
        return []
    out = []
    for ftype, text in raw:
        if isinstance(text, str):
            text = normalize_fact(text)
            if text:
                out.append((ftype, text))
    return out
