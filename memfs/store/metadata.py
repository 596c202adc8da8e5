"""Metadata of one session on disk: snapshot and persist of the manifest and turn index (SPEC §3.2).

A persist has two halves. A :class:`Snapshot` is taken under the session's ``mutex`` with
nothing pending (cheap: the index's closed entries are not copied, see
:class:`~memfs.store.meta.IndexSnapshot`). :meth:`MetadataWriter.write` then writes it in the
§3.2 order — the log durable up to the snapshot's length, the index (and its cache), then the
manifest that names the length they describe — and may run with the mutex released (the
background persister does, :mod:`memfs.store.persister`), so appends go on meanwhile.

Writers of one session serialize on :attr:`MetadataWriter.lock`; a snapshot older than the
metadata on disk (a ``flush`` or a cap rewrite persisted in between) is dropped, and so is
every snapshot once the session is closed (:meth:`MetadataWriter.retire`).

Coalescing: the background persister persists a session at most every ``metadata_interval``
seconds, and at most every ten times the last persist's duration, so a session whose index is
huge (a persist rewrites ``turns.json`` whole) keeps the thread and the disk busy about a
tenth of the time at most.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from memfs.store import catalog
from memfs.store.meta import IndexSnapshot, file_key
from memfs.store.paths import (
    CAP_MARKER,
    INDEX_DIR,
    MANIFEST,
    TURNS,
    TURNS_CACHE,
    atomic_write,
    ensure_private_dir,
    remove_file,
    replace_with,
    write_all,
)

PERSIST_SHARE = 10  # the coalescing interval is at least this many times the last persist's cost
_RETIRED = float("inf")  # ``written_seq`` of a closed session: every snapshot is stale
_monotonic = time.monotonic


@dataclass(slots=True)
class Snapshot:
    """The metadata of one state of a session, taken under its ``mutex``, written after."""

    seq: int  # orders snapshots of one session: only a newer one may replace metadata on disk
    version: int  # the session's ``version`` it describes
    sync_target: int  # the log is made durable up to this sync position first
    taken: float  # monotonic time, to measure what the persist cost
    index: IndexSnapshot
    manifest: bytes
    times: tuple | None = None  # lines for index/turn-times.jsonl (see memfs.store.turntimes)


class MetadataWriter:
    """Writes one session's ``index/turns.json`` (+ ``turns.cache``) and ``manifest.json``."""

    __slots__ = ("dir", "lock", "seq", "written_seq", "persisted_version", "last_persist", "gap", "interval",
                 "cache_on_disk", "times", "marker_seq")

    def __init__(self, session_dir: Path, interval: float, cache_on_disk: bool, times=None):
        self.dir = session_dir
        self.times = times  # the session's TurnTimes: writes the sidecar's lines
        # held from the log's fdatasync to the manifest's rename. Lock order: the session's
        # ``mutex``, then this, then the log's sync condition — never the reverse.
        self.lock = threading.Lock()
        self.seq = 0  # snapshots taken (under the session's mutex): their sequence numbers
        self.written_seq: float = 0  # the newest snapshot on disk (under ``lock``); _RETIRED when closed
        self.persisted_version = 0  # the session ``version`` the metadata on disk describes
        self.last_persist = 0.0  # monotonic
        self.interval = interval
        self.gap = interval  # the coalescing interval in force
        self.cache_on_disk = cache_on_disk
        # a cap rewrite's marker on disk (SPEC §3.7 step 4) awaits the metadata of the state
        # after its rewrite: the first snapshot taken after ``seq`` had this value. None: none.
        self.marker_seq: int | None = None

    def snapshot(self, version: int, sync_target: int, index, manifest_json: bytes, cache: bool,
                 times: tuple | None = None) -> Snapshot:
        """A snapshot of the state as it is now (caller holds the session's mutex); ``times``:
        what :meth:`TurnTimes.snapshot <memfs.store.turntimes.TurnTimes.snapshot>` took."""
        self.seq += 1
        return Snapshot(self.seq, version, sync_target, _monotonic(), index.snapshot(cache=cache), manifest_json,
                        times)

    def due(self) -> float:
        """No coalesced persist before this monotonic time."""
        return self.last_persist + self.gap

    def write(self, snap: Snapshot, sync_to: Callable[[int], None]) -> bool:
        """Write ``snap`` in the §3.2 order (``sync_to`` makes the log durable first); returns
        whether it wrote (a stale snapshot is dropped)."""
        with self.lock:
            if snap.seq <= self.written_seq:
                return False
            sync_to(snap.sync_target)
            ensure_private_dir(self.dir / INDEX_DIR)
            if snap.times is not None and self.times is not None:
                self.times.write(snap.times)  # the turns' arrival times, before the index
            pieces = snap.index.json_pieces

            def write_pieces(fd: int) -> None:
                for piece in pieces():
                    write_all(fd, piece)

            atomic_write(self.dir / TURNS, write_pieces)
            if snap.index.has_cache:
                data = snap.index.cache_bytes(file_key(os.lstat(self.dir / TURNS)))
                if data is not None:
                    atomic_write(self.dir / TURNS_CACHE, data)
                    self.cache_on_disk = True
            elif self.cache_on_disk:
                remove_file(self.dir / TURNS_CACHE)
                self.cache_on_disk = False
            atomic_write(self.dir / MANIFEST, snap.manifest)
            if self.marker_seq is not None and snap.seq > self.marker_seq:  # step 6's end: metadata after the rewrite
                remove_file(self.dir / CAP_MARKER)
                self.marker_seq = None
            self.written_seq = snap.seq
            self.persisted_version = snap.version
            self.last_persist = now = _monotonic()
            if self.interval:
                self.gap = max(self.interval, PERSIST_SHARE * (now - snap.taken))
        catalog.noted(self.dir)  # the store catalog's row, as part of the commit (SPEC §14)
        return True

    def write_marker(self, tmp: Path) -> None:
        """Step 4 of a cap rewrite (caller holds the session's mutex; any earlier marker was
        cleared): the marker, prepared in temp file ``tmp`` (:func:`~memfs.store.paths.write_temp`),
        takes its place. The first metadata write of a snapshot taken after this — describing
        the state after the rewrite — deletes it (step 6)."""
        with self.lock:
            replace_with(tmp, self.dir / CAP_MARKER)
            self.marker_seq = self.seq

    @property
    def marker_pending(self) -> bool:
        return self.marker_seq is not None

    def retire(self) -> None:
        """No metadata write of this session after this one (a write in flight lands first)."""
        with self.lock:
            self.written_seq = _RETIRED

    def settle(self) -> None:
        """Return once a write in flight has landed (it may make a new persist moot)."""
        with self.lock:
            pass
