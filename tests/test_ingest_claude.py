"""Claude Code records in (SPEC §10, every Claude row): files the real CLI (2.1.332) wrote —
``tests/fixtures/agents/claude/<scenario>/`` (its ``stream-json`` stdout and its own transcript
store) — imported with ``memfs import`` as a user runs it, then read back as the next agent
would: the log, ``derived/memory.json`` facts, ``summary.md``, ``progress.md``, ``context.md``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import orjson
import pytest
from memfs.events import parse_line
from memfs.ingest import AutoTranslator
from memfs.ingest.sidefiles import SideReader

from agent_helpers import MEMFS, cli, events_of, facts, items, of_type, turns, view  # noqa: F401
from mounting import mounted, needs_fuse, sh

CLAUDE = Path(__file__).parent / "fixtures" / "agents" / "claude"
FAMILY = {"thread.started", "thread.completed", "thread.compact_boundary", "turn.started", "turn.completed",
          "turn.failed", "item.started", "item.completed", "item.updated", "error"}


def capture(scenario: str) -> dict:
    return json.loads((CLAUDE / scenario / "capture.json").read_text())


def transcript(scenario: str) -> Path:
    """The run's own transcript: ``home/.claude/projects/<slug>/<session>.jsonl``."""
    sid = capture(scenario)["session_id"]
    (found,) = (CLAUDE / scenario / "home" / ".claude" / "projects").glob(f"*/{sid}.jsonl")
    return found


def streams(scenario: str) -> list[Path]:
    return sorted((CLAUDE / scenario).glob("stream*.jsonl"))


def import_(store: Path, *paths: Path) -> subprocess.CompletedProcess:
    proc = cli("import", "--store", str(store), *map(str, paths))
    assert proc.returncode == 0, proc.stderr
    return proc


def translate(path: Path) -> tuple[list[dict], dict]:
    """The events of one record, through the translator as the importer runs it, and its meta."""
    t = AutoTranslator("auto", reader=SideReader.for_transcript(path))
    out = []
    for raw in path.read_bytes().splitlines():
        for line in t.feed(raw):
            parse_line(line)  # every line valid by the event contract
            out.append(orjson.loads(line))
    return out, t.meta


# --- a failed run is a failed turn ----------------------------------------------------------


def test_an_api_error_run_is_a_failed_turn_from_the_stream_and_from_the_transcript(tmp_path):
    sid = capture("api_error")["session_id"]
    for source in (streams("api_error")[0], transcript("api_error")):
        store = tmp_path / source.stem
        import_(store, source)
        ev = events_of(store, sid)
        assert turns(ev) == ["turn.failed"], source
        failed = next(e for e in ev if e["type"] == "turn.failed")
        assert failed["message"].startswith("API Error: 500 Internal server error")
        assert failed["completed_at"] == "2026-12-03T07:58:47.798Z"
        retries = [i["message"] for i in of_type(ev, "error")]
        assert [r.split(":")[0] for r in retries] == ["API retry 1/2", "API retry 2/2"]
        assert "agent_message" not in {i["type"] for i in items(ev)}  # the synthetic text is the failure
        assert ev[0] == {"type": "thread.started", "thread_id": sid, "agent": "claude"}
        fs = facts(store, sid)
        assert any(f.startswith("API Error: 500 Internal server error") for f in fs)
        summary = view(store, sid, "summary.md")
        assert "- **Turns:** 1 closed (0 completed, 1 failed, 0 abandoned)" in summary
        assert "(turn.failed): API Error: 500 Internal server error" in summary
    stream_ev = events_of(tmp_path / "stream", sid)
    done = stream_ev[-1]
    assert done["type"] == "thread.completed" and done["subtype"] == "error_during_execution"
    assert done["outcome_code"] == "error"
    assert retries[0] == "API retry 1/2: 500 Internal server error"  # the transcript's wording
    assert of_type(stream_ev, "error")[0]["message"] == "API retry 1/2: server_error (HTTP 500)"


def test_an_api_error_run_reads_as_failed_in_the_metadata():
    for source in (streams("api_error")[0], transcript("api_error")):
        _, meta = translate(source)
        assert meta["status"] == "failed" and meta["agent"] == "claude"
        assert meta["conversation_id"] == capture("api_error")["session_id"]
        assert meta["model"] == "claude-opus-5-5" and meta["agent_version"] == "2.1.332"
    _, meta = translate(transcript("api_error"))
    assert (meta["cwd"], meta["git_branch"]) == (capture("api_error")["cwd"], "main")
    assert meta["first_prompt"] == "Summarize the README"


