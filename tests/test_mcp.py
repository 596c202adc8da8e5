"""``memfs mcp`` (SPEC §13): an MCP client from the official SDK drives every tool over stdio and
streamable HTTP against a ``memfs mcp`` subprocess; bad input is answered by a tool error
(``isError``, one line, the filesystem's reason) while the server keeps serving; the server
shares its store with the CLI and a running mount (SPEC §3.5)."""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from mcp.shared.exceptions import MCPError

from agent_helpers import MEMFS, cli
from mcp_helpers import config_file, http_server, kill, make_store, ok, over_stdio, refused, run, text, token_of
from mounting import event, mounted, needs_fuse
from store_helpers import wait_until


@pytest.fixture
def store(tmp_path) -> Path:
    """A store with a native session ``retry`` and two imported ones (codex, claude)."""
    return make_store(tmp_path / "store")


async def every_tool(client, store: Path) -> None:
    """Each tool, each with a call that works and calls that are refused; after every refusal
    the next call is served."""
    tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == {"search", "list_sessions", "get_context", "read_turn", "get_usage", "append_note"}
    options = set(tools["search"].input_schema["properties"])
    assert options >= {"query", "k", "min_score", "stem", "stopwords", "in", "agent", "project", "status", "since",
                       "until", "session", "distinct"}

    # search: the default, and §5.1 options
    results = ok(await client.call_tool("search", {"query": "retry loop"}))["results"]
    assert results[0]["session_id"] == "retry" and "retry loop" in results[0]["snippet"]
    expected = json.loads(cli("search", "--store", str(store), "retry loop", "--json").stdout)
    assert [r["chunk_id"] for r in results] == [r["chunk_id"] for r in expected]
    assert [r["score"] for r in results] == pytest.approx([r["score"] for r in expected], rel=1e-6)  # (recency moves)
    stemmed = ok(await client.call_tool("search", {"query": "retrying loops", "stem": "english", "k": 1}))["results"]
    assert len(stemmed) == 1 and stemmed[0]["session_id"] == "retry"
    assert ok(await client.call_tool("search", {"query": "retry", "agent": "codex"}))["results"] == []
    assert ok(await client.call_tool("search", {"query": "retry", "session": "retry", "distinct": "session",
                                                "min_score": 0.5}))["results"]
    refused(await client.call_tool("search", {"query": "retry", "stem": "french"}), "stem", "french")
    refused(await client.call_tool("search", {"query": "retry", "since": "yesterday"}), "since", "yesterday")
    refused(await client.call_tool("search", {"query": "retry", "k": 0}), "k")
    refused(await client.call_tool("search", {"query": "retry", "colour": "red"}), "colour", "unknown argument")
    refused(await client.call_tool("search", {"query": "retry", "session": "nope"}), "no session 'nope'")
    refused(await client.call_tool("search", {"query": "???"}), "no search terms")

    # list_sessions and the filters of SPEC §10
    every = ok(await client.call_tool("list_sessions", {}))["sessions"]
    assert {s["agent"] for s in every} >= {"codex", "claude"} and "retry" in {s["name"] for s in every}
    codex = ok(await client.call_tool("list_sessions", {"agent": "codex"}))["sessions"]
    assert [s["agent"] for s in codex] == ["codex"]
    assert [s["agent"] for s in ok(await client.call_tool("list_sessions", {"project": "proj"}))["sessions"]] == \
        ["claude"]
    # since: the sessions' record times (an imported session is as old as its records, SPEC §14)
    assert len(ok(await client.call_tool("list_sessions", {"since": "2000-01-01", "status": "completed"}))["sessions"]) == 3
    assert ok(await client.call_tool("list_sessions", {"since": "2999-01-01"}))["sessions"] == []
    refused(await client.call_tool("list_sessions", {"status": "sleeping"}), "status")
    refused(await client.call_tool("list_sessions", {"since": "soon"}), "since", "soon")

    # get_context: the brief the mount serves as derived/context.md?budget=N
    brief = await client.call_tool("get_context", {"session": "retry", "budget": 300})
    assert not brief.is_error and text(brief).startswith("# Context: session retry")
    assert "Added the retry loop" in text(brief) and len(text(brief).encode()) <= 300 * 4
    shown = cli("show", "--store", str(store), "retry", "--view", "context.md").stdout
    assert text(await client.call_tool("get_context", {"session": "retry"})) == shown
    refused(await client.call_tool("get_context", {"session": "nope"}), "no session 'nope'")
    refused(await client.call_tool("get_context", {"session": "../etc"}), "invalid session name")
    refused(await client.call_tool("get_context", {"session": "retry", "budget": 0}), "budget")
    refused(await client.call_tool("get_context", {"session": "retry", "budget": 10**9}), "budget")

    # read_turn
    turn = ok(await client.call_tool("read_turn", {"session": "retry", "turn": 1}))
    assert [e["event"]["type"] for e in turn["events"]] == ["turn.started", "item.completed", "item.completed",
                                                           "turn.completed"]
    refused(await client.call_tool("read_turn", {"session": "retry", "turn": 7}), "turn 7")
    refused(await client.call_tool("read_turn", {"session": "retry", "turn": -1}), "turn")
    refused(await client.call_tool("read_turn", {"session": "retry", "turn": "first"}), "turn")

    # get_usage (SPEC §12): a session's derived/usage.json, or the store's report
    def timeless(doc: dict) -> dict:  # (since: the instant an age such as 30d resolved to)
        return {key: value for key, value in doc.items() if key not in ("generated_at", "since")}

    usage = ok(await client.call_tool("get_usage", {"session": "retry"}))
    shown = json.loads(cli("show", "--store", str(store), "retry", "--view", "usage.json").stdout)
    assert timeless(usage) == timeless(shown) and "1200" in json.dumps(usage)
    by_agent = ok(await client.call_tool("get_usage", {"by": "agent", "since": "30d"}))
    report = json.loads(cli("usage", "--store", str(store), "--by", "agent", "--since", "30d", "--json").stdout)
    assert timeless(by_agent) == timeless(report) and by_agent["rows"]
    refused(await client.call_tool("get_usage", {"by": "colour"}), "by")
    refused(await client.call_tool("get_usage", {"since": "later"}), "since", "later")
    refused(await client.call_tool("get_usage", {"session": "nope"}), "no session 'nope'")

    # append_note: validated as any line; a refused one is not stored
    note = ok(await client.call_tool("append_note", {"session": "retry", "text": "Remember: the CI runs py3.11"}))
    assert note["appended"] == 1
    log = (store / "retry" / "events.jsonl").read_text()
    assert "Remember: the CI runs py3.11" in log.splitlines()[-1]
    goal = {"type": "goal.created", "goal_id": "g1", "objective": "make fetch() retry"}
    ok(await client.call_tool("append_note", {"session": "retry", "event": goal}))
    assert json.loads(cli("show", "--store", str(store), "retry", "--view", "goal.json").stdout)["objective"] == \
        "make fetch() retry"
    refused(await client.call_tool("append_note", {"session": "nope", "text": "x"}), "no session 'nope'")
    refused(await client.call_tool("append_note", {"session": "retry"}), "text or event")
    refused(await client.call_tool("append_note", {"session": "retry", "event": {"type": "turn.completed"}}),
            "goal.*")
    size = (store / "retry" / "events.jsonl").stat().st_size
    refused(await client.call_tool("append_note", {"session": "retry", "text": "x" * 5000}), "refused", "2048")
    assert (store / "retry" / "events.jsonl").stat().st_size == size
    assert "rejected" not in (store / "retry" / "events.jsonl").read_text()
    assert (store / "retry" / "rejected.jsonl").exists()

    refused(await client.call_tool("no_such_tool", {}), "unknown tool")

    # resources: memfs://sessions/<name>/<file>
    uris = {r.uri for r in (await client.list_resources()).resources}
    assert {"memfs://sessions/retry/events.jsonl", "memfs://sessions/retry/manifest.json",
            "memfs://sessions/retry/derived/context.md"} <= uris
    manifest = (await client.read_resource("memfs://sessions/retry/manifest.json")).contents[0].text
    assert json.loads(manifest)["session_id"] == "retry"
    turn1 = (await client.read_resource("memfs://sessions/retry/derived/turns/1.jsonl")).contents[0].text
    assert turn1.count("\n") == 4
    for bad in ("memfs://sessions/retry/../../etc/passwd", "memfs://sessions/nope/manifest.json",
                "memfs://sessions/retry/derived/nope.json", "memfs://elsewhere/x"):
        with pytest.raises(MCPError):
            await client.read_resource(bad)

    # still serving after every refusal
    assert ok(await client.call_tool("list_sessions", {"agent": "claude"}))["sessions"]


