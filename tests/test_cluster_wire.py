"""The event loop's own NATS connection (:mod:`memfs.cluster.wire`) and the follower on it
(:mod:`memfs.cluster.follow`), driven on trio against a real three-node JetStream cluster,
without a mount (the mount's use of them is in test_cluster.py)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
import urllib.request
from contextlib import ExitStack

import pytest
import trio
from memfs.cluster import ClusterConfig
from memfs.cluster.follow import Follower
from memfs.cluster.testing import NatsCluster, free_ports, make_certs, nats_server_binary
from memfs.cluster.wire import Connection

from cluster import require
from mounting import event, mounted, needs_fuse
from test_cluster import delete_stream, nats_cluster, slow_cluster_again, stream_name  # noqa: F401 (fixture)

nats = require("nats")
from nats.js import api  # noqa: E402


@pytest.fixture
def stream(nats_cluster, request):
    """A stream of this test's own on the shared cluster (taking ``memfs.>``), deleted after it."""
    name = stream_name(request)
    try:
        make_stream(nats_cluster.urls, name)
        yield name
    finally:
        delete_stream(nats_cluster.urls, name)


def make_stream(urls: str, name: str) -> None:
    async def run():
        nc = await nats.connect(urls.split(","))
        js = nc.jetstream(timeout=10)
        try:  # (a cluster just started has no leader yet; the same config again is no error when
            # a request that timed out did go through)
            await slow_cluster_again(lambda: js.add_stream(api.StreamConfig(
                name=name, subjects=["memfs.>"], num_replicas=3, storage=api.StorageType.FILE,
                duplicate_window=120.0)))
        finally:
            await nc.close()

    asyncio.run(run())


def delete_consumers(urls: str, stream: str) -> int:
    async def run():
        nc = await nats.connect(urls.split(","))
        js = nc.jetstream(timeout=10)
        try:
            names = [c.name for c in await js.consumers_info(stream)]
            for name in names:
                await js.delete_consumer(stream, name)
            return len(names)
        finally:
            await nc.close()

    return asyncio.run(run())


async def until(predicate, what: str, timeout: float = 20.0):
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.01)


async def fenced(conn: Connection, subject: str, line: bytes, expected: int, msg_id: str | None = None):
    headers = {"Nats-Expected-Last-Subject-Sequence": str(expected), "Nats-Msg-Id": msg_id or f"{subject}:{expected}"}
    return await conn.request(subject, line, 5.0, headers)


async def publish_until_acked(conn: Connection, subject: str, line: bytes, expected: int) -> dict:
    """A stream just made (or a leader just elected) may answer 503 or a no-leader error for
    a moment: asked again until it acknowledges."""
    with trio.fail_after(30):
        while True:
            ack = await fenced(conn, subject, line, expected)
            if ack is not None and "error" not in ack:
                return ack
            await trio.sleep(0.1)


class Node:
    """What the follower hands messages to: here, a list (a ClusterNode applies them); its
    applier's backlog is empty, or full while ``full`` is set."""

    def __init__(self, stream: str, backlog: int = 10_000):
        self.config = ClusterConfig(servers=[], stream=stream, timeout=5, backlog=backlog)
        self.delivered_seq = 0
        self.disconnected_at = time.time()
        self.seen: list[tuple[str, int, bytes]] = []
        self.full = False

    def backlog(self) -> int:
        return self.config.backlog + 1 if self.full else 0

    def delivered(self, name, seq, data, pending, timestamp):
        self.delivered_seq = seq
        self.seen.append((name, seq, data))


