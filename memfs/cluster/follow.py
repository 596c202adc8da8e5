"""The follower: every message of the stream, in order, on the event loop's connection.

Each host follows ``memfs.>`` with an *ordered push consumer* — ephemeral, in memory, one
replica, no acknowledgements, flow control and idle heartbeats — the kind ``nats-py`` makes
with ``ordered_consumer=True``, spoken here over :class:`memfs.cluster.wire.Connection` on the
trio loop, so that this host's own lines (delivered back to it like everyone else's) cost no
other thread a wake-up. It starts after the last stream sequence this host has
(:attr:`ClusterNode.delivered_seq`: the host-wide checkpoint at start) and hands each message
to :meth:`ClusterNode.delivered`, which skips this host's own lines and queues the others for
the applier thread.

Order is kept as ``nats-py`` keeps it: each delivery names its consumer sequence; a gap (a
message lost on the way), a heartbeat naming another last consumer sequence, or two heartbeat
periods without a word make a new consumer starting after the last stream sequence delivered
(under a new delivery subject: the old consumer's late messages are not taken). A new
connection (after the old one was lost) does the same. Flow-control requests are answered
as soon as read — every message before them is handled by then — unless more than the
``[cluster] backlog`` of delivered messages wait for the applier: then the answer waits until
half of them are applied, and the server pauses delivery meanwhile (its next heartbeats say
the consumer is stalled; that is answered the same way). Catching up a long stream so takes
bounded memory, not the stream's size.
"""

from __future__ import annotations

import json
import logging
import os
import time

import trio

from memfs.cluster import SUBJECT_PREFIX
from memfs.cluster.wire import Connection, status_of

log = logging.getLogger("memfs.cluster")

HEARTBEAT = 2.0  # seconds between the consumer's idle heartbeats
RELEASE_EVERY = 0.02  # seconds between looks at the applier's backlog while flow control is held
RETRY = 0.5  # seconds between attempts to make the consumer (no stream leader yet, no quorum)
MAKE_TIMEOUT = 2.0  # seconds one attempt waits for the stream's answer


