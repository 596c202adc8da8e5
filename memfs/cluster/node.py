"""One mount's membership in the cluster (SPEC §9): fenced publishes, the follower, catch-up.

:class:`ClusterNode` is what the filesystem holds; it is made of

* a :class:`~memfs.cluster.join.Link` — the *NATS thread*: an asyncio loop with the
  ``nats-py`` connection (the stream's creation, batches, catch-up, the publishes of the worker
  path); other threads hand it coroutines and wait for their results with a deadline;
* a :class:`~memfs.cluster.replica.Replicas` — each session's last applied sequence, its
  sidecar ``index/cluster.json``, and the one local commit of a stream line;
* a :class:`~memfs.cluster.publish.Publisher` — the *writer's* side: publish with the fence,
  then commit; atomic batches; catch-up after a fence refusal; sessions written before
  cluster mode;
* an :class:`~memfs.cluster.apply.Applier` — the follower's side: the *applier* thread and the
  host-wide checkpoint.

The *event loop* (trio, serving FUSE) has a NATS connection of its own
(:mod:`memfs.cluster.wire`): it publishes one whole line per ``write()`` and commits it once
acknowledged (:meth:`ClusterNode.claim_fast` … :meth:`ClusterNode.finish_fast`), and runs the
follower (:mod:`memfs.cluster.follow`), which hands every stream message to
:meth:`ClusterNode.delivered`. The trio loop never waits for the network.
"""

from __future__ import annotations

import threading

from memfs.cluster import ClusterConfig, redact
from memfs.cluster.apply import Applier
from memfs.cluster.auth import Credentials
from memfs.cluster.join import Link
from memfs.cluster.publish import Publisher
from memfs.cluster.replica import ClusterError, Replica, Replicas
from memfs.cluster.trust import new_host_id
from memfs.errors import ValidationError
from memfs.store.config import check_line_size


