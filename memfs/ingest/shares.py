"""One ``memfs import`` run's files, read in this process or spread over the machine's cores.

:class:`Share` imports files in the order given: the whole run (:func:`run_share`), or the parts
one process is handed. :func:`spread` splits a large run over ``jobs`` processes (``memfs import
--jobs``; by default one per CPU this process may use, up to :data:`MAX_JOBS`, once there are
:data:`MIN_BYTES` to read). The files of one session always go to one process, in the run's
order: the run identifies each file's conversation and where it would go
(:meth:`memfs.ingest.importer.Source.place`) and keeps in one part every file whose session, or
whose sub-agent's parent, is the same (files that would get one name from two ids included).
Sessions are independent once their names are known, so each process imports its parts as a
whole run would — its own sidecar batches and ``syncfs`` (:mod:`memfs.ingest.sidecars`), its own
conversation-map registrations (merged under the map's lock), its catalog rows (SQLite's own
locking) — and hands back its items and its re-import notes (:mod:`memfs.ingest.seen`), which
the run merges and saves once. Parts are handed out as the workers ask for more, this process
taking the next one between its own, so a slow part or a late start costs no one else's time.

A worker is a spawned process that dies with the run's process (``PR_SET_PDEATHSIG``, and at its
next word to a closed pipe): a kill of ``memfs import`` stops every part of it, and the next
import repairs what any of them left (docs/design.md "First import at the disk's pace"). A
worker that fails makes its files' items ``error``, with its reason.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from memfs.errors import MemfsError
from memfs.ingest import conversations
from memfs.ingest.importer import ImportItem, Source, identify
from memfs.ingest.inputs import MAX_DECOMPRESSED, NotRegular
from memfs.ingest.seen import SeenSources
from memfs.ingest.sidecars import ImportBatch
from memfs.store.catalog_defer import deferred as catalog_notes_deferred
from memfs.store.config import DEFAULT_EVICT_TO, DEFAULT_MAX_LINE_BYTES
from memfs.store.paths import deferred_sync
from memfs.usage.reporting import keep as keep_usage

log = logging.getLogger("memfs.ingest")

MAX_JOBS = 4  # processes an import uses by default, at most
MIN_BYTES = 64 << 20  # a run with less to read stays in one process (a worker's start costs ~0.3 s)
PROGRESS_EVERY = 0.25  # seconds between a worker's progress reports
PART_BYTES = 4 << 20  # the run is handed out in parts of about this many bytes
PARTS_EACH = 4  # or smaller: at least this many parts per process
AHEAD = 2  # parts a worker holds (one in hand, one waiting), so that it never waits for this process
POLL_EVERY = 0.02  # seconds between this process's looks at its workers, while it imports


@dataclass(frozen=True)
class ImportOptions:
    """How :func:`import_paths` reads and writes (handed to its workers, :mod:`memfs.ingest.shares`)."""

    fmt: str = "auto"
    dry_run: bool = False
    max_events: int = 0
    evict_to: float = DEFAULT_EVICT_TO
    max_decompressed: int = MAX_DECOMPRESSED
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES


@dataclass
class Pending:
    """A source file the run reads (not known to be unchanged, :mod:`memfs.ingest.seen`)."""

    item: ImportItem
    path: Path
    key: str
    size: int
    identified: tuple[str | None, str | None] | None = None  # :func:`identify`'s, when known already


class Progress:
    """The run's progress callback ``(done, total)``, fed the bytes read here and by its workers."""

    def __init__(self, total: int, progress: Callable[[int, int], None] | None):
        self.total, self.progress, self.done = total, progress, 0
        self.elsewhere: list[Callable[[], int]] = []  # the workers' counts so far
        self.poll: Callable[[], object] = lambda: None  # takes in what the workers said
        self.polled = 0.0

    def __call__(self, n: int) -> None:
        self.done += n
        if self.elsewhere and time.monotonic() - self.polled >= POLL_EVERY:
            self.polled = time.monotonic()
            self.poll()
        self.show()

    def show(self) -> None:
        if self.progress:
            self.progress(min(self.total, self.done + sum(count() for count in self.elsewhere)), self.total)


