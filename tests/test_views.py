"""Derived views through the library (SPEC §4): memory, trajectory, turns, summary.

Progress/goal rules are in test_views_progress_goal.py; laziness, incrementality and the
backing-store copies in test_views_cache.py.
"""

from __future__ import annotations

import memfs
import orjson
import pytest
from memfs import views
from memfs.errors import TurnNotFound


def item(kind: str, iid: str = "i", **fields) -> dict:
    return {"type": "item.completed", "item": {"id": iid, "type": kind, **fields}}


def usage(i=0, c=0, cc=0, o=0) -> dict:
    return {"input_tokens": i, "cached_input_tokens": c, "cache_creation_tokens": cc, "output_tokens": o}


STARTED = {"type": "turn.started"}
COMPLETED = {"type": "turn.completed", "usage": usage()}


def offsets(handle) -> list[int]:
    """The byte offset of every line of the session's events.jsonl."""
    data = handle.read_bytes()  # writes buffered lines first
    out, pos = [], 0
    for line in data.split(b"\n")[:-1]:
        out.append(pos)
        pos += len(line) + 1
    return out


def facts_of(handle) -> list[tuple]:
    return [(f["type"], f["fact"], f["turn"], f["offset"]) for f in views.memory_view(handle)["grounded_facts"]]


# --- grounded facts (§4.1) -----------------------------------------------------------------


def test_facts_per_event_type_carry_turn_and_offset(session):
    session.append_many([
        {"type": "thread.started", "thread_id": "t1"},
        {"type": "error", "message": "outside any turn"},
        STARTED,
        item("agent_message", text="Added the retry loop."),
        item("plan", text="- [ ] write tests"),
        item("decision", summary="Use backoff", rationale="fewer retries"),
        item("file_change", changes=[{"path": "src/a.py", "kind": "update"}, {"path": "src/b.py", "kind": "add"}],
             status="completed"),
        item("command_execution", command="pytest -q", status="failed", exit_code=1),
        item("command_execution", command="make lint", status="completed"),
        item("harness", event="compaction", message="context compacted"),
        item("harness", event="quiet"),  # no message: no fact
        item("reasoning", text="thinking is not a fact"),
        {"type": "item.started", "item": {"id": "x", "type": "agent_message", "text": "partial, not a fact"}},
        {"type": "turn.blocked", "message": "needs approval"},
        {"type": "turn.failed", "message": "tests failed"},
        STARTED,
        {"type": "error", "message": "rate limited"},
    ])
    off = offsets(session)
    assert facts_of(session) == [
        ("error", "outside any turn", None, off[1]),
        ("agent_message", "Added the retry loop.", 1, off[3]),
        ("plan", "- [ ] write tests", 1, off[4]),
        ("decision", "Use backoff", 1, off[5]),
        ("file_change", "file update: src/a.py", 1, off[6]),
        ("file_change", "file add: src/b.py", 1, off[6]),
        ("command_execution", "ran pytest -q (exit 1)", 1, off[7]),
        ("command_execution", "ran make lint", 1, off[8]),
        ("harness", "context compacted", 1, off[9]),
        ("turn.blocked", "needs approval", 1, off[13]),
        ("turn.failed", "tests failed", 1, off[14]),
        ("error", "rate limited", 2, off[16]),
    ]
    # the offset is the start of the event's own line in events.jsonl
    log = session.read_bytes()
    assert log[off[7]:].startswith(b'{"schema_version"') and b"pytest -q" in log[off[7]:].split(b"\n")[0]


