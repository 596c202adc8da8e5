"""The conventions a FUSE or CLI user expects (issue 16, SPEC §6–§8): search names, real
times, mount options and `memfs mounts`, one log per daemon, `memfs gc` confirmation, a
missing store."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from mounting import event, mounted, needs_fuse
from store_helpers import errno_of, make_logged
from store_helpers import run_cli as run

FACTS = [event("thread.started", thread_id="t"), event("turn.started"),
         event("item.completed", item={"id": "m", "type": "agent_message", "text": "retry loop added"}),
         event("item.completed", item={"id": "p", "type": "file_change", "status": "completed",
                                        "changes": [{"path": "src/net.py", "kind": "update"}]}),
         event("turn.completed", usage={"input_tokens": 5})]


# --- 13: search names --------------------------------------------------------------------


@needs_fuse
def test_search_names_percent_decoding_and_bad_parameters(tmp_path, capsys):
    store = tmp_path / "store"
    make(store, "s1")
    with mounted(store, tmp_path / "mnt") as m:
        search = m.mnt / "search"
        results = [json.loads(x) for x in (search / "src%2Fnet.py").read_text().splitlines()]
        assert results and "src/net.py" in results[0]["snippet"]
        assert (search / "src%2Fnet.py?k=1&format=text").read_text().count("\n") == 1
        bad = {"retry?kk=1": "unknown parameter 'kk'", "retry?k=0": "k must be a whole number of at least 1",
               "retry?k=two": "k must be a whole number", "retry?min_score=high": "min_score must be a number",
               "retry?format=xml": "format must be jsonl or text", "retry?k=1&k=2": "given twice",
               "retry?k=1&verbose": "unknown parameter 'verbose'"}
        for name, reason in bad.items():
            assert errno_of(lambda: (search / name).read_bytes()) == errno.EINVAL, name  # noqa: B023 (called now)
            assert reason in m.log_text(), name
        # a '?' without parameters is text, as before
        assert errno_of(lambda: (search / "what was retried?").read_bytes()) == 0
    # the command line refuses k=0 the same way
    code, _, err = run(capsys, "search", "retry", "-k", "0", "--store", store)
    assert code == 2 and "k must be a whole number of at least 1" in err  # the mount's reason, word for word
    code, out, _ = run(capsys, "search", "src/net.py", "-k", "1", "--store", store)
    assert code == 0 and out.count("\n") == 1 and "src/net.py" in out


# --- 12: memfs gc asks before removing ---------------------------------------------------


def _completed(root: Path, name: str, age_days: float) -> None:
    import time

    from memfs.store.meta import format_rfc3339

    make(root, name, FACTS + [event("thread.completed", thread_id="t", session_id=name, subtype="success",
                                    outcome_code="completed", usage={}, num_turns=1)])
    path = root / name / "manifest.json"
    m = json.loads(path.read_text())
    m["updated_at"] = format_rfc3339(time.time() - age_days * 86400)
    path.write_text(json.dumps(m))


def _gc_on_a_terminal(store: Path, answer: bytes) -> tuple[int, str]:
    import pty
    import subprocess
    import sys

    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "memfs", "gc", "--store", str(store)],
                                stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        os.write(master, answer)
        out, _ = proc.communicate(timeout=60)
    finally:
        os.close(master)
        os.close(slave)
    return proc.returncode, out.decode()


def test_gc_confirms_on_a_terminal_and_refuses_without_one(capsys, tmp_path):
    store = tmp_path / "store"
    _completed(store, "old", 60)
    _completed(store, "new", 0)
    code, out = _gc_on_a_terminal(store, b"n\n")
    assert code == 1 and "old (updated" in out and "remove 1 session" in out and "[y/N]" in out
    assert "nothing removed" in out and (store / "old").exists()
    code, out = _gc_on_a_terminal(store, b"y\n")
    assert code == 0 and "removed 1 session" in out and not (store / "old").exists()
    _completed(store, "old2", 60)
    code, _, err = run(capsys, "gc", "--store", store)  # stdin is not a terminal here
    assert code == 1 and err.count("\n") == 1 and "run with --yes to confirm" in err
    assert (store / "old2").exists()
    assert run(capsys, "gc", "--store", store, "--dry-run")[0] == 0 and (store / "old2").exists()
    code, out, _ = run(capsys, "gc", "--store", store, "--yes")
    assert code == 0 and "removed 1 session" in out and sorted(n for n in os.listdir(store) if n[0] != ".") == ["new"]


# --- 8: real times --------------------------------------------------------------------------


@needs_fuse
def test_times_are_real_ls_sorts_and_a_second_rsync_copies_nothing(tmp_path):
    import shutil
    import subprocess
    import time

    from memfs.store.meta import format_rfc3339

    if shutil.which("rsync") is None:
        pytest.fail("rsync is not installed (scripts/setup.sh installs it)")
    store = tmp_path / "store"
    now = time.time()
    for name, age_hours in (("oldest", 30), ("newest", 1), ("middle", 10)):
        make(store, name)
        path = store / name / "manifest.json"
        m = json.loads(path.read_text())
        m["updated_at"] = format_rfc3339(now - age_hours * 3600)
        path.write_text(json.dumps(m, separators=(",", ":")))
        os.utime(store / name / "events.jsonl", (now - age_hours * 3600,) * 2)
    copy = tmp_path / "copy"
    with mounted(store, tmp_path / "mnt") as m:
        sessions = m.mnt / "sessions"
        out = subprocess.run(["ls", "-t", str(sessions)], capture_output=True, text=True, check=True).stdout
        assert out.split() == ["newest", "middle", "oldest"]
        for name in ("oldest", "newest"):
            mounted_st = os.stat(sessions / name / "events.jsonl")
            assert mounted_st.st_mtime_ns == os.stat(store / name / "events.jsonl").st_mtime_ns
            view = sessions / name / "derived" / "summary.md"
            first = os.stat(view).st_mtime_ns
            view.read_bytes()
            assert os.stat(view).st_mtime_ns == first  # unchanged content, unchanged time
        assert abs(os.stat(sessions / "oldest").st_mtime - (now - 30 * 3600)) < 1

        def rsync() -> list[str]:
            done = subprocess.run(["rsync", "-a", "-i", f"{m.mnt}/", f"{copy}/"], capture_output=True, text=True)
            assert done.returncode == 0, done.stderr
            return done.stdout.splitlines()

        assert any("events.jsonl" in x for x in rsync())
        assert rsync() == []  # nothing changed: nothing copied
        before = os.stat(sessions / "middle" / "derived" / "memory.json").st_mtime_ns
        with open(sessions / "middle" / "events.jsonl", "a") as f:
            f.write(event("turn.started") + "\n")
            f.write(event("item.completed", item={"id": "n", "type": "agent_message", "text": "new fact"}) + "\n")
            f.write(event("turn.completed", usage={}) + "\n")
        assert os.stat(sessions / "middle" / "derived" / "memory.json").st_mtime_ns > before
        out = subprocess.run(["ls", "-t", str(sessions)], capture_output=True, text=True, check=True).stdout
        assert out.split()[0] == "middle"
        changed = rsync()
        # the session's files, and the root's usage/ totals over every session (SPEC §12), which
        # counted the new turn (rsync sees them as changed once their attributes are re-read)
        assert changed and any("sessions/middle" in x for x in changed), changed
        assert all("sessions/middle" in x or x.split()[-1].startswith("usage/") for x in changed), changed
        assert rsync() == []


# --- 9, 10: mount conventions, memfs mounts, umount messages, one log per daemon ------------


def _memfs(*argv, env, cwd=None, timeout=60):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "memfs", *map(str, argv)], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=timeout)


def _xdg(tmp_path: Path) -> dict:
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path / "run"), "XDG_STATE_HOME": str(tmp_path / "state")}
    (tmp_path / "run").mkdir(mode=0o700)
    return env


@needs_fuse
def test_mount_options_source_mounts_list_and_umount_messages(tmp_path):
    import shutil
    import subprocess

    env = _xdg(tmp_path)
    store = tmp_path / "store"
    make(store, "s")
    mnt = tmp_path / "mnt"
    with mounted(store, mnt, "-o", "ro,uid=1234,gid=4321,durability=fsync,max_events=5", "-f", env=env) as m:
        if shutil.which("findmnt"):
            out = subprocess.run(["findmnt", "-n", "-o", "SOURCE,FSTYPE", str(mnt)], capture_output=True,
                                 text=True).stdout.split()
            assert out == [f"memfs:{store}", "fuse.memfs"]
        st = os.stat(mnt / "sessions" / "s" / "events.jsonl")
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (1234, 4321, 0o444)
        assert errno_of(lambda: open(mnt / "sessions" / "s" / "events.jsonl", "a")) == errno.EROFS
        listed = json.loads(_memfs("mounts", "--json", env=env).stdout)
        assert {"mountpoint": str(mnt), "store": str(store), "pid": m.proc.pid, "log": None, "session": None,
                "read_only": True, "cluster": None, "cluster_lag": None} in listed
        human = _memfs("mounts", env=env).stdout.splitlines()
        assert human[0].split() == ["MOUNTPOINT", "STORE", "PID", "CLUSTER", "LAG", "LOG"]
        assert [str(mnt), str(store), str(m.proc.pid), "-", "-", "-"] in [row.split() for row in human]
        # stacking another memfs on it is refused
        again = _memfs("mount", tmp_path / "other", mnt, env=env)
        assert again.returncode == 1 and again.stderr.strip().count("\n") == 0
        assert f"{mnt} is already a memfs mount (store {store})" in again.stderr
        # busy: one line saying what to do
        holder = subprocess.Popen(["cat"], cwd=mnt, stdin=subprocess.PIPE)
        try:
            busy = _memfs("umount", mnt, env=env)
            assert busy.returncode == 1 and busy.stderr.count("\n") == 1
            assert "is busy" in busy.stderr and f"memfs umount --lazy {mnt}" in busy.stderr
            assert _memfs("umount", "--lazy", mnt, env=env).returncode == 0
        finally:
            holder.communicate(timeout=10)
        assert m.proc.wait(30) == 0
    missing = _memfs("umount", mnt, env=env)
    assert missing.returncode == 1 and missing.stderr == f"memfs: {mnt} is not mounted (memfs mounts lists the memfs mounts)\n"
    assert _memfs("umount", tmp_path / "nowhere", env=env).stderr == f"memfs: {tmp_path / 'nowhere'} does not exist\n"
    bad = _memfs("mount", store, mnt, "-o", "ro,colour=blue", env=env)
    assert bad.returncode == 2 and "unknown mount option -o colour=blue" in bad.stderr


@needs_fuse
def test_a_daemon_creates_its_mountpoint_and_logs_to_its_own_file(tmp_path):
    import subprocess
    import time

    from mounting import is_mounted

    env = _xdg(tmp_path)
    store = tmp_path / "store"
    make(store, "s")
    mnts = [tmp_path / "mem-a", tmp_path / "mem-b"]  # do not exist yet: created (their parent does)
    pids = []
    try:
        for mnt in mnts:
            done = _memfs("mount", store, mnt, "--daemon", env=env)
            assert done.returncode == 0, done.stderr
            pids.append(int(done.stdout.strip()))
            assert is_mounted(mnt)
        listed = {m["mountpoint"]: m for m in json.loads(_memfs("mounts", "--json", env=env).stdout)}
        logs = [Path(listed[str(mnt)]["log"]) for mnt in mnts]
        assert [listed[str(mnt)]["pid"] for mnt in mnts] == pids
        assert logs[0] != logs[1] and logs[0].parent == tmp_path / "state" / "memfs" / "logs"
        assert logs[0].name == f"{str(mnts[0]).strip('/').replace('-', '%2D').replace('/', '-')}.log"
        for mnt, log in zip(mnts, logs):
            assert f"serving {store} at {mnt}" in log.read_text()
        with pytest.raises(OSError):
            with open(mnts[0] / "sessions" / "s" / "events.jsonl", "a") as f:
                f.write('{"type":"turn.failed"}\n')
        refused = [x for x in logs[0].read_text().splitlines() if "turn.failed" in x or "refused" in x
                   or "EBADMSG" in x or "flush" in x or "write" in x]
        assert refused and all("[session s]" in x for x in refused), logs[0].read_text()
        assert "[session s]" not in logs[1].read_text()
        for mnt in mnts:
            assert _memfs("umount", mnt, env=env).returncode == 0
        deadline = time.monotonic() + 30
        while any(os.path.exists(f"/proc/{pid}") and "zombie" not in open(f"/proc/{pid}/status").read()
                  for pid in pids):
            assert time.monotonic() < deadline, "daemons did not exit"
            time.sleep(0.05)
        assert "unmounted" in logs[0].read_text()
        left = [m["mountpoint"] for m in json.loads(_memfs("mounts", "--json", env=env).stdout)]
        assert not set(map(str, mnts)) & set(left)  # (other mounts on this machine may be listed)
        assert os.listdir(tmp_path / "run" / "memfs" / "mounts") == []  # their records are gone
    finally:
        for mnt in mnts:
            if is_mounted(mnt):
                subprocess.run(["fusermount3", "-u", "-z", str(mnt)], check=False)
        for pid in pids:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


# --- 11: a store that does not exist ----------------------------------------------------------


def test_commands_on_a_missing_store_say_so(capsys, tmp_path):
    missing = tmp_path / "nope"
    for argv in (["sessions"], ["show", "s"], ["search", "retry"], ["gc", "--dry-run"], ["fsck"],
                 ["pack", "create", "s"], ["pin", "s", "--reason", "x"]):
        code, out, err = run(capsys, *argv, "--store", missing)
        assert code == 1 and out == "", argv
        assert err == f"memfs: no store at {missing}: it does not exist (check --store/--workspace)\n", argv
    assert not missing.exists()


def make(root: Path, name: str, lines=FACTS) -> Path:
    return make_logged(root, name, lines)
