"""Cluster authentication and TLS (SPEC §9 "Trust boundary"), for real: nats-server clusters
started here with users (password, NKey), a token, JWTs (operator mode) and TLS with a CA made
here and client certificates required (``verify: true``). Two hosts mount each (A appends, B
follows), a wrong credential fails the mount within seconds naming the server and the cause,
and no secret shows in the root's xattrs, ``memfs mounts``, the log or the daemon's command line."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
from memfs.cluster.testing import make_certs, new_nkey, operator_mode

from cluster import NatsCluster, require
from mounting import event, is_mounted, mounted, needs_fuse, sh
from test_cluster import delete_stream, stream_name, wait_for

nats = require("nats", "nkeys")

pytestmark = needs_fuse

FAIL_WITHIN = 10.0  # seconds a refused mount may take, all told (it used to time out after 17 s)


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    """Three routed servers that take only TLS with a client certificate signed by their CA,
    and only the user ``agent`` (password) or an NKey user."""
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make the test's certificates (apt install openssl)")
    d = tmp_path_factory.mktemp("secure")
    certs = make_certs(d / "certs")
    password = "pw-" + secrets.token_hex(8)
    seed, public = new_nkey()
    conf = (f'accounts {{ MEMFS {{ jetstream: enabled\n'
            f'  users: [ {{user: agent, password: "{password}"}}, {{nkey: {public}}} ] }} }}\n'
            f'tls {{ cert_file: "{certs["server_cert"]}", key_file: "{certs["server_key"]}", '
            f'ca_file: "{certs["ca"]}", verify: true, timeout: 2 }}\n')
    cluster = NatsCluster.started(d / "nats", conf=conf)
    try:
        yield SimpleNamespace(cluster=cluster, urls=cluster.urls, certs=certs, password=password,
                              seed=secret_file(d / "agent.nk", seed.decode()),
                              password_file=secret_file(d / "password", password),
                              tls={"tls_ca": certs["ca"], "tls_cert": certs["client_cert"],
                                   "tls_key": certs["client_key"]})
    finally:
        cluster.stop()


@pytest.fixture
def stream(secure, request):
    """A stream of this test's own on the shared secure cluster, deleted after it (streams may
    not share the ``memfs.>`` subjects)."""
    name = stream_name(request)
    yield name

    import ssl

    tls = ssl.create_default_context(cafile=str(secure.certs["ca"]))
    tls.load_cert_chain(secure.certs["client_cert"], secure.certs["client_key"])
    delete_stream(secure.urls, name, user="agent", password=secure.password, tls=tls)


def secret_file(path: Path, text: str) -> Path:
    path.write_text(text + "\n")
    path.chmod(0o600)
    return path


def cluster_toml(path: Path, stream: str, **keys) -> Path:
    """A config file with a ``[cluster]`` table: ``stream``, a 5 s timeout and ``keys``."""
    lines = [f'stream = "{stream}"', "timeout = 5", *(f'{k} = "{v}"' for k, v in keys.items())]
    path.write_text("[cluster]\n" + "\n".join(lines) + "\n")
    return path


def memfs(*argv, env=None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memfs", *map(str, argv)], capture_output=True, text=True,
                          env=env, timeout=timeout)


def a_writes_b_follows(a, b, session: str = "s") -> None:
    """A's event-loop connection comes up (it authenticated too), A appends one line per write(),
    B's replica gets the same bytes."""
    wait_for(lambda: os.getxattr(a.mnt, "user.memfs.cluster_direct") != b"-", what="A's event-loop connection")
    os.mkdir(a.mnt / "sessions" / session)
    lines = [event("thread.started", thread_id="t"), event("turn.started"),
             *(event("item.completed", item={"id": f"m{i}", "type": "agent_message", "text": f"line {i}"})
               for i in range(5))]
    path = a.mnt / "sessions" / session / "events.jsonl"
    for line in lines:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
    b_log = b.store / session / "events.jsonl"
    wait_for(lambda: b_log.exists() and b_log.read_bytes() == (a.store / session / "events.jsonl").read_bytes(),
             what="B to follow A")
    assert len(b_log.read_bytes().splitlines()) == len(lines)
    assert int(os.getxattr(a.mnt, "user.memfs.cluster_direct_appends")) >= 1  # the event loop's connection


def two_hosts(stack: ExitStack, tmp_path: Path, urls: str, config: Path) -> tuple:
    return tuple(stack.enter_context(mounted(tmp_path / f"s{h}", tmp_path / h, "--cluster", urls,
                                             "--config", str(config))) for h in "AB")


def test_user_and_password_file_over_tls_on_a_three_node_cluster(secure, tmp_path, stream):
    config = cluster_toml(tmp_path / "c.toml", stream, user="agent",
                          password_file=secure.password_file, **secure.tls)
    with ExitStack() as stack:
        a, b = two_hosts(stack, tmp_path, secure.urls, config)
        a_writes_b_follows(a, b)
        shown = sh(f"getfattr -d -m - {a.mnt}", tmp_path).stdout
        assert "user.memfs.cluster=" in shown and secure.password not in shown
    assert secure.password not in a.log_text() + b.log_text()


