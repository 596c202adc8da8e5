"""Real agents' streams through a real mount (SPEC §2, §4.3): a recorded `codex exec --json`
stream appended with `cat >>`, a foreign line refused with its reason, context.md's budget."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mounting import mounted, needs_fuse, sh

pytestmark = needs_fuse

CODEX = Path(__file__).parent / "fixtures" / "codex_exec.jsonl"


@pytest.fixture
def mount(tmp_path):
    with mounted(tmp_path / "store", tmp_path / "mnt") as m:
        yield m


def test_cat_a_codex_stream_into_events_jsonl(mount):
    s = mount.mnt / "sessions" / "codex"
    os.mkdir(s)
    done = sh(f"cat {CODEX} >> events.jsonl", s, check=False)
    assert done.returncode == 0, done.stderr  # every line accepted: no "Bad message"
    lines = CODEX.read_bytes().count(b"\n")
    assert sh("wc -l < events.jsonl", s).stdout.strip() == str(lines)
    assert not (s / "rejected.jsonl").exists() or (s / "rejected.jsonl").read_bytes() == b""
    manifest = json.loads((s / "manifest.json").read_text())
    assert (manifest["in_turn"], manifest["turn_count"], manifest["event_count"]) == (False, 2, lines)
    outcomes = sh("jq -r .outcome derived/trajectory.jsonl", s).stdout.split()
    assert outcomes == ["completed", "failed"]
    reason = ("stream disconnected before completion: error sending request for url "
              "(https://api.openai.com/v1/responses)")
    facts = sh("jq -c '.grounded_facts[] | [.type, .fact, .turn]' derived/memory.json", s).stdout.splitlines()
    assert json.dumps(["turn.failed", reason, 2], separators=(",", ":")) in facts
    assert '["mcp_tool_call","called docs.search",1]' in facts
    assert '["command_execution","declined: git push origin main",1]' in facts
    progress = (s / "derived" / "progress.md").read_text()
    assert "**Completion:** 67%" in progress
    assert "[x] 1 — Read src/net.py\n[x] 2 — Add a retry loop with backoff\n[ ] 3 — Run the tests\n" in progress
    assert "**Goal:** Read src/net.py; Add a retry loop with backoff; Run the tests" in progress
    summary = (s / "derived" / "summary.md").read_text()
    assert "- **Agent:** codex (thread `0199a213-81c0-7800-8aa1-bbab2a035a53`)" in summary
    assert "derived/context.md" in (mount.mnt / "README.md").read_text()
    brief = sh("cat derived/context.md", s).stdout
    assert "## Open todos\n- [ ] Run the tests\n" in brief and reason in brief
    small = sh("cat 'derived/context.md?budget=50'", s).stdout
    assert 0 < len(small.encode()) <= 200 and small.startswith("# Context: session codex\n")
    assert "context.md" in os.listdir(s / "derived")
    assert sh("cat 'derived/context.md?budget=0'", s, check=False).returncode != 0  # names nothing


def test_a_claude_code_line_is_refused_with_the_command_to_use(mount):
    s = mount.mnt / "sessions" / "claude"
    os.mkdir(s)
    line = '{"type":"assistant","message":{"role":"assistant","content":[]},"session_id":"abc"}'
    done = sh(f"echo '{line}' >> events.jsonl", s, check=False)
    assert done.returncode != 0 and "Bad message" in done.stderr
    rejected = json.loads((s / "rejected.jsonl").read_text().splitlines()[-1])
    assert rejected["reason"] == ('Claude Code stream-json line ("type":"assistant"): '
                                  'use "memfs record --format claude" or "memfs import"')
    assert os.getxattr(s, "user.memfs.last_error").decode().endswith(rejected["reason"])
    assert (s / "events.jsonl").read_bytes() == b""
