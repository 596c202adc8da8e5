"""``memfs import``: agents' transcript files become sessions, once (SPEC §8).

Each source file becomes one session, named by the thread or session id it carries (Codex's
``thread.started``/``session_meta`` id, Claude Code's ``session_id``/``sessionId``; a Claude
Code sub-agent file ``agent-<hash>.jsonl`` gets ``<sessionId>.agent-<hash>``; a file naming no
id, its file name), sanitized as every session id is.

**Idempotent.** What was imported from each source is remembered in the session's
``index/import-sources.json`` (a memfs sidecar; VT Code ignores it): per source path, the bytes
and lines consumed, the sha256 of that prefix, the source's size then, and the translator's
state. An import reads a source from where the last one stopped, after checking that the
prefix is unchanged; a source whose imported prefix changed (rewritten, truncated) is
reported as ``changed`` and left alone, never imported twice. Only complete lines are
consumed: a partial last line waits for its newline. The sidecar is replaced atomically right
after the session's new lines are durable (``flush``); a crash exactly between the two makes
the next import repeat that last batch — the one window where a line can be appended twice.

**Follow** (:func:`follow`) keeps watching directories with inotify (through ctypes: no new
dependency), including directories created later (Codex's ``YYYY/MM/DD``), and appends the
lines tools add as they add them, each source's position kept in the same sidecar, so a
restart neither loses nor repeats a line and never rewrites a session. A directory yields its
``*.jsonl`` files, recursively.

Refused lines (untranslatable, or refused by the event contract) go to the session's
``rejected.jsonl`` with their reason and the import goes on: one hostile line costs that
session that line only.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import hashlib
import os
import select
import signal
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import orjson

from memfs.errors import CapRewriteError, MemfsError, ValidationError
from memfs.events import parse_line
from memfs.ingest import AutoTranslator, Untranslatable, classify, parse_object, session_id_of
from memfs.store.config import DEFAULT_EVICT_TO
from memfs.store.session import open_session
from memfs.store.meta import now_rfc3339
from memfs.store.paths import IMPORT_SOURCES, INDEX_DIR, atomic_write, sanitize

SOURCES = IMPORT_SOURCES
CHUNK = 1 << 20
HEAD_LINES = 64


# --- appending a batch, refusals included -----------------------------------------------------


def append_tolerant(handle, lines: list[bytes]) -> tuple[int, int]:
    """Append ``lines`` in order, going on past refused ones (each refused line is already
    recorded in ``rejected.jsonl`` by the store). Returns ``(accepted, refused)``."""
    accepted = refused = 0
    start = 0
    while start < len(lines):
        try:
            accepted += handle.append_many(lines[start:] if start else lines)
            break
        except ValidationError as exc:
            accepted += exc.accepted
            refused += 1
            start += exc.accepted + 1
        except CapRewriteError as exc:  # committed; the cap is retried after the next append
            accepted += exc.accepted
            start += exc.accepted
            if not exc.accepted:
                start += 1
    return accepted, refused


def reject(handle, raw: bytes, reason: str) -> None:
    handle.reject(raw, ValidationError(reason))


# --- the sidecar -------------------------------------------------------------------------------


def read_sources(session_dir: Path) -> dict:
    try:
        data = orjson.loads((session_dir / SOURCES).read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return {}
    sources = data.get("sources") if isinstance(data, dict) else None
    return sources if isinstance(sources, dict) else {}


def write_sources(session_dir: Path, sources: dict) -> None:
    atomic_write(session_dir / SOURCES, orjson.dumps({"version": 1, "sources": sources}))


# --- one source file ---------------------------------------------------------------------------


@dataclass
class ImportItem:
    source: str
    session: str | None = None
    format: str | None = None
    status: str = "imported"  # imported | up-to-date | changed | empty | error
    lines: int = 0  # source lines consumed now
    appended: int = 0  # events appended now
    refused: int = 0  # lines refused now (in rejected.jsonl)
    reason: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def identify(path: Path, fmt: str) -> tuple[str | None, str | None]:
    """``(kind, session id)`` from the first lines of a source (either may be None)."""
    kind = sid = None
    with open(path, "rb") as f:
        head = f.read(CHUNK)
    complete = head[: head.rfind(b"\n") + 1] if len(head) == CHUNK else head
    for raw in complete.splitlines()[:HEAD_LINES]:
        try:
            obj = parse_object(raw, "auto")
        except Untranslatable:
            continue
        kind = kind or classify(obj)
        sid = sid or session_id_of(obj)
        if kind and sid:
            break
    if kind == "claude" and sid and path.stem.startswith("agent-"):
        sid = f"{sid}.{path.stem}"
    return kind, sid


def _prefix_sha(path: Path, length: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        left = length
        while left:
            chunk = f.read(min(CHUNK, left))
            if not chunk:
                break
            h.update(chunk)
            left -= len(chunk)
    return h.hexdigest()


class Source:
    """One source file being imported (kept between batches by :func:`follow`)."""

    def __init__(self, path: Path, fmt: str):
        self.path = path
        self.key = str(path.resolve())
        self.fmt = fmt
        self.session: str | None = None
        self.kind: str | None = None
        self.entry: dict | None = None
        self.translator: AutoTranslator | None = None
        self.hasher = None
        self.changed = False

    def prepare(self, root: Path) -> bool:
        """Find the session and where the last import stopped; False while the file does not
        yet say which session it is (or is empty)."""
        if self.entry is not None:
            return True
        if not self.path.stat().st_size:
            return False
        kind, sid = identify(self.path, self.fmt)
        self.kind, self.session = kind, sid or self.path.stem
        session_dir = root / sanitize(self.session)
        entry = read_sources(session_dir).get(self.key) if session_dir.is_dir() else None
        self.translator = AutoTranslator(self.fmt)
        if entry:
            offset = entry.get("offset", 0)
            if self.path.stat().st_size < offset or _prefix_sha(self.path, offset) != entry.get("sha256"):
                self.changed = True
                self.entry = entry
                return True
            self.translator.restore(entry.get("state") or {})
        else:
            entry = {"path": self.key, "offset": 0, "lines": 0, "sha256": hashlib.sha256().hexdigest()}
        self.entry = entry
        self.hasher = hashlib.sha256()
        if entry["offset"]:
            with open(self.path, "rb") as f:
                left = entry["offset"]
                while left:
                    chunk = f.read(min(CHUNK, left))
                    self.hasher.update(chunk)
                    left -= len(chunk)
        return True

    def run(self, root: Path, item: ImportItem, *, dry_run: bool, durability: str, max_events: int,
            evict_to: float = DEFAULT_EVICT_TO, progress: Callable[[int], None] | None = None) -> None:
        """Consume the complete lines past the remembered offset."""
        item.session, item.format = self.session, self.translator.kind if self.translator else self.kind
        if self.changed:
            item.status, item.reason = "changed", "the source's imported part changed since the last import; left alone"
            return
        offset = self.entry["offset"]
        size = self.path.stat().st_size
        if size <= offset:
            item.status = "up-to-date"
            return
        handle = None if dry_run else open_session(root, self.session, durability=durability, max_events=max_events,
                                                   evict_to=evict_to)
        try:
            with open(self.path, "rb") as f:
                f.seek(offset)
                carry = b""
                while True:
                    data = f.read(CHUNK)
                    if not data:
                        break
                    data = carry + data
                    cut = data.rfind(b"\n") + 1
                    carry = data[cut:]
                    if cut:
                        self._batch(handle, data[:cut], item, dry_run)
                        offset += cut
                        if not dry_run:
                            self.hasher.update(data[:cut])
                    if progress:
                        progress(len(data) - len(carry))
            item.format = self.translator.kind or item.format
            if handle is not None and item.lines:
                handle.flush()
                sources = read_sources(handle.path)
                self.entry = {"path": self.key, "format": item.format, "offset": offset,
                              "lines": self.entry["lines"] + item.lines, "size": size,
                              "sha256": self.hasher.hexdigest(), "state": self.translator.state(),
                              "updated_at": now_rfc3339()}
                sources[self.key] = self.entry
                write_sources(handle.path, sources)
        finally:
            if handle is not None:
                handle.close()
        if not item.lines:
            item.status = "up-to-date"

    def _batch(self, handle, data: bytes, item: ImportItem, dry_run: bool) -> None:
        out: list[bytes] = []
        for raw in data.split(b"\n")[:-1]:
            item.lines += 1
            if raw.endswith(b"\r"):
                raw = raw[:-1]
            if not raw.strip():
                continue
            try:
                produced = self.translator.feed(raw)
            except Untranslatable as exc:
                if out and handle is not None:
                    a, r = append_tolerant(handle, out)
                    item.appended, item.refused = item.appended + a, item.refused + r
                    out = []
                item.refused += 1
                if handle is not None:
                    reject(handle, raw, str(exc))
                continue
            if dry_run:
                for line in produced:
                    try:
                        parse_line(line)
                        item.appended += 1
                    except ValidationError:
                        item.refused += 1
            else:
                out.extend(produced)
        if out and handle is not None:
            a, r = append_tolerant(handle, out)
            item.appended, item.refused = item.appended + a, item.refused + r


def discover(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """The files to import: each FILE as given, and every ``*.jsonl`` under each DIR."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found.extend(sorted(q for q in p.rglob("*.jsonl") if q.is_file()))
        elif p.exists():
            found.append(p)
        else:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(p))
    return found


