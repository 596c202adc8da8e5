"""Laziness, incrementality and the backing-store copies of the derived views (SPEC §4)."""

from __future__ import annotations

import os
import random
import shutil
import threading

import memfs
import orjson
import pytest
from memfs import views
from memfs.views import cache, persist

from store_helpers import join_all

ENV = b'{"schema_version":"0.18.0","event":'


def line(event: dict) -> bytes:
    return ENV + orjson.dumps(event) + b"}"


def item(kind: str, **fields) -> dict:
    return {"type": "item.completed", "item": {"id": "i", "type": kind, **fields}}


STARTED = {"type": "turn.started"}
COMPLETED = {"type": "turn.completed", "usage": {"input_tokens": 3, "output_tokens": 2}}


def without_generated_at(name: str, data: bytes):
    if name == "memory.json":
        doc = orjson.loads(data)
        del doc["generated_at"]
        return doc
    return data


def fresh_render(handle) -> dict:
    """Every view rendered from a cold state (the reference for the incremental ones)."""
    views.forget(handle.path)
    return {name: without_generated_at(name, views.render_view(handle, name)) for name in views.VIEW_NAMES}


def current_render(handle) -> dict:
    return {name: without_generated_at(name, views.render_view(handle, name)) for name in views.VIEW_NAMES}


def test_reading_twice_without_new_events_does_no_work(session):
    session.append_many([STARTED, item("agent_message", text="hi"), COMPLETED])
    first = {name: views.render_view(session, name) for name in views.VIEW_NAMES}
    st = cache.state_for(session)
    folded, rebuilds, renders, refreshes = st.folded_bytes, st.rebuilds, cache.stats.renders, cache.stats.refreshes
    assert folded == session.file_len
    for _ in range(3):
        for name in views.VIEW_NAMES:
            assert views.render_view(session, name) is first[name]  # the very same cached bytes
    views.memory_facts(session)
    assert (st.folded_bytes, st.rebuilds, cache.stats.renders, cache.stats.refreshes) == (
        folded, rebuilds, renders, refreshes)


def test_only_the_view_read_is_rendered(session):
    session.append_many([STARTED, item("agent_message", text="hi")])
    views.render_view(session, "memory.json")
    renders = cache.stats.renders
    session.append(COMPLETED)
    views.render_view(session, "memory.json")
    assert cache.stats.renders == renders + 1


def test_refresh_after_one_append_to_a_100k_event_session_folds_only_the_new_bytes(tmp_path):
    lines = [line({"type": "thread.started", "thread_id": "t"})]
    t = 0
    while len(lines) < 100_000:
        lines += [line(STARTED), line(item("agent_message", text=f"message {t}")),
                  line(item("command_execution", command=f"make {t % 10}", status="completed", exit_code=0)),
                  line(COMPLETED)]
        t += 1
    session_dir = tmp_path / "big"
    session_dir.mkdir(mode=0o700)
    (session_dir / "events.jsonl").write_bytes(b"\n".join(lines[:100_000]) + b"\n")
    with memfs.open_session(tmp_path, "big", max_events=0) as h:
        assert h.manifest["event_count"] == 100_000
        views.render_view(h, "memory.json")
        st = cache.state_for(h)
        assert st.folded_bytes == h.file_len and st.rebuilds == 1
        before_bytes, before_lines = st.folded_bytes, cache.stats.folded_lines
        new = line(item("agent_message", text="the one new event"))
        h.append(new)
        mem = views.memory_view(h)
        assert st.folded_bytes - before_bytes == len(new) + 1  # exactly the appended line
        assert cache.stats.folded_lines - before_lines == 1
        assert st.rebuilds == 1
        assert mem["grounded_facts"][-1]["fact"] == "the one new event"
        assert mem["source"] == {"events_len": h.file_len, "event_count": 100_001}


