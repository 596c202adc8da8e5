"""TurnIndex.snapshot (memfs.store.meta): the ``turns.json``/``turns.cache`` of one moment,
written after the index went on changing (what a persist outside the session lock needs)."""

from __future__ import annotations

import orjson
from memfs.store import meta
from memfs.store.meta import COMPLETED, TurnIndex


def grow(index: TurnIndex, n: int, close_last: bool = True) -> None:
    for _ in range(n):
        start = index.end[-1] if len(index) else 0
        index.open_turn(start, start + 50, "2026-01-01T00:00:00.000+00:00")
        index.count[-1] = 3
        index.outcome[-1] = COMPLETED
    if not close_last:
        index.outcome[-1] = meta.OPEN


def test_a_snapshot_keeps_its_moment_while_the_index_grows_and_evicts():
    index = TurnIndex()
    grow(index, 100, close_last=False)
    snap = index.snapshot(cache=True)
    expected_json = index.to_json()
    expected_cache = snap.cache_bytes([1, 2, 3, 4])
    index.outcome[-1] = COMPLETED  # the open turn closes, more turns come, the front is evicted
    grow(index, 50)
    index.to_json()  # renders the new entries into the buffer the snapshot still refers to
    index.drop_front(10, index.end[9])
    grow(index, 5)
    assert index.to_json() != expected_json
    assert snap.json() == expected_json
    assert snap.cache_bytes([1, 2, 3, 4]) == expected_cache
    entries = orjson.loads(snap.json())["entries"]
    assert len(entries) == 100 and entries[-1]["outcome"] == "open"


def test_a_large_index_is_written_in_pieces_while_it_keeps_growing(monkeypatch):
    monkeypatch.setattr(meta, "_SLICE", 4096)
    index = TurnIndex()
    grow(index, 2000)
    snap = index.snapshot()
    whole = index.to_json()
    pieces = []
    for piece in snap.json_pieces():
        pieces.append(piece)
        grow(index, 3)
        index.to_json()  # the buffer grows between two pieces: no BufferError, no change
    assert len(pieces) > 3
    assert b"".join(pieces) == whole
    assert len(orjson.loads(b"".join(pieces))["entries"]) == 2000
