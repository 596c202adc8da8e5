"""Gemini CLI records in (SPEC §10, the Gemini rows): files the real CLI (0.61.0) wrote —
``tests/fixtures/agents/gemini/<scenario>/`` (its ``--output-format stream-json`` stdout and its
own chat files under ``home/.gemini/tmp/proj/chats/``) — imported with ``memfs import`` as a
user runs it, then read back as the next agent would: the log, ``derived/memory.json`` facts,
``summary.md``, ``progress.json``, ``memfs sessions --json``."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import orjson
import pytest
from memfs.events import parse_line
from memfs.ingest import AutoTranslator, classify, parse_object

from agent_helpers import (
    cli,
    events_of,
    facts,
    import_,
    items,
    listing,
    mounted_views,
    of_type,
    record_replayed,
    started,
    turns,
    view,
)
from mounting import mounted, needs_fuse, sh

AGENTS = Path(__file__).parent / "fixtures" / "agents"
GEMINI = AGENTS / "gemini"
FAMILY = {"thread.started", "thread.compact_boundary", "turn.started", "turn.completed", "turn.failed",
          "item.started", "item.completed", "item.updated", "error"}
SCENARIOS = sorted(p.name for p in GEMINI.iterdir() if p.is_dir())


def capture(scenario: str) -> dict:
    return json.loads((GEMINI / scenario / "capture.json").read_text())


def chats(scenario: str) -> Path:
    """The CLI's chats directory: ``home/.gemini/tmp/<project>/chats``."""
    return GEMINI / scenario / "home" / ".gemini" / "tmp" / "proj" / "chats"


def chat_file(scenario: str) -> Path:
    """The conversation's chat file (a resume writes on in the first one)."""
    return sorted(chats(scenario).glob(f"session-*-{capture(scenario)['session_id'][:8]}.jsonl"))[0]


def streams(scenario: str) -> list[Path]:
    return sorted((GEMINI / scenario).glob("stream*.jsonl"))


def prompts(scenario: str) -> list[str]:
    return [run["prompt"] for run in capture(scenario)["runs"]]


def translate(*paths: Path) -> tuple[list[dict], dict]:
    """The events of a record (each file through its own translator, as the importer runs a
    one-shot import), and the last file's meta."""
    out: list[dict] = []
    for path in paths:
        t = AutoTranslator("auto")
        lines = [line for raw in path.read_bytes().splitlines() if raw.strip() for line in t.feed(raw)]
        for line in lines + t.finish():
            parse_line(line)  # every line valid by the event contract
            out.append(orjson.loads(line))
    return out, t.meta


# --- telling Gemini's lines from the others' (issue 43) ------------------------------------------


def test_every_gemini_line_reads_as_gemini_and_no_other_agents_line_does():
    for scenario in SCENARIOS:
        for path in [*streams(scenario), *chats(scenario).rglob("*.jsonl")]:
            for raw in path.read_bytes().splitlines():
                assert classify(parse_object(raw, "test")) == "gemini", (path, raw[:120])
    for agent in ("claude", "codex"):
        for path in (AGENTS / agent).rglob("*.jsonl"):
            if path.name == "requests.jsonl":
                continue
            for raw in path.read_bytes().splitlines():
                try:
                    obj = parse_object(raw, "test")
                except ValueError:
                    continue
                assert classify(obj) != "gemini", (path, raw[:120])


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_only_events_of_the_family_never_a_patch_or_metadata_line(scenario):
    for path in [*streams(scenario), *chats(scenario).rglob("*.jsonl")]:
        ev, _ = translate(path)
        assert {e["type"] for e in ev} <= FAMILY, path


# --- one turn per prompt, from the stream and from the chat file --------------------------------


