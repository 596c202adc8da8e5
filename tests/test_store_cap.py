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

from store_helpers import DONE, START, disk_index, env, join_all, log_lines, msg, open_s, run_python, state_of, turn

HELPERS = {"PYTHONPATH": os.path.dirname(__file__)}


@pytest.fixture(autouse=True, params=["in-order", "overlapped"])
def overlap(request, monkeypatch):
    """Every test runs both ways a rewrite does its disk steps (``memfs.store.evict._disk_steps``):
    in order on the rewriting thread (a small log, as all of these are) and overlapped on the
    store's worker threads (a log of a megabyte or more); crash scripts read the environment."""
    import memfs.store.evict as evict

    value = evict.OVERLAP_BYTES if request.param == "in-order" else 0
    monkeypatch.setattr(evict, "OVERLAP_BYTES", value)
    monkeypatch.setenv("MEMFS_TEST_OVERLAP_BYTES", str(value))


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

        join_all([threading.Thread(target=writer, args=(k,)) for k in range(3)],
                 "an fsync waiter hung across a cap rewrite", timeout=120)
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
    evict.OVERLAP_BYTES = int(os.environ["MEMFS_TEST_OVERLAP_BYTES"])  # (the fixture's way)
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


def test_a_failed_copy_of_the_remainder_stops_before_the_marker_and_leaves_no_temp(tmp_path, monkeypatch):
    """The remainder is copied into a temp file beside the recount and the hook: a copy that
    fails (a full disk) fails the cap before the marker, the log untouched and no temp file
    left; the next append's rewrite goes through. The rewrite is the call's last step, so
    every line of the call is committed and counted in ``accepted``."""
    import errno

    failing = [True]
    real = os.copy_file_range

    def copy_file_range(*args):
        if failing[0]:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args)

    monkeypatch.setattr(os, "copy_file_range", copy_file_range)
    lines = [*turn("t1"), *turn("t2"), START]
    sdir = tmp_path / "s"
    with open_s(tmp_path, max_events=5) as h:
        with pytest.raises(CapRewriteError) as err:
            h.append_many(lines)
        assert err.value.accepted == 9 and "No space left" in str(err.value)  # the 6th crossed the cap
        assert log_lines(sdir) == lines
        assert (h.manifest["event_count"], h.manifest["retained_turn_base"]) == (9, 1)  # as on disk
        assert not (sdir / "index" / "pending-cap-rewrite.json").exists()
        assert not [p for p in sdir.rglob("*") if p.name.endswith(".tmp")]
        failing[0] = False
        h.append(msg("t3 message 0"))  # the cap is tried again: turns 1 and 2 go
        assert h.manifest["retained_turn_base"] == 3 and h.stats()["rewrites"] == 1
        assert h.manifest["event_count"] == 2
    assert log_lines(sdir) == [START, msg("t3 message 0")]
    with open_s(tmp_path, max_events=5) as h:
        assert h.manifest["event_count"] == 2 and h.manifest["retained_turn_base"] == 3


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


# --- the amortized cap: down to evict_to × max_events (SPEC §3.7) -----------------------------


def workload(seed: int, n_turns: int) -> list[tuple[bytes, int | None]]:
    """Turns of 2 to 12 events, with now and then a record outside any turn between them;
    each line with its turn's ordinal (None outside turns)."""
    import random

    rng = random.Random(seed)
    out: list[tuple[bytes, int | None]] = []
    for t in range(1, n_turns + 1):
        if rng.random() < 0.2:
            out.append((msg(f"outside before t{t}"), None))
        size = rng.randint(2, 12)
        out += [(line, t) for line in turn(f"t{t}", size - 2)]
    return out


