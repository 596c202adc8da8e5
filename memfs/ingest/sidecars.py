"""The import's sidecar (``index/import-sources.json``, see :mod:`memfs.ingest.importer`) and
how ``memfs import`` keeps it true at the disk's pace (docs/design.md "First import at the
disk's pace").

The sidecar claims that a source's prefix is in its session, so it may only reach the disk
after the lines it describes. :func:`write_sources` writes it at once (after the caller made the
session durable: ``--follow``, ``memfs resume``). An import run instead writes everything
under :func:`memfs.store.paths.deferred_sync` (no per-file syncs) and hands each entry to an
:class:`ImportBatch`, which holds it until one ``syncfs`` has made the batch's sessions durable,
then writes the batch's sidecars (and notes the sources in the re-import cache,
:mod:`memfs.ingest.seen`). A crash before that sync loses the batch's sidecar entries only:
the next import reads those sources from where the last durable entry says (from the start,
for a new session) and the dedupe drops what the session already holds — the same repair as a
crash between a session's flush and its sidecar write.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import orjson

from memfs.store.paths import IMPORT_SOURCES, atomic_write, sync_filesystem

SOURCES = IMPORT_SOURCES
BATCH_SECONDS = 10.0  # an import syncs and writes its held sidecars at least this often


def read_sources(session_dir: Path) -> dict:
    try:
        data = orjson.loads((session_dir / SOURCES).read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return {}
    sources = data.get("sources") if isinstance(data, dict) else None
    return sources if isinstance(sources, dict) else {}


def write_sources(session_dir: Path, sources: dict) -> None:
    atomic_write(session_dir / SOURCES, orjson.dumps({"version": 1, "sources": sources}))


class ImportBatch:
    """Sidecar entries (and re-import cache notes) of one import run, held until the lines they
    describe are durable. ``maps``: the run's :class:`memfs.ingest.conversations.MapBatch`
    (written before each sync); ``seen``: its :class:`memfs.ingest.seen.SeenSources`."""

    def __init__(self, root: Path, seen, maps=None, every: float = BATCH_SECONDS):
        self.root = Path(root)
        self.seen, self.maps, self.every = seen, maps, every
        self.entries: dict[Path, dict[str, dict]] = {}  # session dir -> {source key: entry}
        self.notes: list[tuple] = []  # SeenSources.note's arguments
        self.started = time.monotonic()

    def add(self, session_dir: Path, key: str, entry: dict) -> None:
        self.entries.setdefault(session_dir, {})[key] = entry

    def note(self, *args) -> None:
        self.notes.append(args)

    def due(self) -> bool:
        return time.monotonic() - self.started >= self.every

    def commit(self) -> None:
        """Make what the run wrote durable (one ``syncfs``), then write the held sidecars."""
        if self.maps is not None:
            self.maps.write()
        if self.entries or self.notes:
            if self.root.is_dir():
                sync_filesystem(self.root)
            for session_dir, entries in self.entries.items():
                if os.path.isdir(session_dir):
                    sources = read_sources(session_dir)
                    sources.update(entries)
                    write_sources(session_dir, sources)
            for args in self.notes:
                self.seen.note(*args)
        self.entries, self.notes = {}, []
        self.started = time.monotonic()