@pytest.mark.parametrize("scenario", ["ok_failing_command", "http_500_then_ok", "mcp_call", "tasks"])
def test_each_capture_alone_gives_the_session_one_turn_per_prompt(tmp_path, scenario):
    sid = capture(scenario)["session_id"]
    for source in (streams(scenario)[0], chat_file(scenario)):
        store = tmp_path / source.stem
        (report,) = import_(store, source)
        assert (report["session"], report["format"], report["refused"]) == (sid, "gemini", 0)
        ev = events_of(store, sid)
        assert ev[0] == {"type": "thread.started", "thread_id": sid, "agent": "gemini"}
        assert turns(ev) == ["turn.completed"]
        (ctx,) = started(ev)
        assert (ctx["origin"], ctx["prompt"]) == ("user", prompts(scenario)[0])
        if source.name.startswith("session-"):  # the chat file has the prompt's own id
            first = orjson.loads(source.read_bytes().splitlines()[2])
            assert ctx["turn_id"] == first["id"] and ctx["timestamp"] == first["timestamp"]
        assert of_type(ev, "agent_message")[-1]["text"] == capture(scenario)["script"]["steps"][-1]["text"]
        assert json.loads(view(store, sid, "progress.json"))["goal"] == prompts(scenario)[0]


def test_usage_is_per_turn_from_the_record(tmp_path):
    sid = capture("http_500_then_ok")["session_id"]
    for source in (streams("http_500_then_ok")[0], chat_file("http_500_then_ok")):
        store = tmp_path / source.stem
        import_(store, source)
        (end,) = [e for e in events_of(store, sid) if e["type"] == "turn.completed"]
        assert end["usage"] == {"input_tokens": 1100, "cached_input_tokens": 0, "output_tokens": 25}
        assert end["completed_at"].startswith("2026-12-03T07:59:37.4")
    # a resumed run's stream counts that run only; the chat file its own records
    ev, _ = translate(*streams("resume_two_turns"))
    assert [e["usage"]["input_tokens"] for e in ev if e["type"] == "turn.completed"] == [2100, 1200]
    ev, _ = translate(chat_file("resume_two_turns"))
    assert [e["usage"]["input_tokens"] for e in ev if e["type"] == "turn.completed"] == [2100, 1200]


# --- commands ----------------------------------------------------------------------------------


def test_a_command_that_exits_1_is_failed_with_its_exit_code_from_the_chat_file(tmp_path):
    sid = capture("ok_failing_command")["session_id"]
    store = tmp_path / "chat"
    import_(store, chat_file("ok_failing_command"))
    (cmd,) = of_type(events_of(store, sid), "command_execution")
    assert (cmd["command"], cmd["status"], cmd["exit_code"]) == ("cat CHANGELOG.md", "failed", 1)
    assert cmd["aggregated_output"] == "cat: CHANGELOG.md: No such file or directory"
    assert "ran cat CHANGELOG.md (exit 1)" in facts(store, sid)
    # the stream says "success" for it and has no exit code: the command is on record, no more
    store = tmp_path / "stream"
    import_(store, streams("ok_failing_command")[0])
    ev = events_of(store, sid)
    assert [i["status"] for i in items(ev, "item.started")] == ["in_progress"]
    (cmd,) = of_type(ev, "command_execution")
    assert (cmd["status"], "exit_code" in cmd) == ("completed", False)
    assert "ran cat CHANGELOG.md" in facts(store, sid)


# --- ids: the same thing from either capture is stored once -------------------------------------


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s != "subagent"])
def test_item_ids_are_the_same_from_the_stream_and_from_the_chat_file(scenario):
    from_stream, _ = translate(*streams(scenario))
    from_chat, _ = translate(chat_file(scenario))
    ids = {i["id"] for i in items(from_stream)}
    assert ids and ids <= {i["id"] for i in items(from_chat)}
    tools = {e["tool_id"] for p in streams(scenario) for e in map(orjson.loads, p.read_bytes().splitlines())
             if e["type"] == "tool_use"}
    assert tools <= ids  # a tool call's item id is the call's own id


