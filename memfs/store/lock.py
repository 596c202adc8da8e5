"""The liveness lock, ``session.lock`` (SPEC §3.5, §3.6).

An exclusive, non-blocking BSD ``flock`` (through portalocker, whose POSIX locker is
``fcntl.flock``) held while a process is a session's writer — from its first change until it
has been idle for a while (:mod:`memfs.store.session`), never for reading. flock locks belong
to the open file description, so a probe from the same process on a fresh descriptor also
sees the lock as held — which is what :func:`is_live` relies on.

The holder writes ``{"pid": …, "host": …}`` into the file once it holds the lock, so a writer
that is refused can say who holds it (:class:`SessionBusy`'s reason names the pid). The
content is a hint for people: liveness is the flock alone, and a file left by a holder that
died names a process that no longer holds anything.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import BinaryIO

import orjson

from memfs.errors import SessionBusy, SymlinkRefused
from memfs.store.paths import LOCK, open_nofollow


def _portalocker():
    """portalocker, imported at the first lock (it loads importlib.metadata: a cost the commands
    that only read the catalog do not pay)."""
    import portalocker

    return portalocker


def _lock(handle: BinaryIO) -> bool:
    """Take an exclusive flock without blocking; False when another open file holds it."""
    portalocker = _portalocker()
    try:
        portalocker.lock(handle, portalocker.LockFlags.EXCLUSIVE | portalocker.LockFlags.NON_BLOCKING)
    except portalocker.exceptions.LockException:
        return False
    return True


def acquire(session_dir: Path) -> BinaryIO:
    """Create ``session.lock`` (0600, empty) if absent and take it; return the held file.

    Raises :class:`SessionBusy` when another open file description holds it.
    """
    fd = open_nofollow(session_dir / LOCK, os.O_RDWR | os.O_CREAT)
    handle = os.fdopen(fd, "rb", buffering=0)
    if not _lock(handle):
        who = describe_holder(os.pread(fd, 4096, 0))
        handle.close()
        raise SessionBusy(f"session {session_dir.name} is being written by {who}") from None
    try:  # who holds it, for the next writer's message (a hint: the flock is what counts)
        holder = orjson.dumps({"pid": os.getpid(), "host": socket.gethostname()}) + b"\n"
        os.pwrite(fd, holder, 0)
        if os.fstat(fd).st_size > len(holder):  # (a new file's truncation would cost a journal handle)
            os.ftruncate(fd, len(holder))
    except OSError:
        pass  # a full disk must not stop a writer: the file stays as it was
    return handle


def describe_holder(content: bytes) -> str:
    """``process PID on HOST`` from a lock file's content, or ``another process``."""
    try:
        holder = orjson.loads(content)
        pid, host = holder["pid"], holder.get("host")
    except (orjson.JSONDecodeError, TypeError, KeyError):
        return "another process"
    return f"process {pid}" + (f" on {host}" if host and host != socket.gethostname() else "")


def release(handle: BinaryIO) -> None:
    """Release and close a lock taken by :func:`acquire`."""
    try:
        _portalocker().unlock(handle)
    finally:
        handle.close()


def is_live(session_dir: Path) -> bool:
    """Whether some process holds the session open.

    Lock file missing → not live; cannot open → live (fail safe); lock would block → live;
    lock acquired → not live (released at once).
    """
    path = Path(session_dir) / LOCK
    if not os.path.lexists(path):
        return False
    try:
        fd = open_nofollow(path, os.O_RDONLY)
    except (OSError, SymlinkRefused):
        return True
    with os.fdopen(fd, "rb", buffering=0) as handle:
        if not _lock(handle):
            return True
        _portalocker().unlock(handle)
        return False
