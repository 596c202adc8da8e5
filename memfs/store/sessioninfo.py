"""What one session is, read from its folder (SPEC §7, §10): :class:`SessionInfo` — the manifest
with live counts, its pin, liveness, ``index/about.json`` and the agent that wrote it.

The catalog (:mod:`memfs.store.catalog`) builds its rows with :func:`info_of`; retention reads
manifests with :func:`manifest_info`. Nothing here writes.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from memfs.agents import HEAD_BYTES, Origin, agent_name
from memfs.errors import SymlinkRefused
from memfs.events import decode_stored
from memfs.store import lock as liveness
from memfs.store.about import read as read_about
from memfs.store.lines import split_lines
from memfs.store.machine import TurnState
from memfs.store.meta import TurnIndex, format_rfc3339, parse_rfc3339, read_manifest
from memfs.store.paths import EVENTS, MANIFEST, PIN, open_nofollow, read_file
from memfs.store.recovery import scan_into


def is_pinned(session_dir: Path) -> bool:
    """Whether ``retention-pin.json`` exists (any kind of entry: fail safe)."""
    return os.path.lexists(session_dir / PIN)


# --- reading manifests -------------------------------------------------------------------


@dataclass(slots=True)
class SessionInfo:
    """One session of a store as its manifest on disk describes it."""

    name: str  # directory name
    session_id: str
    status: str
    turn_count: int
    event_count: int
    created_at: str
    updated_at: str
    updated_ts: float  # seconds since the epoch (manifest mtime when updated_at is unreadable)
    readable: bool  # False: no usable manifest (fields are placeholders)
    imported: bool = False
    pinned: bool = False
    live: bool = False
    agent: str = "unknown"  # which agent wrote it (memfs.agents), from the log's head
    thread_id: str | None = None
    in_turn: bool = False  # a turn is open
    described_len: int = -1  # the log length the manifest describes (-1: unknown)
    about: dict = field(default_factory=dict)  # index/about.json (memfs.store.about; listings only)
    first_ts: float = 0.0  # the first and last record times (record_times), seconds since the epoch
    last_ts: float = 0.0

    def to_dict(self) -> dict:
        # Spelled out: dataclasses.asdict deep-copies every field (about.json) and costs most of a listing.
        d = {"name": self.name, "session_id": self.session_id, "status": self.status, "turn_count": self.turn_count,
             "event_count": self.event_count, "created_at": self.created_at, "updated_at": self.updated_at,
             "readable": self.readable, "imported": self.imported, "pinned": self.pinned, "live": self.live,
             "agent": self.agent, "thread_id": self.thread_id, "in_turn": self.in_turn}
        d["first_record_at"] = format_rfc3339(self.first_ts) if self.first_ts else None
        d["last_record_at"] = format_rfc3339(self.last_ts) if self.last_ts else None
        return d


def _manifest_info(session_dir: Path) -> tuple[SessionInfo, dict | None]:
    """Read ``manifest.json`` afresh: the info and the raw object (None when unreadable)."""
    name = session_dir.name
    path = session_dir / MANIFEST
    raw = None
    try:
        data = read_file(path)
        mtime = os.lstat(path).st_mtime
        parsed = read_manifest(data, name)
        if parsed is not None:
            raw = orjson.loads(data)
    except (OSError, SymlinkRefused):
        parsed, mtime = None, 0.0
    if parsed is None:
        return SessionInfo(name, name, "unknown", 0, 0, "", "", mtime, readable=False), None
    m = parsed.manifest
    updated = raw.get("updated_at") if type(raw.get("updated_at")) is str else ""
    ts = parse_rfc3339(updated) if updated else None
    status = raw["status"] if type(raw.get("status")) is str else "unknown"
    info = SessionInfo(name, m.session_id, status, m.turn_count, m.event_count, m.created_at,
                       updated, ts if ts is not None else mtime, readable=True,
                       imported="imported_from" in raw or _has_import(session_dir), in_turn=m.in_turn,
                       described_len=m.persisted_file_len if parsed.complete else -1)
    return info, raw


def follow_tail(session_dir: Path, info: SessionInfo) -> None:
    """Bring ``info`` up to the log as it is now (SPEC §3.5, a follower's read): the lines past
    the length the manifest describes — another process's appends it has not persisted yet —
    are folded with the rescan's rules (:func:`memfs.store.recovery.scan_into`) into the
    manifest's counts, so ``event_count``, ``turn_count``, ``in_turn`` and ``status`` are
    current; ``updated_at`` becomes the log's mtime. Cost: the new bytes only. A log shorter
    than described (rewritten meanwhile), an incomplete manifest or an unreadable log leave
    ``info`` as the manifest says; an unterminated last line (being written) is left out."""
    if not info.readable or info.described_len < 0:
        return
    path = session_dir / EVENTS
    try:
        fd = open_nofollow(path, os.O_RDONLY)
    except (OSError, SymlinkRefused):
        return
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size <= info.described_len:
            return
        index = TurnIndex(info.turn_count + 1)  # the next turn to open is turn_count + 1
        if info.in_turn:
            index.open_turn(0, 0, "")  # stands for the open turn: the tail extends or closes it
        state = TurnState(index, info.turn_count, info.event_count, info.status, info.in_turn)
        end = scan_into(state, fd, info.described_len, st.st_size)
    except OSError:
        return
    finally:
        os.close(fd)
    if end > info.described_len:
        info.turn_count, info.event_count = state.turn_count, state.event_count
        info.status, info.in_turn = state.status, state.in_turn
        info.updated_ts = max(info.updated_ts, st.st_mtime)
        info.updated_at = format_rfc3339(info.updated_ts)


def _has_import(session_dir: Path) -> bool:
    """The ``imported/`` copy ``memfs migrate`` leaves; it outlives the manifest's
    ``imported_from``, which the log's own metadata rewrites drop."""
    try:
        return stat.S_ISDIR(os.lstat(session_dir / "imported").st_mode)
    except OSError:
        return False


# A cache of manifest reads for listings, keyed by path and invalidated whenever the
# manifest's identity or timestamps change (an atomic replace always gives a new inode).
_CACHE: dict[str, tuple[tuple, SessionInfo]] = {}
# Bounded (emptied when full): the store catalog keeps what a server lists; a build or check that
# reads every session of a large store must not leave them all here (SPEC §14: a server's memory).
CACHED_MAX = 4096


def _cached_info(session_dir: Path) -> SessionInfo:
    try:
        st = os.lstat(session_dir / MANIFEST)
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    except OSError:
        key = None
    hit = _CACHE.get(str(session_dir))
    if key is not None and hit is not None and hit[0] == key:
        info = hit[1]
    else:
        info, _ = _manifest_info(session_dir)
        if key is not None:
            if len(_CACHE) >= CACHED_MAX:
                _CACHE.clear()
            _CACHE[str(session_dir)] = (key, info)
    return dataclasses.replace(info)


_ORIGINS: dict[str, tuple[tuple, tuple[str, str | None]]] = {}


def _origin(session_dir: Path) -> tuple[str, str | None]:
    """``(agent, thread_id)`` of a session from the lines that start in its log's first
    :data:`~memfs.agents.HEAD_BYTES`; unreadable reads as unknown."""
    path = session_dir / EVENTS
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            return "unknown", None
        key = (st.st_dev, st.st_ino, min(st.st_size, 2 * HEAD_BYTES))
        hit = _ORIGINS.get(str(session_dir))
        if hit is not None and hit[0] == key:
            return hit[1]
        fd = open_nofollow(path, os.O_RDONLY)
        try:
            head = os.pread(fd, 2 * HEAD_BYTES, 0)  # the lines that start in the head, whole
        finally:
            os.close(fd)
    except (OSError, SymlinkRefused):
        return "unknown", None
    origin = Origin()
    offset = 0
    for line in split_lines(head)[0]:
        if offset >= HEAD_BYTES:
            break
        offset += len(line) + 1
        decoded = decode_stored(line)
        if decoded is not None:
            origin.feed(decoded[1])
            if origin.settled:
                break
    result = (origin.agent, origin.thread_id)
    if len(_ORIGINS) >= CACHED_MAX:
        _ORIGINS.clear()
    _ORIGINS[str(session_dir)] = (key, result)
    return result


def _when(about: dict, key: str) -> float | None:
    value = about.get(key)
    return parse_rfc3339(value) if type(value) is str and value else None


def record_times(info: SessionInfo) -> tuple[float, float]:
    """``(first, last)`` record time of a session, seconds since the epoch (decision recorded
    here): what the agent's own records say when the session was captured from them —
    ``index/about.json``'s ``started_at`` and ``ended_at``, which the ingest takes from the
    records' timestamps — else the store's own times, which for a session written through memfs
    are the records' arrival: the manifest's ``created_at`` and the last activity. Never the
    time of an import."""
    created = parse_rfc3339(info.created_at) if info.created_at else None
    first = _when(info.about, "started_at") or created or info.updated_ts
    last = _when(info.about, "ended_at")
    if last is None:
        last = info.updated_ts
    return min(first, last), last


def updated_at_of(session_dir: Path) -> str:
    """The session's ``updated_at`` read from its folder now, as :func:`info_of` reads it (its
    catalog row's): the manifest's, moved to the log's mtime by appends it does not describe yet."""
    info = _cached_info(session_dir)
    follow_tail(session_dir, info)
    return info.updated_at


def info_of(session_dir: Path) -> SessionInfo:
    """Everything the listing shows of one session, read from its folder now: the manifest (and
    the log's lines past what it describes, :func:`follow_tail`), pin, liveness, about.json, the
    agent, and the record times. A few small reads; the log is read only for its head when
    about.json does not name the agent and conversation."""
    info = _cached_info(session_dir)
    follow_tail(session_dir, info)
    info.pinned = is_pinned(session_dir)
    info.live = liveness.is_live(session_dir)
    info.about = read_about(session_dir)
    agent, conversation = info.about.get("agent"), info.about.get("conversation_id")
    told = agent_name(agent) if type(agent) is str and agent else None
    told_all = told is not None and type(conversation) is str  # then the log is not read
    info.agent, info.thread_id = (told, conversation) if told_all else _origin(session_dir)
    info.agent = told or info.agent
    info.first_ts, info.last_ts = record_times(info)
    return info
