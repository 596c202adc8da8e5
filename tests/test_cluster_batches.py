"""Cluster mode: batches (a ``write()`` of many lines) are published pipelined, as fenced
JetStream atomic batches, for real on a three-node cluster (SPEC §9, issue 17 item 2)."""

from __future__ import annotations

import asyncio
import json
import os

from cluster import require
from mounting import event
from test_cluster import hosts, lines_of, nats_cluster, on_both, session_on_both, stream_name, wait_for  # noqa: F401 (fixtures)

nats = require("nats")


def stream_headers(urls: str, stream: str, subject: str) -> list[dict]:
    """The headers of every message of ``subject`` in the stream, in stream order."""

    async def run():
        nc = await nats.connect(urls.split(","))
        js = nc.jetstream()
        out, seq = [], 0
        try:
            while True:
                try:
                    msg = await js.get_msg(stream, seq=seq + 1, subject=subject, next=True)
                except nats.js.errors.NotFoundError:
                    return out
                out.append(msg.headers or {})
                seq = msg.seq
        finally:
            await nc.close()

    return asyncio.run(run())


def item(tag: str, i: int) -> str:
    return event("item.completed", item={"id": f"{tag}{i}", "type": "agent_message", "text": f"{tag} line {i} " + "x" * 80})


def test_a_500_line_write_is_pipelined_in_order_on_both_hosts(hosts, nats_cluster, request):
    a, b = hosts
    os.mkdir(a.mnt / "sessions" / "big")
    body = "".join(line + "\n" for line in [event("thread.started", thread_id="t")] + [item("L", i) for i in range(499)])
    fd = os.open(a.mnt / "sessions" / "big" / "events.jsonl", os.O_WRONLY | os.O_APPEND)
    try:
        written = 0
        while written < len(body):  # the kernel may cut it in chunks; each chunk is one batch
            written += os.write(fd, body[written:].encode())
    finally:
        os.close(fd)
    a_log, b_log = a.store / "big" / "events.jsonl", b.store / "big" / "events.jsonl"
    assert a_log.read_text() == body  # acknowledged: on A's replica already, in order
    wait_for(lambda: len(lines_of(b_log)) == 500, what="B to apply the 500 lines")
    assert b_log.read_bytes() == a_log.read_bytes()
    # pipelined: the lines went as a few atomic batches, not 500 fenced round trips
    headers = stream_headers(nats_cluster.urls, stream_name(request), "memfs.big")
    assert len(headers) == 500
    batches = {h.get("Nats-Batch-Id") for h in headers}
    assert None not in batches and len(batches) <= 10
    fenced = [h for h in headers if "Nats-Expected-Last-Subject-Sequence" in h]
    assert len(fenced) == len(batches)  # each batch fenced by its first message


def test_concurrent_batches_from_two_hosts_do_not_diverge(hosts):
    a, b = hosts
    session_on_both(a, b, "cb")
    writes, per_write = 15, 20

    def writer(m, tag):
        fd = os.open(m.mnt / "sessions" / "cb" / "events.jsonl", os.O_WRONLY | os.O_APPEND)
        try:
            for w in range(writes):
                chunk = "".join(item(tag, w * per_write + i) + "\n" for i in range(per_write)).encode()
                assert os.write(fd, chunk) == len(chunk)  # one write() of 20 lines, taken whole
        finally:
            os.close(fd)

    on_both(writer, a, b)
    total = 1 + 2 * writes * per_write
    a_log, b_log = a.store / "cb" / "events.jsonl", b.store / "cb" / "events.jsonl"
    wait_for(lambda: len(lines_of(a_log)) == total and len(lines_of(b_log)) == total,
             what="both replicas to hold every line")
    assert a_log.read_bytes() == b_log.read_bytes()
    ids = [json.loads(line)["event"]["item"]["id"] for line in lines_of(a_log)[1:]]
    for tag in "AB":
        assert [i for i in ids if i[0] == tag] == [f"{tag}{i}" for i in range(writes * per_write)]  # once, in order
    # no host's line inside another host's write: each 20-line write is contiguous in the log
    for start in range(0, len(ids), per_write):
        assert len({i[0] for i in ids[start:start + per_write]}) == 1
