"""The event cap and eviction (SPEC §3.7): whole completed turns leave from the front, the
summary hook sees them first, a failing hook changes nothing, and a crash after any step of
the rewrite protocol recovers with stable turn ordinals."""

from __future__ import annotations

import os
import re
import stat
import textwrap
import threading

import orjson
import pytest

from memfs.errors import CapRewriteError, TurnNotFound
from store_helpers import DONE, START, disk_index, env, log_lines, msg, open_s, run_python, state_of, turn

HELPERS = {"PYTHONPATH": os.path.dirname(__file__)}


def summaries(sdir):
    derived = sdir / "derived"
    return sorted(derived.glob("eviction-summary-*.json")) if derived.exists() else []


def texts(events):
    return [e["item"]["text"] for e in events if e["type"] == "item.completed"]


def test_eviction_keeps_the_open_turn_and_takes_records_outside_turns_with_it(tmp_path):
    sdir = tmp_path / "s"
    lines = [msg("before t1"), *turn("t1"), msg("between"), *turn("t2"), START, msg("t3 message 0")]
    with open_s(tmp_path, "s", max_events=11) as h:
        h.append_many(lines)  # 12 events: one over the cap
        m = h.manifest
        assert (m["event_count"], m["turn_count"], m["retained_turn_base"]) == (7, 2, 2)
        assert [e["turn_number"] for e in h.turn_index] == [2, 3]
        with pytest.raises(TurnNotFound):
            h.reconstruct_turn(1)
        assert texts(h.reconstruct_turn(2)) == ["t2 message 0", "t2 message 1"]
        assert texts(h.reconstruct_turn(3)) == ["t3 message 0"]
        assert h.turn_index[0]["start_offset"] == len(msg("between")) + 1
        assert h.rewrites == 1
        live = state_of(h)
    assert log_lines(sdir) == lines[5:]
    assert not (sdir / "index" / "pending-cap-rewrite.json").exists()
    [path] = summaries(sdir)
    summary = orjson.loads(path.read_bytes())
    assert summary["evicted_event_count"] == 5
    assert summary["event_types"] == {"item.completed": 3, "turn.started": 1, "turn.completed": 1}
    assert summary["grounded_facts"] == ["before t1", "t1 message 0", "t1 message 1"]
    assert summary["session_id"] == "s" and summary["created_at"].endswith("+00:00")
    with open_s(tmp_path, "s", max_events=11) as h:
        assert h.open_report.fast_path
        assert state_of(h) == live
        h.append_many([msg("t3 message 1"), DONE, *turn("t4")])  # appendable: evicts again
        assert h.manifest["retained_turn_base"] == 3 and h.manifest["turn_count"] == 4
        live = state_of(h)
    (sdir / "index" / "turns.json").unlink()  # a rescan keeps the ordinals
    with open_s(tmp_path, "s", max_events=11) as h:
        assert not h.open_report.fast_path
        assert state_of(h) == live


def test_the_open_turn_is_never_evicted(tmp_path):
    sdir = tmp_path / "s"
    with open_s(tmp_path, max_events=5) as h:
        h.append_many([START, *(msg(f"m{i}") for i in range(10))])
        assert h.manifest["event_count"] == 11
        assert h.manifest["retained_turn_base"] == 1
        h.append(DONE)  # now it is a completed turn, over the cap: it goes
        assert h.manifest["event_count"] == 0
        assert (h.manifest["turn_count"], h.manifest["retained_turn_base"]) == (1, 2)
    assert log_lines(sdir) == []
    assert len(summaries(sdir)) == 1


