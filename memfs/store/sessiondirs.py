"""The session folders of a store's root, as the directory says: which entries are sessions, their
names, and one session's folder. The catalog (:mod:`memfs.store.catalog`) and whatever must not
trust it (a rebuild, the importer's identity, a replica) read the root through these."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from memfs.errors import NotFound
from memfs.store.paths import EVENTS, MANIFEST, refuse_symlink, sanitize


def is_session_dir(path: Path) -> bool:
    """A real (not symlinked) directory holding a log or a manifest."""
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return False
    except OSError:
        return False
    return os.path.lexists(path / EVENTS) or os.path.lexists(path / MANIFEST)


def root_entries(root: str | os.PathLike[str]) -> list[os.DirEntry[str]]:
    """The entries of the sessions root, sorted by name; none when it is absent. A symlinked
    root is refused."""
    refuse_symlink(Path(root))
    try:
        with os.scandir(root) as it:
            return sorted(it, key=lambda e: e.name)
    except FileNotFoundError:
        return []


def is_session_entry(entry: os.DirEntry) -> bool:
    """An entry of the root that may be a session: a real directory, not hidden."""
    return entry.is_dir(follow_symlinks=False) and not entry.name.startswith(".")


def session_names(root: str | os.PathLike) -> list[str]:
    """The directory names of the sessions under ``root``, sorted; none when it is absent.
    Symlinks and stray files are not sessions. (:func:`is_session_dir` with the entry's own
    type for the directory's ``lstat``, and strings for paths: 10,000 names are listed often.)
    Names are interned: the mount's nodes, the catalog's listing and the search index then share
    one ``str`` per session."""
    lexists, join, intern = os.path.lexists, os.path.join, sys.intern
    refuse_symlink(Path(root))
    names = []
    try:
        with os.scandir(os.fspath(root)) as it:  # (one entry at a time: 100,000 held at once cost ~30 MiB)
            for e in it:
                if is_session_entry(e) and (lexists(join(e.path, EVENTS)) or lexists(join(e.path, MANIFEST))):
                    names.append(intern(e.name))
    except FileNotFoundError:
        return []
    names.sort()
    return names


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
