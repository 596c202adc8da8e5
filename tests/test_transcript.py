"""``derived/transcript.md`` — a session as Markdown for people (SPEC §11): what it shows of a
log (prompts, messages, tool calls with arguments and results, failures, usage), long outputs
cut, and, through a real mount, the captured Claude Code and Codex fixtures imported, the
view growing as the log does."""

from __future__ import annotations

import json
import re
from pathlib import Path

import memfs
from memfs import views
from memfs.export.markdown import render
from memfs.store import about

from agent_helpers import cli
from mounting import event, mounted, needs_fuse, sh
from store_helpers import wait_until

AGENTS = Path(__file__).parent / "fixtures" / "agents"

LINES = [
    event("thread.started", thread_id="t-1"),
    event("turn.started", context={"origin": "user", "prompt": "Make the tests pass"}),
    event("item.completed", item={"id": "r1", "type": "reasoning", "text": "Look at the failing test first."}),
    event("item.started", item={"id": "c1", "type": "command_execution", "command": "pytest -q",
                                "status": "in_progress"}),
    event("item.completed", item={"id": "c1", "type": "command_execution", "command": "pytest -q",
                                  "status": "failed", "exit_code": 1,
                                  "aggregated_output": "E   assert 1 == 2\n```\nfence inside\n"}),
    event("item.completed", item={"id": "x1", "type": "mcp_tool_call", "server": "notes", "tool": "lookup",
                                  "arguments": {"key": "release"}, "result": None,
                                  "error": {"message": "no such note"}, "status": "failed"}),
    event("item.completed", item={"id": "f1", "type": "file_change", "status": "completed",
                                  "changes": [{"path": "src/app.py", "kind": "update"}]}),
    event("item.completed", item={"id": "m1", "type": "agent_message", "text": "Fixed the off-by-one."}),
    event("turn.completed", usage={"input_tokens": 1200, "cached_input_tokens": 800, "output_tokens": 95}),
    event("turn.started", context={"origin": "user", "prompt": "Now deploy"}),
    event("item.completed", item={"id": "t1", "type": "tool_invocation", "tool_name": "Deploy", "status": "failed",
                                  "arguments": {"env": "prod"}, "output": "x" * 10000}),
    event("turn.failed", message="deploy refused"),
]


def session(root: Path, lines=LINES, name: str = "s") -> memfs.SessionHandle:
    h = memfs.open_session(root, name, durability="write")
    h.append_many(lines)
    return h


def test_a_turn_shows_its_prompt_messages_tool_calls_results_failures_and_usage(tmp_path):
    with session(tmp_path) as h:
        about.merge(h.path, {"agent": "codex", "title": "Green tests", "project": "/work/app", "model": "gpt-5.5"})
        text = render(h)
    assert text.startswith("# Green tests\n")
    assert "- **Agent:** codex\n" in text and "- **Model:** gpt-5.5\n" in text and "- **Project:** /work/app\n" in text
    turn1 = text[text.index("## Turn 1 — completed"):text.index("## Turn 2")]
    assert "**Prompt** (user):\n\n> Make the tests pass\n" in turn1
    assert "> Look at the failing test first." in turn1  # reasoning, quoted
    assert "**Command** `pytest -q` — **FAILED** (exit 1)" in turn1
    assert "````text\nE   assert 1 == 2\n```\nfence inside\n````\n" in turn1  # a longer fence than the output's
    assert turn1.count("pytest -q") == 1  # an item's lifecycle is one entry, its last state
    assert "**MCP tool** `notes.lookup` — **FAILED**" in turn1 and '"key": "release"' in turn1
    assert "**Error:** no such note" in turn1
    assert "- update `src/app.py`" in turn1
    assert "Fixed the off-by-one." in turn1
    assert "_Usage: input 1,200 · cached input 800 · output 95_" in turn1
    turn2 = text[text.index("## Turn 2 — FAILED"):]
    assert "> Now deploy" in turn2 and "**Tool** `Deploy` — **FAILED**" in turn2
    assert "**Turn failed:** deploy refused" in turn2


def test_a_long_output_is_cut_to_its_first_and_last_2_kib_with_a_marker(tmp_path):
    with session(tmp_path) as h:
        text = render(h)
    m = re.search(r"```text\n(x+)\n… \[(\d+) bytes cut\] …\n(x+)\n```", text)
    assert m is not None
    assert (len(m.group(1)), len(m.group(3)), int(m.group(2))) == (2048, 2048, 10000 - 4096)


