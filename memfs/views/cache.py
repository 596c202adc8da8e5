"""Per-session view state, keyed by the session directory, refreshed lazily and incrementally.

One :class:`ViewState` per session directory in this process holds the :class:`Fold` of the
retained log and the bytes of each view last rendered. Reading a view first *refreshes*:

* nothing happened to the log since the last refresh (same opening, same ``handle.version``,
  same ``handle.rewrites``) → no work at all, the cached bytes are returned;
* the log grew → only the bytes in ``[offset, file_len)`` are folded;
* a cap rewrite (``handle.rewrites`` changed), a log shorter than what was folded, a
  different opening of the session (closed and reopened, so another process may have
  rewritten it meanwhile), or other command results noted in ``index/about.json``
  (``item_notes``, :func:`memfs.views.fold.command_notes`) → the fold is rebuilt from byte 0,
  seeded with the log's first retained turn ordinal, after the imported facts of a migrated
  session (:mod:`memfs.views.imported`, re-read at every rebuild) and the eviction summaries' facts.

A refresh reads ``rewrites``, ``version`` and the live manifest before folding up to the
manifest's ``persisted_file_len`` and retries if a cap rewrite raced it. After an incremental
fold, the turn counters must agree with the live manifest; if they do not, it rebuilds (and a
whole fold that still disagrees is trusted: it is the views' own reading of the bytes).

Only the view being read is rendered, and only when the fold changed since it was last
rendered (``epoch``) — or, for the views that begin with the session's metadata or take
their goal from it (:data:`ABOUT_VIEWS`), when ``index/about.json`` was replaced since it
was last read (its ``lstat`` identity is checked at each refresh: the ingest merges metadata
without touching the log). A view whose bytes changed is queued for the backing store
(:mod:`memfs.views.persist`) unless the handle is read-only.

Counters for tests and benchmarks: the module-level :data:`stats` and each state's
``folded_bytes`` / ``rebuilds``. Each state has its own lock; renders may come from any thread.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import os
import stat
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from memfs.store.about import ABOUT
from memfs.store.about import read as read_about
from memfs.store.meta import now_rfc3339
from memfs.views import context, memory, persist, progress, summary, transcript
from memfs.views.fold import Fold, command_notes
from memfs.views.imported import NOTHING, load_imported
from memfs.views.memory import indented, load_evicted_facts, real_derived_dir
from memfs.views.trajectory import Trajectory

VIEW_NAMES = ("memory.json", "trajectory.jsonl", "summary.md", "progress.json", "progress.md", "goal.json",
              "context.md", "transcript.md", "usage.json")
TURNS_DIR = "turns"
# they begin with index/about.json, or take the goal from it (a prompt a later capture knew)
ABOUT_VIEWS = frozenset(("summary.md", "context.md", "progress.json", "progress.md", "transcript.md",
                         "usage.json"))


# Folding this many bytes or more pauses the cyclic garbage collector (see _gc_paused).
BULK_BYTES = 1 << 20
# Refresh attempts; the last two hold the log still (SessionHandle.hold), so the refresh
# always ends: a held incremental fold that disagrees is followed by a held rebuild.
ATTEMPTS = 5


@contextlib.contextmanager
def _gc_paused(pause: bool):
    """Pause the cyclic GC during a bulk fold, when it was running.

    A fold allocates a few dicts per line (JSON decoding) and keeps many (facts, per-turn
    records); the collector then runs thousands of times over an ever larger heap and doubles
    the cost of a rebuild. Nothing in a fold creates cycles, so pausing loses nothing; other
    threads' garbage is collected once the fold ends.
    """
    if not pause or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@dataclass
class Stats:
    """Process-wide counters (never reset by the library; tests compare before/after)."""

    refreshes: int = 0  # refreshes that found the log changed
    rebuilds: int = 0  # of which rebuilt the fold from byte 0
    folded_bytes: int = 0  # log bytes folded
    folded_lines: int = 0
    renders: int = 0  # views rendered (a cached view served again does not count)


stats = Stats()
_generations = itertools.count(1)


class ViewState:
    """Everything the views know about one session directory."""

    def __init__(self, path: Path):
        self.lock = threading.RLock()
        self.path = path
        self.report = None  # the opening the fold belongs to (``handle.reads.opening``)
        self.rewrites = -1
        self.version = -1
        self.offset = 0  # log bytes folded: just past the last complete line seen
        self.fold: Fold | None = None
        self.agrees = True  # the last whole fold matched the store's turn counters
        self.trajectory = Trajectory()
        self.imported = NOTHING  # what a migrated session imported (read at each rebuild)
        self.evicted = 0  # eviction summaries found at the last rebuild
        self.generation = 0  # changes at every rebuild: facts[:n] are stable within one
        self.epoch = 0  # changes whenever the fold changes
        self.generated_at = ""
        self.created_at = ""
        self.folded_bytes = 0
        self.rebuilds = 0
        self._rendered: dict[str, tuple[tuple[int, int], bytes]] = {}  # name -> (its epochs, its bytes)
        self._written: dict[str, bytes] = {}
        self._written_turns: dict[int, tuple] = {}
        self._touched: tuple[int, bytes] = (-1, b"[]")
        self._turn_ts: dict[int, str] = {}
        self.about: dict = {}  # index/about.json as last read (refresh_about)
        self.about_epoch = 0  # changes whenever it does
        self._about_key: tuple | None | bool = False  # its lstat identity (None: absent; False: unread)

    # --- refreshing ------------------------------------------------------------------------

    def current(self, handle) -> bool:
        """Whether the fold already reflects ``handle``'s log (a refresh would do nothing)."""
        return (self.fold is not None and handle.reads.opening is self.report
                and handle.rewrites == self.rewrites and handle.version == self.version)

    def refresh(self, handle) -> bool:
        """Bring the fold up to date with ``handle``'s log; True when it changed. A fold made
        before ``index/about.json`` noted another result for a stored command is rebuilt."""
        report = handle.reads.opening
        self.refresh_about()
        notes = command_notes(self.about) if self.about.get("item_notes") else {}
        if self.fold is not None and notes != self.fold.item_notes:
            self.fold = None
        if self.current(handle):
            return False
        force = False
        for attempt in range(ATTEMPTS):
            # a log rewritten at nearly every append (a small cap, many writers) could starve
            # the lock-free attempts: the last ones hold the log still while they fold
            with handle.reads.hold() if attempt >= ATTEMPTS - 2 else contextlib.nullcontext():
                rewrites, version = handle.rewrites, handle.version
                m = handle.manifest
                end = m["persisted_file_len"]
                rebuild = (force or self.fold is None or report is not self.report
                           or rewrites != self.rewrites or end < self.offset)
                fold, start = (Fold(m["retained_turn_base"], notes), 0) if rebuild else (self.fold, self.offset)
                seed = None
                if rebuild:
                    imported = load_imported(self.path, fold.facts)
                    seed = (imported, load_evicted_facts(self.path, fold.facts))
                lines0 = fold.lines
                try:
                    with _gc_paused(end - start > BULK_BYTES):
                        stop = fold.feed(handle.iter_lines(start, end))
                except BaseException as exc:
                    self.fold = None  # possibly half-fed: the next refresh rebuilds
                    if isinstance(exc, OSError) and handle.rewrites != rewrites:
                        continue  # the file was replaced under us: start over
                    raise
                if handle.rewrites != rewrites:
                    self.fold = None
                    continue
                turns = fold.turns
                agrees = (turns.in_turn == m["in_turn"]
                          and turns.index.last_ordinal == m["turn_count"] + (1 if m["in_turn"] else 0))
                if not rebuild and not agrees and self.agrees:
                    force = True  # our incremental fold disagrees with the store: redo it whole
                    continue
                if rebuild:
                    # a whole fold that disagrees (an index written by another writer that counts
                    # lines differently) is trusted as is, and not re-checked until the next rebuild
                    self.agrees = agrees
                self._commit(handle, report, rewrites, version, m, fold, seed,
                             stop if stop >= 0 else start, start, fold.lines - lines0)
                return True
        self.fold = None
        raise RuntimeError("log kept changing under a view refresh (concurrent cap rewrites)")

    def _commit(self, handle, report, rewrites, version, m, fold, seed, offset, start, lines) -> None:
        """Adopt ``fold``; ``seed`` is ``(imported, evicted)`` after a rebuild, else None."""
        if seed is not None:
            if not handle.read_only and fold.turns.index.base > 1:
                self._prune_turns(fold.turns.index.base)
            self.fold = fold
            self.imported, self.evicted = seed
            self.trajectory = Trajectory()
            self.generation = next(_generations)
            self._touched = (-1, b"[]")
            self._turn_ts = {}
            self._written_turns = {}
            self.rebuilds += 1
            stats.rebuilds += 1
        self.report, self.rewrites, self.version = report, rewrites, version
        self.folded_bytes += offset - start
        stats.folded_bytes += offset - start
        stats.folded_lines += lines
        self.offset = offset
        self.created_at = m["created_at"]
        self.generated_at = now_rfc3339()
        self.epoch += 1
        stats.refreshes += 1

    def _prune_turns(self, base: int) -> None:
        """Remove the store's copies of turns a cap rewrite evicted."""
        derived = real_derived_dir(self.path)
        turns = derived / TURNS_DIR if derived is not None else None
        try:
            if turns is None or not stat.S_ISDIR(os.lstat(turns).st_mode):
                return  # never list through a symlink
            names = os.listdir(turns)
        except OSError:
            return
        for name in names:
            stem = name[:-len(".jsonl")] if name.endswith(".jsonl") else ""
            if stem.isdigit() and int(stem) < base:
                persist.remove(self.path, f"{TURNS_DIR}/{name}")

    def refresh_about(self) -> None:
        """Re-read ``index/about.json`` when it is not the file last read (an atomic replace
        always gives a new inode) or is gone (call under the lock)."""
        try:
            st = os.lstat(self.path / ABOUT)
            key = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        except OSError:
            key = None
        if key != self._about_key:
            self._about_key = key
            about = read_about(self.path) if key is not None else {}
            if about != self.about:
                self.about = about
                self.about_epoch += 1

    # --- rendering -------------------------------------------------------------------------

    def render(self, handle, name: str, copy: bool = True) -> bytes:
        """The current bytes of view ``name`` (one of :data:`VIEW_NAMES`); copied into the
        backing store's ``derived/`` when it changed (a writer's handle), unless ``copy`` is false."""
        with self.lock:
            self.refresh(handle)  # (index/about.json re-read too)
            key = (self.epoch, self.about_epoch if name in ABOUT_VIEWS else 0)
            cached = self._rendered.get(name)
            if cached is not None and cached[0] == key:
                return cached[1]
            data = _RENDERERS[name](self, handle)
            self._rendered[name] = (key, data)
            stats.renders += 1
            if copy and not handle.read_only and self._written.get(name) != data:
                self._written[name] = data
                persist.submit(self.path, name, data)
            return data

    def touched_json(self) -> bytes:
        fold = self.fold
        if self._touched[0] != fold.touched_changes:
            imported = self.imported.touched
            paths = fold.touched | imported if imported else fold.touched
            self._touched = (fold.touched_changes, memory.render_paths(paths))
        return self._touched[1]

    def no_events(self) -> bool:
        """The log has no accepted event and nothing was ever evicted from it: a migrated
        session's views are still its imported files, byte for byte."""
        turns = self.fold.turns
        return turns.event_count == 0 and turns.index.base == 1 and not self.evicted

    def source(self) -> dict:
        return {"events_len": self.offset, "event_count": self.fold.turns.event_count}

    def resolver(self, handle):
        """``resolve(stamp) -> str`` for :mod:`memfs.views.progress` stamps."""
        def resolve(stamp) -> str:
            if type(stamp) is str:
                return stamp
            if type(stamp) is int:
                if stamp not in self._turn_ts:
                    for entry in handle.turn_index:  # once per opening and new turn, at most
                        self._turn_ts[entry["turn_number"]] = entry.get("ts") or ""
                    self._turn_ts.setdefault(stamp, "")
                if self._turn_ts[stamp]:
                    return self._turn_ts[stamp]
            return self.created_at
        return resolve

    def ledger(self, handle) -> dict:
        fold = self.fold
        return fold.ledger.to_dict(handle.session_id, fold.goal_text(self.about), self.resolver(handle))

    def context(self, handle, budget: int) -> str:
        """``context.md`` in ``budget`` tokens (the fold must be fresh: call under the lock)."""
        return context.render(handle.session_id, self.fold, self.ledger(handle), budget, self.about)

    def note_turn_written(self, handle, n: int, key: tuple, data: bytes) -> None:
        if handle.read_only or self._written_turns.get(n) == key:
            return
        self._written_turns[n] = key
        persist.submit(self.path, f"{TURNS_DIR}/{n}.jsonl", data)


