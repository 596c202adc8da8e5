"""The follower's side of a mount in cluster mode (SPEC §9): what the follower
(:mod:`memfs.cluster.follow`, an ordered consumer on ``memfs.>`` from the checkpoint or the
stream's first message) delivers is applied here, in stream order, by the *applier* thread;
a line this host already applied (its own, or caught up) is skipped by its sequence, on the
event loop, without waking that thread.

What the stream brings is checked first (:mod:`memfs.cluster.trust`,
:class:`memfs.cluster.replica.Replicas`); a message that cannot be applied is passed, and the
follower moves past it.

The host-wide checkpoint ``.memfs-cluster.json`` in the store's root records the stream
sequence up to which every message is applied here, so a restarted host follows from there.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable

from memfs.cluster.replica import Replica, Replicas, UntrustedName
from memfs.errors import AlreadyExists, NotFound, SymlinkRefused

log = logging.getLogger("memfs.cluster")

CHECKPOINT = ".memfs-cluster.json"  # in the store's root: not a session (a file)
CHECKPOINT_EVERY = 1.0  # seconds between checkpoint writes while lines are applied


class Applier:
    """The applier thread, its inbox, and what the mount shows of the lag and the checkpoint."""

    def __init__(self, store, config, replicas: Replicas):
        self.store = store
        self.config = config
        self.replicas = replicas
        self._inbox: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="memfs-cluster-apply", daemon=True)
        self._ready: Callable[[Replica], None] = replicas.load
        self._stopping = False
        # lag: what the follower has seen of the stream and what is applied
        self.delivered_seq = 0  # the last stream sequence the follower delivered
        self.applied_seq = 0  # the last stream sequence the applier finished
        self.pending = 0  # messages the stream holds beyond the last delivered one
        self.oldest_unapplied: float | None = None  # when the oldest queued message arrived
        self.disconnected_at: float | None = time.time()  # when the follower stopped (here: not started yet)
        # the host-wide checkpoint: every stream message up to ``checkpointed`` is applied here
        self.resumed_after = 0  # the checkpoint the follower started after (0: from the start)
        self.delivered_count = 0  # messages the follower delivered since start
        self.checkpointed = 0
        self._checkpoint_limit: int | None = None  # a message that failed to apply: never checkpoint past it
        self.held: set[int] = set()  # the first delivery each session holds (Replica.held)
        self._checkpoint_at = 0.0
        self._stream_created = ""

    # --- life ------------------------------------------------------------------------------

    def resume(self, stream_created: str, last_seq: int) -> None:
        """After the join: follow from the checkpoint of this stream (``stream_created``: its
        creation time; ``last_seq``: its last sequence)."""
        self._stream_created = stream_created
        start = self._read_checkpoint(last_seq)
        self.resumed_after = self.applied_seq = self.delivered_seq = self.checkpointed = start
        if start:
            log.info("cluster: following stream %s after the checkpoint, sequence %d", self.config.stream, start)

    def start(self, ready: Callable[[Replica], None]) -> None:
        """Start the applier thread; ``ready(rep)`` readies a replica before its first line
        (under its lock: it may publish the session's local lines)."""
        self._ready = ready
        self._thread.start()

    def stop(self) -> None:
        """Stop the applier thread and write the checkpoint."""
        self._stopping = True
        self._inbox.put(None)
        if self._thread.is_alive():
            self._thread.join(10)
        if self._stream_created:
            self.write_checkpoint(force=True)

    # --- deliveries ------------------------------------------------------------------------

    def delivered(self, name: str, seq: int, data: bytes, pending: int, timestamp: float) -> None:
        """The follower (:mod:`memfs.cluster.follow`, on the event loop) delivered stream
        message ``seq`` of session ``name``, with ``pending`` more in the stream after it, stored
        at ``timestamp``: skip it when this host has it (its own line, committed by its writer),
        hold it when the event loop awaits the ack of a line of that session (it is most likely
        that line, delivered before its ack: :meth:`release` then skips or queues it), else
        queue it for the applier thread."""
        self.delivered_seq = seq
        self.delivered_count += 1
        self.pending = pending
        if self._inbox.empty():  # this host's own line, committed by its writer: no hop to the applier
            rep = self.replicas.by_name.get(name)
            if rep is not None and rep.seq is not None:
                if seq <= rep.seq:
                    self.applied_seq = seq
                    if pending == 0:
                        self.oldest_unapplied = None
                    return
                if rep.held is not None:  # the event loop awaits the ack of a line of it: ours, most likely
                    if not rep.held:
                        self.held.add(seq)
                    rep.held.append((seq, data, pending, timestamp))
                    return
        self._queue(name, seq, data, pending, timestamp)

    def release(self, rep: Replica) -> None:
        """The event loop's publish of a line of ``rep`` ended (its lock released): the
        deliveries held meanwhile are skipped when committed, else queued."""
        held, rep.held = rep.held, None
        if held:
            self.held.discard(held[0][0])
            for seq, data, pending, timestamp in held:
                if seq > rep.seq:  # another host's line (ours was refused): the applier's
                    self._queue(rep.name, seq, data, pending, timestamp)

    def backlog(self) -> int:
        """Delivered messages waiting for the applier."""
        return self._inbox.qsize()

    def _queue(self, name: str, seq: int, data: bytes, pending: int, timestamp: float) -> None:
        if self.oldest_unapplied is None:
            self.oldest_unapplied = timestamp
        self._inbox.put((name, seq, data, pending))

    def _run(self) -> None:
        while True:
            try:
                item = self._inbox.get(timeout=CHECKPOINT_EVERY)
            except queue.Empty:  # idle (or only this host's own lines, which skip this thread)
                self.write_checkpoint()
                continue
            if item is None or self._stopping:
                return
            name, seq, data, pending = item
            try:
                rep = self.replicas.get(name)
                with rep.lock:
                    self._ready(rep)
                    self.replicas.commit(rep, seq, data, create=True)
            except UntrustedName as exc:  # no session: nothing to record it in
                log.warning("cluster: stream message %d skipped: %s", seq, exc.problem)
            except (NotFound, AlreadyExists, SymlinkRefused) as exc:  # the name is taken here by no session folder
                log.warning("cluster: session %s: stream message %d skipped: %s", name, seq, exc)
            except Exception:
                log.exception("cluster: session %s: applying stream message %d failed", name, seq)
                if self._checkpoint_limit is None:  # a restart delivers it again
                    self._checkpoint_limit = seq - 1
            self.applied_seq = seq
            if self._inbox.empty() and pending == 0:
                self.oldest_unapplied = None
            self.write_checkpoint()

    def wait_applied(self, seq: int, timeout: float) -> bool:
        """For tools and tests: wait until the follower applied stream sequence ``seq``."""
        deadline = time.monotonic() + timeout
        while self.applied_seq < seq:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def lag(self) -> float:
        """Seconds this host's replica is behind the stream: 0 when every delivered message is
        applied and the stream had nothing more; the age of the oldest unapplied one otherwise;
        since the disconnection while no server is reachable."""
        now = time.time()
        if self.disconnected_at is not None:
            return now - self.disconnected_at
        oldest = self.oldest_unapplied
        return 0.0 if oldest is None else now - oldest

    # --- the host-wide checkpoint ----------------------------------------------------------

    def _read_checkpoint(self, last_seq: int) -> int:
        """The sequence this store applied everything up to, for this stream — 0 when there is
        no checkpoint, it names another stream, or the stream was made anew since (its creation
        time differs, or it holds fewer messages than the checkpoint)."""
        try:
            data = json.loads((self.store.root / CHECKPOINT).read_bytes())
        except (FileNotFoundError, ValueError):
            return 0
        seq = data.get("seq") if isinstance(data, dict) else None
        if (data.get("stream") != self.config.stream or data.get("created") != self._stream_created
                or not isinstance(seq, int) or not 0 <= seq <= last_seq):
            return 0
        return seq

    def write_checkpoint(self, force: bool = False) -> None:
        """Record ``applied_seq`` (applier thread, or stop): at most every
        :data:`CHECKPOINT_EVERY` seconds unless ``force``; atomically, never on the trio loop."""
        seq = self.applied_seq
        if self._checkpoint_limit is not None:
            seq = min(seq, self._checkpoint_limit)
        held = self.held.copy()  # (the event loop's set: a copy, then read)
        if held:  # a delivery held for an ack in flight is not applied yet
            seq = min(seq, min(held) - 1)
        now = time.monotonic()
        if seq <= self.checkpointed or (not force and now - self._checkpoint_at < CHECKPOINT_EVERY):
            return
        from memfs.store.paths import atomic_write

        data = json.dumps({"stream": self.config.stream, "created": self._stream_created, "seq": seq})
        try:
            atomic_write(self.store.root / CHECKPOINT, data.encode())
        except OSError as exc:  # the next one may succeed; a restart then replays a little more
            log.warning("cluster: checkpoint not written: %s", exc)
            return
        self.checkpointed, self._checkpoint_at = seq, now
