"""Ingest (SPEC §8): the translators (pure), and ``memfs record`` / ``import`` / ``append``
run as a user runs them, in subprocesses, against a store checked through the library."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import memfs
import orjson
import pytest
from memfs.events import parse_line
from memfs.ingest import AutoTranslator, Untranslatable
from memfs.ingest.importer import SOURCES

from agent_helpers import MEMFS
from store_helpers import wait_until as wait_for

FIXTURES = Path(__file__).parent / "fixtures"
AGENT = Path(__file__).parent / "agents" / "replay.py"
CLAUDE_SID = "8f3c2d1e-6a7b-4c9d-9e0f-1a2b3c4d5e6f"
TRANSCRIPT_SID = "3b7e1f2a-9c8d-4e6f-a1b2-c3d4e5f60718"
ROLLOUT_SID = "0199a3c1-2f4e-7c52-b1de-5e0f5a3c9d10"
EXEC_SID = "0199a213-81c0-7800-8aa1-bbab2a035a53"


def translate(name: str, fmt: str = "auto") -> list[dict]:
    t = AutoTranslator(fmt)
    out = []
    for raw in (FIXTURES / name).read_bytes().splitlines():
        out.extend(orjson.loads(line) for line in t.feed(raw))
    return out


def events_of(root: Path, session: str) -> list[dict]:
    with memfs.open_session(root, session, read_only=True) as h:
        return [orjson.loads(line)["event"] for _, line in h.iter_lines()]


def manifest_of(root: Path, session: str) -> dict:
    with memfs.open_session(root, session, read_only=True) as h:
        return h.manifest


def rejected_of(root: Path, session: str) -> list[dict]:
    path = root / memfs.sanitize(session) / "rejected.jsonl"
    return [orjson.loads(l) for l in path.read_bytes().splitlines()] if path.exists() else []


def cli(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*MEMFS, *args], capture_output=True, timeout=60, **kw)


def items(events: list[dict], etype: str = "item.completed") -> dict[str, list[dict]]:
    by: dict[str, list[dict]] = {}
    for e in events:
        if e["type"] == etype:
            by.setdefault(e["item"]["type"], []).append(e["item"])
    return by


# --- translators (pure) -------------------------------------------------------------------


def test_every_translated_line_is_valid():
    for name in ("claude_stream.jsonl", "claude_transcript.jsonl", "codex_rollout.jsonl"):
        t = AutoTranslator("auto")
        for raw in (FIXTURES / name).read_bytes().splitlines():
            for line in t.feed(raw):
                parse_line(line)  # raises on a refusal


def test_claude_stream_json_maps_per_the_spec_table():
    ev = translate("claude_stream.jsonl")
    assert [e["type"] for e in ev][:2] == ["thread.started", "turn.started"]
    assert ev[0] == {"type": "thread.started", "thread_id": CLAUDE_SID, "agent": "claude"}
    done = items(ev)
    assert done["reasoning"][0]["text"].startswith("The user wants retries")
    assert done["command_execution"][0] == {"id": "toolu_01Bash", "type": "command_execution",
                                            "command": "rg -n retry src", "status": "completed", "exit_code": 0,
                                            "aggregated_output": "src/net.py:12:def fetch(url):"}
    assert items(ev, "item.started")["command_execution"][0]["status"] == "in_progress"
    assert done["todo_list"][0]["items"] == [{"text": "Add a retry loop to fetch", "completed": False},
                                             {"text": "Test the retry loop", "completed": False}]
    assert done["file_change"][0]["changes"] == [{  # with its diff (issue 53)
        "path": "/home/dev/proj/src/net.py", "kind": "update",
        "diff": "--- /home/dev/proj/src/net.py\n+++ /home/dev/proj/src/net.py\n@@ -1 +1 @@\n"
                "-def fetch(url):\n\\ No newline at end of file\n+def fetch(url, retries=3):\n"
                "\\ No newline at end of file\n"}]
    mcp = done["mcp_tool_call"][0]
    assert (mcp["server"], mcp["tool"], mcp["arguments"], mcp["error"]) == ("docs", "search", {"q": "backoff"}, None)
    assert mcp["result"]["content"] == [{"type": "text", "text": "Use exponential backoff."}]
    grep = done["tool_invocation"][0]  # a call and its result: one item (SPEC §10 identity)
    assert (grep["id"], grep["tool_name"], grep["status"], grep["output"]) == (
        "toolu_01Grep", "Grep", "failed", "No matches found")
    assert "tool_output" not in done
    assert done["agent_message"][0]["text"] == "Added the retry loop with exponential backoff."
    end, thread = ev[-2], ev[-1]
    sonnet = "claude-sonnet-4-5-20250929"
    assert end == {"type": "turn.completed", "usage": {"input_tokens": 34, "cached_input_tokens": 84720,
                                                       "cache_creation_tokens": 3710, "output_tokens": 397},
                   "agent": "claude", "model": sonnet, "requests": [  # (each API message once; they add up to usage)
                       {"model": sonnet, "input": 4, "cached_input": 11250, "cache_creation": 3120, "output": 7},
                       {"model": sonnet, "input": 6, "cached_input": 14370, "cache_creation": 210, "output": 120},
                       {"model": sonnet, "input": 6, "cached_input": 14580, "cache_creation": 180, "output": 140},
                       {"model": sonnet, "input": 6, "cached_input": 14760, "cache_creation": 90, "output": 40},
                       {"model": sonnet, "input": 6, "cached_input": 14850, "cache_creation": 60, "output": 30},
                       {"model": sonnet, "input": 6, "cached_input": 14910, "cache_creation": 50, "output": 60}]}
    assert thread["type"] == "thread.completed" and thread["subtype"] == "success"
    assert (thread["num_turns"], thread["total_cost_usd"], thread["session_id"]) == (7, 0.0412, CLAUDE_SID)


def test_claude_result_with_is_error_fails_the_turn():
    t = AutoTranslator("claude")
    t.feed(b'{"type":"system","subtype":"init","session_id":"s1"}')
    t.feed(b'{"type":"assistant","message":{"id":"m","content":[{"type":"text","text":"hi"}]},"session_id":"s1"}')
    out = [orjson.loads(l) for l in t.feed(orjson.dumps({
        "type": "result", "subtype": "error_max_turns", "is_error": True, "num_turns": 3, "session_id": "s1",
        "usage": {"input_tokens": 5, "output_tokens": 1}}))]
    assert out[0] == {"type": "turn.failed", "message": "error_max_turns",
                      "usage": {"input_tokens": 5, "output_tokens": 1}, "agent": "claude"}
    assert out[1]["subtype"] == "error_max_turns" and out[1]["outcome_code"] == "error"


def test_claude_transcript_turns_usage_once_per_message_and_interruption():
    ev = translate("claude_transcript.jsonl")
    kinds = [e["type"] for e in ev]
    assert kinds.count("turn.started") == 2
    prompts = [e["context"]["prompt"] for e in ev if e["type"] == "turn.started"]
    assert prompts == ["Add a retry loop to fetch()", "Now use it in fetch"]
    first_end = next(e for e in ev if e["type"] == "turn.completed")
    # msg_T1 appears on two lines (one per content block) and counts once
    assert first_end["usage"] == {"input_tokens": 16, "cached_input_tokens": 34300,
                                  "cache_creation_tokens": 2400, "output_tokens": 113}
    assert items(ev)["file_change"][0]["changes"] == [{"path": "/home/dev/proj/src/retry.py", "kind": "add",
                                                       "content": "def retry(f, n=3): ..."}]  # (issue 53)
    assert items(ev)["command_execution"][0]["status"] == "failed"
    assert ev[-1]["type"] == "turn.failed" and ev[-1]["message"] == "interrupted by user"
    assert ev[1]["context"] == {"origin": "user", "turn_id": "5d0e9a8b-0000-4000-8000-000000000001",
                                "prompt": "Add a retry loop to fetch()", "timestamp": "2025-09-20T10:00:00.000Z"}


def test_codex_rollout_keeps_each_fact_once():
    ev = translate("codex_rollout.jsonl")
    assert ev[0] == {"type": "thread.started", "thread_id": ROLLOUT_SID, "agent": "codex"}
    done = items(ev)
    # agent_message and reasoning come both as event_msg and response_item: once each
    assert [i["text"] for i in done["agent_message"]] == ["Added the retry loop with exponential backoff."]
    assert len(done["reasoning"]) == 1
    # the patch comes as custom_tool_call(+output) and patch_apply_end: once
    assert done["file_change"] == [{"id": "call_B2", "type": "file_change",
                                    "changes": [{"path": "src/net.py", "kind": "update",  # with its diff (issue 53)
                                                 "diff": "--- a/src/net.py\n+++ b/src/net.py\n@@\n"
                                                         "-def fetch(url):\n+def fetch(url, retries=3):\n"}],
                                    "status": "completed"}]
    assert done["command_execution"][0]["command"] == "rg -n retry src"
    assert done["command_execution"][0]["exit_code"] == 0
    assert done["todo_list"][0]["items"][0] == {"text": "Add a retry loop to fetch", "completed": False}
    prompts = [e["context"]["prompt"] for e in ev if e["type"] == "turn.started"]  # the prompt is the turn's
    assert prompts == ["Add a retry loop to fetch()", "Now push it"]
    closes = [e for e in ev if e["type"] in ("turn.completed", "turn.failed")]
    assert closes[0]["usage"] == {"input_tokens": 24763, "cached_input_tokens": 24448, "output_tokens": 122,
                                   "reasoning_output_tokens": 64}  # (part of output: SPEC §12 reports it)
    assert closes[1]["type"] == "turn.failed" and closes[1]["message"] == "interrupted"
    assert [e["type"] for e in ev].count("turn.started") == 2


def test_codex_exec_lines_pass_through_byte_for_byte():
    t = AutoTranslator("codex")
    for raw in (FIXTURES / "codex_exec.jsonl").read_bytes().splitlines():
        assert t.feed(raw) == [raw]


def test_translator_state_round_trips_mid_stream():
    lines = (FIXTURES / "claude_stream.jsonl").read_bytes().splitlines()
    whole = AutoTranslator("auto")
    expected = [l for raw in lines for l in whole.feed(raw)]
    first = AutoTranslator("auto")
    got = [l for raw in lines[:3] for l in first.feed(raw)]
    state = orjson.loads(orjson.dumps(first.state()))  # survives JSON, as in the sidecar
    second = AutoTranslator("auto")
    second.restore(state)
    got += [l for raw in lines[3:] for l in second.feed(raw)]
    assert got == expected


def test_a_format_mismatch_and_garbage_are_refused_with_a_reason():
    t = AutoTranslator("claude")
    with pytest.raises(Untranslatable, match="another format"):
        t.feed((FIXTURES / "codex_rollout.jsonl").read_bytes().splitlines()[0])
    t = AutoTranslator("auto")
    t.feed(b'{"type":"system","subtype":"init","session_id":"s"}')
    with pytest.raises(Untranslatable, match="not valid JSON"):
        t.feed(b"Error: rate limited, retrying")


# --- memfs record ---------------------------------------------------------------------------


def record(store: Path, session: str, stream: str, *agent_args: str, fmt: str = "auto"):
    return subprocess.run([*MEMFS, "record", "--store", str(store), session, "--format", fmt, "--",
                           sys.executable, str(AGENT), str(FIXTURES / stream), *agent_args],
                          capture_output=True, timeout=60)


def test_record_claude_stream_passes_stdout_through_and_translates(tmp_path):
    store = tmp_path / "store"
    proc = record(store, "claude-run", "claude_stream.jsonl", "--status", "3", "--stderr", "warming up\n")
    assert proc.stdout == (FIXTURES / "claude_stream.jsonl").read_bytes()  # byte for byte
    assert proc.stderr.startswith(b"warming up\n")  # the agent's stderr, untouched
    assert proc.returncode == 3
    assert events_of(store, "claude-run") == translate("claude_stream.jsonl")
    m = manifest_of(store, "claude-run")
    assert (m["status"], m["in_turn"], m["turn_count"]) == ("completed", False, 1)


def test_record_codex_stream_refused_lines_go_to_rejected_and_the_rest_is_kept(tmp_path):
    store = tmp_path / "store"
    proc = record(store, "codex-run", "codex_exec.jsonl", fmt="codex")
    assert proc.returncode == 0
    source = (FIXTURES / "codex_exec.jsonl").read_bytes()
    assert proc.stdout == source
    accepted, refused = [], []
    for raw in source.splitlines():  # whatever the contract refuses is in rejected.jsonl, in order
        try:
            parse_line(raw)
            accepted.append(orjson.loads(raw))
        except memfs.ValidationError:
            refused.append(raw.decode())
    lifecycle = [e["type"] for e in accepted if e["type"].startswith("turn.")]
    if lifecycle[-1] == "turn.started":  # the stream's own close was refused: record closes the turn
        accepted.append({"type": "turn.failed", "message": "agent exited with status 0 before the turn ended"})
    assert events_of(store, "codex-run") == accepted
    assert [r["line"] for r in rejected_of(store, "codex-run")] == refused


def test_record_an_agent_killed_mid_turn(tmp_path):
    store = tmp_path / "store"
    proc = record(store, "crash", "claude_stream.jsonl", "--crash-after", "6")
    lines = (FIXTURES / "claude_stream.jsonl").read_bytes().splitlines(keepends=True)
    assert proc.returncode == 128 + signal.SIGKILL
    assert proc.stdout == b"".join(lines[:6])
    assert b"closed the open turn as failed" in proc.stderr
    ev = events_of(store, "crash")
    t = AutoTranslator("auto")
    assert ev[:-1] == [orjson.loads(l) for raw in lines[:6] for l in t.feed(raw.rstrip(b"\n"))]
    assert ev[-1] == {"type": "turn.failed", "message": "agent killed by SIGKILL before the turn ended"}
    m = manifest_of(store, "crash")
    assert (m["in_turn"], m["turn_count"]) == (False, 1)
    with memfs.open_session(store, "crash", read_only=True) as h:
        assert h.turn_index[0]["outcome"] == "failed"


def test_record_a_busy_session_does_not_run_the_agent(tmp_path):
    store = tmp_path / "store"
    marker = tmp_path / "ran"
    with memfs.open_session(store, "busy", durability="write") as h:
        h.append(b'{"type":"turn.started"}')  # this process now holds the session
        proc = cli("record", "--store", str(store), "busy", "--", sys.executable, "-c",
                   f"open({str(marker)!r}, 'w')")
    assert proc.returncode == 1 and b"memfs:" in proc.stderr and len(proc.stderr.splitlines()) == 1
    assert not marker.exists()


# --- memfs import ---------------------------------------------------------------------------


def test_import_each_format_once_and_again_adds_nothing(tmp_path):
    store = tmp_path / "store"
    proc = cli("import", "--store", str(store), str(FIXTURES))
    assert proc.returncode == 3 and b"0 files skipped" in proc.stderr, proc.stderr  # 3: lines were refused
    expected = {CLAUDE_SID: translate("claude_stream.jsonl"), TRANSCRIPT_SID: translate("claude_transcript.jsonl"),
                ROLLOUT_SID: translate("codex_rollout.jsonl")}
    for sid, events in expected.items():
        assert events_of(store, sid) == events
    assert manifest_of(store, EXEC_SID)["event_count"] + len(rejected_of(store, EXEC_SID)) == 26
    before = {p: p.read_bytes() for p in store.rglob("events.jsonl")}
    again = cli("import", "--store", str(store), "--json", str(FIXTURES))
    assert again.returncode == 0
    assert {i["status"] for i in orjson.loads(again.stdout)} == {"up-to-date"}
    assert {p: p.read_bytes() for p in store.rglob("events.jsonl")} == before
    sidecar = orjson.loads((store / ROLLOUT_SID / SOURCES).read_bytes())["sources"]
    (entry,) = sidecar.values()
    assert entry["lines"] == 23 and entry["offset"] == (FIXTURES / "codex_rollout.jsonl").stat().st_size


def test_import_dry_run_changes_nothing(tmp_path):
    store = tmp_path / "store"
    proc = cli("import", "--store", str(store), "--dry-run", str(FIXTURES / "claude_stream.jsonl"))
    assert proc.returncode == 0 and b"would import" in proc.stdout and b"14 events" in proc.stdout
    assert not store.exists() or not any(store.iterdir())


def test_import_appends_only_new_lines_and_waits_for_a_partial_line(tmp_path):
    store, src = tmp_path / "store", tmp_path / "rollout-x.jsonl"
    lines = (FIXTURES / "codex_rollout.jsonl").read_bytes().splitlines(keepends=True)
    src.write_bytes(b"".join(lines[:10]) + lines[10][:25])  # a torn last line
    assert cli("import", "--store", str(store), str(src)).returncode == 0
    with src.open("ab") as f:
        f.write(lines[10][25:] + b"".join(lines[11:]))
    assert cli("import", "--store", str(store), str(src)).returncode == 0
    assert events_of(store, ROLLOUT_SID) == translate("codex_rollout.jsonl")


def test_import_leaves_a_rewritten_source_alone(tmp_path):
    store, src = tmp_path / "store", tmp_path / "t.jsonl"
    data = (FIXTURES / "claude_transcript.jsonl").read_bytes()
    src.write_bytes(data)
    assert cli("import", "--store", str(store), str(src)).returncode == 0
    before = (store / TRANSCRIPT_SID / "events.jsonl").read_bytes()
    src.write_bytes(data.replace(b"Add a retry loop", b"Add a RETRY loop"))
    proc = cli("import", "--store", str(store), str(src))
    assert proc.returncode == 1 and b"changed" in proc.stdout
    assert (store / TRANSCRIPT_SID / "events.jsonl").read_bytes() == before


def test_import_hostile_lines_cost_their_session_only(tmp_path):
    store, bad, good = tmp_path / "store", tmp_path / "bad.jsonl", tmp_path / "good.jsonl"
    lines = (FIXTURES / "claude_stream.jsonl").read_bytes().splitlines(keepends=True)
    bad.write_bytes(lines[0] + b"\xff\xfe not json\n" + b"[1,2]\n" + b"".join(lines[1:]))
    good.write_bytes((FIXTURES / "claude_transcript.jsonl").read_bytes())
    proc = cli("import", "--store", str(store), str(bad), str(good))
    assert proc.returncode == 3 and b"2 lines refused" in proc.stderr  # (the import's status for refused lines)
    assert events_of(store, CLAUDE_SID) == translate("claude_stream.jsonl")
    reasons = [r["reason"] for r in rejected_of(store, CLAUDE_SID)]
    assert len(reasons) == 2 and reasons[0].startswith("claude: line is not valid JSON")
    assert reasons[1] == "claude: line is not a JSON object"
    assert "line_b64" in rejected_of(store, CLAUDE_SID)[0]
    assert events_of(store, TRANSCRIPT_SID) == translate("claude_transcript.jsonl")


def event_count(store: Path, sid: str) -> int:
    try:
        return manifest_of(store, sid)["event_count"]
    except FileNotFoundError:
        return 0


def stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(20)


def test_follow_appends_as_tools_write_survives_restart_without_loss_or_duplicates(tmp_path, follower):
    store, watched = tmp_path / "store", tmp_path / "codex" / "sessions"
    watched.mkdir(parents=True)
    lines = (FIXTURES / "codex_rollout.jsonl").read_bytes().splitlines(keepends=True)
    full = translate("codex_rollout.jsonl")
    proc = follower(store, watched)
    day = watched / "2025" / "10" / "02"  # a directory made once the follow runs (or before: either works)
    day.mkdir(parents=True)
    src = day / f"rollout-2025-10-02T09-14-03-{ROLLOUT_SID}.jsonl"
    with src.open("ab") as f:
        f.write(b"".join(lines[:8]) + lines[8][:30])  # and a partial line
        f.flush()
        first = len(translate_prefix(lines[:8]))
        wait_for(lambda: event_count(store, ROLLOUT_SID) == first, what="first lines")
        assert events_of(store, ROLLOUT_SID) == full[:first]
        assert stop(proc) == 0
        f.write(lines[8][30:] + b"".join(lines[9:16]))  # written while nobody follows
        f.flush()
        proc = follower(store, watched)
        expected = len(translate_prefix(lines[:16]))
        wait_for(lambda: event_count(store, ROLLOUT_SID) == expected, what="lines written while stopped")
        f.write(b"".join(lines[16:]))
        f.flush()
        wait_for(lambda: event_count(store, ROLLOUT_SID) == len(full), what="the rest")
    assert stop(proc) == 0
    assert events_of(store, ROLLOUT_SID) == full  # nothing lost, nothing twice


def translate_prefix(lines: list[bytes]) -> list[bytes]:
    t = AutoTranslator("auto")
    return [l for raw in lines for l in t.feed(raw.rstrip(b"\n"))]


# --- memfs append ---------------------------------------------------------------------------


def test_append_keep_going_records_bad_lines_and_continues(tmp_path):
    store, src = tmp_path / "store", tmp_path / "in.jsonl"
    src.write_bytes(b'{"type":"turn.started"}\nnot json\n{"type":"turn.completed"}\n'
                    b'{"type":"turn.completed","usage":{}}\n')
    proc = cli("append", "--store", str(store), "--keep-going", "s", str(src))
    assert proc.returncode == 1
    assert b"appended 2 lines to s; refused 2" in proc.stdout
    assert proc.stderr.count(b"refused") == 2 and b"line 2:" in proc.stderr and b"line 3:" in proc.stderr
    assert manifest_of(store, "s")["turn_count"] == 1
    assert len(rejected_of(store, "s")) == 2


def test_append_says_how_many_went_in_and_where_to_go_on(tmp_path):
    store, src = tmp_path / "store", tmp_path / "in.jsonl"
    src.write_bytes(b'{"type":"turn.started"}\n{"type":"turn.completed"}\n{"type":"turn.started"}\n')
    proc = cli("append", "--store", str(store), "s", str(src))
    assert proc.returncode == 1
    assert b"line 2:" in proc.stderr and b"1 line before it appended" in proc.stderr
    assert f"tail -n +3 {src}".encode() in proc.stderr
    assert manifest_of(store, "s")["event_count"] == 1
