"""The sessions root as a set (SPEC §7): finding and listing sessions, retention (``memfs gc``)
and retention pins.

Retention, in order:

1. **abandoned sweep** — an ``active`` session that is not live and whose last activity is
   older than ``max_age_days`` is marked ``completed``, as its writer (:func:`mark_completed`):
   metadata that does not describe the log is rebuilt first, then only ``status`` changes, so
   the open fast path still holds; ``max_age_days`` 0 disables the sweep;
2. remove completed sessions with no events (``empty``);
3. remove the oldest (by last activity) candidates beyond ``max_sessions``;
4. remove candidates whose last activity is older than ``max_age_days``.

Every decision is taken on the session as it is (:func:`session_now`), never on a manifest
alone: a writer killed before it persisted its metadata leaves lines the manifest does not
describe (SPEC §3.3), and those count.

Candidates are direct child directories of the root that are real directories (never a
symlink), not hidden (a leading dot), not pinned (``retention-pin.json``), not preserved,
not live (``session.lock`` held), with a readable manifest whose status is not ``active``.
Paths are always ``root / <directory entry name>``; a manifest's ``session_id`` is never used
to build one. A symlinked sessions root is refused as a whole.

Decisions: ``docs/design.md`` ("Retention").
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson

from memfs.agents import HEAD_BYTES, Origin, agent_name
from memfs.errors import SessionBusy, SymlinkRefused
from memfs.events import decode_stored
from memfs.store import lock as liveness
from memfs.store.about import read as read_about
from memfs.store.catalog import find_session, is_session_entry, root_entries, session_names
from memfs.store.lines import split_lines
from memfs.store.machine import TurnState
from memfs.store.meta import TurnIndex, format_rfc3339, now_rfc3339, parse_rfc3339, read_manifest
from memfs.store.paths import (
    EVENTS,
    MANIFEST,
    PIN,
    REJECTED,
    atomic_write,
    open_nofollow,
    pid_alive,
    read_file,
    refuse_symlink,
    remove_file,
    remove_tree,
    sanitize,
    tree_bytes,
)
from memfs.store.recovery import recover, scan_into
from memfs.store.session import open_session

Progress = Callable[[int, int], None]  # (done, total)
DAY = 86400.0


@dataclass(frozen=True, slots=True)
class Policy:
    """Retention policy (SPEC §7)."""

    max_sessions: int = 50
    max_age_days: float = 30


def is_pinned(session_dir: Path) -> bool:
    """Whether ``retention-pin.json`` exists (any kind of entry: fail safe)."""
    return os.path.lexists(session_dir / PIN)


def pin(root: str | os.PathLike, session: str, reason: str) -> dict:
    """Pin a session against retention; return the pin record written."""
    path = find_session(root, session)
    record = {"session_id": _raw_id(path), "reason": reason, "pinned_at": now_rfc3339()}
    atomic_write(path / PIN, orjson.dumps(record, option=orjson.OPT_INDENT_2) + b"\n")
    return record


def unpin(root: str | os.PathLike, session: str) -> bool:
    """Remove a session's pin; False when it was not pinned."""
    return remove_file(find_session(root, session) / PIN)


def read_pin(session_dir: Path) -> dict | None:
    """The pin record, ``{}`` for a pin that cannot be read, None when not pinned."""
    if not is_pinned(session_dir):
        return None
    try:
        record = orjson.loads(read_file(session_dir / PIN))
    except (OSError, SymlinkRefused, orjson.JSONDecodeError):
        return {}
    return record if isinstance(record, dict) else {}


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

    def to_dict(self) -> dict:
        d = asdict(self)
        del d["updated_ts"], d["described_len"], d["about"]
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


