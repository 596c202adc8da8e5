"""Event lines for tests, benchmarks and examples: the one place that builds them.

Compact JSON lines of the event family (SPEC §2) without a trailing newline, unless a name
says otherwise. No I/O; nothing here is used by the store or the filesystem.
"""

from __future__ import annotations

import orjson

from memfs.events import SCHEMA_VERSION

_HEAD = b'{"schema_version":"' + SCHEMA_VERSION.encode() + b'","event":'


def envelope(event: dict) -> bytes:
    """The enveloped line of ``event``."""
    return _HEAD + orjson.dumps(event) + b"}"


def event(etype: str, **fields) -> bytes:
    """An enveloped event line: ``event("turn.started")``."""
    return envelope({"type": etype, **fields})


def bare(etype: str, **fields) -> bytes:
    """A bare event line (no envelope): the store wraps it."""
    return orjson.dumps({"type": etype, **fields})


def item(kind: str, item_id: str | None = None, **fields) -> dict:
    """An ``item.completed`` event (a dict) with a ThreadItem of ``kind``."""
    return {"type": "item.completed", "item": {"id": item_id or f"i{kind}", "type": kind, **fields}}


def message(text: str, item_id: str = "m") -> bytes:
    """An agent message line."""
    return envelope(item("agent_message", item_id, text=text))


START = event("turn.started")
DONE = event("turn.completed", usage={"input_tokens": 10, "output_tokens": 2})
FAILED = event("turn.failed", message="tests failed")


def turn(tag: str, n_msgs: int = 2, end: bytes = DONE) -> list[bytes]:
    """``turn.started``, ``n_msgs`` agent messages tagged ``tag``, then ``end``."""
    return [START, *(message(f"{tag} message {i}", f"{tag}-{i}") for i in range(n_msgs)), end]


def padded(ev: dict, pad_field: str, size: int) -> bytes:
    """The enveloped line of ``ev`` with the string at ``pad_field`` (a dotted path) padded
    with ``x`` so the line is exactly ``size`` bytes, its newline included (returned without)."""
    keys = pad_field.split(".")
    pad = size - 1 - len(envelope(ev))
    if pad < 0:
        raise ValueError(f"the event is already longer than {size} bytes")
    out = dict(ev)
    target = out
    for key in keys[:-1]:
        target[key] = dict(target[key])
        target = target[key]
    target[keys[-1]] = target[keys[-1]] + "x" * pad
    return envelope(out)


def sized_message(i: int, size: int = 300) -> bytes:
    """A distinct agent message line of exactly ``size`` bytes with its newline (returned with it)."""
    return padded(item("agent_message", f"m{i:08d}", text=f"step {i}: "), "item.text", size) + b"\n"