def test_fact_normalization_cut_and_duplicates(session):
    long_text = "é" * 300  # 600 UTF-8 bytes: cut on a character boundary
    session.append_many([
        STARTED,
        item("agent_message", text="  spaced \n\t out   text  "),
        item("agent_message", text="spaced out text"),  # duplicate after normalization
        item("agent_message", text=" \n "),  # empty after normalization
        item("agent_message", text=long_text),
        item("decision", summary="spaced out text", rationale="dup across types"),
        COMPLETED,
    ])
    facts = [f["fact"] for f in views.memory_view(session)["grounded_facts"]]
    cut = "é" * 254 + "…"  # 254 × 2 = 508 ≤ 509 bytes, then the 3-byte ellipsis
    assert facts == ["spaced out text", cut]
    assert len(cut.encode()) == 511


def test_memory_json_shape_and_exact_pretty_bytes(session):
    session.append_many([{"type": "thread.started", "thread_id": "t"}, STARTED,
                         item("agent_message", text="hello"), COMPLETED])
    data = views.render_view(session, "memory.json")
    doc = orjson.loads(data)
    assert list(doc) == ["session_id", "schema_version", "summary", "grounded_facts", "touched_files",
                         "generated_at", "created_at", "source"]
    assert doc["session_id"] == "sess-1" and doc["schema_version"] == 3
    assert doc["created_at"] == session.manifest["created_at"]
    assert doc["source"] == {"events_len": session.file_len, "event_count": 4}
    assert data == orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n"
    empty = memfs.open_session(session.path.parent, "empty")
    data = views.render_view(empty, "memory.json")
    assert data == orjson.dumps(orjson.loads(data), option=orjson.OPT_INDENT_2) + b"\n"
    assert orjson.loads(data)["grounded_facts"] == [] and orjson.loads(data)["summary"] == ""
    empty.close()


def test_touched_files_and_summary(session):
    mem = views.memory_view(session)
    assert mem["summary"] == "" and mem["touched_files"] == []
    session.append_many([
        STARTED,
        item("agent_message", text="first message"),
        item("file_change", changes=[{"path": "src/z.py", "kind": "update"}, {"path": "src/a.py", "kind": "add"}],
             status="completed"),
        item("agent_message", text="last message of turn 1"),
        COMPLETED,
        STARTED,
        item("file_change", changes=[{"path": "src/a.py", "kind": "delete"}, {"path": "README", "kind": "update"}],
             status="failed"),
        item("agent_message", text="message of the open turn"),
    ])
    mem = views.memory_view(session)
    assert mem["touched_files"] == ["README", "src/a.py", "src/z.py"]
    assert mem["summary"] == "last message of turn 1"  # the open turn does not count
    session.append({"type": "turn.failed", "message": "boom"})
    assert views.memory_view(session)["summary"] == "message of the open turn"
    session.append_many([STARTED, COMPLETED])  # the last closed turn has no agent message
    assert views.memory_view(session)["summary"] == ""


def test_evicted_facts_survive_a_cap_eviction(tmp_path):
    with memfs.open_session(tmp_path, "capped", max_events=6) as h:
        h.append_many([STARTED, item("agent_message", text="evicted fact one"),
                       item("command_execution", command="make", status="completed", exit_code=0), COMPLETED])
        assert [f["turn"] for f in views.memory_view(h)["grounded_facts"]] == [1, 1]
        h.append_many([STARTED, item("agent_message", text="kept fact"), COMPLETED])  # 7 > 6: turn 1 goes
        assert h.manifest["retained_turn_base"] == 2
        mem = views.memory_view(h)
        names = views.list_names(h)
        summaries = [n for n in names if n.startswith("eviction-summary-")]
        assert len(summaries) == 1
        assert [(f["fact"], f["turn"], f["offset"], f["type"]) for f in mem["grounded_facts"]] == [
            ("evicted fact one", None, None, "evicted"),
            ("ran make (exit 0)", None, None, "evicted"),
            ("kept fact", 2, offsets(h)[1], "agent_message"),
        ]
        assert mem["grounded_facts"][0]["summary"] == summaries[0]
        assert mem["source"]["event_count"] == 3
        stored = views.render_view(h, summaries[0])
        assert stored == (h.path / "derived" / summaries[0]).read_bytes()
        assert orjson.loads(stored)["grounded_facts"] == ["evicted fact one", "ran make (exit 0)"]
        # the same fact appearing again in the log stays at its evicted place only
        h.append_many([STARTED, item("agent_message", text="evicted fact one"), COMPLETED])
        facts = [f["fact"] for f in views.memory_view(h)["grounded_facts"]]
        assert facts.count("evicted fact one") == 1


