"""memfs — an AI coding agent's session memory as a plain directory.

Library first: :func:`open_session` gives a validated, append-only session log; the
filesystem (``memfs.fs``) and the command line (``memfs.cli``) are thin skins over it.
"""

from memfs.errors import (
    CapRewriteError,
    LineTooLong,
    MemfsError,
    ReadOnlySession,
    SessionBusy,
    SessionClosed,
    SymlinkRefused,
    TurnNotFound,
    ValidationError,
)
from memfs.store.lock import is_live
from memfs.store.log import SessionHandle, open_session
from memfs.store.paths import default_root, sanitize

__version__ = "0.1.0"

__all__ = [
    "CapRewriteError",
    "LineTooLong",
    "MemfsError",
    "ReadOnlySession",
    "SessionBusy",
    "SessionClosed",
    "SessionHandle",
    "SymlinkRefused",
    "TurnNotFound",
    "ValidationError",
    "default_root",
    "is_live",
    "open_session",
    "sanitize",
]
