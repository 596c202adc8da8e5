"""Retention (memfs gc), pins and the session listing (SPEC §7)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import memfs
import pytest
from memfs.errors import SymlinkRefused
from memfs.store import retention
from memfs.store.meta import format_rfc3339
from memfs.store.retention import Policy, gc, list_sessions, pin, unpin

DAY = 86400


def ev(type_: str, **fields) -> str:
    return json.dumps({"schema_version": "0.18.0", "event": {"type": type_, **fields}})


THREAD_STARTED = ev("thread.started", thread_id="t")
THREAD_DONE = ev("thread.completed", thread_id="t", session_id="s", subtype="success",
                 outcome_code="completed", usage={}, num_turns=1)
TURN = [ev("turn.started"), ev("item.completed", item={"id": "m", "type": "agent_message", "text": "done"}),
        ev("turn.completed", usage={"input_tokens": 3})]


def make_session(root: Path, name: str, *, status: str = "completed", turns: int = 1,
                 age_days: float = 0.0, manifest_id: str | None = None) -> Path:
    """A closed session of ``turns`` turns, last updated ``age_days`` ago."""
    with memfs.open_session(root, name, durability="write", metadata_interval=0) as h:
        h.append(THREAD_STARTED)
        for _ in range(turns):
            h.append_many(TURN)
        if status == "completed":
            h.append(THREAD_DONE)
    path = root / name
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["status"] == status
    manifest["updated_at"] = format_rfc3339(time.time() - age_days * DAY)
    if manifest_id is not None:
        manifest["session_id"] = manifest_id
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path


def names(report) -> dict[str, str]:
    return {r.name: r.reason for r in report.removed}


def status_of(path: Path) -> str:
    return json.loads((path / "manifest.json").read_text())["status"]


def test_removes_the_oldest_beyond_the_cap(tmp_path):
    for i in range(5):
        make_session(tmp_path, f"s{i}", age_days=i + 1)
    report = gc(tmp_path, Policy(max_sessions=3, max_age_days=30))
    assert names(report) == {"s3": "count", "s4": "count"}
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["s0", "s1", "s2"]
    assert report.bytes_freed == sum(r.bytes for r in report.removed) > 0


def test_removes_old_sessions_under_the_cap(tmp_path):
    make_session(tmp_path, "young", age_days=2)
    make_session(tmp_path, "old", age_days=45)
    report = gc(tmp_path, Policy(max_sessions=50, max_age_days=30))
    assert names(report) == {"old": "age"}
    assert (tmp_path / "young").is_dir() and not (tmp_path / "old").exists()


def test_removes_empty_completed_sessions_at_once(tmp_path):
    """Empty means no events: a session of thread.started + thread.completed and no turn is
    not empty (issue 42 item 4)."""
    make_session(tmp_path, "shell", turns=0)  # thread.started + thread.completed only
    make_session(tmp_path, "work", turns=1)
    with memfs.open_session(tmp_path, "void"):  # created, nothing appended
        pass
    manifest = json.loads((tmp_path / "void" / "manifest.json").read_text())
    (tmp_path / "void" / "manifest.json").write_text(json.dumps({**manifest, "status": "completed"}))
    report = gc(tmp_path)
    assert names(report) == {"void": "empty"}
    assert report.removed[0].detail == "empty: no events"
    assert (tmp_path / "work").is_dir() and (tmp_path / "shell").is_dir()


def test_keeps_active_pinned_live_and_preserved_sessions(tmp_path):
    make_session(tmp_path, "active", status="active", turns=0, age_days=1)
    make_session(tmp_path, "pinned", age_days=90)
    make_session(tmp_path, "live", age_days=90)
    make_session(tmp_path, "kept", age_days=90)
    make_session(tmp_path, "gone", age_days=90)
    pin(tmp_path, "pinned", "evidence for a bug")
    with memfs.open_session(tmp_path, "live", read_only=False) as h:
        h.lock()  # holds session.lock, as a writer does
        report = gc(tmp_path, Policy(max_sessions=0, max_age_days=30), preserve=["kept"])
    assert names(report) == {"gone": "count"}
    assert report.kept == {"active": "active", "pinned": "pinned", "live": "live", "kept": "preserved"}
    for name in ("active", "pinned", "live", "kept"):
        assert (tmp_path / name / "events.jsonl").exists()


def test_idle_active_sessions_are_marked_completed_then_evicted_but_never_live_ones(tmp_path):
    idle = make_session(tmp_path, "idle", status="active", age_days=40)
    busy = make_session(tmp_path, "busy", status="active", age_days=40)
    recent = make_session(tmp_path, "recent", status="active", age_days=3)
    with memfs.open_session(tmp_path, "busy") as h:
        h.lock()  # being written
        report = gc(tmp_path, Policy(max_sessions=50, max_age_days=30))
    assert report.marked_completed == ["idle"]
    assert names(report) == {"idle": "age"}
    assert not idle.exists()
    assert status_of(busy) == "active" and status_of(recent) == "active"


def test_the_sweep_rewrites_only_the_status_and_keeps_the_fast_path(tmp_path):
    path = make_session(tmp_path, "s", status="active", age_days=40)
    before = json.loads((path / "manifest.json").read_text())
    assert retention.mark_completed(path)
    after = json.loads((path / "manifest.json").read_text())
    assert after == {**before, "status": "completed"}
    assert os.stat(path / "manifest.json").st_mode & 0o777 == 0o600
    with memfs.open_session(tmp_path, "s") as h:
        assert h.open_report.fast_path
        assert h.manifest["status"] == "completed"


def test_a_dry_run_changes_nothing(tmp_path):
    idle = make_session(tmp_path, "idle", status="active", age_days=40)
    make_session(tmp_path, "old", age_days=40)
    report = gc(tmp_path, dry_run=True)
    assert report.marked_completed == ["idle"]
    assert names(report) == {"idle": "age", "old": "age"}
    assert report.bytes_freed > 0
    assert status_of(idle) == "active" and (tmp_path / "old").is_dir()


def test_max_age_days_zero_disables_the_sweep(tmp_path):
    idle = make_session(tmp_path, "idle", status="active", age_days=400)
    report = gc(tmp_path, Policy(max_sessions=50, max_age_days=0))
    assert report.marked_completed == [] and report.removed == []
    assert status_of(idle) == "active"


def test_a_manifest_id_is_never_used_as_a_path(tmp_path):
    root = tmp_path / "sessions"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep me")
    make_session(root, "real", age_days=60, manifest_id="../outside")
    report = gc(root)
    assert [(r.name, r.session_id) for r in report.removed] == [("real", "../outside")]
    assert not (root / "real").exists()
    assert (outside / "precious.txt").read_text() == "keep me"


def test_symlinked_session_entries_are_skipped(tmp_path):
    root = tmp_path / "sessions"
    elsewhere = tmp_path / "elsewhere"
    target = make_session(elsewhere, "target", age_days=60)
    make_session(root, "real", age_days=60)
    (root / "link").symlink_to(target)
    report = gc(root)
    assert names(report) == {"real": "age"}
    assert report.kept["link"] == "symlink"
    assert (root / "link").is_symlink() and (target / "events.jsonl").exists()


def test_a_symlinked_sessions_root_is_refused(tmp_path):
    real = tmp_path / "real"
    make_session(real, "old", age_days=60)
    (tmp_path / "root").symlink_to(real)
    with pytest.raises(SymlinkRefused):
        gc(tmp_path / "root")
    assert (real / "old" / "events.jsonl").exists()


def test_a_missing_root_is_an_empty_store(tmp_path):
    report = gc(tmp_path / "nothing")
    assert report.removed == [] and report.kept == {}


def test_stray_entries_are_not_sessions(tmp_path):
    make_session(tmp_path, "s", age_days=60)
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / "no-manifest").mkdir()
    report = gc(tmp_path)
    assert names(report) == {"s": "age"}
    assert (tmp_path / "notes.txt").exists() and (tmp_path / ".hidden").is_dir()
    assert report.kept["no-manifest"] == "manifest missing or unreadable"


def test_imported_sessions_are_not_empty_shells(tmp_path):
    path = make_session(tmp_path, "imported", turns=0, age_days=1)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["imported_from"] = ".vtcode/history/imported.json"
    (path / "manifest.json").write_text(json.dumps(manifest))
    assert gc(tmp_path).removed == []


def test_pin_and_unpin(tmp_path):
    path = make_session(tmp_path, "s", age_days=60)
    record = pin(tmp_path, "s", "blocker evidence")
    on_disk = json.loads((path / "retention-pin.json").read_text())
    assert on_disk == record and record["reason"] == "blocker evidence" and record["session_id"] == "s"
    assert gc(tmp_path).removed == []
    assert unpin(tmp_path, "s") is True
    assert unpin(tmp_path, "s") is False
    assert names(gc(tmp_path)) == {"s": "age"}


def test_pin_of_an_unknown_session_fails(tmp_path):
    with pytest.raises(memfs.errors.NotFound):
        pin(tmp_path, "nope", "x")


def test_list_sessions_most_recent_first_and_cache_invalidation(tmp_path):
    make_session(tmp_path, "a", age_days=3)
    make_session(tmp_path, "b", age_days=1)
    make_session(tmp_path, "c", status="active", age_days=2)
    listed = list_sessions(tmp_path)
    assert [s.name for s in listed] == ["b", "c", "a"]
    assert listed[0].status == "completed" and listed[0].turn_count == 1 and listed[0].event_count == 5
    with memfs.open_session(tmp_path, "a", durability="write", metadata_interval=0) as h:
        h.append_many(TURN)  # a turn boundary persists the manifest: "a" is now the newest
        assert [s.name for s in list_sessions(tmp_path)][0] == "a"
        assert list_sessions(tmp_path)[0].live
    first = list_sessions(tmp_path)[0]
    assert first.name == "a" and first.turn_count == 2 and not first.live


def test_half_created_leftovers_of_older_versions_are_removed_and_fsck_completes_them(tmp_path):
    """What an interrupted creation of an older memfs left (an empty log, index/, session.lock,
    no manifest): gc removes it as half-created, fsck makes it a whole empty session."""
    from memfs.store.fsck import fsck_session

    for name in ("left", "fixed"):
        (tmp_path / name / "index").mkdir(parents=True)
        (tmp_path / name / "events.jsonl").write_bytes(b"")
        (tmp_path / name / "session.lock").write_bytes(b"")
    make_session(tmp_path, "real", turns=1)
    assert fsck_session(tmp_path, "fixed").result == "repaired"
    assert (tmp_path / "fixed" / "manifest.json").exists()
    report = gc(tmp_path, Policy(max_sessions=50, max_age_days=30))
    assert names(report) == {"left": "half-created"}
    assert not (tmp_path / "left").exists() and (tmp_path / "real").is_dir()


# --- live counts (issue 16 item 11) --------------------------------------------------------

WRITER = r"""
import sys, memfs
h = memfs.open_session(sys.argv[1], "busy", durability="write", metadata_interval=3600)
h.append(b'{"type":"turn.started"}\n')
h.append(b'{"type":"item.completed","item":{"id":"a","type":"agent_message","text":"one"}}\n')
h.append(b'{"type":"item.completed","item":{"id":"b","type":"agent_message","text":"two"}}\n')
print("ready", flush=True)
sys.stdin.read()  # hold the session, mid-turn, metadata not persisted, until the test is done
h.close()
"""


def test_sessions_lists_the_live_counts_of_a_session_being_written(tmp_path):
    """A writer in another process appended a turn's first lines and persisted nothing: the
    listing (library and ``memfs sessions --json``) follows the log past the manifest."""
    import subprocess
    import sys

    store = tmp_path / "store"
    with memfs.open_session(store, "busy") as h:  # one closed turn, persisted on close
        h.append(b'{"type":"thread.started","thread_id":"t"}\n')
        h.append(b'{"type":"turn.started"}\n')
        h.append(b'{"type":"turn.completed","usage":{"input_tokens":1}}\n')
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(store)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        on_disk = json.loads((store / "busy" / "manifest.json").read_bytes())
        assert (on_disk["event_count"], on_disk["in_turn"]) == (3, False)  # stale: what the listing used to show
        [info] = list_sessions(store)
        assert (info.event_count, info.turn_count, info.in_turn, info.status, info.live) == (6, 1, True, "active", True)
        assert info.updated_ts >= os.stat(store / "busy" / "events.jsonl").st_mtime - 1
        done = subprocess.run([sys.executable, "-m", "memfs", "sessions", "--json", "--store", str(store)],
                              capture_output=True, text=True, timeout=60)
        [row] = json.loads(done.stdout)
        assert (row["event_count"], row["turn_count"], row["in_turn"]) == (6, 1, True)
    finally:
        proc.stdin.close()
        proc.wait(30)
    [info] = list_sessions(store)  # closed: persisted, and the same counts from the manifest alone
    assert (info.event_count, info.turn_count, info.in_turn) == (6, 1, True)
    assert json.loads((store / "busy" / "manifest.json").read_bytes())["event_count"] == 6


def test_follow_tail_closes_the_open_turn_and_counts_turns_on(tmp_path):
    """The tail's turn boundaries number on from the manifest: a turn open in the manifest
    closed in the tail, then a whole new turn and a thread.completed."""
    store = tmp_path / "store"
    with memfs.open_session(store, "s") as h:
        h.append(b'{"type":"turn.started"}\n')
    described = (store / "s" / "events.jsonl").stat().st_size
    with open(store / "s" / "events.jsonl", "ab") as f:  # as another process's unpersisted appends
        f.write(b'{"schema_version":"0.18.0","event":{"type":"turn.completed","usage":{"input_tokens":1}}}\n'
                b'{"schema_version":"0.18.0","event":{"type":"turn.started"}}\n'
                b'{"schema_version":"0.18.0","event":{"type":"turn.failed","message":"x"}}\n'
                + THREAD_DONE.encode() + b"\n"
                b'{"schema_version":"0.18.0","event":{"type":"turn.sta')  # being written: left out
    assert json.loads((store / "s" / "manifest.json").read_bytes())["persisted_file_len"] == described
    [info] = list_sessions(store)
    assert (info.event_count, info.turn_count, info.in_turn, info.status) == (5, 2, False, "completed")