def session_now(session_dir: Path, info: SessionInfo) -> int:
    """Bring ``info`` (read from the manifest) to the session as it is, as a read-only open
    sees it (:func:`memfs.store.recovery.recover`, SPEC §3.3/§3.5: the metadata trusted for
    the prefix of the log it describes and the lines past it folded with the rescan's rules,
    or a rescan when it describes nothing usable): counts, open turn, status. The last
    activity becomes the log's mtime when that is later and the log holds bytes the manifest
    does not describe. Returns the log's length (-1: no log). Changes nothing on disk;
    raises ``OSError``/:class:`SymlinkRefused` when the log cannot be read."""
    try:
        fd = open_nofollow(session_dir / EVENTS, os.O_RDONLY)
    except FileNotFoundError:
        fd = None
    try:
        st = os.fstat(fd) if fd is not None else None
        found = recover(session_dir, fd, info.name, writable=False)
    finally:
        if fd is not None:
            os.close(fd)
    state = found.state
    info.turn_count, info.event_count, info.status, info.in_turn = \
        state.turn_count, state.event_count, state.status, state.in_turn
    if st is None:
        return -1
    if st.st_size != info.described_len and st.st_mtime > info.updated_ts:
        info.updated_ts = st.st_mtime
        info.updated_at = format_rfc3339(st.st_mtime)
    return st.st_size


def _log_len(session_dir: Path) -> int:
    try:
        return os.lstat(session_dir / EVENTS).st_size
    except FileNotFoundError:
        return -1


def is_empty(session_dir: Path, info: SessionInfo, log_len: int) -> bool:
    """No events (see the module docstring): ``info`` and ``log_len`` as :func:`session_now`
    gave them."""
    if info.event_count or log_len > 0 or info.imported:
        return False
    try:
        return not os.lstat(session_dir / REJECTED).st_size
    except FileNotFoundError:
        return True


def _has_import(session_dir: Path) -> bool:
    """The ``imported/`` copy ``memfs migrate`` leaves; it outlives the manifest's
    ``imported_from``, which the log's own metadata rewrites drop."""
    try:
        return stat.S_ISDIR(os.lstat(session_dir / "imported").st_mode)
    except OSError:
        return False


def _raw_id(session_dir: Path) -> str:
    info, _ = _manifest_info(session_dir)
    return info.session_id


# A cache of manifest reads for listings, keyed by path and invalidated whenever the
# manifest's identity or timestamps change (an atomic replace always gives a new inode).
_CACHE: dict[str, tuple[tuple, SessionInfo]] = {}


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
    _ORIGINS[str(session_dir)] = (key, result)
    return result


def list_sessions(root: str | os.PathLike) -> list[SessionInfo]:
    """Every session of the store, most recently updated first (ties by name).

    The sessions are what the mount lists (:func:`memfs.store.catalog.session_names`: real
    directories holding a log or a manifest); symlinked entries and stray files are not
    sessions. Manifest reads are cached until the manifest changes; the counts and status
    are live: the log's lines past what the manifest describes are followed
    (:func:`follow_tail`), so a session another process is writing shows its real counts.
    """
    root = Path(root)
    sessions = []
    for name in session_names(root):
        path = root / name
        info = _cached_info(path)
        follow_tail(path, info)
        info.pinned = is_pinned(path)
        info.live = liveness.is_live(path)
        info.about = read_about(path)
        agent, conversation = info.about.get("agent"), info.about.get("conversation_id")
        told = agent_name(agent) if type(agent) is str and agent else None
        told_all = told is not None and type(conversation) is str  # then the log is not read
        info.agent, info.thread_id = (told, conversation) if told_all else _origin(path)
        info.agent = told or info.agent
        sessions.append(info)
    sessions.sort(key=lambda s: s.name)
    sessions.sort(key=lambda s: s.updated_ts, reverse=True)
    return sessions


# --- retention ---------------------------------------------------------------------------


@dataclass(slots=True)
class Removed:
    name: str
    session_id: str
    reason: str  # "empty" | "count" | "age" | "half-created"
    updated_at: str  # the last activity
    bytes: int
    detail: str = ""  # the reason in words, e.g. "old: last activity 2026-10-01 (63 days > max_age_days 30)"


@dataclass(slots=True)
class GcReport:
    """What :func:`gc` did (or, with ``dry_run``, would do)."""

    root: str
    dry_run: bool
    policy: Policy
    marked_completed: list[str] = field(default_factory=list)  # the abandoned sweep
    removed: list[Removed] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)  # name -> why it is not a candidate
    candidates_left: int = 0
    trash_removed: int = 0  # leftovers of removals a crash interrupted, deleted now

    @property
    def bytes_freed(self) -> int:
        return sum(r.bytes for r in self.removed)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["bytes_freed"] = self.bytes_freed
        return d