# --- trajectory and turns (§4.2) -----------------------------------------------------------


def test_trajectory_outcomes_usage_and_counts(session):
    session.append_many([
        {"type": "thread.started", "thread_id": "t"},
        {"type": "turn.started", "context": {"timestamp": "2026-01-01T00:00:00+00:00"}},
        item("agent_message", text="a"),
        item("command_execution", command="make", status="completed", exit_code=0),
        item("command_execution", command="make test", status="failed", exit_code=2),
        item("file_change", changes=[{"path": "x.py", "kind": "update"}, {"path": "x.py", "kind": "update"}],
             status="completed"),
        {"type": "item.updated", "item": {"id": "m", "type": "agent_message", "text": "partial"}},
        {"type": "turn.completed", "usage": usage(100, 50, 5, 10), "completed_at": "2026-01-01T00:01:00+00:00"},
        STARTED,  # turn 2: blocked then failed
        {"type": "turn.blocked", "message": "waiting", "usage": usage(1, 0, 0, 1)},
        item("error", message="item error"),
        {"type": "turn.failed", "message": "gave up", "usage": usage(7, 0, 0, 3)},
        STARTED,  # turn 3: abandoned by the next turn.started
        item("agent_message", text="b"),
        STARTED,  # turn 4: open
        {"type": "error", "message": "still going"},
    ])
    traj = views.trajectory(session)
    assert [t["turn"] for t in traj] == [1, 2, 3, 4]
    assert [t["outcome"] for t in traj] == ["completed", "failed", "abandoned", "open"]
    index = session.turn_index
    for t, entry in zip(traj, index):
        assert (t["start_offset"], t["end_offset"], t["event_count"]) == (
            entry["start_offset"], entry["end_offset"], entry["event_count"])
    t1, t2, t3, t4 = traj
    assert t1["usage"] == usage(100, 50, 5, 10)
    assert t1["item_types"] == {"agent_message": 1, "command_execution": 2, "file_change": 1}
    assert t1["commands"] == [{"command": "make", "exit_code": 0, "status": "completed"},
                              {"command": "make test", "exit_code": 2, "status": "failed"}]
    assert t1["files"] == ["x.py"] and t1["errors"] == []
    assert t1["started_at"] == "2026-01-01T00:00:00+00:00" and t1["completed_at"] == "2026-01-01T00:01:00+00:00"
    assert t2["usage"] == usage(8, 0, 0, 4)
    assert t2["errors"] == ["waiting", "item error", "gave up"]
    assert t3["event_count"] == 2 and t3["usage"] == usage()
    assert t4["errors"] == ["still going"] and t4["completed_at"] is None
    raw = views.render_view(session, "trajectory.jsonl")
    assert raw.endswith(b"\n") and raw.count(b"\n") == 4


