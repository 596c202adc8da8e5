"""Grounded facts (SPEC §4.1): the short, searchable statements an event contributes.

A pure function of one decoded event. Used by the memory view, by search (through the view)
and by the eviction-summary hook, so evicted history keeps its facts.

Decisions recorded here where the spec is silent:

* Items contribute only through ``item.completed``; ``item.started``/``item.updated`` carry
  partial text that would otherwise be indexed again at every update.
* A command execution without an ``exit_code`` reads ``ran <command>``.
"""

from __future__ import annotations

MAX_FACT_BYTES = 512
_CUT_BYTES = MAX_FACT_BYTES - len("…".encode())


def normalize_fact(text: str) -> str:
    """Collapse whitespace runs to one space, trim, and cut to ≤ 512 UTF-8 bytes with ``…``."""
    text = " ".join(text.split())
    encoded = text.encode()
    if len(encoded) <= MAX_FACT_BYTES:
        return text
    return encoded[:_CUT_BYTES].decode("utf-8", "ignore") + "…"


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
        code = item.get("exit_code")
        return [(itype, f"ran {command}" if code is None else f"ran {command} (exit {code})")]
    if itype == "harness":
        return [(itype, item.get("message"))]
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
        raw = [(etype, event.get("message"))]
    else:
        return []
    out = []
    for ftype, text in raw:
        if isinstance(text, str):
            text = normalize_fact(text)
            if text:
                out.append((ftype, text))
    return out
