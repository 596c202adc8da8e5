"""Soak (issue 7): 8 writers and 4 readers on one mount for a bounded time, with cap evictions.

Writers append numbered lines (turns of six lines) to one session whose cap (``--max-events``)
is small, so completed turns are evicted again and again while readers ``cat`` every view,
the manifest, the turn index, turn files and search results (per session and store-wide).
Every read must give well-formed content (or ``ENOENT`` for a turn evicted meanwhile), every
write must succeed. At the end: the store is consistent (its metadata agrees with a fresh
rescan), each writer's retained lines are the newest ones it wrote, in order, once; and the
daemon has no more open file descriptors or inodes than before the run (inodes counted after
the kernel dropped its caches, so every node it ever looked up was forgotten).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from mounting import mounted, needs_fuse
from test_reliability_helpers import acked, assert_consistent, drop_caches, line_id, open_fds, start_writer

pytestmark = needs_fuse

WRITERS, READERS = 8, 4
MAX_EVENTS = 300
SOAK_LINES = 10 * MAX_EVENTS // WRITERS  # per writer: the session goes through ~10 caps' worth
SOAK_DEADLINE = 120  # seconds the writers may take to get there before the test fails

# argv: the mount, the session name, the stop file. Reads in rounds until the stop file exists
# (at least one); prints how many rounds it made; exits non-zero on the first unexpected result.
READER = r'''
import errno, json, os, sys
mnt, name, stop = sys.argv[1:4]
s = os.path.join(mnt, "sessions", name)
def read(path):
    with open(path, "rb") as f:
        return f.read()
def jsonl(data):
    return [json.loads(line) for line in data.splitlines()]
checks = {
    "manifest.json": json.loads, "index/turns.json": json.loads, "derived/memory.json": json.loads,
    "derived/progress.json": json.loads, "derived/goal.json": json.loads,
    "derived/trajectory.jsonl": jsonl, "derived/summary.md": bytes.decode, "derived/progress.md": bytes.decode,
    "search/retry loop?k=5": jsonl, "search/writer w3 line": jsonl,
}
rounds = 0
while not rounds or not os.path.exists(stop):
    for rel, parse in checks.items():
        parse(read(os.path.join(s, rel)))
    parse_root = jsonl(read(os.path.join(mnt, "search", "retry loop?k=3")))
    manifest = json.loads(read(os.path.join(s, "manifest.json")))
    assert manifest["event_count"] > 0, manifest
    for n in sorted(int(t.split(".")[0]) for t in os.listdir(os.path.join(s, "derived", "turns")))[-2:]:
        try:
            jsonl(read(os.path.join(s, "derived", "turns", "%d.jsonl" % n)))
        except FileNotFoundError:
            pass  # evicted since the listing
    os.listdir(os.path.join(s, "derived"))
    os.stat(os.path.join(s, "events.jsonl"))
    rounds += 1
print(rounds)
'''


def settled(measure, at_most: int | None = None, timeout: float = 10) -> int:
    """A count of the daemon's once transient work is over (the kernel's forgets delivered,
    a view copy's temp file closed): at most ``at_most``, or (without it) no longer
    shrinking; the last value seen when ``timeout`` runs out."""
    deadline = time.monotonic() + timeout
    n = measure()
    while time.monotonic() < deadline:
        time.sleep(0.2)
        last, n = n, measure()
        if (n <= at_most) if at_most is not None else (n == last):
            break
    return n


def test_soak_writers_readers_and_evictions(tmp_path):
    store, stop = tmp_path / "store", tmp_path / "stop"
    acks = [tmp_path / f"w{i}.acks" for i in range(WRITERS)]
    procs = []
    with mounted(store, tmp_path / "mnt", "--max-events", str(MAX_EVENTS)) as m:
        session = m.mnt / "sessions" / "s1"
        os.mkdir(session)
        warm = start_writer(session / "events.jsonl", "warm", tmp_path / "warm.acks", count=12, per_turn=6)
        assert warm.wait(30) == 0
        reader = [sys.executable, "-c", READER, str(m.mnt), "s1", str(stop)]
        stop.touch()  # one round of every read: the views and the search index exist
        warmed = subprocess.run(reader, capture_output=True, text=True, timeout=60)
        assert warmed.returncode == 0, warmed.stderr
        stop.unlink()
        drop_caches()
        inodes_before = settled(lambda: os.statvfs(m.mnt).f_files)
        fds_before = settled(lambda: open_fds(m.proc.pid))
        try:
            procs = [start_writer(session / "events.jsonl", f"w{i}", acks[i], per_turn=6, stop=stop)
                     for i in range(WRITERS)]
            procs += [subprocess.Popen(reader, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                      for _ in range(READERS)]
            deadline = time.monotonic() + SOAK_DEADLINE  # run until every writer has done its share
            while min(len(acked(a)) for a in acks) < SOAK_LINES:
                assert time.monotonic() < deadline, "writers made too little progress"
                assert all(p.poll() is None for p in procs), "a writer or reader stopped early"
                time.sleep(0.1)
        finally:
            stop.touch()
            results = []
            for p in procs:
                try:
                    out, err = p.communicate(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
                    out, err = p.communicate()
                results.append((p.returncode, out, err))
        assert all(code == 0 and not err for code, _out, err in results), [r for r in results if r[0] or r[2]]
        assert all(int(out) > 0 for _code, out, _err in results[WRITERS:]), results  # readers read
        drop_caches()
        inodes_after = settled(lambda: os.statvfs(m.mnt).f_files, at_most=inodes_before)
        fds_after = settled(lambda: open_fds(m.proc.pid), at_most=fds_before)
        assert inodes_after <= inodes_before
        assert fds_after <= fds_before
        log = m.log_text()
        assert "Traceback" not in log and "unexpected error" not in log, log[-3000:]
    assert m.proc.returncode == 0

    lines = assert_consistent(store / "s1")
    manifest = json.loads((store / "s1" / "manifest.json").read_bytes())
    assert manifest["retained_turn_base"] > 1  # turns were evicted...
    assert list((store / "s1" / "derived").glob("eviction-summary-*.json"))  # ...and summarized
    assert len(lines) <= MAX_EVENTS + 6 * WRITERS  # under the cap, but for turns still open
    found: dict[str, list[int]] = {}
    for line in lines:
        name, n = line_id(line)
        found.setdefault(name, []).append(n)
    for i in range(WRITERS):
        wrote = acked(acks[i])
        numbers = found.get(f"w{i}", [])
        assert len(wrote) > MAX_EVENTS // WRITERS  # each writer outlived several evictions
        # what is retained of each writer is its newest lines: consecutive, ending at its last
        assert numbers == list(range(len(wrote) - len(numbers), len(wrote))), f"w{i}"
