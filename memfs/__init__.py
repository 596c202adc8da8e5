"""memfs — an AI coding agent's session memory as a plain directory.

Library first: :func:`open_session` gives a validated, append-only session log; the
filesystem (``memfs.fs``) and the command line (``memfs.cli``) are thin skins over it.

The public names are exported lazily (PEP 562): ``import memfs.events`` loads the event
contract only, and the store is imported the first time one of its names is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memfs._lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "CapRewriteError": "memfs.errors",
    "LineTooLong": "memfs.errors",
    "MemfsError": "memfs.errors",
    "ReadOnlySession": "memfs.errors",
    "SessionBusy": "memfs.errors",
    "SessionClosed": "memfs.errors",
    "SymlinkRefused": "memfs.errors",
    "TurnNotFound": "memfs.errors",
    "ValidationError": "memfs.errors",
    "SessionHandle": "memfs.store.session",
    "open_session": "memfs.store.session",
    "is_live": "memfs.store.lock",
    "default_root": "memfs.store.paths",
    "sanitize": "memfs.store.paths",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # for type checkers and IDEs; at run time __getattr__ imports on first use
    # `X as X`: an explicit re-export (PEP 484), as __all__ above is computed and linters cannot read it
    from memfs.errors import CapRewriteError as CapRewriteError
    from memfs.errors import LineTooLong as LineTooLong
    from memfs.errors import MemfsError as MemfsError
    from memfs.errors import ReadOnlySession as ReadOnlySession
    from memfs.errors import SessionBusy as SessionBusy
    from memfs.errors import SessionClosed as SessionClosed
    from memfs.errors import SymlinkRefused as SymlinkRefused
    from memfs.errors import TurnNotFound as TurnNotFound
    from memfs.errors import ValidationError as ValidationError
    from memfs.store.lock import is_live as is_live
    from memfs.store.paths import default_root as default_root
    from memfs.store.paths import sanitize as sanitize
    from memfs.store.session import SessionHandle as SessionHandle
    from memfs.store.session import open_session as open_session


__getattr__ = lazy_exports(globals(), _EXPORTS)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
