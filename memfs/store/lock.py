"""The liveness lock, ``session.lock`` (SPEC §3.6).

An exclusive, non-blocking BSD ``flock`` (through portalocker, whose POSIX locker is
``fcntl.flock``) held while a process has a session open for writing. flock locks belong to
the open file description, so a probe from the same process on a fresh descriptor also sees
the lock as held — which is what :func:`is_live` relies on.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

import portalocker

from memfs.errors import SessionBusy, SymlinkRefused
from memfs.store.paths import LOCK, open_nofollow

_FLAGS = portalocker.LockFlags.EXCLUSIVE | portalocker.LockFlags.NON_BLOCKING


def acquire(session_dir: Path) -> BinaryIO:
    """Create ``session.lock`` (0600, empty) if absent and take it; return the held file.

    Raises :class:`SessionBusy` when another open file description holds it.
    """
    fd = open_nofollow(session_dir / LOCK, os.O_RDWR | os.O_CREAT)
    handle = os.fdopen(fd, "rb", buffering=0)
    try:
        portalocker.lock(handle, _FLAGS)
    except portalocker.exceptions.LockException:
        handle.close()
        raise SessionBusy(f"session {session_dir.name} is open for writing by another process") from None
    return handle


def release(handle: BinaryIO) -> None:
    """Release and close a lock taken by :func:`acquire`."""
    try:
        portalocker.unlock(handle)
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
        try:
            portalocker.lock(handle, _FLAGS)
        except portalocker.exceptions.LockException:
            return True
        portalocker.unlock(handle)
        return False
