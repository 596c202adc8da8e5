"""``memfs mcp`` over HTTP is guarded (SPEC §13): every request needs the bearer token (made on
first use into a 0600 file and printed once with the clients' configuration, or given with
``--token-file``); ``--unix`` serves on a 0600 socket another user cannot connect to; the session
table is bounded, so a flood of initializes — refused or accepted — leaves room for a new client.
Servers run as subprocesses, driven with the official SDK client, httpx2 and raw sockets, and
another uid's client runs under ``setpriv``."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
from pathlib import Path

import anyio
import httpx2
import pytest

from agent_helpers import cli
from mcp_helpers import http_server, make_store, ok, run, state_env, the_setup, token_of
from store_helpers import wait_until

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}
MCP_HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


@pytest.fixture
def store(tmp_path) -> Path:
    return make_store(tmp_path / "store")


def as_other_uid(code: str) -> str:
    """Run Python ``code`` as uid/gid 65534 (nobody); its stdout."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("running a client as another uid needs root and setpriv")
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--",
                           "/usr/bin/python3", "-I", "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


async def served_by(client) -> None:
    """The client's server answers tools: list_sessions and a search."""
    assert "search" in {t.name for t in (await client.list_tools()).tools}
    assert ok(await client.call_tool("search", {"query": "retry loop"}))["results"][0]["session_id"] == "retry"


def test_every_request_needs_the_bearer_token_made_on_first_use(store, tmp_path):
    token_file = tmp_path / "state" / "memfs" / "mcp-token"
    with http_server(tmp_path, "--store", str(store), "--allow-write") as server:
        token = token_of(tmp_path)
        st = token_file.stat()
        assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid() and len(token) >= 32
        # printed once, with what Claude Code and Codex need, and memfs named by its absolute path
        claude, codex, stdio = the_setup(server.stderr())
        assert claude == (f'claude mcp add --transport http memfs {server.url} '
                          f'--header "Authorization: Bearer {token}"')
        assert codex == {"url": server.url, "http_headers": {"Authorization": f"Bearer {token}"}}
        executable = stdio.split()[0]
        assert os.path.isabs(executable) and os.access(executable, os.X_OK), stdio
        assert stdio.split()[-3:] == ["mcp", "--store", str(store)] or stdio.endswith(f"mcp --store {store}")

        async def main():
            # a session opened with the token, then requests without it or with another one
            async with server.http(token) as good:
                opened = await good.post(server.url, json=INIT, headers=MCP_HEADERS)
                assert opened.status_code == 200, opened.text
                sid = opened.headers["mcp-session-id"]
            wrong = "x" * len(token)
            for headers in ({}, {"Authorization": f"Bearer {wrong}"}, {"Authorization": f"Basic {token}"},
                            {"Authorization": f"Bearer {token[:-1]}"}, {"Authorization": token}):
                async with server.http(headers=headers) as bad:
                    for method in ("POST", "GET", "DELETE"):
                        answer = await bad.request(method, server.url, json=INIT if method == "POST" else None,
                                                   headers={**MCP_HEADERS, "mcp-session-id": sid})
                        assert answer.status_code == 401, (method, headers, answer.text)
                        assert answer.headers["www-authenticate"].startswith("Bearer")
                        assert "mcp-session-id" not in answer.headers
                        assert "Authorization: Bearer" in answer.json()["error"]["message"]
                    assert (await bad.get(server.url.replace("/mcp", "/elsewhere"))).status_code == 401
            # the session the unauthorized DELETE named is still there; the SDK client works
            async with server.http(token) as good:
                ping = await good.post(server.url, json={"jsonrpc": "2.0", "id": 2, "method": "ping"},
                                       headers={**MCP_HEADERS, "mcp-session-id": sid,
                                                "mcp-protocol-version": "2025-06-18"})
                assert ping.status_code == 200, ping.text
            async with server.client(token) as client:
                await served_by(client)

        run(main)
        # another user on the machine: no token (the file is 0600), so 401, and no session
        code = (f"import http.client, json\n"
                f"c = http.client.HTTPConnection('127.0.0.1', {server.url.split(':')[2].split('/')[0]})\n"
                f"c.request('POST', '/mcp', {json.dumps(json.dumps(INIT))}, {MCP_HEADERS!r})\n"
                f"r = c.getresponse(); print(r.status, r.getheader('mcp-session-id'))\n"
                f"try:\n    open({str(token_file)!r}).read(); print('read the token')\n"
                f"except PermissionError:\n    print('no token')\n")
        assert as_other_uid(code).split("\n") == ["401 None", "no token"]

    # the next start uses the same token and prints nothing of it
    with http_server(tmp_path, "--store", str(store), name="again") as server:
        assert token_of(tmp_path) == token and token not in server.stderr()
        assert "made a bearer token" not in server.stderr()

        async def again():
            async with server.client(token) as client:
                await served_by(client)

        run(again)
    # a token file others may read is refused, with the reason
    token_file.chmod(0o644)
    proc = cli_with_state(tmp_path, "mcp", "--store", str(store), "--http", "1")
    assert proc.returncode == 1 and "open to group or others" in proc.stderr and "chmod 600" in proc.stderr


