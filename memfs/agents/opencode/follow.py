"""``memfs import --follow`` of OpenCode's database (SPEC §10, the fourth agent).

OpenCode keeps its sessions in one SQLite database in WAL mode
(:mod:`memfs.agents.opencode.store`): a change is a commit to ``opencode.db-wal`` (to
``opencode.db`` itself in a rollback-journal database). :func:`memfs.ingest.follow.follow`
watches the data directory with inotify and tells a :class:`StoreFollower` of writes to those two
files; it waits for a quiet spell (:data:`DEBOUNCE`, never more than :data:`MAX_WAIT` after the
first write: OpenCode writes many times a second while it streams), then asks the database which
sessions have rows updated since the last pass (:func:`recent_sessions`) and imports those with
:func:`memfs.agents.opencode.read.import_store` — the plain import's identity and bookkeeping, so a
follow, a plain import and a follow again add each thing once, and a running turn stays open
until OpenCode's record says it ended.

Cheap when nothing changed: between writes, a ``stat`` of the two files (inode, size, mtime)
every ``poll`` seconds decides whether to look at all (the check that stands in for inotify when
it is unavailable, or when an event was missed); a pass whose sessions have the same rows as the
last pass's, none updated lately, imports nothing. "Since the last pass" is the largest
``time_updated`` read less :data:`SLACK_MS`: OpenCode stamps a row before its commit, so a row
committed later may carry an earlier time than one already read.

Reads are the plain import's: read-only SQLite, one short read each, no lock held between them,
nothing written beside the database. An error (the database locked, busy, corrupt, gone) is
reported with its one-line reason and the pass retried (after 1 s, doubling up to 30 s); the
mark does not move until a pass succeeds.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from memfs.agents.opencode.store import StoreError, read

DEBOUNCE = 0.1  # seconds without a write before a pass
MAX_WAIT = 0.5  # seconds after the first write at most
POLL = 2.0  # seconds between stat checks, with inotify watching
POLL_UNWATCHED = 0.5  # without it
SLACK_MS = 10_000  # how far before the newest row read the next pass looks again
RETRY_FIRST, RETRY_MAX = 1.0, 30.0


def recent_sessions(db: Path, since: int) -> dict[str, tuple[int, int]]:
    """The sessions with a session, message or part row updated at or after ``since`` (ms):
    each one's newest ``time_updated`` and how many such rows it has (one read)."""
    rows = read(db, "cannot read what changed", lambda conn: conn.execute(
        "SELECT sid, max(t), count(*) FROM ("
        "SELECT id AS sid, time_updated AS t FROM session WHERE time_updated >= ?1 "
        "UNION ALL SELECT session_id, time_updated FROM message WHERE time_updated >= ?1 "
        "UNION ALL SELECT session_id, time_updated FROM part WHERE time_updated >= ?1) GROUP BY sid",
        (since,)).fetchall())
    return {sid: (t, n) for sid, t, n in rows if isinstance(sid, str) and type(t) is int}


def newest(db: Path) -> int | None:
    """The newest ``time_updated`` of a session, message or part row (ms), None when none."""
    (top,) = read(db, "cannot read its newest row", lambda conn: conn.execute(
        "SELECT max(t) FROM (SELECT max(time_updated) AS t FROM session "
        "UNION ALL SELECT max(time_updated) FROM message "
        "UNION ALL SELECT max(time_updated) FROM part)").fetchone())
    return top if type(top) is int else None


