"""Audit packs (SPEC §7): create and verify."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import memfs
import pytest
from memfs.errors import NotFound
from memfs.store.pack import create_pack, verify_pack

EVENTS = [
    {"schema_version": "0.18.0", "event": {"type": "thread.started", "thread_id": "t"}},
    {"schema_version": "0.18.0", "event": {"type": "turn.started"}},
    {"schema_version": "0.18.0", "event": {"type": "turn.completed", "usage": {}}},
]


@pytest.fixture
def session(tmp_path) -> Path:
    with memfs.open_session(tmp_path, "sess-1", durability="write", metadata_interval=0) as h:
        h.append_many(EVENTS)
    (tmp_path / "sess-1" / "derived").mkdir(mode=0o700)
    (tmp_path / "sess-1" / "derived" / "summary.md").write_text("# a view\n")
    return tmp_path / "sess-1"


def test_a_clean_pack_verifies(session):
    root = session.parent
    path, pack = create_pack(root, "sess-1")
    assert path == session / "derived" / "audit-pack.json"
    on_disk = json.loads(path.read_text())
    assert on_disk == pack
    assert path.read_text().startswith("{\n  ")  # pretty
    assert pack["schema_version"] == 1 and pack["session_id"] == "sess-1"
    assert (pack["status"], pack["turn_count"], pack["event_count"]) == ("active", 1, 3)
    paths = [e["path"] for e in pack["entries"]]
    assert paths == sorted(paths)
    assert "audit-pack.json" not in " ".join(paths)  # the pack excludes itself
    assert {"events.jsonl", "manifest.json", "index/turns.json", "derived/summary.md"} <= set(paths)
    assert "session.lock" not in paths and (session / "session.lock").exists()  # not content
    events = next(e for e in pack["entries"] if e["path"] == "events.jsonl")
    data = (session / "events.jsonl").read_bytes()
    assert events == {"path": "events.jsonl", "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    result = verify_pack(root, "sess-1")
    assert result.valid and result.verified
    assert (result.mismatches, result.missing, result.unaccounted) == ([], [], [])
    assert result.checked == len(paths)


def test_a_one_byte_change_is_a_mismatch(session):
    create_pack(session.parent, "sess-1")
    view = session / "derived" / "summary.md"
    view.write_bytes(view.read_bytes().replace(b"a", b"b", 1))
    result = verify_pack(session.parent, "sess-1")
    assert result.valid and not result.verified
    assert result.mismatches == ["derived/summary.md"]


def test_a_deleted_file_is_missing(session):
    create_pack(session.parent, "sess-1")
    (session / "derived" / "summary.md").unlink()
    result = verify_pack(session.parent, "sess-1")
    assert not result.verified and result.missing == ["derived/summary.md"]


def test_a_new_file_is_unaccounted_and_fails(session):
    create_pack(session.parent, "sess-1")
    (session / "derived" / "new.md").write_text("later")
    result = verify_pack(session.parent, "sess-1")
    assert result.valid and not result.verified and result.unaccounted == ["derived/new.md"]


def test_symlinks_are_neither_listed_nor_followed(session, tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside")
    (outside / "secret").write_text("x")
    (session / "derived" / "link").symlink_to(outside / "secret")
    (session / "derived" / "dirlink").symlink_to(outside)
    _, pack = create_pack(session.parent, "sess-1")
    assert not any("link" in e["path"] or "secret" in e["path"] for e in pack["entries"])


def rewrite_pack(session: Path, change) -> None:
    path = session / "derived" / "audit-pack.json"
    pack = json.loads(path.read_text())
    change(pack)
    path.write_text(json.dumps(pack))


@pytest.mark.parametrize("bad", ["../x", "/etc/passwd", "a/../../b", ""])
def test_unsafe_entry_paths_make_an_invalid_pack(session, bad):
    create_pack(session.parent, "sess-1")
    rewrite_pack(session, lambda p: p["entries"].append({"path": bad, "bytes": 1, "sha256": "0" * 64}))
    result = verify_pack(session.parent, "sess-1")
    assert not result.valid and not result.verified
    assert "unsafe path" in result.reason


@pytest.mark.parametrize("version", [2, 0, "1", None, True])
def test_an_unknown_schema_version_is_an_invalid_pack(session, version):
    create_pack(session.parent, "sess-1")
    rewrite_pack(session, lambda p: p.__setitem__("schema_version", version))
    result = verify_pack(session.parent, "sess-1")
    assert not result.valid and not result.verified
    assert "schema_version" in result.reason


def test_malformed_entries_make_an_invalid_pack(session):
    create_pack(session.parent, "sess-1")
    rewrite_pack(session, lambda p: p["entries"][0].__setitem__("sha256", "xyz"))
    assert not verify_pack(session.parent, "sess-1").valid
    create_pack(session.parent, "sess-1")
    rewrite_pack(session, lambda p: p["entries"].append(dict(p["entries"][0])))
    assert "twice" in verify_pack(session.parent, "sess-1").reason


def test_a_pack_written_elsewhere_and_inside_under_another_name(session, tmp_path_factory):
    root = session.parent
    out = tmp_path_factory.mktemp("out") / "pack.json"
    path, _ = create_pack(root, "sess-1", out)
    assert path == out and verify_pack(root, "sess-1", out).verified
    inside = session / "derived" / "my-pack.json"
    _, pack = create_pack(root, "sess-1", inside)
    assert "derived/my-pack.json" not in [e["path"] for e in pack["entries"]]
    result = verify_pack(root, "sess-1", inside)
    assert result.verified and result.unaccounted == []


def test_a_missing_pack_or_session_is_an_error(session):
    with pytest.raises(FileNotFoundError):
        verify_pack(session.parent, "sess-1")
    with pytest.raises(NotFound):
        create_pack(session.parent, "nope")
