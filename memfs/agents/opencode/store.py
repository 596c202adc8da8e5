"""OpenCode's store, read without changing it (SPEC §10, fourth agent).

Shapes followed: OpenCode 1.18 (checked with 1.18.33; the fixtures in
``tests/fixtures/agents/opencode``). Its store is one SQLite database,
``$XDG_DATA_HOME/opencode/opencode.db`` (default ``~/.local/share/opencode/opencode.db``), in WAL
mode: OpenCode does not checkpoint on exit, so most rows may sit in ``opencode.db-wal``. The
tables read here: ``session`` (id, ``parent_id`` of a sub-agent's session, ``directory``,
``title``, ``version``, token and cost totals, times in ms), ``message`` (``data``: JSON with
``role``, ``parentID`` of an assistant message = its user message, ``modelID``, ``tokens``,
``cost``, ``error``, ``time``, ``finish``) and ``part`` (``data``: JSON, ``type`` ``text`` /
``reasoning`` / ``tool`` / ``step-start`` / ``step-finish`` / …).

The database is opened read-only through SQLite (``file:…?mode=ro``, its WAL index read-only too;
never a copy of the main file alone, which would lose the WAL's rows), one short read transaction
per session, and closed at once: OpenCode may be writing to it meanwhile, and must never meet a
lock of ours (:func:`read`). Only a regular file, not a symbolic link, is opened. No other I/O
here.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import orjson

from memfs.agents.common import iso_ms, read_usage
from memfs.agents.opencode.shapes import SHAPES
from memfs.errors import MemfsError

AGENT = "opencode"
DB_NAME = "opencode.db"
SQLITE_MAGIC = b"SQLite format 3\x00"
BUSY_TIMEOUT = 5.0  # seconds to wait for a writer's lock (reads in WAL mode rarely wait)
T = TypeVar("T")
DEFAULT_TITLE = "New session - "  # OpenCode's placeholder title, until its title request answers


class StoreError(MemfsError):
    """OpenCode's database cannot be read (the reason says why)."""


def is_store(path: Path) -> Path | None:
    """The database when ``path`` is OpenCode's store: ``opencode.db``, or a directory holding
    one (its data directory); else None. (A symbolic link named so is a store too: reading it
    is refused with the reason, never skipped in silence.)"""
    db = path / DB_NAME if path.is_dir() else path
    return db if db.name == DB_NAME and os.path.lexists(db) else None


