"""The event cap (SPEC §3.7): evict whole completed turns from the front of the log.

The cap is amortized: the commit calls :func:`enforce_cap` once ``event_count > max_events``,
and one eviction then removes enough leading closed turns to bring the count down to
``evict_to × max_events`` (:attr:`SessionConfig.evict_floor`; default 0.9). The next
``(1 − evict_to) × max_events`` appends run without a rewrite, and each rewrite writes one
summary. ``evict_to = 1.0`` is VT Code's literal "just under the cap": a rewrite (and a
summary) at almost every turn. When the closed turns are not enough (the open turn alone is
that large), all of them go and the open turn stays: the cap is tried again after each append.

The rewrite protocol, in order — each step leaves the store recoverable if the process dies
right after it:

1. flush + fdatasync; the evicted prefix is ``[0, cut)`` where ``cut`` ends a closed turn;
2. recount the prefix with the rescan's acceptance rules (the plan counted turns only: when
   records outside turns before the cut make fewer turns enough, the cut moves back to the
   fewest leading closed turns that reach the low-water mark — :func:`trim_cut`);
3. the summary hook gets the decoded evicted events (default: ``derived/eviction-summary-*.json``);
   if it fails, stop with the log untouched;
4. write the marker ``index/pending-cap-rewrite.json``;
5. atomically replace ``events.jsonl`` with ``[cut, end)``;
6. shift offsets and counts, persist metadata, delete the marker. The persist runs on the
   metadata persister's thread when the session has one (the appender goes on meanwhile; the
   metadata write that lands it deletes the marker — :meth:`MetadataWriter.write_marker
   <memfs.store.metadata.MetadataWriter.write_marker>`), in the appender's thread otherwise.

One append call, one rewrite: :func:`enforce_cap` decides each eviction at the append that
crossed the cap and does its steps 2–3 (with a custom hook also step 1, before calling it);
:func:`apply_evictions` does the rest once, when the call ends (:class:`Eviction`), so an
append of many lines that crosses the cap N times copies and syncs once. With the default
hook, steps 1 and 3 complete there too, for all the call's evictions at once, in the order
above. A call of one line goes through the steps exactly as listed.

Decisions: the default summary keeps the *first* 32 distinct facts of the evicted events, in
log order. Summary names carry the creation time in their first 16 hex digits, so sorting the
names sorts them chronologically. A crash between steps 3 and 5 leaves a summary of events
that are still in the log; the retry after the next append writes another one (readers of the
summaries drop duplicate facts), which is preferred over losing the summary of a rewrite; a
rewrite that fails (ENOSPC while copying) likewise keeps the summaries already written.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

import orjson

from memfs.errors import CapRewriteError
from memfs.events import decode_stored
from memfs.facts import event_facts
from memfs.store.lines import CHUNK, scan_chunks
from memfs.store.meta import CapMarker, now_rfc3339
from memfs.store.paths import (
    CAP_MARKER,
    DERIVED_DIR,
    EVENTS,
    ensure_private_dir,
    fsync_dir,
    in_background,
    open_nofollow,
    remove_file,
    replace_with,
    run_now,
    write_all,
    write_temp,
)

SUMMARY_PREFIX = "eviction-summary-"
SUMMARY_MAX_FACTS = 32
# A rewrite that keeps fewer bytes than this runs its disk steps in order on its own thread;
# a larger one overlaps them on the store's worker threads (see :func:`_disk_steps`).
OVERLAP_BYTES = 1 << 20


def _disk_steps(kept: int) -> Callable:
    """How a rewrite keeping ``kept`` bytes starts its disk work (the copy, syncs, temp files):
    :func:`~memfs.store.paths.in_background` to overlap them, or
    :func:`~memfs.store.paths.run_now`. Overlapping pays for a long copy (the default cap's
    copy runs beside the log's sync); for a small log each step is shorter than the thread
    hand-offs it costs, and those hand-offs share the interpreter lock with the mount's event
    loop (an idle session's p99 under ``scripts/bench_responsive.py`` (a) was lower in order)."""
    return in_background if kept >= OVERLAP_BYTES else run_now


def _after_step(step: int) -> None:
    """Called after each protocol step; crash tests replace it to stop the process there."""


def plan_cut(index, in_turn: bool, excess: int, first: int = 0) -> tuple[int, int] | None:
    """How many leading closed turns to evict to drop at least ``excess`` events, and the
    byte offset ending the last of them, counting from entry ``first`` of ``index`` (the
    entries before it are already evicted by this append call, see :class:`Eviction`). None
    when there is no closed turn left to evict.

    The turns' own counts are a lower bound of what goes: records outside turns before the
    cut go too, and the recount (step 2) finds them.
    """
    closed = len(index) - (1 if in_turn else 0)
    total, k = 0, first
    while k < closed and total < excess:
        total += index.count[k]
        k += 1
    return (k, index.end[k - 1]) if k > first else None


def trim_cut(index, k: int, offsets: list[int], excess: int, first: int = 0) -> tuple[int, int, int]:
    """The fewest of the planned entries ``first … k`` that drop at least ``excess`` events,
    now that the recount (step 2) gave the start ``offsets`` of every event between the
    previous cut and the planned one: records outside turns count too, so fewer turns than
    :func:`plan_cut` planned may be enough. Returns ``(k, cut, events before the cut)``."""
    for j in range(first + 1, k):
        n = bisect_left(offsets, index.end[j - 1])
        if n >= excess:
            return j, index.end[j - 1], n
    return k, index.end[k - 1], len(offsets)


def summary_json(session_id: str, events: list[dict]) -> bytes:
    """The default summary of the evicted ``events`` (SPEC §3.7), as the file's bytes."""
    facts: list[str] = []
    seen: set[str] = set()
    for event in events:
        if len(facts) == SUMMARY_MAX_FACTS:
            break
        for _type, fact in event_facts(event):
            if fact not in seen and len(facts) < SUMMARY_MAX_FACTS:
                seen.add(fact)
                facts.append(fact)
    summary = {
        "session_id": session_id,
        "evicted_event_count": len(events),
        "event_types": dict(Counter(e["type"] for e in events)),
        "grounded_facts": facts,
        "created_at": now_rfc3339(),
    }
    return orjson.dumps(summary, option=orjson.OPT_INDENT_2)


_names_lock = threading.Lock()
_last_ns = 0


def summary_name() -> str:
    """A new summary's file name: its creation time in the first 16 hex digits (strictly
    increasing in this process, so the names of one call's summaries sort in their order)."""
    global _last_ns
    with _names_lock:
        _last_ns = max(time.time_ns(), _last_ns + 1)
        ns = _last_ns
    return f"{SUMMARY_PREFIX}{ns:016x}{os.urandom(8).hex()}.json"


class Eviction:
    """The evictions of one append call whose rewrite is still to come: one rewrite of the log
    applies them all when the call ends (:func:`apply_evictions`).

    Each eviction is decided where the spec puts it — after the append that crossed the cap,
    with the turns closed at that point — and has its own summary; the rest is shared: the
    durability of step 1, the writes of the summaries (step 3, with the default hook), the
    copy of the remainder, the marker, the replace and the persist. The log then ends exactly
    as if each eviction had rewritten it, but a call of many lines (a ``write()`` of a batch,
    the CLI's import) copies the retained events once, not once per eviction, and syncs once.
    Meanwhile the log file still holds the evicted turns: the index keeps them (entries
    ``< turns``) with their offsets in that file, and ``state.event_count`` already excludes
    them (so the commit checks the cap against what the log will hold). No metadata is
    persisted until the rewrite (:meth:`~memfs.store.session.Session.request_persist` leaves
    it to the rewrite), so the disk never describes a log that is not there."""

    __slots__ = ("turns", "cut", "events", "summaries", "copy", "copied")

    def __init__(self) -> None:
        self.turns = 0  # index entries evicted (all closed turns, from the front)
        self.cut = 0  # the byte offset in the current file where the retained part starts
        self.events = 0  # events evicted
        self.summaries: list[bytes] = []  # the default hook's files, written at the rewrite
        self.copy: Future | None = None  # a temp copy of the remainder, started at the first eviction
        self.copied = (0, 0)  # the ``[start, end)`` it copies


def enforce_cap(s) -> None:
    """One eviction of session ``s`` (a :class:`memfs.store.session.Session`, its mutex held):
    plan the turns that bring the count down to its low-water mark (``evict_to ×
    max_events``), if closed turns allow, recount them (step 2) and summarize them (step 3).
    The commit calls it when ``event_count > max_events``; the rewrite (:func:`apply_evictions`)
    comes at the end of the append call.

    With the default summary hook, the summary is made here and written at the rewrite, after
    step 1's ``fdatasync``: steps 1–3 then complete there, once for all the call's evictions.
    A custom hook is called here, after step 1 (each eviction syncs the log first), since what
    it does cannot wait. For the call's first eviction the remainder is copied into a temp
    file — when it is large, on a worker thread while this thread recounts (a call of one line
    then finds its copy ready), else first, here (:func:`_disk_steps`). Temp files are
    invisible until renamed (and a dead process's are removed at the next open).
    """
    state, log = s.state, s.log
    ev = s.evicting
    first, start = (ev.turns, ev.cut) if ev is not None else (0, 0)
    excess = state.event_count - s.config.evict_floor
    plan = plan_cut(state.index, state.in_turn, excess, first)
    if plan is None:
        return
    k, cut = plan
    hook = s.config.summary_hook
    log.write_pending()
    file_len, fd = log.flushed_len, log.fd
    # 1. (a custom hook's) everything durable first; the remainder copied meanwhile
    disk = _disk_steps(file_len - cut)
    syncing = disk(log.sync_to, log.position) if hook is not None else None
    copying = None if ev is not None else disk(write_temp, s.dir / EVENTS, _copier(fd, cut, file_len))
    temps = [copying] if copying is not None else []
    try:
        # 2. recount the prefix as a rescan would
        evicted, offsets = [], []
        for off, lines in scan_chunks(fd, start, cut):
            for line in lines:
                decoded = decode_stored(line)
                if decoded is not None:
                    evicted.append(decoded[1])
                    offsets.append(off)
                off += len(line) + 1
        if k - first > 1 and len(evicted) > excess:  # records outside turns went too: maybe fewer turns do
            k, trimmed, n = trim_cut(state.index, k, offsets, excess, first)
            del evicted[n:]
            if trimmed != cut and copying is not None:  # the remainder starts earlier: copy it again
                temps.append(copying := disk(write_temp, s.dir / EVENTS, _copier(fd, trimmed, file_len)))
            cut = trimmed
        # 3. the summary (a custom hook's failure leaves the log untouched)
        if hook is None:
            summary = summary_json(s.session_id, evicted)
        else:
            syncing.result()
            _after_step(1)
            _after_step(2)
            try:
                hook(s.dir, s.session_id, evicted)
            except Exception as exc:
                raise CapRewriteError(f"event cap not applied: summary hook failed: {exc}") from exc
            _after_step(3)
    except BaseException:
        _discard(temps)
        raise
    if ev is None:
        s.evicting = ev = Eviction()
        temps.remove(copying)
        _discard(temps)
        ev.copy, ev.copied = copying, (cut, file_len)
    if hook is None:
        ev.summaries.append(summary)
    ev.turns, ev.cut = k, cut
    ev.events += len(evicted)
    state.event_count -= len(evicted)


def apply_evictions(s) -> None:
    """The rewrite for the evictions of the append call that ends (``s.evicting``; the caller
    holds the mutex): with the default hook step 1's ``fdatasync`` and step 3's summaries,
    then the marker (4), the log replaced by its bytes from the last cut on (5), the state
    shifted and persisted (6). Each step's disk work starts at once — on worker threads when
    the log is large, else here, in order (:func:`_disk_steps`); each step completes in order.
    On failure (``OSError``) the log and the state are as before the call's evictions
    (summaries already written stay, as after a crash before step 4), and the cap is tried
    again after the next append."""
    ev, s.evicting = s.evicting, None
    state, log = s.state, s.log
    state.event_count += ev.events  # what the file holds until it is replaced
    log.write_pending()
    file_len, fd = log.flushed_len, log.fd
    base = state.index.base
    derived = s.dir / DERIVED_DIR
    temps = []
    try:
        disk = _disk_steps(file_len - ev.cut)
        syncing = disk(log.sync_to, log.position) if ev.summaries else None
        copying = ev.copy
        temps.append(copying)
        if ev.copied[0] != ev.cut or ev.copied[1] > file_len:  # later evictions moved the cut
            temps.append(copying := disk(write_temp, s.dir / EVENTS, _copier(fd, ev.cut, file_len)))
        marker = CapMarker(file_len, file_len - ev.cut, base + ev.turns).to_json()
        temps.append(marking := disk(write_temp, s.dir / CAP_MARKER, marker))
        if ev.summaries:
            ensure_private_dir(derived)
            names = [summary_name() for _ in ev.summaries]
            writing = [disk(write_temp, derived / name, data) for name, data in zip(names, ev.summaries)]
            temps.extend(writing)
            # 1. the log durable before its summaries are
            syncing.result()
            _after_step(1)
            _after_step(2)
            # 3. the summaries, in the order of their evictions
            written = [w.result() for w in writing]
            for w, tmp, name in zip(writing, written, names):
                os.rename(tmp, derived / name)
                temps.remove(w)
            fsync_dir(derived)
            _after_step(3)
        remainder = copying.result()  # (a failed copy stops here, before the marker)
        if copying is ev.copy and ev.copied[1] < file_len:  # lines appended after the copy began
            _extend(remainder, fd, ev.copied[1], file_len)
        # 4. the marker (the previous rewrite's metadata first, if it is not on disk yet: the
        # marker it replaces is what recovery would need until then)
        if s.meta.marker_pending:
            s.persist()
        s.meta.write_marker(marking.result())
        temps.remove(marking)
        _after_step(4)
        # 5. the remainder replaces the log
        replace_with(remainder, s.dir / EVENTS)
        temps.remove(copying)
    finally:
        _discard(temps)
    s.replace_log(open_nofollow(s.dir / EVENTS, os.O_RDWR | os.O_APPEND), ev.cut)
    _after_step(5)
    # 6. shift the state; persisting it deletes the marker (on the persister thread, if any)
    state.index.drop_front(ev.turns, ev.cut)
    state.event_count -= ev.events
    s.persist_rewrite()
    _after_step(6)


def _extend(path: Path, src: int, start: int, end: int) -> None:
    """Append ``[start, end)`` of ``src`` to the temp file ``path`` and make it durable."""
    fd = open_nofollow(path, os.O_WRONLY)  # (not O_APPEND: copy_file_range refuses it)
    try:
        os.lseek(fd, 0, os.SEEK_END)
        _copier(src, start, end)(fd)
        os.fsync(fd)
    finally:
        os.close(fd)


def _copier(src: int, start: int, end: int) -> Callable[[int], None]:
    """What :func:`write_temp` calls to copy ``[start, end)`` of ``src`` into the temp file."""

    def copy(dst: int) -> None:
        pos = start
        while pos < end:
            try:
                n = os.copy_file_range(src, dst, end - pos, pos)
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                data = os.pread(src, min(end - pos, CHUNK), pos)  # no in-kernel copy here
                write_all(dst, data)
                n = len(data)
            if n == 0:
                raise OSError("log shrank during a cap rewrite")
            pos += n

    return copy


def _discard(temps: list[Future]) -> None:
    """Wait for the temp files not used (a step failed, or the cut moved) and delete them."""
    for future in temps:
        try:
            remove_file(future.result())
        except Exception:  # its own failure left nothing
            pass
