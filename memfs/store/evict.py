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

Decisions: the default summary keeps the *first* 32 distinct facts of the evicted events, in
log order. Summary names carry the creation time in their first 16 hex digits, so sorting the
names sorts them chronologically. A crash between steps 3 and 5 leaves a summary of events
that are still in the log; the retry after the next append writes another one (readers of the
summaries drop duplicate facts), which is preferred over losing the summary of a rewrite.
"""

from __future__ import annotations

import errno
import os
import time
from bisect import bisect_left
from collections import Counter
from concurrent.futures import Future
from pathlib import Path
from typing import Callable

import orjson

from memfs.errors import CapRewriteError
from memfs.events import decode_stored
from memfs.facts import event_facts
from memfs.store.lines import CHUNK, scan_lines
from memfs.store.meta import CapMarker, now_rfc3339
from memfs.store.paths import (CAP_MARKER, DERIVED_DIR, EVENTS, atomic_write, ensure_private_dir, open_nofollow,
                               in_background, remove_file, replace_with, write_all, write_temp)

SUMMARY_PREFIX = "eviction-summary-"
SUMMARY_MAX_FACTS = 32


def _after_step(step: int) -> None:
    """Called after each protocol step; crash tests replace it to stop the process there."""


def plan_cut(index, in_turn: bool, excess: int) -> tuple[int, int] | None:
    """How many leading closed turns to evict to drop at least ``excess`` events, and the
    byte offset ending the last of them. None when there is no closed turn to evict.

    The turns' own counts are a lower bound of what goes: records outside turns before the
    cut go too, and the recount (step 2) finds them.
    """
    closed = len(index) - (1 if in_turn else 0)
    total = k = 0
    while k < closed and total < excess:
        total += index.count[k]
        k += 1
    return (k, index.end[k - 1]) if k else None


def trim_cut(index, k: int, offsets: list[int], excess: int) -> tuple[int, int, int]:
    """The fewest of the ``k`` planned turns that drop at least ``excess`` events, now that
    the recount (step 2) gave the start ``offsets`` of every event before the planned cut:
    records outside turns count too, so fewer turns than :func:`plan_cut` planned may be
    enough. Returns ``(turns, cut, events before the cut)``."""
    for j in range(1, k):
        n = bisect_left(offsets, index.end[j - 1])
        if n >= excess:
            return j, index.end[j - 1], n
    return k, index.end[k - 1], len(offsets)


def default_summary_hook(session_dir: Path, session_id: str, events: list[dict]) -> None:
    """Write ``derived/eviction-summary-<32 hex>.json`` for the evicted events."""
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
    derived = session_dir / DERIVED_DIR
    ensure_private_dir(derived)
    name = f"{SUMMARY_PREFIX}{time.time_ns():016x}{os.urandom(8).hex()}.json"
    atomic_write(derived / name, orjson.dumps(summary, option=orjson.OPT_INDENT_2))


def enforce_cap(s) -> None:
    """Bring session ``s`` (a :class:`memfs.store.session.Session`, its mutex held) down to
    its low-water mark (``evict_to × max_events``), if closed turns allow; the commit calls it
    when ``event_count > max_events``.

    The steps' disk waits overlap where the order allows (the steps still *complete* in the
    spec's order, and a crash after any of them leaves what it left before): step 1's
    ``fdatasync`` and the copy of the remainder into a temp file run on worker threads while
    this thread recounts the prefix; the marker's temp file is written beside the summary hook.
    Temp files are invisible until renamed (and a dead process's are removed at the next open).
    """
    state, log = s.state, s.log
    excess = state.event_count - s.config.evict_floor
    plan = plan_cut(state.index, state.in_turn, excess)
    if plan is None:
        return
    k, cut = plan
    log.write_pending()
    file_len, old_fd = log.flushed_len, log.fd
    base = state.index.base
    # 1. everything durable before anything is rewritten; the remainder copied meanwhile
    syncing = in_background(log.sync_to, log.position)
    copying = in_background(write_temp, s.dir / EVENTS, _copier(old_fd, cut, file_len))
    temps = [copying]
    try:
        # 2. recount the prefix as a rescan would
        evicted, offsets = [], []
        for off, line in scan_lines(old_fd, 0, cut):
            decoded = decode_stored(line)
            if decoded is not None:
                evicted.append(decoded[1])
                offsets.append(off)
        if k > 1 and len(evicted) > excess:  # records outside turns went too: maybe fewer turns do
            k, trimmed, n = trim_cut(state.index, k, offsets, excess)
            del evicted[n:]
            if trimmed != cut:  # the remainder starts earlier: copy it again
                cut = trimmed
                temps.append(copying := in_background(write_temp, s.dir / EVENTS, _copier(old_fd, cut, file_len)))
        syncing.result()
        _after_step(1)
        _after_step(2)
        # 3. the summary hook (its failure leaves the log untouched); the marker's temp meanwhile
        marker = CapMarker(file_len, file_len - cut, base + k).to_json()
        temps.append(marking := in_background(write_temp, s.dir / CAP_MARKER, marker))
        hook = s.config.summary_hook or default_summary_hook
        try:
            hook(s.dir, s.session_id, evicted)
        except Exception as exc:
            raise CapRewriteError(f"event cap not applied: summary hook failed: {exc}") from exc
        _after_step(3)
        remainder = copying.result()  # (a failed copy stops here, before the marker)
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
    s.replace_log(open_nofollow(s.dir / EVENTS, os.O_RDWR | os.O_APPEND), cut)
    _after_step(5)
    # 6. shift the state; persisting it deletes the marker (on the persister thread, if any)
    state.index.drop_front(k, cut)
    state.event_count -= len(evicted)
    s.persist_rewrite()
    _after_step(6)


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
