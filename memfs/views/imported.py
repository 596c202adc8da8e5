"""Sessions made by ``memfs migrate``: their imported legacy files stay part of the views.

SPEC §7 makes a legacy ``.vtcode/history/<stem>.json`` a session "whose
``derived/memory.json`` is that file", and a legacy ``.vtcode/logs/<stem>.jsonl`` a session
whose ``derived/trajectory.jsonl`` is that file. The log of such a session starts empty, so a
view computed from the log alone would replace the imported history with an empty one (and
search, fed by the memory view's facts, would stop finding it). :func:`load_imported` reads
the import once per rebuild of the fold, and the views serve and extend it.

Decisions recorded here where the spec is silent:

* The source of truth is the verbatim copy ``<session>/imported/<file name>`` that migrate
  keeps — not ``derived/`` (rewritten by the views), nor the manifest's ``imported_from``
  (the store's metadata writer does not keep extra fields past the first append). Which view
  a file stands for is :func:`memfs.store.migrate.imported_view` (``.json`` → memory,
  ``.jsonl`` → trajectory). Migrate writes one file per session; were there several for one
  view, the first by name is used. A symlinked ``imported/`` or file, or anything but a
  regular file, is ignored; an unreadable one counts as absent.
* **No events yet** (no accepted line in the log, nothing ever evicted): ``memory.json`` and
  ``trajectory.jsonl`` are the imported file, byte for byte.
* **Once the log has events**, the views are computed as usual, and:

  - ``grounded_facts`` begin with the imported facts, before eviction-summary facts and the
    log's: in their order, normalized again (SPEC §4.1), empty ones and exact duplicates
    dropped (across the whole list, first occurrence wins). Mapping of an imported
    ``grounded_facts`` entry: an object with a string ``fact`` keeps ``fact``, ``turn`` and
    ``offset`` when they are integers (else null; they number the *legacy* session's turns and
    bytes, not this log's) and ``type`` when it is a string (else ``"imported"``); a bare
    string is a fact with null ``turn``/``offset`` and type ``"imported"``; anything else is
    skipped. Each imported fact gets an extra ``"imported"`` field, the imported file's name
    (as evicted facts get ``"summary"``). The same facts, in the same order, feed search
    (:func:`memfs.views.memory_facts`) before and after the first event, so a fact's index —
    its search ``chunk_id`` — never changes; while the file is served verbatim, that index
    matches its ``grounded_facts`` entry whenever the legacy list was already normalized and
    deduplicated (VT Code's own rules, the same as ours).
  - ``summary`` is the imported one until a turn of this log closes;
  - ``touched_files`` is the sorted union of the imported ``touched_files`` (strings) and the
    log's;
  - ``session_id`` and ``created_at`` are the session's (manifest), as for any session;
  - ``trajectory.jsonl`` is the imported file's bytes (a final ``\\n`` added if it lacks one,
    so every line stays a line), then one line per turn of the log.

* An imported memory file that is not a JSON object (hand-edited after the migration) is
  still served verbatim while the log is empty, and contributes nothing once it is not.
* The views never write into ``imported/``: their copies in ``derived/``
  (:mod:`memfs.views.persist`) always hold the imported data, verbatim or extended, and the
  ``imported/`` copy stays untouched.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

import orjson

from memfs.errors import SymlinkRefused
from memfs.facts import normalize_fact
from memfs.store.migrate import IMPORTED_DIR, imported_view
from memfs.store.paths import read_file
from memfs.views.memory import FactList

IMPORTED_TYPE = "imported"
MEMORY = "memory.json"
TRAJECTORY = "trajectory.jsonl"


@dataclass(frozen=True, slots=True)
class Imported:
    """What a session imported: each view's file bytes (None: nothing imported for it)."""

    memory: bytes | None = None
    summary: str = ""
    touched: frozenset = frozenset()
    trajectory: bytes | None = None
    trajectory_prefix: bytes = b""  # the trajectory bytes ending with a newline (or empty)


NOTHING = Imported()


def imported_files(session_dir: Path) -> dict[str, str]:
    """``{view name: file name}`` of the session's ``imported/`` regular files."""
    folder = session_dir / IMPORTED_DIR
    try:
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            return {}  # never list through a symlink
        with os.scandir(folder) as it:
            names = sorted(e.name for e in it if e.is_file(follow_symlinks=False))
    except OSError:
        return {}
    found: dict[str, str] = {}
    for name in names:
        view_name = imported_view(name)
        if view_name is not None:
            found.setdefault(view_name, name)
    return found


def _read(session_dir: Path, name: str | None) -> bytes | None:
    if name is None:
        return None
    try:
        return read_file(session_dir / IMPORTED_DIR / name)
    except (OSError, SymlinkRefused):
        return None


def imported_fact(entry) -> tuple[str, int | None, int | None, str] | None:
    """``(fact, turn, offset, type)`` of one imported ``grounded_facts`` entry, or None to skip
    it (see the module docstring for the mapping)."""
    if type(entry) is str:
        text, turn, offset, ftype = entry, None, None, IMPORTED_TYPE
    elif type(entry) is dict and type(entry.get("fact")) is str:
        text, turn, offset, ftype = entry["fact"], entry.get("turn"), entry.get("offset"), entry.get("type")
        turn = turn if type(turn) is int else None
        offset = offset if type(offset) is int else None
        ftype = ftype if type(ftype) is str else IMPORTED_TYPE
    else:
        return None
    text = normalize_fact(text)
    return (text, turn, offset, ftype) if text else None


def load_imported(session_dir: Path, facts: FactList) -> Imported:
    """Read the session's imported files and add the imported facts to ``facts`` (first)."""
    found = imported_files(session_dir)
    if not found:
        return NOTHING
    memory = _read(session_dir, found.get(MEMORY))
    trajectory = _read(session_dir, found.get(TRAJECTORY))
    summary, touched = "", frozenset[str]()
    if memory is not None:
        try:
            obj = orjson.loads(memory)
        except orjson.JSONDecodeError:
            obj = None
        if type(obj) is dict:
            origin = (IMPORTED_TYPE, found[MEMORY])
            items = obj.get("grounded_facts")
            for entry in items if type(items) is list else ():
                fact = imported_fact(entry)
                if fact is not None:
                    facts.add(*fact, origin)
            if type(obj.get("summary")) is str:
                summary = obj["summary"]
            paths = obj.get("touched_files")
            if type(paths) is list:
                touched = frozenset(p for p in paths if type(p) is str)
    prefix = b""
    if trajectory:
        prefix = trajectory if trajectory.endswith(b"\n") else trajectory + b"\n"
    return Imported(memory, summary, touched, trajectory, prefix)