def cli_with_state(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    from agent_helpers import MEMFS

    return subprocess.run([*MEMFS, *args], capture_output=True, text=True, timeout=60, env=state_env(tmp_path))


def test_token_file(store, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("given-token-0123456789abcdef\n")
    secret.chmod(0o600)
    with http_server(tmp_path, "--store", str(store), "--token-file", str(secret)) as server:
        assert "made a bearer token" not in server.stderr() and not (tmp_path / "state" / "memfs").exists()

        async def main():
            async with server.http("given-token-0123456789abcdef") as good:
                assert (await good.post(server.url, json=INIT, headers=MCP_HEADERS)).status_code == 200
            async with server.http("given-token-0123456789abcdeF") as bad:
                assert (await bad.post(server.url, json=INIT, headers=MCP_HEADERS)).status_code == 401
            async with server.client("given-token-0123456789abcdef") as client:
                await served_by(client)

        run(main)

    link = tmp_path / "link"
    link.symlink_to(secret)
    short = tmp_path / "short"
    short.write_text("abc\n")
    short.chmod(0o600)
    spaced = tmp_path / "spaced"
    spaced.write_text("two words in a token file\n")
    spaced.chmod(0o600)
    for path, reason in ((link, "symbolic link"), (short, "does not hold a token"), (spaced, "does not hold a token"),
                         (tmp_path / "missing", "cannot read"), (tmp_path, "not a regular file")):
        proc = cli_with_state(tmp_path, "mcp", "--store", str(store), "--http", "1", "--token-file", str(path))
        assert proc.returncode == 1 and reason in proc.stderr, (path, proc.stderr)
    secret.chmod(0o640)
    proc = cli_with_state(tmp_path, "mcp", "--store", str(store), "--http", "1", "--token-file", str(secret))
    assert proc.returncode == 1 and "mode 0640" in proc.stderr
    for args, reason in ((["--unix", str(tmp_path / "s"), "--token-file", str(secret)], "--token-file goes with"),
                         (["--http", "1", "--unix", str(tmp_path / "s")], "do not go together"),
                         (["--http", "1", "--max-sessions", "0"], "not a positive number")):
        proc = cli("mcp", "--store", str(store), *args)
        assert proc.returncode == 2 and reason in proc.stderr, proc.stderr


@pytest.fixture
def open_dir():
    """A directory every user may enter (tmp_path's parents are private to root), removed after."""
    path = Path(tempfile.mkdtemp(prefix="memfs-mcp-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_unix_socket_is_this_users_only(store, tmp_path, open_dir):
    sock_path = open_dir / "mcp.sock"
    sock_path.write_text("not a socket")
    proc = cli("mcp", "--store", str(store), "--unix", str(sock_path))
    assert proc.returncode == 1 and "exists and is not a socket" in proc.stderr
    assert sock_path.read_text() == "not a socket"
    sock_path.unlink()

    with http_server(tmp_path, "--store", str(store), "--unix", str(sock_path), unix=sock_path) as server:
        st = sock_path.lstat()
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
        assert "Bearer" not in server.stderr()

        async def main():  # no token needed
            async with server.client() as client:
                await served_by(client)

        run(main)
        # another uid cannot connect to it, though it can to a socket open to all in the same directory
        with socket.socket(socket.AF_UNIX) as control:
            control.bind(str(open_dir / "control.sock"))
            os.chmod(open_dir / "control.sock", 0o666)
            control.listen(1)
            code = ("import socket\n"
                    "for p in ({!r}, {!r}):\n"
                    "    s = socket.socket(socket.AF_UNIX)\n"
                    "    try:\n        s.connect(p); print('connected')\n"
                    "    except PermissionError:\n        print('refused')\n").format(
                str(open_dir / "control.sock"), str(sock_path))
            assert as_other_uid(code).split("\n") == ["connected", "refused"]
        # killed, it leaves its socket; the next server replaces it, and removes it when stopped
        server.proc.kill()
        server.proc.wait(10)
        assert stat.S_ISSOCK(sock_path.lstat().st_mode)
    with http_server(tmp_path, "--store", str(store), "--unix", str(sock_path), unix=sock_path, name="again") as server:
        run(lambda: _served(server))
        # a second server on the same socket is refused while this one listens
        proc = cli("mcp", "--store", str(store), "--unix", str(sock_path))
        assert proc.returncode == 1 and "another server is listening" in proc.stderr
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(30) == 0
        assert not os.path.lexists(sock_path)


async def _served(server) -> None:
    async with server.client() as client:
        await served_by(client)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_flood_of_initializes_leaves_room_for_a_new_client(store, tmp_path):
    """At most --max-sessions sessions: 401s open none, and each initialize beyond the bound ends
    the session idle the longest; a new client is served after both floods."""
    max_sessions, flood = 8, 20
    with http_server(tmp_path, "--store", str(store), "--max-sessions", str(max_sessions)) as server:
        token = token_of(tmp_path)

        async def main():
            async with server.http() as anonymous:
                for _ in range(flood):
                    answer = await anonymous.post(server.url, json=INIT, headers=MCP_HEADERS)
                    assert answer.status_code == 401 and "mcp-session-id" not in answer.headers
            sessions = []
            async with server.http(token) as flooder:
                for _ in range(flood):
                    answer = await flooder.post(server.url, json=INIT, headers=MCP_HEADERS)
                    assert answer.status_code == 200, answer.text
                    sessions.append(answer.headers["mcp-session-id"])

                async def alive(sid: str) -> bool:
                    ping = await flooder.post(server.url, json={"jsonrpc": "2.0", "id": 2, "method": "ping"},
                                              headers={**MCP_HEADERS, "mcp-session-id": sid,
                                                       "mcp-protocol-version": "2025-06-18"})
                    assert ping.status_code in (200, 404), ping.text
                    return ping.status_code == 200

                # the newest max_sessions are open, the older ones were ended (404: start a new session)
                assert [await alive(sid) for sid in sessions] == [False] * (flood - max_sessions) + [True] * max_sessions
                async with server.client(token) as client:
                    await served_by(client)
                    # the new client's session ended the longest idle of the flood's
                    assert not await alive(sessions[flood - max_sessions])
                    assert await alive(sessions[-1])

        run(main)
        assert rss_kib(server.proc.pid) < 400 * 1024


def test_concurrent_clients_within_the_bound_and_the_idle_timeout(store, tmp_path):
    """Clients at once up to the bound are all served (none ends another one's session while it
    is in use); a session nobody uses for --idle-timeout seconds is ended."""
    with http_server(tmp_path, "--store", str(store), "--max-sessions", "4", "--idle-timeout", "3") as server:
        token = token_of(tmp_path)

        async def one(results: list) -> None:
            async with server.client(token) as client:
                for _ in range(3):
                    await served_by(client)
                results.append(True)

        async def main():
            results: list = []
            async with anyio.create_task_group() as tg:
                for _ in range(4):
                    tg.start_soon(one, results)
            assert results == [True] * 4

        run(main)
        headers = {**MCP_HEADERS, "Authorization": f"Bearer {token}"}
        with httpx2.Client(headers=headers, timeout=30) as raw:
            sid = raw.post(server.url, json=INIT).headers["mcp-session-id"]

            def ping() -> int:
                return raw.post(server.url, json={"jsonrpc": "2.0", "id": 2, "method": "ping"},
                                headers={"mcp-session-id": sid, "mcp-protocol-version": "2025-06-18"}).status_code

            assert ping() == 200
            # (a ping is a use: the server's log says when the session's idle time ran out)
            wait_until(lambda: f"Session {sid} idle timeout" in server.stderr(), "the idle session is ended", 60)
            assert ping() == 404
