"""MCP over streamable HTTP, guarded (SPEC §13): a bearer token on TCP, a 0600 Unix socket
without one, and a bounded session table.

* :func:`load_token` / :func:`ensure_token` — the token: ``--token-file FILE``, or one made on
  first use (``secrets.token_urlsafe``) into ``$XDG_STATE_HOME/memfs/mcp-token`` (mode 0600). A
  token file that is a symbolic link, not a regular file, owned by another user or open to group
  or others is refused with the reason.
* :class:`Guard` — the ASGI wrapper in front of the SDK's app: every request (POST, GET, DELETE,
  any path) without ``Authorization: Bearer <token>`` is answered 401 before anything else runs
  (compared with :func:`hmac.compare_digest`); then the session table is kept at most
  ``max_sessions`` long: a request that opens a session when the table is full ends the session
  idle the longest (one with no request in progress; an open GET stream is not a request in
  progress) the way a client ends one (``DELETE``), and is refused with 503 and the reason only
  while every session is serving a request. The SDK's own idle timeout ends sessions nobody used
  for ``idle_timeout`` seconds.
* :func:`bind_unix` — the 0600 socket for ``--unix PATH`` (uvicorn's own would be 0666).
* :func:`client_setup` — what to paste into Claude Code and Codex, printed once, when the token is
  made; it names ``memfs`` by its absolute path (:func:`memfs_command`).
"""

from __future__ import annotations

import hmac
import os
import secrets
import shlex
import shutil
import signal
import socket
import stat
import sys
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import orjson

from memfs.errors import MemfsError
from memfs.fs.registry import state_home
from memfs.mcp_server import DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_SESSIONS

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

TOKEN_NAME = "mcp-token"
MIN_TOKEN_CHARS = 16
MAX_TOKEN_BYTES = 4096
TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~+/=")
SESSION_HEADER = b"mcp-session-id"


class TokenError(MemfsError):
    """A token file that cannot be used: unreadable, not private, or not a token."""

    errno_name = "EACCES"


def token_path() -> Path:
    """Where the generated token lives: ``$XDG_STATE_HOME/memfs/mcp-token``."""
    return state_home() / "memfs" / TOKEN_NAME


def load_token(path: str | os.PathLike) -> str:
    """The token in ``path``, which must be a regular file of this user, mode 0600 or
    stricter, and not a symbolic link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        if os.path.islink(path):
            raise TokenError(f"token file {path} is a symbolic link; give the file itself") from None
        raise TokenError(f"cannot read the token file {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise TokenError(f"token file {path} is not a regular file")
        if st.st_uid != os.geteuid():
            raise TokenError(f"token file {path} belongs to uid {st.st_uid}, not to this user ({os.geteuid()})")
        if st.st_mode & 0o077:
            raise TokenError(f"token file {path} is open to group or others (mode {stat.S_IMODE(st.st_mode):04o}); "
                             f"chmod 600 it")
        data = os.read(fd, MAX_TOKEN_BYTES + 1)
    finally:
        os.close(fd)
    token = data.strip().decode("ascii", errors="replace")
    if len(data) > MAX_TOKEN_BYTES or len(token) < MIN_TOKEN_CHARS or not set(token) <= TOKEN_CHARS:
        raise TokenError(f"token file {path} does not hold a token: one line of at least {MIN_TOKEN_CHARS} "
                         f"letters, digits or -._~+/=")
    return token


def ensure_token(path: str | os.PathLike | None) -> tuple[str, Path, bool]:
    """``(token, its file, made now)``: the token of ``path`` (``--token-file``), else of
    :func:`token_path`, made there first when it does not exist yet."""
    if path is not None:
        return load_token(path), Path(path), False
    target = token_path()
    if os.path.lexists(target):
        return load_token(target), target, False
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    # written whole under a private name, then linked into place: the file is never seen
    # partly written, and of two servers starting at once the first link wins
    draft = target.with_name(f".{TOKEN_NAME}.{os.getpid()}")
    try:
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, token.encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.link(draft, target)
    except FileExistsError:
        return load_token(target), target, False
    except OSError as exc:
        raise TokenError(f"cannot create the token file {target}: {exc.strerror}") from None
    finally:
        try:
            os.unlink(draft)
        except OSError:
            pass
    return token, target, True


def memfs_command() -> list[str]:
    """How to start this memfs from any shell: its executable's absolute path (or the
    interpreter's with ``-m memfs``)."""
    argv0 = sys.argv[0] if sys.argv else ""
    if argv0 and os.path.basename(argv0) == "memfs" and os.path.isfile(argv0):
        return [os.path.abspath(argv0)]
    found = shutil.which("memfs")
    if found:
        return [os.path.abspath(found)]
    return [os.path.abspath(sys.executable), "-m", "memfs"]


