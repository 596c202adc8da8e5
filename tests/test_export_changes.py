"""An export shows what a turn changed (issue 53): a Claude Code Edit/Write, a Codex
``apply_patch`` and a Gemini CLI ``replace`` keep their diff (or the written content) in the
``file_change`` item, and the Markdown export shows it in a fenced ``diff`` block.

The captured sessions (tests/fixtures/agents) ran a shell command; each test swaps that one
call (and its result) for a file edit in the agent's own record shape, keeping the rest of the
captured file, then imports it with ``memfs import`` as a user would."""

from __future__ import annotations

import json
from pathlib import Path

from memfs.agents.changes import claude_change, event_changes, patch_changes

from agent_helpers import cli, events_of

AGENTS = Path(__file__).parent / "fixtures" / "agents"
OLD, NEW = "def f():\n    return 1\n", "def f():\n    return 2\n"
HUNK = "@@ -1,2 +1,2 @@\n def f():\n-    return 1\n+    return 2\n"


def swapped(src: Path, dst: Path, swap) -> Path:
    """``src`` with each JSON line passed through ``swap`` (``{}``: dropped), written to ``dst``."""
    lines = [json.dumps(rec) for line in src.read_text().splitlines() if line.strip()
             if (rec := swap(json.loads(line)))]
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text("\n".join(lines) + "\n")
    return dst


def imported(store: Path, path: Path) -> str:
    done = cli("import", "--store", str(store), "--json", str(path))
    assert done.returncode == 0, done.stderr
    sessions = [i["session"] for i in json.loads(done.stdout) if i["status"] == "imported"]
    assert len(sessions) == 1, done.stdout
    return sessions[0]


def changes_of(store: Path, session: str) -> list[dict]:
    items = [e["item"] for e in events_of(store, session)
             if e["type"] == "item.completed" and e["item"]["type"] == "file_change"]
    assert len(items) == 1, items
    return items[0]["changes"]


def markdown(store: Path, session: str) -> str:
    done = cli("export", "--store", str(store), session, "--to", "markdown")
    assert done.returncode == 0, done.stderr
    return done.stdout


def claude_swap(tool: str, args: dict, extra):
    def swap(record: dict) -> dict:
        content = record.get("message", {}).get("content")
        for block in content if isinstance(content, list) else []:
            if block.get("type") == "tool_use" and block.get("name") == "Bash":
                block.update(name=tool, input=args)
            elif block.get("type") == "tool_result":
                block.update(content="The file has been updated.", is_error=False)
                record["toolUseResult"] = extra
        return record
    return swap


def test_a_claude_edit_keeps_its_diff_and_the_export_shows_it(tmp_path):
    src = next((AGENTS / "claude" / "ok_failing_command" / "home" / ".claude" / "projects").glob("*/*.jsonl"))
    path = "/tmp/memfs-agent-capture/claude/ok_failing_command/proj/app.py"
    args = {"file_path": path, "old_string": OLD, "new_string": NEW}
    record = swapped(src, tmp_path / "home" / src.relative_to(AGENTS / "claude" / "ok_failing_command" / "home"),
                     claude_swap("Edit", args, {"filePath": path, "oldString": OLD, "newString": NEW}))
    store = tmp_path / "store"
    session = imported(store, record)
    diff = f"--- {path}\n+++ {path}\n{HUNK}"
    assert changes_of(store, session) == [{"path": path, "kind": "update", "diff": diff}]
    text = markdown(store, session)
    assert f"- update `{path}`\n\n```diff\n{diff}```\n" in text


def test_a_claude_write_of_a_new_file_shows_its_content(tmp_path):
    scenario = AGENTS / "claude" / "large_output" / "home"
    src = next((scenario / ".claude" / "projects").glob("*/*.jsonl"))
    path = "/tmp/memfs-agent-capture/claude/large_output/proj/notes.txt"
    record = swapped(src, tmp_path / "home" / src.relative_to(scenario),
                     claude_swap("Write", {"file_path": path, "content": "first line\n```\nsecond"},
                                 {"type": "create", "filePath": path, "content": "first line\n```\nsecond"}))
    store = tmp_path / "store"
    session = imported(store, record)
    assert changes_of(store, session) == [{"path": path, "kind": "add", "content": "first line\n```\nsecond"}]
    assert f"- add `{path}`\n\n````text\nfirst line\n```\nsecond\n````\n" in markdown(store, session)


