"""Audit packs (SPEC §7): a signed-off list of every file of a session folder, and its check.

``derived/audit-pack.json`` (pretty JSON)::

    {"schema_version": 1, "session_id": …, "generated_at": …, "status": …,
     "turn_count": …, "event_count": …, "entries": [{"path", "bytes", "sha256"}, …]}

``entries`` lists every regular file of the session folder, walked without following a
symlink (a symlink is neither listed nor followed), sorted by path; files named
``audit-pack.json`` are skipped, and so is the pack being written when it lies inside the
folder under another name — a pack never lists itself.

Verification re-walks the folder the same way and never opens a path taken from the pack:
entry paths only name what the walk is expected to find. An entry path that is empty,
absolute, or has an empty, ``.`` or ``..`` component (or a NUL) makes the pack invalid, as do
an unknown ``schema_version``, a malformed entry and a path listed twice. Changed files are
``mismatches``, vanished ones ``missing``, new ones ``unaccounted`` (informational):
``verified`` is true when the pack is valid, nothing mismatches and nothing is missing.

Decision: status and counts come from a read-only open of the session, i.e. what the log
says now even when the metadata on disk is stale; the files themselves (manifest included)
are hashed as they are on disk.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

import orjson

from memfs.store.session import open_session
from memfs.store.meta import now_rfc3339
from memfs.store.paths import DERIVED_DIR, atomic_write, ensure_private_dir, read_file
from memfs.store.catalog import find_session

PACK_NAME = "audit-pack.json"
PACK_SCHEMA_VERSION = 1
_HEX = frozenset("0123456789abcdef")


def walk_files(top: Path) -> Iterator[tuple[str, int, int]]:
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


def hash_file(dirfd: int, name: str) -> tuple[int, str]:
    """``(bytes, sha256 hex)`` of one file, opened without following a symlink."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dirfd)
    digest, size = hashlib.sha256(), 0
    try:
        while chunk := os.read(fd, 1 << 20):
            digest.update(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    return size, digest.hexdigest()


def _inside(session_dir: Path, pack_path: Path | None) -> str | None:
    """The pack file's path relative to the session folder, when it lies inside it."""
    if pack_path is None:
        return None
    rel = os.path.relpath(os.path.realpath(pack_path), os.path.realpath(session_dir))
    return None if rel == ".." or rel.startswith("../") else rel.replace(os.sep, "/")


def _listed(rel: str, own: str | None) -> bool:
    return rel.rsplit("/", 1)[-1] != PACK_NAME and rel != own


def build_pack(root: str | os.PathLike, session: str, *, exclude: Path | None = None) -> dict:
    """The audit pack of a session as a dict (nothing is written)."""
    session_dir = find_session(root, session)
    own = _inside(session_dir, exclude)
    entries = []
    for rel, dirfd, name in walk_files(session_dir):
        if _listed(rel, own):
            size, digest = hash_file(dirfd, name)
            entries.append({"path": rel, "bytes": size, "sha256": digest})
    entries.sort(key=lambda e: e["path"])
    with open_session(root, session_dir.name, read_only=True) as handle:
        manifest = handle.manifest
    return {
        "schema_version": PACK_SCHEMA_VERSION,
        "session_id": manifest["session_id"],
        "generated_at": now_rfc3339(),
        "status": manifest["status"],
        "turn_count": manifest["turn_count"],
        "event_count": manifest["event_count"],
        "entries": entries,
    }


def create_pack(root: str | os.PathLike, session: str, output: str | os.PathLike | None = None) -> tuple[Path, dict]:
    """Write the session's audit pack (atomically) to ``output`` or the default path; return
    where it went and what it holds."""
    session_dir = find_session(root, session)
    if output is None:
        ensure_private_dir(session_dir / DERIVED_DIR)
        target = session_dir / DERIVED_DIR / PACK_NAME
    else:
        target = Path(output)
    pack = build_pack(root, session, exclude=target)
    atomic_write(target, orjson.dumps(pack, option=orjson.OPT_INDENT_2) + b"\n")
    return target, pack


@dataclass(slots=True)
class Verification:
    """The outcome of :func:`verify_pack`."""

    pack_path: str
    valid: bool
    verified: bool = False
    reason: str = ""  # why the pack is invalid
    session_id: str | None = None
    checked: int = 0  # entries compared
    mismatches: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unaccounted: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def safe_entry_path(path: object) -> bool:
    """A canonical relative path: non-empty, not absolute, no empty/``.``/``..`` component."""
    if type(path) is not str or not path or path.startswith("/") or "\x00" in path or "\\" in path:
        return False
    return all(part not in ("", ".", "..") for part in path.split("/"))


def parse_pack(data: bytes) -> tuple[dict, dict[str, tuple[int, str]]] | str:
    """The pack object and its entries by path, or the reason it is invalid."""
    try:
        pack = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        return f"not valid JSON: {exc}"
    if type(pack) is not dict:
        return "not a JSON object"
    version = pack.get("schema_version")
    if type(version) is not int or version != PACK_SCHEMA_VERSION:
        return f"unknown schema_version {version!r} (this memfs reads {PACK_SCHEMA_VERSION})"
    entries = pack.get("entries")
    if type(entries) is not list:
        return '"entries" must be a list'
    expected: dict[str, tuple[int, str]] = {}
    for i, entry in enumerate(entries):
        if type(entry) is not dict:
            return f"entry {i} is not an object"
        path, size, digest = entry.get("path"), entry.get("bytes"), entry.get("sha256")
        if not safe_entry_path(path):
            return f"entry {i} has an unsafe path {path!r}"
        if type(size) is not int or size < 0:
            return f"entry {path!r}: bytes must be a non-negative integer"
        if type(digest) is not str or len(digest) != 64 or not set(digest) <= _HEX:
            return f"entry {path!r}: sha256 must be 64 lowercase hex digits"
        if path in expected:
            return f"entry {path!r} is listed twice"
        expected[path] = (size, digest)
    return pack, expected


def verify_pack(root: str | os.PathLike, session: str, pack_file: str | os.PathLike | None = None) -> Verification:
    """Check a session folder against its audit pack (default ``derived/audit-pack.json``).

    A pack file that cannot be read raises ``OSError``; an invalid one gives
    ``valid=False`` with the reason.
    """
    session_dir = find_session(root, session)
    pack_path = Path(pack_file) if pack_file is not None else session_dir / DERIVED_DIR / PACK_NAME
    parsed = parse_pack(read_file(pack_path))
    if isinstance(parsed, str):
        return Verification(str(pack_path), valid=False, reason=parsed)
    pack, expected = parsed
    result = Verification(str(pack_path), valid=True, session_id=pack.get("session_id"))
    own = _inside(session_dir, pack_path)
    seen = set()
    for rel, dirfd, name in walk_files(session_dir):
        if not _listed(rel, own):
            continue
        want = expected.get(rel)
        if want is None:
            result.unaccounted.append(rel)
            continue
        seen.add(rel)
        result.checked += 1
        if hash_file(dirfd, name) != want:
            result.mismatches.append(rel)
    result.missing = sorted(set(expected) - seen)
    result.mismatches.sort()
    result.unaccounted.sort()
    result.verified = not result.mismatches and not result.missing
    return result