def client_setup(url: str, token: str, token_file: Path, stdio_args: list[str]) -> str:
    """The lines that configure Claude Code and Codex for this server (HTTP with the token),
    and the token-less stdio alternative."""
    stdio = shlex.join([*memfs_command(), "mcp", *stdio_args])
    return "\n".join([
        f"memfs mcp: made a bearer token in {token_file} (mode 0600); every request needs "
        f"'Authorization: Bearer <token>'. Clients:",
        f"  Claude Code: claude mcp add --transport http memfs {url} --header \"Authorization: Bearer {token}\"",
        "  Codex, in ~/.codex/config.toml:",
        "    [mcp_servers.memfs]",
        f"    url = \"{url}\"",
        f"    http_headers = {{ Authorization = \"Bearer {token}\" }}",
        f"  Or over stdio, without a token: claude mcp add memfs -- {stdio}",
    ])


def bind_unix(path: str) -> socket.socket:
    """A listening Unix socket at ``path`` that only this user may connect to (mode 0600). An
    existing path is refused unless it is a socket nobody listens on (left by a killed server),
    which is replaced."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISSOCK(st.st_mode):
            raise MemfsError(f"--unix {path}: exists and is not a socket")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(path)
            except (ConnectionRefusedError, FileNotFoundError):
                os.unlink(path)
            except OSError as exc:
                raise MemfsError(f"--unix {path}: {exc.strerror}") from None
            else:
                raise MemfsError(f"--unix {path}: another server is listening on it")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    except OSError as exc:
        sock.close()
        raise MemfsError(f"--unix {path}: {exc.strerror or exc}") from None
    finally:
        os.umask(old)
    sock.listen(128)
    return sock


def unlink_socket(path: str, made: os.stat_result) -> None:
    """Remove ``path`` if it is still the socket made there (``made``: its ``lstat``)."""
    try:
        st = os.lstat(path)
        if (st.st_dev, st.st_ino) == (made.st_dev, made.st_ino):
            os.unlink(path)
    except OSError:
        pass


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


async def _answer(send: Send, status: int, reason: str, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    body = orjson.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": -32001 if status == 401 else -32603,
                                                                 "message": reason}})
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


class _Session:
    __slots__ = ("busy", "last")

    def __init__(self) -> None:
        self.busy = 0  # POST/DELETE requests in progress
        self.last = time.monotonic()


class Guard:
    """The bearer token check and the session bound, in front of the SDK's ASGI app (see the
    module's docstring). ``token=None`` (the Unix socket) checks no token."""

    def __init__(self, app: ASGIApp, token: str | None, max_sessions: int) -> None:
        self.app, self.max_sessions = app, max_sessions
        self.token = token.encode() if token is not None else None
        self.sessions: dict[str, _Session] = {}
        self.opening = 0  # sessions being opened (their initialize is being answered)
        import anyio  # (with the SDK: this module's token functions work without it)

        self.lock = anyio.Lock()

    def authorized(self, scope: Scope) -> bool:
        if self.token is None:
            return True
        given = _header(scope, b"authorization") or ""
        scheme, _, credential = given.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(credential.strip().encode("latin-1"), self.token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "websocket":
                return  # refused: the server speaks no websocket
            await self.app(scope, receive, send)  # the lifespan (runs the SDK's session manager)
            return
        if not self.authorized(scope):
            await _answer(send, 401, "unauthorized: send 'Authorization: Bearer <token>' (the token file "
                                     "memfs mcp printed at startup)",
                          ((b"www-authenticate", b'Bearer realm="memfs"'),))
            return
        sid = _header(scope, SESSION_HEADER)
        method = scope.get("method", "")
        if sid is None and method == "POST":
            await self.open_session(scope, receive, send)
        elif sid is not None:
            await self.in_session(sid, scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def open_session(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with self.lock:
            while len(self.sessions) + self.opening >= self.max_sessions:
                idle = [(s.last, sid) for sid, s in self.sessions.items() if not s.busy]
                if not idle:
                    await _answer(send, 503, f"too many MCP sessions: all {self.max_sessions} are serving a "
                                             f"request; retry in a moment")
                    return
                await self.end_session(min(idle)[1], scope)
            self.opening += 1
        made: list[str] = []

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] < 400 and not made:
                sid = next((v.decode("latin-1") for k, v in message.get("headers", ()) if k.lower() == SESSION_HEADER),
                           None)
                if sid is not None:  # opened: counted in the table from now on
                    self.sessions[sid] = _Session()
                    self.opening -= 1
                    made.append(sid)
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            if not made:
                self.opening -= 1
            elif made[0] in self.sessions:
                self.sessions[made[0]].last = time.monotonic()

    async def in_session(self, sid: str, scope: Scope, receive: Receive, send: Send) -> None:
        session = self.sessions.get(sid)
        counted = session is not None and scope.get("method") != "GET"
        if counted:
            session.busy += 1
            session.last = time.monotonic()
        status: list[int] = []

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            if counted:
                session.busy -= 1
                session.last = time.monotonic()
            if scope.get("method") == "DELETE" or status[:1] == [404]:
                self.sessions.pop(sid, None)

    async def end_session(self, sid: str, like: Scope) -> None:
        """End session ``sid`` as its client would: a ``DELETE`` with its id, to the SDK's app."""
        self.sessions.pop(sid, None)
        headers = [(k, v) for k, v in like.get("headers", ()) if k.lower() in (b"host", b"authorization")]
        scope = dict(like, method="DELETE", headers=[*headers, (SESSION_HEADER, sid.encode())], query_string=b"")
        sent = False

        async def receive() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": b"", "more_body": False}
            return {"type": "http.disconnect"}

        async def discard(message: Message) -> None:
            pass

        await self.app(scope, receive, discard)


def serve_http(server, *, port: int | None = None, unix: str | None = None, token: str | None = None,
               max_sessions: int = DEFAULT_MAX_SESSIONS, idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
               host: str = "127.0.0.1") -> None:
    """Serve the low-level ``server`` at ``http://<host>:<port>/mcp`` (``token`` required) or
    on the Unix socket ``unix``, until a signal stops it; the socket is removed on the way out."""
    import uvicorn
    from mcp.server.transport_security import TransportSecuritySettings

    # no browser can reach a Unix socket: the Host/Origin checks (DNS rebinding) are for TCP only
    security = TransportSecuritySettings(enable_dns_rebinding_protection=False) if unix is not None else None
    app = server.streamable_http_app(host=host, session_idle_timeout=idle_timeout, max_sessions=max_sessions,
                                     transport_security=security)
    guard = Guard(app, token if unix is None else None, max_sessions)
    # uvicorn stops gracefully on SIGTERM, then raises it again: this handler turns that into an
    # exit through the callers' cleanup (the socket removed, the store closed) instead of a kill
    previous = signal.signal(signal.SIGTERM, _exit_0)
    try:
        if unix is None:
            uvicorn.Server(uvicorn.Config(guard, host=host, port=port or 0, log_level="warning")).run()
            return
        sock = bind_unix(unix)
        made = os.lstat(unix)
        try:
            uvicorn.Server(uvicorn.Config(guard, log_level="warning")).run(sockets=[sock])
        finally:
            unlink_socket(unix, made)
            sock.close()
    finally:
        signal.signal(signal.SIGTERM, previous)


def _exit_0(signum, frame) -> None:
    raise SystemExit(0)
