"""Cluster mode (SPEC §9): many hosts, one memory, on NATS JetStream.

This module only describes the settings (:class:`ClusterConfig`) and imports nothing of NATS:
``memfs mount`` without ``--cluster`` never loads :mod:`memfs.cluster.node`, nor ``nats``.

* :mod:`memfs.cluster.node` — :class:`~memfs.cluster.node.ClusterNode`: one mount's
  membership, made of the NATS connection and join (:mod:`memfs.cluster.join`), the fenced
  publish of validated lines (:mod:`memfs.cluster.publish`), the applier of every host's lines
  and the checkpoint (:mod:`memfs.cluster.apply`), the per-session sidecar
  ``index/cluster.json`` (:mod:`memfs.cluster.replica`).
* :class:`~memfs.cluster.node.ClusterSession` — what the filesystem's line appender writes
  through in cluster mode, instead of the session handle.
* :mod:`memfs.cluster.trust` — the trust boundary: names from subjects, acks, the host id, the
  longest line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

DEFAULT_STREAM = "MEMFS"
DEFAULT_BACKLOG = 10_000  # stream messages waiting for the applier before the follower pauses delivery
DEFAULT_TIMEOUT = 5.0  # seconds an append waits for JetStream before it fails with ETIMEDOUT
SUBJECT_PREFIX = "memfs."
# the authentication keys of [cluster] (memfs.cluster.auth); the paths among them are relative
# to the config file
AUTH_KEYS = ("user", "password_file", "token_file", "creds", "tls_ca", "tls_cert", "tls_key")
AUTH_PATH_KEYS = ("password_file", "token_file", "creds", "tls_ca", "tls_cert", "tls_key")
_USERINFO = re.compile(r"\b([a-z][a-z0-9+.-]*://)([^/@\s]*)@", re.I)


@dataclass(slots=True)
class ClusterConfig:
    """The ``[cluster]`` settings: ``servers`` (``nats://host:port`` URLs), ``stream``
    (default ``MEMFS``), ``replicas`` (default: 3 with three or more servers, else 1),
    ``timeout`` (seconds, default 5), ``max_age`` / ``max_bytes`` (the stream's own
    limits, 0: none; used only when memfs creates the stream), and ``backlog`` (default
    10,000: how many delivered messages may wait for the applier in memory before the
    follower holds the stream's flow control, so that catching up a long stream takes
    bounded memory).

    Authentication and TLS (:mod:`memfs.cluster.auth`; at most one way to authenticate):
    ``user`` + ``password_file``, ``token_file``, ``creds`` (an NKey seed or a ``.creds``
    file), or credentials in the URLs; ``tls_ca`` (trust this CA only), ``tls_cert`` +
    ``tls_key`` (the client certificate). Secrets live in files, never in the settings."""

    servers: list[str] = field(default_factory=list)
    stream: str = DEFAULT_STREAM
    replicas: int | None = None
    timeout: float = DEFAULT_TIMEOUT
    max_age: float = 0.0
    max_bytes: int = 0
    backlog: int = DEFAULT_BACKLOG
    user: str | None = None
    password_file: str | None = None
    token_file: str | None = None
    creds: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None

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
        if bool(self.user) != bool(self.password_file):
            raise ConfigError("cluster.user and cluster.password_file go together")
        ways = [w for w, on in (("user/password_file", self.user), ("token_file", self.token_file),
                                ("creds", self.creds)) if on]
        if any(has_userinfo(u) for u in self.servers):
            ways.append("credentials in the URLs")
        if len(ways) > 1:
            raise ConfigError(f"cluster: choose one way to authenticate, not {' and '.join(ways)}")
        if self.tls_key and not self.tls_cert:
            raise ConfigError("cluster.tls_key needs cluster.tls_cert")
        return self

    def __repr__(self) -> str:  # (URL userinfo hidden wherever a config is shown)
        return redact(f"ClusterConfig(servers={self.servers!r}, stream={self.stream!r})")


def parse_servers(text: str) -> list[str]:
    """``nats://a:4222,nats://b:4222`` → the list of URLs."""
    return [u.strip() for u in text.split(",") if u.strip()]


def redact(text: str) -> str:
    """``text`` with every URL's userinfo hidden: ``nats://user:***@host``, ``nats://***@host``
    (a token). Whatever memfs shows of the servers (xattrs, logs, messages) goes through it."""
    if "@" not in text:
        return text
    return _USERINFO.sub(lambda m: f"{m[1]}{m[2].partition(':')[0] + ':***' if ':' in m[2] else '***'}@", text)


def has_userinfo(url: str) -> bool:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return parts.username is not None or parts.password is not None
