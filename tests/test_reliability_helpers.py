"""Shared pieces of the reliability suite (tests/test_reliability_*.py); holds no tests.

* :func:`assert_consistent` — the store-side invariant every case ends with: the log is whole
  lines, and ``manifest.json`` + ``index/turns.json`` on disk agree with a fresh rescan of
  ``events.jsonl`` (so the next open takes the fast path).
* :data:`WRITER` — a writer process for ``python -c``: appends distinct numbered lines to a
  file with one ``write()`` per line and records each line whose ``write()`` returned success.
* small probes of the daemon: :func:`open_fds`, :func:`wait_unmounted`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from memfs.store.machine import renumber
from memfs.store.recovery import OpenReport, rescan
from memfs.store.session import open_session

from mounting import is_mounted

TURN_KEYS = ("turn_number", "start_offset", "end_offset", "event_count")


def assert_consistent(session_dir: Path) -> list[bytes]:
    """Check a session's files on disk (no mount serving them); return the log's lines.

    Every line ends with ``\\n``; the manifest names the log's length and the counts, and the
    turn index the turns, that a rescan of the log finds; no cap rewrite is pending; and a
    read-only open trusts the metadata (fast path).
    """
    data = (session_dir / "events.jsonl").read_bytes()
    assert data == b"" or data.endswith(b"\n"), f"torn tail: {data[-80:]!r}"
    manifest = json.loads((session_dir / "manifest.json").read_bytes())
    entries = json.loads((session_dir / "index" / "turns.json").read_bytes())["entries"]
    fd = os.open(session_dir / "events.jsonl", os.O_RDONLY)
    try:
        state = rescan(fd, len(data), OpenReport())
    finally:
        os.close(fd)
    renumber(state, manifest["retained_turn_base"])
    assert manifest["persisted_file_len"] == len(data)
    found = {"event_count": state.event_count, "turn_count": state.turn_count, "in_turn": state.in_turn}
    assert {k: manifest[k] for k in found} == found
    assert [{k: e[k] for k in TURN_KEYS} for e in entries] == \
        [{k: e[k] for k in TURN_KEYS} for e in state.index.entries()]
    assert not (session_dir / "index" / "pending-cap-rewrite.json").exists()
    with open_session(session_dir.parent, session_dir.name, read_only=True) as handle:
        assert handle.open_report.fast_path, handle.open_report.reason
    return data.splitlines()


# argv: events.jsonl path, writer name, acks file, number of lines (0: until a write fails or
# the stop file exists), lines per turn (0: no turns), stop file (optional). Each line is an
# envelope (stored byte for byte) whose item id is "<name>-<n>"; its turn.started and
# turn.completed lines carry the same numbering, so every line of every writer is distinct.
# A line is acknowledged (one os.write of "<n>\n" to the acks file, which survives the
# writer) only after its write() returned its full length.
WRITER = r'''
import errno, os, sys
path, name, acks, count, per_turn = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
stop = sys.argv[6] if len(sys.argv) > 6 else None
ack = os.open(acks, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
fd = os.open(path, os.O_WRONLY | os.O_APPEND)
def line(n):
    head = '{"schema_version":"0.18.0","event":'
    if per_turn and n % per_turn == 0:
        return head + '{"type":"turn.started","id":"%s-%d"}}\n' % (name, n)
    if per_turn and n % per_turn == per_turn - 1:
        return head + '{"type":"turn.completed","usage":{"input_tokens":%d},"id":"%s-%d"}}\n' % (n, name, n)
    return head + ('{"type":"item.completed","item":{"id":"%s-%d","type":"agent_message",'
                   '"text":"writer %s line %d retry loop"}}}\n' % (name, n, name, n))
n = 0
try:
    while (not count or n < count) and not (stop and os.path.exists(stop)):
        data = line(n).encode()
        if os.write(fd, data) != len(data):
            sys.exit("short write of a valid line")
        os.write(ack, b"%d\n" % n)
        n += 1
    os.close(fd)
except OSError as exc:
    # the mount went away (ENOTCONN, ECONNABORTED) or the write failed: stop here
    print("%s stopped at %d: %s" % (name, n, errno.errorcode.get(exc.errno, exc.errno)), file=sys.stderr)
'''


def start_writer(events: Path, name: str, acks: Path, count: int = 0, per_turn: int = 0,
                 stop: Path | None = None) -> subprocess.Popen:
    args = [str(events), name, str(acks), str(count), str(per_turn)] + ([str(stop)] if stop else [])
    return subprocess.Popen([sys.executable, "-c", WRITER, *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def line_id(line: bytes) -> tuple[str, int]:
    """``(writer, n)`` of a line :data:`WRITER` wrote."""
    event = json.loads(line)["event"]
    ident = event["item"]["id"] if "item" in event else event["id"]
    name, _, n = ident.rpartition("-")
    return name, int(n)


def acked(acks: Path) -> list[int]:
    """The line numbers a writer acknowledged, in order."""
    try:
        return [int(x) for x in acks.read_text().split()]
    except FileNotFoundError:
        return []


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def wait_unmounted(mnt: Path, timeout: float) -> bool:
    """Whether the kernel stopped showing the mount within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while is_mounted(mnt):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def drop_caches() -> None:
    """Make the kernel forget dentries and inodes (it then sends FUSE ``forget``s); the calling
    test is skipped, with the reason, where that is not allowed (it needs root)."""
    if os.geteuid() != 0:
        pytest.skip("writing /proc/sys/vm/drop_caches needs root")
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2\n")
