"""What ``memfs import`` already took whole, per source file: decided from ``lstat`` alone
(SPEC §14: "import decides per file from (inode, size, mtime) whether anything is new").

``<store>/.memfs-import-index.json`` maps each source (its resolved path) to the session it
went to, and to two identities: the source's ``(inode, size, mtime_ns)`` when the import read
it, and the session's ``index/import-sources.json``'s ``(inode, mtime_ns)`` right after. While
both are unchanged, importing the source again can only find what the last import found —
the same complete lines, already consumed — so it is ``up-to-date`` without opening the file,
identifying its conversation or reading the sidecar. Anything else (the source grew or was
replaced, the sidecar rewritten by another import, the session removed) takes the full path,
which checks the imported prefix's hash as before.

A source modified less than :data:`RACY_NS` before it was read is not noted: a change within
the same timestamp tick would not show in its mtime (git's "racily clean" case), so it takes
the full path next time too.

The index is a cache, replaced atomically once per import run: deleting it, or losing a
concurrent run's entries, costs speed only. A sidecar holds every source of its session, so
when a run imports several sources into one session, the entries it noted take the sidecar's
identity as the run leaves it (the later sources' writes only added their own entries).
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson

from memfs.store.paths import IMPORT_SOURCES, atomic_write

INDEX = ".memfs-import-index.json"
RACY_NS = 2_000_000_000  # a source modified this shortly before it was read is not noted


def _identity(st: os.stat_result) -> list[int]:
    return [st.st_ino, st.st_size, st.st_mtime_ns]


class SeenSources:
    """The index of one store, loaded once per import run."""

    def __init__(self, root: Path, load: bool = True):
        self.root = Path(root)
        self.prefix = str(self.root) + "/"
        self.dirty = False
        self.noted: set[str] = set()  # noted by this run
        self.forgotten: set[str] = set()  # forgotten by this run
        if not load:  # (an import worker's: it hands its notes to the run, :meth:`changes`)
            self.entries: dict = {}
            return
        try:
            data = orjson.loads((self.root / INDEX).read_bytes())
            entries = data.get("sources") if isinstance(data, dict) and data.get("version") == 1 else None
        except (OSError, orjson.JSONDecodeError):
            entries = None
        self.entries = entries if isinstance(entries, dict) else {}

    def _sidecar(self, session: str) -> list[int] | None:
        try:
            st = os.lstat(f"{self.prefix}{session}/{IMPORT_SOURCES}")
        except OSError:
            return None
        return [st.st_ino, st.st_mtime_ns]

    def unchanged(self, key: str, st: os.stat_result) -> tuple[str, str | None] | None:
        """``(session, format)`` when the source, as ``st`` says it is, was taken whole by an
        earlier import into a session whose sidecar has not changed since; else None."""
        entry = self.entries.get(key)
        if type(entry) is not list or len(entry) != 4 or entry[2] != _identity(st) or type(entry[0]) is not str:
            return None
        if "/" in entry[0] or entry[0].startswith(".") or self._sidecar(entry[0]) != entry[3]:
            return None
        return entry[0], entry[1] if type(entry[1]) is str else None

    def note(self, key: str, st: os.stat_result, read_at: int, session: str, fmt: str | None) -> None:
        """The source, as ``st`` said it was when read (at ``read_at``, ``time.time_ns()``), is
        now wholly in ``session``."""
        sidecar = self._sidecar(session)
        if sidecar is None or read_at - st.st_mtime_ns < RACY_NS:
            self.forget(key)
            return
        self.entries[key] = [session, fmt, _identity(st), sidecar]
        self.noted.add(key)
        self.forgotten.discard(key)
        self.dirty = True

    def forget(self, key: str) -> None:
        self.forgotten.add(key)
        self.noted.discard(key)
        if self.entries.pop(key, None) is not None:
            self.dirty = True

    def _settle(self) -> None:
        """The noted entries take their sidecar's identity as the run leaves it."""
        for key in self.noted:
            entry = self.entries.get(key)
            sidecar = self._sidecar(entry[0]) if entry else None
            if entry and sidecar:
                entry[3] = sidecar

    def changes(self) -> tuple[dict, list[str]]:
        """What this run noted and forgot, for :meth:`merge` into another process's index (an
        import worker's, :mod:`memfs.ingest.shares`)."""
        self._settle()
        return {key: self.entries[key] for key in self.noted if key in self.entries}, sorted(self.forgotten)

    def merge(self, noted: dict, forgotten: list[str]) -> None:
        for key in forgotten:
            self.forget(key)
        for key, entry in noted.items():
            self.entries[key] = entry
            self.forgotten.discard(key)
            self.dirty = True

    def save(self) -> None:
        self._settle()
        self.noted.clear()
        if self.dirty and self.root.is_dir():
            atomic_write(self.root / INDEX, orjson.dumps({"version": 1, "sources": self.entries}))
            self.dirty = False
