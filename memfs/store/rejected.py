"""``rejected.jsonl`` (SPEC §3.8): every refused line is recorded, with why — boundedly.

One record per refused line:
``{"at","reason","errno","bytes","sha256","line","pid"}`` — ``bytes`` and ``sha256`` are the
whole refused line's length and SHA-256; ``line`` is its first :data:`KEEP_BYTES` (4 KiB) as
lossy UTF-8, with ``"truncated": true`` when the line was longer. When those kept bytes are
not valid UTF-8, ``line_b64`` (a memfs extra field) holds them exactly. A line of a cluster's
stream that this host could not apply carries its ``stream_seq`` (memfs extra, SPEC §9).

Decisions recorded here:

* **Bounded.** A hostile writer (a never-ending line in 1 MiB writes) cannot grow the file
  without limit or make a record big: each record is at most ~10 KiB, and when appending
  one would take ``rejected.jsonl`` past ``max_rejected_bytes`` (default 16 MiB; the
  ``max_rejected_bytes`` setting) it is first renamed to ``rejected.1.jsonl``, replacing the
  previous one: at most about twice the limit is kept. ``rejected.1.jsonl`` is in the backing
  store only (the mount shows the current file).
* The limit is process-wide (:func:`set_max_rejected_bytes`), set from the configuration by
  the mount and the command line.
"""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

import orjson

from memfs.store.lines import KEEP, LongLine
from memfs.store.meta import now_rfc3339
from memfs.store.paths import REJECTED, open_nofollow, write_all

KEEP_BYTES = KEEP  # of a refused line, kept in its record
DEFAULT_MAX_REJECTED_BYTES = 16 << 20
ROTATED = "rejected.1.jsonl"

_max_rejected_bytes = DEFAULT_MAX_REJECTED_BYTES


def set_max_rejected_bytes(limit: int) -> None:
    """The size past which ``rejected.jsonl`` is rotated (this process)."""
    global _max_rejected_bytes
    if limit < 1:
        raise ValueError("max_rejected_bytes must be at least 1")
    _max_rejected_bytes = limit


def _kept_text(kept: bytes, cut: bool) -> tuple[str, bool]:
    """``kept`` as text, and whether it is valid UTF-8 (when the line was ``cut`` at the
    4 KiB edge, a character cut there does not count against it)."""
    try:
        return kept.decode("utf-8"), True
    except UnicodeDecodeError as exc:
        if cut and exc.reason == "unexpected end of data" and exc.end == len(kept) and _valid(kept[:exc.start]):
            return kept[:exc.start].decode("utf-8"), True
        return kept.decode("utf-8", "replace"), False


def _valid(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def rejected_record(raw: bytes | LongLine, reason: str, errno_name: str, pid: int | None = None,
                    stream_seq: int | None = None) -> bytes:
    """One ``rejected.jsonl`` line (with its ``\\n``) for the refused ``raw`` bytes (or a
    line over the limit that was streamed, not held: :class:`memfs.store.lines.LongLine`)."""
    if isinstance(raw, LongLine):
        kept, size, digest = raw.head[:KEEP_BYTES], raw.size, raw.sha256
    else:
        kept, size, digest = raw[:KEEP_BYTES], len(raw), hashlib.sha256(raw).hexdigest()
    text, valid = _kept_text(kept, size > KEEP_BYTES)
    record = {
        "at": now_rfc3339(),
        "reason": reason,
        "errno": errno_name,
        "bytes": size,
        "sha256": digest,
        "line": text,
        "pid": os.getpid() if pid is None else pid,
    }
    if size > KEEP_BYTES:
        record["truncated"] = True
    if not valid:
        record["line_b64"] = base64.b64encode(kept).decode()
    if stream_seq is not None:
        record["stream_seq"] = stream_seq
    return orjson.dumps(record) + b"\n"


def record_rejected(session_dir: Path, raw: bytes | LongLine, reason: str, errno_name: str, pid: int | None = None,
                    stream_seq: int | None = None) -> None:
    """Append one record for the refused ``raw`` bytes to the session's ``rejected.jsonl``,
    rotating it first when the record would take it past the limit."""
    data = rejected_record(raw, reason, errno_name, pid, stream_seq)
    path = session_dir / REJECTED
    fd = open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        size = os.fstat(fd).st_size
        if size and size + len(data) > _max_rejected_bytes:
            os.close(fd)
            fd = -1
            os.rename(path, session_dir / ROTATED)  # renames the link itself, never its target
            fd = open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            size = os.fstat(fd).st_size
        try:
            write_all(fd, data)
        except OSError:
            os.ftruncate(fd, size)  # no torn record for the next one to merge into (ENOSPC)
            raise
    finally:
        if fd >= 0:
            os.close(fd)


def count_rejected(session_dir: Path) -> int:
    """Number of records in ``rejected.jsonl`` (0 when absent; a rotated file not counted)."""
    try:
        fd = open_nofollow(session_dir / REJECTED, os.O_RDONLY)
    except FileNotFoundError:
        return 0
    n = 0
    with os.fdopen(fd, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            n += chunk.count(b"\n")
    return n