def test_summary_facts_are_bounded(tmp_path):
    sdir = tmp_path / "s"
    long_texts = [f"fact {i} " + "é" * 400 for i in range(40)]
    with open_s(tmp_path, max_events=3) as h:
        h.append_many([START, *(msg(t) for t in long_texts), msg(long_texts[0]), DONE])
        h.append_many(turn("next", 0))
    [path] = summaries(sdir)
    assert re.fullmatch(r"eviction-summary-[0-9a-f]{32}\.json", path.name)
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.lstat(sdir / "derived").st_mode) == 0o700
    summary = orjson.loads(path.read_bytes())
    facts = summary["grounded_facts"]
    assert len(facts) == 32
    assert all(len(f.encode()) <= 512 for f in facts)
    assert [f.split(" ")[1] for f in facts] == [str(i) for i in range(32)]
    assert facts[0].endswith("…")
    assert summary["evicted_event_count"] == 43


def test_a_failing_hook_leaves_every_line_and_the_append_reports_it(tmp_path):
    sdir = tmp_path / "s"
    calls = []

    def hook(session_dir, session_id, events):
        calls.append([e["type"] for e in events])
        if len(calls) == 1:
            raise RuntimeError("disk says no")

    lines = [*turn("t1"), *turn("t2")]
    with open_s(tmp_path, max_events=7, summary_hook=hook, durability="buffered") as h:
        h.append_many(lines[:-1])
        with pytest.raises(CapRewriteError, match="summary hook failed: disk says no"):
            h.append(lines[-1])
        assert h.manifest["event_count"] == 8 and h.manifest["retained_turn_base"] == 1
        assert log_lines(sdir) == lines  # the event itself is durable, nothing was cut
        assert not (sdir / "index" / "pending-cap-rewrite.json").exists()
        assert h.rewrites == 0
        h.append(START)  # the cap is tried again after the next append
        assert calls == [["turn.started", "item.completed", "item.completed", "turn.completed"]] * 2
        assert h.manifest["event_count"] == 5 and h.manifest["retained_turn_base"] == 2
    assert log_lines(sdir) == [*lines[4:], START]
    assert summaries(sdir) == []  # a custom hook replaces the default summary


def test_an_emptied_log_continues_at_turn_count_plus_one(tmp_path):
    sdir = tmp_path / "s"
    with open_s(tmp_path, max_events=1) as h:
        h.append_many(turn("t1", 0))
        assert (h.manifest["event_count"], h.manifest["turn_count"], h.manifest["retained_turn_base"]) == (0, 1, 2)
        assert h.turn_index == []
    assert log_lines(sdir) == [] and disk_index(sdir) == []
    with open_s(tmp_path, max_events=1) as h:
        assert h.open_report.fast_path
        h.append(START)
        assert h.turn_index[0]["turn_number"] == 2
    (sdir / "index" / "turns.json").unlink()  # rescan from the manifest alone
    with open_s(tmp_path, max_events=1) as h:
        assert not h.open_report.fast_path
        assert h.turn_index[0]["turn_number"] == 2
        h.append(DONE)
        assert (h.manifest["turn_count"], h.manifest["retained_turn_base"], h.manifest["event_count"]) == (2, 3, 0)
        h.append(START)
        assert h.turn_index[0]["turn_number"] == 3


def test_no_cap_when_max_events_is_zero(tmp_path):
    with open_s(tmp_path, max_events=0) as h:
        for i in range(30):
            h.append_many(turn(f"t{i}", 0))
        assert h.manifest["event_count"] == 60 and h.manifest["retained_turn_base"] == 1


def test_group_commit_waiters_survive_cap_rewrites(tmp_path):
    with open_s(tmp_path, max_events=20, durability="fsync") as h:
        errors = []

        def writer(k):
            try:
                for i in range(15):
                    h.append_many(turn(f"w{k}-{i}", 1))
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads), "an fsync waiter hung across a cap rewrite"
        assert errors == []
        assert h.manifest["turn_count"] == 45
        assert h.manifest["event_count"] <= 20
        live = state_of(h)
    with open_s(tmp_path, max_events=20) as h:
        assert h.open_report.fast_path and state_of(h) == live
        assert h.manifest["event_count"] == len(log_lines(tmp_path / "s"))


