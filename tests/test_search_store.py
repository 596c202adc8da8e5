"""Search over real session stores: memory views → index → results (SPEC §5), through
``search_store`` (what ``memfs search`` calls) and ``store_searcher`` (what the mount calls)."""

from __future__ import annotations

import json
import shutil
import time

import orjson
import pytest
from memfs import open_session
from memfs.errors import NotFound
from memfs.search import created_at_of, recency_factor, search_store, store_searcher
from memfs.store.meta import parse_rfc3339
from memfs.store.root import Store
from memfs.views import memory_view


def ev(etype: str, **fields) -> str:
    return json.dumps({"schema_version": "0.18.0", "event": {"type": etype, **fields}}, separators=(",", ":"))


def message(i: int, text: str) -> str:
    return ev("item.completed", item={"id": f"m{i}", "type": "agent_message", "text": text})


def turn(handle, *texts: str, base: int = 0) -> None:
    handle.append(ev("turn.started"))
    for i, text in enumerate(texts):
        handle.append(message(base + i, text))
    handle.append(ev("turn.completed", usage={"input_tokens": 1}))


@pytest.fixture
def root(tmp_path):
    root = tmp_path / "sessions"
    with open_session(root, "alpha") as h:
        h.append(ev("thread.started", thread_id="t1"))
        turn(h, "Added the retry loop to the client.", "Wrote tests for the retry loop.")
        turn(h, "Fixed a flaky network test.", base=2)
    with open_session(root, "beta/2") as h:  # directory name beta_2
        turn(h, "Parsed the config file.", "The retry budget is three attempts.")
    return root


def test_search_store_root_and_per_session(root):
    results = search_store(root, "retry loop")
    assert [r["chunk_id"] for r in results] == ["alpha:1", "alpha:0", "beta_2:1"]  # shorter fact first
    assert {r["session_id"] for r in results} == {"alpha", "beta/2"}
    per = search_store(root, "retry loop", session="beta_2")
    assert [r["chunk_id"] for r in per] == ["beta_2:1"]
    assert per[0]["score"] != results[2]["score"]  # its own corpus statistics
    assert [r["chunk_id"] for r in search_store(root, "retry loop", k=1)] == ["alpha:1"]
    assert search_store(root, "retry", min_score=1e9) == []


def test_results_lead_back_to_the_event(root):
    (r,) = search_store(root, "flaky")
    assert r["path"] == "sessions/alpha/derived/memory.json"
    assert r["turn"] == 2 and r["snippet"] == "Fixed a flaky network test."
    with open_session(root, "alpha", read_only=True) as h:
        line = next(line for offset, line in h.iter_lines(r["offset"]))
        assert orjson.loads(line)["event"]["item"]["text"] == r["snippet"]
        created = parse_rfc3339(h.manifest["created_at"])
        assert created_at_of(h) == created
        facts = memory_view(h)["grounded_facts"]
    assert r["created_at"] == created
    index = int(r["chunk_id"].split(":")[1])  # chunk id = position in memory.json's grounded_facts
    assert facts[index] == {"fact": r["snippet"], "turn": r["turn"], "offset": r["offset"], "type": "agent_message"}


def test_score_carries_the_recency_factor(root):
    now = time.time()
    with open_session(root, "alpha", read_only=True) as h:
        created = created_at_of(h)
    (r,) = search_store(root, "flaky")
    # the same fact alone in a session without a manifest has factor 1.0
    (root / "alpha" / "manifest.json").unlink()
    # (the index memfs search saved in the store is keyed on the logs, which did not change)
    shutil.rmtree(root / ".search-index")
    (bare,) = search_store(root, "flaky")
    assert bare["created_at"] is None
    expected = bare["score"] * recency_factor(created, now)
    assert r["score"] == pytest.approx(expected, rel=1e-6)  # `now` differs by the test's runtime


def test_queries_without_tokens_and_unknown_sessions(root):
    for query in ("", "   ", "?!—"):
        with pytest.raises(NotFound):
            search_store(root, query)
    with pytest.raises(NotFound):
        search_store(root, "retry", session="nope")
    assert search_store(root, "zebra") == []
    assert search_store(root.parent / "empty-root", "retry") == []