class StoreFollower:
    """One OpenCode database under ``import --follow``: :meth:`touched` for each write inotify
    reports in its directory, :meth:`step` whenever :meth:`due` (a monotonic time) has come.
    ``report`` gets each session that appended or refused events, and each error."""

    def __init__(self, root: Path, db: Path, *, report: Callable, poll: float = POLL, **import_kw) -> None:
        self.root = Path(root)
        self.db = Path(os.path.abspath(db))
        self.dir = self.db.parent
        self.names = frozenset((self.db.name, f"{self.db.name}-wal"))
        self.report = report
        self.poll = poll
        self.import_kw = import_kw
        self.mark: int | None = None  # the newest time_updated read by a good pass (ms)
        self.window: dict[str, tuple[int, int]] = {}  # that pass's recent_sessions(db, since)
        self.since = 0  # (ms)
        self.seen: tuple | None = None  # the files' stat as of that pass
        self.first: float | None = None  # the first and last write not yet read
        self.last = 0.0
        self.retry_at: float | None = None
        self.delay = RETRY_FIRST
        self.next_poll = 0.0

    def watch(self, ino) -> str | None:
        """Watch the database's directory with ``ino`` (a :class:`memfs.ingest.follow.Inotify`;
        None: unavailable, already said); when that fails, check it every
        :data:`POLL_UNWATCHED` seconds and return what to say."""
        if ino is None:
            self.poll = POLL_UNWATCHED
            return None
        try:
            ino.watch(self.dir)
        except OSError as exc:
            self.poll = POLL_UNWATCHED
            return f"cannot watch {self.dir} ({exc.strerror}): checking it every {POLL_UNWATCHED:g} s"
        return None

    def fingerprint(self) -> tuple:
        """The database's and its WAL's (inode, size, mtime), None for a file not there."""
        out: list[tuple[int, int, int] | None] = []
        for path in (self.db, self.dir / f"{self.db.name}-wal"):
            try:
                st = os.stat(path, follow_symlinks=False)
            except OSError:
                out.append(None)
            else:
                out.append((st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(out)

    def touched(self, name: str, now: float) -> None:
        """inotify: ``name`` in the database's directory was written (at monotonic ``now``)."""
        if name in self.names:
            self.first = now if self.first is None else self.first
            self.last = now

    def due(self) -> float:
        if self.retry_at is not None:
            return self.retry_at
        if self.first is not None:
            return min(self.first + MAX_WAIT, self.last + DEBOUNCE)
        return self.next_poll

    def step(self, now: float) -> None:
        if now < self.due():
            return
        if self.retry_at is None and self.first is None:  # the stat check
            self.next_poll = now + self.poll
            if self.fingerprint() == self.seen:
                return
        self.first = None
        self.sync()

    def sync(self) -> None:
        """One pass: every session the first time (or when another database took its place),
        then the sessions updated since the last good pass."""
        from memfs.agents.opencode.read import import_store
        from memfs.ingest.importer import ImportItem

        stat = self.fingerprint()
        started = time.time() * 1000
        if self.seen is not None and (stat[0] or (None,))[0] != (self.seen[0] or (None,))[0]:
            self.mark = None  # another database in its place: read it all
        sids: set[str] | None = None  # (None: all)
        try:
            if self.mark is None:
                top = newest(self.db)
                since = (top or 0) - SLACK_MS
                window = recent_sessions(self.db, since)
            else:
                since = self.mark - SLACK_MS
                window = recent_sessions(self.db, since)
                same = since == self.since  # (the last window covered the same rows: compare)
                sids = {sid for sid, now in window.items()
                        if now[0] >= started - SLACK_MS or not same or self.window.get(sid) != now}
        except (StoreError, OSError) as exc:
            self._failed([ImportItem(str(self.db), format="opencode", status="error", reason=str(exc))])
            return
        items = import_store(self.root, self.db, only=sids, **self.import_kw) if sids is None or sids else []
        if any(i.status == "error" for i in items):
            self._failed(items)
            return
        for item in items:
            if item.appended or item.refused:
                self.report(item)
        self.seen, self.window, self.since, self.retry_at, self.delay = stat, window, since, None, RETRY_FIRST
        self.mark = max(self.mark or 0, since + SLACK_MS, *(t for t, _n in window.values()))

    def _failed(self, items: list) -> None:
        for item in items:
            if item.status == "error":
                item.reason = f"{item.reason} (again in {self.delay:g} s)"
            if item.status == "error" or item.appended or item.refused:
                self.report(item)
        self.retry_at = time.monotonic() + self.delay
        self.delay = min(self.delay * 2, RETRY_MAX)
