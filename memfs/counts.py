"""Token counts (SPEC §12): the one validator of a Usage object's counters, for every reader.

A count is an integer in ``0..2^53`` (:data:`MAX_COUNT`: a float keeps every integer up to it,
so a sum or a cost computed from counts is exact or finite). A JSON boolean is never an
integer; a number written as a float (``1000.0``, ``1e9``), a string, a negative or a larger
integer is *refused*: never read as 0, never dropped in silence. Its reason names the field
and the value (``input_tokens: -1000000000 is not an integer in 0..2^53``).

The readers: the agents' translators (:mod:`memfs.ingest`: Claude, Codex, Gemini usage objects
become a Usage of valid counts that carries the first refusal's reason under
:data:`ERROR`, so the event stays valid and the reason reaches the log), and the views' fold
(:mod:`memfs.views.fold`, whose turn usage feeds ``derived/trajectory.jsonl`` and
``derived/usage.json``: a refused count, or a Usage carrying :data:`ERROR`, marks the turn's
usage as refused with that reason), and the export (:mod:`memfs.export.conversation`: the
Claude and Codex writers put :data:`ERROR` beside the counts, so a re-import keeps the mark).
Pure; no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

MAX_COUNT = 2**53
ERROR = "usage_error"  # the key under which a Usage object carries a refused count's reason


def show(value: Any) -> str:
    """A short rendering of a refused value for a reason."""
    if type(value) is float and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    if type(value) is bool:
        return "true" if value else "false"
    if type(value) is str:
        return f'"{value}"' if len(value) <= 38 else f'"{value[:36]}…"'
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


def problem(name: str, value: Any) -> str | None:
    """None when ``value`` is a count (:data:`MAX_COUNT`), else the reason it is refused."""
    if type(value) is int and 0 <= value <= MAX_COUNT:
        return None
    return f"{name}: {show(value)} is not an integer in 0..2^53"


def _present(obj: dict, names) -> Iterator[tuple[int, Any, str | None]]:
    """``(i, value, reason)`` for each ``names[i]`` that ``obj`` holds and is not null:
    ``reason`` None for a count (:func:`problem`), else why it is refused."""
    for i, name in enumerate(names):
        v = obj.get(name)
        if v is not None:
            yield i, v, problem(name, v)


def _carried(obj: dict) -> str | None:
    """The reason a Usage carries under :data:`ERROR` (None: none, or not a string)."""
    error = obj.get(ERROR)
    return error if type(error) is str and error else None


def read(usage: Any, names: tuple[str, ...]) -> tuple[list[int], str | None]:
    """The counts ``names`` of a Usage object (absent or null: 0) and the first refusal's
    reason (a refused count reads 0 here and the reason says so; a Usage that carries
    :data:`ERROR` — a translator refused one of the agent's counts — gives that reason)."""
    values = [0] * len(names)
    if usage is None:
        return values, None
    if type(usage) is not dict:
        return values, f"usage: {show(usage)} is not an object"
    reason = _carried(usage)
    for i, v, refused in _present(usage, names):
        if refused is None:
            values[i] = v
        elif reason is None:
            reason = refused
    return values, reason


def translate(source: Any, pairs: tuple[tuple[str, str], ...]) -> dict:
    """An agent's usage object as a Usage: ``{dst: count}`` for each ``(src, dst)`` of ``pairs``
    whose count is valid, and :data:`ERROR` with the first refusal's reason (``src`` named, or
    the :data:`ERROR` memfs's export wrote beside the counts)."""
    out: dict = {}
    if type(source) is not dict:
        return out
    carried = _carried(source)  # memfs's own marker, in what it exported (memfs.export)
    if carried is not None:
        out[ERROR] = carried
    for i, v, refused in _present(source, [src for src, _ in pairs]):
        if refused is None:
            out[pairs[i][1]] = v
        else:
            out.setdefault(ERROR, refused)
    return out


def add(into: dict, usage: dict) -> dict:
    """Add a Usage's counts to ``into`` (the first :data:`ERROR` kept); returns ``into``."""
    for k, v in usage.items():
        if k == ERROR:
            into.setdefault(ERROR, v)
        elif type(v) is int:
            into[k] = into.get(k, 0) + v
    return into


def counts_of(usage: dict) -> dict:
    """A Usage's counts without its :data:`ERROR`."""
    return {k: v for k, v in usage.items() if k != ERROR and type(v) is int}
