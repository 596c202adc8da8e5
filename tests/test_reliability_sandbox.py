"""A sandboxed agent with its memory at ``/memory`` (issue 7, SPEC §6 ``--session``).

bubblewrap runs a process whose whole world is a read-only ``/usr`` and ``/etc``, fresh
``/dev``, ``/proc`` (own pid namespace) and ``/tmp``, and one ``memfs mount --session a``
bound at ``/memory``. From there it appends events, reads ``derived/`` and ``search/``, and
tries to reach the other session and the backing store. A probe (stdlib Python, run with the
system interpreter inside the sandbox) reports what each attempt gave as JSON, and the tests
check it. A read-only bind must refuse writes with ``EROFS``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from mounting import event, mounted, needs_fuse

pytestmark = [needs_fuse, pytest.mark.skipif(shutil.which("bwrap") is None,
                                             reason="needs bubblewrap (scripts/setup.sh installs it)")]

SANDBOX_PYTHON = "/usr/bin/python3"  # the system interpreter: the only one under /usr
SECRET = "zanzibarquokka"  # a word only session b holds

LINES = [
    '{"type":"thread.started","thread_id":"t1"}',
    '{"type":"turn.started"}',
    event("item.completed", item={"id": "m1", "type": "agent_message", "text": "Added the retry loop to the client."}),
    '{"type":"turn.completed","usage":{"input_tokens":3}}',
    '{"type":"turn.failed"}',  # invalid: no message
]

PROBE = r'''
import errno, json, os, sys
store, lines = sys.argv[1], json.loads(sys.argv[2])
def attempt(fn):
    try:
        result = fn()
        return "ok" if result is None else result
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
def append(line):
    fd = os.open("/memory/events.jsonl", os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, line.encode() + b"\n")
    finally:
        os.close(fd)
def read(path):
    with open(path, "rb") as f:
        return f.read().decode()
def every_file():
    for top in ("/", "/tmp", "/memory"):
        for root, dirs, files in os.walk(top):
            if root == "/":
                dirs[:] = [d for d in dirs if d not in ("proc", "sys", "dev", "usr", "etc")]
            for name in files:
                yield os.path.join(root, name)
out = {"uid": os.getuid()}
out["append"] = [attempt(lambda line=line: append(line)) for line in lines]
out["listing"] = sorted(os.listdir("/memory"))
out["events"] = attempt(lambda: read("/memory/events.jsonl").splitlines())
out["facts"] = attempt(lambda: [f["fact"] for f in json.loads(read("/memory/derived/memory.json"))["grounded_facts"]])
out["summary"] = attempt(lambda: read("/memory/derived/summary.md"))
out["search"] = attempt(lambda: [json.loads(l)["chunk_id"] for l in read("/memory/search/retry loop").splitlines()])
out["search_secret"] = attempt(lambda: read("/memory/search/" + SECRET))
out["rejected"] = attempt(lambda: [json.loads(l)["line"] for l in read("/memory/rejected.jsonl").splitlines()])
out["mkdir"] = attempt(lambda: os.mkdir("/memory/other"))
out["parent"] = sorted(os.listdir("/memory/.."))
out["sessions"] = attempt(lambda: os.listdir("/memory/sessions"))
out["other_session"] = attempt(lambda: read("/memory/../b/events.jsonl"))
out["store"] = attempt(lambda: os.stat(store))
out["secret_files"] = [p for p in every_file() if SECRET in attempt(lambda p=p: read(p))]
out["daemon_visible"] = any(b"memfs\x00mount" in open("/proc/%s/cmdline" % p, "rb").read()
                            for p in os.listdir("/proc") if p.isdigit())
print(json.dumps(out))
'''.replace("SECRET", repr(SECRET))


def sandbox(mnt, store, bind: str = "--bind", user: int | None = None) -> dict:
    """Run :data:`PROBE` in bubblewrap with ``mnt`` at ``/memory``; return its report."""
    command = [
        "bwrap", "--tmpfs", "/", "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc",
        "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
        "--symlink", "usr/sbin", "/sbin", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
        "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent",
        bind, str(mnt), "/memory", "--chdir", "/memory", "--",
    ]
    if user is not None:  # drop to an unprivileged user inside, as an agent would run
        command += ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"]
    command += [SANDBOX_PYTHON, "-c", PROBE, str(store), json.dumps(LINES)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture
def sandbox_store(tmp_path):
    """A store with sessions ``a`` (empty) and ``b`` (holding the secret)."""
    store = tmp_path / "store"
    with mounted(store, tmp_path / "setup") as m:
        os.mkdir(m.mnt / "sessions" / "a")
        os.mkdir(m.mnt / "sessions" / "b")
        with open(m.mnt / "sessions" / "b" / "events.jsonl", "a") as f:
            f.write(event("item.completed", item={"id": "s", "type": "agent_message", "text": SECRET}) + "\n")
    return store


def check_confined(report: dict, store) -> None:
    """Nothing outside session a is reachable from inside."""
    assert report["listing"] == ["README.md", "derived", "events.jsonl", "index", "manifest.json",
                                 "rejected.jsonl", "search"]
    assert report["parent"] == ["bin", "dev", "etc", "lib", "lib64", "memory", "proc", "sbin", "tmp", "usr"]
    assert report["sessions"] == "ENOENT"
    assert report["other_session"] == "ENOENT"
    assert report["store"] == "ENOENT"
    assert report["search_secret"] == ""  # search/ of a session mount searches that session only
    assert report["secret_files"] == []
    assert report["daemon_visible"] is False  # no /proc/<daemon>/fd or /root path to the store


@pytest.mark.parametrize("user", [None, 65534], ids=["root", "nobody"])
def test_sandboxed_agent_appends_reads_and_is_confined(tmp_path, sandbox_store, user):
    store = sandbox_store
    args = ["--session", "a"]
    if user is not None:  # the owner reported for every node, and other users let in
        args += ["--uid", str(user), "--gid", str(user), "--allow-other"]
    with mounted(store, tmp_path / "mnt", *args) as m:
        report = sandbox(m.mnt, store, user=user)
    assert report["uid"] == (0 if user is None else user)
    assert report["append"] == ["ok", "ok", "ok", "ok", "EBADMSG"]
    assert len(report["events"]) == 4 and all(line.startswith('{"schema_version"') for line in report["events"])
    assert report["facts"] == ["Added the retry loop to the client."]
    assert "# Session a" in report["summary"]
    assert report["search"] == ["a:0"]
    assert report["rejected"] == ['{"type":"turn.failed"}']
    assert report["mkdir"] == "EPERM"
    check_confined(report, store)
    assert (store / "a" / "events.jsonl").read_text().splitlines() == report["events"]
    assert SECRET not in (store / "a" / "events.jsonl").read_text()


def test_read_only_bind_gives_erofs(tmp_path, sandbox_store):
    store = sandbox_store
    with mounted(store, tmp_path / "mnt", "--session", "a") as m:
        report = sandbox(m.mnt, store, bind="--ro-bind")
    assert report["append"] == ["EROFS"] * 5
    assert report["mkdir"] == "EROFS"
    assert report["events"] == [] and report["rejected"] == []
    assert "# Session a" in report["summary"] and report["facts"] == []
    check_confined(report, store)
    assert (store / "a" / "events.jsonl").read_bytes() == b""
