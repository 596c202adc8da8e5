"""Migrated sessions keep their imported views (SPEC §7 with §4): memory.json and
trajectory.jsonl are the imported files while the log is empty, and stay extended by them
once it is not; the imported facts are searchable throughout."""

from __future__ import annotations

import json
import os
from pathlib import Path

import memfs
import pytest
from memfs import views
from memfs.search import search_store
from memfs.store.evict import SUMMARY_PREFIX
from memfs.store.migrate import migrate_workspace
from memfs.views import cache

from mounting import event, mounted, needs_fuse, sh

LEGACY_MEMORY = {
    "session_id": "abc",
    "schema_version": 3,
    "summary": "Legacy summary.",
    "grounded_facts": [
        {"fact": "Zebra parser rewritten in Rust", "turn": 2, "offset": 120, "type": "agent_message"},
        {"fact": "  file   update:\tsrc/zebra.rs ", "turn": 2, "offset": 300, "type": "file_change"},
        {"fact": "Zebra parser rewritten in Rust", "turn": 3, "offset": 900, "type": "agent_message"},
        "a bare fact about quokkas",
        {"fact": "   ", "turn": 4, "offset": 1000, "type": "agent_message"},
        {"fact": "odd fields on a lemur fact", "turn": "2", "offset": None, "type": 7, "extra": 1},
        {"no_fact": "skipped"},
        42,
    ],
    "touched_files": ["src/zebra.rs", 5, "docs/a.md"],
    "generated_at": "2025-01-01T00:00:00.000+00:00",
    "created_at": "2025-01-01T00:00:00.000+00:00",
    "source": {"events_len": 1500, "event_count": 9},
}
# the mapping documented in memfs.views.imported, in order
IMPORTED_FACTS = [
    {"fact": "Zebra parser rewritten in Rust", "turn": 2, "offset": 120, "type": "agent_message",
     "imported": "abc.json"},
    {"fact": "file update: src/zebra.rs", "turn": 2, "offset": 300, "type": "file_change", "imported": "abc.json"},
    {"fact": "a bare fact about quokkas", "turn": None, "offset": None, "type": "imported", "imported": "abc.json"},
    {"fact": "odd fields on a lemur fact", "turn": None, "offset": None, "type": "imported",
     "imported": "abc.json"},
]
LEGACY_TRAJECTORY = b'{"turn":1,"outcome":"completed","note":"legacy"}\n{"turn":2,"outcome":"failed"}'

STARTED = {"type": "turn.started"}
COMPLETED = {"type": "turn.completed", "usage": {"input_tokens": 3, "output_tokens": 2}}


def message(text: str) -> dict:
    return {"type": "item.completed", "item": {"id": "m", "type": "agent_message", "text": text}}


def file_change(path: str) -> dict:
    return {"type": "item.completed",
            "item": {"id": "f", "type": "file_change", "status": "completed",
                     "changes": [{"path": path, "kind": "add"}]}}


@pytest.fixture
def migrated_store(tmp_path) -> Path:
    """A sessions root holding ``abc`` (history import) and ``traj-run`` (trajectory import)."""
    workspace = tmp_path / "ws"
    (workspace / ".vtcode" / "history").mkdir(parents=True)
    (workspace / ".vtcode" / "logs").mkdir()
    (workspace / ".vtcode" / "history" / "abc.json").write_text(json.dumps(LEGACY_MEMORY, indent=2))
    (workspace / ".vtcode" / "logs" / "trajectory-run.jsonl").write_bytes(LEGACY_TRAJECTORY)
    root = tmp_path / "store"
    report = migrate_workspace(workspace, root)
    assert report.imported == 2
    yield root
    views.flush()
    for name in ("abc", "traj-run"):
        views.forget(root / name)


def imported_bytes(root: Path, name: str, file: str) -> bytes:
    return (root / name / "imported" / file).read_bytes()


def open_abc(root: Path, **kw) -> memfs.SessionHandle:
    return memfs.open_session(root, "abc", max_events=0, **kw)


# --- memory.json ---------------------------------------------------------------------------


def test_memory_is_the_imported_file_while_the_log_is_empty(migrated_store):
    legacy = imported_bytes(migrated_store, "abc", "abc.json")
    with open_abc(migrated_store) as h:
        assert views.render_view(h, "memory.json") == legacy
        assert views.memory_view(h) == LEGACY_MEMORY
        views.flush()
    assert (migrated_store / "abc" / "derived" / "memory.json").read_bytes() == legacy
    # deleting derived/ loses nothing: the imported/ copy is the source of truth
    for child in (migrated_store / "abc" / "derived").iterdir():
        child.unlink()
    (migrated_store / "abc" / "derived").rmdir()
    views.forget(migrated_store / "abc")  # as another process would
    with open_abc(migrated_store) as h:
        assert views.render_view(h, "memory.json") == legacy
    views.flush()
    assert (migrated_store / "abc" / "derived" / "memory.json").read_bytes() == legacy
    assert imported_bytes(migrated_store, "abc", "abc.json") == legacy


