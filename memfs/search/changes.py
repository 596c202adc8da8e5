"""Which sessions changed since a cursor: what keeps the root search's index current (SPEC §14).

A root query never lists the store nor stats every session: it asks a :class:`ChangeSource`
for the sessions changed since its last query and refreshes only those. The question is one
method, :meth:`ChangeSource.changes_since`, so that the store catalog's change feed can answer
it; until then :class:`NoticedChanges` does:

* the process that writes (the mount) calls :meth:`NoticedChanges.notice` for each session it
  writes, creates or removes — a set of names, no I/O;
* other processes' changes (``memfs record``, ``import --follow``, another mount) are found by
  :meth:`NoticedChanges.sweep`: one ``lstat`` of each known session's log, and a listing of the
  root only when the root's own mtime moved (a session created or removed) — run in the
  background, in batches with pauses (its work at most :data:`SWEEP_DUTY` of its time, and of
  the time between two sweeps), never by a query. The mount runs it every
  :meth:`NoticedChanges.interval` seconds; a store searched without a mount (``memfs mcp``, the
  library) starts one on a background thread when a query comes and the last is older than that.

A session's **log key** is ``(st_ino, st_size, st_mtime_ns)`` of its ``events.jsonl`` (an
append moves size and mtime, a cap rewrite the inode), None when it has none.
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
import time
from pathlib import Path
from typing import Protocol

from memfs.pace import pace
from memfs.store.catalog import is_session_dir, is_session_entry, root_entries
from memfs.store.paths import EVENTS

log = logging.getLogger("memfs.search")

LogKey = tuple[int, int, int]

SWEEP = 0.5  # seconds between two sweeps, at least
SWEEP_BATCH = 256  # sessions stat'ed between two chances to give way to requests
SWEEP_DUTY = 0.25  # sweeping takes at most this share of the time…
IDLE_DUTY = 0.02  # …and this share once no root query came for IDLE_AFTER seconds
IDLE_AFTER = 600.0
RACY_NS = 1_000_000_000  # a root mtime this recent may hide a later change in the same tick


class ChangeSource(Protocol):
    """What the searcher asks (the store catalog's change feed can answer it)."""

    def changes_since(self, cursor: int) -> tuple[int, dict[str, LogKey | None], set[str]]:
        """``(cursor now, {name: log key} of the sessions changed since cursor, names removed
        since cursor)``. Cursor 0: every session, nothing removed (the caller drops what it
        knows that is not in the answer)."""
        ...


def log_key(root: str, name: str) -> LogKey | None:
    """The log key of session ``name`` under ``root`` now (None: no log)."""
    try:
        st = os.lstat(f"{root}/{name}/{EVENTS}")
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class NoticedChanges:
    """A :class:`ChangeSource` over a sessions root: notices from the writer in this process,
    and sweeps for the others' (see the module docstring). ``background``: a query that finds
    the last sweep older than :meth:`interval` starts one on a thread (without a mount to run
    them)."""

    def __init__(self, root: str | os.PathLike, *, background: bool = False):
        self.root = os.fspath(root)
        self.background = background
        self._lock = threading.Lock()
        self._known: dict[str, LogKey | None] = {}  # every non-hidden directory of the root
        self._scanned = False
        self._root_key: tuple | None = None  # the root's (inode, mtime) when last listed
        self._log: list[tuple[int, str]] = []  # (sequence number, name changed), in order
        self._seq = 1  # the last sequence number: the cursor now (0 asks for everything)
        self._swept = 0.0
        self._asked = float("-inf")  # when a query last asked (the sweeps' pace depends on it)
        self._interval = SWEEP
        self._sweeper: threading.Thread | None = None
        self._sweeping = threading.Lock()
        self.sweeps = 0  # sweeps done (stats)
        self.noticed = 0  # notices taken (stats)

    # --- what the writer calls ------------------------------------------------------------------

    def notice(self, name: str) -> None:
        """Session ``name`` was written, created or removed by this process."""
        with self._lock:
            self._note([name])
            self.noticed += 1

    def _note(self, names: list[str]) -> None:
        """Log ``names`` as changed (caller holds ``_lock``); when the log has grown past what a
        reader needs, keep only each name's last entry (a cursor still answers the same)."""
        for name in names:
            self._seq += 1
            self._log.append((self._seq, name))
        if len(self._log) > max(1024, 4 * len(self._known)):
            last = {name: seq for seq, name in self._log}
            self._log = sorted((seq, name) for name, seq in last.items())

    # --- ChangeSource ---------------------------------------------------------------------------

    def changes_since(self, cursor: int) -> tuple[int, dict[str, LogKey | None], set[str]]:
        self._asked = time.monotonic()
        if not self._scanned:
            self.sweep(paced=False)
        with self._lock:
            now, full = self._seq, cursor <= 0
            if full:
                names = list(self._known)
            else:
                at = bisect.bisect_right(self._log, cursor, key=lambda entry: entry[0])
                names = list(dict.fromkeys(name for _, name in self._log[at:]))
        changed, removed = {}, set()
        for name in names:
            key = self._known.get(name) if full else log_key(self.root, name)
            if key is not None or is_session_dir(Path(self.root, name)):
                changed[name] = key
            elif not full:
                removed.add(name)
            if not full:
                with self._lock:  # (what the next sweep compares with: not reported twice)
                    self._known[name] = key
        if self.background and time.monotonic() - self._swept >= self._interval:
            self._sweep_later()
        return now, changed, removed

    # --- sweeping for other processes' changes --------------------------------------------------

    def interval(self) -> float:
        """Seconds from the end of one sweep to the start of the next."""
        return self._interval

    def sweep(self, *, paced: bool = True) -> None:
        """Find what other processes changed since the last sweep: the root listed only if its
        mtime moved, each known session's log ``lstat``'ed (in batches, giving way to requests
        between them when ``paced``); what changed is logged for :meth:`changes_since`."""
        with self._sweeping:
            duty = SWEEP_DUTY if time.monotonic() - self._asked < IDLE_AFTER else IDLE_DUTY
            t = time.perf_counter()
            try:
                st = os.lstat(self.root)
            except FileNotFoundError:
                st = None
            root_key = None if st is None else (st.st_ino, st.st_mtime_ns)
            with self._lock:
                known = dict(self._known)
            if root_key is None or root_key != self._root_key or not self._scanned:
                names = [e.name for e in root_entries(self.root) if is_session_entry(e)]
                racy = st is not None and time.time_ns() - st.st_mtime_ns < RACY_NS
                self._root_key = None if racy else root_key
            else:
                names = list(known)
            seen: dict[str, LogKey | None] = {}
            changed = []
            for i, name in enumerate(names):
                key = seen[name] = log_key(self.root, name)
                if name not in known or known[name] != key:
                    changed.append(name)
                if paced and i % SWEEP_BATCH == SWEEP_BATCH - 1:
                    pace()  # (in the mount's upkeep: gives way while requests are served)
            work = time.perf_counter() - t
            gone = [n for n in known if n not in seen]
            with self._lock:
                for name in gone:
                    self._known.pop(name, None)
                self._known.update(seen)
                if self._scanned:
                    self._note(changed + gone)
                self._scanned = True
                self.sweeps += 1
            self._interval = max(SWEEP, work / duty)
            self._swept = time.monotonic()

    def _sweep_later(self) -> None:
        if self._sweeper is not None and self._sweeper.is_alive():
            return
        self._swept = time.monotonic()

        def run() -> None:
            try:
                self.sweep()
            except Exception:  # a sweep never takes a query down; the next one tries again
                log.exception("search: sweeping %s for changes failed", self.root)

        self._sweeper = threading.Thread(target=run, name="memfs-search-sweep", daemon=True)
        self._sweeper.start()

    def stats(self) -> dict:
        """Sessions known, sweeps done, notices taken, the sweep interval."""
        with self._lock:
            return {"known": len(self._known), "sweeps": self.sweeps, "noticed": self.noticed,
                    "sweep_interval": self._interval}
