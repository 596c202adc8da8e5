"""Audit packs (SPEC §7): a signed-off list of every file of a session folder, and its check.

``derived/audit-pack.json`` (pretty JSON)::

    {"schema_version": 1, "session_id": …, "generated_at": …, "status": …,
     "turn_count": …, "event_count": …, "events_len": …, "events_sha256": …,
     "entries": [{"path", "bytes", "sha256"}, …]}

``entries`` lists every regular file of the session folder, walked without following a
symlink (a symlink is neither listed nor followed), sorted by path; files named
``audit-pack.json`` are skipped, and so is the pack being written when it lies inside the
folder under another name — a pack never lists itself — and ``session.lock``.
``events_len``/``events_sha256`` are the log as packed (the same bytes as its entry); the
header's counts and status are those of exactly those bytes.

Verification re-walks the folder the same way and never opens a path taken from the pack:
entry paths only name what the walk is expected to find. **Verify is strict** (a pack
vouches for the session). The pack is *invalid* when: it does not parse, its
``schema_version`` is unknown, an entry is malformed, unsafe (empty, absolute, an empty,
``.`` or ``..`` component, a NUL) or listed twice, it lists no files, it has no entry for
``events.jsonl``, or ``events_len``/``events_sha256`` disagree with that entry. A valid
pack is *verified* only when nothing mismatches, nothing is missing, nothing is
unaccounted, the header (``session_id``, ``event_count``, ``turn_count``, ``status``) agrees
with the files, and the pack file's own SHA-256 is the one given with ``--digest`` (if any).

Decisions recorded here:

* **``session.lock`` is not content**: it is empty or names whichever process last wrote
  the session (SPEC §3.6), so any writer — an append, ``fsck`` — rewrites it. It is neither
  listed nor checked (an entry for it in an older pack is ignored).
* **A log that only grew** (the packed bytes are an exact prefix of ``events.jsonl``)
  verifies as ``grown by N events``. The files memfs regenerates from the log
  (``manifest.json``, ``index/``, ``derived/``) then naturally differ or are new: they are
  listed as ``refreshed``, not as failures; everything else must still match. The header is
  checked against the packed prefix of the log (rescanned), so it cannot disagree with it.
* ``rejected.jsonl`` is append-only too: when its packed bytes are a prefix of it now, the
  refused lines added since are noted (``refreshed``), not a failure; so is a
  ``rejected.jsonl`` made since the pack (its packed bytes were none).
* The status in the header may read ``completed`` where the log implies ``active`` (the
  retention sweep marks abandoned sessions that way), as in fsck.
* ``session_id`` is checked against ``manifest.json``.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from memfs.store.machine import TurnState, renumber
from memfs.store.meta import now_rfc3339
from memfs.store.paths import (
    DERIVED_DIR,
    EVENTS,
    LOCK,
    MANIFEST,
    REJECTED,
    atomic_write,
    ensure_private_dir,
    hash_file,
    open_nofollow,
    read_file,
    walk_files,
)
from memfs.store.recovery import OpenReport, rescan
from memfs.store.session import open_session
from memfs.store.sessiondirs import find_session

PACK_NAME = "audit-pack.json"
PACK_SCHEMA_VERSION = 1
_HEX = frozenset("0123456789abcdef")


def _inside(session_dir: Path, pack_path: Path | None) -> str | None:
    """The pack file's path relative to the session folder, when it lies inside it."""
    if pack_path is None:
        return None
    rel = os.path.relpath(os.path.realpath(pack_path), os.path.realpath(session_dir))
    return None if rel == ".." or rel.startswith("../") else rel.replace(os.sep, "/")


def _listed(rel: str, own: str | None) -> bool:
    """Whether a file of the folder is content a pack vouches for (see the module docstring)."""
    return rel.rsplit("/", 1)[-1] != PACK_NAME and rel != own and rel != LOCK


def _prefix_state(session_dir: Path, length: int, base: int, report: OpenReport | None = None) -> TurnState:
    """The turn state of the log's first ``length`` bytes, turns numbered from ``base``."""
    fd = open_nofollow(session_dir / EVENTS, os.O_RDONLY)
    try:
        state = rescan(fd, length, OpenReport() if report is None else report)
    finally:
        os.close(fd)
    renumber(state, base)
    return state


