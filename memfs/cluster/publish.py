"""The writer's side of a mount in cluster mode (SPEC §9): publish with the fence, then commit.

A *writer* — the filesystem's worker thread running a ``write()`` on ``events.jsonl`` — calls
:meth:`Publisher.append`: for each validated record, publish to ``memfs.<session>`` with
``Nats-Expected-Last-Subject-Sequence`` = the stream sequence of the last line of that session
this host applied (0: none) and ``Nats-Msg-Id`` = ``<host id>:<session>:<that
sequence>:<digest of the line>`` (:func:`msg_id`, deterministic: a retry of the same publish is
stored once, two hosts never share an id — the host id is unique per daemon start — nor two
lines of one host); once JetStream acknowledged it — an ack checked, not assumed
(:mod:`memfs.cluster.trust`) — commit the line to the local store through the store's one
commit. A refusal for a wrong last sequence (err_code 10071) means another host appended
first: catch up (fetch the session's messages after the last applied one and commit them),
revalidate, publish again. The event loop publishes one whole line per ``write()`` on its own
connection (:meth:`Publisher.claim_fast` … :meth:`Publisher.finish_fast`) unless
``MEMFS_CLUSTER_LOOP_CLIENT=0`` (:func:`loop_client_enabled`).

*Batches* (a ``write()`` of many lines) are published pipelined as JetStream **atomic
batches** (nats-server ≥ 2.12, stream setting ``allow_atomic``): up to :data:`BATCH_MAX`
messages sent back to back with ``Nats-Batch-Id`` / ``Nats-Batch-Sequence`` (the last with
``Nats-Batch-Commit``), one acknowledgement for all. Why this and not a chain of per-message
fences: JetStream numbers messages across every subject of the stream, so the sequence
message *i* will get is unknown until message *i-1* is acknowledged — a chain of
``Nats-Expected-Last-Subject-Sequence`` needs one round trip per line, and fencing only the
first message of a plain pipeline would let another host's line land between ours (and ours
still be stored after it: interleaving inside the window). An atomic batch is stored whole and
contiguous or not at all: only its first message carries the fence (the session's last applied
sequence), so the fence covers the whole batch; the ack gives the last sequence and the count,
hence each line's sequence (``last - count + 1 + i``). A refused batch (wrong last sequence:
another host appended first) stores nothing: catch up, revalidate the rest against the
caught-up state, send it again. A batch whose ack was lost (timeout) is sent again with the
same fence (under a new batch id: an unfinished batch is never reopened): if the first attempt
was stored, the retry is refused, and the catch-up recognises one of the attempts'
``Nats-Batch-Id`` in the messages it applies — those lines count as accepted and are not sent
again. A stream created without ``allow_atomic`` (before this, by hand) is updated to allow it
(:mod:`memfs.cluster.join`); when that is refused, batches fall back to one fenced publish per
line.

A per-session :class:`~memfs.cluster.replica.Replica` lock serializes the writer and the
applier of one session on this host; the session's own mutex is never held across a network
wait (the store takes it only inside each local commit).
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import time
import uuid

import nats
from nats.js.errors import APIError, NotFoundError

from memfs.cluster import SUBJECT_PREFIX
from memfs.cluster.apply import Applier
from memfs.cluster.join import Link
from memfs.cluster.replica import ClusterError, Replica, Replicas, UntrustedName
from memfs.cluster.trust import MESSAGE_TOO_BIG, ack_problem, is_this_publish
from memfs.errors import ValidationError
from memfs.store.paths import EVENTS, open_nofollow

log = logging.getLogger("memfs.cluster")

WRONG_LAST_SEQUENCE = 10071
MAX_FENCE_RETRIES = 100
BATCH_MAX = 256  # messages per atomic batch (the server takes up to 1,000)
LOOP_CLIENT = "MEMFS_CLUSTER_LOOP_CLIENT"  # "0": single-line writes take the worker path (nats-py)


def loop_client_enabled() -> bool:
    """Whether single-line writes may publish on the event loop's own connection
    (:mod:`memfs.cluster.wire`); ``MEMFS_CLUSTER_LOOP_CLIENT=0`` sends them through the
    worker path's ``nats-py`` connection instead (the follower stays on the event loop)."""
    return os.environ.get(LOOP_CLIENT, "1") != "0"