class Share:
    """One process's part of a run: files imported in the order given, under the caller's
    ``deferred_sync`` and ``conversations.batched`` (``maps``); sidecar batches committed as they
    fall due and by :meth:`finish`."""

    def __init__(self, root: Path, opts: ImportOptions, seen: SeenSources, maps, step: Callable[[int], None]):
        self.root, self.opts, self.step = root, opts, step
        self.usage: list = []  # the new sessions' usage, kept in the store catalog with each batch (SPEC §14)
        self.batch = None if opts.dry_run else ImportBatch(root, seen, maps)

    def run(self, todo: list[Pending]) -> None:
        root, opts, batch = self.root, self.opts, self.batch
        for pending in todo:
            item = pending.item
            try:
                source = Source(pending.path, opts.fmt, opts.max_decompressed, opts.dry_run,
                                max_line_bytes=opts.max_line_bytes, key=pending.key)
                if not source.prepare(root, pending.identified):
                    item.status = "empty"
                    continue
                source.usage = None if opts.dry_run else self.usage
                with catalog_notes_deferred():  # (its catalog row read once, when the file is done)
                    source.run(root, item, dry_run=opts.dry_run, durability="buffered", max_events=opts.max_events,
                               evict_to=opts.evict_to, progress=self.step, final=True, batch=batch)
                if batch is not None and item.status in ("imported", "up-to-date") and source.read_stat \
                        and source.session and source.entry is not None:
                    batch.note(pending.key, source.read_stat, source.read_at, source.session, item.format)
            except NotRegular as exc:  # replaced since it was listed
                item.status, item.reason = "skipped", str(exc)
            except (MemfsError, OSError) as exc:
                item.status, item.reason = "error", str(exc)
            if batch is not None and batch.due():
                batch.commit()
                keep_usage(root, self.usage)

    def finish(self) -> None:
        if self.batch is not None:
            self.batch.commit()
        keep_usage(self.root, self.usage)


def run_share(root: Path, todo: list[Pending], opts: ImportOptions, seen: SeenSources, maps,
              step: Callable[[int], None]) -> None:
    """The whole run in this process."""
    share = Share(root, opts, seen, maps, step)
    share.run(todo)
    share.finish()


# --- spreading a run over processes ------------------------------------------------------------


def default_jobs() -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(MAX_JOBS, cpus))


def _jobs(jobs: int | None, todo: list[Pending], opts: ImportOptions) -> int:
    if opts.dry_run or len(todo) < 2:
        return 1
    if jobs is None:
        if sum(p.size for p in todo) < MIN_BYTES:
            return 1
        jobs = default_jobs()
    return max(1, min(jobs, len(todo)))