class Follower:
    """The ordered consumer of the stream for one :class:`~memfs.cluster.node.ClusterNode`."""

    def __init__(self, conn: Connection, node, heartbeat: float = HEARTBEAT):
        self.conn = conn
        self.node = node
        self.heartbeat = heartbeat
        self.consumers = 0  # consumers made (the first, then one per reset or reconnection)
        self._sid: bytes | None = None
        self._cseq = 0  # the last consumer sequence delivered by the current consumer
        self._active = False
        self._reset = trio.Event()
        self._held: list[bytes] = []  # flow-control answers held while the applier's backlog is full
        self._holding = trio.Event()  # set while answers are held
        self.paused = 0  # times delivery was paused for the applier
        self.stalled = 0  # heartbeats that said the server waits for a flow-control answer
        conn.on_connect.append(self.follow)
        conn.on_lost.append(self._lost)

    def _lost(self) -> None:
        self._sid = None
        if self.node.disconnected_at is None:
            self.node.disconnected_at = time.time()

    async def follow(self) -> None:
        """Run for one connection: make the consumer, remake it when order is lost, and
        answer held flow-control requests once the applier caught up."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._release_flow)
            await self._consume()
            nursery.cancel_scope.cancel()

    async def _release_flow(self) -> None:
        """While answers are held, look at the applier's backlog every :data:`RELEASE_EVERY`
        seconds; send them once half of it is applied (idle otherwise)."""
        while True:
            await self._holding.wait()
            await trio.sleep(RELEASE_EVERY)
            if self._held and self.node.backlog() > self.node.config.backlog // 2:
                continue
            held, self._held = self._held, []
            self._holding = trio.Event()
            for subject in held:
                self.conn.publish(subject)

    def _answer_flow(self, subject: bytes) -> None:
        if self._held or self.node.backlog() > self.node.config.backlog:
            if not self._held:
                self.paused += 1
                self._holding.set()
            if subject not in self._held:
                self._held.append(subject)
        else:
            self.conn.publish(subject)

    async def _consume(self) -> None:
        while True:
            self._reset = trio.Event()
            if not await self._make():
                await trio.sleep(RETRY)
                continue
            while not self._reset.is_set():
                self._active = False
                with trio.move_on_after(self.heartbeat * 2):
                    await self._reset.wait()
                if not self._active and not self._reset.is_set():
                    log.info("cluster: follower: no heartbeat for %g s: a new consumer after sequence %d",
                             self.heartbeat * 2, self.node.delivered_seq)
                    break

    async def _make(self) -> bool:
        """A new consumer after the last delivered sequence; False when the stream refused it."""
        conn, node = self.conn, self.node
        self._held.clear()  # the old consumer's (also after a reconnection: a new one asks anew)
        if self._sid is not None:
            conn.unsubscribe(self._sid)
        deliver = b"_INBOX." + os.urandom(11).hex().encode()
        self._sid = sid = conn.subscribe(deliver, self._message)
        self._cseq = 0
        start = node.delivered_seq + 1
        config = {"deliver_subject": deliver.decode(), "filter_subject": SUBJECT_PREFIX + ">",
                  "deliver_policy": "by_start_sequence", "opt_start_seq": start, "ack_policy": "none",
                  "max_deliver": 1, "flow_control": True, "idle_heartbeat": int(self.heartbeat * 1e9),
                  "mem_storage": True, "num_replicas": 1, "replay_policy": "instant"}
        request = json.dumps({"stream_name": node.config.stream, "config": config}).encode()
        # a short wait, tried again: a stream electing a leader may not answer at all for a while
        reply = await conn.request(f"$JS.API.CONSUMER.CREATE.{node.config.stream}", request,
                                   min(MAKE_TIMEOUT, node.config.timeout))
        if reply is None or "error" in reply:
            log.debug("cluster: follower: consumer not made: %s", reply and reply.get("error"))
            if self._sid == sid:
                conn.unsubscribe(sid)
                self._sid = None
            return False
        self.consumers += 1
        self._active = True
        node.disconnected_at = None
        log.debug("cluster: following stream %s from sequence %d", node.config.stream, start)
        return True

    def _message(self, subject: bytes, reply: bytes, head: bytes, body: bytes) -> None:
        """One delivery of the current consumer (on the receive loop: never waits)."""
        self._active = True
        if head and head[8:10] != b"\r\n":  # "NATS/1.0 100 …": a status, not a message's headers
            code, description, headers = status_of(head)
            if code == 100:  # a heartbeat or a flow-control request
                if reply:  # flow control: every message before it is handled
                    self._answer_flow(reply)
                stalled = headers.get("Nats-Consumer-Stalled")
                if stalled:
                    self.stalled += 1
                    self._answer_flow(stalled.encode())
                last = headers.get("Nats-Last-Consumer")
                if last is not None and last.isdigit() and int(last) != self._cseq:
                    self._lost_order(f"the heartbeat names consumer sequence {last}, {self._cseq} was delivered")
                return
            if code:
                log.debug("cluster: follower: status %d %s", code, description)
                return
        fields = reply.split(b".")
        if len(fields) == 9:  # $JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<ns>.<pending>
            at = 2
        elif len(fields) >= 11:  # with a domain and an account hash before the stream
            at = 4
        else:
            return
        seq, cseq = int(fields[at + 3]), int(fields[at + 4])
        if cseq != self._cseq + 1:
            self._lost_order(f"consumer sequence {cseq} after {self._cseq}")
            return
        self._cseq = cseq
        try:
            # (a subject that is not UTF-8 gives a name the applier refuses: skipped, in one log line)
            self.node.delivered(subject.decode(errors="replace")[len(SUBJECT_PREFIX):], seq, body, int(fields[at + 6]),
                                int(fields[at + 5]) / 1e9)
        except Exception:  # never the connection's end
            log.exception("cluster: follower: stream message %d", seq)

    def _lost_order(self, why: str) -> None:
        log.info("cluster: follower: %s: a new consumer after sequence %d", why, self.node.delivered_seq)
        if self._sid is not None:
            self.conn.unsubscribe(self._sid)  # nothing more of this consumer is taken
            self._sid = None
        self._reset.set()