class ClusterNode:
    """The cluster side of one mount over ``store`` (a :class:`memfs.store.root.Store`)."""

    def __init__(self, store, config: ClusterConfig, host_id: str | None = None):
        self.store = store
        self.config = config
        self.auth = Credentials.load(config)  # what both connections present (files checked now)
        self.host_id = host_id or new_host_id()  # unique per start (memfs.cluster.trust)
        self.link = Link(config, self.auth, self.host_id)
        self.replicas = Replicas(store, config)
        self.applier = Applier(store, config, self.replicas)
        self.publisher = Publisher(self.link, self.replicas, self.applier, self.host_id)

    # --- life ------------------------------------------------------------------------------

    def start(self) -> ClusterNode:
        """Connect, make sure the stream exists, start following; raise when the cluster
        cannot be reached within the timeout."""
        try:
            self.link.start()
        except BaseException:
            self.stop()
            raise
        self.applier.resume(self.link.stream_created, self.link.last_seq)
        self.applier.start(self.publisher.ready)
        threading.Thread(target=self.publisher.publish_local_sessions, name="memfs-cluster-publish",
                         daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop following and close the connection (what is applied stays applied)."""
        self.publisher.stopping = True
        self.applier.stop()
        self.link.close()

    # --- what the filesystem shows ---------------------------------------------------------

    @property
    def max_line(self) -> int:
        """The longest line the servers take (set on connect)."""
        return self.link.max_line

    @property
    def limit_name(self) -> str:
        """Where :attr:`max_line` comes from, for the reason of a refusal."""
        return self.link.limit_name

    @property
    def resumed_after(self) -> int:
        """The checkpoint the follower started after (0: from the start)."""
        return self.applier.resumed_after

    @property
    def delivered_count(self) -> int:
        """Messages the follower delivered since start."""
        return self.applier.delivered_count

    @property
    def fast_appends(self) -> int:
        """Lines published and committed on the event loop (:meth:`finish_fast`)."""
        return self.publisher.fast_appends

    def describe(self) -> str:
        """``stream MEMFS on nats://a:4222,…``: what the mount's root shows in ``user.memfs.cluster``."""
        return f"stream {self.config.stream} on {redact(','.join(self.config.servers))}"

    def lag(self) -> float:
        """Seconds this host's replica is behind the stream (:meth:`memfs.cluster.apply.Applier.lag`)."""
        return self.applier.lag()

    def seq_of(self, name: str) -> int:
        """The last stream sequence applied to session ``name`` on this host (0: none); never waits."""
        return self.replicas.seq_of(name)

    # --- the follower's side (memfs.cluster.follow) ----------------------------------------

    @property
    def delivered_seq(self) -> int:
        """The last stream sequence the follower delivered."""
        return self.applier.delivered_seq

    @delivered_seq.setter
    def delivered_seq(self, seq: int) -> None:
        self.applier.delivered_seq = seq

    @property
    def disconnected_at(self) -> float | None:
        """When the follower stopped (None: following)."""
        return self.applier.disconnected_at

    @disconnected_at.setter
    def disconnected_at(self, when: float | None) -> None:
        self.applier.disconnected_at = when

    def delivered(self, name: str, seq: int, data: bytes, pending: int, timestamp: float) -> None:
        """The follower delivered stream message ``seq`` of session ``name``
        (:meth:`memfs.cluster.apply.Applier.delivered`)."""
        self.applier.delivered(name, seq, data, pending, timestamp)

    def backlog(self) -> int:
        """Delivered messages waiting for the applier."""
        return self.applier.backlog()

    def wait_applied(self, seq: int, timeout: float) -> bool:
        """For tools and tests: wait until the follower applied stream sequence ``seq``."""
        return self.applier.wait_applied(seq, timeout)

    # --- the writer's side (memfs.cluster.publish) -----------------------------------------

    def session(self, handle) -> ClusterSession:
        """What a writer of ``handle``'s session appends through (see :class:`ClusterSession`)."""
        return ClusterSession(self, handle)

    def append(self, name: str, records: list) -> int:
        """Publish ``records`` of session ``name`` with the fence and commit them
        (:meth:`memfs.cluster.publish.Publisher.append`; a worker thread, never the trio loop)."""
        return self.publisher.append(name, records)

    def claim_fast(self, name: str) -> Replica | None:
        """:meth:`memfs.cluster.publish.Publisher.claim_fast` (the event loop's single line)."""
        return self.publisher.claim_fast(name)

    def fast_request(self, rep: Replica, line: bytes) -> tuple[str, bytes, float, dict[str, str]]:
        """:meth:`memfs.cluster.publish.Publisher.fast_request`."""
        return self.publisher.fast_request(rep, line)

    def finish_fast(self, rep: Replica, handle, record, ack: dict | None) -> bool:
        """:meth:`memfs.cluster.publish.Publisher.finish_fast` (releases the claim whatever happened)."""
        return self.publisher.finish_fast(rep, handle, record, ack)


class ClusterSession:
    """What :class:`memfs.store.appender.LineAppender` writes through in cluster mode: the
    session handle's validation and refusal record, with commits published first (the
    :class:`~memfs.store.appender.AppendTarget` of its writes; ``sync`` has no effect: a
    published line's commit is never deferred)."""

    __slots__ = ("node", "handle")

    def __init__(self, node: ClusterNode, handle):
        self.node = node
        self.handle = handle

    @property
    def name(self) -> str:
        return self.handle.name

    def validate(self, line: bytes):
        """The session's validation, and no line longer than the servers take (``EFBIG``)."""
        node = self.node
        if len(line) > node.max_line:
            check_line_size(len(line), node.max_line, node.limit_name)
        return self.handle.writes.validate(line)

    def reject(self, line: bytes, error, *, pid=None) -> None:
        self.handle.writes.reject(line, error, pid=pid)

    def append(self, line: bytes, pid=None, *, sync: bool = True) -> None:
        try:
            record = self.validate(line)
        except ValidationError as exc:
            self.handle.writes.reject(line, exc, pid=pid)
            raise
        self.append_records([record])

    def append_records(self, records, *, sync: bool = True) -> int:
        try:
            return self.node.append(self.handle.name, list(records))
        except ClusterError as exc:
            self.handle.writes.note_failure(exc.strerror or str(exc))  # the writer's reason (user.memfs.last_error)
            raise
