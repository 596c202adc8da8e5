"""The event loop's own NATS connection: publish requests and the follower's deliveries on trio.

The filesystem's fast path (one whole line per ``write()``, :meth:`memfs.fs.ops.Operations.write`)
publishes through this connection, and the follower (:mod:`memfs.cluster.follow`) receives
the stream's messages on it — both on the trio loop that serves FUSE, with no other thread
woken on the way. Handing each publish to ``nats-py``'s asyncio thread and back, and having
that thread wake for every message of the stream (this host's own lines included), cost much
of the fenced publish rate through the mount (``scripts/bench_cluster.py``).

Everything else of cluster mode stays on :class:`memfs.cluster.node.ClusterNode`'s ``nats-py``
connection: the stream's creation, catch-up, batches and every retry of a publish. This module
speaks only what those two need of the NATS client protocol (``INFO``, ``CONNECT``,
``PING``/``PONG``, ``SUB``/``UNSUB``, ``PUB``/``HPUB``, ``MSG``/``HMSG``), and never retries a
request: one without a reply in time — no connection yet, the connection lost, a timeout —
returns None, and its caller decides (the fast path takes the worker-thread path, which
publishes again with the same fence and ``Nats-Msg-Id``: a publish that was stored is
deduplicated there).

:meth:`Connection.run` (a task in the mount's nursery) keeps the connection: it connects to the
configured servers in turn, runs the ``on_connect`` hooks (the follower's subscription), and
after a failure tries the next server after :data:`RECONNECT_WAIT` seconds. Subscriptions end
with the connection (the hooks make them again). It presents the mount's
:class:`memfs.cluster.auth.Credentials` — the same as ``nats-py``'s connection: user and
password, token, NKey (the server's nonce signed) or user JWT, else the URL's userinfo — and
speaks TLS when the URL is ``tls://`` or the server requires it, with the configured CA and
client certificate (else the system's trusted CAs). A server that refuses the credentials, or
a failed TLS handshake, is logged once as an error (then retried quietly, as nats-py does).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import ssl
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

import trio

from memfs.cluster import redact
from memfs.cluster.auth import Credentials, Refused, refusal, tls_not_offered
from memfs.errors import MemfsError

log = logging.getLogger("memfs.cluster")

RECONNECT_WAIT = 0.25  # seconds between connection attempts (as ClusterNode's nats-py connection)
CONNECT_TIMEOUT = 2.0  # seconds for the TCP connection and the INFO/CONNECT/PONG handshake
MAX_QUEUED = 4 << 20  # bytes waiting to be sent; beyond it (a stalled server) requests fail at once
_REPLIES_SID = b"1"

# (subject, reply subject, header block, payload) of one delivered message
Handler = Callable[[bytes, bytes, bytes, bytes], None]


class Connection:
    """One plain NATS connection owned by a trio loop."""

    def __init__(self, servers: list[str], name: str = "memfs", auth: Credentials | None = None):
        self.servers = servers
        self.name = name
        self.auth = auth or Credentials()
        self.connected_url: str | None = None  # the server spoken to now, userinfo hidden (None: not connected)
        self._refused: set[str] = set()  # servers whose refusal was logged (once each)
        self.max_payload = 0
        self.requests = 0  # requests answered
        self.on_connect: list[Callable[[], Awaitable[None]]] = []  # run after each handshake
        self.on_lost: list[Callable[[], None]] = []
        self._stream: trio.abc.Stream | None = None
        self._inbox = b""
        self._ids = itertools.count(1)
        self._sids = itertools.count(2)
        self._waiters: dict[bytes, _Waiter] = {}  # reply token -> waiter
        self._subs: dict[bytes, Handler] = {}  # sid -> handler
        self._out = bytearray()
        self._out_ready = trio.Event()
        self._fd: int | None = None  # the plain TCP socket's descriptor: written straight when idle
        self._sending = False  # the send loop is in a send_all

    @property
    def ready(self) -> bool:
        return self._stream is not None

    # --- the connection --------------------------------------------------------------------

    async def run(self) -> None:
        """Keep the connection until cancelled (the mount's nursery ends)."""
        for url in itertools.cycle(self.servers):
            try:
                await self._serve(url)
            except (*_LOST, MemfsError) as exc:  # (MemfsError: refused, or a secret file unreadable)
                why = str(exc) if isinstance(exc, MemfsError) else refusal(exc)
                if why is not None and url not in self._refused:
                    self._refused.add(url)
                    detail = self.auth.describe_tls(why) if why.startswith("TLS") else self.auth.describe(url)
                    log.error("cluster: event-loop connection: %s at %s (%s)", why, redact(url), detail)
                else:
                    log.debug("cluster: event-loop connection to %s: %r", redact(url), exc)
            except Exception:  # never the mount's end: nats-py's connection still publishes
                log.exception("cluster: event-loop connection to %s failed", redact(url))
            finally:
                self._lost()
            await trio.sleep(RECONNECT_WAIT)

    async def _serve(self, url: str) -> None:
        parts = urlsplit(url)
        with trio.fail_after(CONNECT_TIMEOUT):
            stream: trio.abc.Stream = await trio.open_tcp_stream(parts.hostname or "127.0.0.1", parts.port or 4222)
        try:
            with trio.fail_after(CONNECT_TIMEOUT):
                stream, reader = await self._handshake(stream, parts)
            self._stream, self.connected_url = stream, redact(url)
            self._refused.discard(url)
            self._fd = stream.socket.fileno() if isinstance(stream, trio.SocketStream) else None
            log.debug("cluster: event-loop connection to %s", self.connected_url)
            lost: list[BaseException] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_until_lost, self._send_loop, stream, lost, nursery.cancel_scope)
                nursery.start_soon(_until_lost, self._receive_loop, reader, lost, nursery.cancel_scope)
                for hook in self.on_connect:
                    nursery.start_soon(hook)
            if lost:
                raise lost[0]
        finally:
            # nothing writes to the descriptor once closed (its number may be reused at once)
            self._stream = self._fd = None
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def _handshake(self, stream, parts) -> tuple[trio.abc.Stream, _Reader]:
        """INFO, TLS when the URL or the server asks for it, CONNECT, the replies'
        subscription, PING/PONG; the stream to speak on and its reader."""
        reader = _Reader(stream)
        line = await reader.line()
        if not line.startswith(b"INFO "):
            raise ValueError(f"not a NATS server: {line[:60]!r}")
        info = json.loads(line[5:])
        if not info.get("headers"):
            raise ValueError("the server does not take headers: cluster mode needs nats-server >= 2.2")
        if parts.scheme == "tls" or info.get("tls_required"):  # as nats-py: else the system's trusted CAs
            stream = trio.SSLStream(stream, self.auth.tls or ssl.create_default_context(),
                                    server_hostname=parts.hostname)
            await stream.do_handshake()
            reader = _Reader(stream)
        elif self.auth.tls is not None:  # TLS was configured: never credentials in plain text
            raise Refused(tls_not_offered(parts.geturl()))
        self.max_payload = int(info.get("max_payload", 1 << 20))
        connect = {"verbose": False, "pedantic": False, "lang": "python-trio", "version": "memfs",
                   "protocol": 1, "headers": True, "no_responders": True, "name": self.name,
                   "tls_required": isinstance(stream, trio.SSLStream)}
        connect.update(self.auth.connect_fields(info, parts.geturl()))
        self._inbox = b"_INBOX." + os.urandom(11).hex().encode() + b"."
        await stream.send_all(b"CONNECT " + json.dumps(connect).encode() + b"\r\nSUB " + self._inbox + b"* "
                              + _REPLIES_SID + b"\r\nPING\r\n")
        while True:
            line = await reader.line()
            if line == b"PONG":
                return stream, reader
            if line.startswith(b"-ERR"):
                said = line[5:].decode(errors="replace")
                why = refusal(OSError(said))
                if why is not None:
                    raise Refused(why)
                raise OSError(f"{parts.hostname}:{parts.port} refused the connection: {said}")

    def _lost(self) -> None:
        """The connection ended: every request waiting on it gets None; subscriptions end."""
        was = self.connected_url
        self._stream = self.connected_url = self._fd = None
        self._out.clear()
        self._subs.clear()
        waiters, self._waiters = self._waiters, {}
        for waiter in waiters.values():
            waiter.event.set()
        if was is not None:
            for hook in self.on_lost:
                hook()

    async def _send_loop(self, stream) -> None:
        while True:
            await self._out_ready.wait()
            self._out_ready = trio.Event()
            if self._out:
                data = bytes(self._out)
                self._out.clear()
                self._sending = True
                try:
                    await stream.send_all(data)  # what is queued meanwhile goes out in the next one
                finally:
                    self._sending = False

    async def _receive_loop(self, reader: _Reader) -> None:
        replies = self._inbox
        while True:
            line = await reader.line()
            if line.startswith((b"MSG ", b"HMSG ")):
                # MSG <subject> <sid> [reply] <size> / HMSG <subject> <sid> [reply] <header size> <size>
                fields = line.split()
                headed = fields[0] == b"HMSG"
                size = int(fields[-1])
                header_size = int(fields[-2]) if headed else 0
                reply = fields[3] if len(fields) == (6 if headed else 5) else b""
                body = await reader.exact(size)
                subject, sid = fields[1], fields[2]
                if sid == _REPLIES_SID:
                    if subject.startswith(replies):
                        self._answer(subject[len(replies):], body[:header_size], body[header_size:])
                    continue
                handler = self._subs.get(sid)
                if handler is not None:
                    handler(subject, reply, body[:header_size], body[header_size:])
            elif line == b"PING":
                self._queue(b"PONG\r\n")
            elif line.startswith(b"-ERR"):
                log.debug("cluster: event-loop connection: %s", line.decode(errors="replace"))
            # PONG, +OK and INFO (cluster membership) need nothing here

    def _answer(self, token: bytes, head: bytes, body: bytes) -> None:
        waiter = self._waiters.pop(token, None)
        if waiter is None:
            return  # timed out before
        reply = _reply(head, body)
        self.requests += 1
        try:
            waiter.value = waiter.on_reply(reply) if waiter.on_reply is not None else reply
        except BaseException as exc:  # the caller's: raised in its task, not this loop's
            waiter.error = exc
        waiter.answered = True
        waiter.event.set()

    def _queue(self, data: bytes) -> None:
        """Send ``data`` after what is queued: straight to the socket when nothing is (one
        non-blocking write, no task switch), else — and for what that write did not take —
        through the send loop."""
        if self._fd is not None and not self._out and not self._sending:
            try:
                sent = os.write(self._fd, data)
            except OSError:  # full (EAGAIN), or broken: the send loop waits, or meets the error
                sent = 0
            if sent == len(data):
                return
            data = data[sent:]
        self._out += data
        self._out_ready.set()

    # --- what the follower and the fast path use ---------------------------------------------

    def publish(self, subject: bytes, payload: bytes = b"") -> None:
        """Send a message without waiting for anything (flow-control replies)."""
        if self._stream is not None:
            self._queue(b"PUB %s %d\r\n%s\r\n" % (subject, len(payload), payload))

    def subscribe(self, subject: bytes, handler: Handler) -> bytes:
        """Deliver ``subject``'s messages to ``handler`` (called on this loop, in the receive
        loop: it must not wait) until :meth:`unsubscribe` or the connection ends; the sid."""
        sid = str(next(self._sids)).encode()
        if self._stream is not None:
            self._subs[sid] = handler
            self._queue(b"SUB %s %s\r\n" % (subject, sid))
        return sid

    def unsubscribe(self, sid: bytes) -> None:
        if self._subs.pop(sid, None) is not None and self._stream is not None:
            self._queue(b"UNSUB %s\r\n" % sid)

    async def request(self, subject: str, payload: bytes, timeout: float, headers: dict[str, str] | None = None,
                      on_reply: Callable[[dict | None], object] | None = None):
        """Publish ``payload`` to ``subject`` (with ``headers``) and wait up to ``timeout``
        seconds for the reply: its JSON (a JetStream ack ``{"stream", "seq", "duplicate"?}``,
        or ``{"error": {...}}`` — ``code`` 503 when nothing answers the subject), or None when
        there was no connection, it was lost, the reply did not come in time, the message
        (headers included) is larger than the server takes, or the reply is not JSON.

        ``on_reply``, when given, is called with that reply on this loop as soon as it is read
        — before any message read after it is handled — and what it returns (or raises) is the
        result; it is not called when None is returned for want of a reply."""
        head = b"NATS/1.0\r\n" + b"".join(f"{k}: {v}\r\n".encode() for k, v in headers.items()) + b"\r\n" \
            if headers else b""
        # (over max_payload with its headers, the server would close the connection)
        if self._stream is None or len(head) + len(payload) > self.max_payload or len(self._out) > MAX_QUEUED:
            return None
        token = str(next(self._ids)).encode()
        waiter = _Waiter(on_reply)
        self._waiters[token] = waiter
        reply_to = self._inbox + token
        if headers:
            self._queue(b"HPUB %s %s %d %d\r\n%s%s\r\n" % (subject.encode(), reply_to, len(head),
                                                           len(head) + len(payload), head, payload))
        else:
            self._queue(b"PUB %s %s %d\r\n%s\r\n" % (subject.encode(), reply_to, len(payload), payload))
        try:
            with trio.move_on_after(timeout):
                await waiter.event.wait()
        finally:
            if not waiter.answered:  # (also when cancelled: on_reply is then never called)
                self._waiters.pop(token, None)
        if not waiter.answered:
            return None
        if waiter.error is not None:
            raise waiter.error
        return waiter.value