class CapModel:
    """The spec's eviction, stated directly: over ``max_events``, the fewest leading closed
    turns (with the records outside turns before them) whose removal leaves at most
    ``floor`` events; all closed turns when even that is not enough."""

    def __init__(self, max_events: int, floor: int):
        self.max_events, self.floor = max_events, floor
        self.log: list[tuple[bytes, int | None]] = []
        self.closed: set[int] = set()
        self.turn_count = 0
        self.evictions: list[int] = []  # events evicted by each rewrite, in order

    def append(self, line: bytes, t: int | None) -> None:
        self.log.append((line, t))
        if line == DONE:  # turn_count counts completed turns
            self.closed.add(t)
            self.turn_count += 1
        if len(self.log) <= self.max_events:
            return
        excess = len(self.log) - self.floor
        cut = None
        for i, (ln, tt) in enumerate(self.log):
            if ln == DONE and tt in self.closed:  # the end of a closed turn: a possible cut
                cut = i + 1
                if cut >= excess:
                    break
        if cut is not None:
            self.evictions.append(cut)
            del self.log[:cut]

    @property
    def base(self) -> int:
        ordinals = [t for _, t in self.log if t is not None]
        return ordinals[0] if ordinals else self.turn_count + 1


@pytest.mark.parametrize("evict_to", [0.9, 1.0, 0.55])
def test_amortized_cap_is_exact_about_counts_ordinals_and_summaries(tmp_path, evict_to):
    sdir = tmp_path / "s"
    max_events = 60
    floor = {0.9: 54, 1.0: 60, 0.55: 33}[evict_to]
    lines = workload(seed=14, n_turns=150)
    model = CapModel(max_events, floor)
    with open_s(tmp_path, max_events=max_events, evict_to=evict_to) as h:
        for line, t in lines:
            h.append(line)
            model.append(line, t)
            m = h.manifest
            assert (m["event_count"], m["turn_count"], m["retained_turn_base"]) == \
                (len(model.log), model.turn_count, model.base)
            assert h.stats()["rewrites"] == len(model.evictions)
            if model.evictions and len(model.log) > max_events:  # over only while nothing closed is left
                assert [e["outcome"] for e in h.turn_index] == ["open"]
        ordinals = [e["turn_number"] for e in h.turn_index]
        assert ordinals == sorted({t for _, t in model.log if t is not None})
        for n in ordinals[:3] + ordinals[-2:]:  # an ordinal still names its own turn
            assert {x.split(" ")[0] for x in texts(h.reconstruct_turn(n))} == {f"t{n}"}
        live = state_of(h)
    assert log_lines(sdir) == [line for line, _ in model.log]
    found = summaries(sdir)  # named by creation time: sorted is chronological
    assert [orjson.loads(p.read_bytes())["evicted_event_count"] for p in found] == model.evictions
    if evict_to < 1.0:  # each rewrite takes at least (1 - evict_to) × max_events events
        assert min(model.evictions) >= max_events - floor
    (sdir / "index" / "turns.json").unlink()
    with open_s(tmp_path, max_events=max_events, evict_to=evict_to) as h:  # a rescan agrees
        assert not h.open_report.fast_path and state_of(h) == live


def test_a_long_session_at_the_cap_leaves_tens_of_summaries_not_one_per_turn(tmp_path):
    """200 turns of 5 events at a cap of 100: at 0.9 a rewrite every 15 events (the 101st
    event is a turn's first; going down to 90 takes three turns), at 1.0 one at every turn."""
    counts = {}
    for evict_to in (0.9, 1.0):
        with open_s(tmp_path, f"s{evict_to}", max_events=100, evict_to=evict_to, durability="buffered",
                    metadata_interval=0.05) as h:
            for i in range(200):
                h.append_many(turn(f"t{i}", 3))
            m = h.manifest
            assert m["turn_count"] == 200 and m["event_count"] <= 100
            counts[evict_to] = h.stats()["rewrites"]
        assert len(summaries(tmp_path / f"s{evict_to}")) == counts[evict_to]
    evicted = 200 * 5 - 100
    assert counts[1.0] == 200 - 20  # one per turn once the cap is reached
    assert counts[0.9] <= evicted / (0.1 * 100) and counts[0.9] == pytest.approx(evicted / 15, abs=2)


def test_evict_to_out_of_range_is_refused(tmp_path):
    for bad in (0.49, 1.01, -1, "0.9", True):
        with pytest.raises(ValueError, match="evict_to must be a number from 0.5 to 1.0"):
            open_s(tmp_path, max_events=10, evict_to=bad)
    assert not (tmp_path / "s").exists()
    from memfs.store.config import SessionConfig

    assert SessionConfig(max_events=100, evict_to=0.57).evict_floor == 57  # the decimal, not 56.99…
    assert SessionConfig(max_events=10_000).evict_floor == 9_000
    assert SessionConfig(max_events=7, evict_to=0.7).evict_floor == 4


