"""OpenCode's store in (SPEC §10, the fourth agent): the database the real CLI (1.18.33) wrote —
``tests/fixtures/agents/opencode/<scenario>/home/.local/share/opencode/opencode.db`` (a SQLite
backup of it: docs/agents.md) — imported with ``memfs import`` as a user runs it, from a copy
of its data directory, then read back as the next agent would: the log, ``about.json`` through
``memfs sessions --json``, facts, ``progress.json``."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import memfs
import pytest

from agent_helpers import (
    MEMFS,
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
from mounting import needs_fuse

OPENCODE = Path(__file__).parent / "fixtures" / "agents" / "opencode"
SCENARIOS = sorted(p.name for p in OPENCODE.iterdir() if p.is_dir())
FAMILY = {"thread.started", "turn.started", "turn.completed", "turn.failed", "item.started", "item.completed",
          "thread.completed", "thread.compact_boundary"}


def capture(scenario: str) -> dict:
    return json.loads((OPENCODE / scenario / "capture.json").read_text())


def prompts(scenario: str) -> list[str]:
    return [run["prompt"] for run in capture(scenario)["runs"]]


def data_dir(tmp_path: Path, scenario: str) -> Path:
    """A copy of the fixture's OpenCode data directory (the import reads it, never the tree's)."""
    dest = tmp_path / "home" / scenario
    shutil.copytree(OPENCODE / scenario / "home", dest)
    return dest / ".local" / "share" / "opencode"


def quoted(prompt: str) -> str:
    """The prompt as ``opencode run`` stores it: an argument with a space is quoted."""
    return f'"{prompt}"' if " " in prompt else prompt


def db_rows(db: Path, sql: str, *args) -> list[tuple]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


# --- one session per OpenCode session, each turn once -------------------------------------------


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_each_store_gives_one_session_per_opencode_session_and_a_second_import_adds_nothing(tmp_path, scenario):
    data = data_dir(tmp_path, scenario)
    db = data / "opencode.db"
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    store = tmp_path / "store"
    reports = import_(store, data)
    ids = [r[0] for r in db_rows(db, "SELECT id FROM session")]
    assert sorted(r["source"].rsplit("#", 1)[1] for r in reports) == sorted(ids)
    assert all((r["status"], r["format"], r["refused"]) == ("imported", "opencode", 0) for r in reports), reports
    sid = capture(scenario)["session_id"]
    ev = events_of(store, sid)
    assert {e["type"] for e in ev} <= FAMILY
    assert ev[0] == {"type": "thread.started", "thread_id": sid, "agent": "opencode"}
    users = [c for c in started(ev) if "prompt" in c]  # (compact: its summary turn and the synthetic one have none)
    assert [c["prompt"] for c in users] == [quoted(p) for p in prompts(scenario)]
    assert all(c["origin"] == "user" for c in users) and all(c["turn_id"].startswith("msg_") for c in started(ev))
    again = import_(store, data)
    assert [(r["status"], r["appended"]) for r in again] == [("up-to-date", 0)] * len(ids)
    assert events_of(store, sid) == ev
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before, "the import changed OpenCode's database"
    assert sorted(p.name for p in data.iterdir()) == ["opencode.db"], "the import left files beside it"


def test_a_plain_turn_is_the_prompt_the_answer_and_the_session_metadata(tmp_path):
    store = tmp_path / "store"
    import_(store, data_dir(tmp_path, "plain"))
    doc = capture("plain")
    sid = doc["session_id"]
    ev = events_of(store, sid)
    assert turns(ev) == ["turn.completed"]
    assert [i["text"] for i in of_type(ev, "agent_message")] == [doc["script"]["steps"][0]["text"]]
    s = listing(store)[sid]
    assert (s["agent"], s["agent_version"], s["conversation_id"], s["status"], s["model"]) == (
        "opencode", "1.18.33", sid, "completed", "gpt-5.5")
    assert s["title"] == "Scripted title"  # OpenCode's own title (its title request's answer)
    assert s["cwd"] == doc["cwd"] and s["first_prompt"] == quoted(prompts("plain")[0])
    assert s["started_at"] < s["ended_at"] and s["started_at"].startswith(doc["captured_at"][:10])


def test_a_command_that_exits_1_is_a_failed_command_with_its_exit_code(tmp_path):
    store = tmp_path / "store"
    import_(store, data_dir(tmp_path, "ok_failing_command"))
    sid = capture("ok_failing_command")["session_id"]
    ev = events_of(store, sid)
    (cmd,) = of_type(ev, "command_execution")
    assert (cmd["command"], cmd["status"], cmd["exit_code"]) == ("cat CHANGELOG.md", "failed", 1)
    assert cmd["aggregated_output"] == "cat: CHANGELOG.md: No such file or directory\n"
    assert cmd["id"].startswith("prt_")  # OpenCode's part id
    assert turns(ev) == ["turn.completed"]  # the run itself succeeded
    assert "ran cat CHANGELOG.md (exit 1)" in facts(store, sid)
    assert json.loads(view(store, sid, "progress.json"))["goal"] == quoted(prompts("ok_failing_command")[0])


def test_usage_is_per_turn_with_each_request_and_its_model(tmp_path):
    store = tmp_path / "store"
    import_(store, data_dir(tmp_path, "ok_failing_command"))
    steps = capture("ok_failing_command")["script"]["steps"]
    (end,) = [e for e in events_of(store, capture("ok_failing_command")["session_id"]) if e["type"] == "turn.completed"]
    # each request in the form every agent's close gives (memfs.ingest.request_entry), as usage prices it
    assert [{k: v for k, v in r.items() if k != "at"} for r in end["requests"]] == [
        {"model": "gpt-5.5", "input": s["usage"]["input"], "output": s["usage"]["output"]} for s in steps]
    assert all(r["at"].endswith("Z") for r in end["requests"])
    assert end["usage"] == {"input_tokens": 2100, "cached_input_tokens": 0, "output_tokens": 45}
    assert end["model"] == "gpt-5.5" and end["completed_at"].endswith("Z")
    # the title request (a side request, answered outside the turn) is not the turn's


def test_an_api_error_is_a_failed_turn_with_the_providers_message(tmp_path):
    store = tmp_path / "store"
    import_(store, data_dir(tmp_path, "api_error"))
    sid = capture("api_error")["session_id"]
    ev = events_of(store, sid)
    message = "API Error: 400 Invalid request: model is not available"
    assert [e.get("message") for e in ev if e["type"] == "turn.failed"] == [message]
    assert of_type(ev, "error") == []  # the close says it (the stream has no id for an error item)
    assert listing(store)[sid]["status"] == "failed"


def test_a_retried_500_leaves_one_completed_turn(tmp_path):
    store = tmp_path / "store"
    import_(store, data_dir(tmp_path, "http_500_then_ok"))
    ev = events_of(store, capture("http_500_then_ok")["session_id"])
    assert turns(ev) == ["turn.completed"]
    assert [i["text"] for i in of_type(ev, "agent_message")] == ["The README describes a tiny demo project."]


# --- a continued session: run --session, then imports of the store as it grows ------------------


def _truncate(db: Path, after_ms: int) -> None:
    """The store as it was at ``after_ms``: OpenCode only adds rows (a later run's messages and
    parts), so the earlier store is this one less the rows created later."""
    conn = sqlite3.connect(db)
    try:
        conn.execute("DELETE FROM part WHERE time_created > ?", (after_ms,))
        conn.execute("DELETE FROM message WHERE time_created > ?", (after_ms,))
        conn.commit()
    finally:
        conn.close()


def test_a_continued_session_appends_its_new_turn_to_the_same_session(tmp_path):
    sid = capture("resume_two_turns")["session_id"]
    full = data_dir(tmp_path, "resume_two_turns")
    early = tmp_path / "early"
    shutil.copytree(full, early)
    (second,) = db_rows(full / "opencode.db", "SELECT time_created FROM message WHERE data LIKE '%\"role\":\"user\"%' "
                                              "ORDER BY time_created LIMIT 1 OFFSET 1")
    _truncate(early / "opencode.db", second[0] - 1)
    store = tmp_path / "store"
    import_(store, early)
    assert turns(events_of(store, sid)) == ["turn.completed"]
    (report,) = import_(store, full)
    assert (report["session"], report["status"], report["duplicates"] > 0) == (sid, "imported", True)
    ev = events_of(store, sid)
    assert turns(ev) == ["turn.completed", "turn.completed"]
    assert [c["prompt"] for c in started(ev)] == [quoted(p) for p in prompts("resume_two_turns")]
    assert [i["text"] for i in of_type(ev, "agent_message")] == [
        "The project has one file: README.md.", "It is a tiny demo project."]
    assert [e["usage"]["input_tokens"] for e in ev if e["type"] == "turn.completed"] == [2100, 1200]


def test_a_turn_imported_while_open_gets_its_new_items_and_its_close_once(tmp_path):
    sid = capture("ok_failing_command")["session_id"]
    full = data_dir(tmp_path, "ok_failing_command")
    early = tmp_path / "early"
    shutil.copytree(full, early)
    # the store after the command ran, before the answer: the second assistant message not yet there
    (answer,) = db_rows(full / "opencode.db", "SELECT time_created FROM message ORDER BY time_created DESC LIMIT 1")
    _truncate(early / "opencode.db", answer[0] - 1)
    store = tmp_path / "store"
    import_(store, early)
    ev = events_of(store, sid)
    assert turns(ev) == [] and [c["command"] for c in of_type(ev, "command_execution")] == ["cat CHANGELOG.md"]
    assert listing(store)[sid]["status"] == "running"
    import_(store, full)
    ev = events_of(store, sid)
    assert [e["type"] for e in ev] == ["thread.started", "turn.started", "item.completed", "item.completed",
                                       "turn.completed", "thread.completed"]
    assert [i["type"] for i in items(ev)] == ["command_execution", "agent_message"]
    assert listing(store)[sid]["status"] == "completed"


def test_an_interrupted_run_is_an_open_turn_with_what_it_did(tmp_path):
    doc = capture("interrupted")
    assert doc["runs"][0]["exit_code"] != 0  # killed by SIGINT while the model request hung
    store = tmp_path / "store"
    import_(store, data_dir(tmp_path, "interrupted"))
    ev = events_of(store, doc["session_id"])
    assert turns(ev) == []  # nothing in OpenCode's record says the turn ended
    assert [(c["command"], c["exit_code"]) for c in of_type(ev, "command_execution")] == [("ls", 0)]
    assert listing(store)[doc["session_id"]]["status"] == "running"


# --- sub-agents, to-do lists, MCP ---------------------------------------------------------------


def test_a_sub_agent_is_a_child_session_named_by_its_parent(tmp_path):
    sid = capture("subagent")["session_id"]
    data = data_dir(tmp_path, "subagent")
    (sub,) = [r[0] for r in db_rows(data / "opencode.db", "SELECT id FROM session WHERE parent_id = ?", sid)]
    child = f"{sid}.{sub}"
    store = tmp_path / "store"
    reports = import_(store, data)
    assert [r["session"] for r in reports] == [sid, child]  # the parent first
    parent = events_of(store, sid)
    assert of_type(parent, "command_execution") == []  # the sub-agent's `ls` is not the parent's
    (task,) = [i for i in items(parent) if i.get("tool_name") == "task"]
    assert (task["status"], task["child_session"], task["arguments"]["subagent_type"]) == ("completed", child, "general")
    ev = events_of(store, child)
    assert ev[0] == {"type": "thread.started", "thread_id": sub, "agent": "opencode"}
    assert started(ev)[0]["prompt"] == "List the files in the project and report them."
    assert [(c["command"], c["exit_code"]) for c in of_type(ev, "command_execution")] == [("ls", 0)]
    sessions = listing(store)
    assert sessions[child]["parent_session"] == sid and sessions[child]["conversation_id"] == sub
    assert child in sessions[sid]["children"]


def test_todowrite_is_one_todo_list_per_change_and_drives_progress(tmp_path):
    store = tmp_path / "store"
    import_(store, data_dir(tmp_path, "tasks"))
    sid = capture("tasks")["session_id"]
    lists = of_type(events_of(store, sid), "todo_list")
    assert [[t["status"] for t in tl["items"]] for tl in lists] == [
        ["in_progress", "pending"], ["completed", "in_progress"], ["completed", "completed"]]
    assert [t["text"] for t in lists[-1]["items"]] == ["Read the README", "Write the summary"]
    progress = json.loads(view(store, sid, "progress.json"))
    assert json.dumps(progress).count("Write the summary") >= 1


def test_an_mcp_tool_is_an_mcp_tool_call(tmp_path):
    store = tmp_path / "store"
    import_(store, data_dir(tmp_path, "mcp_call"))
    sid = capture("mcp_call")["session_id"]
    (call,) = of_type(events_of(store, sid), "mcp_tool_call")
    assert (call["server"], call["tool"], call["arguments"], call["status"], call["error"]) == (
        "notes", "lookup", {"key": "release"}, "completed", None)
    assert "v1.2 ships on Friday" in call["result"]["content"][0]["text"]
    assert "called notes.lookup" in facts(store, sid)


# --- reading the store: read-only, rows still in the WAL, links refused -------------------------


def test_rows_still_in_the_write_ahead_log_are_read_while_opencode_holds_the_database(tmp_path):
    data = data_dir(tmp_path, "plain")
    db = data / "opencode.db"
    sid = capture("plain")["session_id"]
    writer = sqlite3.connect(db)  # as OpenCode keeps it: WAL mode, not checkpointed, still open
    try:
        assert writer.execute("PRAGMA journal_mode = WAL").fetchone() == ("wal",)
        writer.execute("PRAGMA wal_autocheckpoint = 0")
        writer.execute("UPDATE session SET title = ? WHERE id = ?", ("Renamed in the WAL", sid))
        writer.commit()
        assert b"Renamed in the WAL" not in db.read_bytes()  # only in opencode.db-wal
        store = tmp_path / "store"
        (report,) = import_(store, db)
        assert report["status"] == "imported"
        assert listing(store)[sid]["title"] == "Renamed in the WAL"
        writer.execute("UPDATE session SET title = 'after' WHERE id = ?", (sid,))  # the import holds no lock
        writer.commit()
    finally:
        writer.close()


def test_a_write_ahead_log_left_by_an_exited_opencode_is_read_and_nothing_beside_it_written(tmp_path):
    """OpenCode exits without a checkpoint, its WAL and WAL index (``-shm``) left behind and no
    connection open. An import then reads the WAL's rows and changes none of the three files: a
    first connection that rebuilt the index would hold exclusive locks while it did, and
    OpenCode's next start (``PRAGMA journal_mode`` before its ``busy_timeout``) fails at once on
    those with "database is locked"."""
    data = data_dir(tmp_path, "plain")
    db = data / "opencode.db"
    sid = capture("plain")["session_id"]
    left = ("import os, sqlite3, sys; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
            "c.execute('PRAGMA journal_mode = WAL'); c.execute('PRAGMA wal_autocheckpoint = 0'); "
            "c.execute('UPDATE session SET title = ? WHERE id = ?', ('Left in the WAL', sys.argv[2])); os._exit(0)")
    subprocess.run([sys.executable, "-c", left, str(db), sid], check=True, timeout=60)
    files = [db, data / "opencode.db-wal", data / "opencode.db-shm"]

    def state() -> list[tuple]:
        return [(os.stat(f).st_mtime_ns, hashlib.sha256(f.read_bytes()).hexdigest()) for f in files]

    before = state()
    store = tmp_path / "store"
    (report,) = import_(store, db)
    assert report["status"] == "imported"
    assert listing(store)[sid]["title"] == "Left in the WAL"
    assert state() == before


def test_a_symbolic_link_to_the_database_is_refused_with_the_reason(tmp_path):
    data = data_dir(tmp_path, "plain")
    link_dir = tmp_path / "linked"
    link_dir.mkdir()
    (link_dir / "opencode.db").symlink_to(data / "opencode.db")
    store = tmp_path / "store"
    (report,) = import_(store, link_dir, ok=False)
    assert report["status"] == "error" and "symbolic link" in report["reason"]
    assert not listing(store) if store.exists() else True


def test_a_file_named_opencode_db_that_is_not_a_database_is_an_error_not_a_crash(tmp_path):
    bogus = tmp_path / "data" / "opencode.db"
    bogus.parent.mkdir()
    bogus.write_text("not sqlite\n")
    (report,) = import_(tmp_path / "store", bogus, ok=False)
    assert report["status"] == "error" and "not a SQLite database" in report["reason"]


# --- opencode run --format json: record and import of the stream, with the store ----------------


def streams(scenario: str) -> list[Path]:
    return sorted((OPENCODE / scenario).glob("stream*.jsonl"))


@pytest.mark.parametrize("scenario", ["ok_failing_command", "api_error", "resume_two_turns", "tasks"])
def test_the_stream_and_the_store_in_either_order_store_each_thing_once(tmp_path, scenario):
    sid = capture(scenario)["session_id"]
    data = data_dir(tmp_path, scenario)
    logs = {}
    for order, sources in (("stream-first", [*streams(scenario), data]), ("store-first", [data, *streams(scenario)])):
        store = tmp_path / order
        for source in sources:
            for report in import_(store, source, ok=True):
                assert (report["session"], report["refused"]) == (sid, 0), report
        ev = events_of(store, sid)
        assert len(turns(ev)) == len(prompts(scenario)), order
        ids = [i["id"] for i in items(ev)]
        assert len(ids) == len(set(ids)), order
        # (OpenCode's own cost is in its store only: thread.completed when the store came first)
        logs[order] = [(e["type"], e.get("item", {}).get("id")) for e in ev if e["type"] != "thread.completed"]
        # the prompt only the store has: a turn field when the store came first, a note otherwise
        assert listing(store)[sid]["first_prompt"] == quoted(prompts(scenario)[0]), order
    assert logs["stream-first"] == logs["store-first"]


def test_record_of_the_runs_then_the_store_is_one_session_each_thing_once(tmp_path):
    """``memfs record`` of the live runs (replayed from their captured stdout), then ``memfs
    import`` of OpenCode's store: one session, the name the user gave, nothing twice."""
    sid = capture("resume_two_turns")["session_id"]
    store = tmp_path / "store"
    recorded = record_replayed(store, "work", streams("resume_two_turns"), capture("resume_two_turns")["runs"])
    assert turns(recorded) == ["turn.completed", "turn.completed"]
    assert recorded[0] == {"type": "thread.started", "thread_id": sid, "agent": "opencode"}
    reports = import_(store, data_dir(tmp_path, "resume_two_turns"))
    assert {r["session"] for r in reports} == {"work"}
    stored = events_of(store, "work")  # the runs' streams have no end: the store's (with OpenCode's cost) is added
    assert stored[:-1] == recorded and stored[-1]["type"] == "thread.completed" and stored[-1]["thread_id"] == sid
    sessions = listing(store)
    assert sid not in sessions and sessions["work"]["conversation_id"] == sid
    assert sessions["work"]["cwd"] == capture("resume_two_turns")["cwd"]  # what only the store says
    assert sessions["work"]["model"] == "gpt-5.5"


