"""Derived views through a real mount (SPEC §4, §6); search files: tests/test_search_mount.py."""

from __future__ import annotations

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
def mounted_session(tmp_path):
    with mounted(tmp_path / "store", tmp_path / "mnt") as m:
        s = m.mnt / "sessions" / "s1"
        os.mkdir(s)
        with open(s / "events.jsonl", "a") as f:
            f.write("\n".join(LOG) + "\n")
        yield m, s


def test_derived_listing_and_turn_files(mounted_session):
    m, s = mounted_session
    names = set(os.listdir(s / "derived"))
    assert {"memory.json", "trajectory.jsonl", "summary.md", "progress.json", "progress.md", "goal.json",
            "turns"} <= names
    assert sorted(os.listdir(s / "derived" / "turns")) == ["1.jsonl", "2.jsonl"]
    log = (s / "events.jsonl").read_bytes()
    for entry in json.loads((s / "index" / "turns.json").read_text())["entries"]:
        turn = (s / "derived" / "turns" / f"{entry['turn_number']}.jsonl").read_bytes()
        assert turn == log[entry["start_offset"]:entry["end_offset"]]
    assert not (s / "derived" / "turns" / "3.jsonl").exists()


def test_tools_agree_on_memory_json(mounted_session):
    m, s = mounted_session
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


def test_a_view_read_right_after_an_append_includes_it(mounted_session):
    m, s = mounted_session
    before = json.loads((s / "derived" / "memory.json").read_text())
    sh("echo '" + event("item.completed", item={"id": "m9", "type": "decision", "summary": "Use exponential backoff",
                                                 "rationale": "fewer retries"}) + "' >> events.jsonl", s)
    after = json.loads(sh("cat derived/memory.json", s).stdout)
    assert [f["fact"] for f in after["grounded_facts"]][-1] == "Use exponential backoff"
    assert after["source"]["event_count"] == before["source"]["event_count"] + 1


def test_views_reach_the_backing_store(mounted_session):
    m, s = mounted_session
    through_mount = (s / "derived" / "summary.md").read_bytes()
    m.stop()
    on_disk = m.store / "s1" / "derived" / "summary.md"
    assert on_disk.read_bytes() == through_mount
    assert oct(on_disk.stat().st_mode & 0o777) == "0o600"