@dataclass(slots=True)
class _Candidate:
    path: Path
    info: SessionInfo
    half: bool = False  # a creation that never finished (see half_created)
    log_len: int = -1  # the log's length gc decided on (written since: the session stays)


def half_created(path: Path) -> bool:
    """A session folder an interrupted creation left (older memfs versions could, on
    ``EMFILE``): an empty log and no manifest, nothing refused, no import. (A folder without
    a log is not a session at all, and is left alone.)"""
    if os.path.lexists(path / MANIFEST) or os.path.lexists(path / "imported"):
        return False
    def size(name: str) -> int | None:
        try:
            return os.lstat(path / name).st_size
        except FileNotFoundError:
            return None

    return size("events.jsonl") == 0 and not size("rejected.jsonl")


@contextlib.contextmanager
def _locked(path: Path):
    """Hold the session's liveness lock; yields False (and holds nothing) when it is live."""
    try:
        held = liveness.acquire(path)
    except SessionBusy:
        yield False
        return
    try:
        yield True
    finally:
        liveness.release(held)


def mark_completed(path: Path, cutoff: float | None = None) -> bool:
    """The sweep's rewrite, as the session's writer (SPEC §3.5): the writer's takeover (the
    lock, then the log re-read) rebuilds metadata that does not describe the log (a killed
    writer's lines: real counts, the open turn), then only ``status`` changes — and, after a
    rebuild, ``updated_at`` becomes the log's last activity. False when the session became
    live, is no longer active, or (given ``cutoff``) was active since then."""
    if sanitize(path.name) != path.name:
        return False  # not a name memfs opens (made by another tool): left as it is
    try:
        handle = open_session(path.parent, path.name, durability="write", max_events=0, create=False)
    except (OSError, SymlinkRefused):
        return False
    with handle:
        try:
            handle.lock()
        except SessionBusy:
            return False
        _, raw = _manifest_info(path)
        if raw is None or raw.get("status") != "active" or raw.get("persisted_file_len") != handle.file_len:
            return False
        if not handle.open_report.fast_path:  # rebuilt: the log had lines the manifest did not describe
            stated = parse_rfc3339(raw["updated_at"]) if type(raw.get("updated_at")) is str else None
            last = max(stated or 0.0, os.lstat(path / EVENTS).st_mtime)
            if cutoff is not None and last >= cutoff:
                return False
            raw["updated_at"] = format_rfc3339(last)
        raw["status"] = "completed"
        atomic_write(path / MANIFEST, orjson.dumps(raw))
        return True


def _remove(path: Path, log_len: int) -> int | None:
    """Delete one session folder under its lock; the bytes freed, or None when it must stay
    (it became live, pinned or active meanwhile, or its log is no longer ``log_len`` long)."""

    refuse_symlink(path)
    with _locked(path) as held:
        if not held:
            return None
        info, raw = _manifest_info(path)
        if (raw is None and not half_created(path)) or (raw is not None and info.status == "active") or \
                is_pinned(path) or _log_len(path) != log_len:
            return None
        size = tree_bytes(path)
        # out of the sessions root first (one rename), then delete: a crash mid-delete leaves
        # a hidden trash folder, never a half-deleted session that still lists as one
        trash = path.with_name(f"{TRASH_PREFIX}{os.getpid()}-{os.urandom(4).hex()}-{path.name}")
        os.rename(path, trash)
    remove_tree(trash)
    return size


TRASH_PREFIX = ".trash-"  # + <pid>-<8 hex>-<session name>: a removal in progress (or interrupted)


