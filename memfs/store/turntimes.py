"""Arrival times of turns: ``index/turn-times.jsonl``, a sidecar memfs writes for itself.

No event has to carry a clock (Codex's ``exec --json`` stream carries none), so memfs records
*when it received* a turn's ``turn.started`` line and the line that closed it. The sidecar is a
memfs extension under ``index/`` (other readers, VT Code among them, ignore it), append-only,
one JSON line per fact::

    {"turn":3,"started_at":"2025-05-01T10:00:00.123+00:00","completed_at":null}      (still open)
    {"turn":3,"started_at":"2025-05-01T10:00:00.123+00:00","completed_at":"…"}       (closed)

Readers merge the lines of one turn (a string beats a null; a later string beats an earlier
one; an unparsable line is skipped), so a duplicate line — a crash between the sidecar's write
and the manifest's — changes nothing.

Decisions recorded here:

* **Only arrivals this process witnessed as the writer are recorded.** The start is the index
  entry's ``ts``, stamped by the commit when it opened the entry (:func:`memfs.store.machine.apply`)
  — but only for turns opened since this process took the liveness lock (``first_live``): a
  rescan or a follower stamps ``ts`` with the time *it* read the line, which is not when the
  turn started, so those turns get no start. The end is the time of the boundary's
  :meth:`~memfs.store.session.Session.request_persist` (run right after the boundary's
  ``apply`` in the commit, so the hot path gains one integer comparison), or,
  for a turn abandoned by the next ``turn.started``, that next turn's arrival. What was not
  witnessed is null — never invented — and stays null: a rescan writes nothing here.
* **Written with the metadata persist** (:class:`~memfs.store.metadata.MetadataWriter`, on the
  persister thread): the lines noted since the last persist go in one ``write`` before
  ``turns.json``, never a syscall per append. An open turn's start is written by the first
  persist that sees it open (so a writer that dies mid-turn, or hands over, leaves it for the
  next one); until then it is known in memory. The sidecar is not fsynced of its own: a crash
  may lose its last lines (those turns then show null), never the log's bytes.
* **Ordinals are stable across cap rewrites** (SPEC §3.7), and the sidecar is compacted with
  them, amortized: the persist after a cap rewrite rewrites it (atomically) with the retained
  turns' lines only once the turns evicted since its last compaction are at least as many as
  the retained ones (and at least :data:`COMPACT_MIN`); until then evicted turns' lines stay
  (readers get times for ordinals no longer retained, and ignore them), so the sidecar holds
  at most about twice the index's turns and a rewrite at the default ``evict_to`` (a tenth of
  the turns) costs an append, not a rewrite of the whole sidecar.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import orjson

from memfs.store.lines import split_lines
from memfs.store.meta import ABANDONED, OPEN, UNKNOWN
from memfs.store.paths import TURN_TIMES, atomic_write, open_nofollow, write_all

_NEVER = 1 << 62  # ``first_live`` of a process that is not the writer: no entry is its own
COMPACT_MIN = 64  # evicted turns before a cap rewrite's persist compacts the sidecar


def _now() -> str:
    """The current time as :func:`memfs.store.meta.format_rfc3339` renders it (milliseconds,
    ``+00:00``), without building datetime objects."""
    t = time.time()
    ms = int(t * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + ".%03d+00:00" % (ms % 1000)


def _line(ordinal: int, started: str | None, completed: str | None) -> bytes:
    return orjson.dumps({"turn": ordinal, "started_at": started, "completed_at": completed}) + b"\n"


class TurnTimes:
    """One session's turn times in this process: what the sidecar says (loaded lazily, read
    incrementally as it grows) merged with what this process noted as the writer.

    All methods run under the session's ``mutex`` except :meth:`write` (the metadata writer's,
    serialized by its lock) — they share only ``flushed`` (an int, written by :meth:`write`).
    """

    __slots__ = ("path", "known", "changes", "generation", "loaded", "disk_key", "disk_offset", "queue",
                 "serial", "flushed", "first_live", "closed_through", "open_noted", "base_seen")
    # ``base_seen``: the lowest ordinal the sidecar may hold lines of (the index base when it
    # was last compacted or this process became the writer; 1 when unknown)

    def __init__(self, session_dir: Path):
        self.path = session_dir / TURN_TIMES
        self.known: dict[int, list] = {}  # ordinal -> [started_at, completed_at]
        self.changes: list[int] = []  # ordinals whose times changed, in order (within a generation)
        self.generation = 0  # changes when ``known`` was rebuilt from scratch
        self.loaded = False
        self.disk_key: tuple | None = None  # (st_dev, st_ino) of the sidecar read
        self.disk_offset = 0  # bytes of it read (up to its last complete line)
        self.queue: list[tuple[int, bytes]] = []  # (serial, line) noted, not known to be on disk
        self.serial = 0
        self.flushed = 0  # the newest serial on disk
        self.first_live = _NEVER  # ordinals from here on were opened by this process's commit
        self.closed_through = 0  # the newest ordinal whose close was noted (or predates the writer)
        self.open_noted = 0  # the newest open turn whose start line was queued
        self.base_seen = 1  # see __slots__

    # --- reading the sidecar ---------------------------------------------------------------

    def _merge(self, ordinal: int, started, completed) -> None:
        cur = self.known.get(ordinal)
        if cur is None:
            cur = self.known[ordinal] = [None, None]
        changed = False
        if type(started) is str and started != cur[0]:
            cur[0], changed = started, True
        if type(completed) is str and completed != cur[1]:
            cur[1], changed = completed, True
        if changed:
            self.changes.append(ordinal)

    def _parse(self, lines: list[bytes]) -> None:
        for raw in lines:
            if not raw:
                continue
            try:
                obj = orjson.loads(raw)
                ordinal = obj["turn"]
            except (orjson.JSONDecodeError, KeyError, TypeError):
                continue
            if type(ordinal) is int and ordinal > 0:
                self._merge(ordinal, obj.get("started_at"), obj.get("completed_at"))

    def refresh(self) -> bool:
        """Read what the sidecar gained since the last call (all of it the first time, or when
        it was replaced); True when the times changed. A missing sidecar is an empty one."""
        first = not self.loaded
        self.loaded = True
        try:
            fd = open_nofollow(self.path, os.O_RDONLY)
        except FileNotFoundError:
            if self.disk_key is not None:
                self._reset()
                return True
            return False
        try:
            st = os.fstat(fd)
            key = (st.st_dev, st.st_ino)
            if key != self.disk_key or st.st_size < self.disk_offset:
                if self.disk_key is not None:
                    self._reset()
                self.disk_key, self.disk_offset = key, 0
            if st.st_size == self.disk_offset:
                return first and bool(self.known)
            data = os.pread(fd, st.st_size - self.disk_offset, self.disk_offset)
        finally:
            os.close(fd)
        lines, cut = split_lines(data)  # a line still being written is read next time
        self.disk_offset += cut
        before = len(self.changes)
        self._parse(lines)
        return len(self.changes) != before

    def _reset(self) -> None:
        """Forget what was read from disk (the sidecar was replaced), keeping what this
        process noted and has not seen written."""
        self.known, self.changes, self.disk_key, self.disk_offset = {}, [], None, 0
        self.generation += 1
        for _serial, line in self.queue:
            self._parse(split_lines(line)[0])

    def refresh_if_loaded(self) -> bool:
        """A follower's catch-up: only when somebody reads the times in this process."""
        return self.loaded and self.refresh()

    def delta(self, token) -> tuple[tuple, bool, dict]:
        """``(token, whole, times)``: every known time (``whole``) when ``token`` is None or
        from another generation, else the turns whose times changed since ``token``."""
        if not self.loaded:
            self.refresh()
        new = (self.generation, len(self.changes))
        if token is None or token[0] != self.generation:
            return new, True, {o: tuple(t) for o, t in self.known.items()}
        return new, False, {o: tuple(self.known[o]) for o in self.changes[token[1]:] if o in self.known}

    # --- the writer's notes ----------------------------------------------------------------

    def became_writer(self, state) -> None:
        """This process took the lock with ``state`` read afresh from disk: turns it opens from
        now on are its own; closes before now are not its to time."""
        index = state.index
        self.first_live = index.last_ordinal + 1
        self.closed_through = state.turn_count
        self.open_noted = index.last_ordinal if state.in_turn else 0
        if self.loaded:
            self.refresh()

    def stopped_writing(self) -> None:
        self.first_live = _NEVER

    def _note(self, ordinal: int, started: str | None, completed: str | None) -> None:
        self._merge(ordinal, started, completed)
        self.serial += 1
        self.queue.append((self.serial, _line(ordinal, started, completed)))

    def note_closed(self, state) -> None:
        """Turns closed since the last call get their lines (caller: ``request_persist``, right
        after a boundary's ``apply``; and every snapshot)."""
        index, upto = state.index, state.turn_count
        first_live, ts, base, n = self.first_live, None, index.base, len(index)
        now = None
        for ordinal in range(max(self.closed_through + 1, base), upto + 1):
            i = ordinal - base
            if i >= n:
                break
            if ts is None:
                ts = index.ts
            outcome = index.outcome[i]
            started = ts[i] or None if ordinal >= first_live else None
            if outcome == ABANDONED:  # closed when the next turn.started arrived
                completed = ts[i + 1] or None if ordinal + 1 >= first_live and i + 1 < n else None
            elif outcome in (OPEN, UNKNOWN):
                completed = None
            else:  # completed / failed: noted right after the boundary's apply
                completed = now = now or _now()
            if started is not None or completed is not None:
                self._note(ordinal, started, completed)
        self.closed_through = max(self.closed_through, upto)

    def open_start(self, state) -> tuple[int, str] | None:
        """The open turn's ordinal and arrival, when this process opened it."""
        if not state.in_turn:
            return None
        index = state.index
        ordinal = index.last_ordinal
        if ordinal < self.first_live or not len(index):
            return None
        ts = index.ts[-1]
        return (ordinal, ts) if ts else None

    def snapshot(self, state) -> tuple | None:
        """What the next sidecar write needs (caller holds the mutex): ``(replace, lines)``
        where ``lines`` are ``(serial, line)`` pairs; None when there is nothing to write."""
        self.note_closed(state)
        opened = self.open_start(state)
        if opened is not None and self.open_noted < opened[0]:
            self._note(opened[0], opened[1], None)
            self.open_noted = opened[0]
        flushed = self.flushed
        if self.queue and self.queue[0][0] <= flushed:
            self.queue = [entry for entry in self.queue if entry[0] > flushed]
        base = state.index.base
        if base - self.base_seen >= max(COMPACT_MIN, len(state.index)):  # evicted as many as are retained
            self.base_seen = base  # compact: write the retained turns' times afresh
            if not self.loaded:
                self.refresh()
            self.known = {o: t for o, t in self.known.items() if o >= base}  # a new, small dict
            self.changes = []  # readers start over (they rebuild after a cap rewrite anyway)
            self.generation += 1
            serial = self.serial
            lines = [(serial, b"".join(_line(o, *self.known[o]) for o in sorted(self.known)))]
            return True, lines
        if not self.queue:
            return None
        return False, list(self.queue)

    def write(self, snap: tuple) -> None:
        """Write a :meth:`snapshot` (caller: the metadata writer, holding its lock)."""
        replace, lines = snap
        if replace:
            serial, data = lines[0]
            atomic_write(self.path, data)
            self.flushed = max(self.flushed, serial)
            return
        data = b"".join(line for serial, line in lines if serial > self.flushed)
        if not data:
            return
        fd = open_nofollow(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":  # a torn last line (a crash): end it
                data = b"\n" + data
            write_all(fd, data)
        finally:
            os.close(fd)
        self.flushed = max(self.flushed, lines[-1][0])
