"""The README's "Sandboxes" recipe with a session that does not exist yet (issue 42, SPEC §3.5, §6):
``memfs mount STORE MNT --session NEW --daemon`` creates the session, forks, and serves it. After
a write through the mount the daemon must let the session's lock go once idle (another writer,
``memfs append``, then gets in), and ``memfs umount`` must return promptly with the daemon gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from mounting import alive, event, is_mounted, needs_fuse

pytestmark = needs_fuse

IDLE_RELEASE = 0.5  # seconds: the daemon lets the lock go this long after the last change


def memfs(*argv, env: dict, stdin: str | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memfs", *map(str, argv)], input=stdin, capture_output=True,
                          text=True, env=env, timeout=timeout)



def test_daemon_on_a_new_session_releases_its_lock_and_unmounts_promptly(tmp_path: Path):
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path / "run"), "XDG_STATE_HOME": str(tmp_path / "state")}
    (tmp_path / "run").mkdir(mode=0o700)
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    pid = None
    try:
        started = memfs("mount", "--store", store, "--session", "NEW", mnt, "--daemon",
                        "--idle-release", IDLE_RELEASE, env=env)
        assert started.returncode == 0, started.stderr
        pid = int(started.stdout.strip())
        assert is_mounted(mnt) and alive(pid)
        first = event("item.completed", item={"id": "m1", "type": "agent_message", "text": "from the sandbox"})
        with open(mnt / "events.jsonl", "a") as f:
            f.write(first + "\n")

        # the daemon is idle now: within a deadline its lock goes and another writer gets in
        second = event("item.completed", item={"id": "m2", "type": "agent_message", "text": "from the host"})
        deadline = time.monotonic() + 10
        while True:
            appended = memfs("append", "--store", store, "NEW", env=env, stdin=second + "\n")
            if appended.returncode == 0:
                break
            assert "is being written by" in appended.stderr, appended.stderr
            assert time.monotonic() < deadline, f"the daemon kept the lock: {appended.stderr}"
        assert (mnt / "events.jsonl").read_text().splitlines() == [first, second]  # the daemon follows

        began = time.monotonic()
        umount = memfs("umount", mnt, env=env, timeout=20)
        took = time.monotonic() - began
        assert umount.returncode == 0, umount.stderr
        assert took < 10, f"memfs umount took {took:.1f} s"
        assert not alive(pid) and not is_mounted(mnt)
        assert (store / "NEW" / "events.jsonl").read_text().splitlines() == [first, second]
    finally:
        if is_mounted(mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], check=False)
        if pid is not None and alive(pid):
            os.kill(pid, signal.SIGKILL)


AUDIT_SQLITE = """import os, sys
def _hook(event, args):
    if event == "sqlite3.connect":
        with open(os.environ["SQLITE_CONNECTS"], "a") as f:
            f.write(f"{os.getpid()} {sys.argv[1] if len(sys.argv) > 1 else '-'} {args[0]}\\n")
sys.addaudithook(_hook)
"""


def test_the_daemons_parent_opens_no_catalog_its_server_would_inherit(tmp_path: Path):
    """SQLite's locks belong to a process: a catalog connection the parent made before the fork
    was used by the server, and the parent's close on exit deleted the WAL under it (the
    server's listings then failed with 'disk I/O error')."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(AUDIT_SQLITE)
    connects = tmp_path / "connects"
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path / "run"), "XDG_STATE_HOME": str(tmp_path / "state"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(hooks), os.environ.get("PYTHONPATH")])),
           "SQLITE_CONNECTS": str(connects)}
    (tmp_path / "run").mkdir(mode=0o700)
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    line = event("item.completed", item={"id": "m1", "type": "agent_message", "text": "kept"})
    for name in ("a", "b"):
        assert memfs("append", "--store", store, name, env=env, stdin=line + "\n").returncode == 0
    assert (store / ".memfs" / "catalog.sqlite").exists()  # a catalog kept from before: the mount checks it
    connects.unlink()
    pid = None
    try:
        started = memfs("mount", store, mnt, "--daemon", env=env)
        assert started.returncode == 0, started.stderr
        pid = int(started.stdout.strip())
        assert sorted(os.listdir(mnt / "sessions")) == ["a", "b"]
        assert memfs("append", "--store", store, "c", env=env, stdin=line + "\n").returncode == 0
        deadline = time.monotonic() + 10
        while sorted(os.listdir(mnt / "sessions")) != ["a", "b", "c"]:
            assert time.monotonic() < deadline, os.listdir(mnt / "sessions")
        opened = [entry.split(" ", 2) for entry in connects.read_text().splitlines()]
        by_mount = {int(p) for p, command, db in opened if command == "mount" and db.endswith("catalog.sqlite")}
        assert by_mount == {pid}, opened  # the server only, never the parent that forked it
    finally:
        if is_mounted(mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], check=False)
        if pid is not None and alive(pid):
            os.kill(pid, signal.SIGKILL)
