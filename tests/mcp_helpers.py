"""What the ``memfs mcp`` tests share: a small store, the server in a subprocess (stdio, TCP with
its bearer token, or a Unix socket), always stopped by pid, and the official SDK client on it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import anyio
import httpx2
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from agent_helpers import MEMFS, cli
from store_helpers import wait_until

FIXTURES = Path(__file__).parent / "fixtures" / "agents"
LINES = [
    {"type": "thread.started", "thread_id": "t-retry"},
    {"type": "turn.started"},
    {"type": "item.completed", "item": {"id": "c1", "type": "command_execution", "command": "pytest tests/test_net.py",
                                        "status": "failed", "exit_code": 1, "aggregated_output": "1 failed"}},
    {"type": "item.completed", "item": {"id": "m1", "type": "agent_message", "text": "Added the retry loop to fetch()."}},
    {"type": "turn.completed", "usage": {"input_tokens": 1200, "output_tokens": 95}},
]


def make_store(root: Path) -> Path:
    """A store with a native session ``retry`` and two imported ones (codex, claude)."""
    data = "".join(json.dumps(line) + "\n" for line in LINES)
    proc = subprocess.run([*MEMFS, "append", "--store", str(root), "retry"], input=data, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    proc = cli("import", "--store", str(root), str(FIXTURES / "codex" / "ok_failing_command" / "stream.jsonl"),
               str(FIXTURES / "claude" / "ok_failing_command" / "stream.jsonl"))
    assert proc.returncode == 0, proc.stderr
    return root


def config_file(tmp_path: Path, **settings) -> Path:
    path = tmp_path / "memfs.toml"
    path.write_text("".join(f"{key} = {value}\n" for key, value in settings.items()))
    return path


def text(result) -> str:
    assert len(result.content) == 1
    return result.content[0].text


def ok(result):
    assert not result.is_error, text(result)
    return json.loads(text(result))


def refused(result, *words: str) -> str:
    """The tool error's one-line reason, which says each of ``words``."""
    assert result.is_error, text(result)
    reason = text(result)
    assert "\n" not in reason and reason
    for word in words:
        assert word in reason, reason
    return reason


def kill(pid: int | None) -> None:
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def server_pid(errlog: Path) -> int | None:
    """The pid ``memfs mcp`` names on its first line of stderr."""
    for line in errlog.read_text(errors="replace").splitlines():
        if line.startswith("memfs mcp: serving") and "pid " in line:
            return int(line.rsplit("pid ", 1)[1].rstrip(")"))
    return None


def run(main):
    """``anyio.run(main)``, a failure inside the SDK's task groups raised as itself."""
    try:
        return anyio.run(main)
    except BaseExceptionGroup as group:
        while isinstance(group, BaseExceptionGroup) and len(group.exceptions) == 1:
            group = group.exceptions[0]
        raise group from None


def over_stdio(tmp_path: Path, body, *args: str):
    """Run ``body(client)`` against ``memfs mcp ARGS`` over stdio; the server is killed by pid
    afterwards, whatever happened."""
    errlog = tmp_path / "mcp-stdio.log"
    params = StdioServerParameters(command=sys.executable, args=["-m", "memfs", "mcp", *args])

    async def main():
        with open(errlog, "w") as err:
            async with Client(stdio_client(params, errlog=err), read_timeout_seconds=60) as client:
                return await body(client)

    try:
        return run(main)
    finally:
        kill(server_pid(errlog) if errlog.exists() else None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def state_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a server whose state directory (its generated token) is in tmp_path."""
    return {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}


class Served:
    """A ``memfs mcp`` HTTP server in a subprocess: its url (or socket), its stderr so far."""

    def __init__(self, proc: subprocess.Popen, log: Path, url: str, unix: Path | None):
        self.proc, self.log, self.url, self.unix = proc, log, url, unix

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    def http(self, token: str | None = None, headers: dict[str, str] | None = None) -> httpx2.AsyncClient:
        """An httpx2 client for this server (over its socket for --unix), with ``token`` (or
        the ``headers`` given)."""
        if headers is None:
            headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        transport = httpx2.AsyncHTTPTransport(uds=str(self.unix)) if self.unix is not None else None
        return httpx2.AsyncClient(headers=headers, transport=transport, timeout=httpx2.Timeout(30, read=60))

    def client(self, token: str | None = None) -> Client:
        """The official SDK client on this server."""
        return Client(streamable_http_client(self.url, http_client=self.http(token)), read_timeout_seconds=60)


@contextlib.contextmanager
def http_server(tmp_path: Path, *args: str, unix: Path | None = None, env: dict[str, str] | None = None,
                name: str = "mcp-http"):
    """``memfs mcp --http PORT ARGS`` (or ``--unix PATH ARGS``) in a subprocess, once it listens;
    killed by pid on the way out."""
    port = free_port()
    log = tmp_path / f"{name}.log"
    where = ["--unix", str(unix)] if unix is not None else ["--http", str(port)]
    with open(log, "wb") as out:
        proc = subprocess.Popen([*MEMFS, "mcp", *where, *args], stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                env=env or state_env(tmp_path))
    try:
        def listening():
            assert proc.poll() is None, log.read_text()
            family = socket.AF_UNIX if unix is not None else socket.AF_INET
            with socket.socket(family) as s:
                return s.connect_ex(str(unix) if unix is not None else ("127.0.0.1", port)) == 0

        wait_until(listening, "memfs mcp listens", timeout=30)
        yield Served(proc, log, "http://localhost/mcp" if unix is not None else f"http://127.0.0.1:{port}/mcp", unix)
    finally:
        kill(proc.pid)
        proc.wait(10)


def token_of(tmp_path: Path) -> str:
    """The token a server with :func:`state_env` made."""
    return (tmp_path / "state" / "memfs" / "mcp-token").read_text().strip()


def the_setup(stderr: str) -> tuple[str, dict, str]:
    """The Claude Code command, the Codex table and the stdio alternative a server printed."""
    lines = stderr.splitlines()
    claude = next(line.strip() for line in lines if "claude mcp add --transport http" in line)
    start = next(i for i, line in enumerate(lines) if line.strip() == "[mcp_servers.memfs]")
    codex = tomllib.loads("\n".join(line.strip() for line in lines[start:start + 3]))["mcp_servers"]["memfs"]
    stdio = next(line for line in lines if "over stdio" in line).split(" -- ", 1)[1]
    return claude.split(": ", 1)[1], codex, stdio
