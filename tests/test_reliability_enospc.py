"""The backing store runs out of space (issue 7): a 2 MiB tmpfs as the store.

Appends must fail with ``ENOSPC`` and take nothing (a line reported as failed is never
committed later, and a write that tore half a line into the file is cut back), nothing
accepted earlier is lost, the mount stays up, the store stays consistent, and the same
appends succeed once space is freed.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import time

import pytest

from mounting import event, mounted, needs_fuse
from test_reliability_helpers import assert_consistent

pytestmark = [needs_fuse, pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")]

PAGE = 4096
BIG = 6000  # bytes: a line this long always spans a page boundary, so a full tmpfs tears it


def item(ident: str, size: int = 0) -> bytes:
    line = event("item.completed", item={"id": ident, "type": "agent_message", "text": "x"}).encode()
    if size > len(line):
        line = event("item.completed", item={"id": ident, "type": "agent_message",
                                             "text": "x" * (size - len(line))}).encode()
    return line + b"\n"


@pytest.fixture
def small_store(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(store)], check=True)
    try:
        yield store
    finally:
        subprocess.run(["umount", "-l", str(store)], check=False)


def fill(store) -> None:
    """Take every free block of the tmpfs with a hidden filler file (not a session)."""
    fd = os.open(store / ".filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * (64 * 1024 if os.statvfs(store).f_bavail > 16 else PAGE))
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)


def write_errno(fd: int, data: bytes) -> int:
    """0 when ``data`` was written whole, else the errno the writer saw."""
    try:
        assert os.write(fd, data) == len(data)
        return 0
    except OSError as exc:
        return exc.errno


@pytest.mark.parametrize("durability", ["write", "fsync"])
def test_appends_fail_with_enospc_take_nothing_and_resume(small_store, tmp_path, durability):
    store = small_store
    with mounted(store, tmp_path / "mnt", "--durability", durability) as m:
        s = m.mnt / "sessions" / "s1"
        os.mkdir(s)
        accepted = [event("turn.started").encode() + b"\n"] + [item(f"a{i}", 200) for i in range(20)]
        accepted.append(event("turn.completed", usage={"input_tokens": 5}).encode() + b"\n")
        accepted.append(event("turn.started").encode() + b"\n")
        fd = os.open(s / "events.jsonl", os.O_WRONLY | os.O_APPEND)
        closing = os.open(s / "events.jsonl", os.O_WRONLY | os.O_APPEND)
        try:
            for line in accepted:
                assert os.write(fd, line) == len(line)
            room = PAGE - os.stat(s / "events.jsonl").st_size % PAGE
            if room < 600:  # leave room in the log's last page for one small line
                accepted.append(item("pad", room + 200))
                assert os.write(fd, accepted[-1]) == len(accepted[-1])
            big = item("big", BIG)
            assert os.write(closing, big[:-1]) == len(big) - 1  # a fragment, kept until close
            (s / "derived" / "memory.json").read_bytes()
            fill(store)
            assert os.statvfs(store).f_bavail == 0

            # a line that fits the log's last page is written; the turn boundary's metadata
            # cannot be persisted, which must not fail the append
            accepted.append(event("turn.completed", usage={"input_tokens": 7}).encode() + b"\n")
            assert os.write(fd, accepted[-1]) == len(accepted[-1])
            deadline = time.monotonic() + 30  # the persister thread tries the metadata and fails
            while "persisting metadata of s1: " not in m.log_text():
                assert time.monotonic() < deadline, m.log_text()[-2000:]
                time.sleep(0.05)
            # a line that needs a new page: ENOSPC, every time, and nothing of it stays
            for _ in range(3):
                assert write_errno(fd, big) == errno.ENOSPC
            # a refused line that cannot be recorded in rejected.jsonl fails the same way
            assert write_errno(fd, b'{"broken":\n') == errno.ENOSPC
            assert write_errno(fd, big[:3000]) == 0  # a fragment is only kept in memory...
            assert write_errno(fd, big[3000:]) == errno.ENOSPC  # ...until its line is due
            # the final fragment of a handle: its close fails. The open file stays referenced
            # by a message in flight on a socket, so its RELEASE comes only once space is free
            # again (closing the socket drops that reference without a FLUSH): a line whose
            # close reported ENOSPC must not be appended then either.
            holder, receiver = socket.socketpair(socket.AF_UNIX)
            socket.send_fds(holder, [b"fd"], [closing])
            with pytest.raises(OSError) as err:
                os.close(closing)
            assert err.value.errno == errno.ENOSPC

            served = (s / "events.jsonl").read_bytes()
            assert served == b"".join(accepted)
            assert (store / "s1" / "events.jsonl").read_bytes() == served  # no torn tail
            assert json.loads((s / "manifest.json").read_bytes())["event_count"] == len(accepted)
            assert json.loads((s / "derived" / "memory.json").read_bytes())["source"]["event_count"] \
                == len(accepted)  # views are served from memory while copies cannot be written
            assert not os.path.exists(store / "s1" / "rejected.jsonl") or \
                (store / "s1" / "rejected.jsonl").read_bytes() == b""

            os.unlink(store / ".filler")
            # the careful writer retries what failed: each line now goes in exactly once
            assert write_errno(fd, big[3000:]) == 0
            accepted.append(big)
            assert write_errno(fd, big) == 0
            accepted.append(big)
            assert write_errno(fd, b'{"broken":\n') == errno.EBADMSG
            accepted.append(event("turn.completed", usage={"input_tokens": 9}).encode() + b"\n")
            assert write_errno(fd, accepted[-1]) == 0
            holder.close()
            receiver.close()  # the last reference: RELEASE
            deadline = time.monotonic() + 30
            while f"final line of s1 ({len(big) - 1} bytes) dropped" not in m.log_text():
                assert time.monotonic() < deadline, m.log_text()[-2000:]
                time.sleep(0.05)
        finally:
            os.close(fd)
        assert (s / "events.jsonl").read_bytes() == b"".join(accepted)
        log = m.log_text()
        # the boundary's metadata failed on the persister thread: logged once, not at every retry
        assert log.count("persisting metadata of s1: [Errno 28]") == 1
        assert log.count("persisting metadata of s1") == 1
    assert m.proc.returncode == 0  # the mount stayed up and shut down cleanly
    lines = assert_consistent(store / "s1")
    assert [line + b"\n" for line in lines] == accepted
    rejected = [json.loads(r) for r in (store / "s1" / "rejected.jsonl").read_text().splitlines()]
    assert [(r["line"], r["errno"]) for r in rejected] == [('{"broken":', "EBADMSG")]