def test_nkey_seed_file_over_tls(secure, tmp_path, stream):
    config = cluster_toml(tmp_path / "c.toml", stream, creds=secure.seed, **secure.tls)
    with ExitStack() as stack:
        a, b = two_hosts(stack, tmp_path, secure.urls, config)
        a_writes_b_follows(a, b)


def test_creds_file_with_a_user_jwt(tmp_path, request):
    """Operator mode: the server knows accounts by their JWTs; the user's .creds file carries its
    JWT and the seed that signs the server's nonce."""
    conf, creds = operator_mode(tmp_path / "op")
    cluster = NatsCluster.started(tmp_path / "nats", size=1, conf=conf)
    try:
        config = cluster_toml(tmp_path / "c.toml", stream_name(request), creds=creds)
        with ExitStack() as stack:
            a, b = two_hosts(stack, tmp_path, cluster.urls, config)
            a_writes_b_follows(a, b)
    finally:
        cluster.stop()


def test_token_file_and_a_wrong_token(tmp_path, request):
    token = "tok-" + secrets.token_hex(12)
    cluster = NatsCluster.started(tmp_path / "nats", size=1, conf=f'authorization {{ token: "{token}" }}\n')
    try:
        config = cluster_toml(tmp_path / "c.toml", stream_name(request),
                              token_file=secret_file(tmp_path / "token", token))
        with ExitStack() as stack:
            a, b = two_hosts(stack, tmp_path, cluster.urls, config)
            a_writes_b_follows(a, b)
            shown = sh(f"getfattr -d -m - {a.mnt}", tmp_path).stdout
            assert token not in shown
        wrong = cluster_toml(tmp_path / "w.toml", stream_name(request),
                             token_file=secret_file(tmp_path / "wrong", "tok-wrong"))
        refused(tmp_path, cluster.urls, wrong, "authorization failed", f"the token in {tmp_path / 'wrong'}")
        refused(tmp_path, cluster.urls, None, "authorization failed", "no credentials given")
        # TLS configured, the server offers none: refused before any credential is sent
        plain = cluster_toml(tmp_path / "p.toml", stream_name(request), tls_ca=make_certs(tmp_path / "certs")["ca"],
                             token_file=secret_file(tmp_path / "token", token))
        refused(tmp_path, cluster.urls, plain, "TLS failed", "the server does not offer TLS")
    finally:
        cluster.stop()


def refused(tmp_path: Path, urls: str, config: Path | None, *expected: str) -> str:
    """``memfs mount`` with ``config`` fails within :data:`FAIL_WITHIN` seconds, its last line
    saying ``expected`` and which server; nothing is left mounted. That line."""
    mnt = tmp_path / "R"
    started = time.monotonic()
    result = memfs("mount", tmp_path / "sr", mnt, "--cluster", urls, *(("--config", config) if config else ()),
                   timeout=60)
    took = time.monotonic() - started
    try:
        assert result.returncode == 1, result.stderr
        assert took < FAIL_WITHIN, f"the refused mount took {took:.1f} s"
        line = result.stderr.strip().splitlines()[-1]
        assert line.startswith("memfs: cannot join the cluster: "), result.stderr
        for text in expected:
            assert text in line, line
        ports = [url.rsplit(":", 1)[1] for url in urls.split(",")]
        assert any(f"@127.0.0.1:{port} (" in line or f" at nats://127.0.0.1:{port} (" in line for port in ports), line
        return line
    finally:
        if is_mounted(mnt):  # (a failure above must not leave it)
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], check=False)


@pytest.mark.parametrize("case", ["password", "password in the URL", "nkey", "ca", "no client certificate"])
def test_a_wrong_credential_fails_the_mount_within_seconds(secure, tmp_path, case):
    stream = "NEVER"  # (never made: the mount fails before)
    urls = secure.urls
    if case == "password":
        config = cluster_toml(tmp_path / "c.toml", stream, user="agent",
                              password_file=secret_file(tmp_path / "pw", "not-it"), **secure.tls)
        expected = ("authorization failed", "'Authorization Violation'",
                    f"user 'agent' with the password in {tmp_path / 'pw'}")
    elif case == "password in the URL":
        urls = ",".join(u.replace("nats://", "nats://agent:not-it@") for u in urls.split(","))
        config = cluster_toml(tmp_path / "c.toml", stream, **secure.tls)
        expected = ("authorization failed", "nats://agent:***@127.0.0.1:")
    elif case == "nkey":
        other = secret_file(tmp_path / "other.nk", new_nkey()[0].decode())  # a seed the servers do not know
        config = cluster_toml(tmp_path / "c.toml", stream, creds=other, **secure.tls)
        expected = ("authorization failed", f"the NKey in {tmp_path / 'other.nk'}")
    elif case == "ca":
        other = make_certs(tmp_path / "other")
        config = cluster_toml(tmp_path / "c.toml", stream, user="agent", password_file=secure.password_file,
                              tls_ca=other["ca"], tls_cert=secure.certs["client_cert"],
                              tls_key=secure.certs["client_key"])
        expected = ("TLS failed", "certificate", f"trusting the CA in {other['ca']}")
    else:
        config = cluster_toml(tmp_path / "c.toml", stream, user="agent", password_file=secure.password_file,
                              tls_ca=secure.certs["ca"])
        expected = ("TLS failed", "the server refused the client certificate")
    line = refused(tmp_path, urls, config, *expected)
    assert "not-it" not in line and secure.password not in line