def _events_grown(session_dir: Path, packed_len: int, now_len: int) -> int:
    """How many events were appended after the first ``packed_len`` bytes, when everything
    after them is whole, valid event lines; 0 otherwise (a torn or invalid tail is not
    growth, it is a change)."""
    fd = open_nofollow(session_dir / EVENTS, os.O_RDONLY)
    try:
        if os.pread(fd, 1, now_len - 1) != b"\n":
            return 0
    finally:
        os.close(fd)
    before, after = OpenReport(), OpenReport()
    old = _prefix_state(session_dir, packed_len, 1, before)
    new = _prefix_state(session_dir, now_len, 1, after)
    added = new.event_count - old.event_count
    if after.skipped_lines != before.skipped_lines or added != after.scanned_lines - before.scanned_lines:
        return 0
    return added


def build_pack(root: str | os.PathLike, session: str, *, exclude: Path | None = None) -> dict:
    """The audit pack of a session as a dict (nothing is written)."""
    session_dir = find_session(root, session)
    own = _inside(session_dir, exclude)
    with open_session(root, session_dir.name, read_only=True) as handle:
        manifest = handle.manifest
        live_len = handle.file_len
    entries: list[dict[str, Any]] = []
    for rel, dirfd, name in walk_files(session_dir):
        if _listed(rel, own):
            try:
                size, digest = hash_file(dirfd, name)
            except FileNotFoundError:  # replaced meanwhile (a writer's atomic replace of its temp)
                continue
            entries.append({"path": rel, "bytes": size, "sha256": digest})
    entries.sort(key=lambda e: e["path"])
    log: dict[str, Any] = next((e for e in entries if e["path"] == EVENTS),
                               {"bytes": 0, "sha256": hashlib.sha256().hexdigest()})
    # the header describes exactly the bytes hashed (a writer may have appended meanwhile)
    state = _prefix_state(session_dir, log["bytes"], manifest["retained_turn_base"]) \
        if os.path.lexists(session_dir / EVENTS) else TurnState()
    status = manifest["status"] if live_len == log["bytes"] else state.status
    return {
        "schema_version": PACK_SCHEMA_VERSION,
        "session_id": manifest["session_id"],
        "generated_at": now_rfc3339(),
        "status": status,
        "turn_count": state.turn_count,
        "event_count": state.event_count,
        "events_len": log["bytes"],
        "events_sha256": log["sha256"],
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


def pack_digest(path: str | os.PathLike) -> str:
    """SHA-256 (hex) of a pack file as it is on disk: what ``pack verify --digest`` checks."""
    return hashlib.sha256(read_file(Path(path))).hexdigest()


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
    header: list[str] = field(default_factory=list)  # header fields that disagree with the files
    refreshed: list[str] = field(default_factory=list)  # regenerated/grown since; not failures
    grown_events: int = 0  # events appended to the log since the pack (its bytes a prefix)
    pack_sha256: str = ""
    digest_ok: bool | None = None  # None: no --digest given

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


def _regenerated(rel: str) -> bool:
    """Files memfs rewrites from the log as it grows."""
    return rel == MANIFEST or rel.startswith(("index/", DERIVED_DIR + "/"))


def verify_pack(root: str | os.PathLike, session: str, pack_file: str | os.PathLike | None = None,
                digest: str | None = None) -> Verification:
    """Check a session folder against its audit pack (default ``derived/audit-pack.json``),
    strictly (see the module docstring); ``digest`` is the SHA-256 the pack file must have.

    A pack file that cannot be read raises ``OSError``; an invalid one gives
    ``valid=False`` with the reason.
    """
    session_dir = find_session(root, session)
    pack_path = Path(pack_file) if pack_file is not None else session_dir / DERIVED_DIR / PACK_NAME
    data = read_file(pack_path)
    result = Verification(str(pack_path), valid=False, pack_sha256=hashlib.sha256(data).hexdigest())
    if digest is not None:
        result.digest_ok = digest.strip().lower() == result.pack_sha256
    parsed = parse_pack(data)
    if isinstance(parsed, str):
        result.reason = parsed
        return result
    pack, expected = parsed
    result.session_id = pack.get("session_id")
    reason = _header_problem(pack, expected)
    if reason:
        result.reason = reason
        return result
    result.valid = True
    expected.pop(LOCK, None)  # (older packs listed it)
    own = _inside(session_dir, pack_path)
    log_len = expected[EVENTS][0]
    grown = False
    seen = set()
    for rel, dirfd, name in walk_files(session_dir):
        if not _listed(rel, own):
            continue
        want = expected.get(rel)
        if want is None:
            (result.refreshed if rel == REJECTED else result.unaccounted).append(rel)
            continue
        try:
            have = hash_file(dirfd, name)
        except FileNotFoundError:  # gone since the walk saw it: missing
            continue
        seen.add(rel)
        result.checked += 1
        if have == want:
            continue
        if rel in (EVENTS, REJECTED) and have[0] > want[0] and hash_file(dirfd, name, want[0]) == want:
            if rel == REJECTED:
                result.refreshed.append(rel)
                continue
            result.grown_events = _events_grown(session_dir, want[0], have[0])
            if result.grown_events:
                grown = True
                continue
        result.mismatches.append(rel)
    result.missing = sorted(set(expected) - seen)
    if grown:  # what memfs regenerates from the log is expected to differ, or be new
        for kind in ("mismatches", "unaccounted"):
            paths = getattr(result, kind)
            result.refreshed += [p for p in paths if _regenerated(p)]
            setattr(result, kind, [p for p in paths if not _regenerated(p)])
    if EVENTS not in result.missing and EVENTS not in result.mismatches:
        result.header = _header_disagreements(session_dir, pack, log_len)
    if not grown:
        result.grown_events = 0
    result.mismatches.sort()
    result.unaccounted.sort()
    result.refreshed.sort()
    result.verified = not (result.mismatches or result.missing or result.unaccounted or result.header) \
        and result.digest_ok is not False
    return result


def _header_problem(pack: dict, expected: dict[str, tuple[int, str]]) -> str:
    """Why a parsed pack cannot vouch for anything, or ''."""
    if not expected:
        return "the pack lists no files"
    if EVENTS not in expected:
        return f"the pack has no entry for {EVENTS}"
    size, digest = expected[EVENTS]
    if "events_len" in pack or "events_sha256" in pack:
        if pack.get("events_len") != size or pack.get("events_sha256") != digest:
            return f"events_len/events_sha256 disagree with the pack's {EVENTS} entry"
    for key in ("event_count", "turn_count"):
        if type(pack.get(key)) is not int:
            return f"{key} must be an integer"
    for key in ("session_id", "status"):
        if type(pack.get(key)) is not str:
            return f"{key} must be a string"
    return ""


def _header_disagreements(session_dir: Path, pack: dict, log_len: int) -> list[str]:
    """Header fields that disagree with the packed bytes of the log and the manifest."""
    diffs = []
    try:
        manifest = orjson.loads(read_file(session_dir / MANIFEST))
    except (OSError, orjson.JSONDecodeError):
        manifest = None
    if type(manifest) is not dict:
        return [f"{MANIFEST} is missing or unreadable"]
    if pack["session_id"] != manifest.get("session_id"):
        diffs.append(f"session_id is {pack['session_id']!r}, {MANIFEST} says {manifest.get('session_id')!r}")
    base = manifest.get("retained_turn_base")
    state = _prefix_state(session_dir, log_len, base if type(base) is int and base >= 1 else 1)
    for key, found in (("event_count", state.event_count), ("turn_count", state.turn_count)):
        if pack[key] != found:
            diffs.append(f"{key} is {pack[key]}, the log as packed says {found}")
    if pack["status"] != state.status and not (pack["status"] == "completed" and state.status == "active"):
        diffs.append(f"status is {pack['status']!r}, the log as packed says {state.status!r}")
    return diffs
