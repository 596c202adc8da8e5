"""The catalog of a sessions root: what a session directory is, listing and lookup (SPEC §1, §7).

The one place that knows it. A session is a direct child directory of the sessions root that
is a real directory (never a symlink), whose name is not hidden (``sanitize`` strips leading
dots, and ``memfs migrate`` assembles sessions in hidden folders), and that holds a log or a
manifest. The mount, the CLI, retention, fsck and pack all list and look up through here.
"""

from __future__ import annotations

import os
import stat
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
    Symlinks and stray files are not sessions."""
    root = Path(root)
    return [e.name for e in root_entries(root) if is_session_entry(e) and is_session_dir(root / e.name)]


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