def test_publish_requests_acks_fences_duplicates_and_refusals(nats_cluster, stream):

    async def main():
        conn = Connection(nats_cluster.urls.split(","))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conn.run)
            await until(lambda: conn.ready, "connected")
            assert conn.connected_url == nats_cluster.urls.split(",")[0]
            first = await publish_until_acked(conn, "memfs.s", b'{"n":1}', 0)
            assert first["stream"] == stream and first["seq"] >= 1
            # the same publish again (an ack lost and retried): stored once
            again = await fenced(conn, "memfs.s", b'{"n":1}', 0)
            assert again["seq"] == first["seq"] and again.get("duplicate") is True
            # a stale fence: refused with 10071, nothing stored
            stale = await fenced(conn, "memfs.s", b'{"n":2}', 0, msg_id="other")
            assert stale["error"]["err_code"] == 10071
            second = await fenced(conn, "memfs.s", b'{"n":2}', first["seq"])
            assert second["seq"] == first["seq"] + 1
            # a subject no stream takes: a 503 status, at once
            t = time.monotonic()
            nobody = await conn.request("nostream.x", b"x", 5.0, {"Nats-Msg-Id": "x"})
            assert nobody["error"]["code"] == 503 and time.monotonic() - t < 2
            # larger than the server takes: not sent (the worker path refuses it with a reason)
            assert await conn.request("memfs.s", b"x" * (conn.max_payload + 1), 5.0) is None
            # on_reply runs with the reply, and what it returns is the result
            seen = []
            result = await conn.request("memfs.s", b'{"n":3}', 5.0, {"Nats-Expected-Last-Subject-Sequence":
                                                                     str(second["seq"])},
                                        on_reply=lambda reply: seen.append(reply) or "committed")
            assert result == "committed" and seen[0]["seq"] == second["seq"] + 1
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_follower_delivers_every_message_once_in_order_across_a_lost_consumer(nats_cluster, stream):
    n = 200

    async def main():
        conn = Connection(nats_cluster.urls.split(","))
        node = Node(stream)
        follower = Follower(conn, node, heartbeat=0.5)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conn.run)
            await until(lambda: follower.consumers == 1, "the consumer made")
            assert node.disconnected_at is None  # following: no lag from a disconnection
            last = {0: 0, 1: 0, 2: 0}  # each subject's last sequence: the fence of its next publish
            seq = 0
            for i in range(n // 2):
                seq = last[i % 3] = (await publish_until_acked(conn, f"memfs.s{i % 3}", json.dumps({"i": i}).encode(),
                                                               last[i % 3]))["seq"]
            await until(lambda: node.delivered_seq == seq, "the first half delivered")
            # the consumer is deleted under it: no heartbeat, so a new one after the last delivered
            await trio.to_thread.run_sync(delete_consumers, nats_cluster.urls, stream)
            await until(lambda: follower.consumers == 2, "a new consumer")
            for i in range(n // 2, n):
                seq = last[i % 3] = (await publish_until_acked(conn, f"memfs.s{i % 3}", json.dumps({"i": i}).encode(),
                                                               last[i % 3]))["seq"]
            await until(lambda: node.delivered_seq == seq, "the second half delivered")
            nursery.cancel_scope.cancel()
        seqs = [s for _, s, _ in node.seen]
        assert seqs == sorted(set(seqs)) and len(seqs) == n  # each once, in stream order
        assert [json.loads(d)["i"] for _, _, d in node.seen] == list(range(n))
        assert [name for name, _, _ in node.seen] == [f"s{i % 3}" for i in range(n)]

    trio.run(main)


def test_follower_pauses_delivery_while_the_applier_backlog_is_full(nats_cluster, stream):
    n, size = 2400, 16_000  # 38 MB: more than the server sends before asking for flow control

    async def main():
        conn = Connection(nats_cluster.urls.split(","))
        node = Node(stream, backlog=100)
        node.full = True
        follower = Follower(conn, node, heartbeat=0.5)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conn.run)
            await until(lambda: follower.consumers == 1, "following")

            async def publish(k: int) -> None:  # one of 32 publishers, each to its own subject
                for i in range(k, n, 32):
                    with trio.fail_after(30):
                        while not (ack := await conn.request(f"memfs.p{k}", i.to_bytes(4, "big") * (size // 4), 5.0,
                                                             {"Nats-Msg-Id": f"p{i}"})) or "error" in ack:
                            await trio.sleep(0.1)

            async with trio.open_nursery() as publishers:
                for k in range(32):
                    publishers.start_soon(publish, k)
            # the server waits for the flow-control answer: its heartbeats say the consumer is stalled
            await until(lambda: follower.stalled >= 1, "a stalled heartbeat")
            assert follower.paused >= 1 and len(node.seen) < n
            node.full = False  # the applier caught up: the held answer goes, delivery resumes
            await until(lambda: len(node.seen) == n, "every message", 60)
            nursery.cancel_scope.cancel()
        seqs = [s for _, s, _ in node.seen]
        assert seqs == sorted(set(seqs))

    trio.run(main)


def test_connection_moves_to_another_server_after_kill_9_and_the_follower_resumes(tmp_path, request):
    cluster = NatsCluster.started(tmp_path / "nats")  # its own: a server is killed
    try:
        stream = stream_name(request)
        make_stream(cluster.urls, stream)
        urls = cluster.urls.split(",")

        async def main():
            conn = Connection(urls)
            node = Node(stream)
            follower = Follower(conn, node, heartbeat=0.5)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(conn.run)
                await until(lambda: follower.consumers == 1, "following")
                first = await publish_until_acked(conn, "memfs.k", b'{"n":1}', 0)
                await until(lambda: node.delivered_seq == first["seq"], "delivered")
                assert conn.connected_url == urls[0]
                cluster.servers[0].kill()  # kill -9 of the server this connection is on
                t = time.monotonic()
                # a request meanwhile gets None (or a refusal) in bounded time, never hangs
                lost = await conn.request("memfs.k", b'{"n":2}', 2.0, {"Nats-Expected-Last-Subject-Sequence":
                                                                       str(first["seq"])})
                assert time.monotonic() - t < 3 and (lost is None or "error" in lost or lost["seq"] > first["seq"])
                await until(lambda: conn.ready and conn.connected_url != urls[0], "another server", 30)
                last = await publish_until_acked(conn, "memfs.k", b'{"n":3}',
                                                 lost["seq"] if lost and "seq" in lost else first["seq"])
                await until(lambda: node.delivered_seq == last["seq"], "following again", 30)
                # on a new consumer: the server may push its first messages before the reply to
                # the consumer's creation comes back, and the follower counts it at the reply
                await until(lambda: follower.consumers >= 2 and node.disconnected_at is None, "a new consumer", 10)
                nursery.cancel_scope.cancel()
            seqs = [s for _, s, _ in node.seen]
            assert seqs == sorted(set(seqs))  # no message twice, none out of order
            assert node.seen[0][2] == b'{"n":1}' and node.seen[-1][2] == b'{"n":3}'

        trio.run(main)
    finally:
        cluster.stop()


def wait_healthy(server: subprocess.Popen, http: int, log) -> None:
    """Until the single server listens with JetStream ready (its monitoring port is plain HTTP)."""
    deadline = time.monotonic() + 20
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/healthz?js-enabled-only=true", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        assert server.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)


def tls_files(d) -> tuple:
    """A CA and a certificate for 127.0.0.1 it signed (openssl), as PEM files."""
    certs = make_certs(d)
    return certs["ca"], certs["server_cert"], certs["server_key"]


@needs_fuse
def test_tls_server_carries_appends_and_following_on_both_connections(tmp_path, request):
    """``tls://``: the nats-py connection (the stream) and the event loop's (single appends,
    the follower) both verify the server against the trusted CAs (here SSL_CERT_FILE)."""
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make the test's certificates (apt install openssl)")
    ca, cert, key = tls_files(tmp_path)
    port, http = free_ports(2)
    log = open(tmp_path / "nats.log", "ab")
    server = subprocess.Popen([nats_server_binary(), "-js", "-a", "127.0.0.1", "-p", str(port), "-m", str(http),
                               "-sd", str(tmp_path / "js"), "--tls", "--tlscert", str(cert), "--tlskey", str(key)],
                              stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        wait_healthy(server, http, tmp_path / "nats.log")
        url = f"tls://127.0.0.1:{port}"
        config = tmp_path / "c.toml"
        config.write_text(f'[cluster]\nstream = "{stream_name(request)}"\ntimeout = 5\n')
        env = {"SSL_CERT_FILE": str(ca)}
        with ExitStack() as stack:
            a, b = (stack.enter_context(mounted(tmp_path / f"s{h}", tmp_path / h, "--cluster", url, "--config",
                                                str(config), env=env)) for h in "AB")
            deadline = time.monotonic() + 20
            while os.getxattr(a.mnt, "user.memfs.cluster_direct").decode() != url:  # its TLS handshake done
                assert time.monotonic() < deadline, "A's event-loop connection did not come up over TLS"
                time.sleep(0.02)
            os.mkdir(a.mnt / "sessions" / "t")
            lines = [event("thread.started", thread_id="t"), event("turn.started"),
                     *(event("item.completed", item={"id": f"m{i}", "type": "agent_message", "text": f"tls {i}"})
                       for i in range(20))]
            for line in lines:  # one write() each: the event loop's connection publishes them
                fd = os.open(a.mnt / "sessions" / "t" / "events.jsonl", os.O_WRONLY | os.O_APPEND)
                try:
                    os.write(fd, (line + "\n").encode())
                finally:
                    os.close(fd)
            assert os.getxattr(a.mnt, "user.memfs.cluster_direct").decode() == url
            # most went over it (a session's first line, which reads its cluster state, and a line
            # that finds the replica busy take a worker thread and nats-py's TLS connection)
            assert int(os.getxattr(a.mnt, "user.memfs.cluster_direct_appends")) >= len(lines) // 2
            b_log = b.store / "t" / "events.jsonl"
            deadline = time.monotonic() + 20
            while not (b_log.exists() and b_log.read_bytes() == (a.store / "t" / "events.jsonl").read_bytes()):
                assert time.monotonic() < deadline, "B did not follow A over TLS"
                time.sleep(0.02)
            assert len(b_log.read_bytes().splitlines()) == len(lines)
    finally:
        server.terminate()
        server.wait(10)
        log.close()


def test_credentials_in_the_url_authenticate_and_wrong_ones_are_refused_without_harm(tmp_path):
    """``nats://user:password@host:port``: the event loop's connection logs in with them (as
    nats-py does); with a wrong password it never connects, requests get None at once, and
    the connection keeps trying (the fast path is simply off)."""
    port, http = free_ports(2)
    log = open(tmp_path / "nats.log", "ab")
    server = subprocess.Popen([nats_server_binary(), "-js", "-a", "127.0.0.1", "-p", str(port), "-m", str(http),
                               "-sd", str(tmp_path / "js"), "--user", "agent", "--pass", "s3cr%t"],
                              stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        wait_healthy(server, http, tmp_path / "nats.log")

        async def main():
            good = Connection([f"nats://agent:s3cr%25t@127.0.0.1:{port}"])
            bad = Connection([f"nats://agent:wrong@127.0.0.1:{port}"])
            async with trio.open_nursery() as nursery:
                nursery.start_soon(good.run)
                nursery.start_soon(bad.run)
                await until(lambda: good.ready, "the good connection")
                # no stream takes the subject: a 503 reply proves the request went through
                reply = await good.request("nothing.here", b"x", 5.0, {"Nats-Msg-Id": "x"})
                assert reply["error"]["code"] == 503
                t = time.monotonic()
                assert await bad.request("nothing.here", b"x", 5.0) is None and time.monotonic() - t < 0.5
                assert not bad.ready and bad.connected_url is None
                nursery.cancel_scope.cancel()

        trio.run(main)
    finally:
        server.terminate()
        server.wait(10)
        log.close()