# --- a crash after each step of the rewrite protocol ------------------------------------------

CRASH = textwrap.dedent("""
    import os, sys, memfs
    import memfs.store.evict as evict
    from store_helpers import START, msg, turn
    root, step, interval = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    h = memfs.open_session(root, "s", max_events=10, durability="write", metadata_interval=interval)
    for line in [msg("outside"), *turn("t1"), *turn("t2"), START]:
        h.append(line)

    def after_step(n):
        if n == step:
            os._exit(0)

    evict._after_step = after_step
    h.append(msg("t3 message 0"))  # 11 events: evicts "outside" and turn 1
    os._exit(3)
""")

ALL = [msg("outside"), *turn("t1"), *turn("t2"), START, msg("t3 message 0")]


@pytest.mark.parametrize("interval", [0, 3600], ids=["metadata-current", "metadata-stale"])
@pytest.mark.parametrize("step", [1, 2, 3, 4, 5, 6])
def test_crash_after_each_step_recovers_with_stable_ordinals(tmp_path, step, interval):
    sdir = tmp_path / "s"
    res = run_python(CRASH, str(tmp_path), str(step), str(interval), env={**os.environ, **HELPERS})
    assert res.returncode == 0, res.stderr
    rewritten = step >= 5
    assert log_lines(sdir) == (ALL[5:] if rewritten else ALL)
    assert len(summaries(sdir)) == (1 if step >= 3 else 0)
    with open_s(tmp_path, max_events=0) as h:
        h.lock()  # the writer's open: it completes or drops the marker
        report = h.open_report
        assert not (sdir / "index" / "pending-cap-rewrite.json").exists()
        if step == 5:
            assert report.recovered_marker
        if step == 4:
            assert report.stale_marker
        m = h.manifest
        expected_events = 6 if rewritten else 11
        assert (m["event_count"], m["turn_count"], m["in_turn"]) == (expected_events, 2, True)
        assert m["retained_turn_base"] == (2 if rewritten else 1)
        ordinals = [e["turn_number"] for e in h.turn_index]
        assert ordinals == ([2, 3] if rewritten else [1, 2, 3])
        for n in ordinals:  # every ordinal still names the same turn
            tags = {t.split(" ")[0] for t in texts(h.reconstruct_turn(n))}
            assert tags == {f"t{n}"}
        h.append(DONE)
        assert h.manifest["turn_count"] == 3
        live = state_of(h)
    with open_s(tmp_path, max_events=10) as h:
        assert h.open_report.fast_path and state_of(h) == live
        h.append(START)  # the cap applies again and the ordinals go on
        assert h.manifest["retained_turn_base"] >= 2
        assert h.turn_index[-1]["turn_number"] == 4


def test_eviction_copies_without_copy_file_range(tmp_path, monkeypatch):
    import errno

    def unsupported(*args):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "copy_file_range", unsupported)
    lines = [*turn("t1"), *turn("t2"), START]
    with open_s(tmp_path, max_events=5) as h:
        h.append_many(lines)
        assert h.manifest["retained_turn_base"] == 2
    assert log_lines(tmp_path / "s") == lines[4:]


def test_status_set_by_an_evicted_event_survives_a_rescan(tmp_path):
    sdir = tmp_path / "s"
    with open_s(tmp_path, max_events=1) as h:
        h.append_many([START, env("thread.completed", thread_id="t", session_id="s", subtype="success",
                                  outcome_code="completed", usage={}, num_turns=1), DONE])
        assert (h.manifest["status"], h.manifest["event_count"]) == ("completed", 0)
    (sdir / "index" / "turns.json").unlink()
    with open_s(tmp_path, max_events=1) as h:
        assert not h.open_report.fast_path
        assert h.manifest["status"] == "completed"
        h.append(START)  # an event that sets the status still wins
        assert h.manifest["status"] == "active"
