"""The extended attributes the mount reports (read-only; SPEC §6, §9).

The root reports the mount's own state; a session folder its manifest's status and counts
(and, in cluster mode, how stale its replica is); ``events.jsonl`` and its session folder
the reason of the session's last refused line in this server, ``user.memfs.last_error``
(``getfattr -n user.memfs.last_error sessions/s``).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from memfs.fs.nodes import K, Node
from memfs.store import rescanner

if TYPE_CHECKING:
    from memfs.fs.ops import Operations


class Xattrs:
    """The attributes of the nodes of one mount."""

    def __init__(self, ops: Operations):
        self.ops = ops  # its cluster, NATS connection and warm-up count are set at mount

    def of(self, node: Node) -> dict[bytes, bytes]:
        """``{name: value}`` of ``node`` now."""
        if node.kind is K.ROOT:
            return self._mount()
        if node.kind is K.EVENTS:  # where a refused write went: its reason there too
            reason = self.ops.tree.session(node).writes.last_refusal
            return {} if reason is None else {b"user.memfs.last_error": reason.encode()}
        if node.kind is not K.SESSION:
            return {}
        return self._session(node)

    def _mount(self) -> dict[bytes, bytes]:
        """The mount's own state (the root's attributes)."""
        ops = self.ops
        values = {b"user.memfs.store": os.fsencode(os.path.abspath(ops.store.root)),  # MCP --mount lists from its catalog
                  b"user.memfs.writes_gated": str(ops.gate.gated).encode(),  # memfs.fs.gate
                  b"user.memfs.background_waits": str(ops.pacer.waits).encode(),  # memfs.pace
                  b"user.memfs.background_waited_ms": str(ops.pacer.waited_ns // 1_000_000).encode(),
                  b"user.memfs.attr_ticked": str(ops.ticks.ticked).encode(),  # memfs.fs.ticks
                  b"user.memfs.attr_unticked": str(ops.ticks.unticked).encode(),
                  b"user.memfs.attr_tick_sessions": str(ops.ticks.sessions).encode()}
        if ops.warm_pending is not None:
            values[b"user.memfs.warm_pending"] = str(ops.warm_pending).encode()
        counters = getattr(ops.searcher, "counters", None)  # the root search (memfs.search.searcher)
        if counters is not None:
            for name, value in counters().items():  # root_queries, checked_last, loaded, saves, …
                values[b"user.memfs.search_" + name.encode()] = str(value).encode()
        helper = rescanner.current()  # the mount's: large logs' rescans in its process
        if helper is not None:
            values[b"user.memfs.helper_rescans"] = str(helper.rescans).encode()
        if ops.cluster is not None:
            values.update(self._cluster())
        return values

    def _cluster(self) -> dict[bytes, bytes]:
        """The mount's cluster state (memfs mounts)."""
        cluster, nats = self.ops.cluster, self.ops.nats
        return {b"user.memfs.cluster": cluster.describe().encode(),
                b"user.memfs.cluster_lag": f"{cluster.lag():.3f}".encode(),
                # the follower: the checkpoint it resumed after, and what it delivered since
                b"user.memfs.cluster_resumed_after": str(cluster.resumed_after).encode(),
                b"user.memfs.cluster_delivered": str(cluster.delivered_count).encode(),
                # delivered messages waiting for the applier (bounded by [cluster] backlog)
                b"user.memfs.cluster_backlog": str(cluster.backlog()).encode(),
                # the event loop's own connection: the server it speaks to (- : none now),
                # and how many appends it published
                b"user.memfs.cluster_direct": ((nats and nats.connected_url) or "-").encode(),
                b"user.memfs.cluster_direct_appends": str(cluster.fast_appends).encode()}

    def _session(self, node: Node) -> dict[bytes, bytes]:
        session = self.ops.tree.session(node)
        m = session.manifest
        values = {
            b"user.memfs.status": m["status"],
            b"user.memfs.turn_count": str(m["turn_count"]),
            b"user.memfs.event_count": str(m["event_count"]),
            b"user.memfs.updated_at": m["updated_at"],
        }
        if session.writes.last_refusal is not None:
            values[b"user.memfs.last_error"] = session.writes.last_refusal
        cluster = self.ops.cluster
        if cluster is not None:  # SPEC §9: how stale this host's replica is, and where it is
            values[b"user.memfs.cluster_lag"] = f"{cluster.lag():.3f}"
            values[b"user.memfs.cluster_seq"] = str(cluster.seq_of(node.session))
        return {k: v.encode() for k, v in values.items()}
