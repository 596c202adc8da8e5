"""The syncer of fsync-mode mounts (memfs/fs/syncer.py): fdatasync of a descriptor handed over
to it (it closes it) on a thread, completions on an eventfd, the errno of a failed sync."""

from __future__ import annotations

import errno
import os
import select

import pytest
from memfs.fs.syncer import Syncer


def completions(syncer, n: int, timeout: float = 10.0) -> list[tuple[int, int]]:
    """Wait on the eventfd, as the mount does, until ``n`` completions arrived."""
    got: list[tuple[int, int]] = []
    poller = select.poll()
    poller.register(syncer.fileno(), select.POLLIN)
    while len(got) < n:
        assert poller.poll(timeout * 1000), f"only {len(got)} of {n} completions within {timeout} s"
        got += syncer.done()
    return got


def test_syncs_complete_with_their_tags_and_the_syncer_closes_what_it_was_given(tmp_path):
    syncer = Syncer(4)
    try:
        before = len(os.listdir("/proc/self/fd"))
        for i in range(20):
            fd = os.open(tmp_path / f"f{i % 5}", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.write(fd, b"line\n")
            syncer.submit(fd, 100 + i)  # the syncer's from here on
        got = completions(syncer, 20)
        assert sorted(got) == [(100 + i, 0) for i in range(20)]
        assert syncer.done() == []  # drained
        assert len(os.listdir("/proc/self/fd")) == before  # each closed once synced
    finally:
        syncer.close()


def test_a_failed_sync_reports_its_errno():
    syncer = Syncer(1)
    r, w = os.pipe()
    try:
        syncer.submit(os.dup(w), 7)  # fdatasync of a pipe: EINVAL
        assert completions(syncer, 1) == [(7, errno.EINVAL)]
        with pytest.raises(OSError) as err:
            syncer.submit(12345, 8)  # no such descriptor: refused at once
        assert err.value.errno == errno.EBADF
    finally:
        os.close(r)
        os.close(w)
        syncer.close()


def test_close_runs_what_is_queued(tmp_path):
    syncer = Syncer(2)
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for i in range(10):
            syncer.submit(os.dup(fd), i)
    finally:
        syncer.close()  # joins the threads after the queue ran: nothing is left behind
    with pytest.raises(ValueError):
        syncer.submit(fd, 10)  # closed: refused, and fd is still the caller's
    os.fstat(fd)
    os.close(fd)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        Syncer(2).close()
    assert len(os.listdir("/proc/self/fd")) == before  # eventfds and duplicates closed