def test_format_opencode_reads_its_stream_only_and_the_others_name_it(tmp_path):
    (report,) = import_(tmp_path / "a", streams("plain")[0])
    assert report["format"] == "opencode"
    other = Path(__file__).parent / "fixtures" / "agents" / "gemini" / "plain"
    gemini = sorted((other.parent / "ok_failing_command").glob("stream.jsonl"))[0]
    proc = cli("import", "--store", str(tmp_path / "b"), "--format", "opencode", "--json", str(gemini))
    (report,) = json.loads(proc.stdout)
    assert report["refused"] > 0 and report["appended"] == 0
    rejected = next((tmp_path / "b").rglob("rejected.jsonl")).read_text()
    assert "Gemini CLI stream-json" in rejected


def test_record_of_the_real_cli_then_import_of_its_store_is_one_session(tmp_path):
    """The real ``opencode run --format json`` (offline, scripted model server) under ``memfs
    record``, then ``memfs import`` of the data directory it wrote: one session, nothing twice,
    and what only the store says (the prompt, the model, the cwd) added."""
    sys.path.insert(0, str(Path(__file__).parent / "agents"))
    from clis import OpenCode
    from model_server import ModelServer

    from test_agents_cli import need_clis

    need_clis()
    script = {"steps": [{"tool": {"name": "bash", "arguments": {"command": "false", "description": "Fail"}}},
                        {"text": "The command failed."}], "side": OpenCode.side}
    store = tmp_path / "store"
    with ModelServer(script, tmp_path / "requests.jsonl") as server:
        agent = OpenCode(tmp_path / "sandbox", server.url)
        argv = agent.argv("Run false")
        proc = subprocess.run([*MEMFS, "record", "--store", str(store), "live", "--", *argv], cwd=agent.proj,
                              env={**agent.env(), "PATH": os.environ["PATH"]}, capture_output=True, timeout=180,
                              stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    recorded = events_of(store, "live")
    assert turns(recorded) == ["turn.completed"]
    (cmd,) = of_type(recorded, "command_execution")
    assert (cmd["command"], cmd["status"], cmd["exit_code"]) == ("false", "failed", 1)
    reports = import_(store, agent.home / ".local" / "share" / "opencode")
    assert [r["session"] for r in reports] == ["live"]
    stored = events_of(store, "live")  # the stream has no end: the store's (with OpenCode's cost) is added
    assert stored[:-1] == recorded and stored[-1]["type"] == "thread.completed"
    s = listing(store)["live"]
    assert (s["agent"], s["model"], s["cwd"], s["first_prompt"]) == ("opencode", "gpt-5.5", str(agent.proj), quoted("Run false"))


# --- what the next agent reads: usage with OpenCode's own cost, the views through the mount -------


def test_usage_per_turn_and_opencodes_own_cost_beside_memfs_computed_one(tmp_path):
    """resume_two_turns: requests of 1000/20 and 1100/25 tokens (run 1), then 1200/30 (run 2); the
    capture priced the scripted model at $1.25 / $10 per million (clis.OpenCode), so OpenCode's
    own cost is 1000*1.25e-6 + 20*1e-5 + 1100*1.25e-6 + 25*1e-5 = $0.003075, then $0.0018;
    memfs prices gpt-5.5 at $5 / $30: $0.01185, then $0.0069."""
    from memfs.usage import session_usage

    store = tmp_path / "store"
    import_(store, data_dir(tmp_path, "resume_two_turns"))
    with memfs.open_session(store, capture("resume_two_turns")["session_id"], read_only=True) as h:
        doc = session_usage(h)
    assert [(t["tokens"]["input"], t["tokens"]["output"], t["cost_usd"]) for t in doc["turns"]] == [
        (2100, 45, 0.01185), (1200, 30, 0.0069)]
    assert [t["agent_cost_usd"] for t in doc["turns"]] == [0.003075, 0.0018]
    assert doc["total"]["agent_cost_usd"] == 0.004875 and doc["total"]["cost_usd"] == 0.01875
    assert [t["model"] for t in doc["turns"]] == ["gpt-5.5", "gpt-5.5"]


@needs_fuse
def test_the_views_of_an_opencode_session_through_the_mount(tmp_path):
    store = tmp_path / "store"
    import_(store, data_dir(tmp_path, "ok_failing_command"))
    sid = capture("ok_failing_command")["session_id"]
    found, context, summary = mounted_views(store, tmp_path / "mnt", sid)
    assert "ran cat CHANGELOG.md (exit 1)" in found
    assert '**Goal:** "Show me the changelog"' in context
    assert "- **Turns:** 1 closed (1 completed, 0 failed, 0 abandoned)" in summary
    assert "There is no CHANGELOG.md in this project." in summary


def test_auto_compaction_is_a_boundary_and_a_summary_fact_in_a_turn_of_its_own(tmp_path):
    """compact: the first answer reports 30,000 input tokens (the model's context is 20,000), so in
    the same run OpenCode asks for a summary (a user message with a ``compaction`` part, answered
    by the summary) and answers a synthetic "Continue…" message; then the continued run."""
    doc = capture("compact")
    sid = doc["session_id"]
    summary = doc["script"]["steps"][1]["text"]
    store = tmp_path / "store"
    import_(store, data_dir(tmp_path, "compact"))
    ev = events_of(store, sid)
    (boundary,) = [e for e in ev if e["type"] == "thread.compact_boundary"]
    assert (boundary["trigger"], boundary["mode"], boundary["thread_id"]) == ("auto", "summary", sid)
    (fact,) = [i for i in items(ev) if i["type"] == "harness"]
    assert (fact["event"], fact["message"]) == ("compact_summary", summary)
    assert [c.get("prompt") for c in started(ev)] == [quoted(prompts("compact")[0]), None, None,
                                                      quoted(prompts("compact")[1])]
    assert "Continue if you have next steps" not in json.dumps(ev)  # synthetic: neither prompt nor answer
    assert [i["text"] for i in of_type(ev, "agent_message")] == [
        "The project has one file: README.md.", "Nothing more to do.", "It is a tiny demo project."]
    assert [e["usage"]["input_tokens"] for e in ev if e["type"] == "turn.completed"] == [30000, 1100, 1200, 1300]
    # from the stream in either order: the same turns, each thing once (the boundary: the store's)
    streamed = tmp_path / "streamed"
    for source in [*streams("compact"), data_dir(tmp_path / "again", "compact")]:
        import_(streamed, source)
    ids = [i["id"] for i in items(events_of(streamed, sid))]
    assert len(ids) == len(set(ids)) and len(turns(events_of(streamed, sid))) == 4
