"""The real agent CLIs, offline (docs/agents.md): Claude Code, Codex, Gemini CLI and OpenCode run against
the scripted model server (tests/agents/model_server.py), and the fixtures captured from them
(tests/fixtures/agents/, scripts/capture_fixtures.py) are complete.

The real-CLI tests need `bash scripts/install_agents.sh`; without it they skip, unless
MEMFS_REQUIRE_AGENTS=1, which makes a missing CLI a failure."""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "agents"))
from clis import AGENTS, VERSIONS, installed  # noqa: E402
from model_server import ModelServer  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "agents"
SCENARIOS = {
    "claude": ["ok_failing_command", "api_error", "http_500_then_ok", "mcp_call", "tasks", "subagent",
               "resume_two_turns", "compact", "large_output", "model_switch", "model_command"],
    "codex": ["ok_failing_command", "api_error", "http_500_then_ok", "mcp_call", "tasks", "resume_two_turns",
              "compact", "model_switch"],
    "gemini": ["ok_failing_command", "api_error", "http_500_then_ok", "mcp_call", "tasks", "subagent",
               "resume_two_turns", "compact", "model_switch"],
    "opencode": ["plain", "ok_failing_command", "api_error", "http_500_then_ok", "mcp_call", "tasks", "subagent",
                 "resume_two_turns", "compact", "interrupted"],
}


def need_clis():
    why = installed()
    if why is None:
        return
    if os.environ.get("MEMFS_REQUIRE_AGENTS") == "1":
        pytest.fail(f"MEMFS_REQUIRE_AGENTS=1 but {why}")
    pytest.skip(why)


SHELL = {"claude": {"name": "Bash", "arguments": {"command": "cat CHANGELOG.md", "description": "Show it"}},
         "codex": {"name": "exec_command", "arguments": {"cmd": "cat CHANGELOG.md"}},
         "gemini": {"name": "run_shell_command", "arguments": {"command": "cat CHANGELOG.md", "description": "Show it"}},
         "opencode": {"name": "bash", "arguments": {"command": "cat CHANGELOG.md", "description": "Show it"}}}


@pytest.mark.parametrize("agent", sorted(AGENTS))
def test_the_real_cli_runs_against_the_scripted_server(agent, tmp_path):
    need_clis()
    prompt = f"Show me the changelog ({uuid.uuid4().hex[:12]})"
    script = {"steps": [{"tool": SHELL[agent]}, {"text": "There is no CHANGELOG.md."}],
              "side": getattr(AGENTS[agent], "side", [])}  # OpenCode's title request
    with ModelServer(script, tmp_path / "requests.jsonl") as server:
        cli = AGENTS[agent](tmp_path / "sandbox", server.url)
        run = cli.run(prompt, timeout=90)
        requests = [r for r in server.requests() if r["method"] == "POST"]
    assert run.exit_code == 0, run.stderr.decode(errors="replace")[-3000:]
    assert requests, "the CLI sent no request to the model server"
    assert prompt in json.dumps(requests[0]["body"]), "the prompt is not in the first model request"
    # the command's failure went back to the model, and the answer came out on stdout
    assert "No such file or directory" in json.dumps(requests[-1]["body"])
    assert b"There is no CHANGELOG.md." in run.stdout
    assert [r["answer"] for r in requests if not r["answer"].startswith("side")] == ["step0", "step1"]
    stored = cli.store_files()
    assert stored, f"{agent} wrote nothing in its store under {cli.home}"
    assert prompt in cli.store_text(), "the store does not hold the prompt"


# --- the model server on its own (no CLI needed) ----------------------------------------------

def post(url: str, body: dict, headers: dict | None = None) -> tuple[int, str, bytes]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json",
                                                                  **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read()


