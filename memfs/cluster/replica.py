"""This host's replica of each session of the stream (SPEC §9): its last applied sequence, its
sidecar, and the one local commit of a stream line.

The last applied sequence of each session is kept in ``index/cluster.json`` (rewritten in
place after each applied line: ``{"stream": …, "seq": N}``), so a restarted host resumes
there. A crash between the log's write and the sidecar's leaves the log one line ahead; the
first message after the sidecar's sequence is then compared with the log's last line, and
skipped when equal.

A session name from a subject must be one ``mkdir`` takes (:meth:`Replicas.get`), and a line
this host cannot apply goes to the session's ``rejected.jsonl`` with its stream sequence
(:meth:`Replicas.commit`).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import threading
from pathlib import Path

from memfs.cluster.trust import Diverged
from memfs.errors import AlreadyExists, NotFound, ValidationError
from memfs.store.paths import EVENTS, INDEX_DIR, new_session_name_problem
from memfs.store.sessiondirs import is_session_dir

log = logging.getLogger("memfs.cluster")

SIDECAR = "cluster.json"
SIDECAR_WIDTH = 96  # the sidecar is rewritten in place at a fixed width (one small pwrite)


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


class Replicas:
    """Every session's :class:`Replica` on this store, and their local commits."""

    def __init__(self, store, config):
        self.store = store
        self.config = config
        self.by_name: dict[str, Replica] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> Replica:
        """Session ``name``'s replica; :class:`UntrustedName` when ``mkdir`` would refuse the
        name (SPEC §9: a name from a subject never reaches a path unchecked)."""
        rep = self.by_name.get(name)
        if rep is not None:
            return rep
        problem = new_session_name_problem(name)
        if problem:
            raise UntrustedName(problem)
        with self._lock:
            rep = self.by_name.get(name)
            if rep is None:
                rep = self.by_name[name] = Replica(name)
            return rep

    def sidecar(self, name: str) -> Path:
        """Session ``name``'s ``index/cluster.json``."""
        return self.store.root / name / INDEX_DIR / SIDECAR

    def load(self, rep: Replica) -> None:
        """Read the session's last applied sequence from its sidecar (caller holds rep.lock)."""
        if rep.seq is not None:
            return
        if not is_session_dir(self.store.root / rep.name):  # none here (a symlink is none: never followed)
            rep.seq = 0
            return
        try:
            with open(self.sidecar(rep.name), "rb") as f:
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

    def save(self, rep: Replica) -> None:
        """Record ``rep.seq`` in the session's sidecar (caller holds rep.lock)."""
        text = ('{"stream":"%s","seq":%d}' % (self.config.stream, rep.seq)).encode()
        text = text.ljust(SIDECAR_WIDTH - 1) + b"\n"
        if rep.sidecar is None:
            rep.sidecar = str(self.sidecar(rep.name))
        fd = os.open(rep.sidecar, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.pwrite(fd, text, 0)
        finally:
            os.close(fd)

    def seq_of(self, name: str) -> int:
        """The last stream sequence applied to session ``name`` on this host (0: none); never
        waits for a writer (the trio loop asks: the sidecar is read when not loaded yet)."""
        rep = self.by_name.get(name)
        if rep is not None and rep.seq is not None:
            return rep.seq
        probe = Replica(name)
        self.load(probe)
        return probe.seq

    def handle(self, name: str, create: bool):
        """The store's handle of session ``name``, made when ``create`` and missing."""
        try:
            return self.store.open(name)
        except NotFound:
            if not create:
                raise
        try:
            return self.store.create(name)
        except AlreadyExists:
            return self.store.open(name)

    def commit(self, rep: Replica, seq: int, line: bytes, create: bool, handle=None, record=None) -> None:
        """Commit one line of the stream to the local replica (caller holds rep.lock); ``record``:
        ``line`` as ``handle`` validated it already (this host's own line). A line this host
        cannot apply — refused by its validation (any client of the servers may publish), or
        of a session whose history here differs from the stream's — goes to the session's
        ``rejected.jsonl`` with its stream sequence instead, and is passed (SPEC §9)."""
        if seq <= rep.seq:
            return
        if handle is None:
            handle = self.handle(rep.name, create)
        if rep.diverged:  # (its sequence stays 0: a restart finds the clash again)
            diverged = Diverged(f"session {rep.name} here differs from stream {self.config.stream}'s "
                                "(written before cluster mode): the stream's line is not applied")
            handle.writes.reject(line, diverged, stream_seq=seq)
            return
        if rep.verify_tail:
            rep.verify_tail = False
            tail = handle.read_bytes(max(0, handle.file_len - len(line) - 1))
            if tail == line + b"\n" or tail.endswith(b"\n" + line + b"\n"):
                rep.seq = seq  # the log got it before a crash, the sidecar did not
                self.save(rep)
                return
        try:
            if record is None:
                record = handle.writes.validate(line)
        except ValidationError as exc:  # not a line another memfs accepted
            log.warning("cluster: session %s: stream message %d refused here (in rejected.jsonl): %s",
                        rep.name, seq, exc)
            handle.writes.reject(line, exc, stream_seq=seq)
            rep.seq = seq
            self.save(rep)
            return
        handle.writes.append_records([record])
        rep.seq = seq
        self.save(rep)