def test_records_outside_turns_make_fewer_turns_enough(tmp_path):
    """The plan counts turns only; the recount sees the records outside turns before the cut
    and takes no more turns than the low-water mark needs."""
    sdir = tmp_path / "s"
    lines = [msg("o1"), msg("o2"), msg("o3"), *turn("t1", 2), *turn("t2", 2), *turn("t3", 2), START, msg("t4")]
    # 3 + 12 + 2 = 17 events, cap 16, evict_to 0.625: down to 10, so 7 must go — "o1-o3" and
    # turn 1 are 7 (the turns' counts alone would have taken turn 2 as well)
    with open_s(tmp_path, max_events=16, evict_to=0.625) as h:
        h.append_many(lines)
        m = h.manifest
        assert (m["event_count"], m["retained_turn_base"]) == (10, 2)
    assert log_lines(sdir) == lines[7:]
    [path] = summaries(sdir)
    assert orjson.loads(path.read_bytes())["evicted_event_count"] == 7


# --- kill -9 at each step of an amortized eviction --------------------------------------------

AMORTIZED_CRASH = textwrap.dedent("""
    import os, signal, sys, memfs
    import memfs.store.evict as evict
    evict.OVERLAP_BYTES = int(os.environ["MEMFS_TEST_OVERLAP_BYTES"])  # (the fixture's way)
    from store_helpers import START, msg, turn
    root, step, interval = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    h = memfs.open_session(root, "s", max_events=20, evict_to=0.55, durability="write",
                           metadata_interval=interval)
    lines = [msg("outside"), *turn("t1"), msg("outside2"), *turn("t2"), *turn("t3"), *turn("t4"),
             START, msg("t5 message 0"), msg("t5 message 1")]
    for line in lines[:-1]:
        h.append(line)
        print("acknowledged", flush=True)

    def after_step(n):
        if n == step:
            os.kill(os.getpid(), signal.SIGKILL)

    evict._after_step = after_step
    h.append(lines[-1])  # 21 events, down to 11: "outside", turn 1, "outside2" and turn 2 go
    print("acknowledged", flush=True)
    os._exit(3)
""")

def killed_at(script: str, root, step: int, interval: float):
    """Run a crash script (it kills itself with SIGKILL after rewrite step ``step``)."""
    res = run_python(script, str(root), str(step), str(interval), env={**os.environ, **HELPERS})
    assert res.returncode == -9, res.stderr
    return res


AMORTIZED_ALL = [msg("outside"), *turn("t1"), msg("outside2"), *turn("t2"), *turn("t3"), *turn("t4"),
                 START, msg("t5 message 0"), msg("t5 message 1")]


@pytest.mark.parametrize("interval", [0, 3600], ids=["metadata-current", "metadata-stale"])
@pytest.mark.parametrize("step", [1, 2, 3, 4, 5, 6])
def test_kill_9_at_each_step_of_an_amortized_eviction_loses_no_acknowledged_line(tmp_path, step, interval):
    sdir = tmp_path / "s"
    res = killed_at(AMORTIZED_CRASH, tmp_path, step, interval)
    acknowledged = res.stdout.count("acknowledged")
    assert acknowledged == len(AMORTIZED_ALL) - 1  # the last append was cut short by the kill
    rewritten = step >= 5
    on_disk = log_lines(sdir)
    assert on_disk == (AMORTIZED_ALL[10:] if rewritten else AMORTIZED_ALL)  # nothing lost but the evicted
    found = summaries(sdir)
    assert len(found) == (1 if step >= 3 else 0)
    if found:  # what left the log is in the summary
        assert orjson.loads(found[0].read_bytes())["evicted_event_count"] == 10
    with open_s(tmp_path, max_events=0) as h:
        h.lock()  # the writer's open: it completes or drops the marker
        assert not (sdir / "index" / "pending-cap-rewrite.json").exists()
        # with a persister (interval > 0) step 6's persist runs there: a kill right after
        # the step may come before it lands, and the open recovers by the marker
        assert h.open_report.recovered_marker in ({True} if step == 5 else {True, False} if step == 6 and interval
                                                  else {False})
        assert h.open_report.stale_marker == (step == 4)
        m = h.manifest
        assert (m["event_count"], m["turn_count"], m["in_turn"]) == (11 if rewritten else 21, 4, True)
        assert m["retained_turn_base"] == (3 if rewritten else 1)
        ordinals = [e["turn_number"] for e in h.turn_index]
        assert ordinals == ([3, 4, 5] if rewritten else [1, 2, 3, 4, 5])
        for n in ordinals:
            assert {t.split(" ")[0] for t in texts(h.reconstruct_turn(n))} == {f"t{n}"}
        h.append(DONE)
        live = state_of(h)
    with open_s(tmp_path, max_events=20, evict_to=0.55) as h:
        assert h.open_report.fast_path and state_of(h) == live
        h.append_many([*turn("t6"), *turn("t7"), START])  # over the cap again: one rewrite
        m = h.manifest
        assert h.stats()["rewrites"] == 1 and m["event_count"] <= 20 and m["turn_count"] == 7
        assert h.turn_index[-1]["turn_number"] == 8 and m["retained_turn_base"] == (6 if rewritten else 4)
    assert len(summaries(sdir)) == len(found) + 1


