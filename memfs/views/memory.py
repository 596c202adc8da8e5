"""``derived/memory.json`` (SPEC §4.1): the session memory view, VT Code compatible (schema 3).

The grounded-facts list is the expensive part of the view, so it is kept as a
:class:`FactList` that grows as lines are folded and renders its own JSON incrementally: each
fact is serialized once, when it is added, and the document is assembled around those bytes.
The result is byte-identical to ``orjson.dumps(view, option=OPT_INDENT_2)`` plus a final
newline (the tests check this).

Decisions recorded here where the spec is silent:

* Facts of an imported legacy ``memory.json`` come first (see :mod:`memfs.views.imported`).
* Facts from eviction summaries come next, in summary-name order (chronological, see
  ``memfs.store.evict``), with ``"turn": null``, ``"offset": null``, ``"type": "evicted"`` and
  an extra ``"summary"`` field naming the summary file they came from. They are normalized
  again (idempotent for the default hook; a custom hook may write anything) and non-strings
  are skipped.
* Duplicates are exact duplicates of the normalized text, across the whole list (the first
  occurrence wins, so an evicted fact repeated later in the log stays at its evicted place).
* ``summary`` is the last agent message of the last closed turn, verbatim (not normalized);
  ``""`` when that turn had none or no turn has closed.
* ``generated_at`` is the time of the refresh that produced the content; ``created_at`` is the
  session's ``created_at`` from its manifest.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import orjson

from memfs.errors import MemfsError
from memfs.facts import normalize_fact
from memfs.store.evict import SUMMARY_PREFIX
from memfs.store.paths import DERIVED_DIR, read_file

log = logging.getLogger("memfs.views")

SCHEMA_VERSION = 3
EVICTED_TYPE = "evicted"

_INDENT = orjson.OPT_INDENT_2


def indented(value, level: int) -> bytes:
    """``value`` as pretty JSON nested ``level`` levels deep (2 spaces a level)."""
    data = orjson.dumps(value, option=_INDENT)
    if level and b"\n" in data:
        data = data.replace(b"\n", b"\n" + b"  " * level)
    return data


class FactList:
    """The grounded facts of one session, in order, deduplicated, with their rendered JSON.

    ``facts[:n]`` never changes once added (until the owner rebuilds a new list), which is
    what the search layer's incremental index relies on.
    """

    __slots__ = ("facts", "seen", "_json", "_json_n")

    def __init__(self) -> None:
        self.facts: list[dict] = []
        self.seen: set[str] = set()
        self._json = bytearray()  # facts [0, _json_n) rendered at depth 2, ",\n"-joined
        self._json_n = 0

    def __len__(self) -> int:
        return len(self.facts)

    def add(self, text: str, turn: int | None, offset: int | None, ftype: str,
            origin: tuple[str, str] | None = None) -> bool:
        """Append a normalized fact unless it is a duplicate; True when it was added.

        ``origin`` ``(field, file name)`` adds that extra field, naming the file a fact that
        does not come from the log came from (``"summary"``, ``"imported"``)."""
        if text in self.seen:
            return False
        self.seen.add(text)
        fact = {"fact": text, "turn": turn, "offset": offset, "type": ftype}
        if origin is not None:
            fact[origin[0]] = origin[1]
        self.facts.append(fact)
        return True

    def json_array(self) -> tuple[bytes | bytearray, ...]:
        """The ``grounded_facts`` array as it appears at depth 1 of the pretty document, in
        pieces: the caller joins them into the document once (the array is most of a
        multi-megabyte view; every extra copy showed in ``cat`` latency)."""
        n = len(self.facts)
        if self._json_n < n:
            parts = [b"    " + indented(f, 2) for f in self.facts[self._json_n:n]]
            if self._json:
                self._json += b",\n"
            self._json += b",\n".join(parts)
            self._json_n = n
        if not n:
            return (b"[]",)
        return b"[\n", self._json, b"\n  ]"


def real_derived_dir(session_dir: Path) -> Path | None:
    """``<session>/derived`` when it is a real directory (never a symlink), else None."""
    path = session_dir / DERIVED_DIR
    try:
        return path if stat.S_ISDIR(os.lstat(path).st_mode) else None
    except OSError:
        return None


def summary_names(session_dir: Path) -> list[str]:
    """The stored ``eviction-summary-*.json`` file names of a session, sorted (oldest first).

    A ``derived`` that is a symlink is not followed: it lists nothing."""
    derived = real_derived_dir(session_dir)
    if derived is None:
        return []
    try:
        names = os.listdir(derived)
    except OSError:
        return []
    return sorted(n for n in names if n.startswith(SUMMARY_PREFIX) and n.endswith(".json")
                  and _regular(derived / n))


def _regular(path: Path) -> bool:
    """A regular file, not followed if a symlink: a link, FIFO or directory planted under a
    summary's name is not a summary (it would loop, block or fail the view)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def load_evicted_facts(session_dir: Path, facts: FactList) -> int:
    """Add the grounded facts of every stored eviction summary to ``facts``; return how many
    summaries the session has.

    An unreadable, malformed or hostile summary (a symlink swapped in after listing, say)
    contributes nothing rather than failing the view: it costs that file only.
    """
    names = summary_names(session_dir)
    for name in names:
        try:
            obj = orjson.loads(read_file(session_dir / DERIVED_DIR / name))
        except (OSError, MemfsError, orjson.JSONDecodeError):
            log.warning("session %s: eviction summary %s left out: unreadable or not JSON", session_dir.name, name)
            continue
        items = obj.get("grounded_facts") if isinstance(obj, dict) else None
        if not isinstance(items, list):
            continue
        for item in items:
            if isinstance(item, str):
                text = normalize_fact(item)
                if text:
                    facts.add(text, None, None, EVICTED_TYPE, ("summary", name))
    return len(names)


def render(session_id: str, summary: str, facts: FactList, touched_files: bytes, generated_at: str,
           created_at: str, source: dict) -> bytes:
    """The ``memory.json`` bytes. ``touched_files`` is the already-rendered sorted path array."""
    return b"".join((
        b'{\n  "session_id": ', orjson.dumps(session_id),
        b',\n  "schema_version": ', str(SCHEMA_VERSION).encode(),
        b',\n  "summary": ', orjson.dumps(summary),
        b',\n  "grounded_facts": ', *facts.json_array(),
        b',\n  "touched_files": ', touched_files,
        b',\n  "generated_at": ', orjson.dumps(generated_at),
        b',\n  "created_at": ', orjson.dumps(created_at),
        b',\n  "source": ', indented(source, 1),
        b"\n}\n",
    ))


def render_paths(paths: set[str]) -> bytes:
    """A sorted path set as the pretty ``touched_files`` array at depth 1."""
    return indented(sorted(paths), 1)
