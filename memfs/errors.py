"""The error types of memfs, shared by every layer.

Each error carries a one-line, human-readable reason (``str(err)``) and the errno name that
the filesystem adapter reports for it (``err.errno_name``). The mapping from these names to
numbers lives in ``memfs.fs.errors``; nothing below the filesystem layer deals in numbers.
"""

from __future__ import annotations


class MemfsError(Exception):
    """Base class: a refused or failed memfs operation with a one-line reason."""

    errno_name = "EIO"

    @property
    def reason(self) -> str:
        return str(self)


class ValidationError(MemfsError):
    """A line was refused by the event contract (SPEC §2); it went to ``rejected.jsonl``."""

    errno_name = "EBADMSG"
    accepted: int  # (set by an append call that raises it: its lines before the refused one, in the log)


class LineTooLong(ValidationError):
    """A line exceeded ``max_line_bytes``."""

    errno_name = "EFBIG"


class InvalidName(MemfsError):
    """A session name that is not already in sanitized form (SPEC §6 mkdir)."""

    errno_name = "EINVAL"


class NameTooLong(InvalidName):
    """A new session's name longer than a directory name may be (``NAME_MAX``)."""

    errno_name = "ENAMETOOLONG"


class IndexBuilding(MemfsError):
    """A root search asked while the store's search index is first built (in a process of its
    own: :mod:`memfs.search.elsewhere`): asked again later, it is answered."""

    errno_name = "EAGAIN"


class BadQuery(MemfsError):
    """A search file name with an unknown parameter or a bad value (SPEC §6 search names)."""

    errno_name = "EINVAL"


class AlreadyExists(MemfsError):
    """A session with that name exists."""

    errno_name = "EEXIST"


class NotEmpty(MemfsError):
    """A session that still holds events (or refused lines) cannot be removed."""

    errno_name = "ENOTEMPTY"


class SessionBusy(MemfsError):
    """Another process holds the session's liveness lock (SPEC §3.5–§3.6)."""

    errno_name = "EBUSY"


class SymlinkRefused(MemfsError):
    """A path inside the store is a symlink; memfs never follows one (SPEC §1)."""

    errno_name = "ELOOP"


class NotFound(MemfsError, LookupError):
    """No such session, view or file."""

    errno_name = "ENOENT"


class TurnNotFound(NotFound):
    """``reconstruct_turn(n)`` for a turn that never existed or was evicted."""


class ReadOnlySession(MemfsError):
    """A write was attempted through a read-only session handle."""

    errno_name = "EROFS"


class SessionClosed(MemfsError):
    """The handle was used after ``close()``."""

    errno_name = "EBADF"


class CapRewriteError(MemfsError):
    """The event cap could not be enforced (SPEC §3.7).

    The appended event itself is durable; the log is untouched and the cap is tried again
    after the next append.
    """

    errno_name = "EIO"
    accepted: int  # (set by an append call that raises it: its lines, committed)
