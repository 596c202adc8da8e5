"""``memfs import``: agents' transcript files become sessions, once (SPEC §8, §10).

Each source file goes to the session of the conversation it carries (Codex's
``thread.started``/``session_meta`` id, Claude Code's ``session_id``/``sessionId``, Gemini's
``sessionId``): the session that already holds that conversation, whatever captured it, else a
new one named by the id (:mod:`memfs.ingest.conversations`; a valid ``mkdir`` name). A Claude Code
sub-agent file ``<session>/subagents/agent-<id>.jsonl`` goes to the child session
``<parent session>.agent-<id>`` (``parent_session`` in its ``about.json``, and it is one of the
parent's ``children``); a file naming no id, to its file name. What the session already holds
of the conversation is not appended again (:class:`memfs.ingest.identity.Dedupe`), and the
record's metadata is merged into ``index/about.json`` after each batch. A file whose lines
make no event but a ``thread.started`` (a Claude Code transcript with only metadata lines) is
no session: reported ``empty``, nothing made.

Inputs: a FILE as given; under a DIR every ``*.jsonl`` and ``*.jsonl.zst`` (Codex's compressed
rollouts, decompressed as a stream up to :data:`MAX_DECOMPRESSED` bytes — a larger one is
refused whole, with the reason); a Codex home (a DIR holding ``sessions/`` or
``archived_sessions/``) gives those two, a Codex ``sessions`` DIR also its sibling
``archived_sessions``. A conversation split over several files (paginated rollouts, a resumed
Gemini chat) lands in one session, each file read once.

**Idempotent.** What was imported from each source is remembered in the session's
``index/import-sources.json`` (a memfs sidecar; VT Code ignores it): per source path, the bytes
and lines consumed (of the decompressed content for ``*.zst``), the sha256 of that prefix, the
source's size then, the translator's state and the dedupe's. An import reads a source from
where the last one stopped, after checking that the prefix is unchanged; a source whose
imported prefix changed (rewritten, truncated) is reported as ``changed`` and left alone,
never imported twice. Only complete lines are consumed: a partial last line waits for its
newline. The sidecar is replaced atomically only once the session's new lines are durable: a
crash before makes the next import repeat what it describes — which the dedupe then drops, as
it drops what another capture of the conversation brought. ``memfs import`` writes without a
sync per file and makes a batch durable with one ``syncfs`` before writing its sidecars
(:mod:`memfs.ingest.sidecars`); ``--follow`` and ``memfs resume`` flush each session first.

**Follow** (``--follow``, :mod:`memfs.ingest.follow`) keeps appending what tools add, each
source's position kept in the same sidecar.

Refused lines (untranslatable, or refused by the event contract) go to the session's
``rejected.jsonl`` with their reason and the import goes on: one hostile line costs that
session that line only. A line over ``max_line_bytes`` is refused as it streams past, never
held. Only regular files reached without following a link are read; anything else is reported
``skipped`` with its reason (:mod:`memfs.ingest.inputs`). A re-import takes a source whose
``(inode, size, mtime)`` did not change since it was taken whole as ``up-to-date`` without
opening it (:mod:`memfs.ingest.seen`). A large run is spread over the CPUs, each session's
files in one process (:mod:`memfs.ingest.shares`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from memfs import agents
from memfs.errors import ValidationError
from memfs.events import parse_line
from memfs.ingest import (
    AutoTranslator,
    Untranslatable,
    classify,
    conversations,
    identity,
    parse_object,
    session_id_of,
)
from memfs.ingest.inputs import (
    CHUNK,
    MAX_DECOMPRESSED,
    InputTooLarge,
    SourceLines,
    compressed,
    discover,
    is_source_name,
    open_input,
    source_roots,
    stat_source,
)
from memfs.ingest.seen import SeenSources
from memfs.ingest.sidecars import ImportBatch, read_sources, write_sources
from memfs.ingest.sidefiles import SideReader
from memfs.store.batch import append_tolerant
from memfs.store.config import DEFAULT_EVICT_TO, DEFAULT_MAX_LINE_BYTES, line_too_long
from memfs.store.lines import LongLine, split_lines
from memfs.store.meta import now_rfc3339
from memfs.store.paths import IMPORT_SOURCES, deferred_sync
from memfs.store.session import SessionHandle, open_session
from memfs.store.sessiondirs import is_session_dir
from memfs.usage.reporting import of_handle

if TYPE_CHECKING:
    from hashlib import _Hash

log = logging.getLogger("memfs.ingest")

SOURCES = IMPORT_SOURCES
HEAD_LINES = 64
HEAD_FIRST = 64 << 10  # identify reads this much of a source first, up to inputs.CHUNK if it must
__all__ = ["InputTooLarge", "discover", "is_source_name", "read_sources", "source_roots",
           "write_sources"]  # (re-exported)


# --- appending a batch, refusals included -----------------------------------------------------


def reject(handle, raw: bytes | LongLine, reason: str | ValidationError) -> None:
    handle.writes.reject(raw, reason if isinstance(reason, ValidationError) else ValidationError(reason))


def feed_line(translator: AutoTranslator, raw: bytes | LongLine,
              max_line: int) -> tuple[list[bytes], ValidationError | str | None] | None:
    """One source line through ``translator``: ``(its events, None)``, or ``([], why)`` when it
    is refused (too long, so unread: :class:`LongLine`; or untranslatable); None for a blank line."""
    if isinstance(raw, LongLine):
        return [], line_too_long(raw.size, max_line)
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    if not raw.strip():
        return None
    try:
        return translator.feed(raw), None
    except Untranslatable as exc:
        return [], str(exc)


# --- one source file ---------------------------------------------------------------------------


@dataclass
class ImportItem:
    source: str
    session: str | None = None
    format: str | None = None
    status: str = "imported"  # imported | up-to-date | changed | empty | skipped | error
    lines: int = 0  # source lines consumed now
    appended: int = 0  # events appended now
    refused: int = 0  # lines refused now (in rejected.jsonl)
    duplicates: int = 0  # events dropped now: the session already holds them (memfs.ingest.identity)
    reason: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _skip(f, n: int, hasher=None) -> int:
    """Read ``n`` bytes of ``f`` (into ``hasher``); returns how many there were."""
    left = n
    while left:
        chunk = f.read(min(CHUNK, left))
        if not chunk:
            break
        if hasher is not None:
            hasher.update(chunk)
        left -= len(chunk)
    return n - left


# --- one source file ---------------------------------------------------------------------------

def identify(path: Path, fmt: str, limit: int = MAX_DECOMPRESSED) -> tuple[str | None, str | None]:
    """``(kind, conversation id)`` from the first lines of a source (either may be None)."""
    with open_input(path, limit) as f:
        head = f.read(HEAD_FIRST)  # (most files say both in their first lines: the rest of the head only if not)
        whole = len(head) < HEAD_FIRST
        kind, sid = _identify(head, whole)
        if (kind and sid) or whole:
            return kind, sid
        head += f.read(CHUNK - HEAD_FIRST)
    return _identify(head, len(head) < CHUNK)


def _identify(head: bytes, whole: bool) -> tuple[str | None, str | None]:
    """:func:`identify` over the first :data:`HEAD_LINES` lines of ``head`` (``whole``: the
    file ends there, its last line needs no newline)."""
    kind = sid = None
    lines, cut = split_lines(head)
    if whole and cut < len(head):
        lines.append(head[cut:])
    for raw in lines[:HEAD_LINES]:
        try:
            obj = parse_object(raw, "auto")
        except Untranslatable:
            continue
        kind = kind or classify(obj)
        sid = sid or session_id_of(obj)
        if kind and sid:
            break
    return kind, sid


def _is_thread_start(line: bytes) -> bool:
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return False
    if type(obj) is dict and type(obj.get("event")) is dict:
        obj = obj["event"]
    return type(obj) is dict and obj.get("type") == "thread.started"


class Source:
    """One source file being imported (kept between batches by :func:`memfs.ingest.follow.follow`)."""

    def __init__(self, path: Path, fmt: str, max_decompressed: int = MAX_DECOMPRESSED, dry_run: bool = False,
                 into: str | None = None, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES, key: str | None = None):
        self.path = path
        self.read_stat: os.stat_result | None = None  # the source's, when the last run read it
        self.read_at = 0  # when that was (time.time_ns())
        self.max_line = max_line_bytes  # a longer source line is refused, streamed past (never held)
        self.dry_run = dry_run
        self.into = into  # the session to import into, whatever the file names (import_into)
        self.key = key or str(path.resolve())  # (key: that, known already: inputs.discover)
        self.fmt = fmt
        self.limit = max_decompressed
        self.compressed = compressed(path)
        self.session: str | None = None
        self.kind: str | None = None
        self.conversation: str | None = None
        self.parent: str | None = None  # a sub-agent's parent session (directory name)
        self.extra: dict = {}
        self.entry: dict | None = None
        self.translator: AutoTranslator | None = None
        self.hasher: _Hash | None = None
        self.changed = False
        self.handle: SessionHandle | None = None
        self.capture: identity.Capture | None = None
        self.opening: dict[str, Any] = {}  # open_session's settings (run)
        self.usage: list | None = None  # where run puts the session's usage contribution (memfs.usage.reporting)
        self.started = False  # the session exists (run)
        self.pending: list[bytes] = []  # thread.started lines held until the session is made (run)
        self.final = False  # a one-shot run (run's ``final``)

    def place(self, root: Path, kind: str | None, sid: str | None) -> str:
        """The session's directory name (see :mod:`memfs.ingest.identity`): a sub-agent's file
        (its agent's table's ``subagent``: a Claude Code ``agent-<id>.jsonl``, a Gemini CLI
        ``chats/<parent id>/<id>.jsonl``) goes to ``<parent session>.<leaf>``."""
        if self.into:
            self.conversation = sid
            return self.into
        agent = agents.agent_of_kind(kind)

        def find(cid: str) -> str | None:
            return conversations.find_conversation(root, cid, agent, write=not self.dry_run)

        if not sid:  # the file's name, less its extension
            name = self.path.name
            return conversations.session_name(name[:-len(".jsonl.zst")] if name.endswith(".jsonl.zst")
                                              else self.path.stem)
        table = agents.shapes(agents.owner_of(kind))
        sub = table.subagent(self.path, sid) if table is not None and table.subagent is not None else None
        if sub:
            self.parent = find(sub.parent) or conversations.new_session_name(root, sub.parent)
            self.conversation = sub.conversation
            self.extra = {"conversation_id": sub.conversation, "parent_session": self.parent}
            return find(sub.conversation) or conversations.session_name(f"{self.parent}.{sub.leaf}")
        self.conversation = sid
        return find(sid) or conversations.new_session_name(root, sid)

    def prepare(self, root: Path, identified: tuple[str | None, str | None] | None = None) -> bool:
        """Find the session and where the last import stopped; False while the file does not
        yet say which session it is (or is empty). ``identified``: :func:`identify`'s answer,
        when the caller has it."""
        if self.entry is not None:
            return True
        st = stat_source(self.path)
        if not st.st_size:
            return False
        kind, sid = identified or identify(self.path, self.fmt, self.limit)
        self.kind = kind
        self.session = self.place(root, kind, sid)
        session_dir = root / self.session
        entry = read_sources(session_dir).get(self.key) if session_dir.is_dir() else None
        self.translator = AutoTranslator(self.fmt, reader=SideReader.for_transcript(self.path))  # tool-results/
        hasher = hashlib.sha256()
        if entry:
            offset = entry.get("offset", 0)
            if not (self.compressed and entry.get("csize") == st.st_size and entry.get("mtime_ns") == st.st_mtime_ns):
                if not self.compressed and st.st_size < offset:
                    self.changed = True
                else:
                    with open_input(self.path, self.limit) as f:
                        self.changed = _skip(f, offset, hasher) < offset or hasher.hexdigest() != entry.get("sha256")
                if self.changed:
                    self.entry = entry
                    return True
            else:
                hasher = None  # unchanged since: nothing to read
            self.translator.restore(entry.get("state") or {})
        else:
            entry = {"path": self.key, "offset": 0, "lines": 0, "sha256": hasher.hexdigest()}
        self.entry = entry
        self.hasher = hasher
        return True

    def run(self, root: Path, item: ImportItem, *, dry_run: bool, durability: str, max_events: int,
            evict_to: float = DEFAULT_EVICT_TO, progress: Callable[[int], None] | None = None,
            final: bool = False, batch: ImportBatch | None = None) -> None:
        """Consume the complete lines past the remembered offset; ``final`` (a one-shot import,
        not ``--follow``): then close what the record leaves open for want of an end mark (a
        Gemini chat file's last turn: :meth:`AutoTranslator.finish`). ``batch``: the sidecar
        entry goes there, written once the batch is durable (:mod:`memfs.ingest.sidecars`);
        else it is written now, after the session's flush."""
        item.session, item.format = self.session, self.translator.kind if self.translator else self.kind
        self.final = final
        if self.changed:
            item.status, item.reason = "changed", "the source's imported part changed since the last import; left alone"
            return
        offset = self.entry["offset"]
        self.read_at = time.time_ns()
        st = self.read_stat = stat_source(self.path)
        if (st.st_size <= offset and not self.compressed) or self.hasher is None:
            item.status = "up-to-date"
            return
        if self.compressed:  # refused whole, before anything is appended
            with open_input(self.path, self.limit) as f:
                while f.read(CHUNK):
                    pass
        self.opening = {"durability": durability, "max_events": max_events, "evict_to": evict_to,
                        "max_line_bytes": self.max_line}
        self.capture = identity.Capture(root, agent=agents.agent_of_kind(self.kind), conversation_id=self.conversation,
                                        extra=self.extra, parent=self.parent, state=self.entry.get("identity"))
        self.pending, self.handle = [], None
        existed = self.started = is_session_dir(root / self.session)
        if existed:  # (a new session is made by its first event: a stub makes none)
            self._open(root, dry_run)
        try:
            with open_input(self.path, self.limit) as f:
                _skip(f, offset)
                reader = SourceLines(f, self.max_line, offset, None if dry_run else self.hasher)
                for lines, nread in reader:
                    if lines:
                        self._batch(root, lines, item, dry_run)
                    if progress:
                        progress(nread)
                offset = reader.offset
                if reader.hasher is not None:
                    self.hasher = reader.hasher
            if final:
                self._emit(root, self.translator.finish(), item, dry_run)
            self._emit(root, self.capture.finish(), item, dry_run, filtered=True)
            item.format = self.translator.kind or item.format
            handle = self.handle
            if handle is not None and not dry_run and item.lines:
                handle.flush()
                self.capture.after(handle, self.translator.meta)
                if self.usage is not None:  # (the log and about.json as the commit leaves them)
                    try:
                        self.usage.append(of_handle(handle))
                    except Exception as exc:  # a cache's: the next report computes it from the log
                        log.debug("%s: usage not kept at import: %s", self.session, exc)
                self.entry = {"path": self.key, "format": item.format, "offset": offset,
                              "lines": self.entry["lines"] + item.lines, "size": st.st_size,
                              "sha256": self.hasher.hexdigest(), "state": self.translator.state(),
                              "identity": self.capture.state(), "updated_at": now_rfc3339()}
                if self.compressed:
                    self.entry.update(csize=st.st_size, mtime_ns=st.st_mtime_ns)
                if batch is not None:
                    batch.add(handle.path, self.key, self.entry)
                else:
                    sources = read_sources(handle.path)
                    sources[self.key] = self.entry
                    write_sources(handle.path, sources)
        finally:
            if self.handle is not None:
                self.handle.close()
                self.handle = None
        item.duplicates += self.capture.dropped
        if item.lines and self.entry.get("offset") != offset:  # consumed, not remembered: start over next time
            self.entry = None
        if not item.lines:
            item.status = "up-to-date"
        elif not existed and not self.started and not item.refused:
            item.status, item.reason = "empty", "no conversation in it (only metadata lines)"

    def _open(self, root: Path, dry_run: bool) -> None:
        if dry_run:
            self.handle = open_session(root, self.session, read_only=True)
        else:
            self.handle = open_session(root, self.session, stay_writer=True, **self.opening)
        self.capture.attach(self.handle)

    def _emit(self, root: Path, lines: list[bytes], item: ImportItem, dry_run: bool, force: bool = False,
              filtered: bool = False) -> None:
        """Append (dry run: count) translated lines, less what the session already holds. The
        session is made by the first line that is more than a ``thread.started``."""
        if not self.started:
            self.pending.extend(lines)
            if not force and all(_is_thread_start(line) for line in self.pending):
                return
            self.started = True
            lines, self.pending = self.pending, []
            if self.handle is None and not dry_run:
                self._open(root, dry_run)
        if self.handle is not None and not filtered:
            lines = self.capture.filter(lines, self.translator.meta)
        if dry_run:
            for line in lines:
                try:
                    parse_line(line)
                    item.appended += 1
                except ValidationError:
                    item.refused += 1
        elif lines:
            a, r = append_tolerant(self.handle, lines)
            item.appended, item.refused = item.appended + a, item.refused + r
            self.capture.appended(lines, a)
            if not self.final:  # (a one-shot import merges the metadata once, after its flush)
                self.capture.after(self.handle, self.translator.meta)

    def _batch(self, root: Path, lines: list[bytes | LongLine], item: ImportItem, dry_run: bool) -> None:
        out: list[bytes] = []
        for raw in lines:
            item.lines += 1
            fed = feed_line(self.translator, raw, self.max_line)  # (a LongLine: inputs.SourceLines)
            if fed is None:
                continue
            events, error = fed
            if error is None:
                out.extend(events)
                continue
            self._emit(root, out, item, dry_run, force=True)
            out = []
            item.refused += 1
            if not dry_run:
                reject(self.handle, raw, error)
        self._emit(root, out, item, dry_run)


def import_paths(root: Path, paths: Iterable[str | os.PathLike], *, fmt: str = "auto", dry_run: bool = False,
                 max_events: int = 0, evict_to: float = DEFAULT_EVICT_TO,
                 progress: Callable[[int, int], None] | None = None,
                 max_decompressed: int = MAX_DECOMPRESSED,
                 max_line_bytes: int = DEFAULT_MAX_LINE_BYTES, jobs: int | None = None) -> list[ImportItem]:
    """Import each source file once (see the module docstring); one item per file, and one
    ``skipped`` item (with its reason) per file or directory not read (:mod:`memfs.ingest.inputs`).
    OpenCode's store (a SQLite database, not lines) goes to
    :func:`memfs.agents.opencode.read.import_store`: one item per OpenCode session. ``jobs``:
    how many processes read the files (:mod:`memfs.ingest.shares`; None: as many as pays)."""
    from memfs.agents.opencode import read as opencode
    from memfs.ingest.shares import ImportOptions, Pending, Progress, run_share, spread

    opts = ImportOptions(fmt, dry_run, max_events, evict_to, max_decompressed, max_line_bytes)
    stores, paths = opencode.split_stores(paths)
    items = opencode.import_stores(root, stores, dry_run=dry_run, max_events=max_events, evict_to=evict_to)
    skipped: list[tuple[Path, str]] = []
    keys: dict[Path, str] = {}
    files = discover(paths, skipped, keys)
    items += [ImportItem(str(path), status="skipped", reason=reason) for path, reason in sorted(skipped)]
    stats = [os.lstat(f) for f in files]
    step = Progress(sum(st.st_size for st in stats), progress)
    seen = SeenSources(root)
    todo: list[Pending] = []
    for path, st in zip(files, stats):
        item = ImportItem(str(path))
        items.append(item)
        known = seen.unchanged(keys[path], st)
        if known is not None:  # taken whole before, unchanged since: not even opened (memfs.ingest.seen)
            item.session, item.format = known
            item.status = "up-to-date"
            step.done += st.st_size
        else:
            todo.append(Pending(item, path, keys[path], st.st_size))
    with (nullcontext() if dry_run else deferred_sync(root)), conversations.batched(root) as maps:
        if not spread(root, todo, opts, jobs, seen, maps, step):
            run_share(root, todo, opts, seen, maps, step)
        if not dry_run:
            try:
                seen.save()
            except OSError:  # (a cache: the next import takes the full path)
                pass
    if progress:
        progress(step.total, step.total)
    return items


# --- one file into a given session (memfs resume, SPEC §11) ------------------------------------


def import_into(root: Path, path: Path, session: str, *, fmt: str = "auto", max_events: int = 0,
                evict_to: float = DEFAULT_EVICT_TO, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> ImportItem:
    """Import one source file into ``session`` (an existing one, whatever conversation the file
    names), as :func:`import_paths` imports a file: from where the last import of it into that
    session stopped, less what the session already holds. Errors raise (:class:`NotRegular`
    for anything but a regular file reached without following a link)."""
    item = ImportItem(str(path))
    source = Source(Path(path), fmt, into=session, max_line_bytes=max_line_bytes)
    if not source.prepare(root):
        item.status = "empty"
        return item
    source.run(root, item, dry_run=False, durability="write", max_events=max_events, evict_to=evict_to, final=True)
    return item


def remember_as_imported(root: Path, path: Path, session: str, *, fmt: str = "auto",
                         max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> int:
    """Note in ``session``'s ``index/import-sources.json`` that ``path``, as it is now, is
    already in the session (``memfs resume``: the file memfs itself exported there), so that
    :func:`import_into` takes only what is appended to it later. Its complete lines are read
    through the translator (nothing appended) to keep the translator's state; returns the
    bytes remembered."""
    root, path = Path(root), Path(path)
    source = Source(path, fmt, into=session)
    translator = AutoTranslator(fmt, reader=SideReader.for_transcript(path))
    lines = 0
    with open_input(path) as f:
        size = stat_source(path).st_size if source.compressed else os.fstat(f.fileno()).st_size
        reader = SourceLines(f, max_line_bytes, 0, hashlib.sha256())
        for batch, _ in reader:
            for raw in batch:
                lines += 1
                if isinstance(raw, LongLine):  # (the import refuses it: nothing to translate)
                    continue
                raw = raw[:-1] if raw.endswith(b"\r") else raw
                if raw.strip():
                    try:
                        translator.feed(raw)
                    except Untranslatable:
                        pass
    offset, hasher = reader.offset, reader.hasher
    assert hasher is not None
    session_dir = root / session
    sources = read_sources(session_dir)
    sources[source.key] = {"path": source.key, "format": translator.kind, "offset": offset, "lines": lines,
                           "size": size, "sha256": hasher.hexdigest(), "state": translator.state(),
                           "identity": {}, "updated_at": now_rfc3339()}
    write_sources(session_dir, sources)
    return offset
