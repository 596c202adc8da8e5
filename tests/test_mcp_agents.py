"""The real Claude Code and Codex CLIs (pinned, offline, against the scripted model server)
configured with ``memfs mcp`` as an MCP server (SPEC §13): when the scripted model asks for
``search`` and ``get_context``, the CLI calls them and sends their results back to the model
in its next request — which is where these tests look.

They need `bash scripts/install_agents.sh`; without it they skip, unless MEMFS_REQUIRE_AGENTS=1,
which makes a missing CLI a failure (tests/test_agents_cli.py's rule)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from agent_helpers import MEMFS
from mcp_helpers import http_server, the_setup

sys.path.insert(0, str(Path(__file__).parent / "agents"))
from clis import BIN, Claude, Codex  # noqa: E402
from model_server import ModelServer  # noqa: E402

from test_agents_cli import need_clis  # noqa: E402

NOTE = "Added the retry loop to fetch() with exponential backoff."
SEARCH = {"query": "retry loop backoff", "k": 3}
CONTEXT = {"session": "retry", "budget": 400}


def memfs_mcp(store: Path) -> list[str]:
    return [sys.executable, "-m", "memfs", "mcp", "--store", str(store)]


class ClaudeWithMemfs(Claude):
    """Claude Code with ``memfs mcp`` as its only MCP server (``--mcp-config``)."""

    store: Path

    def argv(self, prompt, resume=None):
        cmd = memfs_mcp(self.store)
        config = {"mcpServers": {"memfs": {"command": cmd[0], "args": cmd[1:]}}}
        return super().argv(prompt, resume) + ["--mcp-config", json.dumps(config), "--strict-mcp-config"]


class CodexWithMemfs(Codex):
    """Codex with ``memfs mcp`` under ``[mcp_servers.memfs]`` in its ``config.toml``."""

    store: Path

    def setup(self):
        super().setup()
        cmd = memfs_mcp(self.store)
        with open(self.home / ".codex" / "config.toml", "a") as f:
            f.write(f"\n[mcp_servers.memfs]\ncommand = {json.dumps(cmd[0])}\nargs = {json.dumps(cmd[1:])}\n"
                    # required: Codex waits for the server before the first request (else a server still
                    # starting, as a loaded machine makes it, has no tools to find yet)
                    "startup_timeout_sec = 60\nrequired = true\n")


@pytest.fixture
def store(tmp_path) -> Path:
    root = tmp_path / "store"
    lines = [{"type": "turn.started"},
             {"type": "item.completed", "item": {"id": "m1", "type": "agent_message", "text": NOTE}},
             {"type": "turn.completed", "usage": {"input_tokens": 10, "output_tokens": 5}}]
    proc = subprocess.run([*MEMFS, "append", "--store", str(root), "retry"],
                          input="".join(json.dumps(line) + "\n" for line in lines), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return root


def claude_results(body: dict) -> dict[str, str]:
    """Tool name → the text of its tool_result in a Claude request."""
    names, out = {}, {}
    for message in body.get("messages", []):
        for block in message["content"] if isinstance(message["content"], list) else []:
            if block.get("type") == "tool_use":
                names[block["id"]] = block["name"]
            elif block.get("type") == "tool_result" and block["tool_use_id"] in names:
                out[names[block["tool_use_id"]]] = json.dumps(block["content"])
    return out


def codex_results(body: dict) -> dict[str, str]:
    """``namespace.name`` → the output of its function call in a Codex request."""
    names, out = {}, {}
    for item in body.get("input", []):
        if item.get("type") == "function_call":
            names[item["call_id"]] = f"{item.get('namespace', '')}.{item['name']}"
        elif item.get("type") == "function_call_output" and item["call_id"] in names:
            out[names[item["call_id"]]] = json.dumps(item["output"])
    return out


def check(requests: list[dict], results, search_name: str, context_name: str) -> None:
    posts = [r for r in requests if r["method"] == "POST" and r.get("answer")]
    after_search = results(posts[-2]["body"])  # the request after the search call
    assert search_name in after_search, sorted(after_search)
    assert NOTE in after_search[search_name] and "retry:0" in after_search[search_name]
    final = results(posts[-1]["body"])
    assert context_name in final, sorted(final)
    assert "# Context: session retry" in final[context_name] and NOTE in final[context_name]


def run_agent(agent_class, store: Path, tmp_path: Path, steps: list[dict]) -> list[dict]:
    script = {"steps": steps + [{"text": "The memory says the retry loop is in."}]}
    with ModelServer(script, tmp_path / "requests.jsonl") as server:
        agent_class.store = store
        cli = agent_class(tmp_path / "sandbox", server.url)
        run = cli.run("What do we remember about the retry loop?", timeout=120)
        requests = server.requests()
    assert run.exit_code == 0, run.stderr.decode(errors="replace")[-3000:]
    assert b"The memory says the retry loop is in." in run.stdout
    return requests


def test_claude_code_calls_memfs_search_and_get_context(store, tmp_path):
    need_clis()
    steps = [  # Claude Code defers MCP tools: the model loads their schemas with ToolSearch first
        {"tool": {"name": "ToolSearch", "arguments": {"query": "select:mcp__memfs__search,mcp__memfs__get_context",
                                                      "max_results": 2}}},
        {"tool": {"name": "mcp__memfs__search", "arguments": SEARCH}},
        {"tool": {"name": "mcp__memfs__get_context", "arguments": CONTEXT}},
    ]
    requests = run_agent(ClaudeWithMemfs, store, tmp_path, steps)
    check(requests, claude_results, "mcp__memfs__search", "mcp__memfs__get_context")


def test_codex_calls_memfs_search_and_get_context(store, tmp_path):
    need_clis()
    steps = [  # Codex defers them too: a client-side tool_search, then calls in the mcp__memfs namespace
        {"tool": {"item": {"type": "tool_search_call", "execution": "client",
                           "arguments": {"query": "memfs search get_context", "limit": 6}}}},
        {"tool": {"name": "search", "namespace": "mcp__memfs", "arguments": SEARCH}},
        {"tool": {"name": "get_context", "namespace": "mcp__memfs", "arguments": CONTEXT}},
    ]
    requests = run_agent(CodexWithMemfs, store, tmp_path, steps)
    check(requests, codex_results, "mcp__memfs.search", "mcp__memfs.get_context")


class ClaudeOverHttp(Claude):
    """Claude Code configured by running the ``claude mcp add --transport http …`` line that
    ``memfs mcp --http`` printed (its own config, no ``--mcp-config``)."""

    added: str

    def setup(self):
        super().setup()
        argv = shlex.split(self.added)
        assert argv[:2] == ["claude", "mcp"]
        proc = subprocess.run([str(BIN / "claude"), *argv[1:]], cwd=self.proj, env=self.env(), capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr


class CodexOverHttp(Codex):
    """Codex with the ``[mcp_servers.memfs]`` table ``memfs mcp --http`` printed."""

    table: dict

    def setup(self):
        super().setup()
        with open(self.home / ".codex" / "config.toml", "a") as f:
            f.write(f"\n[mcp_servers.memfs]\nurl = {json.dumps(self.table['url'])}\n"
                    f"http_headers = {{ Authorization = {json.dumps(self.table['http_headers']['Authorization'])} }}\n"
                    "startup_timeout_sec = 60\nrequired = true\n")


def test_claude_code_and_codex_over_http_with_the_printed_setup(store, tmp_path):
    """What the first ``memfs mcp --http`` prints configures both CLIs: they reach the server
    with the bearer token and call its tools."""
    need_clis()
    (tmp_path / "claude").mkdir()
    (tmp_path / "codex").mkdir()
    with http_server(tmp_path, "--store", str(store)) as server:
        claude, codex, _ = the_setup(server.stderr())
        ClaudeOverHttp.added = claude
        steps = [
            {"tool": {"name": "ToolSearch", "arguments": {"query": "select:mcp__memfs__search,mcp__memfs__get_context",
                                                          "max_results": 2}}},
            {"tool": {"name": "mcp__memfs__search", "arguments": SEARCH}},
            {"tool": {"name": "mcp__memfs__get_context", "arguments": CONTEXT}},
        ]
        requests = run_agent(ClaudeOverHttp, store, tmp_path / "claude", steps)
        check(requests, claude_results, "mcp__memfs__search", "mcp__memfs__get_context")
        CodexOverHttp.table = codex
        steps = [
            {"tool": {"item": {"type": "tool_search_call", "execution": "client",
                               "arguments": {"query": "memfs search get_context", "limit": 6}}}},
            {"tool": {"name": "search", "namespace": "mcp__memfs", "arguments": SEARCH}},
            {"tool": {"name": "get_context", "namespace": "mcp__memfs", "arguments": CONTEXT}},
        ]
        requests = run_agent(CodexOverHttp, store, tmp_path / "codex", steps)
        check(requests, codex_results, "mcp__memfs.search", "mcp__memfs.get_context")