def _memory(st: ViewState, handle) -> bytes:
    fold, imported = st.fold, st.imported.memory
    if imported is not None and st.no_events():
        return imported
    # an imported summary stands until a turn of this log closes
    summary = fold.summary if imported is None or fold.turns.turn_count else st.imported.summary
    return memory.render(handle.session_id, summary, fold.facts, st.touched_json(), st.generated_at,
                         st.created_at, st.source())


def _trajectory(st: ViewState, handle) -> bytes:
    imported = st.imported
    if imported.trajectory is None:
        return st.trajectory.render(st.fold.turns, st.fold.records, handle.reads.turn_times_delta)
    if st.no_events():
        return imported.trajectory
    return imported.trajectory_prefix + st.trajectory.render(st.fold.turns, st.fold.records, handle.reads.turn_times_delta)


def _summary(st: ViewState, handle) -> bytes:
    return summary.render(handle.session_id, st.fold, st.offset, st.created_at, st.about).encode()


def _progress_json(st: ViewState, handle) -> bytes:
    return progress.render_json(st.ledger(handle))


def _progress_md(st: ViewState, handle) -> bytes:
    return progress.render_markdown(st.ledger(handle)).encode()


def _goal(st: ViewState, handle) -> bytes:
    return indented(st.fold.goal.to_dict(st.resolver(handle)), 0) + b"\n"