def import_paths(root: Path, paths: Iterable[str | os.PathLike], *, fmt: str = "auto", dry_run: bool = False,
                 max_events: int = 0, evict_to: float = DEFAULT_EVICT_TO,
                 progress: Callable[[int, int], None] | None = None) -> list[ImportItem]:
    """Import each source file once (see the module docstring); one item per file."""
    files = discover(paths)
    total = sum(f.stat().st_size for f in files)
    done = 0
    items = []
    for path in files:
        item = ImportItem(str(path))
        items.append(item)

        def step(n: int) -> None:
            nonlocal done
            done += n
            if progress:
                progress(done, total)
        try:
            source = Source(path, fmt)
            if not source.prepare(root):
                item.status = "empty"
                continue
            source.run(root, item, dry_run=dry_run, durability="buffered", max_events=max_events, evict_to=evict_to,
                       progress=step)
        except (MemfsError, OSError) as exc:
            item.status, item.reason = "error", str(exc)
    if progress:
        progress(total, total)
    return items


# --- follow: inotify through ctypes ------------------------------------------------------------

IN_MODIFY, IN_CLOSE_WRITE, IN_MOVED_TO, IN_CREATE = 0x2, 0x8, 0x80, 0x100
IN_DELETE_SELF, IN_Q_OVERFLOW, IN_IGNORED, IN_ISDIR = 0x400, 0x4000, 0x8000, 0x40000000
IN_NONBLOCK, IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
_EVENT = struct.Struct("iIII")


