"""Hostile input to ``memfs import``, ``record`` and ``append`` (SPEC §10 "untrusted input"):
only regular files reached without following a link are read, and a line over the limit is
refused while streaming — never held — and the lines after it go in. Run as a user runs them,
in subprocesses; the store is checked through the library."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
from pathlib import Path

import memfs
import orjson
import pytest

from agent_helpers import MEMFS
from store_helpers import wait_until

FIXTURES = Path(__file__).parent / "fixtures"
EXEC = FIXTURES / "codex_exec.jsonl"
EXEC_SID = "0199a213-81c0-7800-8aa1-bbab2a035a53"
ROLLOUT = FIXTURES / "codex_rollout.jsonl"
MIB = 1 << 20
RSS_LIMIT_KIB = 100 * 1024


def cli(*args: str, **kw) -> subprocess.CompletedProcess:
    if "stdout" not in kw and "stderr" not in kw:
        kw["capture_output"] = True
    return subprocess.run([*MEMFS, *args], timeout=120, **kw)


def events_of(store: Path, session: str) -> list[dict]:
    with memfs.open_session(store, session, read_only=True) as h:
        return [orjson.loads(line)["event"] for _, line in h.iter_lines()]


def rejected_of(store: Path, session: str) -> list[dict]:
    path = store / session / "rejected.jsonl"
    return [orjson.loads(x) for x in path.read_bytes().splitlines()] if path.exists() else []


def sessions(store: Path) -> list[str]:
    return sorted(p.name for p in store.iterdir() if (p / "events.jsonl").exists()) if store.exists() else []


def long_line(size: int) -> bytes:
    head = b'{"type":"error","message":"'
    return head + b"x" * (size - len(head) - 2) + b'"}'


def with_long_line(path: Path, size: int, after: int = 3) -> list[bytes]:
    """``codex_exec.jsonl`` with a ``size``-byte line after its ``after``-th line, written
    without holding it; returns the fixture's lines."""
    lines = EXEC.read_bytes().splitlines()
    with open(path, "wb") as f:
        f.write(b"".join(x + b"\n" for x in lines[:after]))
        f.write(long_line(size)[:27])
        left = size - 29
        while left:
            n = min(left, 4 * MIB)
            f.write(b"x" * n)
            left -= n
        f.write(b'"}\n')
        f.write(b"".join(x + b"\n" for x in lines[after:]))
    return lines


def assert_refused_long(record: dict, size: int) -> None:
    assert record["errno"] == "EFBIG" and record["bytes"] == size and record["truncated"] is True
    assert record["line"] == long_line(size)[:4096].decode()
    assert f"line is {size} bytes, over the limit" in record["reason"]


def max_rss_kib(argv: list[str], **kw) -> tuple[subprocess.CompletedProcess, int]:
    """Run ``argv`` from a fresh wrapper process; its child's peak RSS (KiB) is the wrapper's
    ``RUSAGE_CHILDREN`` — no other child of this test run is counted."""
    code = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:]); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(p.returncode)")
    if "stdout" not in kw:
        kw["capture_output"] = True
    proc = subprocess.run([sys.executable, "-c", code, *argv], timeout=120, **kw)
    return proc, int(proc.stderr.decode().strip().splitlines()[-1])


# --- only regular files, never through a link -------------------------------------------------


