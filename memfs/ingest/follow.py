"""``memfs import --follow``: keep importing what tools add (SPEC §8, §10).

:func:`follow` watches directories with inotify (through ctypes: no new dependency),
including directories created later (Codex's ``YYYY/MM/DD``), and appends the lines tools add
as they add them through :class:`memfs.ingest.importer.Source`, each source's position kept in
the same sidecar as ``memfs import``'s, so a restart neither loses nor repeats a line and never
rewrites a session. As ``memfs import``, it reads only regular files reached without following
a link and never watches or enters a linked directory (:mod:`memfs.ingest.inputs`); what it
skips is reported once, with its reason. OpenCode's database is followed beside the files
(:mod:`memfs.agents.opencode.follow`: its directory in the same inotify watch). Without inotify,
it looks again every half second.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import select
import signal
import struct
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from memfs.errors import MemfsError
from memfs.ingest.importer import ImportItem, Source
from memfs.ingest.inputs import LINK, NotRegular, discover, is_source_name, real_dir, source_roots
from memfs.store.config import DEFAULT_EVICT_TO, DEFAULT_MAX_LINE_BYTES

# --- inotify through ctypes --------------------------------------------------------------------

IN_MODIFY, IN_CLOSE_WRITE, IN_MOVED_TO, IN_CREATE = 0x2, 0x8, 0x80, 0x100
IN_DELETE_SELF, IN_Q_OVERFLOW, IN_IGNORED, IN_ISDIR = 0x400, 0x4000, 0x8000, 0x40000000
IN_ONLYDIR, IN_DONT_FOLLOW = 0x01000000, 0x02000000
IN_NONBLOCK, IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
_EVENT = struct.Struct("iIII")


class Inotify:
    """The few inotify calls :func:`follow` needs."""

    MASK = IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_DELETE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW

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
           evict_to: float = DEFAULT_EVICT_TO, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
           report: Callable[[ImportItem], None] | None = None, should_stop: Callable[[], bool] | None = None,
           poll_interval: float = 0.5, stores: Iterable[str | os.PathLike] = (),
           notice: Callable[[str], None] | None = None) -> None:
    """Import what ``dirs`` hold, then keep appending what tools add, until SIGINT/SIGTERM
    (or ``should_stop()``). Appends use ``write`` durability: each line reaches the log as
    it is appended. ``report`` is called with every batch that appended or refused lines.
    ``stores``: OpenCode databases, followed too (:mod:`memfs.agents.opencode.follow`).
    Without inotify (or a watch refused) it polls, and says so once through ``notice``."""
    from memfs.agents.opencode.follow import POLL_UNWATCHED, StoreFollower

    stop = False

    def on_signal(signum, frame):
        nonlocal stop
        stop = True

    def say(text: str) -> None:
        if notice is not None:
            notice(text)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    ino: Inotify | None
    try:
        ino = Inotify()
    except OSError as exc:
        ino = None
        say(f"inotify unavailable ({exc.strerror}): checking for changes every {POLL_UNWATCHED:g} s")
    followers = [StoreFollower(root, Path(db), report=report or (lambda item: None), max_events=max_events,
                               evict_to=evict_to) for db in stores]
    sources: dict[str, Source] = {}
    said: set[str] = set()  # what was reported as skipped
    try:
        def watch_tree(top: Path) -> None:
            if ino is None or not real_dir(top):
                return
            ino.watch(top)
            for parent, subdirs, _files in os.walk(top):  # (os.walk never enters a linked directory)
                subdirs.sort()
                for sub in subdirs:
                    if real_dir(Path(parent) / sub):
                        ino.watch(Path(parent) / sub)

        def skip(path: Path, reason: str) -> None:
            if report and str(path) not in said:
                said.add(str(path))
                report(ImportItem(str(path), status="skipped", reason=reason))

        def found(paths: list[Path]) -> list[Path]:
            skipped: list[tuple[Path, str]] = []
            files = discover(paths, skipped)
            for path, reason in skipped:
                skip(path, reason)
            return files

        def process(path: Path) -> None:
            key = str(path.resolve())
            source = sources.get(key)
            if source is None or source.compressed:  # (a compressed file is read whole again when it changes)
                source = sources[key] = Source(path, fmt, max_line_bytes=max_line_bytes)
            item = ImportItem(str(path))
            try:
                if not source.prepare(root):
                    return
                source.run(root, item, dry_run=False, durability="write", max_events=max_events, evict_to=evict_to)
            except NotRegular as exc:
                sources.pop(key, None)
                skip(path, str(exc))
                return
            except (MemfsError, OSError) as exc:
                item.status, item.reason = "error", str(exc)
                source.entry = None  # start over from the sidecar next time
            if report and (item.lines or item.status in ("error", "changed")):
                report(item)

        def wanted(path: Path) -> bool:
            return is_source_name(path.name) and any(path.is_relative_to(r) for t in tops for r in source_roots(t))

        tops = [Path(d) for d in dirs]
        for top in tops:
            if not real_dir(top):
                raise NotADirectoryError(errno.ENOTDIR, LINK if top.is_symlink() else "Not a directory", str(top))
        for f in followers:  # (before the trees: a tree holding a data directory names it as it does)
            if (problem := f.watch(ino)) is not None:
                say(problem)
        watched = {f.dir: f for f in followers}
        trees = [Path(os.path.abspath(t)) for t in tops]
        for top in dict.fromkeys([*tops, *(r for t in tops for r in source_roots(t))]):
            watch_tree(top)
        for path in found(tops):
            process(path)
        rescan = 0.0  # (without inotify: when to look at the files again)
        while not stop and not (should_stop and should_stop()):
            for f in followers:
                f.step(time.monotonic())
            timeout = poll_interval
            if followers:
                timeout = max(0.0, min(timeout, min(f.due() for f in followers) - time.monotonic()))
            if ino is None:
                time.sleep(timeout)
                if tops and time.monotonic() >= rescan:
                    rescan = time.monotonic() + POLL_UNWATCHED
                    for path in found(tops):
                        process(path)
                continue
            for directory, mask, name in ino.read(timeout):
                if mask & IN_Q_OVERFLOW:
                    for f in followers:
                        f.touched(f.db.name, time.monotonic())
                    for path in found(tops):
                        process(path)
                    continue
                if directory is None or not name:
                    continue
                here = Path(os.path.abspath(directory))
                if here in watched:
                    watched[here].touched(name, time.monotonic())
                    if not any(here.is_relative_to(t) for t in trees):
                        continue  # (a data directory only: its other files are not sources)
                path = directory / name
                if mask & IN_ISDIR:
                    if mask & (IN_CREATE | IN_MOVED_TO):
                        watch_tree(path)
                        for p in found([path]):
                            if wanted(p):
                                process(p)
                elif wanted(path) and os.path.lexists(path):
                    process(path)
    finally:
        if ino is not None:
            ino.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
