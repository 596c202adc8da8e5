"""Issue 15 through a real mount: turn times memfs records itself fill ``trajectory.jsonl``
(item 4), and ``memfs record`` appends while a store-wide mount serves the same store, the
mount showing the events live (item 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import memfs
import orjson
from memfs.store.meta import parse_rfc3339

from mounting import event, mounted, needs_fuse, sh
from store_helpers import wait_until

pytestmark = needs_fuse

FIXTURES = Path(__file__).parent / "fixtures"
AGENT = Path(__file__).parent / "agents" / "replay.py"



def ordered(start, end) -> bool:
    return start is not None and end is not None and parse_rfc3339(start) <= parse_rfc3339(end)


def read_json(path: Path):
    return orjson.loads(path.read_bytes())


def trajectory(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_trajectory_and_show_have_the_times_of_turns_written_through_the_mount(tmp_path):
    store = tmp_path / "store"
    with mounted(store, tmp_path / "mnt") as m:
        sdir = m.mnt / "sessions" / "timed"
        sdir.mkdir()
        log = sdir / "events.jsonl"
        # no event carries a clock: the times are memfs's own
        for text in ("first", "second"):
            sh(f"printf '%s\\n' '{event('turn.started')}' >> {log}", tmp_path)
            sh(f"printf '%s\\n' '{event('item.completed', item={'id': text, 'type': 'agent_message', 'text': text})}'"
               f" >> {log}", tmp_path)
            sh(f"printf '%s\\n' '{event('turn.completed', usage={'input_tokens': 1})}' >> {log}", tmp_path)
        sh(f"printf '%s\\n' '{event('turn.started')}' >> {log}", tmp_path)  # turn 3 stays open
        turns = trajectory(sdir / "derived" / "trajectory.jsonl")
        assert [t["turn"] for t in turns] == [1, 2, 3]
        for t in turns[:2]:
            assert ordered(t["started_at"], t["completed_at"]), t
        assert parse_rfc3339(turns[0]["completed_at"]) <= parse_rfc3339(turns[1]["started_at"])
        assert turns[2]["started_at"] is not None and turns[2]["completed_at"] is None
        # memfs show beside the mount reads the sidecar the mount persists (coalesced: soon)
        def shown():
            res = subprocess.run([sys.executable, "-m", "memfs", "show", "--store", str(store), "timed", "--json"],
                                 capture_output=True, timeout=60)
            assert res.returncode == 0, res.stderr
            rows = json.loads(res.stdout)["turns"]
            return rows if [r["started_at"] for r in rows] == [t["started_at"] for t in turns] else None
        rows = wait_until(shown, "memfs show lists the mount's turn times")
        assert [r["completed_at"] for r in rows] == [t["completed_at"] for t in turns]
        table = subprocess.run([sys.executable, "-m", "memfs", "show", "--store", str(store), "timed"],
                               capture_output=True, text=True, timeout=60)
        assert "STARTED" in table.stdout and "ENDED" in table.stdout
        assert turns[1]["completed_at"] in table.stdout
    assert m.proc.returncode == 0


def test_record_appends_while_a_store_wide_mount_serves_the_store(tmp_path):
    store = tmp_path / "store"
    stream = FIXTURES / "codex_exec.jsonl"
    with mounted(store, tmp_path / "mnt", "-o", "idle_release=1") as m:
        sessions = m.mnt / "sessions"
        assert list(sessions.iterdir()) == []
        agent = subprocess.Popen([sys.executable, "-m", "memfs", "record", "--store", str(store), "live-run",
                                  "--format", "codex", "--", sys.executable, str(AGENT), str(stream),
                                  "--pause", "0.1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            sdir = sessions / "live-run"
            # while it runs: the mount lists the session and follows its events
            counts = []

            def seen_mid_run():
                if agent.poll() is not None:
                    return "ended"
                try:
                    counts.append(read_json(sdir / "manifest.json")["event_count"])
                except FileNotFoundError:
                    return None
                facts = read_json(sdir / "derived" / "memory.json")["grounded_facts"]
                return "live" if counts[-1] > 0 and facts else None
            assert wait_until(seen_mid_run, "the mount shows the recorded events while record runs") == "live"
            assert memfs.is_live(store / "live-run")  # record holds the session for its run
            out, err = agent.communicate(timeout=60)
        finally:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
        assert agent.returncode == 0, err
        assert out == stream.read_bytes()  # passed through byte for byte
        assert counts == sorted(counts)
        # after it: the mount shows exactly what the store holds, the views included
        with memfs.open_session(store, "live-run", read_only=True) as h:
            final = h.manifest
            events = [orjson.loads(line)["event"] for _, line in h.iter_lines()]
            times = h.turn_times()
        mounted_manifest = wait_until(
            lambda: (lambda mf: mf if mf["event_count"] == final["event_count"] else None)(
                read_json(sdir / "manifest.json")), "the mount's manifest catches up")
        assert (mounted_manifest["turn_count"], mounted_manifest["in_turn"]) == (final["turn_count"], final["in_turn"])
        assert final["turn_count"] >= 1 and final["event_count"] == len(events) > 0
        assert (sdir / "events.jsonl").read_bytes().count(b"\n") == len(events)
        texts = [e["item"]["text"] for e in events
                 if e["type"] == "item.completed" and e["item"].get("type") == "agent_message"]
        facts = [f["fact"] for f in read_json(sdir / "derived" / "memory.json")["grounded_facts"]]
        assert texts and all(any(text[:40] in fact for fact in facts) for text in texts)
        # the recorder's arrival times reach the mount's trajectory (the stream has no clock)
        turns = wait_until(lambda: (lambda ts: ts if all(t["completed_at"] for t in ts) else None)(
            trajectory(sdir / "derived" / "trajectory.jsonl")), "the recorder's turn times in the mount")
        assert [t["turn"] for t in turns] == list(range(1, final["turn_count"] + 1))
        for t in turns:
            assert ordered(t["started_at"], t["completed_at"])
            assert (t["started_at"], t["completed_at"]) == times[t["turn"]]
        wait_until(lambda: not memfs.is_live(store / "live-run"), "record released the session")
        # and the mount can write the session now that record is done
        sh(f"printf '%s\\n' '{event('turn.started')}' >> {sdir / 'events.jsonl'}", tmp_path)
        assert read_json(sdir / "manifest.json")["in_turn"] is True
    assert m.proc.returncode == 0