def test_turn_files_are_the_exact_bytes_and_evicted_turns_are_absent(tmp_path):
    with memfs.open_session(tmp_path, "turns", max_events=8) as h:
        h.append_many([{"type": "thread.started", "thread_id": "t"}, STARTED, item("agent_message", text="one"),
                       COMPLETED, STARTED, item("agent_message", text="two"), COMPLETED])
        log = h.read_bytes()
        assert views.list_turns(h) == [1, 2]
        for n, entry in zip((1, 2), h.turn_index):
            assert views.render_view(h, f"turns/{n}.jsonl") == log[entry["start_offset"]:entry["end_offset"]]
        h.append_many([STARTED, {"type": "turn.blocked", "message": "x"}])  # 9 > 8: turn 1 is evicted
        assert views.list_turns(h) == [2, 3]
        with pytest.raises(TurnNotFound):
            views.render_view(h, "turns/1.jsonl")
        log = h.read_bytes()
        open_turn = views.render_view(h, "turns/3.jsonl")
        start, end, outcome = h.turn_range(3)
        assert outcome == "open" and open_turn == log[start:end] and log.endswith(open_turn)
        assert [t["turn"] for t in views.trajectory(h)] == [2, 3]
        for bad in ("turns/0.jsonl", "turns/4.jsonl", "turns/01.jsonl", "turns/x.jsonl", "turns/2.json"):
            with pytest.raises(TurnNotFound):
                views.render_view(h, bad)
        for bad in ("nope.json", "eviction-summary-../../manifest.json", "turns"):
            with pytest.raises(FileNotFoundError):
                views.render_view(h, bad)


def test_list_names(session):
    assert views.list_names(session) == list(views.VIEW_NAMES)
    assert views.VIEW_NAMES == ("memory.json", "trajectory.jsonl", "summary.md", "progress.json", "progress.md",
                                "goal.json", "context.md", "transcript.md", "usage.json")


def test_summary_markdown(session):
    session.append_many([
        {"type": "thread.started", "thread_id": "t"},
        STARTED,
        item("agent_message", text="Added the retry loop."),
        item("file_change", changes=[{"path": "src/net.py", "kind": "update"}], status="completed"),
        {"type": "turn.completed", "usage": usage(1200, 800, 0, 95)},
        STARTED,
        {"type": "turn.failed", "message": "tests   failed\non CI"},
        {"type": "thread.completed", "thread_id": "t", "session_id": "sess-1", "subtype": "success",
         "outcome_code": "completed", "usage": usage(), "num_turns": 2},
    ])
    created = session.manifest["created_at"]
    assert views.summary_markdown(session) == (
        "# Session sess-1\n\n"
        "- **Status:** completed\n"
        "- **Agent:** vtcode (thread `t`)\n"  # thread.completed: VT Code's, Codex has none
        "- **Turns:** 2 closed (1 completed, 1 failed, 0 abandoned)\n"
        f"- **Events:** 8 ({session.file_len} bytes)\n"
        "- **Tokens:** 1200 input (800 cached, 0 cache creation), 95 output\n"
        f"- **Created:** {created}\n"
        "\n## Files touched (1)\n\n"
        "- `src/net.py`\n"
        "\n## Errors (1)\n\n"
        "- turn 2 (turn.failed): tests failed on CI\n"
        "\n## Last agent message\n\n"
        "Added the retry loop.\n"
    )
    session.append_many([STARTED])
    assert "- **Status:** running, turn 3 open\n" in views.summary_markdown(session)  # as memfs sessions says


def test_summary_markdown_of_an_empty_session(session):
    text = views.summary_markdown(session)
    assert "- **Turns:** 0 closed (0 completed, 0 failed, 0 abandoned)\n" in text
    assert "## Files touched (0)\n\n_None._\n" in text and "## Errors (0)\n\n_None._\n" in text
    assert text.endswith("## Last agent message\n\n_None yet._\n")