def test_a_retry_that_worked_is_an_error_item_in_a_completed_turn(tmp_path):
    sid = capture("http_500_then_ok")["session_id"]
    for source in (streams("http_500_then_ok")[0], transcript("http_500_then_ok")):
        store = tmp_path / source.stem
        import_(store, source)
        ev = events_of(store, sid)
        assert turns(ev) == ["turn.completed"]
        (retry,) = of_type(ev, "error")
        assert retry["message"].startswith("API retry 1/2: ")
        assert [i["text"] for i in of_type(ev, "agent_message")] == ["The README describes a tiny demo project."]


@needs_fuse
def test_the_views_of_a_failed_run_do_not_report_success(tmp_path):
    sid = capture("api_error")["session_id"]
    store = tmp_path / "store"
    import_(store, transcript("api_error"))
    with mounted(store, tmp_path / "mnt") as m:
        s = m.mnt / "sessions" / sid
        summary = sh("cat derived/summary.md", s).stdout
        context = sh("cat derived/context.md", s).stdout
        progress = sh("cat derived/progress.md", s).stdout
    assert "**Run:** failed" in summary and "**Run:** failed" in context
    assert "- **Turns:** 1 closed (0 completed, 1 failed, 0 abandoned)" in summary
    assert "## Errors (3)" in summary and "_None._\n\n## Last agent message" not in summary.split("## Errors")[1]
    assert "**Goal:** Summarize the README" in context
    assert "1 turns (0 completed, 1 failed" in context
    assert "## Failures (newest first)\n- turn 1 (turn.failed): API Error: 500" in context
    assert "**Stalled since:** 2026-12-03T07:58:47.798Z" in progress
    assert "**Goal:** Summarize the README" in progress
    # the run's stream too (its result says is_error): still one session, one failed turn
    import_(store, streams("api_error")[0])
    summary = view(store, sid, "summary.md")
    assert "**Run:** failed" in summary
    assert "- **Turns:** 1 closed (0 completed, 1 failed, 0 abandoned)" in summary


# --- commands -------------------------------------------------------------------------------


def test_a_failed_bash_command_is_a_failed_command_execution(tmp_path):
    sid = capture("ok_failing_command")["session_id"]
    for source in (streams("ok_failing_command")[0], transcript("ok_failing_command")):
        store = tmp_path / source.stem
        import_(store, source)
        ev = events_of(store, sid)
        (cmd,) = of_type(ev, "command_execution")
        assert (cmd["id"], cmd["command"], cmd["status"], cmd["exit_code"]) == (
            "toolu_0170000001", "cat CHANGELOG.md", "failed", 1)
        assert cmd["aggregated_output"] == "Exit code 1\ncat: CHANGELOG.md: No such file or directory"
        started = items(ev, "item.started")
        assert [(i["id"], i["status"]) for i in started] == [("toolu_0170000001", "in_progress")]
        assert "ran cat CHANGELOG.md (exit 1)" in facts(store, sid)
        assert turns(ev) == ["turn.completed"]


def test_a_large_output_is_read_from_tool_results_and_bounded(tmp_path):
    sid = capture("large_output")["session_id"]
    store = tmp_path / "store"
    import_(store, transcript("large_output").parent)  # the project directory, as a user imports it
    (cmd,) = of_type(events_of(store, sid), "command_execution")
    out = cmd["aggregated_output"]
    assert (cmd["command"], cmd["status"], cmd["exit_code"]) == ("seq 1 8000", "completed", 0)
    assert out.startswith("1\n2\n3\n") and out.endswith("\n7999\n8000\n")  # the file's end: not the preview
    assert "\n…\n" in out and len(out.encode()) == 2048 + len("\n…\n".encode()) + 2048
    assert "persisted-output" not in out
    # the stream names the same file; without it (record's stdout), the printed stdout, bounded
    ev, _ = translate(streams("large_output")[0])
    (cmd,) = of_type(ev, "command_execution")
    assert cmd["aggregated_output"].startswith("1\n2\n") and len(cmd["aggregated_output"].encode()) <= 4101


