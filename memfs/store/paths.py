"""Paths and safe file primitives of the store (SPEC §1).

The one place that knows: how a session id becomes a directory name, where the default store
lives, how private directories and files are made, how files are opened without following a
symlink, and the one atomic-replace helper every metadata and derived file goes through.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memfs.errors import InvalidName, NameTooLong, SymlinkRefused
from memfs.pace import worker_started

if TYPE_CHECKING:  # (imported where used: most uses never need it)
    from concurrent.futures import Future

DIR_MODE = 0o700
FILE_MODE = 0o600

EVENTS = "events.jsonl"
MANIFEST = "manifest.json"
LOCK = "session.lock"
REJECTED = "rejected.jsonl"
PIN = "retention-pin.json"
INDEX_DIR = "index"
TURNS = "index/turns.json"
TURNS_CACHE = "index/turns.cache"  # memfs extension: see memfs.store.meta
CAP_MARKER = "index/pending-cap-rewrite.json"
TURN_TIMES = "index/turn-times.jsonl"  # memfs extension: see memfs.store.turntimes
IMPORT_SOURCES = "index/import-sources.json"  # memfs extension: see memfs.ingest.importer
DERIVED_DIR = "derived"

NAME_MAX = 255  # bytes of a directory name (Linux)

_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


def sanitize(session_id: str) -> str:
    """Session id → directory name: keep ``[A-Za-z0-9._-]``, ``_`` for any other character,
    strip leading dots, ``session`` when nothing is left."""
    name = "".join(c if c in _SAFE else "_" for c in session_id).lstrip(".")
    return name or "session"


def new_session_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be the directory name of a *new* session, or None when it can."""
    error = new_session_name_error(name)
    return None if error is None else str(error)


def new_session_name_error(name: str) -> InvalidName | None:
    """Why ``name`` cannot be the directory name of a *new* session, as the error to raise
    (:class:`NameTooLong` for a name over :data:`NAME_MAX` bytes), or None when it can.

    It must already be in sanitized form and must not begin with ``-`` (a name like ``-rf``
    reads as an option to every shell tool that is handed it). Existing sessions with such
    a name (made by another tool) stay readable; only creating one is refused. The one check
    of ``mkdir`` and of a session name taken from a cluster subject (SPEC §9).
    """
    if not name or name != sanitize(name):
        return InvalidName(f"invalid session name {name[:64]!r}: use letters, digits, '-', '_', '.' "
                           f"and no leading dot (e.g. {sanitize(name)[:64]!r})")
    if name.startswith("-"):
        return InvalidName(f"invalid session name {name[:64]!r}: it must not begin with '-' "
                           f"(e.g. {'_' + name.lstrip('-')[:63]!r})")
    if len(name) > NAME_MAX:  # (sanitized: one byte a character)
        return NameTooLong(f"invalid session name {name[:16]!r}…: {len(name)} bytes, over the limit of {NAME_MAX}")
    return None


def default_config_path() -> Path:
    """``$XDG_CONFIG_HOME/memfs/config.toml`` (``~/.config/memfs/config.toml``): the file every
    command and the mount read when ``--config`` is not given (SPEC §12; a relative
    ``XDG_CONFIG_HOME`` is ignored, as the XDG spec says)."""
    base = os.environ.get("XDG_CONFIG_HOME") or ""
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "memfs" / "config.toml"


def config_path(given: str | os.PathLike | None) -> Path | None:
    """The config file a command reads: ``--config``'s, else the default one when it exists."""
    if given:
        return Path(given)
    default = default_config_path()
    return default if default.exists() else None


def default_root() -> Path:
    """``$XDG_DATA_HOME/memfs/sessions`` (``~/.local/share/memfs/sessions``)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "memfs" / "sessions"


def workspace_root(workspace: str | os.PathLike) -> Path:
    """The sessions root of a VT Code workspace: ``DIR/.vtcode/sessions``."""
    return Path(workspace) / ".vtcode" / "sessions"


def refuse_symlink(path: Path) -> os.stat_result | None:
    """Raise :class:`SymlinkRefused` when ``path`` exists and is a symlink; return its
    ``lstat`` (None when it does not exist)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        raise SymlinkRefused(f"refusing symlink inside the store: {path}")
    return st


