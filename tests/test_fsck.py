"""memfs fsck (SPEC §7): rescan, repair metadata, report damage."""

from __future__ import annotations

import json
from pathlib import Path

import memfs
import pytest
from memfs.store import lock
from memfs.store.fsck import fsck_session, fsck_store

EVENTS = [
    {"schema_version": "0.18.0", "event": {"type": "thread.started", "thread_id": "t"}},
    {"schema_version": "0.18.0", "event": {"type": "turn.started"}},
    {"schema_version": "0.18.0", "event": {"type": "item.completed",
                                           "item": {"id": "m", "type": "agent_message", "text": "hi"}}},
    {"schema_version": "0.18.0", "event": {"type": "turn.completed", "usage": {}}},
    {"schema_version": "0.18.0", "event": {"type": "turn.started"}},
    {"schema_version": "0.18.0", "event": {"type": "turn.failed", "message": "boom"}},
]


@pytest.fixture
def session_dir(tmp_path) -> Path:
    with memfs.open_session(tmp_path, "s", durability="write", metadata_interval=0) as h:
        h.append_many(EVENTS)
    return tmp_path / "s"


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def test_a_clean_session_is_ok(session_dir):
    report = fsck_session(session_dir.parent, "s")
    assert report.result == "ok" and not report.failed
    assert (report.events, report.turns, report.skipped_lines, report.rejected) == (6, 2, 0, 0)
    assert report.fast_path and report.repairs == [] and report.damage == []


def test_a_corrupted_manifest_is_repaired(session_dir):
    good = read_json(session_dir / "manifest.json")
    (session_dir / "manifest.json").write_text("{not json")
    report = fsck_session(session_dir.parent, "s")
    assert report.result == "repaired" and report.failed
    assert not report.fast_path and "manifest" in report.rescan_reason
    repaired = read_json(session_dir / "manifest.json")
    for key in ("event_count", "turn_count", "status", "in_turn", "persisted_file_len", "retained_turn_base"):
        assert repaired[key] == good[key]
    assert fsck_session(session_dir.parent, "s").result == "ok"


def test_metadata_that_passes_the_fast_path_but_lies_is_rebuilt(session_dir):
    manifest = read_json(session_dir / "manifest.json")
    manifest["event_count"] = 99
    (session_dir / "manifest.json").write_text(json.dumps(manifest))
    turns = read_json(session_dir / "index" / "turns.json")
    turns["entries"][0]["event_count"] = 1
    (session_dir / "index" / "turns.json").write_text(json.dumps(turns))
    report = fsck_session(session_dir.parent, "s")
    assert report.result == "repaired"
    assert any("event_count is 99" in r for r in report.repairs)
    assert read_json(session_dir / "manifest.json")["event_count"] == 6
    assert read_json(session_dir / "index" / "turns.json")["entries"][0]["event_count"] == 3
    assert fsck_session(session_dir.parent, "s").result == "ok"


def test_a_torn_tail_is_reported_and_repaired(session_dir):
    size = (session_dir / "events.jsonl").stat().st_size
    tail = b'{"schema_version":"0.18.0","event":{"ty'
    with open(session_dir / "events.jsonl", "ab") as f:
        f.write(tail)
    report = fsck_session(session_dir.parent, "s")
    assert report.result == "repaired"
    assert report.torn_tail_bytes == len(tail)
    assert report.rejected == 1
    assert (session_dir / "events.jsonl").stat().st_size == size
    rejected = read_json(session_dir / "rejected.jsonl")
    assert rejected["reason"].startswith("torn-tail")
    assert fsck_session(session_dir.parent, "s").result == "ok"


def test_unreadable_lines_are_damage_and_stay_reported(session_dir):
    data = (session_dir / "events.jsonl").read_bytes()
    (session_dir / "events.jsonl").write_bytes(data + b"not json at all\n\xff\xfe\n")
    report = fsck_session(session_dir.parent, "s")
    assert report.result == "damaged" and report.failed
    assert report.skipped_lines == 2
    assert any("metadata rebuilt" in r for r in report.repairs)
    again = fsck_session(session_dir.parent, "s")
    assert again.result == "damaged" and again.repairs == [] and again.skipped_lines == 2


def test_a_stale_cap_marker_is_removed(session_dir):
    marker = session_dir / "index" / "pending-cap-rewrite.json"
    marker.write_text(json.dumps({"previous_file_len": 5, "new_file_len": 3, "retained_turn_base": 1}))
    report = fsck_session(session_dir.parent, "s")
    assert report.result == "repaired" and report.stale_marker
    assert not marker.exists()


def test_rejected_lines_are_counted_but_are_not_damage(session_dir):
    with memfs.open_session(session_dir.parent, "s") as h:
        with pytest.raises(memfs.ValidationError):
            h.append(b'{"type": "turn.completed"}')  # no usage: refused
    report = fsck_session(session_dir.parent, "s")
    assert report.result == "ok" and report.rejected == 1


def test_a_live_session_is_skipped(session_dir):
    held = lock.acquire(session_dir)  # as another process holding it would
    try:
        report = fsck_session(session_dir.parent, "s")
    finally:
        lock.release(held)
    assert report.result == "skipped" and not report.failed and "live" in report.note


def test_fsck_store_checks_every_session_or_the_named_ones(session_dir):
    root = session_dir.parent
    with memfs.open_session(root, "other", durability="write") as h:
        h.append(EVENTS[0])
    (root / "other" / "manifest.json").write_text("")
    reports = fsck_store(root)
    assert [(r.name, r.result) for r in reports] == [("other", "repaired"), ("s", "ok")]
    assert [r.name for r in fsck_store(root, ["s"])] == ["s"]
    missing = fsck_store(root, ["nope"])
    assert missing[0].result == "error" and "no session" in missing[0].note