class _Waiter:
    __slots__ = ("event", "on_reply", "answered", "value", "error")

    def __init__(self, on_reply):
        self.event = trio.Event()
        self.on_reply = on_reply
        self.answered = False
        self.value = None
        self.error: BaseException | None = None


_LOST = (OSError, EOFError, ValueError, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError)


async def _until_lost(loop, arg, lost: list, scope: trio.CancelScope) -> None:
    """Run one of the connection's loops; when it ends (the connection is lost), note why and
    end the other one."""
    try:
        await loop(arg)
    except _LOST as exc:
        lost.append(exc)
    finally:
        scope.cancel()


def status_of(head: bytes) -> tuple[int, str, dict[str, str]]:
    """The status code (0: none), its description and the headers of a header block."""
    lines = head.decode(errors="replace").split("\r\n")
    first = lines[0].split(None, 2)
    code = int(first[1]) if len(first) > 1 and first[1].isdigit() else 0
    headers = {}
    for line in lines[1:]:
        key, sep, value = line.partition(":")
        if sep:
            headers[key.strip()] = value.strip()
    return code, first[2] if len(first) > 2 else "", headers


def _reply(head: bytes, body: bytes) -> dict | None:
    """A request's reply: its JSON, or an ``error`` for a status (503: no responders); None
    for anything unreadable."""
    if head:
        code, description, _ = status_of(head)
        if code:
            return {"error": {"code": code, "description": description}}
    try:
        reply = json.loads(body)
    except ValueError:
        return None
    return reply if isinstance(reply, dict) else None


class _Reader:
    """Lines and sized bodies of the NATS protocol from a trio stream."""

    __slots__ = ("stream", "buf")

    def __init__(self, stream):
        self.stream = stream
        self.buf = bytearray()

    async def _more(self) -> None:
        data = await self.stream.receive_some(65536)
        if not data:
            raise EOFError("connection closed by the server")
        self.buf += data

    async def line(self) -> bytes:
        while True:
            end = self.buf.find(b"\r\n")
            if end >= 0:
                line = bytes(self.buf[:end])
                del self.buf[:end + 2]
                return line
            if len(self.buf) > 1 << 20:
                raise ValueError("a protocol line longer than 1 MiB")
            await self._more()

    async def exact(self, n: int) -> bytes:
        while len(self.buf) < n + 2:
            await self._more()
        body = bytes(self.buf[:n])
        del self.buf[:n + 2]
        return body
