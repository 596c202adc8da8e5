"""The filesystem through a real mount, driven with syscalls and shell tools (SPEC §6)."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from mounting import cleanup, event, mounted, needs_fuse, sh, start
from store_helpers import wait_until

pytestmark = needs_fuse

THREAD = event("thread.started", thread_id="t1")
TURN = event("turn.started")
MSG = event("item.completed", item={"id": "m1", "type": "agent_message", "text": "Added the retry loop."})
DONE = event("turn.completed", usage={"input_tokens": 10, "output_tokens": 2})


@pytest.fixture
def m(tmp_path):
    with mounted(tmp_path / "store", tmp_path / "mnt") as mount:
        yield mount


def make_session(m, name="s1"):
    os.mkdir(m.mnt / "sessions" / name)
    return m.mnt / "sessions" / name


def lines(path):
    return path.read_text().splitlines()


def test_tree_and_readme(m):
    assert sorted(os.listdir(m.mnt)) == ["README.md", "search", "sessions", "usage"]
    assert "memfs" in (m.mnt / "README.md").read_text()
    assert os.listdir(m.mnt / "search") == []


def test_mkdir_creates_session_and_refuses_bad_names(m):
    s = make_session(m, "sess-1")
    assert sorted(os.listdir(s)) == ["derived", "events.jsonl", "index", "manifest.json", "rejected.jsonl", "search"]
    assert json.loads((s / "manifest.json").read_text())["session_id"] == "sess-1"
    assert (m.store / "sess-1" / "events.jsonl").exists()
    for bad, code in [("a b", errno.EINVAL), (".hidden", errno.EINVAL), ("sess-1", errno.EEXIST)]:
        with pytest.raises(OSError) as err:
            os.mkdir(m.mnt / "sessions" / bad)
        assert err.value.errno == code, bad
    with pytest.raises(OSError) as err:
        os.mkdir(s / "sub")
    assert err.value.errno == errno.EPERM


def test_shell_appends_and_bare_events_are_wrapped(m):
    s = make_session(m)
    sh(f"echo '{THREAD}' >> events.jsonl", s)
    sh("printf '%s\\n' '{\"type\":\"turn.started\"}' >> events.jsonl", s)
    got = lines(s / "events.jsonl")
    assert got == [THREAD, '{"schema_version":"0.18.0","event":{"type":"turn.started"}}']
    manifest = json.loads((s / "manifest.json").read_text())
    assert manifest["event_count"] == 2 and manifest["in_turn"] is True
    assert (m.store / "s1" / "events.jsonl").read_text().splitlines() == got


def test_one_write_of_three_lines_and_byte_by_byte(m):
    s = make_session(m)
    fd = os.open(s / "events.jsonl", os.O_WRONLY | os.O_APPEND)
    try:
        payload = f"{THREAD}\n{TURN}\n{MSG}\n".encode()
        assert os.write(fd, payload) == len(payload)
        for byte in f"{DONE}\n".encode():
            assert os.write(fd, bytes([byte])) == 1
    finally:
        os.close(fd)
    assert sh("cat events.jsonl", s).stdout.splitlines() == [THREAD, TURN, MSG, DONE]
    assert json.loads((s / "manifest.json").read_text())["turn_count"] == 1


def test_two_processes_append_concurrently(m):
    s = make_session(m)
    script = (
        "import os,sys\n"
        "fd=os.open(sys.argv[1],os.O_WRONLY|os.O_APPEND)\n"
        "for i in range(1000):\n"
        "    line=('{\"type\":\"item.completed\",\"item\":{\"id\":\"%s-%d\",\"type\":\"agent_message\",\"text\":\"x\"}}\\n'%(sys.argv[2],i)).encode()\n"
        "    half=len(line)//2\n"
        "    os.write(fd,line[:half]); os.write(fd,line[half:])\n"
        "os.close(fd)\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", script, str(s / "events.jsonl"), w]) for w in "ab"]
    assert [p.wait(120) for p in procs] == [0, 0]
    got = [json.loads(line)["event"]["item"]["id"] for line in lines(s / "events.jsonl")]
    assert len(got) == 2000
    for w in "ab":
        assert [i for i in got if i.startswith(w)] == [f"{w}-{i}" for i in range(1000)]


def test_invalid_line_in_the_middle_of_cat(m, tmp_path):
    s = make_session(m)
    good = [event("item.completed", item={"id": f"i{i}", "type": "plan", "text": "step"}) for i in range(500)]
    bad = '{"type":"turn.failed"}'
    src = tmp_path / "big.jsonl"
    src.write_text("\n".join(good[:300] + [bad] + good[300:]) + "\n")
    result = sh(f"cat {src} >> events.jsonl", s, check=False)
    assert result.returncode != 0
    assert "Bad message" in result.stderr
    assert lines(s / "events.jsonl") == good[:300]
    rejected = [json.loads(line) for line in lines(s / "rejected.jsonl")]
    assert [(r["line"], r["errno"]) for r in rejected] == [(bad, "EBADMSG")]
    assert rejected[0]["reason"] == ('turn.failed: "message" must be a string '
                                     '(or "error" an object with a string "message", as Codex writes it)')
    reason = os.getxattr(s, "user.memfs.last_error").decode()
    assert "message" in reason


def test_pending_fragment_validated_at_close(m):
    s = make_session(m)
    fd = os.open(s / "events.jsonl", os.O_WRONLY | os.O_APPEND)
    os.write(fd, b'{"type":"turn.started"}')  # no newline: kept until close
    assert lines(s / "events.jsonl") == []
    os.close(fd)
    assert lines(s / "events.jsonl") == ['{"schema_version":"0.18.0","event":{"type":"turn.started"}}']
    fd = os.open(s / "events.jsonl", os.O_WRONLY | os.O_APPEND)
    os.write(fd, b'{"broken":')
    with pytest.raises(OSError) as err:
        os.close(fd)
    assert err.value.errno == errno.EBADMSG
    assert json.loads(lines(s / "rejected.jsonl")[-1])["line"] == '{"broken":'


def test_over_long_line_is_efbig(tmp_path):
    with mounted(tmp_path / "store", tmp_path / "mnt") as m:
        s = make_session(m)
        huge = b'{"type":"error","message":"' + b"x" * (17 * 1024 * 1024) + b'"}\n'
        fd = os.open(s / "events.jsonl", os.O_WRONLY | os.O_APPEND)
        try:
            with pytest.raises(OSError) as err:
                view = memoryview(huge)
                while view:
                    view = view[os.write(fd, view[: 1 << 20]):]
            assert err.value.errno == errno.EFBIG
        finally:
            os.close(fd)
        assert lines(s / "events.jsonl") == []
        assert json.loads(lines(s / "rejected.jsonl")[0])["errno"] == "EFBIG"


def test_changes_are_refused_with_eperm(m):
    s = make_session(m)
    sh(f"echo '{THREAD}' >> events.jsonl", s)
    cases = {
        "truncate": lambda: os.truncate(s / "events.jsonl", 0),
        "overwrite": lambda: open(s / "events.jsonl", "w"),
        "unlink": lambda: os.unlink(s / "events.jsonl"),
        "rename": lambda: os.rename(s / "events.jsonl", s / "x.jsonl"),
        "link": lambda: os.link(s / "events.jsonl", s / "x.jsonl"),
        "symlink": lambda: os.symlink("/etc/passwd", s / "x"),
        "chmod": lambda: os.chmod(s / "events.jsonl", 0o777),
        "create": lambda: open(s / "new.txt", "x"),
        "write manifest": lambda: open(s / "manifest.json", "a"),
    }
    for name, action in cases.items():
        with pytest.raises(OSError) as err:
            action()
        assert err.value.errno == errno.EPERM, name
    fd = os.open(s / "events.jsonl", os.O_WRONLY)
    try:
        with pytest.raises(OSError) as err:
            os.pwrite(fd, f"{TURN}\n".encode(), 0)  # not at the end: an overwrite
        assert err.value.errno == errno.EPERM
    finally:
        os.close(fd)
    assert lines(s / "events.jsonl") == [THREAD]


def test_tools_agree_on_manifest(m):
    s = make_session(m)
    sh(f"printf '%s\\n' '{THREAD}' '{TURN}' '{MSG}' '{DONE}' >> events.jsonl", s)
    data = (s / "manifest.json").read_bytes()
    assert int(sh("wc -c < manifest.json", s).stdout) == len(data) == os.stat(s / "manifest.json").st_size
    assert sh("head -c 100000 manifest.json", s).stdout.encode() == data
    assert sh("tail -n1 manifest.json", s).stdout.encode() == data
    assert json.loads(sh("cat manifest.json", s).stdout)["turn_count"] == 1
    turns = json.loads((s / "index" / "turns.json").read_text())
    assert [e["turn_number"] for e in turns["entries"]] == [1]


def test_events_size_is_true_at_every_stat_and_tail_f_follows(m):
    s = make_session(m)
    sh(f"echo '{THREAD}' >> events.jsonl", s)
    assert os.stat(s / "events.jsonl").st_size == len(THREAD) + 1
    tail = subprocess.Popen(["tail", "-n", "+1", "-f", str(s / "events.jsonl")], stdout=subprocess.PIPE, text=True)
    try:
        assert tail.stdout.readline().strip() == THREAD
        sh(f"echo '{TURN}' >> events.jsonl", s)
        assert os.stat(s / "events.jsonl").st_size == len(THREAD) + len(TURN) + 2
        assert tail.stdout.readline().strip() == TURN
    finally:
        tail.kill()
        tail.wait()


def test_grep_over_the_log(m):
    s = make_session(m)
    sh(f"printf '%s\\n' '{THREAD}' '{TURN}' '{MSG}' >> events.jsonl", s)
    assert sh("grep -c retry events.jsonl", s).stdout.strip() == "1"


def test_read_only_mount(tmp_path):
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    with mounted(store, mnt) as m:
        s = make_session(m)
        sh(f"echo '{THREAD}' >> events.jsonl", s)
    with mounted(store, mnt, "--read-only") as m:
        s = m.mnt / "sessions" / "s1"
        assert lines(s / "events.jsonl") == [THREAD]
        for action in (lambda: open(s / "events.jsonl", "a"), lambda: os.mkdir(m.mnt / "sessions" / "s2"),
                       lambda: os.unlink(s / "events.jsonl")):
            with pytest.raises(OSError) as err:
                action()
            assert err.value.errno == errno.EROFS
        assert oct(os.stat(s / "events.jsonl").st_mode & 0o777) == "0o444"


def test_session_mount_shows_only_that_session(tmp_path):
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    with mounted(store, mnt) as m:
        make_session(m, "a")
        make_session(m, "b")
        sh(f"echo '{THREAD}' >> sessions/b/events.jsonl", m.mnt)
    with mounted(store, mnt, "--session", "a") as m:
        assert sorted(os.listdir(m.mnt)) == sorted(
            ["README.md", "derived", "events.jsonl", "index", "manifest.json", "rejected.jsonl", "search"])
        assert not (m.mnt / "sessions").exists()
        assert not (m.mnt / ".." / "b").resolve().is_relative_to(m.mnt)
        sh(f"echo '{TURN}' >> events.jsonl", m.mnt)
        assert json.loads((m.mnt / "manifest.json").read_text())["session_id"] == "a"
    assert (store / "a" / "events.jsonl").read_text().splitlines() == [TURN]


def test_a_handler_that_raises_does_not_take_the_mount_down(tmp_path):
    with mounted(tmp_path / "store", tmp_path / "mnt", env={"MEMFS_INJECT_FAULT": "getxattr"}) as m:
        s = make_session(m)
        with pytest.raises(OSError) as err:
            os.getxattr(s, "user.memfs.status")
        assert err.value.errno == errno.EIO
        sh(f"echo '{THREAD}' >> events.jsonl", s)
        assert lines(s / "events.jsonl") == [THREAD]
        assert "injected fault in getxattr" in m.log_text() and "Traceback" in m.log_text()


def test_an_unexpected_error_in_write_is_eio_and_the_mount_stays_up(tmp_path):
    """``write`` is a plain (not async) handler; the guard covers it all the same."""
    with mounted(tmp_path / "store", tmp_path / "mnt", env={"MEMFS_INJECT_FAULT": "write"}) as m:
        s = make_session(m)
        fd = os.open(s / "events.jsonl", os.O_WRONLY | os.O_APPEND)
        try:
            with pytest.raises(OSError) as err:
                os.write(fd, (THREAD + "\n").encode())
        finally:
            os.close(fd)
        assert err.value.errno == errno.EIO
        assert (s / "manifest.json").read_text()  # still serving
        assert "injected fault in write" in m.log_text()


def test_fsync_mode_writes_wait_in_a_thread_with_the_same_errors(tmp_path):
    with mounted(tmp_path / "store", tmp_path / "mnt", "--durability", "fsync") as m:
        s = make_session(m)
        sh(f"printf '%s\\n' '{THREAD}' '{TURN}' >> events.jsonl", s)
        result = sh("echo '{\"type\":\"turn.failed\"}' >> events.jsonl", s, check=False)
        assert result.returncode != 0 and "Bad message" in result.stderr
        assert lines(s / "events.jsonl") == [THREAD, TURN]
        assert "message" in os.getxattr(s, "user.memfs.last_error").decode()
        assert lines(m.store / "s1" / "events.jsonl") == [THREAD, TURN]


def test_xattrs_on_session_folders(m):
    s = make_session(m)
    sh(f"printf '%s\\n' '{THREAD}' '{TURN}' '{MSG}' '{DONE}' >> events.jsonl", s)
    names = set(os.listxattr(s))
    assert {"user.memfs.status", "user.memfs.turn_count", "user.memfs.event_count", "user.memfs.updated_at"} <= names
    assert os.getxattr(s, "user.memfs.turn_count") == b"1"
    assert os.getxattr(s, "user.memfs.event_count") == b"4"
    assert os.getxattr(s, "user.memfs.status") == b"active"
    with pytest.raises(OSError) as err:
        os.getxattr(s, "user.other")
    assert err.value.errno == errno.ENODATA
    # memfs keeps no ACLs and no security labels: it says so (ENOTSUP), and ls -l then stops asking
    for name in ("system.posix_acl_access", "system.posix_acl_default", "security.selinux", "trusted.x"):
        with pytest.raises(OSError) as err:
            os.getxattr(s, name)
        assert err.value.errno == errno.EOPNOTSUPP, name
    row = sh("ls -ld s1", m.mnt / "sessions").stdout
    assert row.startswith("drwx") and row.split()[-1] == "s1" and row[10] == " ", row  # no ACL '+', no label '.'


def test_rmdir_only_empty_sessions(m):
    s = make_session(m, "empty")
    full = make_session(m, "full")
    sh(f"echo '{THREAD}' >> events.jsonl", full)
    with pytest.raises(OSError) as err:
        os.rmdir(full)
    assert err.value.errno == errno.ENOTEMPTY
    os.rmdir(s)
    assert not (m.store / "empty").exists()
    assert sorted(os.listdir(m.mnt / "sessions")) == ["full"]


@pytest.mark.skipif(os.geteuid() != 0, reason="writing /proc/sys/vm/drop_caches needs root")
def test_inode_table_forgets(m):
    s = make_session(m)
    sh(f"printf '%s\\n' '{THREAD}' '{TURN}' '{MSG}' >> events.jsonl", s)
    before = os.statvfs(m.mnt).f_files
    for i in range(300):
        os.stat(s / "search" / f"retry {i}")  # each query name is an inode while referenced
    assert os.statvfs(m.mnt).f_files >= before + 300
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2\n")  # the kernel forgets its dentries and inodes: memfs must too
    deadline = time.monotonic() + 5
    while os.statvfs(m.mnt).f_files > before + 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert os.statvfs(m.mnt).f_files <= before + 2


def test_sigterm_flushes_and_remount_shows_everything(tmp_path):
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    m = start(store, mnt, "--durability", "buffered")
    try:
        s = make_session(m)
        sh(f"printf '%s\\n' '{THREAD}' '{TURN}' '{MSG}' >> events.jsonl", s)
        assert m.stop(signal.SIGTERM) == 0
    finally:
        cleanup(m)
    manifest = json.loads((store / "s1" / "manifest.json").read_text())
    assert manifest["persisted_file_len"] == (store / "s1" / "events.jsonl").stat().st_size
    assert manifest["event_count"] == 3 and manifest["in_turn"] is True
    with mounted(store, mnt) as m:
        s = m.mnt / "sessions" / "s1"
        assert lines(s / "events.jsonl") == [THREAD, TURN, MSG]
        sh(f"echo '{DONE}' >> events.jsonl", s)
        assert json.loads((s / "manifest.json").read_text())["turn_count"] == 1


def test_daemon_mode_umount_and_config_file(tmp_path):
    from mounting import is_mounted

    store, mnt = tmp_path / "store", tmp_path / "mnt"
    mnt.mkdir()
    config = tmp_path / "memfs.toml"
    config.write_text(f'store = "{store}"\nread_only = false\ndurability = "fsync"\nmax_events = 5\n')
    result = subprocess.run([sys.executable, "-m", "memfs", "mount", "--config", str(config), "--daemon", str(mnt)],
                            capture_output=True, text=True, timeout=30)
    try:
        assert result.returncode == 0, result.stderr
        pid = int(result.stdout.strip())
        assert is_mounted(mnt) and os.path.exists(f"/proc/{pid}")
        s = make_session(type("M", (), {"mnt": mnt})(), "d")
        for _ in range(4):  # a cap of 5 from the file: turns get evicted
            sh(f"printf '%s\\n' '{TURN}' '{DONE}' >> events.jsonl", s)
        manifest = json.loads((s / "manifest.json").read_text())
        assert manifest["turn_count"] == 4 and manifest["event_count"] <= 5
        assert manifest["retained_turn_base"] > 1
        umount = subprocess.run([sys.executable, "-m", "memfs", "umount", str(mnt)], capture_output=True, text=True,
                                timeout=30)
        assert umount.returncode == 0, umount.stderr
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(f"/proc/{pid}") and not is_mounted(mnt)
    finally:
        if is_mounted(mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], check=False)
    on_disk = json.loads((store / "d" / "manifest.json").read_text())
    assert on_disk["turn_count"] == 4 and on_disk["persisted_file_len"] == (store / "d" / "events.jsonl").stat().st_size


def test_metadata_attributes_are_cached_for_a_tick_and_exact_after_each_append(m):
    """``manifest.json``'s and ``index/turns.json``'s attributes carry a one-tick timeout
    while nothing in the mount writes the session (``Operations._attr_timeout``); opening
    ``events.jsonl`` for writing withdraws them, so a ``stat`` right after an append reports
    the new content's size — and while a file is open for writing none is cached."""
    s = make_session(m)

    def count(name):
        return int(os.getxattr(m.mnt, f"user.memfs.{name}"))

    files = [s / "manifest.json", s / "index" / "turns.json"]
    with open(s / "events.jsonl", "a") as log:
        log.write(THREAD + "\n")
    for i in range(20):
        ticked = count("attr_ticked")
        deadline = time.monotonic() + 10
        while True:  # (the last close's RELEASE, asynchronous, may still hold the session)
            before = [os.stat(f) for f in files]  # the kernel may keep these for a tick
            if count("attr_ticked") >= ticked + 2:
                break
            assert time.monotonic() < deadline
        with open(s / "events.jsonl", "a") as log:
            log.write(f"{TURN}\n{MSG}\n{DONE}\n")
        after = [os.stat(f) for f in files]
        assert [st.st_size for st in after] == [len(f.read_bytes()) for f in files]
        assert after[1].st_size > before[1].st_size  # one more turn in the index
        assert json.loads(files[0].read_bytes())["turn_count"] == i + 1
    assert count("attr_unticked") >= 20
    with open(s / "events.jsonl", "a") as log:
        ticked = count("attr_ticked")
        for _ in range(3):
            log.write(f"{TURN}\n{DONE}\n")
            log.flush()
            assert [os.stat(f).st_size for f in files] == [len(f.read_bytes()) for f in files]
        assert count("attr_ticked") == ticked