def assert_private_file(path: Path) -> None:
    """Refuse a symlink at ``path`` and re-assert mode 0600 on a regular file there."""
    st = refuse_symlink(path)
    if st is not None and stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) != FILE_MODE:
        os.chmod(path, FILE_MODE)


def ensure_private_dir(path: Path) -> None:
    """Create ``path`` (and parents) if needed; refuse a symlink; re-assert mode 0700."""
    st = refuse_symlink(path)
    if st is not None and stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == DIR_MODE:
        return
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise SymlinkRefused(f"not a directory: {path}")
    if stat.S_IMODE(st.st_mode) != DIR_MODE:
        os.chmod(path, DIR_MODE)


def open_nofollow(path: Path, flags: int, mode: int = FILE_MODE) -> int:
    """``os.open`` with ``O_NOFOLLOW|O_CLOEXEC``; a symlink becomes :class:`SymlinkRefused`.

    Files created or opened for writing get their mode re-asserted to 0600.
    """
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # the last component is a symlink
            raise SymlinkRefused(f"refusing symlink inside the store: {path}") from None
        raise
    if flags & (os.O_WRONLY | os.O_RDWR):
        try:
            if stat.S_IMODE(os.fstat(fd).st_mode) != mode:
                os.fchmod(fd, mode)
        except OSError:
            os.close(fd)
            raise
    return fd


READ_MIN, READ_MAX = 1 << 16, 1 << 20  # read_fd's reads: sized by the file, within these


def read_fd(fd: int) -> bytes:
    """Everything left to read from ``fd``, in reads sized by its ``fstat``: ``os.read`` allocates
    the size it is asked for, and a 1 MiB buffer per small file (manifests, ``about.json``) is an
    ``mmap``/``munmap`` pair each time."""
    try:
        size = os.fstat(fd).st_size
    except OSError:
        size = 0
    step = min(max(size + 1, READ_MIN), READ_MAX)
    chunks = []
    while chunk := os.read(fd, step):
        chunks.append(chunk)
    return b"".join(chunks)