# --- one rewrite for the evictions of one append call -----------------------------------------


@pytest.mark.parametrize("evict_to", [0.9, 1.0, 0.55])
def test_a_batch_over_the_cap_many_times_ends_as_line_by_line_appends_with_one_rewrite(tmp_path, evict_to):
    """``append_many`` of many lines crosses the cap several times: each eviction happens
    where the line-by-line appends would have made it (same cuts, same summaries, in order),
    and the log is rewritten once per call."""
    import random

    max_events, floor = 60, {0.9: 54, 1.0: 60, 0.55: 33}[evict_to]
    lines = workload(seed=15, n_turns=150)
    model = CapModel(max_events, floor)
    rng = random.Random(7)
    calls = 0
    with open_s(tmp_path, "batched", max_events=max_events, evict_to=evict_to) as h:
        i = 0
        while i < len(lines):
            size = rng.choice([1, 7, 40, 300]) if i else 500  # the first call alone crosses it many times
            batch = lines[i:i + size]
            before = len(model.evictions)
            h.append_many([line for line, _ in batch])
            for line, t in batch:
                model.append(line, t)
            calls += len(model.evictions) > before
            m = h.manifest
            assert (m["event_count"], m["turn_count"], m["retained_turn_base"]) == \
                (len(model.log), model.turn_count, model.base)
            assert h.stats()["rewrites"] == calls  # one rewrite per call that evicted
            i += size
        live = state_of(h)
    sdir = tmp_path / "batched"
    assert log_lines(sdir) == [line for line, _ in model.log]
    assert not (sdir / "index" / "pending-cap-rewrite.json").exists()
    found = [orjson.loads(p.read_bytes()) for p in summaries(sdir)]  # sorted by name: in eviction order
    assert [s["evicted_event_count"] for s in found] == model.evictions
    assert calls < len(model.evictions)
    with open_s(tmp_path, "single", max_events=max_events, evict_to=evict_to) as h:  # line by line
        for line, _ in lines:
            h.append(line)
        (manifest, index), (manifest2, index2) = state_of(h), live
        assert {**manifest, "session_id": "batched"} == manifest2 and index == index2
    single = [orjson.loads(p.read_bytes()) for p in summaries(tmp_path / "single")]
    strip = [{k: v for k, v in s.items() if k not in ("created_at", "session_id")} for s in single]
    assert [{k: v for k, v in s.items() if k not in ("created_at", "session_id")} for s in found] == strip
    assert log_lines(tmp_path / "single") == log_lines(sdir)
    (sdir / "index" / "turns.json").unlink()
    with open_s(tmp_path, "batched", max_events=max_events, evict_to=evict_to) as h:  # a rescan agrees
        assert not h.open_report.fast_path and state_of(h) == live