def test_ticks_are_forgotten_once_expired_so_stats_of_many_sessions_hold_no_memory(m):
    """The server remembers a session's ticked attributes (``Operations._attr_timeout``) only
    while the kernel may still hold them: ``stat`` of 30 sessions' manifests ticks each, and
    once they have expired the next tick drops them, leaving only the session ``stat``'d
    then (the root's ``user.memfs.attr_tick_sessions``)."""
    def count(name):
        return int(os.getxattr(m.mnt, f"user.memfs.{name}"))

    names = [f"t{i}" for i in range(30)]
    for name in names:
        make_session(m, name)
    ticked = count("attr_ticked")
    for name in names:
        os.stat(m.mnt / "sessions" / name / "manifest.json")
    assert count("attr_ticked") >= ticked + len(names)
    assert 1 <= count("attr_tick_sessions") <= len(names)
    last = m.mnt / "sessions" / names[0] / "manifest.json"
    wait_until(lambda: os.stat(last) and count("attr_tick_sessions") == 1, "the expired ticks to be dropped")


def test_a_readers_close_is_answered_and_a_writers_close_still_checks_its_last_line(tmp_path):
    """A reader's ``close()`` sends a ``FLUSH``, answered at once (no count of opens without
    one: pyfuse3 cannot reply ``FOPEN_NOFLUSH``); a writer's ``close()`` still validates its
    final fragment."""
    with mounted(tmp_path / "store", tmp_path / "mnt") as m:
        s = make_session(m)
        with open(s / "events.jsonl", "a") as log:
            log.write(f"{THREAD}\n{TURN}\n")
        for _ in range(5):
            assert json.loads((s / "manifest.json").read_bytes())["event_count"] == 2
            assert lines(s / "events.jsonl") == [THREAD, TURN]
        assert "user.memfs.noflush_opens" not in os.listxattr(m.mnt)
        fd = os.open(s / "events.jsonl", os.O_WRONLY | os.O_APPEND)
        os.write(fd, MSG.encode())  # a final line without its newline: checked at close()
        os.write(fd, b" trailing garbage")
        with pytest.raises(OSError) as err:
            os.close(fd)
        assert err.value.errno == errno.EBADMSG
        assert lines(s / "events.jsonl") == [THREAD, TURN]