def msg_id(host_id: str, session: str, expected: int, line: bytes, salt: str = "") -> str:
    """A single publish's ``Nats-Msg-Id``: host, session, fence and a digest of the line. A
    retry of the same line on the same fence is stored once; another line on the same fence
    never shares its id (an append that timed out may have been stored: the host's next line,
    published on the same stale fence, must be refused by the fence and caught up, not
    deduplicated into it — the replicas diverged so before). ``salt``: after a duplicate ack
    naming another message (:mod:`memfs.cluster.trust`), the id of the publish again."""
    digest = hashlib.blake2b(line, digest_size=8).hexdigest()
    return f"{host_id}:{session}:{expected}:{digest}:{salt}" if salt else f"{host_id}:{session}:{expected}:{digest}"


class Publisher:
    """Fenced publishes of one mount's lines, catch-up after a fence refusal, and the publish
    of sessions written before cluster mode."""

    def __init__(self, link: Link, replicas: Replicas, applier: Applier, host_id: str):
        self.link = link
        self.config = link.config
        self.replicas = replicas
        self.applier = applier
        self.host_id = host_id
        self.loop_client = loop_client_enabled()
        self.fast_appends = 0  # lines published and committed on the event loop (finish_fast)
        self.stopping = False

    # --- the writer's side -----------------------------------------------------------------

    def append(self, name: str, records: list) -> int:
        """Publish ``records`` of session ``name`` with the fence, in order, each committed to
        the local store once JetStream acknowledged it; return how many. A failure raises
        ``OSError`` (``ETIMEDOUT`` when the cluster did not answer in time) whose ``accepted``
        counts the records that went in (run in a worker thread, never the trio loop)."""
        rep = self.replicas.get(name)
        done = 0
        with rep.lock:
            self.ready(rep)
            if rep.diverged:
                raise ClusterError(errno.EEXIST, f"cluster: session {name} here was written before cluster mode and "
                                   "differs from the stream's: not replicated, read-only here (move it away and "
                                   "remount to follow the stream's)")
            try:
                if len(records) > 1 and self.link.atomic:
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
                exc.accepted = done  # type: ignore[attr-defined]
                raise
        return done

    def _publish_one(self, rep: Replica, record) -> None:
        subject = SUBJECT_PREFIX + rep.name
        line = record[0]
        link = self.link
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
                ack = link.call(link.js.publish(subject, line, timeout=min(left, 1.0), headers=headers),
                                min(left, 1.0) + 0.5)
            except APIError as exc:
                if exc.err_code == MESSAGE_TOO_BIG:
                    raise ClusterError(errno.EFBIG, f"cluster: session {rep.name}: the line is over stream "
                                       f"{self.config.stream}'s max_msg_size") from exc
                if exc.err_code == WRONG_LAST_SEQUENCE and fences < MAX_FENCE_RETRIES:
                    fences += 1
                    log.info("cluster: session %s: fenced at sequence %d (another host appended first): catching up",
                             rep.name, expected)
                    self.catch_up(rep)  # another host appended first
                    deadline = time.monotonic() + self.config.timeout
                    continue
                if exc.err_code == WRONG_LAST_SEQUENCE:
                    raise ClusterError(errno.EAGAIN, f"cluster: session {rep.name}: fenced {fences} times") from exc
                log.debug("cluster: publish to %s: %s (retrying)", subject, exc)
                time.sleep(0.05)  # JetStream without a leader yet: retry until the deadline
                continue
            except (TimeoutError, nats.errors.Error) as exc:
                log.debug("cluster: publish to %s: %r (retrying with the same id)", subject, exc)
                if link.nc.is_closed:
                    raise ClusterError(errno.ENOTCONN, "cluster: connection closed") from exc
                time.sleep(0.05)  # no responders while the stream elects a new leader: not a busy loop
                continue
            problem = ack_problem({"stream": ack.stream, "seq": ack.seq, "duplicate": ack.duplicate},
                                  self.config.stream, expected)
            if problem is not None:  # checked, not assumed: is the message at that sequence this publish?
                try:
                    stored = link.call(link.js.get_msg(self.config.stream, seq=ack.seq), min(left, 1.0) + 0.5)
                except NotFoundError:
                    stored = None
                except (TimeoutError, nats.errors.Error, APIError) as exc:
                    log.debug("cluster: reading stream message %d: %r (publishing again, same id)", ack.seq, exc)
                    time.sleep(0.05)
                    continue
                if not is_this_publish(stored, subject, line, mid, expected):
                    log.warning("cluster: session %s: the ack of its line on fence %d is %s, another message: "
                                "publishing the line again under a new Nats-Msg-Id", rep.name, expected, problem)
                    salt = uuid.uuid4().hex[:8]
                    continue
            self.replicas.commit(rep, ack.seq, line, create=True)
            return

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
                ack = self.link.call(self._send_batch(subject, lines, rep.seq, batch_id, min(left, 2.0)),
                                     min(left, 2.0) + 0.5)
            except (TimeoutError, nats.errors.Error) as exc:
                log.debug("cluster: batch to %s: %r (sending it again, same fence)", subject, exc)
                if self.link.nc.is_closed:
                    raise ClusterError(errno.ENOTCONN, "cluster: connection closed") from exc
                time.sleep(0.05)
                continue
            error = ack.get("error")
            if error is None:
                problem = ack_problem(ack, self.config.stream, rep.seq, batch_id, len(lines))
                if problem is None:
                    first = ack["seq"] - ack["count"] + 1
                    for i, line in enumerate(lines):
                        self.replicas.commit(rep, first + i, line, create=True)
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
            ours = self.catch_up(rep, tried)  # another host appended first (or we did, unacked)
            if ours:
                return ours  # a previous attempt was stored whole: caught up with the rest
            handle = self.replicas.handle(rep.name, create=True)
            for line in lines:  # revalidate against the caught-up state
                handle.writes.validate(line)
            deadline = time.monotonic() + self.config.timeout

    async def _send_batch(self, subject: str, lines: list[bytes], expected: int, batch_id: str,
                          timeout: float) -> dict:
        """One atomic batch, pipelined: every message written to the connection without waiting,
        one reply for the commit (the first message's reply only opens the batch). Returns the
        ack's JSON (with ``error`` when refused)."""
        nc = self.link.nc
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

    # --- catch-up --------------------------------------------------------------------------

    def catch_up(self, rep: Replica, batch_ids: set[str] | frozenset[str] = frozenset()) -> int:
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
            self.replicas.commit(rep, msg.seq, msg.data, create=True)

    def _next_of(self, subject: str, after: int):
        """The stream's first message on ``subject`` after sequence ``after`` (None: none), asked
        again until the ``timeout``; then :class:`ClusterError` ``ETIMEDOUT`` (no quorum, or no
        server reachable: an append that needs it fails as one that is not acknowledged)."""
        link = self.link
        deadline = time.monotonic() + self.config.timeout
        while True:
            left = deadline - time.monotonic()
            try:
                return link.call(link.js.get_msg(self.config.stream, seq=after + 1, subject=subject, next=True),
                                 max(0.1, left))
            except NotFoundError:
                return None
            except (TimeoutError, nats.errors.Error, APIError) as exc:
                if time.monotonic() >= deadline:
                    raise ClusterError(errno.ETIMEDOUT, f"cluster: session {subject[len(SUBJECT_PREFIX):]}: no "
                                       f"answer from stream {self.config.stream} within {self.config.timeout:g} s "
                                       "(no quorum, or no server reachable)") from exc
                log.debug("cluster: reading %s after %d: %r (asking again)", subject, after, exc)
                time.sleep(0.05)

    # --- the fast path of one line from the filesystem's event loop --------------------------

    def claim_fast(self, name: str) -> Replica | None:
        """For one validated line written from an event loop (the filesystem's ``write()``):
        this session's replica, its lock taken without waiting, when its state is known here
        and nothing else holds it; None otherwise (the caller takes the worker-thread path,
        :meth:`append`), and always when :func:`loop_client_enabled` is false. The caller then
        publishes :meth:`fast_request` and calls :meth:`finish_fast` — which releases the lock
        whatever happened."""
        rep = self.replicas.by_name.get(name)
        if (rep is None or rep.seq is None or rep.unpublished or rep.diverged or self.link.js is None
                or not self.loop_client):
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
        session handle: nothing to open) and release the lock; False — lock released, nothing
        committed — when ``ack`` (the JetStream reply) is not an acknowledgement of this stream
        (the caller retries on the worker path: the same fence and id, so a publish that was in
        fact stored is deduplicated, and a fenced one is caught up there). The deliveries of the
        session held meanwhile (:meth:`memfs.cluster.apply.Applier.delivered`) are then skipped
        when committed, else applied."""
        try:
            if ack is not None and (ack.get("error") or {}).get("err_code") == WRONG_LAST_SEQUENCE:
                log.info("cluster: session %s: fenced at sequence %d (another host appended first): catching up",
                         rep.name, rep.seq)
            if ack is None or ack_problem(ack, self.config.stream, rep.seq) is not None:
                return False  # (a duplicate too: the worker path checks what is stored at its sequence)
            self.replicas.commit(rep, ack["seq"], record[0], create=False, handle=handle, record=record)
            self.fast_appends += 1
            return True
        finally:
            rep.lock.release()
            self.applier.release(rep)

    # --- sessions written before cluster mode ----------------------------------------------

    def ready(self, rep: Replica) -> None:
        """Load the replica's sidecar, then publish the local lines of a session written before
        cluster mode (caller holds rep.lock; may wait for the cluster: never on the trio loop)."""
        self.replicas.load(rep)
        if rep.unpublished:
            self._publish_local(rep)

    def publish_local_sessions(self) -> int:
        """Publish every local session written before this store was in cluster mode (a
        non-empty log and no sidecar for this stream); return how many. Runs on its own thread
        after the join; a writer or the applier reaching such a session first publishes it the
        same way (:meth:`ready`)."""
        published = 0
        for name in self.replicas.store.names():
            if self.stopping:
                break
            if os.path.exists(self.replicas.sidecar(name)):
                continue
            try:
                rep = self.replicas.get(name)
                with rep.lock:
                    self.replicas.load(rep)
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

        fd = open_nofollow(self.replicas.store.root / rep.name / EVENTS, os.O_RDONLY)
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
                self.replicas.save(rep)
                rep.unpublished = False
                self.catch_up(rep)
                return
            if chunk:
                self._publish_lines(rep, chunk)
            elif known:
                self.replicas.save(rep)
        finally:
            os.close(fd)
        rep.unpublished = False
        log.info("cluster: session %s: published its local lines (through stream sequence %d; %d were in the "
                 "stream already)", rep.name, rep.seq, known)

    def _diverged(self, rep: Replica) -> None:
        rep.unpublished, rep.diverged, rep.seq = False, True, 0
        log.error("cluster: session %s exists in this store (written before cluster mode) and in stream %s "
                  "with another history: left as it is here, not replicated; move %s away and remount to "
                  "follow the stream's", rep.name, self.config.stream, self.replicas.store.root / rep.name)

    def _publish_lines(self, rep: Replica, lines: list[bytes]) -> None:
        """Publish lines the local log already holds, fenced, without committing them again."""
        subject = SUBJECT_PREFIX + rep.name
        link = self.link
        deadline = time.monotonic() + self.config.timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ClusterError(errno.ETIMEDOUT, f"cluster: session {rep.name}: no acknowledgement within "
                                   f"{self.config.timeout:g} s publishing its local lines")
            try:
                if link.atomic:
                    ack = link.call(self._send_batch(subject, lines, rep.seq, uuid.uuid4().hex, min(left, 2.0)),
                                    min(left, 2.0) + 0.5)
                    error = ack.get("error")
                    if error is None:
                        rep.seq = ack["seq"]
                        break
                    code = error.get("err_code")
                else:
                    for line in lines:
                        headers = {"Nats-Expected-Last-Subject-Sequence": str(rep.seq)}
                        got = link.call(link.js.publish(subject, line, timeout=min(left, 1.0), headers=headers),
                                        min(left, 1.0) + 0.5)
                        rep.seq = got.seq
                    break
            except APIError as exc:
                code = exc.err_code
            except (TimeoutError, nats.errors.Error) as exc:
                log.debug("cluster: publishing local lines of %s: %r (retrying)", rep.name, exc)
                time.sleep(0.05)
                continue
            if code == WRONG_LAST_SEQUENCE:  # another host wrote this session meanwhile
                rep.unpublished, rep.diverged = False, True
                raise ClusterError(errno.EEXIST, f"cluster: session {rep.name} was written on another host while "
                                   "this one published its local lines: left as it is here, not replicated")
            time.sleep(0.05)  # no stream leader yet: retry until the deadline
        self.replicas.save(rep)