@contextmanager
def daemon(store: Path, mnt: Path, *args: str, env: dict):
    """``memfs mount --daemon``: the server's pid; unmounted and gone afterwards, whatever happens."""
    result = memfs("mount", store, mnt, "--daemon", *args, env=env)
    assert result.returncode == 0, result.stderr
    pid = int(result.stdout.split()[-1])
    try:
        yield pid
    finally:
        memfs("umount", mnt, env=env)
        if is_mounted(mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], check=False)
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


def test_no_secret_in_xattrs_mounts_log_or_the_daemons_command_line(secure, tmp_path, stream):
    """Two daemons, one with ``password_file``, one with the password in its URLs (on its own
    command line, so hidden there once it runs), both logging at DEBUG."""
    (tmp_path / "run").mkdir(mode=0o700)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path / "run"), "XDG_STATE_HOME": str(tmp_path / "state")}
    with_file = cluster_toml(tmp_path / "f.toml", stream, user="agent", password_file=secure.password_file,
                             **secure.tls)
    tls_only = cluster_toml(tmp_path / "t.toml", stream, **secure.tls)
    in_url = ",".join(u.replace("nats://", f"nats://agent:{secure.password}@") for u in secure.urls.split(","))
    with ExitStack() as stack:
        pids = {"F": stack.enter_context(daemon(tmp_path / "sf", tmp_path / "F", "--cluster", secure.urls,
                                                "--config", with_file, "--log-level", "DEBUG", env=env)),
                "U": stack.enter_context(daemon(tmp_path / "su", tmp_path / "U", "--cluster", in_url,
                                                "--config", tls_only, "--log-level", "DEBUG", env=env))}
        for name in pids:
            mnt = tmp_path / name
            wait_for(lambda: os.getxattr(mnt, "user.memfs.cluster_direct") != b"-",  # noqa: B023 (called now)
                     what=f"{name}'s connection")
        a, b = (SimpleNamespace(mnt=tmp_path / h, store=tmp_path / f"s{h.lower()}") for h in "FU")
        a_writes_b_follows(a, b)  # (so that the logs have said what they say about a connection)
        listed = {m["mountpoint"]: m for m in json.loads(memfs("mounts", "--json", env=env).stdout)}
        shown = {"mounts": memfs("mounts", env=env).stdout, "mounts --json": json.dumps(listed)}
        for name, pid in pids.items():
            mnt = tmp_path / name
            shown[f"{name} xattrs"] = sh(f"getfattr -d -m - {mnt}", tmp_path).stdout
            shown[f"{name} log"] = Path(listed[str(mnt)]["log"]).read_text()
            shown[f"{name} cmdline"] = Path(f"/proc/{pid}/cmdline").read_bytes().decode().replace("\0", " ")
        assert "nats://agent:***@127.0.0.1:" in shown["U xattrs"]  # the URLs are shown, their password not
        assert "nats://agent:***@127.0.0.1:" in shown["U cmdline"]
        assert "cluster: " in shown["U log"] and "agent:***@" in shown["U log"]
        leaks = [where for where, text in shown.items() if secure.password in text]
        assert not leaks, f"the password shows in {leaks}"


def test_settings_are_checked_and_a_missing_secret_file_fails_the_mount_at_once(tmp_path):
    conf = tmp_path / "c.toml"
    for body, message in [('user = "a"\n', "cluster.user and cluster.password_file go together"),
                          ('token_file = "t"\ncreds = "c"\n', "choose one way to authenticate, not token_file and"),
                          ('servers = ["nats://a:b@h:4222"]\ntoken_file = "t"\n', "credentials in the URLs"),
                          ('tls_key = "k"\n', "cluster.tls_key needs cluster.tls_cert"),
                          ('password_file = 3\n', "cluster.password_file must be a string")]:
        conf.write_text("[cluster]\n" + body)
        result = memfs("mount", tmp_path / "s", tmp_path / "m", "--config", conf)
        assert result.returncode == 1 and message in result.stderr, (body, result.stderr)
    # paths are the config file's (relative ones too); the file is read when the mount starts
    conf.write_text('[cluster]\nservers = ["nats://127.0.0.1:9"]\nuser = "agent"\npassword_file = "gone"\n')
    result = memfs("mount", tmp_path / "s", tmp_path / "m", "--config", conf, timeout=FAIL_WITHIN)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (f"memfs: cannot join the cluster: cluster.password_file: "
                                                      f"cannot read {tmp_path / 'gone'}: No such file or directory")
    assert not is_mounted(tmp_path / "m")