def _context(st: ViewState, handle) -> bytes:
    return st.context(handle, context.DEFAULT_BUDGET).encode()


def _usage(st: ViewState, handle) -> bytes:
    from memfs.usage import view as usage_view

    source = {**st.source(), "about": usage_view.about_stamp(st.path)}
    return usage_view.render(handle.session_id, st.fold, st.about, handle.reads.turn_times(), st.created_at, source)


_RENDERERS = {
    "memory.json": _memory,
    "trajectory.jsonl": _trajectory,
    "summary.md": _summary,
    "progress.json": _progress_json,
    "progress.md": _progress_md,
    "goal.json": _goal,
    "context.md": _context,
    "transcript.md": transcript.render,  # (incremental per turn: memfs.views.transcript)
    "usage.json": _usage,
}
assert tuple(_RENDERERS) == VIEW_NAMES

# --- the registry ---------------------------------------------------------------------------

# At most this many view states are kept, least recently used dropped first: a store-wide
# mount of 100,000 sessions reads each one's views once (the search warm-up), and a state for
# every one of them held ~10 KiB each for good. Dropping one loses nothing but work: a state
# made again rebuilds its fold from byte 0, as a new opening of the session does anyway (the
# store closes and reopens sessions beyond its max_open_sessions, default 256).
MAX_STATES = 1024
_STATES: OrderedDict[str, ViewState] = OrderedDict()
_STATES_LOCK = threading.Lock()


def state_for(handle) -> ViewState:
    """The view state of ``handle``'s session directory (created on first use)."""
    key = str(handle.path)
    with _STATES_LOCK:
        st = _STATES.get(key)
        if st is None:
            st = _STATES[key] = ViewState(Path(handle.path))
            while len(_STATES) > MAX_STATES:
                _STATES.popitem(last=False)
        else:
            _STATES.move_to_end(key)
        return st


def is_current(handle) -> bool:
    """Whether reading a view of ``handle``'s session now needs no refresh (cheap: no I/O, no
    fold) — the filesystem serves such reads inline instead of in a worker thread."""
    with _STATES_LOCK:
        st = _STATES.get(str(handle.path))
    return st is not None and st.current(handle)


def forget(path) -> None:
    """Drop the view state of a session directory (after it was removed, or to free memory)."""
    with _STATES_LOCK:
        _STATES.pop(str(path), None)