def test_a_prompt_a_later_capture_noted_and_an_open_turn_show(tmp_path):
    lines = [event("turn.started"), event("item.completed", item={"id": "m", "type": "agent_message", "text": "hi"}),
             event("turn.completed", usage={}), event("turn.started")]
    with session(tmp_path, lines) as h:
        about.merge(h.path, {"turn_notes": {"1": {"prompt": "the noted prompt"}}})
        text = views.render_view(h, "transcript.md").decode()
        assert "## Turn 1 — completed\n\n**Prompt** (user):\n\n> the noted prompt\n" in text
        assert "## Turn 2 — open\n" in text
        h.append(event("turn.failed", message="late failure"))
        again = views.render_view(h, "transcript.md").decode()
    assert "## Turn 2 — FAILED\n\n**Turn failed:** late failure\n" in again
    assert again.startswith(text[:text.index("## Turn 2")])


def test_the_view_kept_up_by_appends_equals_a_fresh_render(tmp_path):
    with session(tmp_path, LINES[:3]) as h:
        for line in LINES[3:]:
            views.render_view(h, "transcript.md")
            h.append(line)
        about.merge(h.path, {"title": "Renamed"})
        assert views.render_view(h, "transcript.md").decode() == render(h)
        assert render(h).startswith("# Renamed\n")
    with memfs.open_session(tmp_path, "s", read_only=True) as h:  # a new opening renders it whole
        assert views.render_view(h, "transcript.md").decode() == render(h)


def test_an_empty_session_says_so(tmp_path):
    with memfs.open_session(tmp_path, "empty", durability="write") as h:
        assert render(h) == "# empty\n\n- **Session:** `empty`\n\n_No events yet._\n"


@needs_fuse
def test_captured_claude_and_codex_sessions_read_as_markdown_in_a_mount_and_grow(tmp_path):
    store = tmp_path / "store"
    sources = [AGENTS / "claude" / "ok_failing_command" / "home" / ".claude",
               AGENTS / "claude" / "api_error" / "home" / ".claude",
               AGENTS / "codex" / "mcp_call" / "home" / ".codex"]
    proc = cli("import", "--store", str(store), "--json", *map(str, sources))
    assert proc.returncode == 0, proc.stderr
    imported = json.loads(proc.stdout)
    assert [i["status"] for i in imported] == ["imported"] * 3
    claude_ok, claude_err, codex_mcp = (next(i["session"] for i in imported if scenario in i["source"])
                                        for scenario in ("ok_failing_command", "api_error", "mcp_call"))
    with mounted(store, tmp_path / "mnt") as m:
        sessions = m.mnt / "sessions"
        assert "transcript.md" in sh(f"ls {claude_ok}/derived", sessions).stdout.split()
        ok = sh(f"cat {claude_ok}/derived/transcript.md", sessions).stdout
        assert ok.startswith("# Show me the changelog\n") and "- **Agent:** claude 2.1.332\n" in ok
        assert "> Show me the changelog" in ok
        assert "**Command** `cat CHANGELOG.md` — **FAILED** (exit 1)" in ok
        assert "cat: CHANGELOG.md: No such file or directory" in ok
        assert "There is no CHANGELOG.md in this project." in ok
        assert "_Usage: input 2,100 · output 45_" in ok
        err = sh(f"cat {claude_err}/derived/transcript.md", sessions).stdout
        assert "## Turn 1 — FAILED" in err and "**Turn failed:** API Error: 500" in err
        assert "**Error:** API retry 1/2" in err
        mcp = sh(f"cat {codex_mcp}/derived/transcript.md", sessions).stdout
        assert "**MCP tool** `notes.lookup` — completed" in mcp and '"key": "release"' in mcp
        assert "v1.2 ships on Friday" in mcp and "- **Agent:** codex 0.171.0\n" in mcp
        # it grows with the log
        size = len(ok.encode())
        new_turn = [event("turn.started", context={"origin": "user", "prompt": "And the README?"}),
                    event("item.completed", item={"id": "n1", "type": "agent_message", "text": "It is short."}),
                    event("turn.completed", usage={"input_tokens": 7})]
        sh("cat >> events.jsonl <<'EOF'\n" + "\n".join(new_turn) + "\nEOF", sessions / claude_ok)
        grown = sh(f"cat {claude_ok}/derived/transcript.md", sessions).stdout
        assert grown.startswith(ok.rstrip("\n")) and len(grown.encode()) > size
        assert "## Turn 2 — completed\n\n**Prompt** (user):\n\n> And the README?\n" in grown
        assert "It is short." in grown
        assert int(sh(f"stat -c %s {claude_ok}/derived/transcript.md", sessions).stdout) == len(grown.encode())
        # the refreshed view is also in the backing store (write-behind)
        stored = store / claude_ok / "derived" / "transcript.md"
        wait_until(lambda: stored.exists() and stored.read_text() == grown, "transcript.md in the store")