def sse_data(raw: bytes) -> list[dict]:
    return [json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: ")]


def test_the_model_server_answers_each_api_in_script_order_and_records_without_credentials(tmp_path):
    script = {"steps": [{"tool": {"name": "Bash", "arguments": {"command": "ls"}}, "usage": {"input": 7, "output": 3}},
                        {"error": {"status": 529, "message": "Overloaded"}},
                        {"text": "from openai"},
                        {"tool": {"name": "run_shell_command", "arguments": {"command": "ls"}}},
                        {"error": {"status": 400, "message": "bad"}}],
              "side": [{"when": {"contains": "side please"}, "text": "side answer"}]}
    with ModelServer(script, tmp_path / "r.jsonl") as srv:
        status, ctype, raw = post(f"{srv.url}/v1/messages?beta=true", {"model": "m", "stream": True, "messages": []},
                                  {"x-api-key": "sk-secret", "Authorization": "Bearer sk-secret"})
        assert (status, ctype) == (200, "text/event-stream")
        events = sse_data(raw)
        assert [e["type"] for e in events][0] == "message_start" and events[-1]["type"] == "message_stop"
        start = next(e for e in events if e["type"] == "content_block_start")
        assert start["content_block"]["name"] == "Bash"
        delta = next(e for e in events if e["type"] == "content_block_delta")
        assert json.loads(delta["delta"]["partial_json"]) == {"command": "ls"}
        assert next(e for e in events if e["type"] == "message_delta")["usage"]["output_tokens"] == 3

        status, _, raw = post(f"{srv.url}/v1/messages?beta=true", {"model": "m", "messages": []})
        assert status == 529 and json.loads(raw)["error"]["type"] == "overloaded_error"

        status, _, raw = post(f"{srv.url}/v1/responses", {"model": "g", "stream": True, "input": "side please"})
        assert status == 200 and sse_data(raw)[-1]["response"]["output"][0]["content"][0]["text"] == "side answer"
        status, _, raw = post(f"{srv.url}/v1/responses", {"model": "g", "stream": True, "input": []})
        done = sse_data(raw)[-1]
        assert done["type"] == "response.completed" and done["response"]["output"][0]["content"][0]["text"] == "from openai"

        status, _, raw = post(f"{srv.url}/v1beta/models/gemini-x:streamGenerateContent?alt=sse&key=sk-secret",
                              {"contents": []})
        part = sse_data(raw)[0]["candidates"][0]["content"]["parts"][0]
        assert part == {"functionCall": {"name": "run_shell_command", "args": {"command": "ls"}}}
        status, _, raw = post(f"{srv.url}/v1beta/models/gemini-x:generateContent", {"contents": []},
                              {"x-goog-api-key": "sk-secret"})
        assert status == 400 and json.loads(raw)["error"]["status"] == "INVALID_ARGUMENT"
        status, _, raw = post(f"{srv.url}/v1beta/models/gemini-x:generateContent", {"contents": []})
        assert status == 200 and b"Done." in raw  # the steps are used up: the "after" answer
        recorded = srv.requests()
    assert [r["answer"] for r in recorded] == ["step0", "step1", "side0", "step2", "step3", "step4", "after"]
    assert "sk-secret" not in (tmp_path / "r.jsonl").read_text()
    assert recorded[4]["path"] == "/v1beta/models/gemini-x:streamGenerateContent?alt=sse"


def test_the_model_server_answers_chat_completions_streamed_with_tool_calls_and_usage_last(tmp_path):
    script = {"steps": [{"text": "Running it.", "tool": {"name": "bash", "arguments": {"command": "ls"}},
                         "usage": {"input": 11, "output": 4, "cached": 2}},
                        {"text": "plain"}, {"error": {"status": 400, "message": "bad model"}}]}
    with ModelServer(script, tmp_path / "r.jsonl") as srv:
        url = f"{srv.url}/v1/chat/completions"
        status, ctype, raw = post(url, {"model": "m", "stream": True, "messages": []})
        assert (status, ctype) == (200, "text/event-stream") and raw.endswith(b"data: [DONE]\n\n")
        chunks = [json.loads(line[6:]) for line in raw.decode().splitlines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
        assert all(c["object"] == "chat.completion.chunk" for c in chunks)
        deltas = [c["choices"][0]["delta"] for c in chunks]
        assert "".join(d.get("content") or "" for d in deltas) == "Running it."
        (call,) = [tc for d in deltas for tc in d.get("tool_calls", [])]
        assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == ("bash", {"command": "ls"})
        assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
        assert chunks[-1]["usage"] == {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15,
                                       "prompt_tokens_details": {"cached_tokens": 2},
                                       "completion_tokens_details": {"reasoning_tokens": 0}}
        status, ctype, raw = post(url, {"model": "m", "messages": []})  # not streamed: one completion
        doc = json.loads(raw)
        assert (status, doc["object"], doc["choices"][0]["message"]["content"]) == (200, "chat.completion", "plain")
        status, _, raw = post(url, {"model": "m", "stream": True, "messages": []})
        assert status == 400 and json.loads(raw)["error"]["message"] == "bad model"


def test_the_model_server_context_manager_stops_its_process(tmp_path):
    with ModelServer({"steps": []}, tmp_path / "r.jsonl") as srv:
        pid = srv.proc.pid
        assert post(f"{srv.url}/v1/messages", {"messages": []})[0] == 200
    assert srv.proc.poll() is not None, f"model server {pid} still running"


# --- the captured fixtures (no CLI needed) ----------------------------------------------------

def scenario_dirs():
    return [(a, s) for a, names in SCENARIOS.items() for s in names]


@pytest.mark.parametrize("agent,scenario", scenario_dirs())
def test_each_fixture_has_its_capture_json_and_the_files_it_lists(agent, scenario):
    d = FIXTURES / agent / scenario
    doc = json.loads((d / "capture.json").read_text())
    assert (doc["agent"], doc["scenario"], doc["version"]) == (agent, scenario, VERSIONS[agent])
    assert VERSIONS[agent] in doc["version_output"]
    on_disk = sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file())
    assert on_disk == sorted(doc["files"]), "capture.json's file list differs from the directory"
    assert set(doc["store_files"]) <= set(doc["files"]) and doc["store_files"], "no file from the CLI's own store"
    for run in doc["runs"]:
        assert run["stdout"] in doc["files"] and (run["stderr"] is None or run["stderr"] in doc["files"])
        lines = (d / run["stdout"]).read_text().splitlines()
        assert lines and all(json.loads(line) is not None for line in lines), f"{run['stdout']} is not JSONL"
    for f in doc["files"]:
        assert (d / f).stat().st_size < 512 * 1024, f"{f} is too big for a fixture"
    # the only keys in the recorded environments are the scripted server's dummies
    for run in doc["runs"]:
        assert all(v == "dummy" for k, v in run["env"].items() if k.endswith("_API_KEY"))


EVIDENCE = {  # (agent, scenario): (a file glob, a string that shows the scenario happened)
    ("claude", "ok_failing_command"): ("stream.jsonl", '"is_error":true'),
    ("claude", "api_error"): ("stream.jsonl", '"terminal_reason":"api_error"'),
    ("claude", "http_500_then_ok"): ("stream.jsonl", '"subtype":"api_retry"'),
    ("claude", "mcp_call"): ("stream.jsonl", '"name":"mcp__notes__lookup"'),
    ("claude", "tasks"): ("home/.claude/tasks/*/2.json", '"status": "completed"'),
    ("claude", "subagent"): ("home/.claude/projects/*/*/subagents/agent-*.meta.json", "general-purpose"),
    ("claude", "resume_two_turns"): ("stream.2.jsonl", "It is a tiny demo project."),
    ("claude", "compact"): ("home/.claude/projects/*/*.jsonl", '"isCompactSummary":true'),
    ("claude", "large_output"): ("home/.claude/projects/*/*/tool-results/*.txt", "8000"),
    ("claude", "model_switch"): ("stream.2.jsonl", '"model":"claude-haiku-4-5"'),
    ("claude", "model_command"): ("home/.claude/projects/*/*.jsonl", "Set model to `Haiku 4.5` for this session only"),
    ("codex", "ok_failing_command"): ("stream.jsonl", '"exit_code":1'),
    ("codex", "api_error"): ("stream.jsonl", '"type":"turn.failed"'),
    ("codex", "http_500_then_ok"): ("stream.jsonl", "The README describes a tiny demo project."),
    ("codex", "mcp_call"): ("stream.jsonl", '"type":"mcp_tool_call"'),
    ("codex", "tasks"): ("stream.jsonl", '"type":"todo_list"'),
    ("codex", "resume_two_turns"): ("stream.2.jsonl", "It is a tiny demo project."),
    ("codex", "compact"): ("home/.codex/sessions/*/*/*/rollout-*.jsonl", '"type":"compacted"'),
    ("codex", "model_switch"): ("home/.codex/sessions/*/*/*/rollout-*.jsonl", '"model":"gpt-5.4-mini"'),
    ("gemini", "ok_failing_command"): ("home/.gemini/tmp/*/chats/session-*.jsonl", "Exit Code: 1"),
    ("gemini", "api_error"): ("stream.jsonl", '"status":"error"'),
    ("gemini", "http_500_then_ok"): ("stream.jsonl", "The README describes a tiny demo project."),
    ("gemini", "mcp_call"): ("stream.jsonl", '"tool_name":"mcp_notes_lookup"'),
    ("gemini", "tasks"): ("stream.jsonl", '"tool_name":"write_todos"'),
    ("gemini", "subagent"): ("home/.gemini/tmp/*/chats/*/*.jsonl", '"kind":"subagent"'),
    ("gemini", "resume_two_turns"): ("stream.2.jsonl", "It is a tiny demo project."),
    ("gemini", "compact"): ("home/.gemini/tmp/*/chats/session-*.jsonl", "<state_snapshot>"),
    ("opencode", "plain"): ("stream.jsonl", "Hello! How can I help"),
    ("opencode", "ok_failing_command"): ("stream.jsonl", '"exit":1'),
    ("opencode", "api_error"): ("stream.jsonl", '"statusCode":400'),
    ("opencode", "http_500_then_ok"): ("requests.jsonl", '"status": 500'),
    ("opencode", "mcp_call"): ("stream.jsonl", '"tool":"notes_lookup"'),
    ("opencode", "tasks"): ("stream.jsonl", '"tool":"todowrite"'),
    ("opencode", "subagent"): ("stream.jsonl", '"subagent_type":"general"'),
    ("opencode", "resume_two_turns"): ("stream.2.jsonl", "It is a tiny demo project."),
    ("opencode", "compact"): ("stream.1.jsonl", '"compaction_continue":true'),
    ("opencode", "interrupted"): ("requests.jsonl", '"status": 0'),  # the request it was interrupted in
    ("gemini", "model_switch"): ("home/.gemini/tmp/*/chats/session-*.jsonl", '"model":"gemini-2.5-flash"'),
}


@pytest.mark.parametrize("agent,scenario", scenario_dirs())
def test_each_fixture_shows_its_scenario(agent, scenario):
    pattern, needle = EVIDENCE[(agent, scenario)]
    files = sorted((FIXTURES / agent / scenario).glob(pattern))
    assert files, f"no {pattern} in {agent}/{scenario}"
    assert any(needle in f.read_text() for f in files), f"{needle!r} not in {agent}/{scenario}/{pattern}"
