"""One mount's membership in the cluster (SPEC §9): fenced publishes, the follower, catch-up.

Threads (the trio loop never waits for the network):

* the *event loop* (trio, serving FUSE) has a NATS connection of its own
  (:mod:`memfs.cluster.wire`): it publishes one whole line per ``write()`` and commits it once
  acknowledged (:meth:`ClusterNode.claim_fast` … :meth:`ClusterNode.finish_fast`), and runs the
  follower (:mod:`memfs.cluster.follow`), which hands every stream message to
  :meth:`ClusterNode.delivered`;
* the *NATS thread* runs an asyncio loop with the ``nats-py`` connection (the stream's
  creation, batches, catch-up, the publishes of the worker path); other threads hand it
  coroutines (:meth:`ClusterNode._call`) and wait for their results with a deadline;
* a *writer* — the filesystem's worker thread running a ``write()`` on ``events.jsonl`` —
  calls :meth:`ClusterNode.append`: for each validated record, publish to ``memfs.<session>``
  with ``Nats-Expected-Last-Subject-Sequence`` = the stream sequence of the last line of that
  session this host applied (0: none) and ``Nats-Msg-Id`` = ``<host id>:<session>:<that
  sequence>:<digest of the line>`` (:func:`msg_id`, deterministic: a retry of the same publish
  is stored once, two hosts never share an id — the host id is unique per daemon start — nor
  two lines of one host); once JetStream acknowledged it — an ack checked, not assumed
  (:mod:`memfs.cluster.trust`) — commit the line to the local store through the store's one commit. A refusal for a wrong last sequence (err_code 10071) means another host
  appended first: catch up (fetch the session's messages after the last applied one and commit
  them), revalidate, publish again;
* the *applier* thread commits what the follower (an ordered consumer on ``memfs.>``, from
  the checkpoint or the stream's first message) delivers: other hosts' lines, in stream order;
  a line this host already applied (its own, or caught up) is skipped by its sequence, on the
  event loop, without waking this thread.

*Batches* (a ``write()`` of many lines, ``append_many``) are published pipelined as JetStream
**atomic batches** (nats-server ≥ 2.12, stream setting ``allow_atomic``): up to
:data:`BATCH_MAX` messages sent back to back with ``Nats-Batch-Id`` / ``Nats-Batch-Sequence``
(the last with ``Nats-Batch-Commit``), one acknowledgement for all. Why this and not a chain
of per-message fences: JetStream numbers messages across every subject of the stream, so the
sequence message *i* will get is unknown until message *i-1* is acknowledged — a chain of
``Nats-Expected-Last-Subject-Sequence`` needs one round trip per line, and fencing only the
first message of a plain pipeline would let another host's line land between ours (and ours
still be stored after it: interleaving inside the window). An atomic batch is stored whole
and contiguous or not at all: only its first message carries the fence (the session's last
applied sequence), so the fence covers the whole batch; the ack gives the last sequence and
the count, hence each line's sequence (``last - count + 1 + i``). A refused batch (wrong
last sequence: another host appended first) stores nothing: catch up, revalidate the rest
against the caught-up state, send it again. A batch whose ack was lost (timeout) is sent
again with the same fence (under a new batch id: an unfinished batch is never reopened): if
the first attempt was stored, the retry is refused, and the catch-up recognises one of the
attempts' ``Nats-Batch-Id`` in the messages it applies — those lines count as accepted and
are not sent again. A stream created without
``allow_atomic`` (before this, by hand) is updated to allow it; when that is refused, batches
fall back to one fenced publish per line.

A per-session :class:`Replica` lock serializes the writer and the applier of one session on
this host; the session's own mutex is never held across a network wait (the store takes it
only inside each local commit).

The last applied sequence of each session is kept in ``index/cluster.json`` (rewritten in
place after each applied line: ``{"stream": …, "seq": N}``), so a restarted host resumes
there. A crash between the log's write and the sidecar's leaves the log one line ahead; the
first message after the sidecar's sequence is then compared with the log's last line, and
skipped when equal.

What the stream brings is checked first (:mod:`memfs.cluster.trust`): a session name from a
subject must be one ``mkdir`` takes (:meth:`ClusterNode.replica`), and a line this host cannot
apply goes to the session's ``rejected.jsonl`` with its stream sequence; either way the
follower moves past it.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import logging
import os
import queue
import threading
import time
import uuid
from pathlib import Path

import nats
from nats.js import api
from nats.js.errors import APIError, NotFoundError

from memfs.cluster import SUBJECT_PREFIX, ClusterConfig, redact
from memfs.cluster.auth import Credentials, Refused, check_tls_offered, refusal
from memfs.cluster.trust import (HEADER_ROOM, MESSAGE_TOO_BIG, Diverged, ack_problem, is_this_publish, line_limit,
                                 new_host_id)
from memfs.errors import AlreadyExists, NotFound, SymlinkRefused, ValidationError
from memfs.store.catalog import is_session_dir
from memfs.store.config import check_line_size
from memfs.store.paths import INDEX_DIR, EVENTS, new_session_name_problem, open_nofollow

log = logging.getLogger("memfs.cluster")

WRONG_LAST_SEQUENCE = 10071
CHECKPOINT = ".memfs-cluster.json"  # in the store's root: not a session (a file)
CHECKPOINT_EVERY = 1.0  # seconds between checkpoint writes while lines are applied
SIDECAR = "cluster.json"
SIDECAR_WIDTH = 96  # the sidecar is rewritten in place at a fixed width (one small pwrite)
MAX_FENCE_RETRIES = 100
BATCH_MAX = 256  # messages per atomic batch (the server takes up to 1,000)
# seconds the join waits for each JetStream API reply before it asks again (at most the
# ``timeout``): a request made while JetStream has no leader (a cluster starting, no quorum) is
# often not answered at all, and waiting out a ``timeout`` raised to ride out elections (20 s)
# kept the mount down that long after the cluster could answer
JOIN_ATTEMPT = 2.0


def msg_id(host_id: str, session: str, expected: int, line: bytes, salt: str = "") -> str:
    """A single publish's ``Nats-Msg-Id``: host, session, fence and a digest of the line. A
    retry of the same line on the same fence is stored once; another line on the same fence
    never shares its id (an append that timed out may have been stored: the host's next line,
    published on the same stale fence, must be refused by the fence and caught up, not
    deduplicated into it — the replicas diverged so before). ``salt``: after a duplicate ack
    naming another message (:mod:`memfs.cluster.trust`), the id of the publish again."""
    digest = hashlib.blake2b(line, digest_size=8).hexdigest()
    return f"{host_id}:{session}:{expected}:{digest}:{salt}" if salt else f"{host_id}:{session}:{expected}:{digest}"


class ClusterError(OSError):
    """The cluster could not take an append (``ETIMEDOUT``: no quorum or no server in time)."""


class UntrustedName(ClusterError):
    """A session name that ``mkdir`` would refuse (``problem`` says why): from a subject, never
    followed to a path; a local session of that name is not replicated (``EINVAL``)."""

    def __init__(self, problem: str):
        super().__init__(errno.EINVAL, f"cluster: {problem}: not a session name of the stream")
        self.problem = problem


class Replica:
    """This host's view of one session's stream: the last applied sequence, and the lock
    that orders the writer and the applier on it."""

    __slots__ = ("name", "lock", "seq", "verify_tail", "unpublished", "diverged", "held", "sidecar")

    def __init__(self, name: str):
        self.name = name
        self.lock = threading.Lock()
        self.seq: int | None = None  # None: not read from the sidecar yet
        self.verify_tail = False
        self.unpublished = False  # the local log has lines and no sidecar: written before cluster mode
        self.diverged = False  # local lines and the stream's differ: this host leaves the session alone
        # while the event loop publishes a line of it (claim_fast … finish_fast): None when not,
        # else the deliveries of it that came before the ack (this line, most likely)
        self.held: list | None = None
        self.sidecar: str | None = None  # its index/cluster.json (a str: built once, opened at every line)


class ClusterNode:
    """The cluster side of one mount over ``store`` (a :class:`memfs.store.root.Store`)."""

    def __init__(self, store, config: ClusterConfig, host_id: str | None = None):
        self.store = store
        self.config = config
        self.auth = Credentials.load(config)  # what both connections present (files checked now)
        self.host_id = host_id or new_host_id()  # unique per start (memfs.cluster.trust)
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
        self.disconnected_at: float | None = time.time()  # when the follower stopped (here: not started yet)
        self.atomic = False  # the stream takes atomic batches (set on connect)
        self.max_line = line_limit(1 << 20, None)  # the longest line published (set on connect)
        self.limit_name = "cluster mode"  # where it comes from, for the reason of a refusal
        # the host-wide checkpoint: every stream message up to ``checkpointed`` is applied here
        self.resumed_after = 0  # the checkpoint the follower started after (0: from the start)
        self.delivered_count = 0  # messages the follower delivered since start
        self.fast_appends = 0  # lines published and committed on the event loop (finish_fast)
        self.checkpointed = 0
        self._checkpoint_limit: int | None = None  # a message that failed to apply: never checkpoint past it
        self._held: set[int] = set()  # the first delivery each session holds (Replica.held)
        self._checkpoint_at = 0.0
        self._stream_created = ""

    # --- life ------------------------------------------------------------------------------

    def start(self) -> ClusterNode:
        """Connect, make sure the stream exists, start following; raise when the cluster
        cannot be reached within the timeout."""
        self._thread.start()
        try:
            # (the join's own deadline, timeout × 2, ends it first, with the stream's answer)
            self._call(self._connect(), self.config.timeout * 3 + 1)
        except BaseException:
            self.stop()
            raise
        self._applier.start()
        threading.Thread(target=self.publish_local_sessions, name="memfs-cluster-publish", daemon=True).start()
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
        refused_logged = False

        async def disconnected():
            log.warning("cluster: disconnected from NATS")

        async def reconnected():
            nonlocal refused_logged
            refused_logged = False
            url = self.nc.connected_url
            log.info("cluster: reconnected to %s", redact(url.netloc) if url else "?")

        async def error(exc):  # (nats-py retries after it returns; raised, nats.connect ends)
            nonlocal refused_logged
            why = refusal(exc)
            if why is None:
                log.debug("cluster: %s", exc)
                return
            current = getattr(self.nc, "_current_server", None)  # (which server refused: nats-py's own)
            url = current.uri.geturl() if current is not None else ",".join(self.config.servers)
            where = redact(url)
            detail = self.auth.describe_tls(why) if why.startswith("TLS") else self.auth.describe(url)
            if self.js is None:  # joining: refused credentials or TLS fail the mount now; the client
                self.nc = None  # is dropped, not closed (nats-py's close waits forever after a failed TLS)
                raise Refused(f"{why} at {where} ({detail})")
            if not refused_logged:  # (then nats-py keeps trying, as for a server down)
                refused_logged = True
                log.error("cluster: %s at %s (%s)", why, where, detail)

        if self.auth.tls is not None:  # (nats-py would speak plain text to a server not asking for TLS)
            await check_tls_offered(self.config.servers, min(self.config.timeout, JOIN_ATTEMPT))
        self.nc = nats.NATS()  # (assigned first: stop() closes it whatever connect did)
        await self.nc.connect(self.config.servers, name=f"memfs {self.host_id}",
                              connect_timeout=max(1, int(self.config.timeout)), max_reconnect_attempts=-1,
                              reconnect_time_wait=0.25, disconnected_cb=disconnected,
                              reconnected_cb=reconnected, error_cb=error, **self.auth.nats_options())
        self.js = self.nc.jetstream(timeout=self.config.timeout)
        attempt = min(self.config.timeout, JOIN_ATTEMPT)
        join_js = self.nc.jetstream(timeout=attempt)
        deadline = time.monotonic() + self.config.timeout * 2
        unanswered = 0
        while True:  # a cluster just started may answer 400/503, or not at all, until its leaders are elected
            try:
                return await self._join(join_js)
            except (APIError, nats.errors.TimeoutError, asyncio.TimeoutError) as exc:
                if isinstance(exc, NotFoundError) or time.monotonic() > deadline:
                    raise
                if isinstance(exc, APIError):  # (an answer: JetStream is electing its leaders)
                    log.info("cluster: joining stream %s: %r (retrying)", self.config.stream, exc)
                else:  # no answer: said once as a warning, since the mount is not up meanwhile
                    unanswered += 1
                    log.log(logging.WARNING if unanswered == 1 else logging.INFO,
                            "cluster: joining stream %s: JetStream did not answer within %g s (no leader "
                            "yet, or no quorum); asking again for up to %g s", self.config.stream, attempt,
                            self.config.timeout * 2)
                await asyncio.sleep(0.2)

    async def _join(self, js) -> None:
        """Make sure the stream exists (and takes atomic batches); read where following starts
        (the checkpoint). The follower itself runs on the event loop (:mod:`memfs.cluster.follow`).
        ``js``: the join's JetStream context (its requests time out after :data:`JOIN_ATTEMPT`)."""
        cfg = self.config
        try:
            info = await js.stream_info(cfg.stream)
        except NotFoundError:
            info = await js.add_stream(api.StreamConfig(
                name=cfg.stream, subjects=[SUBJECT_PREFIX + ">"], num_replicas=cfg.effective_replicas,
                storage=api.StorageType.FILE, duplicate_window=120.0, max_age=cfg.max_age or None,
                max_bytes=cfg.max_bytes or None, allow_direct=True, allow_atomic=True))
            log.info("cluster: created stream %s (replicas %d)", cfg.stream, cfg.effective_replicas)
        self.atomic = bool(info.config.allow_atomic)
        if not self.atomic:  # a stream made before batches: allow them (an editable setting)
            try:
                info.config.allow_atomic = True
                self.atomic = bool((await js.update_stream(info.config)).config.allow_atomic)
            except APIError as exc:
                log.warning("cluster: stream %s does not take atomic batches (%s): one publish per line",
                            cfg.stream, exc)
        self._stream_created = str(info.created)
        size = info.config.max_msg_size
        self.max_line = line_limit(self.nc.max_payload, size)
        self.limit_name = (f"cluster mode: the server's max_payload of {self.nc.max_payload} bytes"
                           + (f" or stream {cfg.stream}'s max_msg_size of {size}" if size and size > 0 else "")
                           + f", less {HEADER_ROOM} for the message's headers")
        start = self._read_checkpoint(info.state.last_seq)
        self.resumed_after = self.applied_seq = self.delivered_seq = self.checkpointed = start
        if start:
            log.info("cluster: following stream %s after the checkpoint, sequence %d", cfg.stream, start)

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

    def _write_checkpoint(self, force: bool = False) -> None:
        """Record ``applied_seq`` (applier thread, or stop): at most every
        :data:`CHECKPOINT_EVERY` seconds unless ``force``; atomically, never on the trio loop."""
        seq = self.applied_seq
        if self._checkpoint_limit is not None:
            seq = min(seq, self._checkpoint_limit)
        held = self._held.copy()  # (the event loop's set: a copy, then read)
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

    def stop(self) -> None:
        """Stop following and close the connection (what is applied stays applied)."""
        self._stopping = True
        self._inbox.put(None)
        if self._applier.is_alive():
            self._applier.join(10)
        if self._stream_created:
            self._write_checkpoint(force=True)
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
        """Session ``name``'s replica; :class:`UntrustedName` when ``mkdir`` would refuse the
        name (SPEC §9: a name from a subject never reaches a path unchecked)."""
        rep = self.replicas.get(name)
        if rep is not None:
            return rep
        problem = new_session_name_problem(name)
        if problem:
            raise UntrustedName(problem)
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
        if not is_session_dir(self.store.root / rep.name):  # none here (a symlink is none: never followed)
            rep.seq = 0
            return
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
            try:
                rep.unpublished = os.stat(self.store.root / rep.name / EVENTS).st_size > 0
            except FileNotFoundError:
                pass

    def _ready(self, rep: Replica) -> None:
        """:meth:`_load`, then publish the local lines of a session written before cluster
        mode (caller holds rep.lock; may wait for the cluster: never on the trio loop)."""
        self._load(rep)
        if rep.unpublished:
            self._publish_local(rep)

    # --- sessions written before cluster mode ----------------------------------------------

    def publish_local_sessions(self) -> int:
        """Publish every local session written before this store was in cluster mode (a
        non-empty log and no sidecar for this stream); return how many. Runs on its own thread
        after :meth:`start`; a writer or the applier reaching such a session first publishes
        it the same way (:meth:`_load`)."""
        published = 0
        for name in self.store.names():
            if self._stopping:
                break
            if os.path.exists(self._sidecar(name)):
                continue
            try:
                rep = self.replica(name)
                with rep.lock:
                    self._load(rep)
                    if rep.unpublished:
                        self._publish_local(rep)
                        published += not rep.diverged
            except UntrustedName as exc:  # made by another tool: readable here, not replicated
                log.warning("cluster: session %s not published: %s", name, exc.problem)
            except Exception:
                log.exception("cluster: session %s: publishing its local lines failed (retried at its next write)",
                              name)
        return published

    def _publish_local(self, rep: Replica) -> None:
        """Publish the local lines of a session the stream may not have (caller holds rep.lock;
        see :meth:`publish_local_sessions`). When the stream has no line of it, every local
        line goes, in order, fenced from sequence 0 (atomic batches when the stream takes them),
        and the sidecar records the last sequence. When the stream's lines of it are the first
        local lines (this host's publish of them stopped midway: a crash, a timeout between two
        batches), the rest follows them. When the stream has other lines of it — the same name
        written on another host — the two histories differ: this host keeps its
        local session as it is, applies none of the stream's lines to it and refuses writes to
        it (``EEXIST``, saying why), and says so in its log; moving the local folder away and
        remounting makes it a replica of the stream's session."""
        subject = SUBJECT_PREFIX + rep.name
        from memfs.store.lines import scan_lines

        fd = open_nofollow(self.store.root / rep.name / EVENTS, os.O_RDONLY)
        try:
            end = os.fstat(fd).st_size
            chunk: list[bytes] = []
            known = 0  # local lines the stream already has (a publish of them stopped midway)
            in_stream = True
            for _off, line in scan_lines(fd, 0, end):
                line = bytes(line)
                if in_stream:
                    msg = self._next_of(subject, rep.seq)
                    if msg is not None and msg.data == line:
                        rep.seq, known = msg.seq, known + 1
                        continue
                    if msg is not None:
                        return self._diverged(rep)
                    in_stream = False
                chunk.append(line)
                if len(chunk) == BATCH_MAX:
                    self._publish_lines(rep, chunk)
                    chunk = []
            if in_stream and self._next_of(subject, rep.seq) is not None:
                # every local line is in the stream, which has more (other hosts went on after a
                # publish whose sidecar write was lost): a replica behind — catch up
                self._save(rep)
                rep.unpublished = False
                self._catch_up(rep)
                return
            if chunk:
                self._publish_lines(rep, chunk)
            elif known:
                self._save(rep)
        finally:
            os.close(fd)
        rep.unpublished = False
        log.info("cluster: session %s: published its local lines (through stream sequence %d; %d were in the "
                 "stream already)", rep.name, rep.seq, known)

    def _next_of(self, subject: str, after: int):
        """The stream's first message on ``subject`` after sequence ``after`` (None: none), asked
        again until the ``timeout``; then :class:`ClusterError` ``ETIMEDOUT`` (no quorum, or no
        server reachable: an append that needs it fails as one that is not acknowledged)."""
        deadline = time.monotonic() + self.config.timeout
        while True:
            left = deadline - time.monotonic()
            try:
                return self._call(self.js.get_msg(self.config.stream, seq=after + 1, subject=subject, next=True),
                                  max(0.1, left))
            except NotFoundError:
                return None
            except (TimeoutError, asyncio.TimeoutError, nats.errors.Error, APIError) as exc:
                if time.monotonic() >= deadline:
                    raise ClusterError(errno.ETIMEDOUT, f"cluster: session {subject[len(SUBJECT_PREFIX):]}: no "
                                       f"answer from stream {self.config.stream} within {self.config.timeout:g} s "
                                       "(no quorum, or no server reachable)") from exc
                log.debug("cluster: reading %s after %d: %r (asking again)", subject, after, exc)
                time.sleep(0.05)

    def _diverged(self, rep: Replica) -> None:
        rep.unpublished, rep.diverged, rep.seq = False, True, 0
        log.error("cluster: session %s exists in this store (written before cluster mode) and in stream %s "
                  "with another history: left as it is here, not replicated; move %s away and remount to "
                  "follow the stream's", rep.name, self.config.stream, self.store.root / rep.name)

    def _publish_lines(self, rep: Replica, lines: list[bytes]) -> None:
        """Publish lines the local log already holds, fenced, without committing them again."""
        subject = SUBJECT_PREFIX + rep.name
        deadline = time.monotonic() + self.config.timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ClusterError(errno.ETIMEDOUT, f"cluster: session {rep.name}: no acknowledgement within "
                                   f"{self.config.timeout:g} s publishing its local lines")
            try:
                if self.atomic:
                    ack = self._call(self._send_batch(subject, lines, rep.seq, uuid.uuid4().hex, min(left, 2.0)),
                                     min(left, 2.0) + 0.5)
                    error = ack.get("error")
                    if error is None:
                        rep.seq = ack["seq"]
                        break
                    code = error.get("err_code")
                else:
                    for i, line in enumerate(lines):
                        headers = {"Nats-Expected-Last-Subject-Sequence": str(rep.seq)}
                        got = self._call(self.js.publish(subject, line, timeout=min(left, 1.0), headers=headers),
                                         min(left, 1.0) + 0.5)
                        rep.seq = got.seq
                    break
            except APIError as exc:
                code = exc.err_code
            except (TimeoutError, asyncio.TimeoutError, nats.errors.Error) as exc:
                log.debug("cluster: publishing local lines of %s: %r (retrying)", rep.name, exc)
                time.sleep(0.05)
                continue
            if code == WRONG_LAST_SEQUENCE:  # another host wrote this session meanwhile
                rep.unpublished, rep.diverged = False, True
                raise ClusterError(errno.EEXIST, f"cluster: session {rep.name} was written on another host while "
                                   "this one published its local lines: left as it is here, not replicated")
            time.sleep(0.05)  # no stream leader yet: retry until the deadline
        self._save(rep)

    def _save(self, rep: Replica) -> None:
        text = ('{"stream":"%s","seq":%d}' % (self.config.stream, rep.seq)).encode()
        text = text.ljust(SIDECAR_WIDTH - 1) + b"\n"
        if rep.sidecar is None:
            rep.sidecar = str(self._sidecar(rep.name))
        fd = os.open(rep.sidecar, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
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

    def describe(self) -> str:
        """``stream MEMFS on nats://a:4222,…``: what the mount's root shows in ``user.memfs.cluster``."""
        return f"stream {self.config.stream} on {redact(','.join(self.config.servers))}"

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
        rep = self.replica(name)
        done = 0
        with rep.lock:
            self._ready(rep)
            if rep.diverged:
                raise ClusterError(errno.EEXIST, f"cluster: session {name} here was written before cluster mode and "
                                   "differs from the stream's: not replicated, read-only here (move it away and "
                                   "remount to follow the stream's)")
            try:
                if len(records) > 1 and self.atomic:
                    while done < len(records):
                        done += self._publish_batch(rep, records[done:done + BATCH_MAX])
                else:
                    for record in records:
                        self._publish_one(rep, record)
                        done += 1
            except ValidationError:
                if not done:
                    raise
                return done  # a line no longer valid after a catch-up: a short write, the retry reports it
            except OSError as exc:
                exc.accepted = done
                raise
        return done

    def _publish_batch(self, rep: Replica, records: list) -> int:
        """Publish ``records`` (at most :data:`BATCH_MAX`) as one fenced atomic batch and commit
        them locally; return how many went in (fewer when a fence refusal's catch-up showed
        that a previous attempt of this batch was stored, or a line no longer validates after
        a catch-up: then it raises with ``accepted``)."""
        subject = SUBJECT_PREFIX + rep.name
        lines = [r[0] for r in records]
        tried: set[str] = set()  # every attempt's batch id (a new one each: an unfinished batch is never reopened)
        deadline = time.monotonic() + self.config.timeout
        fences = 0
        while True:
            batch_id = uuid.uuid4().hex
            tried.add(batch_id)
            left = deadline - time.monotonic()
            if left <= 0:
                raise ClusterError(errno.ETIMEDOUT, f"cluster: no acknowledgement for session {rep.name} "
                                   f"within {self.config.timeout:g} s (no quorum, or no server reachable)")
            try:
                ack = self._call(self._send_batch(subject, lines, rep.seq, batch_id, min(left, 2.0)),
                                 min(left, 2.0) + 0.5)
            except (TimeoutError, asyncio.TimeoutError, nats.errors.Error) as exc:
                log.debug("cluster: batch to %s: %r (sending it again, same fence)", subject, exc)
                if self.nc.is_closed:
                    raise ClusterError(errno.ENOTCONN, "cluster: connection closed") from exc
                time.sleep(0.05)
                continue
            error = ack.get("error")
            if error is None:
                problem = ack_problem(ack, self.config.stream, rep.seq, batch_id, len(lines))
                if problem is None:
                    first = ack["seq"] - ack["count"] + 1
                    for i, line in enumerate(lines):
                        self._commit_local(rep, first + i, line, create=True)
                    return len(lines)
                # checked, not assumed: what the stream holds of this batch is what the catch-up finds
                log.warning("cluster: session %s: the ack of batch %s is %s: catching up", rep.name, batch_id, problem)
            elif error.get("err_code") == MESSAGE_TOO_BIG:
                raise ClusterError(errno.EFBIG, f"cluster: session {rep.name}: a line is over stream "
                                   f"{self.config.stream}'s max_msg_size")
            elif error.get("err_code") != WRONG_LAST_SEQUENCE:
                log.debug("cluster: batch to %s refused: %s (retrying)", subject, error)
                time.sleep(0.05)  # no stream leader yet: retry until the deadline
                continue
            else:
                log.info("cluster: session %s: batch fenced at sequence %d (another host appended first): "
                         "catching up", rep.name, rep.seq)
            if fences >= MAX_FENCE_RETRIES:
                raise ClusterError(errno.EAGAIN, f"cluster: session {rep.name}: fenced {fences} times")
            fences += 1
            ours = self._catch_up(rep, tried)  # another host appended first (or we did, unacked)
            if ours:
                return ours  # a previous attempt was stored whole: caught up with the rest
            handle = self._handle(rep.name, create=True)
            for line in lines:  # revalidate against the caught-up state
                handle.validate(line)
            deadline = time.monotonic() + self.config.timeout

    async def _send_batch(self, subject: str, lines: list[bytes], expected: int, batch_id: str,
                          timeout: float) -> dict:
        """One atomic batch, pipelined: every message written to the connection without waiting,
        one reply for the commit (the first message's reply only opens the batch). Returns the
        ack's JSON (with ``error`` when refused)."""
        nc = self.nc
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        try:
            n = len(lines)
            for i, line in enumerate(lines, 1):
                headers = {"Nats-Batch-Id": batch_id, "Nats-Batch-Sequence": str(i)}
                if i == 1:
                    headers["Nats-Expected-Last-Subject-Sequence"] = str(expected)
                if i == n:
                    headers["Nats-Batch-Commit"] = "1"
                await nc.publish(subject, line, reply=inbox if i in (1, n) else "", headers=headers)
            end = time.monotonic() + timeout
            while True:
                msg = await sub.next_msg(timeout=max(0.01, end - time.monotonic()))
                if not msg.data:
                    continue  # the batch's opening ack
                reply = json.loads(msg.data)
                if "error" in reply or "batch" in reply:
                    return reply
        finally:
            await sub.unsubscribe()

    def _publish_one(self, rep: Replica, record) -> None:
        subject = SUBJECT_PREFIX + rep.name
        line = record[0]
        deadline = time.monotonic() + self.config.timeout
        fences = 0
        salt = ""  # once a duplicate ack named another message: the line goes again under a new id
        while True:
            expected = rep.seq
            mid = msg_id(self.host_id, rep.name, expected, line, salt)
            headers = {"Nats-Expected-Last-Subject-Sequence": str(expected), "Nats-Msg-Id": mid}
            left = deadline - time.monotonic()
            if left <= 0:
                raise ClusterError(errno.ETIMEDOUT, f"cluster: no acknowledgement for session {rep.name} "
                                   f"within {self.config.timeout:g} s (no quorum, or no server reachable)")
            try:
                ack = self._call(self.js.publish(subject, line, timeout=min(left, 1.0), headers=headers),
                                 min(left, 1.0) + 0.5)
            except APIError as exc:
                if exc.err_code == MESSAGE_TOO_BIG:
                    raise ClusterError(errno.EFBIG, f"cluster: session {rep.name}: the line is over stream "
                                       f"{self.config.stream}'s max_msg_size") from exc
                if exc.err_code == WRONG_LAST_SEQUENCE and fences < MAX_FENCE_RETRIES:
                    fences += 1
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
            problem = ack_problem({"stream": ack.stream, "seq": ack.seq, "duplicate": ack.duplicate},
                                  self.config.stream, expected)
            if problem is not None:  # checked, not assumed: is the message at that sequence this publish?
                try:
                    stored = self._call(self.js.get_msg(self.config.stream, seq=ack.seq), min(left, 1.0) + 0.5)
                except NotFoundError:
                    stored = None
                except (TimeoutError, nats.errors.Error, asyncio.TimeoutError, APIError) as exc:
                    log.debug("cluster: reading stream message %d: %r (publishing again, same id)", ack.seq, exc)
                    time.sleep(0.05)
                    continue
                if not is_this_publish(stored, subject, line, mid, expected):
                    log.warning("cluster: session %s: the ack of its line on fence %d is %s, another message: "
                                "publishing the line again under a new Nats-Msg-Id", rep.name, expected, problem)
                    salt = uuid.uuid4().hex[:8]
                    continue
            self._commit_local(rep, ack.seq, line, create=True)
            return

    def _catch_up(self, rep: Replica, batch_ids: set[str] = frozenset()) -> int:
        """Apply the session's messages after the last applied one (caller holds rep.lock);
        return how many of them belong to the atomic batches ``batch_ids`` (this host's own
        batch, stored by an attempt whose ack was lost)."""
        subject = SUBJECT_PREFIX + rep.name
        ours = 0
        while True:
            msg = self._next_of(subject, rep.seq)
            if msg is None:
                return ours
            if batch_ids and msg.headers and msg.headers.get("Nats-Batch-Id") in batch_ids:
                ours += 1
            self._commit_local(rep, msg.seq, msg.data, create=True)

    # --- the fast path of one line from the filesystem's event loop --------------------------

    def claim_fast(self, name: str) -> Replica | None:
        """For one validated line written from an event loop (the filesystem's ``write()``):
        this session's replica, its lock taken without waiting, when its state is known here
        and nothing else holds it; None otherwise (the caller takes the worker-thread path,
        :meth:`append`). The caller then publishes :meth:`fast_request` and calls
        :meth:`finish_fast` — which releases the lock whatever happened."""
        rep = self.replicas.get(name)
        if rep is None or rep.seq is None or rep.unpublished or rep.diverged or self.js is None:
            return None
        if not rep.lock.acquire(blocking=False):
            return None
        if rep.unpublished or rep.diverged:
            rep.lock.release()
            return None
        rep.held = []
        return rep

    def fast_request(self, rep: Replica, line: bytes) -> tuple[str, bytes, float, dict[str, str]]:
        """The subject, payload, timeout and headers of the fenced publish of ``line`` (the claimed
        replica's next line), for the event loop's own connection
        (:meth:`memfs.cluster.wire.Connection.request`). One try, at most a second: any failure (a
        fence refusal, no leader, a timeout) is the worker path's to handle."""
        headers = {"Nats-Expected-Last-Subject-Sequence": str(rep.seq),
                   "Nats-Msg-Id": msg_id(self.host_id, rep.name, rep.seq, line)}
        return SUBJECT_PREFIX + rep.name, line, min(1.0, self.config.timeout), headers

    def finish_fast(self, rep: Replica, handle, record, ack: dict | None) -> bool:
        """After the publish of :meth:`fast_request`: commit the acknowledged line (``record``,
        validated by ``handle``) to the local replica through ``handle`` (the writer's own
        session handle: nothing to open) and
        release the lock; False — lock released, nothing committed — when ``ack`` (the
        JetStream reply) is not an acknowledgement of this stream (the caller retries on the
        worker path: the same fence and id, so a publish that was in fact stored is
        deduplicated, and a fenced one is caught up there). The deliveries of the session held
        meanwhile (:meth:`delivered`) are then skipped when committed, else applied."""
        try:
            if ack is not None and (ack.get("error") or {}).get("err_code") == WRONG_LAST_SEQUENCE:
                log.info("cluster: session %s: fenced at sequence %d (another host appended first): catching up",
                         rep.name, rep.seq)
            if ack is None or ack_problem(ack, self.config.stream, rep.seq) is not None:
                return False  # (a duplicate too: the worker path checks what is stored at its sequence)
            self._commit_local(rep, ack["seq"], record[0], create=False, handle=handle, record=record)
            self.fast_appends += 1
            return True
        finally:
            rep.lock.release()
            held, rep.held = rep.held, None
            if held:
                self._held.discard(held[0][0])
                for seq, data, pending, timestamp in held:
                    if seq > rep.seq:  # another host's line (ours was refused): the applier's
                        self._queue(rep.name, seq, data, pending, timestamp)

    def _commit_local(self, rep: Replica, seq: int, line: bytes, create: bool, handle=None, record=None) -> None:
        """Commit one line of the stream to the local replica (caller holds rep.lock); ``record``:
        ``line`` as ``handle`` validated it already (this host's own line). A line this host
        cannot apply — refused by its validation (any client of the servers may publish), or
        of a session whose history here differs from the stream's — goes to the session's
        ``rejected.jsonl`` with its stream sequence instead, and is passed (SPEC §9)."""
        if seq <= rep.seq:
            return
        if handle is None:
            handle = self._handle(rep.name, create)
        if rep.diverged:  # (its sequence stays 0: a restart finds the clash again)
            handle.reject(line, Diverged(f"session {rep.name} here differs from stream {self.config.stream}'s "
                                         "(written before cluster mode): the stream's line is not applied"),
                          stream_seq=seq)
            return
        if rep.verify_tail:
            rep.verify_tail = False
            tail = handle.read_bytes(max(0, handle.file_len - len(line) - 1))
            if tail == line + b"\n" or tail.endswith(b"\n" + line + b"\n"):
                rep.seq = seq  # the log got it before a crash, the sidecar did not
                self._save(rep)
                return
        try:
            if record is None:
                record = handle.validate(line)
        except ValidationError as exc:  # not a line another memfs accepted
            log.warning("cluster: session %s: stream message %d refused here (in rejected.jsonl): %s",
                        rep.name, seq, exc)
            handle.reject(line, exc, stream_seq=seq)
            rep.seq = seq
            self._save(rep)
            return
        handle.append_records([record])
        rep.seq = seq
        self._save(rep)

    # --- the follower's side ---------------------------------------------------------------

    def delivered(self, name: str, seq: int, data: bytes, pending: int, timestamp: float) -> None:
        """The follower (:mod:`memfs.cluster.follow`, on the event loop) delivered stream
        message ``seq`` of session ``name``, with ``pending`` more in the stream after it, stored
        at ``timestamp``: skip it when this host has it (its own line, committed by its writer),
        hold it when the event loop awaits the ack of a line of that session (it is most likely
        that line, delivered before its ack: :meth:`finish_fast` then skips or queues it), else
        queue it for the applier thread."""
        self.delivered_seq = seq
        self.delivered_count += 1
        self.pending = pending
        if self._inbox.empty():  # this host's own line, committed by its writer: no hop to the applier
            rep = self.replicas.get(name)
            if rep is not None and rep.seq is not None:
                if seq <= rep.seq:
                    self.applied_seq = seq
                    if pending == 0:
                        self.oldest_unapplied = None
                    return
                if rep.held is not None:  # the event loop awaits the ack of a line of it: ours, most likely
                    if not rep.held:
                        self._held.add(seq)
                    rep.held.append((seq, data, pending, timestamp))
                    return
        self._queue(name, seq, data, pending, timestamp)

    def backlog(self) -> int:
        """Delivered messages waiting for the applier."""
        return self._inbox.qsize()

    def _queue(self, name: str, seq: int, data: bytes, pending: int, timestamp: float) -> None:
        if self.oldest_unapplied is None:
            self.oldest_unapplied = timestamp
        self._inbox.put((name, seq, data, pending))

    def _apply_loop(self) -> None:
        while True:
            try:
                item = self._inbox.get(timeout=CHECKPOINT_EVERY)
            except queue.Empty:  # idle (or only this host's own lines, which skip this thread)
                self._write_checkpoint()
                continue
            if item is None or self._stopping:
                return
            name, seq, data, pending = item
            try:
                rep = self.replica(name)
                with rep.lock:
                    self._ready(rep)
                    self._commit_local(rep, seq, data, create=True)
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
        """The session's validation, and no line longer than the servers take (``EFBIG``)."""
        node = self.node
        if len(line) > node.max_line:
            check_line_size(len(line), node.max_line, node.limit_name)
        return self.handle.validate(line)

    def reject(self, line: bytes, error, *, pid=None) -> None:
        self.handle.reject(line, error, pid=pid)

    def append(self, line: bytes, pid=None) -> None:
        try:
            record = self.validate(line)
        except ValidationError as exc:
            self.handle.reject(line, exc, pid=pid)
            raise
        self.append_records([record])

    def append_records(self, records) -> int:
        try:
            return self.node.append(self.handle.name, list(records))
        except ClusterError as exc:
            self.handle.note_failure(exc.strerror or str(exc))  # the writer's reason (user.memfs.last_error)
            raise