def test_evicted_turn_facts_are_still_found(tmp_path):
    root = tmp_path / "sessions"
    with open_session(root, "capped", max_events=6) as h:
        turn(h, "Investigated the zeppelin outage.")
        for i in range(4):
            turn(h, f"Routine step {i}.", base=10 + i)
        assert h.rewrites >= 1 and h.turn_index[0]["turn_number"] > 1  # turn 1 is gone
    (r,) = search_store(root, "zeppelin outage")
    assert r["snippet"] == "Investigated the zeppelin outage."
    assert r["chunk_id"] == "capped:0" and r["turn"] is None and r["offset"] is None


def test_store_searcher_sees_an_appended_fact_at_once(tmp_path):
    store = Store(tmp_path / "sessions")
    try:
        h = store.create("live")
        turn(h, "Started the migration.")
        search = store_searcher(store, max_results=3)
        assert [r["chunk_id"] for r in search("migration", None, None, None)] == ["live:0"]
        assert search("kraken", "live", None, None) == []
        h.append(ev("turn.started"))
        h.append(message(9, "Released the kraken."))  # mid-turn: the fact exists already
        (r,) = search("kraken", "live", None, None)
        assert r["chunk_id"] == "live:1" and r["turn"] == 2
        assert [x["chunk_id"] for x in search("kraken", None, None, None)] == ["live:1"]
        assert search.index.session_fact_count("live") == 2
        # an unchanged log is not re-read; a new session is picked up by the root search
        other = store.create("other")
        turn(other, "The kraken sleeps.")
        assert {x["chunk_id"] for x in search("kraken", None, 5, 0.0)} == {"live:1", "other:0"}
        with pytest.raises(NotFound):
            search("!!!", None, None, None)
    finally:
        store.close()


def test_a_repeated_query_on_an_unchanged_store_is_scored_once(tmp_path, monkeypatch):
    """A ``cat`` of a search file asks three times (lookup, fstat, open): one scoring."""
    store = Store(tmp_path / "sessions")
    try:
        h = store.create("live")
        turn(h, "Started the migration.")
        search = store_searcher(store, max_results=3)
        scored = []
        real = search.index.search
        monkeypatch.setattr(search.index, "search", lambda *a, **kw: scored.append(a) or real(*a, **kw))
        first = search("migration", None, None, None)
        first[0]["snippet"] = "changed by the caller"  # each caller gets its own copy
        again = [search("migration", None, None, None) for _ in range(2)]
        assert len(scored) == 1 and again[0] == again[1] and again[0][0]["snippet"] == "Started the migration."
        search("migration", "live", None, None)  # another scope is another query
        assert len(scored) == 2
        turn(h, "Finished the migration.", base=5)  # a change: scored again, and seen
        assert len(search("migration", None, None, None)) == 2 and len(scored) == 3
        monkeypatch.setattr("memfs.search.searcher.MEMO_SECONDS", 0.0)  # and only for a moment
        search("migration", None, None, None)
        assert len(scored) == 4
    finally:
        store.close()


def test_a_root_query_reopens_only_sessions_whose_log_changed(tmp_path):
    """With more sessions than the store keeps open, a second root query reopens nothing (the
    held handles are the same objects), and an append by another process to a session the
    LRU closed is found by a query soon after (SPEC §3.5, §14, issues 13 and 54)."""
    from memfs.store.root import StoreSettings

    root = tmp_path / "sessions"
    names = [f"s{i:02d}" for i in range(20)]
    for i, name in enumerate(names):
        with open_session(root, name) as h:
            turn(h, f"Fixed the retry loop in module m{i}.")
    store = Store(root, StoreSettings(max_open_sessions=4))
    try:
        search = store_searcher(store, max_results=100)
        assert len(search("retry")) == 20
        held = {n: store.held(n) for n in names}
        assert sum(h is not None for h in held.values()) == 4
        assert len(search("loop")) == 20
        assert {n: store.held(n) for n in names} == held  # nothing was reopened
        assert all(store.held(n) is held[n] for n in names if held[n] is not None)
        closed = next(n for n in names if held[n] is None)
        assert search.counters()["checked_last"] == 0  # the second root query checked no session
        with open_session(root, closed) as other:  # another process's append, in effect
            turn(other, "Replaced the socket pool.", base=5)
        # found by the background sweep that the queries start (memfs.search.changes)
        deadline = time.monotonic() + 10
        while not (found := search("socket")):
            assert time.monotonic() < deadline, "another process's append was never found"
            time.sleep(0.01)
        assert [r["chunk_id"].split(":")[0] for r in found] == [closed]
        assert search.counters()["checked_last"] == 1
    finally:
        store.close()