def test_views_are_a_pure_function_of_the_log(tmp_path):
    """A second session fed the same lines renders the same views (generated_at aside, and the
    trajectory's times where the events carry no clock: memfs's recorded arrival times)."""
    lines = [STARTED, item("agent_message", text="x"), item("plan", text="1. a\n- [x] b"),
             {"type": "goal.created", "goal_id": "g", "objective": "ship", "created_at": "2026-01-01T00:00:00Z"},
             {"type": "turn.completed", "usage": usage(3, 0, 0, 4), "completed_at": "2026-01-02T00:00:00Z"},
             STARTED, {"type": "turn.failed", "message": "m", "completed_at": "2026-01-03T00:00:00Z"}]
    rendered = []
    for sid in ("sess-one", "sess-two"):
        with memfs.open_session(tmp_path, sid) as h:
            h.append_many(lines)
            out = {}
            for name in views.VIEW_NAMES:
                data = views.render_view(h, name)
                out[name] = data.replace(h.manifest["created_at"].encode(), b"<created>")
            arrivals = h.turn_times()
            turns = []
            for t in views.trajectory(h):
                for i, key in enumerate(("started_at", "completed_at")):
                    if t[key] is not None and t[key] == arrivals[t["turn"]][i]:
                        t[key] = "<arrival>"
                turns.append(t)
            out["trajectory.jsonl"] = turns
            mem = orjson.loads(out["memory.json"])
            del mem["generated_at"], mem["session_id"]
            out["memory.json"] = mem
            for name in ("summary.md", "progress.json", "context.md", "usage.json"):
                out[name] = out[name].replace(f'Session {sid}'.encode(), b"").replace(f'"{sid}"'.encode(), b"")
                out[name] = out[name].replace(f'session {sid}'.encode(), b"")
            out["transcript.md"] = out["transcript.md"].replace(sid.encode(), b"")  # (its title and header)
            rendered.append(out)
    assert rendered[0] == rendered[1]


# --- Codex's dialect (SPEC §2, §4): what the views read from a real-shaped `codex exec --json` ---

CODEX_EXEC = (__import__("pathlib").Path(__file__).parent / "fixtures" / "codex_exec.jsonl").read_bytes()


def test_codex_stream_facts_trajectory_summary_and_progress(session):
    lines = CODEX_EXEC.splitlines()
    assert session.append_many(lines) == len(lines) == 26
    m = session.manifest
    assert (m["turn_count"], m["in_turn"], m["event_count"]) == (2, False, 26)
    facts = [(f["type"], f["fact"], f["turn"]) for f in views.memory_view(session)["grounded_facts"]]
    for fact in [
        ("mcp_tool_call", "called docs.search", 1),
        ("mcp_tool_call", "called tracker.open_issue failed: tool call timed out after 60s", 1),
        ("command_execution", "declined: git push origin main", 1),
        ("web_search", "web search: python socket retry jitter", 1),
        ("error", "command declined by the approval policy: git push origin main", 1),
        ("todo_list", "todo: [x] Read src/net.py; [x] Add a retry loop with backoff; [ ] Run the tests", 1),
        ("error", "Reconnecting... 1/5", 2),
        ("turn.failed", "stream disconnected before completion: error sending request for url "
                        "(https://api.openai.com/v1/responses)", 2),
    ]:
        assert fact in facts
    t1, t2 = views.trajectory(session)
    assert (t1["outcome"], t2["outcome"]) == ("completed", "failed")
    assert t1["item_types"] == {"reasoning": 1, "command_execution": 2, "mcp_tool_call": 2, "web_search": 1,
                                "file_change": 1, "error": 1, "agent_message": 1, "todo_list": 1}
    assert {"command": "git push origin main", "exit_code": None, "status": "declined"} in t1["commands"]
    assert t1["errors"] == ["tracker.open_issue failed: tool call timed out after 60s",
                            "command declined by the approval policy: git push origin main"]
    assert t1["usage"]["input_tokens"] == 24763 and t1["files"] == ["src/net.py", "tests/test_net.py"]
    assert t2["errors"] == ["Reconnecting... 1/5", "stream disconnected before completion: error sending "
                            "request for url (https://api.openai.com/v1/responses)"]
    summary = views.summary_markdown(session)
    assert "- **Agent:** codex (thread `0199a213-81c0-7800-8aa1-bbab2a035a53`)\n" in summary
    assert "- turn 2 (turn.failed): stream disconnected before completion" in summary
    p = views.progress(session)
    assert [(m["description"], m["status"]) for m in p["milestones"]] == [
        ("Read src/net.py", "done"), ("Add a retry loop with backoff", "done"), ("Run the tests", "pending")]
    assert p["goal"] == "Read src/net.py; Add a retry loop with backoff; Run the tests"
    assert p["stalled_since"] is not None  # the failed turn