@pytest.mark.parametrize("scenario", ["resume_two_turns", "ok_failing_command", "api_error", "compact"])
def test_stream_and_chat_file_in_either_order_store_each_thing_once(tmp_path, scenario):
    sid = capture(scenario)["session_id"]
    orders = {"streams_first": [*streams(scenario), chats(scenario)],
              "chats_first": [chats(scenario), *streams(scenario)]}
    stored = {}
    for name, sources in orders.items():
        store = tmp_path / name
        reports = [r for source in sources for r in import_(store, source)]
        assert {r["session"] for r in reports} == {sid}
        assert sum(r["duplicates"] for r in reports) > 0  # the second capture's turns were dropped
        ev = events_of(store, sid)
        assert [c.get("prompt") for c in started(ev)] == prompts(scenario)
        ids = [i["id"] for i in items(ev)]
        assert len(ids) == len(set(ids)), Counter(ids).most_common(3)
        assert len([e for e in ev if e["type"] == "thread.started"]) == 1
        assert listing(store)[sid]["turn_count"] == len(prompts(scenario))
        stored[name] = ev
    first_items = {i["id"] for i in items(stored["streams_first"])}
    assert first_items <= {i["id"] for i in items(stored["chats_first"])}


def test_a_resumed_conversation_continues_in_its_session(tmp_path):
    sid = capture("resume_two_turns")["session_id"]
    store = tmp_path / "store"
    for stream in streams("resume_two_turns"):  # as `memfs record` would get them, one run at a time
        import_(store, stream)
    ev = events_of(store, sid)
    assert turns(ev) == ["turn.completed", "turn.completed"]
    assert [i["text"] for i in of_type(ev, "agent_message")] == [
        "The project has one file: README.md.", "It is a tiny demo project."]
    # the CLI's chat file of both runs adds nothing the streams had (the stray file a resume
    # leaves, with no turn in it, is no session and says nothing of it)
    reports = import_(store, chats("resume_two_turns"))
    assert sum(r["appended"] for r in reports) == 0
    assert events_of(store, sid) == ev


def test_record_of_each_run_then_the_chat_files_is_one_session_each_thing_once(tmp_path):
    """``memfs record`` of the live runs (here replayed from their captured stdout, with their
    exit status), then ``memfs import`` of the CLI's chat files: one session, the name the user
    gave, nothing twice."""
    sid = capture("resume_two_turns")["session_id"]
    store = tmp_path / "store"
    recorded = record_replayed(store, "work", streams("resume_two_turns"), capture("resume_two_turns")["runs"])
    assert turns(recorded) == ["turn.completed", "turn.completed"]
    reports = import_(store, chats("resume_two_turns"))
    assert {r["session"] for r in reports} == {"work"}
    assert events_of(store, "work") == recorded
    sessions = listing(store)
    assert sid not in sessions and sessions["work"]["conversation_id"] == sid
    assert sessions["work"]["cwd"] == capture("resume_two_turns")["cwd"]  # what only the chat file says


# --- failures ----------------------------------------------------------------------------------


def test_an_api_error_run_is_a_failed_turn_from_the_stream_and_from_the_chat_file(tmp_path):
    sid = capture("api_error")["session_id"]
    assert capture("api_error")["runs"][0]["exit_code"] == 244
    expected = {"stream": '[API Error: {"error":{"code":500,"message":"Internal error encountered.",'
                          '"status":"INTERNAL"}}]',
                "chat": "the request failed: Gemini CLI took the turn back out of its history"}
    for name, source in (("stream", streams("api_error")[0]), ("chat", chat_file("api_error"))):
        store = tmp_path / name
        import_(store, source)
        ev = events_of(store, sid)
        assert turns(ev) == ["turn.failed"], name
        failed = next(e for e in ev if e["type"] == "turn.failed")
        assert failed["message"] == expected[name]
        assert started(ev)[0]["prompt"] == "Summarize the README"
        assert "agent_message" not in {i["type"] for i in items(ev)}
        assert expected[name] in facts(store, sid)
        summary = view(store, sid, "summary.md")
        assert "- **Turns:** 1 closed (0 completed, 1 failed, 0 abandoned)" in summary
        assert listing(store)[sid]["status"] == "failed"


