"""Readers of ``events.jsonl`` across cap rewrites (SPEC §3.7, issue 14), through a real mount.

A read handle keeps reading the version of the log it opened (never a fragment of a line of
another version), and every rewritten log is a new file in the mount (a new inode number), so
``tail -F`` reopens it and keeps following.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

from mounting import event, mounted, needs_fuse

pytestmark = needs_fuse

TURNS = 400


def _turn(n: int) -> bytes:
    lines = [event("turn.started"),
             event("item.completed", item={"id": f"m{n}", "type": "agent_message", "text": f"turn {n} done"}),
             event("turn.completed", usage={"input_tokens": n, "output_tokens": 1})]
    return "".join(line + "\n" for line in lines).encode()


def test_tail_F_follows_the_log_across_cap_rewrites(tmp_path):
    with mounted(tmp_path / "store", tmp_path / "mnt", "--max-events", "50") as m:
        session = m.mnt / "sessions" / "s1"
        os.mkdir(session)
        log = session / "events.jsonl"
        with open(log, "ab", buffering=0) as f:
            f.write(_turn(0))
        first_ino = os.stat(log).st_ino
        out = open(tmp_path / "tail.out", "wb")
        tail = subprocess.Popen(["tail", "-F", "-n", "+1", "-s", "0.05", str(log)], stdout=out,
                                stderr=subprocess.PIPE)
        try:
            with open(log, "ab", buffering=0) as f:  # one write() per line, as agents append
                for n in range(1, TURNS):
                    for line in _turn(n).splitlines(keepends=True):
                        f.write(line)
            last = f'"id":"m{TURNS - 1}"'.encode()
            deadline = time.monotonic() + 30
            while last not in (tmp_path / "tail.out").read_bytes():
                assert tail.poll() is None, tail.stderr.read()
                assert time.monotonic() < deadline, "tail -F never showed the last turn"
                time.sleep(0.05)
            assert os.stat(log).st_ino != first_ino  # the rewritten log is a new file
        finally:
            tail.terminate()
            tail.wait(10)
            out.close()
        manifest = json.loads((session / "manifest.json").read_bytes())
    assert manifest["retained_turn_base"] > 1  # the cap did rewrite the log, many times
    printed = (tmp_path / "tail.out").read_bytes().splitlines()
    seen = set()
    for line in printed:  # only whole valid lines: never a fragment of another version
        record = json.loads(line)
        item = record["event"].get("item")
        if item:
            seen.add(int(item["id"][1:]))
    # it kept following: turns from the end of the run (after many rewrites) were printed
    # (how many turns it printed in between depends on its polling: turns evicted before it
    # reopened the new file are gone, as the cap intends)
    assert {TURNS - 3, TURNS - 2, TURNS - 1} <= seen