def test_a_side_file_is_read_only_from_inside_the_record_directory(tmp_path):
    project = tmp_path / "proj"
    (project / "s1" / "tool-results").mkdir(parents=True)
    (project / "s1" / "tool-results" / "ok.txt").write_text("fine")
    (tmp_path / "secret.txt").write_text("private")
    (project / "s1" / "tool-results" / "link.txt").symlink_to(tmp_path / "secret.txt")
    (project / "s1" / "tool-results" / "fifo").mkdir()
    read = SideReader.for_transcript(project / "s1.jsonl")
    assert read("s1/tool-results/ok.txt") == "fine"
    for bad in ("s1/tool-results/link.txt", "../secret.txt", "s1/../../secret.txt", "/etc/passwd", "s1/tool-results/fifo",
                "s1/tool-results/.hidden", "s1//ok.txt", ""):
        assert read(bad) is None, bad
    lines = [{"type": "user", "sessionId": "s1", "uuid": "u1", "message": {"role": "user", "content": "go"}},
             {"type": "assistant", "sessionId": "s1", "uuid": "a1", "message": {
                 "id": "m1", "model": "m", "content": [{"type": "tool_use", "id": "t1", "name": "Bash",
                                                       "input": {"command": "cat x"}}]}},
             {"type": "user", "sessionId": "s1", "uuid": "u2", "message": {"role": "user", "content": [
                 {"type": "tool_result", "tool_use_id": "t1", "content":
                  f"<persisted-output>\nFull output saved to: {tmp_path}/secret.txt\n\nPreview (first 2KB):\np"}]}}]
    (project / "s1.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines))
    ev, _ = translate(project / "s1.jsonl")
    (cmd,) = of_type(ev, "command_execution")
    assert "private" not in cmd["aggregated_output"]  # a file outside <session>/tool-results/ is never read


# --- prompts, MCP, to-do lists ----------------------------------------------------------------


def test_the_prompt_is_the_turn_context_and_the_goal(tmp_path):
    sid = capture("ok_failing_command")["session_id"]
    store = tmp_path / "store"
    import_(store, transcript("ok_failing_command"))
    ev = events_of(store, sid)
    (start,) = [e for e in ev if e["type"] == "turn.started"]
    assert start["context"] == {"origin": "user", "turn_id": "94d44280-5fa7-4b9b-8f01-616f4c579ace",
                                "prompt": "Show me the changelog", "timestamp": "2026-12-03T07:58:44.950Z"}
    assert json.loads(view(store, sid, "progress.json"))["goal"] == "Show me the changelog"
    # the stream does not print the prompt: its turn opens at the first message, without one
    ev, _ = translate(streams("ok_failing_command")[0])
    assert [e.get("context") for e in ev if e["type"] == "turn.started"] == [{"timestamp": "2026-12-03T07:58:45.086Z"}]


def test_an_mcp_call_is_an_mcp_tool_call(tmp_path):
    sid = capture("mcp_call")["session_id"]
    for source in (streams("mcp_call")[0], transcript("mcp_call")):
        store = tmp_path / source.stem
        import_(store, source)
        (call,) = of_type(events_of(store, sid), "mcp_tool_call")
        assert (call["id"], call["server"], call["tool"], call["arguments"], call["status"], call["error"]) == (
            "toolu_0289000004", "notes", "lookup", {"key": "release"}, "completed", None)
        assert call["result"]["content"] == [{"type": "text", "text": '{"result":"v1.2 ships on Friday"}'}]
        assert "called notes.lookup" in facts(store, sid)


def test_task_create_and_update_are_one_todo_list_each_change_and_drive_progress(tmp_path):
    sid = capture("tasks")["session_id"]
    for source in (streams("tasks")[0], transcript("tasks")):
        store = tmp_path / source.stem
        import_(store, source)
        lists = of_type(events_of(store, sid), "todo_list")
        assert [l["id"] for l in lists] == ["toolu_0332000004", "toolu_0332000005", "toolu_0332000008",
                                            "toolu_0332000012", "toolu_0332000011"]
        assert lists[1]["items"] == [{"text": "Read the README", "completed": False},
                                     {"text": "Write the summary", "completed": False}]
        assert lists[-1]["items"] == [{"text": "Read the README", "completed": True},
                                      {"text": "Write the summary", "completed": True}]
        progress = json.loads(view(store, sid, "progress.json"))
        assert [(m["description"], m["status"]) for m in progress["milestones"]] == [
            ("Read the README", "done"), ("Write the summary", "done")]
        assert "**Completion:** 100%" in view(store, sid, "progress.md")


def test_one_api_message_split_over_lines_is_one_message_counted_once(tmp_path):
    sid = capture("tasks")["session_id"]
    store = tmp_path / "store"
    import_(store, transcript("tasks"))
    ev = events_of(store, sid)
    # msg_0332000006 and msg_0332000013 are each written as two assistant lines (two tool calls)
    (end,) = [e for e in ev if e["type"] == "turn.completed"]
    assert end["usage"] == {"input_tokens": 6000, "cached_input_tokens": 0, "cache_creation_tokens": 0,
                            "output_tokens": 150}  # = the CLI's own total (cost-state, result)
    # blocks are numbered across the lines of one message: text 0, tool call 1
    ev, _ = translate(transcript("subagent"))
    assert [i["id"] for i in items(ev) if i["type"] == "agent_message"] == ["msg_0364000002:0", "msg_0364000009:0"]


# --- sub-agents -------------------------------------------------------------------------------


def test_a_sub_agent_is_a_child_session_not_part_of_its_parent(tmp_path):
    sid = capture("subagent")["session_id"]
    child = f"{sid}.agent-a16cdf0d8b50a0884"
    for sources in ([streams("subagent")[0]], [transcript("subagent").parent]):
        store = tmp_path / sources[0].stem
        import_(store, *sources)
        parent = events_of(store, sid)
        assert of_type(parent, "command_execution") == []  # the sub-agent's `ls` is not the parent's
        assert "ran ls (exit 0)" not in facts(store, sid)
        (agent,) = [i for i in items(parent) if i.get("tool_name") == "Agent"]
        assert (agent["id"], agent["status"], agent["child_session"]) == ("toolu_0364000001", "completed", child)
        assert [i["text"] for i in of_type(parent, "agent_message")] == [
            "I'll ask a helper.", "The helper found one file: README.md."]
    ev = events_of(store, child)  # from subagents/agent-<id>.jsonl, beside the parent's transcript
    assert ev[0] == {"type": "thread.started", "thread_id": child, "agent": "claude"}
    assert [(c["command"], c["exit_code"]) for c in of_type(ev, "command_execution")] == [("ls", 0)]
    assert ev[1]["context"]["prompt"] == "List the files in the project and report them."
    assert "ran ls (exit 0)" in facts(store, child)
    _, meta = translate(next(transcript("subagent").parent.glob("*/subagents/agent-*.jsonl")))
    assert (meta["parent_session"], meta["conversation_id"]) == (sid, child)
    assert (meta["title"], meta["title_source"]) == ("List project files", "agent")  # from its .meta.json
    _, meta = translate(transcript("subagent"))
    assert meta["children"] == [child]


def test_sidechain_lines_inside_a_parent_transcript_are_not_the_parent_s(tmp_path):
    """Older Claude Code wrote a sub-agent's lines (``isSidechain``) into the parent's file."""
    parent = transcript("subagent").read_bytes().splitlines(keepends=True)
    (side_file,) = transcript("subagent").parent.glob("*/subagents/agent-*.jsonl")
    at = next(i for i, l in enumerate(parent) if b'"toolu_0364000001"' in l and b'"tool_use"' in l) + 1
    mixed = tmp_path / transcript("subagent").name
    mixed.write_bytes(b"".join(parent[:at] + side_file.read_bytes().splitlines(keepends=True) + parent[at:]))
    assert translate(mixed)[0] == translate(transcript("subagent"))[0]


# --- compaction -------------------------------------------------------------------------------


def test_compact_is_a_boundary_and_a_summary_fact_three_prompts_three_turns(tmp_path):
    sid = capture("compact")["session_id"]
    for sources in (streams("compact"), [transcript("compact")]):
        store = tmp_path / sources[0].stem
        import_(store, *sources)
        ev = events_of(store, sid)
        assert turns(ev) == ["turn.completed"] * 3
        (boundary,) = [e for e in ev if e["type"] == "thread.compact_boundary"]
        assert (boundary["trigger"], boundary["pre_tokens"], boundary["post_tokens"]) == ("manual", 1020, 2570)
        (summary,) = of_type(ev, "harness")
        assert summary["message"] == "The user asked which files the project has; the answer was README.md."
        assert summary["message"] in facts(store, sid)
        assert not any("Compacted" in f or "<local-command" in f or "<command-" in f for f in facts(store, sid))
    ev, _ = translate(transcript("compact"))
    prompts = [e["context"].get("prompt") for e in ev if e["type"] == "turn.started"]
    assert prompts == ["What files are in the project?", None, "What is the project about?"]


# --- metadata lines, ids ------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", sorted(p.name for p in CLAUDE.iterdir() if p.is_dir()))
def test_metadata_lines_are_used_or_skipped_never_unknown_events(scenario):
    for source in [transcript(scenario), *streams(scenario)]:
        ev, _ = translate(source)
        assert {e["type"] for e in ev} <= FAMILY, source
        assert len([e for e in ev if e["type"] == "thread.started"]) == 1


def test_a_transcript_of_metadata_lines_only_is_not_a_session(tmp_path):
    keep = [l for l in transcript("api_error").read_bytes().splitlines(keepends=True)
            if json.loads(l)["type"] not in ("user", "assistant", "system")]
    assert len(keep) > 15
    path = tmp_path / "meta-only.jsonl"
    path.write_bytes(b"".join(keep))
    ev, meta = translate(path)
    assert ev == []
    store = tmp_path / "store"
    store.mkdir()
    assert "empty" in import_(store, path).stdout
    assert [p.name for p in store.iterdir() if not p.name.startswith(".")] == []  # no session made of it


def test_titles_and_pr_link_come_from_their_lines():
    base = transcript("resume_two_turns")
    sid = capture("resume_two_turns")["session_id"]
    lines = base.read_bytes().splitlines()
    extra = [{"type": "summary", "summary": "Old summary", "leafUuid": "x"},
             {"type": "ai-title", "aiTitle": "List the project files", "sessionId": sid},
             {"type": "custom-title", "customTitle": "My  renamed\nsession", "sessionId": sid},
             {"type": "ai-title", "aiTitle": "A later AI title", "sessionId": sid},
             {"type": "pr-link", "prNumber": 13, "prUrl": "https://example.org/o/r/pull/13",
              "prRepository": "o/r", "sessionId": sid}]
    t = AutoTranslator("auto")
    out = [l for raw in [*lines, *map(orjson.dumps, extra)] for l in t.feed(raw)]
    assert {orjson.loads(l)["type"] for l in out} <= FAMILY
    assert (t.meta["title"], t.meta["title_source"]) == ("My renamed session", "agent")  # custom beats AI
    assert t.meta["pr_link"] == "https://example.org/o/r/pull/13"


@pytest.mark.parametrize("scenario", ["resume_two_turns", "ok_failing_command", "api_error", "http_500_then_ok",
                                      "mcp_call", "tasks", "subagent", "compact", "large_output"])
def test_item_ids_are_the_same_from_the_stream_and_from_the_transcript(scenario):
    whole, _ = translate(transcript(scenario))
    in_transcript = {i["id"] for e in whole if e["type"].startswith("item.") for i in [e["item"]]}
    from_streams = set()
    for stream in streams(scenario):
        ev, _ = translate(stream)
        from_streams |= {e["item"]["id"] for e in ev if e["type"].startswith("item.")}
    assert from_streams and from_streams <= in_transcript
    assert not any(i.startswith("claude-") for i in from_streams | in_transcript)  # none made up


def test_a_resumed_conversation_continues_with_its_new_turn(tmp_path):
    sid = capture("resume_two_turns")["session_id"]
    store = tmp_path / "store"
    import_(store, transcript("resume_two_turns"))
    ev = events_of(store, sid)
    assert [e["context"]["prompt"] for e in ev if e["type"] == "turn.started"] == [
        "What files are in the project?", "What is the project about?"]
    assert turns(ev) == ["turn.completed", "turn.completed"]
    assert [e["usage"]["input_tokens"] for e in ev if e["type"] == "turn.completed"] == [2100, 1200]


def test_state_round_trips_anywhere_in_a_transcript():
    lines = transcript("tasks").read_bytes().splitlines()
    whole = AutoTranslator("auto")
    expected = [l for raw in lines for l in whole.feed(raw)]
    for cut in (3, 25, 31, 41):
        first = AutoTranslator("auto")
        got = [l for raw in lines[:cut] for l in first.feed(raw)]
        second = AutoTranslator("auto")
        second.restore(orjson.loads(orjson.dumps(first.state())))  # as the import sidecar keeps it
        got += [l for raw in lines[cut:] for l in second.feed(raw)]
        assert got == expected, cut
