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

Where the facts come from: the store catalog's rows (:mod:`memfs.store.catalog`; pinned, live,
status, last activity, events, the log's length) and one listing of the root choose the
candidates; a session is examined on disk (pin, lock, manifest, log: the rules above) only when
the policy would act on it, or when its row cannot settle it, and the policy is decided again
with what the examination found; the removal re-checks under the session's lock.

Decisions: ``docs/design.md`` ("Retention").
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson

from memfs.errors import SessionBusy, SymlinkRefused
from memfs.store import lock as liveness
from memfs.store.catalog import catalog_of, forgotten, list_sessions, noted
from memfs.store.meta import format_rfc3339, now_rfc3339, parse_rfc3339
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
from memfs.store.recovery import recover
from memfs.store.session import open_session
from memfs.store.sessiondirs import find_session, is_session_entry, root_entries
from memfs.store.sessioninfo import SessionInfo, _manifest_info, is_pinned

Progress = Callable[[int, int], None]  # (done, total)
DAY = 86400.0


@dataclass(frozen=True, slots=True)
class Policy:
    """Retention policy (SPEC §7)."""

    max_sessions: int = 50
    max_age_days: float = 30


def pin(root: str | os.PathLike, session: str, reason: str) -> dict:
    """Pin a session against retention; return the pin record written."""
    path = find_session(root, session)
    record = {"session_id": _raw_id(path), "reason": reason, "pinned_at": now_rfc3339()}
    atomic_write(path / PIN, orjson.dumps(record, option=orjson.OPT_INDENT_2) + b"\n")
    noted(path)
    return record


def unpin(root: str | os.PathLike, session: str) -> bool:
    """Remove a session's pin; False when it was not pinned."""
    path = find_session(root, session)
    removed = remove_file(path / PIN)
    noted(path)
    return removed


def read_pin(session_dir: Path) -> dict | None:
    """The pin record, ``{}`` for a pin that cannot be read, None when not pinned."""
    if not is_pinned(session_dir):
        return None
    try:
        record = orjson.loads(read_file(session_dir / PIN))
    except (OSError, SymlinkRefused, orjson.JSONDecodeError):
        return {}
    return record if isinstance(record, dict) else {}


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