def test_import_skips_links_fifos_and_devices_with_their_reason_and_exit_3(tmp_path):
    secret = tmp_path / "outside" / "shadow.jsonl"
    secret.parent.mkdir()
    secret.write_bytes(EXEC.read_bytes())  # it would import: only the link keeps it out
    (tmp_path / "outside" / "deep").mkdir()
    (tmp_path / "outside" / "deep" / "x.jsonl").write_bytes(ROLLOUT.read_bytes())
    src = tmp_path / "src"
    (src / "p").mkdir(parents=True)
    (src / "p" / "good.jsonl").write_bytes(EXEC.read_bytes())
    (src / "p" / "shadow.jsonl").symlink_to(secret)
    (src / "p" / "linked").symlink_to(secret.parent / "deep", target_is_directory=True)
    os.mkfifo(src / "p" / "fifo.jsonl")
    (src / "p" / "zero.jsonl").symlink_to("/dev/zero")
    device = False
    try:
        os.mknod(src / "p" / "null.jsonl", 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # as root only
        device = True
    except PermissionError:
        pass
    store = tmp_path / "store"

    proc = cli("import", "--store", str(store), str(src))  # (a FIFO read would hang: timeout)
    out = proc.stdout.decode()
    assert proc.returncode == 3, (out, proc.stderr)
    skipped = 4 + device
    assert f"{skipped} files skipped" in proc.stderr.decode()
    for name in ("shadow.jsonl", "linked", "zero.jsonl"):
        assert f"skip {src / 'p' / name}: skipped: a symbolic link; not followed" in out
    assert f"skip {src / 'p' / 'fifo.jsonl'}: skipped: a FIFO, not a regular file; not read" in out
    if device:
        assert f"skip {src / 'p' / 'null.jsonl'}: skipped: a character device" in out
    assert sessions(store) == [EXEC_SID]  # only the regular file's conversation

    # top-level arguments: a link (to a file, to a directory) and a FIFO are not read either
    for arg in (src / "p" / "shadow.jsonl", src / "p" / "linked", src / "p" / "fifo.jsonl"):
        proc = cli("import", "--store", str(store), "--json", str(arg))
        assert proc.returncode == 3, proc.stderr
        (item,) = orjson.loads(proc.stdout)
        assert item["status"] == "skipped" and item["session"] is None, item
    assert sessions(store) == [EXEC_SID]
    assert secret.read_bytes() == EXEC.read_bytes()


def test_a_source_replaced_by_a_link_is_not_read_by_resume_paths(tmp_path):
    """``memfs resume``'s import back (import_into, remember_as_imported) opens as import does."""
    from memfs.ingest.importer import import_into, remember_as_imported
    from memfs.ingest.inputs import NotRegular

    store = tmp_path / "store"
    good = tmp_path / "good.jsonl"
    good.write_bytes(EXEC.read_bytes())
    assert cli("import", "--store", str(store), str(good)).returncode == 0
    link = tmp_path / "link.jsonl"
    link.symlink_to(good)
    for action in (lambda: import_into(store, link, EXEC_SID), lambda: remember_as_imported(store, link, EXEC_SID)):
        with pytest.raises(NotRegular, match="symbolic link"):
            action()


def test_follow_skips_links_and_fifos_as_they_appear(tmp_path, follower):
    import signal

    secret = tmp_path / "outside.jsonl"
    secret.write_bytes(ROLLOUT.read_bytes())
    src, store = tmp_path / "src", tmp_path / "store"
    src.mkdir()
    proc = follower(store, src)
    (src / "link.jsonl").symlink_to(secret)
    os.mkfifo(src / "pipe.jsonl")
    (src / "good.jsonl").write_bytes(EXEC.read_bytes())
    wait_until(lambda: sessions(store) == [EXEC_SID], "the regular file imported")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 3, err
    assert out.decode().count(f"skip {src / 'link.jsonl'}: skipped: a symbolic link; not followed") == 1
    assert out.decode().count(f"skip {src / 'pipe.jsonl'}: skipped: a FIFO") == 1
    assert sessions(store) == [EXEC_SID]


# --- a line over the limit: refused while streaming, the next lines imported ----------------


def test_import_refuses_a_long_line_and_imports_the_lines_after_it(tmp_path):
    src = tmp_path / "long.jsonl"
    lines = with_long_line(src, 40 * MIB)
    clean = tmp_path / "clean" / "long.jsonl"
    clean.parent.mkdir()
    clean.write_bytes(b"".join(x + b"\n" for x in lines))
    store, expect = tmp_path / "store", tmp_path / "expect"
    assert cli("import", "--store", str(expect), str(clean)).returncode == 0

    proc = cli("import", "--store", str(store), "--max-line-bytes", str(MIB), str(src))
    assert proc.returncode == 3, proc.stderr
    assert "0 files skipped, 1 line refused" in proc.stderr.decode()
    assert events_of(store, EXEC_SID) == events_of(expect, EXEC_SID)  # everything but that line
    (record,) = rejected_of(store, EXEC_SID)
    assert_refused_long(record, 40 * MIB)
    assert record["sha256"] == hashlib.sha256(long_line(40 * MIB)).hexdigest()
    # the sidecar covers the whole file: importing again adds and refuses nothing
    again = cli("import", "--store", str(store), "--max-line-bytes", str(MIB), "--json", str(src))
    assert again.returncode == 0 and orjson.loads(again.stdout)[0]["status"] == "up-to-date"


def test_import_of_a_200_mb_line_stays_under_100_mib(tmp_path):
    src = tmp_path / "huge.jsonl"
    with_long_line(src, 200 * MIB)
    store = tmp_path / "store"
    proc, rss = max_rss_kib([*MEMFS, "import", "--store", str(store), str(src)])
    assert proc.returncode == 3, proc.stderr
    assert rss < RSS_LIMIT_KIB, f"import peaked at {rss // 1024} MiB"
    (record,) = rejected_of(store, EXEC_SID)
    assert_refused_long(record, 200 * MIB)
    assert len(events_of(store, EXEC_SID)) > 10


def test_a_zstd_bomb_is_refused_with_bounded_memory(tmp_path):
    """A few hundred KiB of ``.zst`` expanding to a 300 MB line between good lines: the line is
    refused, the others imported, and memory stays bounded."""
    import zstandard

    lines = EXEC.read_bytes().splitlines()
    src = tmp_path / "rollout.jsonl.zst"
    with open(src, "wb") as raw, zstandard.ZstdCompressor(level=1).stream_writer(raw) as z:
        z.write(b"".join(x + b"\n" for x in lines[:3]) + b'{"type":"error","message":"')
        block = b"x" * (4 * MIB)
        for _ in range(75):
            z.write(block)
        z.write(b'"}\n' + b"".join(x + b"\n" for x in lines[3:]))
    assert src.stat().st_size < MIB
    store = tmp_path / "store"
    proc, rss = max_rss_kib([*MEMFS, "import", "--store", str(store), str(src)])
    assert proc.returncode == 3, proc.stderr
    assert rss < RSS_LIMIT_KIB, f"import peaked at {rss // 1024} MiB"
    (record,) = rejected_of(store, EXEC_SID)
    assert record["errno"] == "EFBIG" and record["bytes"] == 300 * MIB + 29
    assert events_of(store, EXEC_SID)[-1] == orjson.loads(lines[-1])  # the lines after it went in


# --- memfs append (stdin) and memfs record ---------------------------------------------------


def test_append_from_stdin_refuses_a_long_line_unheld_and_goes_on(tmp_path):
    src = tmp_path / "in.jsonl"
    good = [b'{"type":"thread.started","thread_id":"t"}', b'{"type":"error","message":"after"}']
    with open(src, "wb") as f:
        f.write(good[0] + b"\n")
        f.write(long_line(200 * MIB) + b"\n")
        f.write(good[1] + b"\n")
    store = tmp_path / "store"
    with open(src, "rb") as stdin:
        proc, rss = max_rss_kib([*MEMFS, "append", "--store", str(store), "--keep-going", "s"], stdin=stdin)
    assert proc.returncode == 1
    assert b"line 2: refused: line is 209715200 bytes, over the limit" in proc.stderr
    assert rss < RSS_LIMIT_KIB, f"append peaked at {rss // 1024} MiB"
    assert [e["type"] for e in events_of(store, "s")] == ["thread.started", "error"]
    (record,) = rejected_of(store, "s")
    assert_refused_long(record, 200 * MIB)


def test_record_refuses_a_long_line_of_the_agent_and_keeps_the_rest(tmp_path):
    lines = EXEC.read_bytes().splitlines()
    agent = tmp_path / "agent.py"
    agent.write_text(
        "import sys\n"
        f"lines = {lines!r}\n"
        "w = sys.stdout.buffer.write\n"
        "w(b''.join(x + b'\\n' for x in lines[:3]))\n"
        "w(b'{\"type\":\"error\",\"message\":\"')\n"
        "for _ in range(200):\n    w(b'x' * (1 << 20))\n"
        "w(b'\"}\\n')\n"
        "w(b''.join(x + b'\\n' for x in lines[3:]))\n")
    store = tmp_path / "store"
    proc, rss = max_rss_kib([*MEMFS, "record", "--store", str(store), "run", "--format", "codex", "--",
                             sys.executable, str(agent)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.returncode == 0, proc.stderr
    assert b"1 line of the agent's output refused" in proc.stderr
    assert rss < RSS_LIMIT_KIB, f"record peaked at {rss // 1024} MiB"  # (the agent's own memory included)
    (record,) = rejected_of(store, "run")
    assert record["errno"] == "EFBIG" and record["bytes"] == 200 * MIB + 29 and record["truncated"] is True
    got = events_of(store, "run")
    assert got[0]["type"] == "thread.started" and got[-1] == orjson.loads(lines[-1])


# --- the mount's write path ------------------------------------------------------------------


def test_a_mount_refuses_a_long_line_written_in_pieces_unheld_and_takes_the_next(tmp_path):
    """Pieces of one line past the limit: the write that crosses it fails with ``EFBIG`` (the
    record keeps the first 4 KiB, the length and hash of what came), the fragment is dropped,
    and the writer's next line is appended."""
    import errno

    from mounting import mounted

    good = b'{"type":"thread.started","thread_id":"t"}\n'
    line = long_line(3 * MIB) + b"\n"
    with mounted(tmp_path / "store", tmp_path / "mnt", "--max-line-bytes", str(MIB)) as m:
        session = m.mnt / "sessions" / "big"
        os.mkdir(session)
        fd = os.open(session / "events.jsonl", os.O_WRONLY | os.O_APPEND)
        errors, pos = [], 0
        try:
            while pos < len(line):
                try:
                    pos += os.write(fd, line[pos:pos + 64 * 1024])
                except OSError as exc:  # the writer's line was refused: it goes on with its next one
                    errors.append(exc.errno)
                    break
            assert os.write(fd, good) == len(good)
        finally:
            os.close(fd)
        assert errors == [errno.EFBIG]
        stored = (session / "events.jsonl").read_bytes().splitlines()
        assert [orjson.loads(x)["event"] for x in stored] == [orjson.loads(good)]
    (record,) = rejected_of(tmp_path / "store", "big")
    assert record["errno"] == "EFBIG" and record["truncated"] is True
    assert MIB < record["bytes"] <= MIB + 64 * 1024
    assert record["line"] == line[:4096].decode()
    assert record["sha256"] == hashlib.sha256(line[:record["bytes"]]).hexdigest()
