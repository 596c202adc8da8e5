"""``rejected.jsonl`` (SPEC §3.8): every refused line is kept, with why.

One record per refused line:
``{"at","reason","errno","bytes","line","pid"}`` — ``line`` is the text as lossy UTF-8. When
the bytes are not valid UTF-8, ``line_b64`` (a memfs extra field) holds them exactly, so
nothing is lost.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

import orjson

from memfs.store.meta import now_rfc3339
from memfs.store.paths import REJECTED, open_nofollow, write_all


def record_rejected(session_dir: Path, raw: bytes, reason: str, errno_name: str, pid: int | None = None) -> None:
    """Append one record for the refused ``raw`` bytes to the session's ``rejected.jsonl``."""
    record = {
        "at": now_rfc3339(),
        "reason": reason,
        "errno": errno_name,
        "bytes": len(raw),
        "line": raw.decode("utf-8", "replace"),
        "pid": os.getpid() if pid is None else pid,
    }
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        record["line_b64"] = base64.b64encode(raw).decode()
    fd = open_nofollow(session_dir / REJECTED, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        size = os.fstat(fd).st_size
        try:
            write_all(fd, orjson.dumps(record) + b"\n")
        except OSError:
            os.ftruncate(fd, size)  # no torn record for the next one to merge into (ENOSPC)
            raise
    finally:
        os.close(fd)


def count_rejected(session_dir: Path) -> int:
    """Number of records in ``rejected.jsonl`` (0 when absent)."""
    try:
        fd = open_nofollow(session_dir / REJECTED, os.O_RDONLY)
    except FileNotFoundError:
        return 0
    n = 0
    with os.fdopen(fd, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            n += chunk.count(b"\n")
    return n