def test_a_custom_hook_sees_each_eviction_of_a_batch_in_order(tmp_path):
    seen = []

    def hook(session_dir, session_id, events):
        seen.append([e["item"]["text"].split(" ")[0] for e in events if e["type"] == "item.completed"])

    lines = [line for t in range(1, 9) for line in turn(f"t{t}", 2)]  # 8 turns of 4 events
    with open_s(tmp_path, max_events=10, evict_to=0.5, summary_hook=hook) as h:
        h.append_many(lines)  # over 10 at the 11th, 19th and 27th line: down to 5 each time
        assert h.stats()["rewrites"] == 1
        assert (h.manifest["event_count"], h.manifest["retained_turn_base"]) == (8, 7)
    assert seen == [["t1", "t1"] + ["t2", "t2"], ["t3", "t3", "t4", "t4"], ["t5", "t5", "t6", "t6"]]
    assert log_lines(tmp_path / "s") == lines[24:]
    assert summaries(tmp_path / "s") == []


def test_a_failing_hook_in_a_batch_keeps_the_evictions_before_it(tmp_path):
    """The second eviction's hook fails: the first eviction is applied, the batch stops after
    the line that crossed the cap (``accepted``), and the cap is tried again later."""
    calls = []

    def hook(session_dir, session_id, events):
        calls.append(len(events))
        if len(calls) == 2:
            raise RuntimeError("disk says no")

    lines = [line for t in range(1, 9) for line in turn(f"t{t}", 2)]
    sdir = tmp_path / "s"
    with open_s(tmp_path, max_events=10, evict_to=0.5, summary_hook=hook) as h:
        with pytest.raises(CapRewriteError, match="disk says no") as err:
            h.append_many(lines)
        assert err.value.accepted == 19
        assert (h.manifest["event_count"], h.manifest["retained_turn_base"]) == (11, 3)
        assert h.stats()["rewrites"] == 1 and log_lines(sdir) == lines[8:19]
        h.append_many(lines[19:])  # the cap is tried again
        assert (h.manifest["event_count"], h.manifest["retained_turn_base"]) == (8, 7)
    assert calls == [8, 8, 8, 8] and log_lines(sdir) == lines[24:]


BATCH_CRASH = textwrap.dedent("""
    import os, signal, sys, memfs
    import memfs.store.evict as evict
    evict.OVERLAP_BYTES = int(os.environ["MEMFS_TEST_OVERLAP_BYTES"])  # (the fixture's way)
    from store_helpers import START, msg, turn
    root, step, interval = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    h = memfs.open_session(root, "s", max_events=10, evict_to=0.5, durability="write", metadata_interval=interval)
    lines = [line for t in range(1, 9) for line in turn(f"t{t}", 2)]
    h.append_many(lines[:6])
    print("acknowledged", flush=True)

    def after_step(n):
        if n == step:
            os.kill(os.getpid(), signal.SIGKILL)

    evict._after_step = after_step
    h.append_many(lines[6:])  # 3 evictions (turns 1-2, 3-4, 5-6), one rewrite
    print("acknowledged", flush=True)
    os._exit(3)
""")


@pytest.mark.parametrize("interval", [0, 3600], ids=["metadata-current", "metadata-stale"])
@pytest.mark.parametrize("step", [1, 2, 3, 4, 5, 6])
def test_kill_9_at_each_step_of_a_batched_rewrite_recovers(tmp_path, step, interval):
    sdir = tmp_path / "s"
    res = killed_at(BATCH_CRASH, tmp_path, step, interval)
    assert res.stdout.count("acknowledged") == 1
    lines = [line for t in range(1, 9) for line in turn(f"t{t}", 2)]
    rewritten = step >= 5
    assert log_lines(sdir) == (lines[24:] if rewritten else lines)  # the batch's lines were all written
    found = summaries(sdir)
    assert [orjson.loads(p.read_bytes())["evicted_event_count"] for p in found] == ([8, 8, 8] if step >= 3 else [])
    with open_s(tmp_path, max_events=0) as h:
        h.lock()  # the writer's open: it completes or drops the marker
        assert not (sdir / "index" / "pending-cap-rewrite.json").exists()
        assert h.open_report.stale_marker == (step == 4)
        m = h.manifest
        assert (m["event_count"], m["turn_count"], m["in_turn"]) == (8 if rewritten else 32, 8, False)
        assert m["retained_turn_base"] == (7 if rewritten else 1)
        for n in [e["turn_number"] for e in h.turn_index]:
            assert {t.split(" ")[0] for t in texts(h.reconstruct_turn(n))} == {f"t{n}"}
