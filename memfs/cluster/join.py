"""The *NATS thread* of a mount in cluster mode (SPEC §9): an asyncio loop with the ``nats-py``
connection, and the join — connect, make sure the stream exists (and takes atomic batches),
learn the longest line the servers take.

Other threads hand the loop coroutines (:meth:`Link.call`) and wait for their results with a
deadline; the trio loop never does.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import nats
from nats.js import JetStreamContext, api
from nats.js.errors import APIError, NotFoundError

from memfs.cluster import SUBJECT_PREFIX, ClusterConfig, redact
from memfs.cluster.auth import Credentials, Refused, check_tls_offered, refusal
from memfs.cluster.trust import HEADER_ROOM, line_limit

log = logging.getLogger("memfs.cluster")

# seconds the join waits for each JetStream API reply before it asks again (at most the
# ``timeout``): a request made while JetStream has no leader (a cluster starting, no quorum) is
# often not answered at all, and waiting out a ``timeout`` raised to ride out elections
# kept the mount down that long after the cluster could answer
JOIN_ATTEMPT = 2.0


class Link:
    """One mount's ``nats-py`` connection, on a loop thread of its own, and what the join
    learnt of the stream."""

    def __init__(self, config: ClusterConfig, auth: Credentials, host_id: str):
        self.config = config
        self.auth = auth
        self.host_id = host_id
        self.loop = asyncio.new_event_loop()
        self.nc: nats.NATS | None = None
        self.js: JetStreamContext | None = None
        self._thread = threading.Thread(target=self._run_loop, name="memfs-nats", daemon=True)
        self.atomic = False  # the stream takes atomic batches (set on connect)
        self.max_line = line_limit(1 << 20, None)  # the longest line published (set on connect)
        self.limit_name = "cluster mode"  # where it comes from, for the reason of a refusal
        self.stream_created = ""  # the stream's creation time (set on connect)
        self.last_seq = 0  # the stream's last sequence when joined

    def start(self) -> None:
        """Start the loop thread, connect and join; raise when the cluster cannot be reached
        within the timeout (the caller then :meth:`close`\\ s)."""
        self._thread.start()
        # (the join's own deadline, timeout × 2, ends it first, with the stream's answer)
        self.call(self._connect(), self.config.timeout * 3 + 1)

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, coro, timeout: float):
        """Run ``coro`` on the NATS thread; its result, or ``TimeoutError`` after ``timeout``."""
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
        self.nc = nats.NATS()  # (assigned first: close() closes it whatever connect did)
        await self.nc.connect(self.config.servers, name=f"memfs {self.host_id}",
                              connect_timeout=max(1, int(self.config.timeout)), max_reconnect_attempts=-1,
                              reconnect_time_wait=0.25,  # type: ignore[arg-type]  # (annotated int; a float works)
                              disconnected_cb=disconnected,
                              reconnected_cb=reconnected, error_cb=error, **self.auth.nats_options())
        self.js = self.nc.jetstream(timeout=self.config.timeout)
        attempt = min(self.config.timeout, JOIN_ATTEMPT)
        join_js = self.nc.jetstream(timeout=attempt)
        deadline = time.monotonic() + self.config.timeout * 2
        unanswered = 0
        while True:  # a cluster just started may answer 400/503, or not at all, until its leaders are elected
            try:
                return await self._join(join_js)
            except (TimeoutError, APIError, nats.errors.TimeoutError) as exc:
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
        """Make sure the stream exists (and takes atomic batches); note its creation time and
        last sequence (where following starts is the applier's: its checkpoint). ``js``: the
        join's JetStream context (its requests time out after :data:`JOIN_ATTEMPT`)."""
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
        self.stream_created = str(info.created)
        size = info.config.max_msg_size
        self.max_line = line_limit(self.nc.max_payload, size)
        self.limit_name = (f"cluster mode: the server's max_payload of {self.nc.max_payload} bytes"
                           + (f" or stream {cfg.stream}'s max_msg_size of {size}" if size and size > 0 else "")
                           + f", less {HEADER_ROOM} for the message's headers")
        self.last_seq = info.state.last_seq

    def close(self) -> None:
        """Close the connection and stop the loop thread (best effort)."""
        if self.nc is not None and self.loop.is_running():
            try:
                self.call(self.nc.close(), 5)
            except Exception as exc:  # closing is best effort
                log.debug("cluster: close: %s", exc)
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5)