def plan(root: Path, todo: list[Pending], opts: ImportOptions, n: int) -> list[list[Pending]]:
    """``todo`` in parts for ``n`` processes (of about :data:`PART_BYTES`, and at least
    :data:`PARTS_EACH` each), every file identified (``identified``): the files of one session
    (or of a sub-agent's parent and its children) in one part, in their order."""
    up: dict[str, str] = {}  # union-find over the session names the files would go to

    def top(name: str) -> str:
        while up.setdefault(name, name) != name:
            up[name] = up[up[name]]
            name = up[name]
        return name

    names: list[str] = []
    for p in todo:
        source = None
        try:
            p.identified = identify(p.path, opts.fmt, opts.max_decompressed)
            source = Source(p.path, opts.fmt, opts.max_decompressed, max_line_bytes=opts.max_line_bytes, key=p.key)
            name = source.place(root, *p.identified)
        except (MemfsError, OSError, ValueError):  # (its import says why: a part of its own)
            name = "\0" + p.key
        names.append(name)
        if source is not None and source.parent:
            up[top(name)] = top(source.parent)
    groups: dict[str, list[Pending]] = {}
    for p, name in zip(todo, names):
        groups.setdefault(top(name), []).append(p)
    part_bytes = min(PART_BYTES, sum(p.size for p in todo) // (n * PARTS_EACH))
    parts: list[list[Pending]] = [[]]
    size = 0
    for group in groups.values():
        if size >= part_bytes:
            parts.append([])
            size = 0
        parts[-1].extend(group)
        size += sum(p.size for p in group)
    return [part for part in parts if part]


def spread(root: Path, todo: list[Pending], opts: ImportOptions, jobs: int | None, seen: SeenSources, maps,
           step: Progress) -> bool:
    """Import ``todo`` over several processes (this one included) when that pays; False when it
    does not (the caller then runs it as one share). The parts (:func:`plan`) are handed out as
    the processes ask for more, this one taking the next between its own."""
    n = _jobs(jobs, todo, opts)
    if n < 2:
        return False
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    workers: list[_Worker] = []
    try:
        for _ in range(n - 1):  # (started first: they load memfs while this process plans)
            try:
                workers.append(_Worker(ctx, root, opts))
            except OSError as exc:  # (no process to be had: fewer workers, or none)
                log.warning("import: a worker process was not started (%s): fewer processes read the files", exc)
                break
            step.elsewhere.append(workers[-1].count)
        if not workers:
            return False
        parts = collections.deque(plan(root, todo, opts, len(workers) + 1))
        index = {id(p): i for i, p in enumerate(todo)}

        def feed() -> None:
            for worker in workers:
                worker.poll()
                while parts and worker.wants():
                    if not worker.give(parts[0], index):
                        break
                    parts.popleft()

        step.poll = feed
        feed()
        share = Share(root, opts, seen, maps, step)
        while parts:
            share.run(parts.popleft())
            feed()
        for worker in workers:
            worker.give(None, index)
        share.finish()
        for worker in workers:
            worker.collect(todo, seen, step)
    finally:
        for worker in workers:
            worker.stop()
    return True


class _Worker:
    """One spawned process importing the parts it is given (:func:`_work`), seen from the run."""

    def __init__(self, ctx, root: Path, opts: ImportOptions):
        self.conn, there = ctx.Pipe()
        self.process = ctx.Process(target=_work, args=(there, os.getpid()), daemon=True, name="memfs import worker")
        self.process.start()
        there.close()
        self.conn.send((str(root), opts))
        self.given: list[Pending] = []  # every file it was given
        self.waiting = 0  # parts given, not yet done
        self.read = 0  # bytes it reported read
        self.result: tuple | None = None
        self.done: list[tuple[int, dict]] = []  # (its index in the run, the item's fields)

    def count(self) -> int:
        return self.read

    def wants(self) -> bool:
        return self.result is None and self.waiting < AHEAD

    def give(self, part: list[Pending] | None, index: dict[int, int]) -> bool:
        """Hand it ``part`` (None: there is no more); False when it is gone (the part stays to give)."""
        try:
            self.conn.send(None if part is None else
                           [(index[id(p)], p.item.source, str(p.path), p.key, p.size, p.identified) for p in part])
        except OSError:  # (its end of the pipe closed: it failed)
            self.poll()
            if self.result is None:
                self._ended()
            return False
        if part is not None:
            self.given.extend(part)
            self.waiting += 1
        return True

    def poll(self, timeout: float = 0.0) -> None:
        """Take what the worker said meanwhile (its progress, parts done, its result)."""
        try:
            while self.result is None and self.conn.poll(timeout):
                message = self.conn.recv()
                if message[0] == "read":
                    self.read = message[1]
                elif message[0] == "part":
                    self.waiting -= 1
                    self.read = message[1]
                    self.done.extend(message[2])
                else:
                    self.result = message
                timeout = 0.0
        except (EOFError, OSError):
            self._ended()

    def _ended(self) -> None:
        self.result = ("failed", f"it ended (exit status {self.process.exitcode})")

    def collect(self, todo: list[Pending], seen: SeenSources, step: Progress) -> None:
        """Wait for the result; the items it was given take theirs, its notes go into ``seen``."""
        while self.result is None:
            self.poll(0.2)
            step.show()
        if self.result[0] == "done":
            for i, fields in self.done:
                vars(todo[i].item).update(fields)
            seen.merge(self.result[1], self.result[2])
            return
        log.warning("an import worker failed: %s", self.result[1])
        for p in self.given:
            p.item.status, p.item.reason = "error", f"the import process of this file failed: {self.result[1]}"

    def stop(self) -> None:
        if self.process.is_alive() and self.result is None:
            self.process.kill()
        self.process.join()
        self.conn.close()


def _die_with_parent(parent: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # (gone already)
        os._exit(1)


def _work(conn, parent: int) -> None:
    """A worker: import the parts the run sends until it sends None, saying after each part
    its items; at the end its re-import notes."""
    _die_with_parent(parent)
    root, opts = conn.recv()
    root = Path(root)
    said = [0.0, 0]

    def step(n: int) -> None:
        said[1] += n
        if time.monotonic() - said[0] >= PROGRESS_EVERY:
            said[0] = time.monotonic()
            conn.send(("read", said[1]))

    try:
        seen = SeenSources(root, load=False)
        with deferred_sync(root), conversations.batched(root) as maps:
            share = Share(root, opts, seen, maps, step)
            while (part := conn.recv()) is not None:
                todo = [(i, Pending(ImportItem(source), Path(path), key, size, tuple(ident) if ident else None))
                        for i, source, path, key, size, ident in part]
                share.run([p for _, p in todo])
                conn.send(("part", said[1], [(i, p.item.to_dict()) for i, p in todo]))
            share.finish()
        conn.send(("done", *seen.changes()))
    except BaseException as exc:
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        raise