@needs_fuse
def test_the_views_of_a_gemini_session_through_the_mount(tmp_path):
    sid = capture("ok_failing_command")["session_id"]
    store = tmp_path / "store"
    import_(store, chats("ok_failing_command"))
    found, context, summary = mounted_views(store, tmp_path / "mnt", sid)
    assert "ran cat CHANGELOG.md (exit 1)" in found
    assert "**Goal:** Show me the changelog" in context
    assert "- **Turns:** 1 closed (1 completed, 0 failed, 0 abandoned)" in summary
    assert "There is no CHANGELOG.md in this project." in summary


# --- MCP, to-do lists, compression, sub-agents --------------------------------------------------


def test_an_mcp_tool_is_an_mcp_tool_call(tmp_path):
    sid = capture("mcp_call")["session_id"]
    for source in (streams("mcp_call")[0], chat_file("mcp_call")):
        store = tmp_path / source.stem
        import_(store, source)
        (call,) = of_type(events_of(store, sid), "mcp_tool_call")
        assert (call["id"], call["server"], call["tool"], call["arguments"], call["status"], call["error"]) == (
            "mcp_notes_lookup__mcp_notes_lookup_1796284783319_0", "notes", "lookup", {"key": "release"},
            "completed", None)
        assert call["result"]["content"] == [{"type": "text", "text": "v1.2 ships on Friday"}]
        assert "called notes.lookup" in facts(store, sid)


def test_write_todos_is_one_todo_list_per_change_and_drives_progress(tmp_path):
    sid = capture("tasks")["session_id"]
    for source in (streams("tasks")[0], chat_file("tasks")):
        store = tmp_path / source.stem
        import_(store, source)
        lists = of_type(events_of(store, sid), "todo_list")
        assert len(lists) == 3
        assert [(t["text"], t["completed"]) for t in lists[0]["items"]] == [
            ("Read the README", False), ("Write the summary", False)]
        assert [t["completed"] for t in lists[-1]["items"]] == [True, True]
        progress = json.loads(view(store, sid, "progress.json"))
        assert [(m["description"], m["status"]) for m in progress["milestones"]] == [
            ("Read the README", "done"), ("Write the summary", "done")]


def test_compression_is_a_boundary_and_a_summary_fact_and_history_is_not_imported_again(tmp_path):
    sid = capture("compact")["session_id"]
    store = tmp_path / "store"
    import_(store, chat_file("compact"))
    ev = events_of(store, sid)
    assert turns(ev) == ["turn.completed", "turn.completed"]
    (boundary,) = [e for e in ev if e["type"] == "thread.compact_boundary"]
    assert (boundary["thread_id"], boundary["trigger"], boundary["mode"]) == (sid, "auto", "summary")
    (summary,) = of_type(ev, "harness")
    assert summary["message"] == "The user asked which files the project has; the answer was README.md."
    assert summary["message"] in facts(store, sid)
    # the rewritten history (the prompt and the call again, under new ids) is not imported again
    assert [i["text"] for i in of_type(ev, "agent_message")] == [
        "The project has one file: README.md.", "It is a tiny demo project."]
    assert [c["prompt"] for c in started(ev)] == prompts("compact")
    assert len(of_type(ev, "command_execution")) == 1
    # the stream shows nothing of it
    ev, _ = translate(*streams("compact"))
    assert "thread.compact_boundary" not in {e["type"] for e in ev}


