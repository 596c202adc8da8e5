"""Codex records in (SPEC §10, every Codex row): the rollouts and ``exec --json`` streams the
real Codex CLI 0.171.0 wrote (``tests/fixtures/agents/codex/*``, see docs/agents.md) tell the
agent's own story — imported with ``memfs import`` and read back through a real mount."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from memfs.agents.codex.read import turn_signature
from memfs.events import parse_line
from memfs.ingest import OUTPUT_HEAD, OUTPUT_TAIL, AutoTranslator

from mounting import cleanup, needs_fuse, start

CODEX = Path(__file__).parent / "fixtures" / "agents" / "codex"
OLD_ROLLOUT = Path(__file__).parent / "fixtures" / "codex_rollout.jsonl"
SCENARIOS = ("api_error", "compact", "http_500_then_ok", "mcp_call", "ok_failing_command", "resume_two_turns",
             "tasks")


def capture(scenario: str) -> dict:
    return json.loads((CODEX / scenario / "capture.json").read_text())


def rollout(scenario: str) -> Path:
    (path,) = (CODEX / scenario / "home" / ".codex" / "sessions").rglob("rollout-*.jsonl")
    return path


def streams(scenario: str) -> list[Path]:
    return sorted((CODEX / scenario).glob("stream*.jsonl"))


def feed(lines: list[bytes]) -> tuple[list[dict], AutoTranslator]:
    t = AutoTranslator("codex")
    out = []
    for raw in lines:
        for line in t.feed(raw):
            parse_line(line)  # every translated line is valid
            out.append(orjson.loads(line))
    return out, t


def translate(path: Path) -> list[dict]:
    return feed(path.read_bytes().splitlines())[0]


def edited(scenario: str, edit) -> list[bytes]:
    """The scenario's rollout with ``edit(obj)`` applied to each line (None drops the line):
    the captured shapes, arranged as other Codex versions write them."""
    out = []
    for raw in rollout(scenario).read_bytes().splitlines():
        obj = edit(orjson.loads(raw))
        if obj is not None:
            out.append(orjson.dumps(obj))
    return out


def completed(events: list[dict], itype: str) -> list[dict]:
    return [e["item"] for e in events if e["type"] == "item.completed" and e["item"]["type"] == itype]


def closes(events: list[dict]) -> list[dict]:
    return [e for e in events if e["type"] in ("turn.completed", "turn.failed")]


def payload_type(obj: dict) -> str | None:
    p = obj.get("payload")
    return p.get("type") if isinstance(p, dict) else None


# --- a mount of what `memfs import` made -----------------------------------------------------------


def memfs_import(store: Path, *paths: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "memfs", "import", "--store", str(store), *map(str, paths)],
                          capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()


STORES = ("rollouts", "streams", "streams_then_rollout", "rollout_then_streams")


@pytest.fixture(scope="module")
def mounts(tmp_path_factory):
    """Stores through real mounts, one session per Codex thread: every scenario's rollout
    (``rollouts``), its ``exec --json`` streams (``streams``), and both, imported in either
    order."""
    base = tmp_path_factory.mktemp("codex")
    memfs_import(base / "rollouts", *(rollout(s) for s in SCENARIOS))
    memfs_import(base / "streams", *(p for s in SCENARIOS for p in streams(s)))
    memfs_import(base / "streams_then_rollout", *(p for s in SCENARIOS for p in [*streams(s), rollout(s)]))
    memfs_import(base / "rollout_then_streams", *(p for s in SCENARIOS for p in [rollout(s), *streams(s)]))
    started = []
    try:
        for name in STORES:
            started.append(start(base / name, base / f"mnt-{name}"))
        yield {name: m.mnt / "sessions" for name, m in zip(STORES, started)}
    finally:
        for m in started:
            cleanup(m)


def view(mnt: Path, scenario: str, name: str):
    path = mnt / capture(scenario)["session_id"] / "derived" / name
    return json.loads(path.read_bytes()) if name.endswith(".json") else path.read_text()


def facts(mnt: Path, scenario: str) -> list[str]:
    return [f["fact"] for f in view(mnt, scenario, "memory.json")["grounded_facts"]]


# --- failures -------------------------------------------------------------------------------------

HIGH_DEMAND = "We’re currently experiencing high demand, which may cause temporary errors."  # Codex's HTTP 500 text


def test_a_task_complete_carrying_an_error_fails_the_turn():
    ev = translate(rollout("api_error"))
    (close,) = closes(ev)
    assert close["type"] == "turn.failed"
    assert close["message"] == HIGH_DEMAND
    assert close["completed_at"] == "2026-12-03T07:59:02.840Z"


def test_error_and_stream_error_events_fail_the_turn_a_recovered_retry_does_not():
    def older(obj):  # the run's error as an `error` event before a plain task_complete
        if payload_type(obj) == "task_complete":
            message = obj["payload"].pop("error")["message"]
            return [{"timestamp": obj["timestamp"], "type": "event_msg",
                     "payload": {"type": "stream_error", "message": "Reconnecting... 1/1"}},
                    {"timestamp": obj["timestamp"], "type": "event_msg",
                     "payload": {"type": "error", "message": message}},
                    obj]
        return [obj]
    lines = [orjson.dumps(o) for raw in rollout("api_error").read_bytes().splitlines()
             for o in older(orjson.loads(raw))]
    ev, _ = feed(lines)
    assert completed(ev, "error") == [{"id": "01a23ae9-f9a7-71e2-9e2f-ff9c176821b2:0", "type": "error",
                                       "message": "Reconnecting... 1/1"}]
    (close,) = closes(ev)
    assert (close["type"], close["message"]) == ("turn.failed", HIGH_DEMAND)
    # a retry the model answered after is no failure: http_500_then_ok with a stream_error in it
    def retried(obj):
        if payload_type(obj) == "item_completed" and obj["payload"]["item"]["type"] == "AgentMessage":
            return [{"timestamp": obj["timestamp"], "type": "event_msg",
                     "payload": {"type": "stream_error", "message": "Reconnecting... 1/2"}}, obj]
        return [obj]
    lines = [orjson.dumps(o) for raw in rollout("http_500_then_ok").read_bytes().splitlines()
             for o in retried(orjson.loads(raw))]
    ev, _ = feed(lines)
    assert [c["type"] for c in closes(ev)] == ["turn.completed"]
    assert [i["message"] for i in completed(ev, "error")] == ["Reconnecting... 1/2"]


def test_turn_aborted_fails_the_turn_as_interrupted():
    ev = translate(OLD_ROLLOUT)
    last = closes(ev)[-1]
    assert (last["type"], last["message"]) == ("turn.failed", "interrupted")


@needs_fuse
def test_the_views_of_a_failed_run_do_not_report_success(mounts):
    for store in ("rollouts", "streams"):
        mnt = mounts[store]
        summary = view(mnt, "api_error", "summary.md")
        assert "(0 completed, 1 failed, 0 abandoned)" in summary, summary
        assert "(turn.failed): We’re currently experiencing high demand" in summary
        context = view(mnt, "api_error", "context.md")
        assert "0 completed, 1 failed" in context and "## Failures" in context
        progress = view(mnt, "api_error", "progress.json")
        assert progress["stalled_since"] is not None
        if store == "rollouts":  # the stream does not carry the prompt
            assert progress["goal"] == "Summarize the README"
        assert HIGH_DEMAND in facts(mnt, "api_error")


# --- commands -------------------------------------------------------------------------------------


def test_a_failed_command_keeps_its_exit_code_and_output():
    expected = {"id": "call_0636000002", "type": "command_execution", "command": "cat CHANGELOG.md",
                "status": "failed", "aggregated_output": "cat: CHANGELOG.md: No such file or directory\n",
                "exit_code": 1}
    ev = translate(rollout("ok_failing_command"))
    assert completed(ev, "command_execution") == [expected]
    assert [c["type"] for c in closes(ev)] == ["turn.completed"]
    # without 0.171's CommandExecution item: from the function call and its output's exit line
    ev, _ = feed(edited("ok_failing_command",
                        lambda o: None if payload_type(o) == "item_completed"
                        and o["payload"]["item"]["type"] == "CommandExecution" else o))
    assert completed(ev, "command_execution") == [expected]


def test_a_long_output_keeps_its_first_and_last_2_kib():
    long = "".join(f"line {i}\n" for i in range(5000))

    def grow(obj):
        if payload_type(obj) == "item_completed" and obj["payload"]["item"]["type"] == "CommandExecution":
            obj["payload"]["item"]["aggregated_output"] = long
        return obj
    ev, _ = feed(edited("ok_failing_command", grow))
    (item,) = completed(ev, "command_execution")
    data = long.encode()
    assert item["aggregated_output"] == (data[:OUTPUT_HEAD] + "\n…\n".encode() + data[-OUTPUT_TAIL:]).decode()


@needs_fuse
def test_the_failed_command_is_a_fact_with_its_exit_code(mounts):
    assert "ran cat CHANGELOG.md (exit 1)" in facts(mounts["rollouts"], "ok_failing_command")
    summary = view(mounts["rollouts"], "ok_failing_command", "summary.md")
    assert "(1 completed, 0 failed, 0 abandoned)" in summary


# --- prompts --------------------------------------------------------------------------------------


def test_the_prompt_is_the_turns_not_the_environment_context():
    for scenario in SCENARIOS:
        prompts = [r["prompt"] for r in capture(scenario)["runs"]]
        ev = translate(rollout(scenario))
        starts = [e for e in ev if e["type"] == "turn.started"]
        assert [s["context"]["prompt"] for s in starts] == prompts, scenario
        assert all(s["context"]["origin"] == "user" for s in starts)
        assert not completed(ev, "user_message")  # the prompt is not an item besides
    # an older rollout: the prompt came before its task_started, as an event and a response item
    ev = translate(OLD_ROLLOUT)
    assert [e["context"]["prompt"] for e in ev if e["type"] == "turn.started"] == \
        ["Add a retry loop to fetch()", "Now push it"]


@needs_fuse
def test_the_goal_is_the_prompt_not_the_plan(mounts):
    progress = view(mounts["rollouts"], "tasks", "progress.json")
    assert progress["goal"] == "Plan the work: read the README, then summarize it"
    assert [(m["description"], m["status"]) for m in progress["milestones"]] == \
        [("Read the README", "done"), ("Write the summary", "done")]


# --- MCP, plans, compaction -----------------------------------------------------------------------

MCP_ITEM = {"id": "call_1094000006", "type": "mcp_tool_call", "server": "notes", "tool": "lookup",
            "arguments": {"key": "release"}, "error": None, "status": "completed"}


def test_an_mcp_call_is_an_mcp_tool_call_item():
    (item,) = completed(translate(rollout("mcp_call")), "mcp_tool_call")
    assert {k: v for k, v in item.items() if k != "result"} == MCP_ITEM
    assert item["result"] == {"content": [{"type": "text", "text": "v1.2 ships on Friday"}],
                              "structured_content": {"result": "v1.2 ships on Friday"}}
    # without the McpToolCall item: the namespaced function call (after tool_search) and its output
    ev, _ = feed(edited("mcp_call", lambda o: None if payload_type(o) == "item_completed"
                        and o["payload"]["item"]["type"] == "McpToolCall" else o))
    (item,) = completed(ev, "mcp_tool_call")
    assert {k: v for k, v in item.items() if k != "result"} == MCP_ITEM
    assert item["result"]["structured_content"] == {"result": "v1.2 ships on Friday"}


@needs_fuse
def test_the_mcp_call_is_a_fact(mounts):
    for store in ("rollouts", "streams"):
        assert "called notes.lookup" in facts(mounts[store], "mcp_call"), store


def test_update_plan_is_one_todo_list_with_the_whole_list_after_each_change():
    ev = translate(rollout("tasks"))
    todo = [(e["type"], e["item"]["id"], [(i["text"], i["completed"]) for i in e["item"]["items"]])
            for e in ev if e["type"].startswith("item.") and e["item"]["type"] == "todo_list"]
    first, both = [("Read the README", False), ("Write the summary", False)], \
        [("Read the README", True), ("Write the summary", True)]
    assert todo == [("item.started", "call_1252000002", first),
                    ("item.updated", "call_1252000002", [("Read the README", True), ("Write the summary", False)]),
                    ("item.updated", "call_1252000002", both),
                    ("item.completed", "call_1252000002", both)]


def test_compaction_is_a_boundary_and_a_summary_not_an_answer():
    ev = translate(rollout("compact"))
    (boundary,) = [e for e in ev if e["type"] == "thread.compact_boundary"]
    assert boundary["thread_id"] == capture("compact")["session_id"] and boundary["compacted_message_count"] == 4
    (summary,) = completed(ev, "harness")
    assert summary["message"] == "The user asked which files the project has; the answer was README.md."
    # the summary the model wrote for the compaction is not one of the agent's answers
    assert [i["text"] for i in completed(ev, "agent_message")] == \
        ["The project has one file: README.md.", "It is a tiny demo project."]
    assert [e["type"] for e in ev].count("turn.started") == 2


@needs_fuse
def test_the_compaction_summary_is_a_fact(mounts):
    summary = "The user asked which files the project has; the answer was README.md."
    assert summary in facts(mounts["rollouts"], "compact")


# --- usage ----------------------------------------------------------------------------------------


def test_cumulative_token_counts_become_per_turn_usage():
    ev = translate(rollout("resume_two_turns"))
    assert [c["usage"] for c in closes(ev)] == [
        {"input_tokens": 2100, "cached_input_tokens": 0, "output_tokens": 45},
        {"input_tokens": 1200, "cached_input_tokens": 0, "output_tokens": 30}]


@needs_fuse
def test_a_resumed_conversation_counts_each_token_once(mounts):
    # the agent counted 3300 input / 75 output over the two runs (its running total at the end)
    for store in ("rollouts", "streams"):
        summary = view(mounts[store], "resume_two_turns", "summary.md")
        assert "**Tokens:** 3300 input (0 cached, 0 cache creation), 75 output" in summary, (store, summary)
        assert "(2 completed, 0 failed, 0 abandoned)" in summary
        compact = view(mounts[store], "compact", "summary.md")
        assert "**Tokens:** 7300 input (0 cached, 0 cache creation), 105 output" in compact, (store, compact)
    trajectory = view(mounts["streams"], "resume_two_turns", "trajectory.jsonl")
    assert [json.loads(line)["usage"]["input_tokens"] for line in trajectory.splitlines()] == [2100, 1200]


# --- metadata and ids -----------------------------------------------------------------------------


def test_metadata_from_session_meta_and_turn_context():
    _, t = feed(rollout("resume_two_turns").read_bytes().splitlines())
    cap = capture("resume_two_turns")
    assert t.meta == {"agent": "codex", "agent_version": "0.171.0", "conversation_id": cap["session_id"],
                      "cwd": cap["cwd"], "originator": "codex_exec", "git_branch": "main",
                      "started_at": "2026-12-03T07:59:07.589Z", "model": "gpt-5.5",
                      "first_prompt": "What files are in the project?", "status": "completed",
                      "ended_at": "2026-12-03T07:59:08.316Z"}
    _, t = feed(rollout("api_error").read_bytes().splitlines())
    assert t.meta["status"] == "failed"
    # an exec --json stream passes through byte for byte; its meta is what it says
    t = AutoTranslator("codex")
    for raw in streams("api_error")[0].read_bytes().splitlines():
        assert t.feed(raw) == [raw]
    assert t.meta == {"agent": "codex", "conversation_id": capture("api_error")["session_id"], "status": "failed"}


def test_ids_are_codexs_own_and_the_rollout_turns_match_the_exec_turns():
    for scenario in SCENARIOS:
        lines = rollout(scenario).read_bytes().splitlines()
        ev = translate(rollout(scenario))
        turn_ids = [orjson.loads(raw)["payload"]["turn_id"] for raw in lines if b'"task_started"' in raw]
        assert [e["context"]["turn_id"] for e in ev if e["type"] == "turn.started"] == turn_ids, scenario
        for e in ev:
            if e["type"].startswith("item."):
                iid = e["item"]["id"]
                assert iid.startswith("call_") or iid.split(":")[0] in turn_ids, (scenario, iid)
        # a turn of the rollout and the same turn printed by `codex exec --json` close alike
        printed = [turn_signature(e) for p in streams(scenario) for e in translate(p) if turn_signature(e)]
        assert [turn_signature(e) for e in closes(ev)] == printed, scenario
    ev = translate(rollout("resume_two_turns"))
    assert [turn_signature(e) for e in closes(ev)] == [("completed", 2100, 0, 45), ("completed", 3300, 0, 75)]


def test_a_rollout_read_in_pieces_translates_as_a_whole():
    for scenario in ("compact", "tasks", "api_error"):
        lines = rollout(scenario).read_bytes().splitlines()
        whole = AutoTranslator("codex")
        expected = [l for raw in lines for l in whole.feed(raw)]
        for cut in range(1, len(lines)):
            first = AutoTranslator("codex")
            got = [l for raw in lines[:cut] for l in first.feed(raw)]
            second = AutoTranslator("codex")
            second.restore(orjson.loads(orjson.dumps(first.state())))  # as the sidecar keeps it
            got += [l for raw in lines[cut:] for l in second.feed(raw)]
            assert got == expected, (scenario, cut)


@needs_fuse
def test_the_rollout_and_the_streams_of_one_run_are_one_story(mounts):
    for store in ("streams_then_rollout", "rollout_then_streams"):
        for scenario in SCENARIOS:
            session = mounts[store] / capture(scenario)["session_id"]
            runs = capture(scenario)["runs"]
            manifest = json.loads((session / "manifest.json").read_bytes())
            assert manifest["turn_count"] == len(runs), (store, scenario)
            events = [e["event"] for e in map(json.loads, (session / "events.jsonl").open())]
            texts = [e["item"]["text"] for e in events
                     if e["type"] == "item.completed" and e["item"]["type"] == "agent_message"]
            answered = sum(1 for r in runs if r["exit_code"] == 0)
            assert len(texts) == len(set(texts)) == answered, (store, scenario, texts)
            assert len(closes(events)) == len(runs), (store, scenario)
        summary = view(mounts[store], "resume_two_turns", "summary.md")
        assert "**Tokens:** 3300 input (0 cached, 0 cache creation), 75 output" in summary, (store, summary)
        # the failed run (no token total to pair by) is one failed turn, whichever came first
        summary = view(mounts[store], "api_error", "summary.md")
        assert "(0 completed, 1 failed, 0 abandoned)" in summary, (store, summary)


@needs_fuse
def test_the_goal_is_the_prompt_when_the_stream_came_first(mounts):
    # `codex exec --json` prints no prompt: the rollout imported after it gives the prompt to
    # index/about.json only (turn_notes, first_prompt), and the views take the goal from there
    for scenario, goal in (("resume_two_turns", "What is the project about?"), ("api_error", "Summarize the README")):
        assert view(mounts["rollouts"], scenario, "progress.json")["goal"] == goal  # the rollout alone says so
        assert view(mounts["streams"], scenario, "progress.json")["goal"] == ""  # the streams alone cannot
        for store in ("streams_then_rollout", "rollout_then_streams"):
            assert f"**Goal:** {goal}\n" in view(mounts[store], scenario, "progress.md"), (store, scenario)
            assert f"**Goal:** {goal}\n" in view(mounts[store], scenario, "context.md"), (store, scenario)


@needs_fuse
def test_a_mounted_sessions_goal_follows_an_import_that_adds_only_the_prompt(tmp_path):
    # the rollout appends nothing to a session its streams filled: the views must still see
    # the prompt it adds to index/about.json, on a mount that already rendered them
    store, sid = tmp_path / "store", capture("resume_two_turns")["session_id"]
    memfs_import(store, *streams("resume_two_turns"))
    m = start(store, tmp_path / "mnt")
    try:
        derived = m.mnt / "sessions" / sid / "derived"
        assert "**Goal:** \n" in (derived / "progress.md").read_text()
        assert json.loads((derived / "progress.json").read_bytes())["goal"] == ""
        log = (store / sid / "events.jsonl").read_bytes()
        memfs_import(store, rollout("resume_two_turns"))
        assert (store / sid / "events.jsonl").read_bytes() == log
        assert "**Goal:** What is the project about?\n" in (derived / "progress.md").read_text()
        assert json.loads((derived / "progress.json").read_bytes())["goal"] == "What is the project about?"
        assert "**Goal:** What is the project about?\n" in (derived / "context.md").read_text()
    finally:
        cleanup(m)


def failed_runs(tmp_path: Path, n: int) -> tuple[Path, list[Path]]:
    """``n`` runs of the conversation that failed alike (api_error's, each a turn of its own):
    the rollout holding them all and each run's ``exec --json`` stream."""
    lines = rollout("api_error").read_bytes().splitlines()
    turn = next(orjson.loads(raw)["payload"]["turn_id"] for raw in lines if b'"task_started"' in raw)
    head, body = lines[:1], lines[1:]
    out = list(head)
    for i in range(n):
        out += [raw.replace(turn.encode(), f"{turn[:-2]}{i:02d}".encode()) for raw in body]
    path = tmp_path / "rollout-failed.jsonl"
    path.write_bytes(b"\n".join(out) + b"\n")
    runs = []
    for i in range(n):
        runs.append(tmp_path / f"stream-{i}.jsonl")
        shutil.copyfile(streams("api_error")[0], runs[-1])
    return path, runs


def test_a_failed_turn_captured_twice_is_stored_once_one_to_one(tmp_path):
    sid = capture("api_error")["session_id"]

    def check(store: Path, turns: int) -> list[dict]:
        manifest = json.loads((store / sid / "manifest.json").read_bytes())
        assert manifest["turn_count"] == turns
        notes = json.loads((store / sid / "index" / "about.json").read_bytes()).get("turn_notes", {})
        return [notes.get(str(n), {}) for n in range(1, turns + 1)]

    roll, runs = failed_runs(tmp_path, 2)
    # the streams first: each rollout turn pairs with one stored stream turn, gives it its prompt
    store = tmp_path / "streams-first"
    memfs_import(store, *runs)
    memfs_import(store, roll)
    notes = check(store, 2)
    assert [n["prompt"] for n in notes] == ["Summarize the README"] * 2
    assert len({n["turn_id"] for n in notes}) == 2
    # another copy of the rollout (archived_sessions/ keeps one): its turns are the noted ones
    copy = tmp_path / "archived" / roll.name
    copy.parent.mkdir()
    shutil.copyfile(roll, copy)
    memfs_import(store, copy)
    check(store, 2)
    # the rollout first, each stream imported on its own: one stored turn each; a third run
    # that failed alike has no stored turn left to pair with, so it is a turn of its own
    store = tmp_path / "rollout-first"
    memfs_import(store, roll)
    for i, run in enumerate(runs):
        memfs_import(store, run)
        assert [bool(n.get("paired")) for n in check(store, 2)] == [True] * (i + 1) + [False] * (1 - i)
    third = tmp_path / "stream-2.jsonl"
    shutil.copyfile(runs[0], third)
    memfs_import(store, third)
    check(store, 3)


# --- a model switch between runs ------------------------------------------------------------------


def rollout_requests(path: Path) -> list[list[tuple[str, int, int, int]]]:
    """Per turn of a rollout, its model requests as ``(model, input, cached, output)``: each
    ``token_count``'s ``last_token_usage``, on the model of the turn's ``turn_context``."""
    turns: list[list[tuple[str, int, int, int]]] = []
    model = None
    for raw in path.read_bytes().splitlines():
        obj = orjson.loads(raw)
        p = obj.get("payload") or {}
        if payload_type(obj) == "task_started":
            turns.append([])
        elif obj["type"] == "turn_context":
            model = p["model"]
        elif payload_type(obj) == "token_count" and (p.get("info") or {}).get("last_token_usage"):
            last = p["info"]["last_token_usage"]
            turns[-1].append((model, last["input_tokens"], last["cached_input_tokens"], last["output_tokens"]))
    return turns


def test_a_model_switch_between_runs_prices_each_turn_on_its_own_model(tmp_path):
    """tests/fixtures/agents/codex/model_switch: `codex exec -m gpt-5.5`, then `codex exec
    resume <id> -m gpt-5.4-mini` (Codex 0.171.0). Each turn's close names the model of its
    requests; usage prices and groups each turn by its own model, whether the rollout came
    alone, before or after the `exec --json` streams (which name no model: the rollout's
    requests, noted for the streams' turns, say it)."""
    from memfs.usage import prices

    sid = capture("model_switch")["session_id"]
    want = rollout_requests(rollout("model_switch"))
    models = [reqs[-1][0] for reqs in want]
    assert len(models) == 2 and models[0] != models[1] and models == capture("model_switch")["models"]

    def usd(reqs):
        total = 0.0
        for model, inp, cached, out in reqs:
            rate = prices.table().lookup(model)
            total += ((inp - cached) * rate.input + cached * rate.cached_input + out * rate.output) / 1e6
        return round(total, 6)

    stores = {"rollout": [rollout("model_switch")], "streams_then_rollout": [*streams("model_switch"), rollout("model_switch")],
              "rollout_then_streams": [rollout("model_switch"), *streams("model_switch")]}
    for name, sources in stores.items():
        store = tmp_path / name
        memfs_import(store, *sources)
        events = [orjson.loads(line)["event"] for line in (store / sid / "events.jsonl").read_bytes().splitlines()]
        if name != "streams_then_rollout":  # the rollout's own closes
            assert [(c["model"], c["agent"]) for c in closes(events)] == [(m, "codex") for m in models], name
            assert [[(r["model"], r["input"], r["output"]) for r in c["requests"]] for c in closes(events)] == [
                [(m, i - c, o) for m, i, c, o in reqs] for reqs in want], name
        doc = json.loads(cli("show", "--store", str(store), sid, "--view", "usage.json"))
        assert [(t["model"], t.get("requests"), t["cost_usd"]) for t in doc["turns"]] == [
            (reqs[-1][0], len(reqs), usd(reqs)) for reqs in want], name
        by_model = json.loads(cli("usage", "--store", str(store), "--by", "model", "--json"))
        assert sorted((r["model"], r["turns"], r["tokens"]["output"], r["cost_usd"]) for r in by_model["rows"]) == sorted(
            (reqs[-1][0], 1, sum(o for *_, o in reqs), usd(reqs)) for reqs in want), name
        (listed,) = json.loads(cli("sessions", "--store", str(store), "--json"))
        assert (listed["model"], listed["models"]) == (models[-1], models), name


def cli(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "memfs", *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout
