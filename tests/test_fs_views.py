"""Derived views and search files through a real mount (SPEC §4, §5, §6)."""

from __future__ import annotations

import errno
import json
import os

import pytest

from mounting import event, mounted, needs_fuse, sh

pytestmark = needs_fuse

LOG = [
    event("thread.started", thread_id="t1"),
    event("turn.started"),
    event("item.completed", item={"id": "m1", "type": "agent_message", "text": "Added the retry loop to the client."}),
    event("item.completed", item={"id": "f1", "type": "file_change", "status": "completed",
                                  "changes": [{"path": "src/net.py", "kind": "update"}]}),
    event("turn.completed", usage={"input_tokens": 1200, "output_tokens": 95}),
    event("turn.started"),
    event("item.completed", item={"id": "c1", "type": "command_execution", "command": "pytest -q",
                                  "status": "failed", "exit_code": 1}),
    event("turn.failed", message="tests still fail on the timeout path"),
]


@pytest.fixture
def session(tmp_path):
    with mounted(tmp_path / "store", tmp_path / "mnt") as m:
        s = m.mnt / "sessions" / "s1"
        os.mkdir(s)
        with open(s / "events.jsonl", "a") as f:
            f.write("\n".join(LOG) + "\n")
        yield m, s


def test_derived_listing_and_turn_files(session):
    m, s = session
    names = set(os.listdir(s / "derived"))
    assert {"memory.json", "trajectory.jsonl", "summary.md", "progress.json", "progress.md", "goal.json",
            "turns"} <= names
    assert sorted(os.listdir(s / "derived" / "turns")) == ["1.jsonl", "2.jsonl"]
    log = (s / "events.jsonl").read_bytes()
    for entry in json.loads((s / "index" / "turns.json").read_text())["entries"]:
        turn = (s / "derived" / "turns" / f"{entry['turn_number']}.jsonl").read_bytes()
        assert turn == log[entry["start_offset"]:entry["end_offset"]]
    assert not (s / "derived" / "turns" / "3.jsonl").exists()


def test_tools_agree_on_memory_json(session):
    m, s = session
    raw = (s / "derived" / "memory.json").read_bytes()
    assert int(sh("wc -c < derived/memory.json", s).stdout) == len(raw) == os.stat(s / "derived" / "memory.json").st_size
    facts = sh("jq -r '.grounded_facts[].fact' derived/memory.json", s).stdout.splitlines()
    assert facts == [
        "Added the retry loop to the client.",
        "file update: src/net.py",
        "ran pytest -q (exit 1)",
        "tests still fail on the timeout path",
    ]
    # the summary is the last agent message of the last closed turn: turn 2 has none
    assert sh("jq -r .summary derived/memory.json", s).stdout == "\n"
    assert sh("jq -r '.touched_files[]' derived/memory.json", s).stdout == "src/net.py\n"
    assert sh("grep -c retry derived/memory.json", s).stdout.strip() == "1"
    outcomes = [json.loads(line)["outcome"] for line in sh("cat derived/trajectory.jsonl", s).stdout.splitlines()]
    assert outcomes == ["completed", "failed"]


def test_a_view_read_right_after_an_append_includes_it(session):
    m, s = session
    before = json.loads((s / "derived" / "memory.json").read_text())
    sh("echo '" + event("item.completed", item={"id": "m9", "type": "decision", "summary": "Use exponential backoff",
                                                 "rationale": "fewer retries"}) + "' >> events.jsonl", s)
    after = json.loads(sh("cat derived/memory.json", s).stdout)
    assert [f["fact"] for f in after["grounded_facts"]][-1] == "Use exponential backoff"
    assert after["source"]["event_count"] == before["source"]["event_count"] + 1


def test_views_reach_the_backing_store(session):
    m, s = session
    through_mount = (s / "derived" / "summary.md").read_bytes()
    m.stop()
    on_disk = m.store / "s1" / "derived" / "summary.md"
    assert on_disk.read_bytes() == through_mount
    assert oct(on_disk.stat().st_mode & 0o777) == "0o600"


def test_search_files(session):
    m, s = session
    results = [json.loads(line) for line in sh('cat "search/retry loop"', s).stdout.splitlines()]
    assert results and results[0]["snippet"] == "Added the retry loop to the client."
    first = results[0]
    assert first["session_id"] == "s1" and first["turn"] == 1 and first["source"] == "session"
    assert first["chunk_id"] == "s1:0" and first["start_line"] == 0 and first["end_line"] == 0
    log = (s / "events.jsonl").read_bytes()
    assert b"retry loop" in log[first["offset"]:].split(b"\n", 1)[0]  # provenance back to the event
    assert len(sh('cat "search/the?k=1"', s).stdout.splitlines()) == 1
    text = sh('cat "search/timeout tests?format=text"', s).stdout.splitlines()
    score, chunk, snippet = text[0].split("\t")
    assert float(score) > 0 and chunk.startswith("s1:") and "timeout" in snippet
    assert sh('grep -c pytest "search/pytest"', s).stdout.strip() == "1"
    root = [json.loads(line) for line in sh('cat "search/retry loop"', m.mnt).stdout.splitlines()]
    assert root[0]["chunk_id"] == "s1:0"
    assert os.listdir(s / "search") == [] and os.listdir(m.mnt / "search") == []
    for empty in ("search/ ", "search/?k=3", "search/!!!"):
        with pytest.raises(OSError) as err:
            (s / empty).read_bytes()
        assert err.value.errno == errno.ENOENT, empty


def test_new_fact_is_searchable_right_after_its_append(session):
    m, s = session
    assert sh('cat "search/zeppelin"', s).stdout == ""
    sh("echo '" + event("item.completed", item={"id": "z", "type": "agent_message", "text": "zeppelin mode on"})
       + "' >> events.jsonl", s)
    got = [json.loads(line)["snippet"] for line in sh('cat "search/zeppelin"', m.mnt).stdout.splitlines()]
    assert got == ["zeppelin mode on"]
