"""Opening a session (SPEC §3.3, §3.7): the fast-path decision, rescan, torn tail, cap recovery.

:func:`recover` reads what is on disk — the log's length, ``manifest.json``, the turn index
(``turns.cache`` when it belongs to the current ``turns.json``), a cap-rewrite marker — and
returns the session's :class:`~memfs.store.machine.TurnState`: trusted from the metadata when
every §3.3 condition holds, else rebuilt by :func:`rescan`, which streams the log and never
fails on content. A writable open first moves a torn tail to ``rejected.jsonl``
(:func:`repair_torn_tail`); a read-only open changes nothing on disk.

An open session then follows the log's tail (:func:`follow`: what other processes appended
since) until it becomes the writer, which reuses its own rescan when it still describes the log
(:func:`rescanned_state`).
"""

from __future__ import annotations

import bisect
import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from memfs.errors import SymlinkRefused
from memfs.events import Kind, decode_stored
from memfs.store import rescanner
from memfs.store.lines import CHUNK, scan_chunks
from memfs.store.machine import TurnState, apply, renumber
from memfs.store.meta import CapMarker, ManifestRead, TurnIndex, file_key, now_rfc3339, read_manifest
from memfs.store.paths import (
    CAP_MARKER,
    EVENTS,
    MANIFEST,
    TURNS,
    TURNS_CACHE,
    open_nofollow,
    read_fd,
    read_file,
    refuse_symlink,
)
from memfs.store.rejected import record_rejected

if TYPE_CHECKING:
    from memfs.store.session import Session

TORN_TAIL = "torn-tail"  # the reason rejected.jsonl gives for an unterminated last line (§3.3)


@dataclass(slots=True)
class OpenReport:
    """How a session was opened: what fsck and the tests look at."""

    fast_path: bool = True
    reason: str = ""  # why a rescan was needed
    scanned_bytes: int = 0
    scanned_lines: int = 0
    skipped_lines: int = 0
    torn_tail_bytes: int = 0
    stale_marker: bool = False
    recovered_marker: bool = False
    index_source: str = ""  # fast path: "turns.json", or "turns.cache" (see memfs.store.meta)


@dataclass(slots=True)
class Recovered:
    """What an open found: the state, the session's identity, and what is left to do."""

    state: TurnState
    file_len: int
    session_id: str
    created_at: str
    updated_at: str
    report: OpenReport
    marker: bool  # a cap-rewrite marker is on disk: delete it once metadata is persisted


def recover(session_dir: Path, fd: int | None, session_id: str, writable: bool) -> Recovered:
    """The state of the session in ``session_dir`` whose log is open as ``fd`` (None: no log
    yet). A rescan's result is not persisted here (``report.fast_path`` is False: the caller
    persists it when it may write).

    ``writable`` (the caller holds the liveness lock): a torn tail is repaired first, and the
    fast path also checks the log's tail against the index (:func:`_tail_agrees`), so a
    manifest that only happens to name the right length is not trusted. Read-only (SPEC §3.5):
    nothing on disk changes; metadata that describes a prefix of the log is trusted for that
    prefix and the bytes past it are read as a tail — another process's appends, at the cost
    of the new bytes only; an unterminated last line is left out (it is being written).
    """
    file_len = os.fstat(fd).st_size if fd is not None else 0
    report = OpenReport()
    if writable and fd is not None:
        file_len = repair_torn_tail(session_dir, fd, file_len, report)

    old = marker = None
    try:
        old = read_manifest(read_file(session_dir / MANIFEST), session_id)
    except FileNotFoundError:
        pass
    try:
        marker = CapMarker.parse(read_file(session_dir / CAP_MARKER))
        if marker is None:
            marker = CapMarker(-1, -1, 1)  # unreadable: stale
    except FileNotFoundError:
        pass
    old_index = read_index(session_dir, old is not None and old.complete, report)

    manifest = old.manifest if old is not None else None
    described = manifest.persisted_file_len if manifest is not None else -1
    tail = not writable and fd is not None and 0 <= described < file_len  # a follower reads the rest
    reason = ""
    if old is None:
        reason = "manifest missing or unreadable"
    elif not old.complete:
        reason = "manifest incomplete"
    elif old_index is None:
        reason = "turn index missing or unreadable"
    elif described != file_len and not tail:
        reason = f"log is {file_len} bytes, metadata describes {described}"
    elif not old_index.consistent_with(manifest, described):
        reason = "turn index inconsistent with manifest"
    elif marker is not None and marker.matches(file_len):
        reason = "cap rewrite was in flight"
    elif writable and fd is not None and not _tail_agrees(fd, file_len, old_index):
        reason = "the log's last lines disagree with the turn index"

    now = now_rfc3339()
    if not reason:
        if manifest.in_turn:
            old_index.mark_last_open()
        elif not len(old_index):  # an empty index does not say where numbering goes on
            old_index.rebase(manifest.retained_turn_base)
        state = TurnState(old_index, manifest.turn_count, manifest.event_count, manifest.status, manifest.in_turn)
        if tail:
            file_len = scan_into(state, fd, described, file_len, report)
            report.scanned_bytes = file_len - described
    else:
        report.fast_path = False
        report.reason = reason
        report.index_source = ""
        status = manifest.status if manifest is not None else "active"
        state = TurnState(status=status)
        if fd is not None:
            got = _helped_rescan(fd, file_len, status, report)
            if got is not None:
                state, end = got
            else:
                end = scan_into(state, fd, 0, file_len, report)
            report.scanned_bytes = file_len
            file_len = end  # (writable: the same; read-only: without a line being written)
        if marker is not None and marker.matches(file_len):
            report.recovered_marker = True
        renumber(state, rescan_base(state, old, old_index, marker, file_len))
    if marker is not None:
        report.stale_marker = not report.recovered_marker
    return Recovered(state, file_len,
                     manifest.session_id if manifest is not None else session_id,
                     manifest.created_at if manifest is not None else now,
                     manifest.updated_at if manifest is not None else now,
                     report, marker is not None)


