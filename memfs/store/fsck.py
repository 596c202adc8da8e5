"""``memfs fsck`` (SPEC §7): rescan a session, repair its metadata, report what was wrong.

Built on the session log's own open: a writable :func:`~memfs.store.session.open_session`
already repairs a torn tail, rescans when the metadata cannot be trusted, recovers or
deletes a cap-rewrite marker, and says so in ``open_report``. On top of that, fsck runs a
forced full :func:`~memfs.store.session.rescan` and compares it with the state the open
settled on: metadata that passed the fast-path checks yet disagrees with the log (wrong
counts, shifted offsets) is invalidated and rebuilt by reopening.

What counts (decisions recorded here):

* **repaired** — a torn tail truncated, metadata rebuilt, a stale marker removed, an
  interrupted cap rewrite completed, temp files of a killed writer removed
  (:func:`~memfs.store.paths.remove_stale_temps`);
* **damaged** — lines the rescan must skip (not UTF-8, not JSON, not an envelope,
  malformed lifecycle events): fsck cannot repair those without losing bytes, so they stay
  and are reported every time; or metadata that still disagrees after a rebuild;
* refused lines in ``rejected.jsonl`` are reported but are not damage (they were handled);
* a session live in another process is ``skipped`` (it cannot be checked without its lock)
  and is not a failure;
* a status of ``completed`` where the log implies ``active`` is accepted: the retention
  sweep marks abandoned sessions that way.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson

from memfs.errors import MemfsError, SessionBusy
from memfs.store.machine import TurnState, renumber
from memfs.store.paths import EVENTS, MANIFEST, atomic_write, open_nofollow, remove_stale_temps
from memfs.store.recovery import OpenReport, rescan
from memfs.store.rejected import count_rejected
from memfs.store.retention import list_sessions, remove_trash
from memfs.store.session import SessionHandle, open_session
from memfs.store.sessiondirs import find_session

Progress = Callable[[int, int], None]


@dataclass(slots=True)
class FsckReport:
    """The findings for one session."""

    name: str
    session_id: str = ""
    result: str = "ok"  # "ok" | "repaired" | "damaged" | "skipped" | "error"
    repairs: list[str] = field(default_factory=list)
    damage: list[str] = field(default_factory=list)
    note: str = ""  # why skipped, or the error
    fast_path: bool = True
    rescan_reason: str = ""
    skipped_lines: int = 0
    torn_tail_bytes: int = 0
    stale_marker: bool = False
    stale_temps: int = 0  # temp files of a dead writer removed
    recovered_marker: bool = False
    rejected: int = 0
    events: int = 0
    turns: int = 0
    log_bytes: int = 0

    @property
    def failed(self) -> bool:
        """Whether this result makes ``memfs fsck`` exit non-zero."""
        return self.result in ("repaired", "damaged", "error")

    def to_dict(self) -> dict:
        return asdict(self)


def _full_rescan(handle: SessionHandle) -> tuple[TurnState, OpenReport]:
    """A forced rescan of the whole log, numbered from the handle's retained base."""
    found = OpenReport()
    fd = open_nofollow(handle.path / EVENTS, os.O_RDONLY)
    try:
        state = rescan(fd, handle.file_len, found)
    finally:
        os.close(fd)
    renumber(state, handle.manifest["retained_turn_base"])
    return state, found


def _differences(handle: SessionHandle, state: TurnState) -> list[str]:
    """Where the handle's state disagrees with the rescanned ``state``."""
    manifest = handle.manifest
    entries = handle.turn_index
    diffs = []
    for name, found in (("event_count", state.event_count), ("turn_count", state.turn_count),
                        ("in_turn", state.in_turn)):
        if manifest[name] != found:
            diffs.append(f"{name} is {manifest[name]}, the log says {found}")
    if manifest["status"] != state.status and not (manifest["status"] == "completed" and state.status == "active"):
        diffs.append(f"status is {manifest['status']}, the log says {state.status}")
    scanned = state.index.entries()
    if len(scanned) != len(entries):
        diffs.append(f"turn index has {len(entries)} entries, the log has {len(scanned)} turns")
        return diffs
    keys = ("turn_number", "start_offset", "end_offset", "event_count")
    for have, want in zip(entries, scanned):
        # another writer's index may carry no outcome: compare it only when both have one
        outcome_differs = "outcome" in have and "outcome" in want and have["outcome"] != want["outcome"]
        if outcome_differs or any(have[k] != want[k] for k in keys):
            diffs.append(f"turn {want['turn_number']}: index entry disagrees with the log")
            break
    return diffs


