"""Writes give way to queued requests (memfs/fs/gate.py): with several agents appending at
once, a write that finds requests waiting in the kernel waits for its turn — and every line
still lands exactly once, in each writer's order, with or without cap rewrites meanwhile."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from mounting import event, mounted, needs_fuse

pytestmark = needs_fuse


def turn_lines(me: str, k: int) -> list[bytes]:
    items = [event("item.completed", item={"id": f"{me}-{k}-{i}", "type": "agent_message", "text": f"{me} {k} {i}"})
             for i in range(3)]
    return [(line + "\n").encode() for line in [event("turn.started"), *items, event("turn.completed", usage={})]]


WRITER = r"""
import json, os, sys
path, stop, me = sys.argv[1:4]

def event(etype, **fields):
    return json.dumps({"schema_version": "0.18.0", "event": {"type": etype, **fields}}, separators=(",", ":"))

fd = os.open(path, os.O_WRONLY | os.O_APPEND)
k = 0
while not os.path.exists(stop):
    items = [event("item.completed", item={"id": f"{me}-{k}-{i}", "type": "agent_message", "text": f"{me} {k} {i}"})
             for i in range(3)]
    for line in [event("turn.started"), *items, event("turn.completed", usage={})]:
        data = (line + "\n").encode()
        assert os.write(fd, data) == len(data)  # one write() per line, as agents append
    k += 1
os.close(fd)
print(k)
"""


def turns_of(session) -> int:
    return int(os.getxattr(session, "user.memfs.turn_count"))


def gated(mnt) -> int:
    return int(os.getxattr(mnt, "user.memfs.writes_gated"))


@pytest.mark.parametrize("max_events", [0, 300])
def test_concurrent_writers_are_gated_and_every_line_lands_once_in_order(tmp_path, max_events):
    with mounted(tmp_path / "store", tmp_path / "mnt", "--max-events", str(max_events)) as m:
        sessions = m.mnt / "sessions"
        os.mkdir(sessions / "idle")
        with open(sessions / "idle" / "events.jsonl", "a") as f:
            f.write(event("turn.started") + "\n" + event("turn.completed", usage={}) + "\n")
        names = [f"w{k}" for k in range(4)]
        for name in names:
            os.mkdir(sessions / name)
        stop = tmp_path / "stop"
        writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(sessions / name / "events.jsonl"), str(stop),
                                     name], stdout=subprocess.PIPE, text=True) for name in names]
        try:
            # an idle session is read meanwhile, as the responsiveness benchmark does, until
            # writes were gated behind queued requests (and the writers wrote a while)
            manifest = sessions / "idle" / "manifest.json"
            deadline = time.monotonic() + 60
            while gated(m.mnt) < 200 or min(turns_of(sessions / name) for name in names) < 150:
                assert time.monotonic() < deadline, f"writes gated: {gated(m.mnt)}"
                assert json.loads(manifest.read_bytes())["event_count"] == 2
        finally:
            stop.touch()
            turns = [int(w.communicate(timeout=60)[0]) for w in writers]
        assert all(w.returncode == 0 for w in writers)

        for name, n in zip(names, turns):
            expected = [line for k in range(n) for line in turn_lines(name, k)]
            log = (sessions / name / "events.jsonl").read_bytes().splitlines(keepends=True)
            manifest = json.loads((sessions / name / "manifest.json").read_bytes())
            if max_events:  # cap rewrites ran meanwhile: what is left is the newest whole turns
                assert 0 < len(log) <= max_events < len(expected)
                assert log == expected[-len(log):] and log[0] == (event("turn.started") + "\n").encode()
                assert manifest["event_count"] == len(log)
            else:
                assert log == expected
                assert manifest["event_count"] == len(expected)
            assert manifest["turn_count"] == n

        # one writer alone finds no requests queued: its writes go at once (but the first may
        # meet the RELEASE of the manifest read just before, which the kernel sends async)
        before = gated(m.mnt)
        fd = os.open(sessions / "idle" / "events.jsonl", os.O_WRONLY | os.O_APPEND)
        try:
            for k in range(100):
                for line in turn_lines("idle", k):
                    assert os.write(fd, line) == len(line)
        finally:
            os.close(fd)
        assert gated(m.mnt) - before <= 1
    assert m.proc.returncode == 0


def test_the_gate_runs_writes_in_order_after_queued_requests_and_all_of_them_at_unmount():
    """The gate itself on a trio loop (no mount): ``queued`` stands for the poll of /dev/fuse,
    a reader task for pyfuse3's (one request read per pass of the loop)."""
    import trio
    import trio.testing
    from memfs.fs.gate import MAX_YIELDS, WriteGate

    events: list[str] = []
    kernel = {"queued": 0}  # requests waiting to be read

    async def reader():
        while kernel["queued"]:
            await trio.lowlevel.checkpoint()
            kernel["queued"] -= 1
            events.append("read")

    async def main():
        gate = WriteGate(lambda: kernel["queued"] > 0)
        arrived, results = [], []

        async def write(k):
            arrived.append(k)
            results.append(await gate.turn(lambda: events.append(f"w{k}") or k))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(gate.run)
            await trio.testing.wait_all_tasks_blocked()
            kernel["queued"] = 3
            assert not gate.busy()  # only writes were served lately: writes go at once
            gate.note_other()
            assert gate.busy()
            for k in range(4):
                nursery.start_soon(write, k)
            nursery.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()
            assert sorted(results) == [0, 1, 2, 3] and gate.gated == 4
            assert events == ["read"] * 3 + [f"w{k}" for k in arrived]  # in arrival order, after the reads

            # requests that are never read: each write still goes, after MAX_YIELDS passes
            kernel["queued"] = 1
            events.clear()
            nursery.start_soon(write, 10)
            passes = 0
            while len(results) < 5:
                await trio.lowlevel.checkpoint()
                passes += 1
            assert results[4] == 10 and MAX_YIELDS <= passes <= MAX_YIELDS + 5  # (+ starting, waking, resuming)

            # unmounting: a write still waiting runs before the gate ends
            nursery.start_soon(write, 20)
            await trio.lowlevel.checkpoint()
            nursery.cancel_scope.cancel()
        assert results[-1] == 20 and events[-1] == "w20"
        assert not gate.busy()
        assert await gate.turn(lambda: 30) == 30  # after the gate ended: at once

    trio.run(main)
