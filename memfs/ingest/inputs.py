"""Finding and reading the files ``memfs import`` is given — untrusted input (SPEC §10).

* **Only regular files, reached without following a link.** Discovery looks at each entry
  without following it (``lstat``, the directory entry's type) and never descends into a
  symbolically linked directory; every open is ``O_NOFOLLOW|O_NONBLOCK`` and is then checked
  with ``fstat`` (:func:`open_source`), so a file replaced by a link, a FIFO or a device
  between the listing and the read is refused too, and a FIFO never blocks the import. What is
  not read is *skipped*, with its reason (:class:`NotRegular`), never silently: a symbolic
  link (to a file or a directory), a FIFO, a socket, a device — a top-level argument as well
  as an entry found under a directory (there, a link or special file is reported when its
  name is a source's, ``*.jsonl``/``*.jsonl.zst``, and a linked directory always).
* **Bounded reads.** A compressed source (``*.jsonl.zst``) is decompressed as a stream, in
  :data:`CHUNK` pieces, at most ``limit`` bytes in all (:class:`InputTooLarge` past it), with
  a decoder window of at most :data:`MAX_WINDOW` (a frame asking for more is refused rather
  than allocated). The lines of a source are cut by :class:`memfs.store.lines.LineSplitter`
  (:class:`SourceLines`): a line over ``max_line_bytes`` is counted and hashed, never held.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from memfs.errors import MemfsError
from memfs.store.lines import LineSplitter, LongLine

if TYPE_CHECKING:
    from hashlib import _Hash

CHUNK = 1 << 20
MAX_DECOMPRESSED = 1 << 30  # bytes a compressed source may decompress to
MAX_WINDOW = 1 << 25  # the largest zstd window a compressed source may ask for (32 MiB; zstd -19 uses 8)
LINK = "a symbolic link; not followed"


class NotRegular(MemfsError):
    """A source that is not a regular file reached without following a link: skipped, with
    this reason."""


class InputTooLarge(MemfsError):
    """A compressed source decompresses to more than the limit (or cannot be decompressed)."""


def kind(mode: int) -> str:
    """What a non-regular file is, for a reason."""
    if stat.S_ISLNK(mode):
        return LINK
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return f"{name}, not a regular file; not read"
    return "not a regular file; not read"


def open_source(path: str | os.PathLike) -> BinaryIO:
    """``path`` opened for reading, if it is a regular file reached without following a link
    in its last component; else :class:`NotRegular` (nothing read, nothing waited for)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotRegular(LINK) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegular(kind(st.st_mode))
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def stat_source(path: str | os.PathLike) -> os.stat_result:
    """The ``fstat`` of :func:`open_source`'s file."""
    with open_source(path) as f:
        return os.fstat(f.fileno())


def compressed(path: Path) -> bool:
    return path.name.endswith(".zst")


class Limited:
    """A reader of a zstd stream that refuses to give more than ``limit`` bytes."""

    def __init__(self, path: Path, limit: int):
        import zstandard

        self.zstd_error = zstandard.ZstdError
        self.path, self.limit, self.total = path, limit, 0
        raw = open_source(path)
        try:
            self.inner = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW).stream_reader(
                raw, read_across_frames=True, closefd=True)
        except BaseException:
            raw.close()
            raise

    def read(self, n: int) -> bytes:
        try:
            data = self.inner.read(n)
        except self.zstd_error as exc:  # a corrupt or truncated stream, a window over MAX_WINDOW
            raise InputTooLarge(f"{self.path}: cannot decompress: {exc}") from None
        self.total += len(data)
        if self.total > self.limit:
            raise InputTooLarge(f"{self.path}: decompresses to more than {self.limit} bytes, the limit; refused")
        return data

    def close(self) -> None:
        self.inner.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_input(path: Path, limit: int = MAX_DECOMPRESSED):
    """The source's bytes: the file, or its decompressed content for ``*.zst`` (at most
    ``limit`` bytes: :class:`InputTooLarge` past it); :class:`NotRegular` for anything but a
    regular file reached without following a link."""
    return Limited(path, limit) if compressed(path) else open_source(path)