TAIL_WINDOW = 4096  # bytes a writer's takeover check reads at the end of the log (and of a turn start)


def _tail_agrees(fd: int, file_len: int, index: TurnIndex) -> bool:
    """A writer's check of metadata it is about to trust (SPEC §3.5, a takeover), beyond the
    length: the log ends with a whole line, and the last indexed turn starts with a
    ``turn.started`` line where the index says. Two short reads."""
    if file_len == 0:
        return True
    if os.pread(fd, 1, file_len - 1) != b"\n":
        return False
    if len(index):
        start = index.start[-1]
        head = os.pread(fd, min(TAIL_WINDOW, file_len - start), start)
        nl = head.find(b"\n")
        if nl >= 0:
            first = decode_stored(head[:nl])
            if first is None or first[0] is not Kind.TURN_STARTED:
                return False
    return True


def scan_into(state: TurnState, fd: int, start: int, end: int, report: OpenReport | None = None) -> int:
    """Fold the complete lines of ``[start, end)`` into ``state`` with the rescan's acceptance
    rules (lines :func:`decode_stored` refuses are skipped; their bytes still advance offsets);
    return the offset just past the last complete line (an unterminated tail is left: another
    process may be writing it). Streams a chunk at a time."""
    ts = now_rfc3339()
    decode = decode_stored
    scanned = skipped = 0
    offset = start
    for offset, lines in scan_chunks(fd, start, end):
        scanned += len(lines)
        for line in lines:
            after = offset + len(line) + 1
            decoded = decode(line)
            if decoded is None:
                skipped += 1
            else:
                apply(state, decoded[0], offset, after, ts)
            offset = after
    if report is not None:
        report.scanned_lines += scanned
        report.skipped_lines += skipped
    return offset


def _helped_rescan(fd: int, file_len: int, status: str, report: OpenReport) -> tuple[TurnState, int] | None:
    """The full rescan of a large log by this process's rescan helper, if it has one
    (:mod:`memfs.store.rescanner`): ``(state, end)``, or None to rescan here."""
    helper = rescanner.current()
    if helper is None or file_len < rescanner.MIN_BYTES:
        return None
    got = helper.scan(fd, file_len, status)
    if got is None:
        return None
    state, end, scanned, skipped = got
    report.scanned_lines += scanned
    report.skipped_lines += skipped
    return state, end


def rescan(fd: int, file_len: int, report: OpenReport, status: str = "active") -> TurnState:
    """Rebuild the turn state from the log's bytes ``[0, file_len)``, numbering turns from 1.

    ``status`` is the session's status before the log's first line: it stands when no line of
    the log sets one (an open passes the old manifest's: the event that set it may have been
    evicted). Never fails on content (see :func:`scan_into`). Memory stays bounded by the
    chunk, the longest line and a few bytes per turn.
    """
    state = TurnState(status=status)
    scan_into(state, fd, 0, file_len, report)
    report.scanned_bytes = file_len
    return state


def rescan_base(state: TurnState, old: ManifestRead | None, old_index: TurnIndex | None,
                 marker: CapMarker | None, file_len: int) -> int:
    """The ordinal of the first turn a rescan found, keeping ordinals stable (SPEC §3.7).

    In order of trust: a matching cap marker names it; else the rescan's first turn is looked
    up in the old index (by offset, shifted when the log is shorter than the manifest
    described — a cap rewrite whose marker was lost); else the old manifest's
    ``retained_turn_base``; else 1. In every case ``turn_count`` never decreases, so an emptied
    log continues at ``turn_count + 1``.
    """
    closed = len(state.index) - (1 if state.in_turn else 0)
    manifest = old.manifest if old is not None else None
    base = None
    if marker is not None and marker.matches(file_len):
        base = marker.retained_turn_base
    elif len(state.index) and old_index is not None and len(old_index):
        shift = 0
        if manifest is not None and file_len < manifest.persisted_file_len:
            shift = manifest.persisted_file_len - file_len
        first = state.index.start[0] + shift
        i = bisect.bisect_left(old_index.start, first)
        if i < len(old_index) and old_index.start[i] == first:
            base = old_index.base + i
    if base is None and old is not None and old.has_base:
        base = manifest.retained_turn_base
    if base is None:
        base = 1
    if old is not None and old.has_turn_count:
        base = max(base, manifest.turn_count - closed + 1)
    return max(base, 1)