def _invalidate(handle: SessionHandle, state: TurnState) -> None:
    """Make the next open rescan: drop ``persisted_file_len`` from the manifest, with the
    turn numbering anchored at the retained base (so ordinals stay stable)."""
    manifest = handle.manifest
    del manifest["persisted_file_len"]
    manifest["turn_count"] = state.turn_count
    atomic_write(handle.path / MANIFEST, orjson.dumps(manifest))


def _record_open(report: FsckReport, rep: OpenReport) -> None:
    report.fast_path = report.fast_path and rep.fast_path
    if rep.torn_tail_bytes:
        report.torn_tail_bytes += rep.torn_tail_bytes
        report.repairs.append(f"torn tail: {rep.torn_tail_bytes} unterminated bytes moved to rejected.jsonl")
    if rep.recovered_marker:
        report.recovered_marker = True
        report.repairs.append("interrupted cap rewrite completed")
    elif rep.stale_marker:
        report.stale_marker = True
        report.repairs.append("stale cap-rewrite marker removed")
    if not rep.fast_path:
        report.rescan_reason = rep.reason
        report.repairs.append(f"metadata rebuilt ({rep.reason})")


def _open(root: Path, name: str) -> SessionHandle:
    """The session as its writer (the lock taken now: repairing is a change, SPEC §3.5);
    :class:`SessionBusy` when another process writes it. No cap: fsck never evicts."""
    handle = open_session(root, name, durability="write", max_events=0, create=False)
    try:
        handle.lock()
    except BaseException:
        handle.close()
        raise
    return handle


def fsck_session(root: str | os.PathLike, session: str) -> FsckReport:
    """Check and repair one session (a raw id or a directory name)."""
    root = Path(root)
    path = find_session(root, session)
    report = FsckReport(path.name)
    try:
        handle = _open(root, path.name)
    except SessionBusy:
        report.result, report.note = "skipped", "live: open for writing by another process"
        return report
    try:
        _record_open(report, handle.open_report)
        report.stale_temps = remove_stale_temps(path)
        if report.stale_temps:
            report.repairs.append(f"removed {report.stale_temps} stale temp file(s) of an interrupted write")
        state, found = _full_rescan(handle)
        diffs = _differences(handle, state)
        if diffs:
            _invalidate(handle, state)
            handle.close()
            handle = _open(root, path.name)  # rescans: the manifest no longer names a length
            report.fast_path = False
            report.repairs.append("metadata rebuilt: it disagreed with the log: " + "; ".join(diffs))
            state, found = _full_rescan(handle)
            left = _differences(handle, state)
            if left:
                report.damage.append("metadata still disagrees after a rebuild: " + "; ".join(left))
        report.skipped_lines = found.skipped_lines
        if found.skipped_lines:
            report.damage.append(f"{found.skipped_lines} line(s) of events.jsonl cannot be read and are skipped")
        manifest = handle.manifest
        report.session_id = manifest["session_id"]
        report.events = manifest["event_count"]
        report.turns = manifest["turn_count"]
        report.log_bytes = handle.file_len
    finally:
        handle.close()
    report.rejected = count_rejected(path)
    report.result = "damaged" if report.damage else "repaired" if report.repairs else "ok"
    return report


def fsck_store(root: str | os.PathLike, sessions: Iterable[str] = (), *,
               progress: Progress | None = None) -> list[FsckReport]:
    """fsck the named sessions, or every session of the store when none is named.

    A session that cannot be checked (I/O error, symlink, vanished) gives an ``error``
    report instead of stopping the run.
    """
    if not sessions:
        remove_trash(root)  # leftovers of a gc removal a crash interrupted
    names = list(sessions) or [s.name for s in sorted(list_sessions(root), key=lambda s: s.name)]
    reports = []
    for i, name in enumerate(names):
        if progress:
            progress(i, len(names))
        try:
            reports.append(fsck_session(root, name))
        except (OSError, MemfsError) as exc:
            reports.append(FsckReport(name, result="error", note=str(exc)))
    if progress:
        progress(len(names), len(names))
    return reports