def test_a_read_only_opening_serves_the_import_too(migrated_store):
    legacy = imported_bytes(migrated_store, "abc", "abc.json")
    with open_abc(migrated_store, read_only=True) as h:
        assert views.render_view(h, "memory.json") == legacy
        facts, _version = views.memory_facts(h)
        assert facts == IMPORTED_FACTS


def test_events_extend_the_imported_memory(migrated_store):
    legacy = imported_bytes(migrated_store, "abc", "abc.json")
    with open_abc(migrated_store) as h:
        h.append_many([{"type": "thread.started", "thread_id": "t"}, STARTED,
                       message("Zebra tests now pass."), file_change("src/new.rs")])
        doc = views.memory_view(h)
        assert doc["grounded_facts"][:4] == IMPORTED_FACTS
        assert [f["fact"] for f in doc["grounded_facts"][4:]] == ["Zebra tests now pass.", "file add: src/new.rs"]
        assert all("imported" not in f for f in doc["grounded_facts"][4:])
        assert doc["touched_files"] == ["docs/a.md", "src/new.rs", "src/zebra.rs"]
        assert doc["summary"] == "Legacy summary."  # no turn of this log has closed yet
        assert (doc["session_id"], doc["schema_version"]) == ("abc", 3)
        assert doc["source"]["event_count"] == 4
        h.append_many([message("Closing words."), COMPLETED])
        assert views.memory_view(h)["summary"] == "Closing words."
        views.flush()
        stored = json.loads((migrated_store / "abc" / "derived" / "memory.json").read_bytes())
        assert stored["grounded_facts"][:4] == IMPORTED_FACTS
    assert imported_bytes(migrated_store, "abc", "abc.json") == legacy


def test_imported_facts_come_before_eviction_summary_facts(migrated_store):
    summary = migrated_store / "abc" / "derived" / f"{SUMMARY_PREFIX}{'0' * 32}.json"
    summary.write_text(json.dumps({"grounded_facts": ["evicted fact about otters",
                                                      "a bare fact about quokkas"]}))
    with open_abc(migrated_store) as h:
        # something was evicted: the view is computed (with nothing from the log yet)
        facts = views.memory_view(h)["grounded_facts"]
        assert facts[:4] == IMPORTED_FACTS
        assert facts[4:] == [{"fact": "evicted fact about otters", "turn": None, "offset": None,
                              "type": "evicted", "summary": summary.name}]
        h.append_many([STARTED, message("a log fact about otters")])
        assert [f["fact"] for f in views.memory_view(h)["grounded_facts"][4:]] == [
            "evicted fact about otters", "a log fact about otters"]


def test_appends_stay_incremental_and_facts_only_grow(migrated_store):
    with open_abc(migrated_store) as h:
        facts0, (gen0, n0) = views.memory_facts(h)
        assert facts0 == IMPORTED_FACTS and n0 == 4
        st = cache.state_for(h)
        rebuilds, folded = st.rebuilds, st.folded_bytes
        before = h.file_len
        h.append_many([STARTED, message("first log fact"), COMPLETED])
        h.flush()
        facts1, (gen1, n1) = views.memory_facts(h)
        assert gen1 == gen0 and facts1[:n0] == facts0 and n1 == n0 + 1
        assert st.rebuilds == rebuilds  # the import is not read again
        assert st.folded_bytes - folded == h.file_len - before
        incremental = {n: views.render_view(h, n) for n in ("memory.json", "trajectory.jsonl")}
        views.forget(h.path)  # a cold rebuild reads the import again and agrees
        for name, data in incremental.items():
            fresh = views.render_view(h, name)
            if name == "memory.json":
                fresh, data = json.loads(fresh), json.loads(data)
                del fresh["generated_at"], data["generated_at"]
            assert fresh == data


# --- trajectory.jsonl ----------------------------------------------------------------------


