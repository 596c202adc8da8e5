"""Cluster mode (SPEC §9): many hosts, one memory, on NATS JetStream.

This module only describes the settings (:class:`ClusterConfig`) and imports nothing of NATS:
``memfs mount`` without ``--cluster`` never loads :mod:`memfs.cluster.node`, nor ``nats``.

* :mod:`memfs.cluster.node` — :class:`~memfs.cluster.node.ClusterNode`: one connection per
  mount, the fenced publish of validated lines, the follower that applies every host's lines
  to the local store, the per-session sidecar ``index/cluster.json``.
* :class:`~memfs.cluster.node.ClusterSession` — what the filesystem's line appender writes
  through in cluster mode, instead of the session handle.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_STREAM = "MEMFS"
DEFAULT_BACKLOG = 10_000  # stream messages waiting for the applier before the follower pauses delivery
DEFAULT_TIMEOUT = 5.0  # seconds an append waits for JetStream before it fails with ETIMEDOUT
SUBJECT_PREFIX = "memfs."


@dataclass(slots=True)
class ClusterConfig:
    """The ``[cluster]`` settings: ``servers`` (``nats://host:port`` URLs), ``stream``
    (default ``MEMFS``), ``replicas`` (default: 3 with three or more servers, else 1),
    ``timeout`` (seconds, default 5), ``max_age`` / ``max_bytes`` (the stream's own
    limits, 0: none; used only when memfs creates the stream), and ``backlog`` (default
    10,000: how many delivered messages may wait for the applier in memory before the
    follower holds the stream's flow control, so that catching up a long stream takes
    bounded memory)."""

    servers: list[str] = field(default_factory=list)
    stream: str = DEFAULT_STREAM
    replicas: int | None = None
    timeout: float = DEFAULT_TIMEOUT
    max_age: float = 0.0
    max_bytes: int = 0
    backlog: int = DEFAULT_BACKLOG

    @property
    def enabled(self) -> bool:
        return bool(self.servers)

    @property
    def effective_replicas(self) -> int:
        if self.replicas is not None:
            return self.replicas
        return 3 if len(self.servers) >= 3 else 1

    def validate(self) -> ClusterConfig:
        from memfs.config import ConfigError

        for url in self.servers:
            if not url.startswith(("nats://", "tls://")):
                raise ConfigError(f"cluster.servers: {url!r} is not a nats:// URL")
        if not self.stream or not self.stream.replace("_", "").replace("-", "").isalnum():
            raise ConfigError(f"cluster.stream must be a name of letters, digits, - and _, not {self.stream!r}")
        if self.replicas is not None and not 1 <= self.replicas <= 5:
            raise ConfigError("cluster.replicas must be between 1 and 5")
        if self.timeout <= 0:
            raise ConfigError("cluster.timeout must be positive")
        if self.max_age < 0 or self.max_bytes < 0:
            raise ConfigError("cluster.max_age and cluster.max_bytes must not be negative")
        if self.backlog < 1:
            raise ConfigError("cluster.backlog must be at least 1")
        return self


def parse_servers(text: str) -> list[str]:
    """``nats://a:4222,nats://b:4222`` → the list of URLs."""
    return [u.strip() for u in text.split(",") if u.strip()]