def random_events(rng: random.Random, n: int) -> list[dict]:
    out = []
    for i in range(n):
        r = rng.random()
        if r < 0.15:
            out.append(STARTED)
        elif r < 0.25:
            out.append(COMPLETED)
        elif r < 0.3:
            out.append({"type": "turn.failed", "message": f"failed {i % 5}"})
        elif r < 0.35:
            out.append({"type": "turn.blocked", "message": "blocked", "usage": {"output_tokens": i}})
        elif r < 0.5:
            out.append(item("agent_message", text=f"msg {i % 17}"))
        elif r < 0.6:
            out.append(item("file_change", changes=[{"path": f"f{i % 9}", "kind": "update"}], status="completed"))
        elif r < 0.7:
            out.append(item("command_execution", command=f"cmd {i % 7}", status="completed", exit_code=i % 2))
        elif r < 0.75:
            boxes = "\n".join(f"- [{rng.choice('x ~!')}] step {k}" for k in range(4))
            out.append(item("plan", text=boxes))
        elif r < 0.85:
            out.append(rng.choice([
                {"type": "goal.created", "goal_id": f"g{i}", "objective": "o", "token_budget": 50},
                {"type": "goal.paused", "reason": rng.choice(["user", "infra", "verification", "x"])},
                {"type": "goal.resumed"}, {"type": "goal.completed"}, {"type": "goal.budget_exceeded"},
                {"type": "goal.cleared"}]))
        elif r < 0.9:
            out.append({"type": "error", "message": f"err {i % 3}"})
        else:
            out.append(item("reasoning", text="hmm"))
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_incremental_views_equal_a_full_rebuild(tmp_path, seed):
    rng = random.Random(seed)
    with memfs.open_session(tmp_path, f"rand-{seed}", max_events=0) as h:
        events = random_events(rng, 300)
        pos = 0
        while pos < len(events):
            step = rng.randint(1, 25)
            h.append_many(events[pos:pos + step])
            pos += step
            incremental = current_render(h)
            assert cache.state_for(h).rebuilds == 1  # folded incrementally, never rebuilt
            assert incremental == fresh_render(h)


def test_cap_rewrite_rebuilds_and_stays_correct(tmp_path):
    rng = random.Random(7)
    with memfs.open_session(tmp_path, "capped", max_events=40) as h:
        events = random_events(rng, 400)
        rebuilds_seen = set()
        generations = []
        for pos in range(0, len(events), 10):
            h.append_many(events[pos:pos + 10])
            incremental = current_render(h)
            st = cache.state_for(h)
            rebuilds_seen.add(st.rebuilds)
            generations.append(views.memory_facts(h)[1][0])
            assert incremental == fresh_render(h)
        assert h.rewrites > 0 and len(rebuilds_seen) > 1
        assert len(set(generations)) > 1
        traj = views.trajectory(h)
        assert [t["turn"] for t in traj] == views.list_turns(h)


def test_memory_facts_version_key(tmp_path):
    with memfs.open_session(tmp_path, "facts", max_events=6) as h:
        h.append_many([STARTED, item("agent_message", text="a"), COMPLETED])
        facts, (gen, count) = views.memory_facts(h)
        assert [f["fact"] for f in facts] == ["a"] and count == 1
        h.append_many([STARTED, item("agent_message", text="b")])
        facts2, (gen2, count2) = views.memory_facts(h)
        assert gen2 == gen and count2 == 2 and facts2[:count] == facts  # same generation only grows
        h.append_many([COMPLETED, STARTED])  # 7 > 6: turn 1 is evicted
        facts3, (gen3, count3) = views.memory_facts(h)
        assert gen3 != gen and [f["fact"] for f in facts3] == ["a", "b"] and facts3[0]["turn"] is None


def test_reopening_rebuilds_the_same_views(tmp_path):
    with memfs.open_session(tmp_path, "re") as h:
        h.append_many([STARTED, item("agent_message", text="x"), COMPLETED, STARTED])
        before = current_render(h)
        st = cache.state_for(h)
        rebuilds = st.rebuilds
    with memfs.open_session(tmp_path, "re") as h:
        assert current_render(h) == before
        assert cache.state_for(h).rebuilds == rebuilds + 1


def test_views_reach_the_backing_store(session):
    session.append_many([STARTED, item("agent_message", text="hi"), COMPLETED])
    rendered = {name: views.render_view(session, name) for name in views.VIEW_NAMES}
    rendered["turns/1.jsonl"] = views.render_view(session, "turns/1.jsonl")
    assert persist.flush(10)
    derived = session.path / "derived"
    for name, data in rendered.items():
        path = derived / name
        assert path.read_bytes() == data, name
        assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert oct(derived.stat().st_mode & 0o777) == "0o700"
    assert not [n for n in os.listdir(derived) if n.startswith(".")]  # no temp files left
    # a new epoch whose bytes did not change is not written again
    writes = persist.writes()
    session.append(item("reasoning", text="no goal change"))
    views.render_view(session, "goal.json")
    assert persist.flush(10) and persist.writes() == writes
    views.render_view(session, "memory.json")
    assert persist.flush(10) and persist.writes() == writes + 1


def test_read_only_handles_never_write(tmp_path):
    with memfs.open_session(tmp_path, "ro") as h:
        h.append_many([STARTED, COMPLETED])
    with memfs.open_session(tmp_path, "ro", read_only=True) as ro:
        for name in views.VIEW_NAMES:
            views.render_view(ro, name)
        views.render_view(ro, "turns/1.jsonl")
        assert persist.flush(10)
        assert not (ro.path / "derived").exists()