def read_index(session_dir: Path, prefer_cache: bool, report: OpenReport) -> TurnIndex | None:
    """The turn index on disk: from ``turns.cache`` when it was written after the current
    ``turns.json``, else by parsing ``turns.json``; None when neither is usable."""
    path = session_dir / TURNS
    if prefer_cache and os.path.lexists(session_dir / TURNS_CACHE):
        index = None
        try:
            st = refuse_symlink(path)
            if st is not None:
                key = file_key(st)
                index = TurnIndex.from_cache(read_file(session_dir / TURNS_CACHE), key)
        except FileNotFoundError:
            pass
        if index is not None:
            index.set_json_source(lambda: _read_if_unchanged(path, key))
            report.index_source = "turns.cache"
            return index
    try:
        index = TurnIndex.parse(read_file(path))
    except FileNotFoundError:
        return None
    report.index_source = "turns.json"
    return index


def _read_if_unchanged(path: Path, key: list[int]) -> bytes | None:
    """The bytes of ``path`` if it is still the file ``key`` identifies, else None."""
    try:
        fd = open_nofollow(path, os.O_RDONLY)
    except (OSError, SymlinkRefused):
        return None
    try:
        return read_fd(fd) if file_key(os.fstat(fd)) == key else None
    finally:
        os.close(fd)


def repair_torn_tail(session_dir: Path, fd: int, file_len: int, report: OpenReport) -> int:
    """Move an unterminated last line to ``rejected.jsonl`` and truncate it away."""
    if file_len == 0 or os.pread(fd, 1, file_len - 1) == b"\n":
        return file_len
    pos = file_len
    while pos > 0:
        lo = max(0, pos - CHUNK)
        nl = os.pread(fd, pos - lo, lo).rfind(b"\n")
        if nl >= 0:
            pos = lo + nl + 1
            break
        pos = lo
    tail = os.pread(fd, file_len - pos, pos)
    record_rejected(session_dir, tail, TORN_TAIL, "EIO")
    os.ftruncate(fd, pos)
    os.fsync(fd)
    report.torn_tail_bytes = len(tail)
    return pos


# --- a session in this process: following the log, taking it over ---------------------------


def follow(s: Session) -> None:
    """A follower's catch-up with the log on disk (caller holds ``mutex``): fold the lines
    other processes appended since; re-read everything when the log was replaced (a cap
    rewrite elsewhere) or shrank. One ``fstat`` when nothing changed (and, once somebody
    read the turn times here, one more for ``index/turn-times.jsonl``: new times bump
    ``version`` too, so views refresh)."""
    if s.lock_file is not None or s.closed:
        return
    _follow_log(s)
    if s.times.refresh_if_loaded():
        s.version += 1


def _follow_log(s: Session) -> None:
    log_file = s.log
    if log_file.fd is None:
        try:
            fd = open_nofollow(s.dir / EVENTS, os.O_RDONLY)
        except FileNotFoundError:
            return
        _reread(s, fd)
        return
    st = os.fstat(log_file.fd)
    if st.st_nlink == 0 or st.st_size < log_file.flushed_len:
        _reread(s, open_nofollow(s.dir / EVENTS, os.O_RDONLY))
    elif st.st_size > log_file.flushed_len:
        end = scan_into(s.state, log_file.fd, log_file.flushed_len, st.st_size)
        if end > log_file.flushed_len:
            log_file.flushed_len = end
            s.version += 1
            s.last_change = st.st_mtime


def _reread(s: Session, fd: int) -> None:
    """Recover the session afresh from disk, the log open as ``fd`` (a new file)."""
    try:
        found = recover(s.dir, fd, s.session_id, writable=False)
    except BaseException:
        os.close(fd)
        raise
    seen = s.log.flushed_len
    s.adopt(found, fd)
    if seen:  # offsets seen before mean nothing now
        s.rewrites += 1


def rescanned_state(s: Session, fd: int) -> Recovered | None:
    """What this process's own rescan found, when it still describes the log open as
    ``fd`` (the same file, nothing appended since, no cap rewrite pending; a torn tail is
    repaired first): a writer taking over a session whose metadata was stale need not read
    the whole log a second time. None when the log must be recovered afresh."""
    old = s.log
    if s.report.fast_path or old.fd is None or os.path.lexists(s.dir / CAP_MARKER):
        return None
    st = os.fstat(fd)
    if not os.path.samestat(os.fstat(old.fd), st) or st.st_size < old.flushed_len:
        return None
    report = dataclasses.replace(s.report, torn_tail_bytes=0)
    if repair_torn_tail(s.dir, fd, st.st_size, report) != old.flushed_len:
        return None  # lines arrived since the rescan: recover afresh
    return Recovered(s.state, old.flushed_len, s.session_id, s.created_at, s.updated_at, report, False)