class SourceLines:
    """The complete lines of ``f`` (read on from ``offset``), in one batch per chunk read:
    iterating gives ``(lines, nread)``; a line over ``max_line`` is a :class:`LongLine`. An
    unterminated tail is left out. :attr:`offset` is where the consumed lines end, and
    :attr:`hasher` (when given: the SHA-256 of the bytes before ``offset``) follows it: it
    covers exactly the consumed prefix, the bytes of a skipped long line included."""

    def __init__(self, f, max_line: int, offset: int = 0, hasher: _Hash | None = None):
        self.f, self.max_line, self.offset, self.hasher = f, max_line, offset, hasher

    def __iter__(self) -> Iterator[tuple[list[bytes | LongLine], int]]:
        splitter = LineSplitter(self.max_line)
        read = self.offset
        running = self.hasher.copy() if self.hasher is not None else None
        while data := self.f.read(CHUNK):
            read += len(data)
            lines = splitter.feed(data)
            if running is not None:
                last = data.rfind(b"\n")
                if last < 0:
                    running.update(data)
                else:
                    view = memoryview(data)
                    running.update(view[:last + 1])
                    self.hasher = running.copy()
                    running.update(view[last + 1:])
            if lines:
                self.offset = read - splitter.pending
            yield lines, len(data)

    def drain(self) -> None:
        for _ in self:
            pass


# --- discovery --------------------------------------------------------------------------------


def is_source_name(name: str) -> bool:
    return name.endswith(".jsonl") or name.endswith(".jsonl.zst")


def real_dir(path: Path) -> bool:
    """``path`` is a directory itself (not a link to one)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def source_roots(top: Path) -> list[Path]:
    """Where the files of a directory given to import are: a Codex home (it holds
    ``sessions/`` or ``archived_sessions/``) → those two; a Codex ``sessions`` folder → it and
    its sibling ``archived_sessions``; a Claude Code home (``.claude`` holding ``projects/``)
    → ``projects/``; anything else → itself. (Linked directories are not followed.)"""
    if top.name == ".claude" and real_dir(top / "projects"):
        return [top / "projects"]
    homes = [top / "sessions", top / "archived_sessions"]
    if any(real_dir(p) for p in homes):
        return [p for p in homes if real_dir(p)]
    if top.name == "sessions" and real_dir(top.parent / "archived_sessions"):
        return [top, top.parent / "archived_sessions"]
    return [top]


def _walk(top: Path, files: list[tuple[Path, str]], skipped: list[tuple[Path, str]]) -> None:
    """The source files under ``top`` (into ``files``, with their resolved paths: ``top``'s,
    resolved once, and the names below, none of them a link) and what is not read there (into
    ``skipped``), never through a link."""
    stack = [(str(top), str(top.resolve()))]
    while stack:
        d, resolved = stack.pop()
        try:
            with os.scandir(d) as it:
                entries = list(it)
        except OSError as exc:
            skipped.append((Path(d), f"cannot list: {exc.strerror}"))
            continue
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    stack.append((e.path, f"{resolved}/{e.name}"))
                elif e.is_symlink():
                    if is_source_name(e.name) or os.path.isdir(e.path):
                        skipped.append((Path(e.path), LINK))
                elif is_source_name(e.name):
                    if e.is_file(follow_symlinks=False):
                        files.append((Path(e.path), f"{resolved}/{e.name}"))
                    else:
                        skipped.append((Path(e.path), kind(e.stat(follow_symlinks=False).st_mode)))
            except OSError as exc:  # gone meanwhile
                skipped.append((Path(e.path), exc.strerror or str(exc)))


def discover(paths: Iterable[str | os.PathLike], skipped: list[tuple[Path, str]] | None = None,
             keys: dict[Path, str] | None = None) -> list[Path]:
    """The files to import: each FILE as given, and every ``*.jsonl`` / ``*.jsonl.zst`` under
    each DIR (see :func:`source_roots`), each once; a sub-agent's file after its parent's.
    What is not read (see the module) goes to ``skipped`` as ``(path, reason)``; each file's
    resolved path (what identifies a source) to ``keys``. (A file found under a directory was
    reached through no link: its resolved path is the directory's, resolved once, joined with
    the rest.)"""
    found: list[Path] = []
    seen: set[str] = set()
    skipped = [] if skipped is None else skipped
    keys = {} if keys is None else keys
    for p in map(Path, paths):
        mode = os.lstat(p).st_mode  # (FileNotFoundError for a path that is not there)
        if stat.S_ISDIR(mode):
            named: list[tuple[Path, str]] = []
            for root in source_roots(p):
                _walk(root, named, skipped)
            named.sort(key=lambda f: (f[0].parent.name == "subagents", str(f[0])))
        elif stat.S_ISREG(mode):
            named = [(p, str(p.resolve()))]
        else:
            skipped.append((p, kind(mode)))
            named = []
        for q, key in named:
            if key not in seen:
                seen.add(key)
                keys[q] = key
                found.append(q)
    return found