class Inotify:
    """The few inotify calls :func:`follow` needs."""

    MASK = IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_DELETE_SELF

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self.fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self.fd < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"inotify_init1: {os.strerror(e)}")
        self.dirs: dict[int, Path] = {}

    def watch(self, path: Path) -> None:
        wd = self._libc.inotify_add_watch(self.fd, os.fsencode(path), self.MASK)
        if wd < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"inotify_add_watch: {os.strerror(e)}", str(path))
        self.dirs[wd] = path

    def read(self, timeout: float) -> list[tuple[Path | None, int, str]]:
        """``(directory, mask, name)`` of the events within ``timeout`` seconds."""
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        if not poller.poll(int(timeout * 1000)):
            return []
        try:
            data = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return []
        events, i = [], 0
        while i + _EVENT.size <= len(data):
            wd, mask, _cookie, length = _EVENT.unpack_from(data, i)
            name = data[i + _EVENT.size: i + _EVENT.size + length].rstrip(b"\0")
            i += _EVENT.size + length
            events.append((self.dirs.get(wd), mask, os.fsdecode(name)))
            if mask & IN_IGNORED:
                self.dirs.pop(wd, None)
        return events

    def close(self) -> None:
        os.close(self.fd)


def follow(root: Path, dirs: Iterable[str | os.PathLike], *, fmt: str = "auto", max_events: int = 0,
           evict_to: float = DEFAULT_EVICT_TO,
           report: Callable[[ImportItem], None] | None = None, should_stop: Callable[[], bool] | None = None,
           poll_interval: float = 0.5) -> None:
    """Import what ``dirs`` hold, then keep appending what tools add, until SIGINT/SIGTERM
    (or ``should_stop()``). Appends use ``write`` durability: each line reaches the log as
    it is appended. ``report`` is called with every batch that appended or refused lines."""
    stop = False

    def on_signal(signum, frame):
        nonlocal stop
        stop = True

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    ino = Inotify()
    sources: dict[str, Source] = {}
    try:
        def watch_tree(top: Path) -> None:
            ino.watch(top)
            for sub in sorted(p for p in top.rglob("*") if p.is_dir()):
                ino.watch(sub)

        def process(path: Path) -> None:
            key = str(path.resolve())
            source = sources.get(key)
            if source is None:
                source = sources[key] = Source(path, fmt)
            item = ImportItem(str(path))
            try:
                if not source.prepare(root):
                    return
                source.run(root, item, dry_run=False, durability="write", max_events=max_events, evict_to=evict_to)
            except (MemfsError, OSError) as exc:
                item.status, item.reason = "error", str(exc)
                source.entry = None  # start over from the sidecar next time
            if report and (item.lines or item.status in ("error", "changed")):
                report(item)

        tops = [Path(d) for d in dirs]
        for top in tops:
            if not top.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, "Not a directory", str(top))
            watch_tree(top)
        for path in discover(tops):
            process(path)
        while not stop and not (should_stop and should_stop()):
            for directory, mask, name in ino.read(poll_interval):
                if mask & IN_Q_OVERFLOW:
                    for path in discover(tops):
                        process(path)
                    continue
                if directory is None or not name:
                    continue
                path = directory / name
                if mask & IN_ISDIR:
                    if mask & (IN_CREATE | IN_MOVED_TO):
                        watch_tree(path)
                        for p in discover([path]):
                            process(p)
                elif name.endswith(".jsonl") and path.is_file():
                    process(path)
    finally:
        ino.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
