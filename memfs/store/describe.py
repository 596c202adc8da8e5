"""What ``memfs show SESSION`` shows of one session (SPEC §8): its manifest, where and how big
its log is, its refusals, pin and liveness, and its turns with the times memfs saw them."""

from __future__ import annotations

from typing import Any

from memfs.store import retention
from memfs.store.lock import is_live
from memfs.store.rejected import count_rejected
from memfs.store.session import SessionHandle


def describe(handle: SessionHandle) -> dict[str, Any]:
    """The session of ``handle`` as one JSON-ready document: ``manifest``, ``name``, ``path``,
    ``log_bytes``, ``rejected``, ``pin``, ``live`` and ``turns`` (the turn index, each turn with
    ``started_at``/``completed_at``: the arrival times memfs recorded, or ``None``)."""
    manifest = handle.manifest
    turns = handle.turn_index
    times = handle.turn_times()  # (index/turn-times.jsonl)
    for t in turns:
        t["started_at"], t["completed_at"] = times.get(t["turn_number"], (None, None))
    path = handle.path
    return {"manifest": manifest, "name": handle.name, "path": str(path), "log_bytes": handle.file_len,
            "rejected": count_rejected(path), "pin": retention.read_pin(path), "live": is_live(path),
            "turns": turns}