def read_file(path: Path) -> bytes:
    """Read a whole (small) file without following a symlink."""
    fd = open_nofollow(path, os.O_RDONLY)
    try:
        return read_fd(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """``os.write`` until every byte is written (a short write is retried, not lost)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def atomic_write(path: Path, data: bytes | Callable[[int], None]) -> None:
    """Replace ``path`` atomically: temp file in the same dir (O_EXCL|O_NOFOLLOW, 0600),
    fsync, rename over the target, fsync the directory (so the rename itself survives a power
    loss). The target is never opened for writing in place.

    ``data`` is the new content, or a function that writes it to the temp file's fd (for
    content too large to hold in memory). The two halves are :func:`write_temp` and
    :func:`replace_with`, for a caller that prepares several replacements at once."""
    replace_with(write_temp(path, data), path)


def write_temp(path: Path, data: bytes | Callable[[int], None]) -> Path:
    """The first half of :func:`atomic_write`: the new content of ``path`` in a temp file
    beside it, on disk (fsynced); returns the temp file's path. Nothing is left on failure."""
    refuse_symlink(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")  # see _TEMP_NAME
    fd = open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        if callable(data):
            data(fd)
        else:
            write_all(fd, data)
        if not syncs_deferred():
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    return tmp


def replace_with(tmp: Path, path: Path) -> None:
    """The second half of :func:`atomic_write`: rename ``tmp`` over ``path`` and make the
    rename durable."""
    os.rename(tmp, path)
    fsync_dir(path.parent)


_pool = None  # a concurrent.futures.ThreadPoolExecutor, made on first use
_pool_pid = 0
_pool_lock = threading.Lock()
_pending = 0  # in_background calls not finished yet (under _pool_lock)


def in_background(fn: Callable, *args) -> Future:
    """Run ``fn(*args)`` on one of the store's worker threads: disk work that overlaps other
    work (a cap rewrite's syncs and copies) or that nobody needs to wait for (closing a
    replaced log's last descriptor, which frees its blocks: about a millisecond per few MB).
    A forked child gets its own threads; once the interpreter is shutting down (no new
    threads) ``fn`` runs here, now. Its outcome is the returned future's."""
    from concurrent.futures import ThreadPoolExecutor  # (not at import: most uses never need it)

    global _pool, _pool_pid, _pending
    with _pool_lock:
        if _pool is None or _pool_pid != os.getpid():  # (a forked child has no workers)
            _pool, _pool_pid, _pending = (ThreadPoolExecutor(max_workers=4, thread_name_prefix="memfs-store",
                                                             initializer=worker_started),  # (memfs.pace)
                                          os.getpid(), 0)
        try:
            future = _pool.submit(fn, *args)
        except RuntimeError:  # interpreter shutdown
            future = None
        else:
            _pending += 1
    if future is None:
        return run_now(fn, *args)
    future.add_done_callback(_finished)
    return future


def _finished(_future) -> None:
    global _pending
    with _pool_lock:
        _pending -= 1


def background_pending() -> int:
    """How many :func:`in_background` calls of this process have not finished: e.g. closes of
    replaced logs whose blocks a full disk is still waiting for."""
    return _pending


def run_now(fn: Callable, *args) -> Future:
    """``fn(*args)`` on this thread, now; its outcome as a finished future (what
    :func:`in_background` returns, for a caller that decides per call whether to overlap)."""
    from concurrent.futures import Future

    done: Future = Future()
    try:
        done.set_result(fn(*args))
    except Exception as exc:
        done.set_exception(exc)
    return done


def fsync_dir(path: Path) -> None:
    """Make the directory's entries (a rename, a new file) durable (in :func:`deferred_sync`:
    left to the :func:`sync_filesystem` that ends it)."""
    if syncs_deferred():
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- deferred durability (memfs import: docs/design.md "First import at the disk's pace") ----------

_deferred = 0  # depth of deferred_sync() in this process


@contextmanager
def deferred_sync(root: Path) -> Iterator[None]:
    """Within: the store's one write path runs as always — same files, same order, same atomic
    renames — but leaves out its per-file syncs (the temp file's ``fsync`` and the directory's
    in :func:`atomic_write`, the log's ``fdatasync`` before a metadata persist). Every write is
    in the page cache (a crash of the process loses nothing written), not yet on disk. On a
    normal exit it ends with one :func:`sync_filesystem` of ``root``'s filesystem, so
    everything written within is durable when it returns. Process-wide: for a command that
    owns its process (``memfs import``), never inside a mount. A caller whose bookkeeping
    claims durability (the import's sidecars) calls :func:`sync_filesystem` before writing it."""
    global _deferred
    _deferred += 1
    try:
        yield
    finally:
        _deferred -= 1
    sync_filesystem(root)


def syncs_deferred() -> bool:
    return _deferred > 0 and not _kept


_kept = 0  # depth of syncs_kept() in this process


@contextmanager
def syncs_kept() -> Iterator[None]:
    """Within: every sync runs, also inside :func:`deferred_sync` — for a step whose own crash
    safety rests on the order of its syncs (a cap rewrite, SPEC §3.7), not on the final one."""
    global _kept
    _kept += 1
    try:
        yield
    finally:
        _kept -= 1


_syncfs: Any = None  # libc's syncfs, once looked up (False: not available)


def sync_filesystem(path: Path) -> None:
    """Make everything written to the filesystem holding ``path`` durable: Linux
    ``syncfs(2)`` on it (one writeback and journal commit for all the files), else ``sync(2)``."""
    global _syncfs
    if _syncfs is None:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            _syncfs = libc.syncfs
            _syncfs.argtypes = [ctypes.c_int]
        except (OSError, AttributeError):
            _syncfs = False
    if _syncfs is False:
        os.sync()
        return
    path = Path(path)
    while not path.is_dir() and path.parent != path:  # (nothing made yet: the filesystem it would be on)
        path = path.parent
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if _syncfs(fd) != 0:
            import ctypes

            err = ctypes.get_errno()
            raise OSError(err, f"syncfs {path}: {os.strerror(err)}")
    finally:
        os.close(fd)


# The temp files atomic_write makes: ".<target name>.<pid>.<8 hex>.tmp".
_TEMP_NAME = re.compile(r"\..+\.([0-9]+)\.[0-9a-f]{8}\.tmp")


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (this process counts: another thread may be at work; a
    zombie does not)."""
    if pid == os.getpid():
        return True  # another thread of this process may be writing it right now
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, under another user
        pass
    try:  # a zombie has exited (and released its files and locks); only its parent has not looked
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def remove_stale_temps(session_dir: Path) -> int:
    """Delete the temp files :func:`atomic_write` left behind in a session folder (and its
    subfolders) when its process died mid-write (kill -9, a crash); return how many.

    A temp file is stale when the process named in it is gone; one whose writer still runs
    is left alone. The walk follows no symlink and deletes only regular files, by directory
    descriptor. A missing folder has none.
    """
    removed = 0
    if not os.path.isdir(session_dir) or os.path.islink(session_dir):
        return 0
    for _dirpath, _dirs, files, dirfd in os.fwalk(session_dir, follow_symlinks=False):
        for name in files:
            m = _TEMP_NAME.fullmatch(name)
            if m is None or pid_alive(int(m.group(1))):
                continue
            try:
                if stat.S_ISREG(os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_mode):
                    os.unlink(name, dir_fd=dirfd)
                    removed += 1
            except FileNotFoundError:
                continue
    return removed


def remove_file(path: Path) -> bool:
    """Unlink a regular file (never through a symlink: the link itself is what goes)."""
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False


def remove_tree(path: Path) -> None:
    """Delete a directory tree without following any symlink.

    ``path`` itself must be a real directory. ``shutil.rmtree`` walks by directory file
    descriptors, so a directory swapped for a symlink mid-walk is not followed either.
    """
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise SymlinkRefused(f"not a real directory: {path}")
    import shutil  # (here: a command that removes nothing does not load it)

    if not shutil.rmtree.avoids_symlink_attacks:  # no fd-based walk here: refuse, don't risk it
        raise OSError("refusing to delete: this platform's rmtree may follow symlinks")
    shutil.rmtree(path)


def walk_files(top: Path) -> Iterator[tuple[str, int, str]]:
    """Yield ``(relative posix path, dir_fd, name)`` for every regular file under ``top``.

    Uses ``os.fwalk`` (directory file descriptors, symlinks never followed), so a directory
    swapped for a symlink mid-walk cannot lead outside. ``dir_fd`` is valid only until the
    next item is requested.
    """
    for dirpath, _dirs, files, dirfd in os.fwalk(top, follow_symlinks=False):
        rel_dir = os.path.relpath(dirpath, top)
        for name in sorted(files):
            try:
                st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                rel = name if rel_dir == "." else f"{rel_dir}/{name}".replace(os.sep, "/")
                yield rel, dirfd, name


def tree_bytes(top: Path) -> int:
    """Total size of the regular files under ``top`` (symlinks not followed)."""
    total = 0
    for _rel, dirfd, name in walk_files(top):
        total += os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_size
    return total


def hash_file(dirfd: int, name: str, limit: int | None = None) -> tuple[int, str]:
    """``(bytes, sha256 hex)`` of one file (of its first ``limit`` bytes when given), opened
    without following a symlink; streamed, never held whole."""
    import hashlib  # (here: a command that hashes nothing does not load it)

    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dirfd)
    digest, size = hashlib.sha256(), 0
    try:
        while limit is None or size < limit:
            chunk = os.read(fd, 1 << 20 if limit is None else min(1 << 20, limit - size))
            if not chunk:
                break
            digest.update(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    return size, digest.hexdigest()