def remove_trash(root: str | os.PathLike) -> int:
    """Finish removals that a crash interrupted: delete the ``.trash-<pid>-…`` folders of the
    sessions root whose gc process is gone; return how many."""
    done = 0
    for entry in root_entries(root):
        if not entry.name.startswith(TRASH_PREFIX) or not entry.is_dir(follow_symlinks=False):
            continue
        pid = entry.name[len(TRASH_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and pid_alive(int(pid)):
            continue
        try:
            remove_tree(Path(root) / entry.name)
            done += 1
        except FileNotFoundError:
            continue
    return done


def gc(root: str | os.PathLike, policy: Policy = Policy(), *, preserve: Iterable[str] = (),
       dry_run: bool = False, now: float | None = None, progress: Progress | None = None) -> GcReport:
    """Apply the retention ``policy`` to the store at ``root`` (see the module docstring).

    ``preserve``: session ids (or directory names) to keep whatever the policy says.
    ``dry_run``: change nothing, report what would happen. ``now``: the clock (tests).
    ``progress(done, total)`` is called as sessions are examined.
    """

    root = Path(root)
    report = GcReport(str(root), dry_run, policy)
    if not dry_run:
        report.trash_removed = remove_trash(root)
    now = time.time() if now is None else now
    cutoff = now - policy.max_age_days * DAY
    preserved = {sanitize(p) for p in preserve}
    entries = root_entries(root)
    candidates: list[_Candidate] = []
    for i, entry in enumerate(entries):
        if progress:
            progress(i, len(entries))
        name = entry.name
        if entry.is_symlink():
            report.kept[name] = "symlink"
            continue
        if not is_session_entry(entry):
            continue
        path = root / name
        if name in preserved:
            report.kept[name] = "preserved"
            continue
        if is_pinned(path):
            report.kept[name] = "pinned"
            continue
        if liveness.is_live(path):
            report.kept[name] = "live"
            continue
        info, raw = _manifest_info(path)
        if raw is None and half_created(path):
            candidates.append(_Candidate(path, info, half=True, log_len=_log_len(path)))
            continue
        if raw is None:
            report.kept[name] = "manifest missing or unreadable"
            continue
        if type(raw.get("status")) is not str:
            report.kept[name] = "manifest has no status"
            continue
        try:
            log_len = session_now(path, info)  # the session as it is, not as its manifest said
        except (OSError, SymlinkRefused) as exc:
            report.kept[name] = f"log unreadable: {exc}"
            continue
        if info.status == "active":
            if policy.max_age_days > 0 and info.updated_ts < cutoff:
                if dry_run:
                    report.marked_completed.append(name)
                    info.status = "completed"
                elif mark_completed(path, cutoff):
                    report.marked_completed.append(name)
                    info, _ = _manifest_info(path)
                    log_len = session_now(path, info)
            if info.status == "active":
                report.kept[name] = "active"
                continue
        candidates.append(_Candidate(path, info, log_len=log_len))
    if progress:
        progress(len(entries), len(entries))

    def remove(c: _Candidate, reason: str) -> None:
        size = tree_bytes(c.path) if dry_run else _remove(c.path, c.log_len)
        if size is None:
            report.kept[c.path.name] = "became live or active, or was written meanwhile"
            return
        report.removed.append(Removed(c.path.name, c.info.session_id, reason, c.info.updated_at, size,
                                      _detail(reason, c.info.updated_ts, policy, now)))

    rest = []
    for c in candidates:
        if c.half:
            remove(c, "half-created")
        elif is_empty(c.path, c.info, c.log_len):
            remove(c, "empty")
        else:
            rest.append(c)
    rest.sort(key=lambda c: c.path.name)
    rest.sort(key=lambda c: c.info.updated_ts, reverse=True)  # newest first
    for c in rest[policy.max_sessions:]:
        remove(c, "count")
    rest = rest[:policy.max_sessions]
    for c in rest:
        if c.info.updated_ts < cutoff:
            remove(c, "age")
    report.candidates_left = len(candidates) - len(report.removed)
    return report


def _detail(reason: str, last: float, policy: Policy, now: float) -> str:
    """Why a session goes, in words (``memfs gc`` prints it)."""
    if reason == "age":
        days = (now - last) / DAY
        shown = f"{days:.0f}" if days - policy.max_age_days >= 1 else f"{days:.1f}"
        return (f"old: last activity {time.strftime('%Y-%m-%d', time.gmtime(last))} "
                f"({shown} days > max_age_days {policy.max_age_days:g})")
    return {"empty": "empty: no events", "count": f"beyond max_sessions {policy.max_sessions}",
            "half-created": "half-created: an empty log and no manifest"}[reason]