def _memfs(*argv) -> subprocess.CompletedProcess:
    """``python -m memfs ARGV`` in a subprocess, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "memfs", *map(str, argv)], capture_output=True, text=True,
                          timeout=60)


def test_import_sources_json_shows_in_the_index_read_only_and_live(tmp_path):
    """``memfs import``'s sidecar, ``index/import-sources.json`` (README), is listed and readable
    in the mount when the session has one, follows later imports, and cannot be changed."""
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    fixture = os.path.join(os.path.dirname(__file__), "fixtures", "codex_exec.jsonl")
    source = tmp_path / "codex.jsonl"
    with open(fixture) as f:
        source.write_text("".join(f.readlines()[:10]))
    assert _memfs("import", "--store", store, source).returncode == 0
    (name,) = [n for n in os.listdir(store) if not n.startswith(".")]  # (.memfs-conversations.*: not sessions)
    with mounted(store, mnt) as m:
        index = m.mnt / "sessions" / name / "index"
        sidecar = index / "import-sources.json"
        assert sorted(os.listdir(index)) == ["import-sources.json", "turns.json"]
        assert sidecar.read_bytes() == (store / name / "index" / "import-sources.json").read_bytes()
        assert json.loads(sh("jq -c '.sources[].lines' index/import-sources.json", index.parent).stdout) == 10
        assert oct(os.stat(sidecar).st_mode & 0o777) == "0o444"
        for action in (lambda: open(sidecar, "a"), lambda: os.unlink(sidecar), lambda: open(sidecar, "r+")):
            with pytest.raises(OSError) as err:
                action()
            assert err.value.errno == errno.EPERM
        with open(fixture) as f:
            source.write_text(f.read())  # the source grew: a second import takes the new lines
        assert _memfs("import", "--store", store, source).returncode == 0
        grown = (store / name / "index" / "import-sources.json").read_bytes()
        assert json.loads(grown)["sources"][str(source)]["lines"] > 10
        wait_until(lambda: sidecar.read_bytes() == grown, "the mount shows the sidecar as it is now")
        assert os.stat(sidecar).st_size == len(grown)
        # a session made in the mount has no sidecar: none is listed nor found
        os.mkdir(m.mnt / "sessions" / "plain")
        assert os.listdir(m.mnt / "sessions" / "plain" / "index") == ["turns.json"]
        assert not (m.mnt / "sessions" / "plain" / "index" / "import-sources.json").exists()
        # one imported while mounted shows its sidecar at once
        other = tmp_path / "rollout.jsonl"
        other.write_bytes(open(fixture.replace("codex_exec", "codex_rollout"), "rb").read())
        assert _memfs("import", "--store", store, other).returncode == 0
        (new,) = {n for n in os.listdir(store) if not n.startswith(".")} - {name, "plain"}
        assert "import-sources.json" in os.listdir(m.mnt / "sessions" / new / "index")
    with mounted(store, mnt, "--session", name) as m:  # the sandbox's view has it too
        assert (m.mnt / "index" / "import-sources.json").read_bytes() == grown


def test_a_refused_write_gives_its_reason_to_getfattr_and_the_log(m):
    """The shell says only "Bad message": the reason is one getfattr away, on the session
    folder and on events.jsonl, and in the server's log with the session's name."""
    s = make_session(m, "demo")
    done = sh("echo '{\"type\":\"turn.failed\"}' >> events.jsonl", s, check=False)
    assert done.returncode != 0 and "Bad message" in done.stderr
    reason = 'turn.failed: "message" must be a string (or "error" an object with a string "message", ' \
             'as Codex writes it)'
    for path in (".", "events.jsonl"):
        got = sh(f"getfattr --only-values -n user.memfs.last_error {path}", s)
        assert got.stdout == reason, path
        assert "user.memfs.last_error" in sh(f"getfattr -d {path}", s).stdout, path
    assert f"[session demo]: {reason}" in m.log_text()
    (m.mnt / "sessions" / "quiet").mkdir()
    assert "last_error" not in sh("getfattr -d events.jsonl", m.mnt / "sessions" / "quiet").stdout
