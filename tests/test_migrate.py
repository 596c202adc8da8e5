"""Migration of VT Code legacy history and trajectory stores (SPEC §7)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import memfs
import pytest
from memfs.store.meta import format_rfc3339
from memfs.store.migrate import migrate_workspace, session_id_for
from memfs.store.retention import gc

MEMORY = {"session_id": "abc", "schema_version": 3, "summary": "did it", "grounded_facts": []}
TRAJECTORY = b'{"turn":1,"outcome":"completed"}\n{"turn":2,"outcome":"failed"}\n'
T_HISTORY = 1_700_000_000.25
T_LOG = 1_710_000_000.5


@pytest.fixture
def workspace(tmp_path) -> Path:
    history = tmp_path / ".vtcode" / "history"
    logs = tmp_path / ".vtcode" / "logs"
    history.mkdir(parents=True)
    logs.mkdir()
    (history / "abc.json").write_text(json.dumps(MEMORY))
    (logs / "trajectory-20240101-run.jsonl").write_bytes(TRAJECTORY)
    (logs / "plain.jsonl").write_bytes(b"{}\n")
    os.utime(history / "abc.json", (T_HISTORY, T_HISTORY))
    os.utime(logs / "trajectory-20240101-run.jsonl", (T_LOG, T_LOG))
    return tmp_path


def manifest(root: Path, name: str) -> dict:
    return json.loads((root / name / "manifest.json").read_text())


def test_naming_rules():
    assert session_id_for("history", "abc.json") == "abc"
    assert session_id_for("history", "x.memory.json") == "x.memory"
    assert session_id_for("logs", "trajectory-2024-run.jsonl") == "traj-2024-run"
    assert session_id_for("logs", "other.jsonl") == "traj-other"


def test_history_and_trajectories_are_imported(workspace):
    report = migrate_workspace(workspace)
    root = workspace / ".vtcode" / "sessions"
    assert report.root == str(root)
    assert sorted((i.source, i.session, i.status) for i in report.items) == [
        (".vtcode/history/abc.json", "abc", "imported"),
        (".vtcode/logs/plain.jsonl", "traj-plain", "imported"),
        (".vtcode/logs/trajectory-20240101-run.jsonl", "traj-20240101-run", "imported"),
    ]
    assert (root / "abc" / "derived" / "memory.json").read_text() == json.dumps(MEMORY)
    assert (root / "traj-20240101-run" / "derived" / "trajectory.jsonl").read_bytes() == TRAJECTORY
    # a verbatim copy outside derived/, which views regenerate
    assert (root / "abc" / "imported" / "abc.json").read_text() == json.dumps(MEMORY)
    assert (root / "traj-20240101-run" / "imported" / "trajectory-20240101-run.jsonl").read_bytes() == TRAJECTORY
    m = manifest(root, "abc")
    assert m["created_at"] == m["updated_at"] == format_rfc3339(T_HISTORY)
    assert (m["status"], m["turn_count"], m["event_count"], m["in_turn"]) == ("completed", 0, 0, False)
    assert m["imported_from"] == ".vtcode/history/abc.json"
    assert manifest(root, "traj-20240101-run")["updated_at"] == format_rfc3339(T_LOG)
    assert (root / "abc" / "events.jsonl").read_bytes() == b""
    assert os.stat(root / "abc").st_mode & 0o777 == 0o700
    assert os.stat(root / "abc" / "manifest.json").st_mode & 0o777 == 0o600
    assert not [p for p in root.iterdir() if p.name.startswith(".")]  # no temp folders left
    # legacy folders are kept unless asked
    assert (workspace / ".vtcode" / "history" / "abc.json").exists()
    assert (workspace / ".vtcode" / "logs" / "plain.jsonl").exists()


def test_an_imported_session_opens_on_the_fast_path(workspace):
    migrate_workspace(workspace)
    root = workspace / ".vtcode" / "sessions"
    with memfs.open_session(root, "abc") as h:
        assert h.open_report.fast_path
        assert h.manifest["status"] == "completed" and h.manifest["session_id"] == "abc"


def test_retention_does_not_take_imports_for_empty_shells(workspace):
    migrate_workspace(workspace)
    root = workspace / ".vtcode" / "sessions"
    report = gc(root, now=T_LOG + 86400)  # a day after the trajectory's mtime
    assert {r.name: r.reason for r in report.removed} == {"abc": "age"}  # months older
    assert (root / "traj-20240101-run").is_dir() and (root / "traj-plain").is_dir()


def test_remove_legacy_deletes_the_folders(workspace, tmp_path_factory):
    store = tmp_path_factory.mktemp("store")
    report = migrate_workspace(workspace, store, remove_legacy=True)
    assert report.imported == 3 and report.failed == 0
    assert all(i.removed for i in report.items)
    assert not (workspace / ".vtcode" / "history").exists()
    assert not (workspace / ".vtcode" / "logs").exists()
    assert sorted(report.removed_folders) == [".vtcode/history", ".vtcode/logs"]
    assert (store / "abc" / "derived" / "memory.json").exists()


def test_remove_legacy_keeps_what_was_not_imported(workspace):
    (workspace / ".vtcode" / "history" / "README.txt").write_text("not a history file")
    (workspace / ".vtcode" / "history" / "broken.json").write_text("[1, 2]")
    report = migrate_workspace(workspace, remove_legacy=True)
    broken = next(i for i in report.items if i.session == "broken")
    assert broken.status == "invalid" and not broken.removed
    assert report.failed == 1
    history = workspace / ".vtcode" / "history"
    assert sorted(p.name for p in history.iterdir()) == ["README.txt", "broken.json"]
    assert ".vtcode/history" in report.kept_folders
    assert not (workspace / ".vtcode" / "logs").exists()


def test_a_rerun_is_harmless_and_conflicts_are_reported(workspace):
    migrate_workspace(workspace)
    root = workspace / ".vtcode" / "sessions"
    (root / "abc" / "derived" / "memory.json").write_text("{}")  # views regenerated it
    again = migrate_workspace(workspace)
    assert {i.status for i in again.items} == {"already-imported"}
    (workspace / ".vtcode" / "history" / "abc.json").write_text('{"changed": true}')
    third = migrate_workspace(workspace, remove_legacy=True)
    abc = next(i for i in third.items if i.session == "abc")
    assert abc.status == "conflict" and not abc.removed
    assert (workspace / ".vtcode" / "history" / "abc.json").exists()
    assert (root / "abc" / "imported" / "abc.json").read_text() == json.dumps(MEMORY)


def test_dry_run_changes_nothing(workspace):
    report = migrate_workspace(workspace, dry_run=True, remove_legacy=True)
    assert report.imported == 3
    assert not (workspace / ".vtcode" / "sessions").exists()
    assert (workspace / ".vtcode" / "history" / "abc.json").exists()


def test_symlinks_are_not_followed(workspace, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    (elsewhere / "secret.json").write_text("{}")
    (workspace / ".vtcode" / "history" / "link.json").symlink_to(elsewhere / "secret.json")
    report = migrate_workspace(workspace)
    assert "link" not in [i.session for i in report.items]


def test_a_workspace_without_legacy_folders(tmp_path):
    report = migrate_workspace(tmp_path)
    assert report.items == [] and not (tmp_path / ".vtcode").exists()


def test_an_imported_session_stays_imported_after_appends(workspace):
    """Appends rewrite the manifest (dropping ``imported_from``); gc must still see the import."""
    migrate_workspace(workspace)
    root = workspace / ".vtcode" / "sessions"
    with memfs.open_session(root, "abc", durability="write") as h:
        h.append({"type": "thread.completed", "thread_id": "t", "session_id": "abc", "subtype": "success",
                  "outcome_code": "completed", "usage": {}, "num_turns": 0})
    assert manifest(root, "abc")["status"] == "completed" and manifest(root, "abc")["turn_count"] == 0
    report = gc(root, dry_run=True)
    assert "abc" not in [r.name for r in report.removed if r.reason == "empty"]
