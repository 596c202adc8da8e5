"""One mount's membership in the cluster (SPEC §9): fenced publishes, the follower, catch-up.

Threads (the trio loop never waits for the network):

* the *NATS thread* runs an asyncio loop with the one ``nats-py`` connection; other threads
  hand it coroutines (:meth:`ClusterNode._call`) and wait for their results with a deadline;
* a *writer* — the filesystem's worker thread running a ``write()`` on ``events.jsonl`` —
  calls :meth:`ClusterNode.append`: for each validated record, publish to ``memfs.<session>``
  with ``Nats-Expected-Last-Subject-Sequence`` = the stream sequence of the last line of that
  session this host applied (0: none) and ``Nats-Msg-Id`` = ``<host id>:<session>:<that
  sequence>:<digest of the line>`` (:func:`msg_id`, deterministic: a retry of the same publish
  is stored once, two hosts never share an id, nor two lines of one host); once JetStream
  acknowledged it, commit the line to the local store through the store's one commit. A refusal for a wrong last sequence (err_code 10071) means another host
  appended first: catch up (fetch the session's messages after the last applied one and commit
  them), revalidate, publish again;
* the *applier* thread commits what the follower (an ordered consumer on ``memfs.>``, from
  the stream's first message) delivers: other hosts' lines, in stream order; a line this host
  already applied (its own, or caught up) is skipped by its sequence.

A per-session :class:`Replica` lock serializes the writer and the applier of one session on
this host; the session's own mutex is never held across a network wait (the store takes it
only inside each local commit).

The last applied sequence of each session is kept in ``index/cluster.json`` (rewritten in
place after each applied line: ``{"stream": …, "seq": N}``), so a restarted host resumes
there. A crash between the log's write and the sidecar's leaves the log one line ahead; the
first message after the sidecar's sequence is then compared with the log's last line, and
skipped when equal.

Host-wide checkpoint: ``<store>/.memfs-cluster.json`` (``{"stream", "created", "seq"}``) is the
stream sequence below which the follower applied everything (the applier handles messages in
stream order, so its last finished sequence is that mark). The applier rewrites it atomically
(temporary file, rename) when it falls idle, at most once a second, and :meth:`stop` writes it
last; the follower of a restarted host starts at ``seq + 1``
(``DeliverPolicy.BY_START_SEQUENCE``), so it reads only what it has not applied. A checkpoint
of another stream, or of an earlier stream of the same name (``created`` differs), is ignored.
It may lag what is applied (a crash between two rewrites): the messages after it are read
again and skipped by each session's sidecar sequence, as before.

Sessions written locally before cluster mode (a log, no sidecar): :meth:`ClusterNode.start`
publishes their lines, fenced from expected sequence 0, before following, so every host gets
them. When the stream already holds that subject (another host wrote a session of that name),
the local one is left alone, and local only: it is logged, the follower does not apply the
stream's lines to it, and appends to it fail with ``EEXIST`` (README, "Decisions the spec
leaves open").
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import logging
import os
import queue
import socket
import threading
import time
from pathlib import Path

import nats
from nats.js import api
from nats.js.errors import APIError, NotFoundError

from memfs.cluster import SUBJECT_PREFIX, ClusterConfig
from memfs.errors import AlreadyExists, NotFound, ValidationError
from memfs.store.paths import INDEX_DIR, EVENTS, open_nofollow

log = logging.getLogger("memfs.cluster")

WRONG_LAST_SEQUENCE = 10071
SIDECAR = "cluster.json"
SIDECAR_WIDTH = 96  # the sidecar is rewritten in place at a fixed width (one small pwrite)
MAX_FENCE_RETRIES = 100
CHECKPOINT = ".memfs-cluster.json"  # in the store's root: the host-wide checkpoint
CHECKPOINT_EVERY = 1.0  # seconds: the applier rewrites the checkpoint at most this often


def msg_id(host_id: str, session: str, expected: int, line: bytes) -> str:
    """The publish's ``Nats-Msg-Id``: host, session, fence and a digest of the line. A retry of
    the same line on the same fence is stored once; another line on the same fence never
    shares its id (an append that timed out may have been stored: the next line, published on
    the same stale fence, must be refused by the fence, not deduplicated into it)."""
    return f"{host_id}:{session}:{expected}:{hashlib.blake2b(line, digest_size=8).hexdigest()}"


class ClusterError(OSError):
    """The cluster could not take an append (``ETIMEDOUT``: no quorum or no server in time)."""


class Replica:
    """This host's view of one session's stream: the last applied sequence, and the lock
    that orders the writer and the applier on it."""

    __slots__ = ("name", "lock", "seq", "verify_tail")

    def __init__(self, name: str):
        self.name = name
        self.lock = threading.Lock()
        self.seq: int | None = None  # None: not read from the sidecar yet
        self.verify_tail = False


class ClusterNode:
    """The cluster side of one mount over ``store`` (a :class:`memfs.store.root.Store`)."""

    def __init__(self, store, config: ClusterConfig, host_id: str | None = None):
        self.store = store
        self.config = config
        self.host_id = host_id or f"{socket.gethostname()}.{os.getpid()}"
        self.replicas: dict[str, Replica] = {}
        self._replicas_lock = threading.Lock()
        self.loop = asyncio.new_event_loop()
        self.nc = None
        self.js = None
        self._thread = threading.Thread(target=self._run_loop, name="memfs-nats", daemon=True)
        self._inbox: queue.Queue = queue.Queue()
        self._applier = threading.Thread(target=self._apply_loop, name="memfs-cluster-apply", daemon=True)
        self._stopping = False
        # lag: what the follower has seen of the stream and what is applied
        self.delivered_seq = 0  # the last stream sequence the follower delivered
        self.applied_seq = 0  # the last stream sequence the applier finished
        self.pending = 0  # messages the stream holds beyond the last delivered one
        self.oldest_unapplied: float | None = None  # when the oldest queued message arrived
        self.disconnected_at: float | None = None
        self.fenced = 0  # publishes refused for a wrong last sequence (another host first)
        self.start_seq = 1  # where the follower started (the checkpoint + 1)
        self.received = 0  # messages the follower delivered since the start
        self.published_local: list[str] = []  # sessions written before cluster mode, published at start
        self.local_only: set[str] = set()  # ... and those the stream already had: left local
        self._stream_created = ""
        self._checkpointed = 0
        self._checkpoint_at = 0.0

    # --- life ------------------------------------------------------------------------------

    def start(self) -> ClusterNode:
        """Connect, make sure the stream exists, start following; raise when the cluster
        cannot be reached within the timeout."""
        self._thread.start()
        try:
            self._call(self._connect(), self.config.timeout * 2)
            self._call(self._publish_local_sessions(), None)  # (each publish has its own timeout)
            self._call(self._follow(), self.config.timeout * 2)
        except BaseException:
            self.stop()
            raise
        self._applier.start()
        return self

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def _call(self, coro, timeout: float):
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    async def _connect(self) -> None:
        async def disconnected():
            if self.disconnected_at is None:
                self.disconnected_at = time.time()
            log.warning("cluster: disconnected from NATS")

        async def reconnected():
            self.disconnected_at = None
            log.info("cluster: reconnected to %s", self.nc.connected_url.netloc if self.nc.connected_url else "?")

        async def error(exc):
            log.debug("cluster: %s", exc)

        self.nc = await nats.connect(self.config.servers, name=f"memfs {self.host_id}",
                                     connect_timeout=max(1, int(self.config.timeout)), max_reconnect_attempts=-1,
                                     reconnect_time_wait=0.25, disconnected_cb=disconnected,
                                     reconnected_cb=reconnected, error_cb=error)
        self.js = self.nc.jetstream(timeout=self.config.timeout)
        cfg = self.config
        try:
            info = await self.js.stream_info(cfg.stream)
        except NotFoundError:
            info = await self.js.add_stream(api.StreamConfig(
                name=cfg.stream, subjects=[SUBJECT_PREFIX + ">"], num_replicas=cfg.effective_replicas,
                storage=api.StorageType.FILE, duplicate_window=120.0, max_age=cfg.max_age or None,
                max_bytes=cfg.max_bytes or None, allow_direct=True))
            log.info("cluster: created stream %s (replicas %d)", cfg.stream, cfg.effective_replicas)
        self._stream_created = info.created.isoformat() if info.created else ""

    async def _follow(self) -> None:
        """Start the follower at the checkpoint + 1."""
        cfg = self.config
        self.applied_seq = self._checkpointed = self._read_checkpoint()
        self.start_seq = self.applied_seq + 1
        config = api.ConsumerConfig(deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=self.start_seq)
        await self.js.subscribe(SUBJECT_PREFIX + ">", cb=self._delivered, ordered_consumer=True, config=config,
                                idle_heartbeat=2.0, flow_control=True)
        log.info("cluster: following stream %s from sequence %d (checkpoint %d)", cfg.stream, self.start_seq,
                 self.start_seq - 1)

    # --- the host-wide checkpoint and sessions written before cluster mode ----------------

    def _read_checkpoint(self) -> int:
        try:
            data = json.loads((self.store.root / CHECKPOINT).read_bytes())
        except (FileNotFoundError, ValueError):
            return 0
        if (not isinstance(data, dict) or data.get("stream") != self.config.stream
                or data.get("created") != self._stream_created or not isinstance(data.get("seq"), int)):
            log.info("cluster: %s is of another stream: following from the first message", CHECKPOINT)
            return 0
        return max(0, data["seq"])

    def _write_checkpoint(self) -> None:
        """Rewrite the checkpoint atomically (the applier's thread, or :meth:`stop`)."""
        seq = self.applied_seq
        if seq == self._checkpointed or self.store.settings.read_only:
            return
        path = self.store.root / CHECKPOINT
        tmp = path.with_name(CHECKPOINT + ".tmp")
        data = json.dumps({"stream": self.config.stream, "created": self._stream_created, "seq": seq}).encode()
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, data + b"\n")
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("cluster: cannot write %s: %s", path, exc)
            return
        self._checkpointed = seq
        self._checkpoint_at = time.monotonic()

    async def _publish_local_sessions(self) -> None:
        """Publish the sessions of the local store that have lines but no sidecar (written
        before cluster mode), fenced from 0; leave local those whose subject the stream has
        with other lines. What the stream has of a session may be a prefix of the local lines
        (an earlier start of this host stopped midway): publishing continues after it."""
        if self.store.settings.read_only:
            return
        for name in self.store.names():
            if self._sidecar(name).exists():
                continue
            try:
                with open(self.store.root / name / EVENTS, "rb") as f:
                    lines = [line for line in f.read().split(b"\n") if line.strip()]
            except FileNotFoundError:
                continue
            if not lines:
                continue  # an empty session appears elsewhere with its first line
            subject = SUBJECT_PREFIX + name
            seq, done = await self._published_prefix(subject, lines)
            if done < 0:
                self.local_only.add(name)
                log.error("cluster: session %s was written here before cluster mode, and the stream already "
                          "has another session of that name: left local, not replicated (rename it to publish it)",
                          name)
                continue
            for line in lines[done:]:
                headers = {"Nats-Expected-Last-Subject-Sequence": str(seq),
                           "Nats-Msg-Id": msg_id(self.host_id, name, seq, line)}
                seq = (await self.js.publish(subject, line, timeout=self.config.timeout, headers=headers)).seq
            os.makedirs(self.store.root / name / INDEX_DIR, mode=0o700, exist_ok=True)
            rep = self.replica(name)
            with rep.lock:
                rep.seq = seq
                self._save(rep)
            self.published_local.append(name)
            log.info("cluster: session %s (written before cluster mode): %d lines published, %d were in the stream",
                     name, len(lines) - done, done)

    async def _published_prefix(self, subject: str, lines: list) -> tuple[int, int]:
        """(last sequence, count) of the stream's messages on ``subject`` when they are the
        first lines of ``lines`` ((0, 0): none); (0, -1) when they are not."""
        seq = done = 0
        while True:
            try:
                msg = await self.js.get_msg(self.config.stream, seq=seq + 1, subject=subject, next=True)
            except NotFoundError:
                return seq, done
            if done >= len(lines) or msg.data != lines[done]:
                return 0, -1
            seq, done = msg.seq, done + 1

    def stop(self) -> None:
        """Stop following and close the connection (what is applied stays applied)."""
        self._stopping = True
        self._inbox.put(None)
        if self._applier.is_alive():
            self._applier.join(10)
            self._write_checkpoint()
            log.info("cluster: stopped at stream sequence %d; the follower received %d messages from sequence %d, "
                     "%d publishes were fenced", self.applied_seq, self.received, self.start_seq, self.fenced)
        if self.nc is not None and self.loop.is_running():
            try:
                self._call(self.nc.close(), 5)
            except Exception as exc:  # closing is best effort
                log.debug("cluster: close: %s", exc)
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5)

    # --- per-session state -----------------------------------------------------------------

    def replica(self, name: str) -> Replica:
        with self._replicas_lock:
            rep = self.replicas.get(name)
            if rep is None:
                rep = self.replicas[name] = Replica(name)
            return rep

    def _sidecar(self, name: str) -> Path:
        return self.store.root / name / INDEX_DIR / SIDECAR

    def _load(self, rep: Replica) -> None:
        """Read the session's last applied sequence from its sidecar (caller holds rep.lock)."""
        if rep.seq is not None:
            return
        import json

        try:
            with open(self._sidecar(rep.name), "rb") as f:
                data = json.loads(f.read() or b"{}")
        except (FileNotFoundError, ValueError):
            data = {}
        if data.get("stream") == self.config.stream and isinstance(data.get("seq"), int):
            rep.seq = data["seq"]
            rep.verify_tail = True
        else:
            rep.seq = 0

    def _save(self, rep: Replica) -> None:
        text = ('{"stream":"%s","seq":%d}' % (self.config.stream, rep.seq)).encode()
        text = text.ljust(SIDECAR_WIDTH - 1) + b"\n"
        fd = os.open(self._sidecar(rep.name), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.pwrite(fd, text, 0)
        finally:
            os.close(fd)

    def seq_of(self, name: str) -> int:
        """The last stream sequence applied to session ``name`` on this host (0: none); never
        waits for a writer (the trio loop asks: the sidecar is read when not loaded yet)."""
        rep = self.replicas.get(name)
        if rep is not None and rep.seq is not None:
            return rep.seq
        probe = Replica(name)
        self._load(probe)
        return probe.seq

    def session(self, handle) -> ClusterSession:
        """What a writer of ``handle``'s session appends through (see :class:`ClusterSession`)."""
        return ClusterSession(self, handle)

    def lag(self) -> float:
        """Seconds this host's replica is behind the stream: 0 when every delivered message is
        applied and the stream had nothing more; the age of the oldest unapplied one otherwise;
        since the disconnection while no server is reachable."""
        now = time.time()
        if self.disconnected_at is not None:
            return now - self.disconnected_at
        oldest = self.oldest_unapplied
        return 0.0 if oldest is None else now - oldest

    # --- the writer's side -----------------------------------------------------------------

    def _handle(self, name: str, create: bool):
        try:
            return self.store.open(name)
        except NotFound:
            if not create:
                raise
        try:
            return self.store.create(name)
        except AlreadyExists:
            return self.store.open(name)

    def append(self, name: str, records: list) -> int:
        """Publish ``records`` of session ``name`` with the fence, in order, each committed to
        the local store once JetStream acknowledged it; return how many. A failure raises
        ``OSError`` (``ETIMEDOUT`` when the cluster did not answer in time) whose ``accepted``
        counts the records that went in (run in a worker thread, never the trio loop)."""
        if name in self.local_only:
            raise ClusterError(errno.EEXIST, f"cluster: session {name} was written here before cluster mode and the "
                               "stream has another session of that name: it stays local, appends are refused")
        rep = self.replica(name)
        done = 0
        with rep.lock:
            self._load(rep)
            try:
                for record in records:
                    self._publish_one(rep, record)
                    done += 1
            except OSError as exc:
                exc.accepted = done
                raise
        return done

    def _publish_one(self, rep: Replica, record) -> None:
        subject = SUBJECT_PREFIX + rep.name
        line = record[0]
        deadline = time.monotonic() + self.config.timeout
        fences = 0
        while True:
            expected = rep.seq
            headers = {"Nats-Expected-Last-Subject-Sequence": str(expected),
                       "Nats-Msg-Id": msg_id(self.host_id, rep.name, expected, line)}
            left = deadline - time.monotonic()
            if left <= 0:
                raise ClusterError(errno.ETIMEDOUT, f"cluster: no acknowledgement for session {rep.name} "
                                   f"within {self.config.timeout:g} s (no quorum, or no server reachable)")
            try:
                ack = self._call(self.js.publish(subject, line, timeout=min(left, 1.0), headers=headers),
                                 min(left, 1.0) + 0.5)
            except APIError as exc:
                if exc.err_code == WRONG_LAST_SEQUENCE and fences < MAX_FENCE_RETRIES:
                    fences += 1
                    self.fenced += 1
                    log.info("cluster: session %s: fenced at sequence %d (another host appended first): catching up",
                             rep.name, expected)
                    self._catch_up(rep)  # another host appended first
                    deadline = time.monotonic() + self.config.timeout
                    continue
                if exc.err_code == WRONG_LAST_SEQUENCE:
                    raise ClusterError(errno.EAGAIN, f"cluster: session {rep.name}: fenced {fences} times") from exc
                log.debug("cluster: publish to %s: %s (retrying)", subject, exc)
                time.sleep(0.05)  # JetStream without a leader yet: retry until the deadline
                continue
            except (TimeoutError, nats.errors.Error, asyncio.TimeoutError) as exc:
                log.debug("cluster: publish to %s: %r (retrying with the same id)", subject, exc)
                if self.nc.is_closed:
                    raise ClusterError(errno.ENOTCONN, "cluster: connection closed") from exc
                time.sleep(0.05)  # no responders while the stream elects a new leader: not a busy loop
                continue
            self._commit_local(rep, ack.seq, line, create=True)
            return

    def _catch_up(self, rep: Replica) -> None:
        """Apply the session's messages after the last applied one (caller holds rep.lock)."""
        subject = SUBJECT_PREFIX + rep.name
        while True:
            try:
                msg = self._call(self.js.get_msg(self.config.stream, seq=rep.seq + 1, subject=subject, next=True),
                                 self.config.timeout)
            except NotFoundError:
                return
            self._commit_local(rep, msg.seq, msg.data, create=True)

    def _commit_local(self, rep: Replica, seq: int, line: bytes, create: bool) -> None:
        """Commit one line of the stream to the local replica (caller holds rep.lock)."""
        if seq <= rep.seq:
            return
        handle = self._handle(rep.name, create)
        if rep.verify_tail:
            rep.verify_tail = False
            tail = handle.read_bytes(max(0, handle.file_len - len(line) - 1))
            if tail == line + b"\n" or tail.endswith(b"\n" + line + b"\n"):
                rep.seq = seq  # the log got it before a crash, the sidecar did not
                self._save(rep)
                return
        try:
            record = handle.validate(line)
        except ValidationError as exc:  # cannot happen for a line another memfs accepted
            log.error("cluster: session %s: stream message %d refused here: %s", rep.name, seq, exc)
            rep.seq = seq
            self._save(rep)
            return
        handle.append_records([record])
        rep.seq = seq
        self._save(rep)

    # --- the follower's side ---------------------------------------------------------------

    async def _delivered(self, msg) -> None:
        md = msg.metadata
        self.delivered_seq = md.sequence.stream
        self.received += 1
        self.pending = md.num_pending
        if self.oldest_unapplied is None:
            self.oldest_unapplied = md.timestamp.timestamp() if md.timestamp else time.time()
        self._inbox.put((msg.subject, md.sequence.stream, msg.data, md.num_pending))

    def _apply_loop(self) -> None:
        while True:
            try:
                item = self._inbox.get(timeout=CHECKPOINT_EVERY)
            except queue.Empty:  # idle: the checkpoint, off the replication's way
                if time.monotonic() - self._checkpoint_at >= CHECKPOINT_EVERY:
                    self._write_checkpoint()
                continue
            if item is None or self._stopping:
                return
            subject, seq, data, pending = item
            name = subject[len(SUBJECT_PREFIX):]
            try:
                if name not in self.local_only:  # (a local-only session: logged once, at start)
                    rep = self.replica(name)
                    with rep.lock:
                        self._load(rep)
                        self._commit_local(rep, seq, data, create=True)
            except Exception:
                log.exception("cluster: session %s: applying stream message %d failed", name, seq)
            self.applied_seq = seq
            if self._inbox.empty() and pending == 0:
                self.oldest_unapplied = None
            if time.monotonic() - self._checkpoint_at >= CHECKPOINT_EVERY:
                self._write_checkpoint()

    def wait_applied(self, seq: int, timeout: float) -> bool:
        """For tools and tests: wait until the follower applied stream sequence ``seq``."""
        deadline = time.monotonic() + timeout
        while self.applied_seq < seq:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True


class ClusterSession:
    """What :class:`memfs.store.appender.LineAppender` writes through in cluster mode: the
    session handle's validation and refusal record, with commits published first."""

    __slots__ = ("node", "handle")

    def __init__(self, node: ClusterNode, handle):
        self.node = node
        self.handle = handle

    @property
    def name(self) -> str:
        return self.handle.name

    def validate(self, line: bytes):
        return self.handle.validate(line)

    def reject(self, line: bytes, error, *, pid=None) -> None:
        self.handle.reject(line, error, pid=pid)

    def append(self, line: bytes, pid=None) -> None:
        try:
            record = self.handle.validate(line)
        except ValidationError as exc:
            self.handle.reject(line, exc, pid=pid)
            raise
        self.append_records([record])

    def append_records(self, records) -> int:
        try:
            return self.node.append(self.handle.name, list(records))
        except OSError as exc:  # no quorum, a local-only session: the reason, on the session folder
            self.handle.note_failure(f"memfs: {exc.strerror}")
            raise