def test_a_sub_agent_is_a_child_session_named_by_its_parent(tmp_path):
    sid = capture("subagent")["session_id"]
    (sub_file,) = chats("subagent").glob(f"{sid}/*.jsonl")
    sub = sub_file.stem
    child = f"{sid}.{sub}"
    store = tmp_path / "store"
    reports = import_(store, chats("subagent"))
    assert sorted(r["session"] for r in reports) == sorted([sid, child])
    parent = events_of(store, sid)
    assert of_type(parent, "command_execution") == []  # the sub-agent's `ls` is not the parent's
    (agent,) = [i for i in items(parent) if i.get("tool_name") == "invoke_agent"]
    assert (agent["id"], agent["status"], agent["child_session"]) == (
        "invoke_agent__invoke_agent_1796284793345_0", "completed", child)
    assert [i["text"] for i in of_type(parent, "agent_message")] == [
        "I'll ask a helper.", "The helper found one file: README.md."]
    ev = events_of(store, child)
    assert ev[0] == {"type": "thread.started", "thread_id": sub, "agent": "gemini"}
    assert started(ev)[0]["prompt"] == "List the files in the project and report them."
    assert [(c["command"], c["exit_code"]) for c in of_type(ev, "command_execution")] == [("ls", 0)]
    assert of_type(ev, "agent_message")[-1]["text"] == "The project has one file: README.md."  # its report
    assert turns(ev) == ["turn.completed"]
    assert "ran ls (exit 0)" in facts(store, child)
    sessions = listing(store)
    assert sessions[child]["parent_session"] == sid and sessions[child]["conversation_id"] == sub
    assert child in sessions[sid]["children"]
    # the parent's stream: the same session, nothing twice, no sub-agent lines in it
    import_(store, streams("subagent")[0])
    assert events_of(store, sid) == parent


# --- the chat file's rewrites and patches -------------------------------------------------------


def test_a_record_written_again_completes_its_item_once_even_across_imports(tmp_path):
    """A gemini record is written first without its tool calls, then again (same ``id``) with
    them and their results: an import that stops between the two goes on with the same item."""
    sid = capture("ok_failing_command")["session_id"]
    whole = tmp_path / "whole"
    import_(whole, chat_file("ok_failing_command"))
    lines = chat_file("ok_failing_command").read_bytes().splitlines(keepends=True)
    cut = next(i for i, raw in enumerate(lines) if b'"type":"gemini"' in raw) + 1  # before its rewrite
    assert b"toolCalls" not in lines[cut - 1] and b"toolCalls" in lines[cut + 1]
    source = tmp_path / "chats" / chat_file("ok_failing_command").name
    source.parent.mkdir()
    source.write_bytes(b"".join(lines[:cut]))
    parts = tmp_path / "parts"
    import_(parts, source)
    assert turns(events_of(parts, sid)) == []  # the turn is still going: left open
    with open(source, "ab") as f:
        f.write(b"".join(lines[cut:]))
    (report,) = import_(parts, source)
    assert report["status"] == "imported" and report["refused"] == 0
    assert events_of(parts, sid) == events_of(whole, sid)
    ids = [i["id"] for i in items(events_of(parts, sid))]
    assert len(ids) == len(set(ids))
    (report,) = import_(parts, source)
    assert report["status"] == "up-to-date"


def test_state_round_trips_anywhere_in_a_chat_file_and_a_stream():
    for path in (chat_file("compact"), chat_file("resume_two_turns"), streams("tasks")[0]):
        whole, _ = translate(path)
        raws = [raw for raw in path.read_bytes().splitlines() if raw.strip()]
        for cut in range(len(raws) + 1):
            a, out = AutoTranslator("auto"), []
            for raw in raws[:cut]:
                out.extend(a.feed(raw))
            b = AutoTranslator("auto")
            b.restore(orjson.loads(orjson.dumps(a.state())))
            for raw in raws[cut:]:
                out.extend(b.feed(raw))
            assert [orjson.loads(line) for line in out + b.finish()] == whole, (path, cut)


# --- metadata -------------------------------------------------------------------------------


