"""Arrival times of turns (issue 15 item 4): ``index/turn-times.jsonl``, recorded by the writer
at the turn boundaries, persisted with the metadata, read back after a reopen and by another
process, never invented by a rescan, kept across cap rewrites (memfs.store.turntimes)."""

from __future__ import annotations

import os
import textwrap

import orjson
from memfs.store.meta import parse_rfc3339
from memfs.views import trajectory

from store_helpers import DONE, FAILED, START, env, forget_metadata, msg, open_s, run_python, turn

SIDECAR = ("index", "turn-times.jsonl")


def sidecar(sdir) -> list[dict]:
    path = sdir.joinpath(*SIDECAR)
    return [orjson.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


def ordered(start: str | None, end: str | None) -> bool:
    return start is not None and end is not None and parse_rfc3339(start) <= parse_rfc3339(end)


def test_times_recorded_for_each_close_and_the_open_turn(tmp_path):
    with open_s(tmp_path) as h:
        h.append_many(turn("a"))  # 1 completed
        h.append(START)  # 2, abandoned by the next turn.started
        h.append_many([START, msg("x"), FAILED])  # 3 failed
        h.append(START)  # 4 open
        times = h.turn_times()
        assert sorted(times) == [1, 2, 3, 4]
        for n in (1, 2, 3):
            assert ordered(*times[n]), times[n]
        assert times[2][1] == times[3][0]  # abandoned when the next turn.started arrived
        assert times[4][0] is not None and times[4][1] is None
        assert times[1][0] == h.turn_index[0]["ts"]  # the start is the commit's stamp


def test_times_are_written_with_the_metadata_persist_not_per_append(tmp_path):
    sdir = tmp_path / "s"
    with open_s(tmp_path, metadata_interval=3600) as h:  # the persister would wait an hour
        h.append_many(turn("a") + turn("b"))
        h.append(START)
        assert sidecar(sdir) == []  # noted in memory only
        assert sorted(h.turn_times()) == [1, 2, 3]
        h.flush()  # a persist writes them, the open turn's start included
        lines = sidecar(sdir)
        assert [line["turn"] for line in lines] == [1, 2, 3]
        assert lines[2]["completed_at"] is None
        expected = h.turn_times()
    assert {line["turn"]: (line["started_at"], line["completed_at"]) for line in lines} == expected


def test_times_survive_reopen_and_an_open_turn_closed_by_the_next_writer(tmp_path):
    with open_s(tmp_path) as h:
        h.append_many(turn("a"))
        h.append(START)  # open when this writer goes
        first = h.turn_times()
    with open_s(tmp_path, read_only=True) as h:
        assert h.turn_times() == first
    with open_s(tmp_path) as h:
        h.append_many([msg("late"), DONE])  # a new writer closes turn 2
        times = h.turn_times()
    assert times[1] == first[1]
    assert times[2][0] == first[2][0] and ordered(*times[2])
    with open_s(tmp_path, read_only=True) as h:
        assert h.turn_times() == times


def test_a_rescan_does_not_invent_times(tmp_path):
    sdir = tmp_path / "s"
    with open_s(tmp_path) as h:
        h.append_many(turn("a"))
        timed = h.turn_times()
    # another program appends turns 2 and 3 straight to the file, and the metadata goes too
    with open(sdir / "events.jsonl", "ab") as f:
        f.write(b"".join(line + b"\n" for line in turn("b") + [START]))
    forget_metadata(sdir)
    with open_s(tmp_path) as h:
        h.lock()  # the writer's open rescans
        assert not h.open_report.fast_path
        assert [e["turn_number"] for e in h.turn_index] == [1, 2, 3]
        assert h.turn_times() == timed  # turns 2 and 3: nobody saw them arrive
        h.append(DONE)  # closes turn 3: its end was seen, its start was not
        times = h.turn_times()
        assert times[3][0] is None and times[3][1] is not None
        h.append_many(turn("c"))  # turn 4 entirely seen
        assert ordered(*h.turn_times()[4])
    with open_s(tmp_path, read_only=True) as h:
        assert 2 not in h.turn_times()
        traj = {t["turn"]: t for t in trajectory(h)}
    assert traj[2]["started_at"] is None and traj[2]["completed_at"] is None
    assert traj[3]["started_at"] is None and traj[3]["completed_at"] == times[3][1]
    assert ordered(traj[4]["started_at"], traj[4]["completed_at"])


def test_cap_rewrite_keeps_ordinals_and_compacts_evicted_turns_times(tmp_path):
    """Evicted turns' lines leave the sidecar in amortized compactions: once as many turns
    were evicted as are retained (at least COMPACT_MIN), never more than that many linger."""
    from memfs.store.turntimes import COMPACT_MIN

    sdir = tmp_path / "s"
    n_turns = 2 * COMPACT_MIN + 20
    with open_s(tmp_path, max_events=8) as h:
        for i in range(n_turns):
            h.append_many(turn(f"t{i}"))  # 4 events a turn: at most two turns retained
        base = h.manifest["retained_turn_base"]
        times = h.turn_times()
        h.flush()  # (persists, compacting when due)
    retained = list(range(base, n_turns + 1))
    assert base > 2 * COMPACT_MIN and set(retained) <= set(times)
    assert all(ordered(*times[n]) for n in retained)
    on_disk = {line["turn"] for line in sidecar(sdir)}
    assert set(retained) <= on_disk and len(on_disk) < COMPACT_MIN + len(retained)
    with open_s(tmp_path, read_only=True) as h:
        assert {n: t for n, t in h.turn_times().items() if n >= base} == {n: times[n] for n in retained}
        assert [t["turn"] for t in trajectory(h)] == retained
        assert all(ordered(t["started_at"], t["completed_at"]) for t in trajectory(h))


def test_a_torn_sidecar_line_is_skipped_and_ended(tmp_path):
    sdir = tmp_path / "s"
    with open_s(tmp_path) as h:
        h.append_many(turn("a"))
    with open(sdir.joinpath(*SIDECAR), "ab") as f:
        f.write(b'{"turn":2,"started_')  # a crash mid-write
    with open_s(tmp_path) as h:
        assert sorted(h.turn_times()) == [1]
        h.append_many(turn("b"))
    with open_s(tmp_path, read_only=True) as h:
        times = h.turn_times()
    assert sorted(times) == [1, 2] and ordered(*times[2])


def test_the_agents_own_clock_wins_in_the_trajectory(tmp_path):
    with open_s(tmp_path) as h:
        h.append_many([env("turn.started", context={"timestamp": "2020-01-02T03:04:05Z"}), msg("m"),
                       env("turn.completed", completed_at="2020-01-02T03:05:00Z", usage={"input_tokens": 1})])
        h.append_many(turn("b"))
        recorded = h.turn_times()
        traj = trajectory(h)
    assert (traj[0]["started_at"], traj[0]["completed_at"]) == ("2020-01-02T03:04:05Z", "2020-01-02T03:05:00Z")
    assert (traj[1]["started_at"], traj[1]["completed_at"]) == recorded[2]


def test_a_follower_in_another_process_sees_the_writers_times(tmp_path):
    code = textwrap.dedent("""
        import sys, memfs
        from memfs.samples import turn, START
        with memfs.open_session(sys.argv[1], "s", max_events=0, metadata_interval=0) as h:
            h.append_many(turn(sys.argv[2]))
            h.append(START)
    """)
    with open_s(tmp_path) as h:  # creates the session, then only reads: a follower
        assert h.turn_times() == {}
        traj0 = trajectory(h)
        assert traj0 == []
        done = run_python(code, str(tmp_path), "a", env={**os.environ})
        assert done.returncode == 0, done.stderr
        times = h.turn_times()  # the follower re-reads the sidecar as it grows
        assert sorted(times) == [1, 2] and ordered(*times[1]) and times[2][1] is None
        traj = trajectory(h)
        assert (traj[0]["started_at"], traj[0]["completed_at"]) == times[1]
        assert traj[1]["started_at"] == times[2][0] and traj[1]["completed_at"] is None