def default_store() -> Path:
    """Where OpenCode keeps its database: ``$XDG_DATA_HOME/opencode`` (default ``~/.local/share``)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "opencode" / DB_NAME


def _check_file(db: Path) -> None:
    """A regular file, not a symbolic link (as every file import reads), that starts like a
    SQLite database."""
    try:
        st = os.lstat(db)
    except OSError as exc:
        raise StoreError(f"{db}: {exc.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        raise StoreError(f"{db}: a symbolic link; refused")
    fd = os.open(db, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise StoreError(f"{db}: not a regular file")
        if os.read(fd, len(SQLITE_MAGIC)) != SQLITE_MAGIC:
            raise StoreError(f"{db}: not a SQLite database")
    finally:
        os.close(fd)


# SQLite's errors worth a retry: a lock, or the WAL index being rebuilt by OpenCode at that moment,
# or its file gone between the check and the open.
TRANSIENT = frozenset({"SQLITE_BUSY", "SQLITE_BUSY_RECOVERY", "SQLITE_BUSY_SNAPSHOT", "SQLITE_BUSY_TIMEOUT",
                       "SQLITE_LOCKED", "SQLITE_PROTOCOL", "SQLITE_CANTOPEN", "SQLITE_READONLY_RECOVERY",
                       "SQLITE_READONLY_CANTINIT"})


def _connect(db: Path) -> sqlite3.Connection:
    """A read-only connection that never takes a lock OpenCode could meet. While the WAL's
    shared-memory file (``opencode.db-shm``) is there, it is opened read-only
    (``readonly_shm``): SQLite then never initialises, truncates or rebuilds it, which takes
    exclusive locks — and OpenCode's first statement on a new connection
    (``PRAGMA journal_mode``, before its ``busy_timeout``) fails at once on such a lock.
    OpenCode 1.18 leaves that file after every run. Without it (a database another program
    closed cleanly, or not in WAL mode) plain ``mode=ro``: the read then makes the index, as
    any SQLite reader must, and an OpenCode starting in that instant could meet its lock."""
    uri = f"file:{quote(str(db.resolve()))}?mode=ro"
    if os.path.exists(f"{db}-shm"):
        uri += "&readonly_shm=1"
    conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT, isolation_level=None)
    try:
        conn.execute("PRAGMA query_only = 1")
    except sqlite3.Error:
        conn.close()
        raise
    return conn


def read(db: Path, what: str, reader: Callable[[sqlite3.Connection], T]) -> T:
    """``reader(connection)`` in one read transaction on a read-only connection, closed at once
    (it never writes, checkpoints or takes a write lock). A transient error (see
    :data:`TRANSIENT`) is retried for up to :data:`BUSY_TIMEOUT` seconds; any other, or one
    that lasts, is a :class:`StoreError` saying ``what`` could not be read, and why."""
    _check_file(db)
    deadline = time.monotonic() + BUSY_TIMEOUT
    pause = 0.005
    while True:
        try:
            conn = _connect(db)
            try:
                conn.execute("BEGIN")
                result = reader(conn)
                conn.execute("COMMIT")
                return result
            finally:
                conn.close()
        except sqlite3.Error as exc:
            if getattr(exc, "sqlite_errorname", None) not in TRANSIENT or time.monotonic() + pause > deadline:
                raise StoreError(f"{db}: {what}: {exc}") from None
        time.sleep(pause)
        pause = min(pause * 2, 0.2)


def _json(text: Any) -> dict:
    if not isinstance(text, (str, bytes)):
        return {}
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


SESSION_COLUMNS = ("id", "parent_id", "slug", "directory", "title", "version", "cost", "time_created",
                   "time_updated", "time_archived")


def list_sessions(db: Path) -> list[dict]:
    """The store's sessions (the columns of :data:`SESSION_COLUMNS`), parents before their
    sub-agents' sessions, each by creation time."""
    rows = read(db, "cannot read its sessions", lambda conn: conn.execute(
        f"SELECT {', '.join(SESSION_COLUMNS)} FROM session ORDER BY time_created, id").fetchall())
    sessions = [dict(zip(SESSION_COLUMNS, r)) for r in rows if isinstance(r[0], str) and r[0]]
    ids = {s["id"] for s in sessions}
    depth: dict[str, int] = {}

    def level(s: dict, seen: int = 0) -> int:
        if s["id"] not in depth:
            parent = s.get("parent_id")
            up = next((p for p in sessions if p["id"] == parent), None) if parent in ids and seen < 32 else None
            depth[s["id"]] = 0 if up is None else level(up, seen + 1) + 1
        return depth[s["id"]]

    return sorted(sessions, key=lambda s: (level(s), s["time_created"] or 0, s["id"]))


def read_session(db: Path, sid: str) -> tuple[list[dict], dict[str, list[dict]]]:
    """One session's messages (the decoded ``data``, ``id``, ``time_created``) in order, and
    each message's parts (decoded ``data`` and ``id``) in order — in one read transaction, so
    the two agree."""
    def both(conn: sqlite3.Connection) -> tuple[list, list]:
        return (conn.execute("SELECT id, time_created, data FROM message WHERE session_id = ? "
                             "ORDER BY time_created, id", (sid,)).fetchall(),
                conn.execute("SELECT id, message_id, data FROM part WHERE session_id = ? "
                             "ORDER BY message_id, id", (sid,)).fetchall())

    msgs, parts = read(db, f"cannot read session {sid}", both)
    messages = [{**_json(data), "id": mid, "time_created": t} for mid, t, data in msgs if isinstance(mid, str)]
    by_message: dict[str, list[dict]] = {}
    for pid, mid, data in parts:
        if isinstance(pid, str) and isinstance(mid, str):
            by_message.setdefault(mid, []).append({**_json(data), "id": pid})
    return messages, by_message


# --- values ---------------------------------------------------------------------------------------


iso = iso_ms  # OpenCode's times (ms since the epoch) as RFC 3339, or None


def usage_of(tokens: Any) -> dict:
    """A message's or step's ``tokens`` in memfs's Usage keys (:data:`SHAPES`: OpenCode's counts
    are disjoint; memfs's ``input_tokens`` includes the cached ones and ``output_tokens`` the
    reasoning ones)."""
    return read_usage(SHAPES.usage, tokens)


def error_message(error: Any) -> str | None:
    """An assistant message's ``error`` (``{"name", "data": {"message", "statusCode"}}``) as one
    line: ``API Error: 400 Invalid request…``; ``interrupted`` for an aborted run."""
    if not isinstance(error, dict):
        return None
    name = error.get("name") if isinstance(error.get("name"), str) else "error"
    data = error.get("data") if isinstance(error.get("data"), dict) else {}
    if name == "MessageAbortedError":
        return "interrupted"
    message = data.get("message") if isinstance(data.get("message"), str) else name
    status = data.get("statusCode")
    if name == "APIError":
        return f"API Error: {status} {message}" if type(status) is int else f"API Error: {message}"
    return f"{name}: {message}" if message != name else name