def test_metadata_comes_from_the_chat_file_and_the_stream(tmp_path):
    sid = capture("resume_two_turns")["session_id"]
    proj = capture("resume_two_turns")["cwd"]
    store = tmp_path / "chat"
    import_(store, chats("resume_two_turns"))
    meta = listing(store)[sid]
    assert (meta["agent"], meta["conversation_id"], meta["model"], meta["status"]) == (
        "gemini", sid, "gemini-2.5-pro", "completed")
    assert (meta["started_at"], meta["ended_at"]) == ("2026-12-03T07:59:58.624Z", "2026-12-03T08:00:01.458Z")
    assert (meta["cwd"], meta["first_prompt"], meta["title"]) == (proj, prompts("resume_two_turns")[0],
                                                                  prompts("resume_two_turns")[0])
    assert meta["project_hash"] == orjson.loads(chat_file("resume_two_turns").read_bytes().split(b"\n")[0])[
        "projectHash"]
    store = tmp_path / "stream"
    import_(store, streams("resume_two_turns")[0])
    meta = listing(store)[sid]
    assert (meta["agent"], meta["conversation_id"], meta["model"], meta["started_at"]) == (
        "gemini", sid, "gemini-2.5-pro", "2026-12-03T07:59:58.639Z")


def test_format_gemini_reads_gemini_only_and_the_others_name_it(tmp_path):
    store = tmp_path / "store"
    proc = cli("import", "--store", str(store), "--format", "gemini", "--json",
               str(AGENTS / "claude" / "ok_failing_command" / "stream.jsonl"))
    assert proc.returncode == 3, proc.stderr  # lines refused (memfs import's exit status 3)
    (report,) = json.loads(proc.stdout)
    assert report["appended"] == 0 and report["refused"] > 0
    proc = cli("import", "--store", str(store), "--format", "claude", "--json", str(streams("mcp_call")[0]))
    (report,) = json.loads(proc.stdout)
    assert report["appended"] == 0 and report["refused"] == 6
    rejected = (store / report["session"] / "rejected.jsonl").read_text().splitlines()
    assert json.loads(rejected[0])["reason"] == \
        "--format claude: this line is in another format (Gemini CLI stream-json or chat file)"
    proc = cli("import", "--store", str(tmp_path / "other"), "--format", "gemini", "--json",
               str(streams("mcp_call")[0]))
    (report,) = json.loads(proc.stdout)
    assert (report["format"], report["refused"], report["appended"]) == ("gemini", 0, 6)


@needs_fuse
def test_the_chat_file_imported_after_the_stream_gives_the_command_its_exit_code(tmp_path):
    # stream-json says "success" and no exit code; the chat file, imported later, knows the
    # command exited 1: the stored command is not appended again, but the views read it failed
    # — also on a mount that had already rendered them
    sid = capture("ok_failing_command")["session_id"]
    store = tmp_path / "store"
    import_(store, streams("ok_failing_command")[0])
    with mounted(store, tmp_path / "mnt") as m:
        s = m.mnt / "sessions" / sid
        memory = json.loads(sh("cat derived/memory.json", s).stdout)
        assert "ran cat CHANGELOG.md" in [f["fact"] for f in memory["grounded_facts"]]
        log = (store / sid / "events.jsonl").read_bytes()
        import_(store, chats("ok_failing_command"))
        assert (store / sid / "events.jsonl").read_bytes() == log
        memory = json.loads(sh("cat derived/memory.json", s).stdout)
        trajectory = [json.loads(line) for line in sh("cat derived/trajectory.jsonl", s).stdout.splitlines()]
    found = [f["fact"] for f in memory["grounded_facts"]]
    assert "ran cat CHANGELOG.md (exit 1)" in found and "ran cat CHANGELOG.md" not in found
    assert trajectory[0]["commands"] == [{"command": "cat CHANGELOG.md", "exit_code": 1, "status": "failed"}]
    assert facts(store, sid).count("ran cat CHANGELOG.md (exit 1)") == 1  # read without a mount too