def test_trajectory_is_the_imported_file_then_the_log_turns(migrated_store):
    with memfs.open_session(migrated_store, "traj-run", max_events=0) as h:
        assert views.render_view(h, "trajectory.jsonl") == LEGACY_TRAJECTORY
        # memory.json of a trajectory import is computed from its (empty) log as usual
        assert views.memory_view(h)["grounded_facts"] == []
        h.append_many([STARTED, message("hello"), COMPLETED, STARTED])
        data = views.render_view(h, "trajectory.jsonl")
        assert data.startswith(LEGACY_TRAJECTORY + b"\n")  # a final newline added: lines stay lines
        lines = [json.loads(line) for line in data.splitlines()]
        assert lines[:2] == [json.loads(line) for line in LEGACY_TRAJECTORY.splitlines()]
        assert [(t["turn"], t["outcome"]) for t in lines[2:]] == [(1, "completed"), (2, "open")]
        assert views.trajectory(h) == lines
        views.flush()
        assert (migrated_store / "traj-run" / "derived" / "trajectory.jsonl").read_bytes() == data
    assert imported_bytes(migrated_store, "traj-run", "trajectory-run.jsonl") == LEGACY_TRAJECTORY


# --- odd imports ---------------------------------------------------------------------------


def test_an_imported_file_that_is_not_an_object_is_served_until_events_come(migrated_store):
    (migrated_store / "abc" / "imported" / "abc.json").write_bytes(b"[1, 2]")
    with open_abc(migrated_store) as h:
        assert views.render_view(h, "memory.json") == b"[1, 2]"
        h.append_many([STARTED, message("only log facts")])
        doc = views.memory_view(h)
        assert [f["fact"] for f in doc["grounded_facts"]] == ["only log facts"]
        assert doc["summary"] == ""


def test_a_symlinked_imported_folder_is_not_followed(migrated_store, tmp_path):
    imported = migrated_store / "abc" / "imported"
    elsewhere = tmp_path / "elsewhere"
    imported.rename(elsewhere)
    imported.symlink_to(elsewhere)
    with open_abc(migrated_store) as h:
        doc = views.memory_view(h)
        assert doc["grounded_facts"] == [] and doc["summary"] == ""
        assert views.memory_facts(h)[0] == []


# --- search --------------------------------------------------------------------------------


def test_search_finds_legacy_facts_before_and_after_appends(migrated_store):
    results = search_store(migrated_store, "zebra parser")
    assert [(r["chunk_id"], r["snippet"], r["turn"], r["offset"]) for r in results][0] == (
        "abc:0", "Zebra parser rewritten in Rust", 2, 120)
    assert search_store(migrated_store, "quokkas")[0]["chunk_id"] == "abc:2"
    with open_abc(migrated_store) as h:
        h.append_many([STARTED, message("zebra benchmarks recorded"), COMPLETED])
    results = search_store(migrated_store, "zebra")
    assert {r["snippet"] for r in results} == {"Zebra parser rewritten in Rust", "file update: src/zebra.rs",
                                              "zebra benchmarks recorded"}
    assert search_store(migrated_store, "quokkas")[0]["chunk_id"] == "abc:2"  # indices did not move


# --- through a mount -----------------------------------------------------------------------


@needs_fuse
def test_a_mounted_migrated_session(migrated_store, tmp_path):
    legacy = imported_bytes(migrated_store, "abc", "abc.json")
    with mounted(migrated_store, tmp_path / "mnt") as m:
        s = m.mnt / "sessions" / "abc"
        assert sh("cat derived/memory.json", s).stdout.encode() == legacy
        assert sh("cat derived/trajectory.jsonl", m.mnt / "sessions" / "traj-run").stdout.encode() == LEGACY_TRAJECTORY
        found = [json.loads(line) for line in sh('cat "search/quokkas"', m.mnt).stdout.splitlines()]
        assert [(r["chunk_id"], r["snippet"]) for r in found] == [("abc:2", "a bare fact about quokkas")]
        with open(s / "events.jsonl", "a") as f:
            f.write(event("turn.started") + "\n")
            f.write(event("item.completed", item={"id": "m", "type": "agent_message", "text": "Zebra via mount."}) + "\n")
        doc = json.loads(sh("cat derived/memory.json", s).stdout)
        assert doc["grounded_facts"][:4] == IMPORTED_FACTS
        assert doc["grounded_facts"][4]["fact"] == "Zebra via mount."
        found = [json.loads(line) for line in sh('cat "search/zebra"', m.mnt).stdout.splitlines()]
        assert {r["snippet"] for r in found} >= {"Zebra parser rewritten in Rust", "Zebra via mount."}
    assert imported_bytes(migrated_store, "abc", "abc.json") == legacy
    assert os.stat(migrated_store / "abc" / "imported" / "abc.json").st_mode & 0o777 == 0o600
