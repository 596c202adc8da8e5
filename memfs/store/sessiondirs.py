"""The session folders of a store's root, as the directory says: which entries are sessions, their
names, and one session's folder. The catalog (:mod:`memfs.store.catalog`) and whatever must not
trust it (a rebuild, the importer's identity, a replica) read the root through these."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

from memfs.errors import NotFound
from memfs.store.paths import EVENTS, MANIFEST, refuse_symlink, sanitize


def _holds_session(path: str) -> bool:
    """The folder at ``path`` holds a log or a manifest."""
    return os.path.lexists(os.path.join(path, EVENTS)) or os.path.lexists(os.path.join(path, MANIFEST))


def is_session_dir(path: Path) -> bool:
    """A real (not symlinked) directory holding a log or a manifest."""
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return False
    except OSError:
        return False
    return _holds_session(os.fspath(path))


def _scan(root: str | os.PathLike[str]) -> Iterator[os.DirEntry[str]]:
    """The entries of the sessions root in the directory's order, one at a time; none when it is
    absent. A symlinked root is refused."""
    refuse_symlink(Path(root))
    try:
        with os.scandir(os.fspath(root)) as it:
            yield from it
    except FileNotFoundError:
        return


def root_entries(root: str | os.PathLike[str]) -> list[os.DirEntry[str]]:
    """The entries of the sessions root, sorted by name; none when it is absent. A symlinked
    root is refused."""
    return sorted(_scan(root), key=lambda e: e.name)


def is_session_entry(entry: os.DirEntry) -> bool:
    """An entry of the root that may be a session: a real directory, not hidden."""
    return entry.is_dir(follow_symlinks=False) and not entry.name.startswith(".")


def session_names(root: str | os.PathLike) -> list[str]:
    """The directory names of the sessions under ``root``, sorted; none when it is absent.
    Symlinks and stray files are not sessions. (:func:`is_session_dir` with the entry's own
    type for the directory's ``lstat``, and strings for paths: 10,000 names are listed often.)
    Names are interned: the mount's nodes, the catalog's listing and the search index then share
    one ``str`` per session."""
    # (one entry at a time: 100,000 held at once cost ~30 MiB)
    return sorted(sys.intern(e.name) for e in _scan(root) if is_session_entry(e) and _holds_session(e.path))


def find_session(root: str | os.PathLike, session: str) -> Path:
    """The directory of ``session`` (a raw id or a directory name) under ``root``.

    Raises :class:`NotFound` when there is none and :class:`SymlinkRefused` when it is a
    symlink.
    """
    path = Path(root) / sanitize(session)
    refuse_symlink(path)
    if not path.is_dir():
        raise NotFound(f"no session {session!r} in {root}")
    return path