@pytest.mark.parametrize(("first", "agent"), [
    ({"type": "thread.started", "thread_id": "x", "agent": "claude"}, "claude"),  # the ingest's marker
    ({"type": "thread.started", "thread_id": "x", "agent": "claude-code"}, "claude"),  # older memfs wrote it
    ({"type": "turn.started", "context": {"origin": "user"}}, "vtcode"),
    (item("todo_list", items=[]), "codex"),
    ({"type": "turn.started"}, "unknown"),
])
def test_the_agent_that_wrote_a_session(session, first, agent):
    session.append_many([first, STARTED])
    assert f"- **Agent:** {agent} (" in views.summary_markdown(session)


# --- context.md: the brief for the next prompt ----------------------------------------------


def test_context_brief_of_a_codex_stream(session):
    session.append_many(CODEX_EXEC.splitlines())
    brief = views.context_markdown(session)
    assert brief == views.render_view(session, "context.md").decode()
    assert brief.startswith(
        "# Context: session sess-1\n\n"
        "**Goal:** Read src/net.py; Add a retry loop with backoff; Run the tests\n"
        "**Progress:** 2 of 3 milestones done (67%), confidence 0.90, stalled since ")
    assert "agent codex (thread `0199a213-81c0-7800-8aa1-bbab2a035a53`)\n" in brief
    sections = [line for line in brief.splitlines() if line.startswith("## ")]
    assert sections == ["## Open todos", "## Last summary", "## Failures (newest first)",
                        "## Files touched (newest first)", "## Facts (newest first)"]
    assert "## Open todos\n- [ ] Run the tests\n\n" in brief
    assert "## Last summary\nAdded a retry loop with exponential backoff to fetch(); tests still to run.\n" in brief
    failures = brief.split("## Failures (newest first)\n")[1].split("\n\n")[0].splitlines()
    assert failures[0] == ("- turn 2 (turn.failed): stream disconnected before completion: error sending request "
                           "for url (https://api.openai.com/v1/responses)")
    assert failures[-1] == "- turn 1 (mcp_tool_call): tracker.open_issue failed: tool call timed out after 60s"
    assert "- `tests/test_net.py`\n- `src/net.py`\n" in brief
    assert "- declined: git push origin main\n" in brief and "- called docs.search\n" in brief
    assert "todo:" not in brief  # the todos have their own section


@pytest.mark.parametrize("budget", [1, 10, 40, 60, 100, 150, 400])
def test_context_brief_never_exceeds_its_budget_and_cuts_the_oldest(session, budget):
    session.append_many([STARTED, *(item("command_execution", f"c{i}", command=f"step-{i:03d}", status="completed",
                                         exit_code=0) for i in range(300)), COMPLETED])
    brief = views.context_markdown(session, budget)
    assert len(brief.encode()) <= budget * 4
    whole = views.context_markdown(session, 100_000)
    assert "ran step-000 (exit 0)" in whole and "ran step-299 (exit 0)" in whole
    if "## Facts" in brief:
        shown = [line for line in brief.splitlines() if line.startswith("- ran step-")]
        assert shown == [f"- ran step-{i:03d} (exit 0)" for i in range(299, 299 - len(shown), -1)]  # newest first
        assert brief.rstrip().endswith(f"- … {300 - len(shown)} earlier")


def test_the_agent_is_told_from_the_head_of_the_log_only(session):
    filler = [item("agent_message", f"m{i}", text="x" * 1000) for i in range(70)]  # > 64 KiB, no sign
    session.append_many([STARTED, *filler, item("todo_list", items=[])])
    assert "- **Agent:** unknown (no thread id)\n" in views.summary_markdown(session)