def test_a_codex_apply_patch_keeps_each_files_section(tmp_path):
    scenario = AGENTS / "codex" / "ok_failing_command" / "home"
    src = next((scenario / ".codex" / "sessions").glob("*/*/*/*.jsonl"))
    patch = ("*** Begin Patch\n*** Update File: app.py\n" + HUNK.replace("@@ -1,2 +1,2 @@", "@@") +
             "*** Add File: NEW.md\n+# New\n+text\n*** Delete File: old.txt\n*** End Patch\n")

    def swap(record: dict) -> dict:
        p = record.get("payload", {})
        if p.get("type") == "function_call" and p.get("call_id") == "call_0636000002":
            record["payload"] = {"type": "custom_tool_call", "status": "completed", "call_id": p["call_id"],
                                 "name": "apply_patch", "input": patch}
        elif p.get("type") == "function_call_output" and p.get("call_id") == "call_0636000002":
            record["payload"] = {"type": "custom_tool_call_output", "call_id": p["call_id"],
                                 "output": "Success. Updated the following files:\nA NEW.md\nM app.py\nD old.txt\n"}
        elif p.get("type") == "item_completed" and p["item"].get("id") == "call_0636000002":
            return {}  # (a rollout before 0.171 has no item_completed: the patch is read from the call)
        return record

    store = tmp_path / "store"
    session = imported(store, swapped(src, tmp_path / "home" / src.relative_to(scenario), swap))
    diff = "--- a/app.py\n+++ b/app.py\n@@\n def f():\n-    return 1\n+    return 2\n"
    assert changes_of(store, session) == [{"path": "app.py", "kind": "update", "diff": diff},
                                          {"path": "NEW.md", "kind": "add", "content": "# New\ntext\n"},
                                          {"path": "old.txt", "kind": "delete"}]
    text = markdown(store, session)
    assert f"- update `app.py`\n\n```diff\n{diff}```\n\n- add `NEW.md`\n\n```text\n# New\ntext\n```\n\n" \
           "- delete `old.txt`\n" in text
    assert "\n## Turn" in text and "\\## New" not in text  # the content is in its block, not a heading


def test_a_codex_file_change_item_keeps_its_unified_diff(tmp_path):
    scenario = AGENTS / "codex" / "ok_failing_command" / "home"
    src = next((scenario / ".codex" / "sessions").glob("*/*/*/*.jsonl"))

    def swap(record: dict) -> dict:
        p = record.get("payload", {})
        if p.get("type") == "item_completed" and p["item"].get("id") == "call_0636000002":
            p["item"] = {"type": "FileChange", "id": "call_0636000002", "status": "completed",
                         "changes": {"app.py": {"type": "update", "unified_diff": HUNK, "move_path": None}}}
        return record

    store = tmp_path / "store"
    session = imported(store, swapped(src, tmp_path / "home" / src.relative_to(scenario), swap))
    diff = f"--- a/app.py\n+++ b/app.py\n{HUNK}"
    assert changes_of(store, session) == [{"path": "app.py", "kind": "update", "diff": diff}]
    assert f"- update `app.py`\n\n```diff\n{diff}```\n" in markdown(store, session)


def test_a_gemini_replace_keeps_its_file_diff(tmp_path):
    scenario = AGENTS / "gemini" / "ok_failing_command" / "home"
    src = next((scenario / ".gemini" / "tmp").glob("*/chats/*.jsonl"))
    path = "/tmp/memfs-agent-capture/gemini/ok_failing_command/proj/app.py"
    file_diff = f"Index: app.py\n===================================================================\n" \
                f"--- app.py\tOriginal\n+++ app.py\tWritten\n{HUNK}"

    def swap(record: dict) -> dict:
        for call in record.get("toolCalls") or []:
            if call.get("name") == "run_shell_command":
                call.update(name="replace", args={"file_path": path, "old_string": OLD, "new_string": NEW},
                            resultDisplay={"fileDiff": file_diff, "fileName": "app.py", "originalContent": OLD,
                                           "newContent": NEW},
                            displayName="Edit", description="app.py")
                for result in call.get("result") or []:
                    result["functionResponse"].update(name="replace",
                                                      response={"output": f"Successfully modified file: {path}"})
        return record

    store = tmp_path / "store"
    session = imported(store, swapped(src, tmp_path / "home" / src.relative_to(scenario), swap))
    assert changes_of(store, session) == [{"path": path, "kind": "update", "diff": file_diff}]
    assert f"```diff\n{file_diff}```\n" in markdown(store, session)


def test_the_shapes_a_capture_did_not_cover():
    change = claude_change({"path": "a.py", "kind": "update"}, "MultiEdit", {
        "file_path": "a.py", "edits": [{"old_string": "x = 1", "new_string": "x = 2"},
                                       {"old_string": "y", "new_string": "z"}]})
    assert change["diff"] == ("--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-x = 1\n\\ No newline at end of file\n"
                              "+x = 2\n\\ No newline at end of file\n"
                              "--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-y\n\\ No newline at end of file\n"
                              "+z\n\\ No newline at end of file\n")
    # patch_apply_end: Codex's {path: {type, unified_diff | content}}; a long diff is cut to 2 + 2 KiB
    big = "".join(f"+line {i}\n" for i in range(2000))
    got = event_changes({"b.py": {"type": "update", "unified_diff": "@@ -1 +1 @@\n-a\n+b\n", "move_path": "c.py"},
                         "d.py": {"type": "add", "content": "new\n"}, "e.py": {"type": "update", "unified_diff": big}})
    assert got[:2] == [{"path": "b.py", "kind": "update", "diff": "--- a/b.py\n+++ b/c.py\n@@ -1 +1 @@\n-a\n+b\n"},
                       {"path": "d.py", "kind": "add", "content": "new\n"}]
    assert len(got[2]["diff"].encode()) < 4200 and "\n…\n" in got[2]["diff"]
    assert patch_changes("*** Begin Patch\n*** Delete File: x\n*** End Patch") == [{"path": "x", "kind": "delete"}]