def _raw_id(session_dir: Path) -> str:
    info, _ = _manifest_info(session_dir)
    return info.session_id


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
    checked: bool = True  # examined on disk (False: as the store catalog's row says)


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
    noted(path)  # (after the lock's release: a live row is read again)
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
    forgotten(path.parent, path.name)
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

    The candidates come from the store catalog's rows (one listing of the root for what is not
    a session); only the sessions the policy would act on — and those whose row does not settle
    it (no readable manifest, an active session old enough for the sweep) — are examined on
    disk (:func:`_examine`), and the policy is decided again until every session it acts on was.
    """

    root = Path(root)
    report = GcReport(str(root), dry_run, policy)
    if not dry_run:
        report.trash_removed = remove_trash(root)
    now = time.time() if now is None else now
    cutoff = now - policy.max_age_days * DAY
    preserved = {sanitize(p) for p in preserve}
    catalog = catalog_of(root)
    catalog.verify()  # (the names listed, a stat of each session: what changed without memfs decides too)
    rows = {r.name: r for r in catalog.rows()}
    entries = root_entries(root)
    candidates: dict[str, _Candidate] = {}
    for i, entry in enumerate(entries):
        if progress:
            progress(i, len(entries))
        name = entry.name
        if entry.is_symlink():
            report.kept[name] = "symlink"
            continue
        if not is_session_entry(entry):
            continue
        if name in preserved:
            report.kept[name] = "preserved"
            continue
        row = rows.get(name)
        got = _from_row(row, root / name, policy, cutoff) if row is not None else None
        if got is None:
            got = _examine(report, root / name, policy, cutoff, dry_run)
        if isinstance(got, str):
            report.kept[name] = got
        elif got is not None:
            candidates[name] = got
    if progress:
        progress(len(entries), len(entries))
    while True:  # what the policy would act on, each examined on disk before it is acted on
        todo = [c for c, _ in _decide(candidates, policy, cutoff) if not c.checked]
        if not todo:
            break
        for c in todo:
            got = _examine(report, c.path, policy, cutoff, dry_run)
            if isinstance(got, str):
                report.kept[c.path.name] = got
                del candidates[c.path.name]
            elif got is not None:
                candidates[c.path.name] = got
            else:
                del candidates[c.path.name]

    def remove(c: _Candidate, reason: str) -> None:
        size = tree_bytes(c.path) if dry_run else _remove(c.path, c.log_len)
        if size is None:
            report.kept[c.path.name] = "became live or active, or was written meanwhile"
            return
        report.removed.append(Removed(c.path.name, c.info.session_id, reason, c.info.updated_at, size,
                                      _detail(reason, c.info.updated_ts, policy, now)))

    for c, reason in _decide(candidates, policy, cutoff):
        remove(c, reason)
    report.candidates_left = len(candidates) - len(report.removed)
    return report


def _from_row(row, path: Path, policy: Policy, cutoff: float) -> _Candidate | str | None:
    """What the catalog's row says of a session: why it is kept, or a candidate as the row
    describes it; None when only the folder can tell (no readable manifest; an active session
    the sweep may complete)."""
    if row.pinned:
        return "pinned"
    if row.live:
        return "live"
    if row.manifest_key is None or not row.readable:
        return None
    if row.manifest_status == "active":
        return None if policy.max_age_days > 0 and row.updated_ts < cutoff else "active"
    info = row.info()
    info.updated_ts = row.updated_ts  # (the store's activity, not the records' time: a year-old import is young)
    return _Candidate(path, info, log_len=row.log_size, checked=False)


def _examine(report: GcReport, path: Path, policy: Policy, cutoff: float, dry_run: bool) -> _Candidate | str | None:
    """The session as it is on disk: why it is kept, or a candidate (None: not one). An
    active session idle since before ``cutoff`` is completed first (the sweep)."""
    name = path.name
    if is_pinned(path):
        return "pinned"
    if liveness.is_live(path):
        return "live"
    info, raw = _manifest_info(path)
    if raw is None and half_created(path):
        return _Candidate(path, info, half=True, log_len=_log_len(path))
    if raw is None:
        return "manifest missing or unreadable"
    if type(raw.get("status")) is not str:
        return "manifest has no status"
    try:
        log_len = session_now(path, info)  # the session as it is, not as its manifest said
    except (OSError, SymlinkRefused) as exc:
        return f"log unreadable: {exc}"
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
            return "active"
    return _Candidate(path, info, log_len=log_len)


def _decide(candidates: dict[str, _Candidate], policy: Policy, cutoff: float) -> list[tuple[_Candidate, str]]:
    """What the policy removes of ``candidates``, in order, and why."""
    out, rest = [], []
    for name in sorted(candidates):
        c = candidates[name]
        if c.half:
            out.append((c, "half-created"))
        elif is_empty(c.path, c.info, c.log_len):
            out.append((c, "empty"))
        else:
            rest.append(c)
    rest.sort(key=lambda c: c.info.updated_ts, reverse=True)  # newest first (ties by name)
    out += [(c, "count") for c in rest[policy.max_sessions:]]
    out += [(c, "age") for c in rest[:policy.max_sessions] if c.info.updated_ts < cutoff]
    return out


def _detail(reason: str, last: float, policy: Policy, now: float) -> str:
    """Why a session goes, in words (``memfs gc`` prints it)."""
    if reason == "age":
        days = (now - last) / DAY
        shown = f"{days:.0f}" if days - policy.max_age_days >= 1 else f"{days:.1f}"
        return (f"old: last activity {time.strftime('%Y-%m-%d', time.gmtime(last))} "
                f"({shown} days > max_age_days {policy.max_age_days:g})")
    return {"empty": "empty: no events", "count": f"beyond max_sessions {policy.max_sessions}",
            "half-created": "half-created: an empty log and no manifest"}[reason]


__all__ = ["GcReport", "Policy", "Removed", "SessionInfo", "gc", "is_pinned", "list_sessions", "mark_completed", "pin",
           "read_pin", "remove_trash", "session_now", "unpin"]