def test_a_removed_session_is_not_recreated_by_a_late_write(session, monkeypatch):
    monkeypatch.setattr(persist, "WRITE_BEHIND", True)
    gate = threading.Event()
    real_apply = persist._writer._apply

    def slow_apply(*args):
        gate.wait(10)
        real_apply(*args)

    monkeypatch.setattr(persist._writer, "_apply", slow_apply)
    session.append(STARTED)
    views.render_view(session, "summary.md")
    shutil.rmtree(session.path)
    gate.set()
    assert persist.flush(10)
    assert not session.path.exists()


def test_evicted_turn_copies_are_pruned(tmp_path):
    with memfs.open_session(tmp_path, "prune", max_events=4) as h:
        h.append_many([STARTED, COMPLETED, STARTED, COMPLETED])
        views.render_view(h, "turns/1.jsonl")
        views.render_view(h, "turns/2.jsonl")
        assert persist.flush(10)
        assert sorted(os.listdir(h.path / "derived" / "turns")) == ["1.jsonl", "2.jsonl"]
        h.append(STARTED)  # 5 > 4: turn 1 is evicted
        views.render_view(h, "memory.json")
        assert persist.flush(10)
        assert sorted(os.listdir(h.path / "derived" / "turns")) == ["2.jsonl"]


def test_concurrent_readers_and_a_writer(session):
    errors = []
    stop = threading.Event()

    def reader():
        try:
            while not stop.is_set():
                for name in views.VIEW_NAMES:
                    views.render_view(session, name)
                views.memory_facts(session)
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        events = random_events(random.Random(11), 600)
        for i in range(0, len(events), 5):
            session.append_many(events[i:i + 5])
    finally:
        stop.set()
        join_all(threads, "a reader still rendering after the appends stopped")
    assert not errors
    assert current_render(session) == fresh_render(session)


def test_store_copies_are_coalesced_and_written_by_flush(session, monkeypatch):
    monkeypatch.setattr(persist, "DELAY", 3600.0)  # nothing becomes due by itself during the test
    assert persist.flush(10)
    writes = persist.writes()
    for i in range(5):
        session.append(item("agent_message", text=f"note {i}"))
        latest = views.render_view(session, "memory.json")
    assert persist.writes() == writes and not (session.path / "derived" / "memory.json").exists()
    assert persist.flush(10)
    assert persist.writes() == writes + 1  # five refreshes, one copy: the newest
    assert (session.path / "derived" / "memory.json").read_bytes() == latest


def test_a_symlinked_derived_dir_is_never_followed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "eviction-summary-0000000000000000aaaaaaaaaaaaaaaa.json").write_text(
        '{"grounded_facts":["planted fact"]}')
    with memfs.open_session(tmp_path / "root", "sym") as h:
        (h.path / "derived").symlink_to(elsewhere)
        h.append(item("agent_message", text="real fact"))
        assert views.list_names(h) == list(views.VIEW_NAMES)
        assert [f["fact"] for f in views.memory_view(h)["grounded_facts"]] == ["real fact"]
        with pytest.raises(memfs.SymlinkRefused):
            views.render_view(h, "eviction-summary-0000000000000000aaaaaaaaaaaaaaaa.json")
        assert persist.flush(10)
        assert sorted(os.listdir(elsewhere)) == ["eviction-summary-0000000000000000aaaaaaaaaaaaaaaa.json"]


def test_view_states_are_bounded_and_a_dropped_one_is_rebuilt(tmp_path, monkeypatch):
    """At most MAX_STATES sessions keep a view state; reading a dropped one again rebuilds it
    from the log, with the same bytes."""
    monkeypatch.setattr(cache, "MAX_STATES", 2)
    handles = []
    for i in range(3):
        h = memfs.open_session(tmp_path, f"s{i}")
        h.append(line(STARTED))
        h.append(line(item("agent_message", text=f"note {i}")))
        h.append(line(COMPLETED))
        handles.append(h)
    try:
        def memory(h) -> dict:  # but the time it was generated
            view = orjson.loads(views.render_view(h, "memory.json"))
            view.pop("generated_at", None)
            return view

        first = memory(handles[0])
        old = cache.state_for(handles[0])
        for h in handles[1:]:
            views.render_view(h, "memory.json")
        new = cache.state_for(handles[0])
        assert new is not old and new.rebuilds == 0  # dropped: a fresh state
        assert memory(handles[0]) == first
        assert new.rebuilds == 1
    finally:
        for h in handles:
            h.close()