def test_every_tool_over_stdio(store, tmp_path):
    conf = config_file(tmp_path, max_line_bytes=2048, idle_release=0.1)
    over_stdio(tmp_path, lambda c: every_tool(c, store), "--store", str(store), "--config", str(conf),
               "--allow-write")


def test_every_tool_over_streamable_http(store, tmp_path):
    conf = config_file(tmp_path, max_line_bytes=2048, idle_release=0.1)
    with http_server(tmp_path, "--store", str(store), "--config", str(conf), "--allow-write") as server:
        async def main():
            async with server.client(token_of(tmp_path)) as client:
                await every_tool(client, store)

        run(main)


def test_append_note_is_offered_only_with_allow_write(store, tmp_path):
    async def body(client):
        names = {t.name for t in (await client.list_tools()).tools}
        assert "append_note" not in names and "search" in names
        refused(await client.call_tool("append_note", {"session": "retry", "text": "x"}), "unknown tool",
                "append_note")
        assert ok(await client.call_tool("search", {"query": "retry"}))["results"]

    before = (store / "retry" / "events.jsonl").read_bytes()
    over_stdio(tmp_path, body, "--store", str(store))
    assert (store / "retry" / "events.jsonl").read_bytes() == before


def test_the_server_follows_other_writers_and_leaves_them_the_session(store, tmp_path):
    """SPEC §3.5: the server reads while ``memfs append`` writes the same session, and a note it
    appended leaves the session's lock for the next writer."""
    conf = config_file(tmp_path, idle_release=0.1)

    async def body(client):
        assert ok(await client.call_tool("search", {"query": "flaky websocket"}))["results"] == []
        line = {"type": "item.completed", "item": {"id": "m9", "type": "agent_message",
                                                   "text": "The flaky websocket test needs a longer timeout."}}
        proc = subprocess.run([*MEMFS, "append", "--store", str(store), "retry"], input=json.dumps(line) + "\n",
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        deadline = time.monotonic() + 20  # another process's append: found by the sweep (SPEC §14)
        while not (found := ok(await client.call_tool("search", {"query": "flaky websocket"}))["results"]):
            assert time.monotonic() < deadline, "memfs append's fact never found by the search"
            await anyio.sleep(0.02)
        assert found[0]["session_id"] == "retry"
        assert "flaky websocket" in text(await client.call_tool("get_context", {"session": "retry"}))
        ok(await client.call_tool("append_note", {"session": "retry", "text": "noted by the MCP client"}))

        def cli_appends():
            p = subprocess.run([*MEMFS, "append", "--store", str(store), "retry"],
                               input='{"type":"error","message":"after the note"}\n', capture_output=True, text=True)
            # until the server lets the lock go (idle_release), the CLI is refused naming the server
            assert p.returncode == 0 or "is being written by process" in p.stderr, p.stderr
            return p.returncode == 0

        wait_until(cli_appends, "memfs append after the server's note")
        tail = (store / "retry" / "events.jsonl").read_text().splitlines()[-2:]
        assert "noted by the MCP client" in tail[0] and "after the note" in tail[1]

    over_stdio(tmp_path, body, "--store", str(store), "--config", str(conf), "--allow-write")


@needs_fuse
def test_a_session_a_mount_is_writing_is_refused_with_its_holder_and_served_through_the_mount(store, tmp_path):
    conf = config_file(tmp_path, idle_release=120)
    with mounted(store, tmp_path / "mnt", "--config", str(conf)) as m:
        with open(m.mnt / "sessions" / "retry" / "events.jsonl", "a") as f:
            f.write(event("error", message="the mount holds this session now") + "\n")

        async def through_store(client):
            reason = refused(await client.call_tool("append_note", {"session": "retry", "text": "x"}), "being written by process")
            assert str(m.proc.pid) in reason
            # reads never need the lock
            assert "the mount holds" in text(await client.call_tool("get_context", {"session": "retry"}))

        over_stdio(tmp_path, through_store, "--store", str(store), "--allow-write")

        async def through_mount(client):
            results = ok(await client.call_tool("search", {"query": "retry loop", "k": 2}))["results"]
            assert results and results[0]["session_id"] == "retry"
            assert ok(await client.call_tool("search", {"query": "retry", "session": "retry"}))["results"]
            brief = text(await client.call_tool("get_context", {"session": "retry", "budget": 200}))
            assert brief.startswith("# Context: session retry") and len(brief.encode()) <= 800
            turn = ok(await client.call_tool("read_turn", {"session": "retry", "turn": 1}))
            assert turn["events"][0]["event"]["type"] == "turn.started"
            names = {s["name"] for s in ok(await client.call_tool("list_sessions", {}))["sessions"]}
            assert "retry" in names and len(names) == 3
            assert [s["agent"] for s in ok(await client.call_tool("list_sessions", {"agent": "codex"}))["sessions"]] \
                == ["codex"]
            assert "1200" in text(await client.call_tool("get_usage", {"session": "retry"}))
            assert ok(await client.call_tool("get_usage", {"by": "agent"}))["rows"]
            refused(await client.call_tool("get_usage", {"by": "session"}), "--store")
            ok(await client.call_tool("append_note", {"session": "retry", "text": "written through the mount"}))
            refused(await client.call_tool("append_note", {"session": "retry", "event": {"type": "goal.x", "a": []},
                                                           "text": "both"}), "not both")
            refused(await client.call_tool("get_context", {"session": "nope"}), "no session 'nope'")
            refused(await client.call_tool("read_turn", {"session": "retry", "turn": 9}), "turn 9")
            manifest = (await client.read_resource("memfs://sessions/retry/manifest.json")).contents[0].text
            assert json.loads(manifest)["session_id"] == "retry"

        over_stdio(tmp_path, through_mount, "--mount", str(m.mnt), "--allow-write")
        assert "written through the mount" in (m.mnt / "sessions" / "retry" / "events.jsonl").read_text()


def test_without_the_sdk_memfs_mcp_exits_2_with_the_install_hint(store):
    probe = ("import sys; sys.modules['mcp'] = None; from memfs.cli import main; "
             f"sys.exit(main(['mcp', '--store', {str(store)!r}]))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "pip install 'memfs[mcp]'" in proc.stderr


def test_bad_command_lines_are_refused(store, tmp_path):
    proc = cli("mcp", "--store", str(store), "--mount", str(tmp_path))
    assert proc.returncode == 2 and "--mount" in proc.stderr
    proc = cli("mcp", "--mount", str(tmp_path))
    assert proc.returncode == 1 and "not a store-wide memfs mount" in proc.stderr
    proc = cli("mcp", "--store", str(tmp_path / "missing"))
    assert proc.returncode == 1 and "no store" in proc.stderr
    proc = cli("mcp", "--store", str(store), "--http", "99999")
    assert proc.returncode == 2 and "port" in proc.stderr


def test_a_malformed_stdio_line_is_answered_with_a_parse_error_and_serving_goes_on(store, tmp_path):
    """SPEC §13: over stdio, a line that is not JSON, or JSON that is not a JSON-RPC message, is
    answered with JSON-RPC's parse error (-32700, id null); the next request is served."""
    proc = subprocess.Popen([*MEMFS, "mcp", "--store", str(store)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=open(tmp_path / "stdio.log", "wb"))
    try:
        def answer(line: bytes) -> dict:
            proc.stdin.write(line + b"\n")
            proc.stdin.flush()
            ready = wait_until(lambda: select.select([proc.stdout], [], [], 0.1)[0], "an answer on stdout", timeout=60)
            assert ready
            return json.loads(proc.stdout.readline())

        for bad, what in ((b"hello?", "not JSON"), (b'{"jsonrpc": "2.0", "method": 7}', "not a JSON-RPC message"),
                          (b"[1, 2", "not JSON"), (b'"\\u0000"', "not a JSON-RPC message")):
            error = answer(bad)
            assert error["id"] is None and error["error"]["code"] == -32700, error
            assert what in error["error"]["message"]
        init = answer(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}).encode())
        assert init["id"] == 1 and init["result"]["serverInfo"]["name"] == "memfs"
        proc.stdin.write(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
        assert answer(b"\x00\xff garbage")["error"]["code"] == -32700
        called = answer(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                                    "params": {"name": "list_sessions", "arguments": {"agent": "codex"}}}).encode())
        assert called["id"] == 2 and not called["result"].get("isError")
        assert [s["agent"] for s in json.loads(called["result"]["content"][0]["text"])["sessions"]] == ["codex"]
    finally:
        kill(proc.pid)
        proc.wait(10)
