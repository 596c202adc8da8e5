"""The root search without listing the store (SPEC §14, issue 54): the index saved in the
store and loaded at the next start, kept up by change notices and a sweep for other processes'
changes; a root query checks only the sessions reported changed."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import orjson
import pytest
from memfs import open_session
from memfs.search import elsewhere, persist, store_searcher
from memfs.search.changes import CatalogChanges, log_key
from memfs.store.catalog import catalog_of
from memfs.store.root import Store, StoreSettings

from mounting import alive, children, event, is_mounted, mounted, needs_fuse

QUERIES = ("retry loop", "socket pool module", "zeppelin", "fixed the retry socket m3")
NOW = 1_900_000_000.0  # the recency factor's clock, fixed: scores compare exactly
WAIT = 20.0  # seconds a poll waits before the test fails


def turn_lines(*texts: str) -> str:
    lines = [event("turn.started")]
    lines += [event("item.completed", item={"id": f"m{i}", "type": "agent_message", "text": t})
              for i, t in enumerate(texts)]
    lines.append(event("turn.completed", usage={"input_tokens": 1}))
    return "".join(line + "\n" for line in lines)


def make_store(root, n: int = 12) -> list[str]:
    names = [f"s{i:02d}" for i in range(n)]
    for i, name in enumerate(names):
        with open_session(root, name) as h:
            for line in turn_lines(f"Fixed the retry loop in module m{i}.",
                                   f"Replaced the socket pool {i % 3} of module m{i}.").splitlines():
                h.append(line)
    return names


def memfs_append(root, session: str, data: str) -> None:
    """``memfs append``: another process's validated append (it creates a new session)."""
    subprocess.run([sys.executable, "-m", "memfs", "append", "--store", str(root), session],
                   input=data, text=True, check=True, capture_output=True, timeout=60)


def built(root, persist_mode: str):
    """A searcher over ``root`` after one root query, and its store (the caller closes both)."""
    store = Store(root)
    search = store_searcher(store, max_results=50, persist=persist_mode)
    search("retry")
    return store, search


def saved(root) -> list[str]:
    """A store of sessions (:func:`make_store`) whose index one searcher saved and closed: their
    names."""
    names = make_store(root)
    store, search = built(root, "save")
    search.close()
    store.close()
    return names


def ranked(search) -> list[list[dict]]:
    return [search.index.search(q, max_results=50, now=NOW) for q in QUERIES]


def test_a_saved_index_loads_with_the_scores_of_a_fresh_build(tmp_path):
    root = tmp_path / "sessions"
    names = saved(root)
    assert persist.index_path(root, "none-none-facts").is_file()
    store, loaded = built(root, "load")
    fresh_store, fresh = built(root, "none")
    try:
        assert loaded.counters()["loaded"] == len(names) and loaded.counters()["reindexed"] == 0
        assert ranked(loaded) == ranked(fresh)  # every field, every score exactly
        assert any(ranked(fresh))
        assert loaded.index.stats()["docs"] == fresh.index.stats()["docs"] == 2 * len(names)
    finally:
        store.close()
        fresh_store.close()


def test_a_store_changed_since_the_save_is_caught_up_session_by_session(tmp_path):
    root = tmp_path / "sessions"
    names = saved(root)
    memfs_append(root, names[3], turn_lines("The zeppelin landed in module m3."))
    memfs_append(root, "newcomer", turn_lines("A zeppelin in a new session."))
    (root / names[5] / "events.jsonl").unlink()  # a session gone: its directory no longer is one
    os.unlink(root / names[5] / "manifest.json")
    store, loaded = built(root, "save")
    fresh_store, fresh = built(root, "none")
    try:
        counts = loaded.counters()
        assert counts["loaded"] == len(names) and counts["reindexed"] == 2  # names[3] and the newcomer only
        assert ranked(loaded) == ranked(fresh)
        assert persist.load(root, "none-none-facts")[2] is not None  # (saved with the catalog's cursor)
        zeppelins = {r["chunk_id"].split(":")[0] for r in loaded("zeppelin")}
        assert zeppelins == {names[3], "newcomer"}
        assert not any(r["chunk_id"].startswith(names[5] + ":") for r in loaded("module"))
    finally:
        loaded.close()  # saves the caught-up index
        store.close()
        fresh_store.close()
    store, again = built(root, "load")
    try:
        assert again.counters()["loaded"] == len(names) and again.counters()["reindexed"] == 0
    finally:
        store.close()


@pytest.mark.parametrize("damage", ["garbage", "truncated", "flipped", "other format"])
def test_an_unusable_index_file_is_ignored_and_rebuilt(tmp_path, damage, monkeypatch):
    root = tmp_path / "sessions"
    names = saved(root)
    path = persist.index_path(root, "none-none-facts")
    data = bytearray(path.read_bytes())
    if damage == "garbage":
        data = bytearray(b"not an index at all")
    elif damage == "truncated":
        del data[len(data) // 2:]
    elif damage == "flipped":
        data[len(persist.MAGIC) + 8] ^= 0xFF  # (in the first array: the header is at the end)
    else:  # what a later memfs would write, read by this one
        size = int.from_bytes(data[-8:], "little")
        header = orjson.loads(data[-8 - size: -8])
        header["format"] = persist.FORMAT + 1
        new = orjson.dumps(header)
        data[-8 - size:] = new + len(new).to_bytes(8, "little")
    path.write_bytes(bytes(data))
    store, loaded = built(root, "save")
    fresh_store, fresh = built(root, "none")
    try:
        assert loaded.counters()["loaded"] == 0 and loaded.counters()["reindexed"] == len(names)
        assert ranked(loaded) == ranked(fresh)
    finally:
        loaded.close()  # the rebuilt index replaces the file
        store.close()
        fresh_store.close()
    store, again = built(root, "load")
    try:
        assert again.counters()["loaded"] == len(names)
    finally:
        store.close()


def test_the_catalog_answers_what_changed_since_a_cursor(tmp_path):
    """The change source's contract, answered by the store catalog's feed."""
    root = tmp_path / "sessions"
    names = make_store(root, 4)
    changes = CatalogChanges(root)
    cursor, every, removed = changes.changes_since(0)
    assert set(every) == set(names) and not removed and cursor > 0
    assert every[names[0]] == log_key(str(root), names[0])
    assert changes.changes_since(cursor) == (cursor, {}, set())  # nothing since
    with open_session(root, names[1]) as h:  # written here, noticed
        h.append(event("error", message="x"))
    changes.notice(names[1])
    cursor, changed, removed = changes.changes_since(cursor)
    assert changed == {names[1]: log_key(str(root), names[1])} and not removed
    memfs_append(root, names[2], turn_lines("Elsewhere."))  # another process: its commit writes the catalog
    memfs_append(root, "newcomer", turn_lines("New."))
    for file in ("events.jsonl", "manifest.json"):  # without memfs: found by the catalog's check
        os.unlink(root / names[3] / file)
    catalog_of(root).verify()
    cursor, changed, removed = changes.changes_since(cursor)
    assert set(changed) == {names[2], "newcomer"} and removed == {names[3]}
    assert changes.changes_since(cursor)[1:] == ({}, set())


def test_memfs_search_uses_and_saves_the_index(tmp_path):
    root = tmp_path / "sessions"
    make_store(root)

    def cli_search(query: str) -> list[dict]:
        done = subprocess.run([sys.executable, "-m", "memfs", "search", "--store", str(root), "--json", "-k", "50",
                               query], capture_output=True, text=True, check=True, timeout=60)
        return orjson.loads(done.stdout)

    first = cli_search("retry loop")
    path = persist.index_path(root, "none-none-facts")
    assert path.is_file() and len(first) == 12  # saved by the first memfs search
    written = path.stat().st_mtime_ns
    assert [r["chunk_id"] for r in cli_search("retry loop")] == [r["chunk_id"] for r in first]
    assert path.stat().st_mtime_ns == written  # nothing changed: not written again
    assert persist.load(root, "none-none-facts")[2] is not None  # the catalog's cursor its keys are current at
    # others change the store: the next search reads what changed since that cursor, and finds
    # what a search building the index from every log finds
    memfs_append(root, "s03", turn_lines("The zeppelin retry landed in module m3."))
    memfs_append(root, "newcomer", turn_lines("A zeppelin retry loop in a new session."))
    caught_up = [(r["chunk_id"], r["snippet"]) for r in cli_search("zeppelin retry loop")]
    assert {c.split(":")[0] for c, _ in caught_up} >= {"s03", "newcomer"}
    for part in path.parent.iterdir():
        part.unlink()
    assert [(r["chunk_id"], r["snippet"]) for r in cli_search("zeppelin retry loop")] == caught_up


# --- through a mount --------------------------------------------------------------------------------


def root_xattr(mnt, name: str) -> int:
    return int(os.getxattr(mnt, f"user.memfs.search_{name}"))


def root_search(mnt, query: str) -> list[dict]:
    return [orjson.loads(line) for line in (mnt / "search" / f"{query}?k=50").read_bytes().splitlines()]


def until(predicate, what: str):
    deadline = time.monotonic() + WAIT
    while not (got := predicate()):
        assert time.monotonic() < deadline, f"{what}: not within {WAIT} s"
        time.sleep(0.02)
    return got


@needs_fuse
def test_a_mount_keeps_up_without_listing_the_store(tmp_path):
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    names = make_store(store)
    with mounted(store, mnt) as m:
        assert len(root_search(m.mnt, "retry")) == len(names)
        checked = root_xattr(m.mnt, "checked")  # sessions checked by root queries so far
        root_search(m.mnt, "socket")
        assert root_xattr(m.mnt, "checked") == checked  # another root query checks no session
        # written through the mount: the next root query checks that session alone
        with open(m.mnt / "sessions" / names[0] / "events.jsonl", "a") as f:
            f.write(turn_lines("Tuned the kraken in module m0."))
        assert [r["chunk_id"] for r in root_search(m.mnt, "kraken")] == [f"{names[0]}:2"]
        assert root_xattr(m.mnt, "checked") == checked + 1
        # another process: an append, a new session; both found by a root search soon after
        memfs_append(store, names[1], turn_lines("The zeppelin landed in module m1."))
        memfs_append(store, "newcomer", turn_lines("A zeppelin in a new session."))
        found = until(lambda: {r["chunk_id"].split(":")[0] for r in root_search(m.mnt, "zeppelin")} ==
                      {names[1], "newcomer"}, "another process's changes found")
        assert found
        # those two sessions (each maybe once per step of its writer's commit), never the whole store
        assert root_xattr(m.mnt, "checked") - checked <= 6 < len(names)
        # a session removed by another process disappears from the results
        for file in ("events.jsonl", "manifest.json"):
            os.unlink(store / names[1] / file)
        until(lambda: [r["chunk_id"] for r in root_search(m.mnt, "zeppelin")] == ["newcomer:0"],
              "a removed session dropped")
        assert root_xattr(m.mnt, "root_queries") >= 5


@needs_fuse
def test_a_restarted_mount_loads_the_index_and_catches_up(tmp_path):
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    names = make_store(store)
    with mounted(store, mnt) as m:
        before = root_search(m.mnt, "retry socket")
        assert root_xattr(m.mnt, "loaded") == 0
    assert persist.index_path(store, "none-none-facts").is_file()  # saved at unmount
    memfs_append(store, names[4], turn_lines("The zeppelin landed in module m4."))  # while unmounted
    with mounted(store, mnt) as m:
        (hit,) = root_search(m.mnt, "zeppelin")
        assert hit["chunk_id"] == f"{names[4]}:2"
        assert root_xattr(m.mnt, "loaded") == len(names)
        assert root_xattr(m.mnt, "reindexed") == 1  # only the session appended to was read again
        after = root_search(m.mnt, "retry socket")
    assert len(before) == len(after) == 2 * len(names)
    fresh_store = Store(store, StoreSettings(read_only=True))  # a build from the logs alone
    try:
        fresh = store_searcher(fresh_store, max_results=50)("retry socket")
    finally:
        fresh_store.close()
    assert [r["chunk_id"] for r in after] == [r["chunk_id"] for r in fresh]
    for a, b in zip(after, fresh):
        assert a["score"] == pytest.approx(b["score"], rel=1e-6)  # (the recency factor's clock moved)


def large_store(store) -> int:
    """A store of :data:`memfs.search.elsewhere.ELSEWHERE_MIN` + 2 sessions (copies of two:
    the least that reaches the size); how many."""
    names = make_store(store, 2)
    for i in range(elsewhere.ELSEWHERE_MIN):
        shutil.copytree(store / names[i % 2], store / f"c{i:04d}")
    return elsewhere.ELSEWHERE_MIN + len(names)


@needs_fuse
def test_a_large_store_without_a_saved_index_has_it_built_by_a_process_of_its_own(tmp_path):
    """The mount neither indexes a large store in its own interpreter nor holds its live index:
    a helper builds and saves it; the mount loads that file, reads no session, and answers as
    an index built from the logs does."""
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    sessions = large_store(store)
    with mounted(store, mnt) as m:
        until(lambda: root_xattr(m.mnt, "loaded") == sessions, "the helper's index loaded")
        assert root_xattr(m.mnt, "reindexed") == 0
        got = root_search(m.mnt, "socket pool 1")
    assert persist.current(store, "none-none-facts")
    fresh_store = Store(store, StoreSettings(read_only=True))
    try:
        fresh = store_searcher(fresh_store, max_results=50)("socket pool 1")
    finally:
        fresh_store.close()
    assert len(got) == 50 and [r["chunk_id"] for r in got] == [r["chunk_id"] for r in fresh]


@needs_fuse
def test_unmounting_during_that_build_ends_the_helper_process(tmp_path):
    """A daemon's server exits without running atexit handlers: it must end the build itself."""
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    large_store(store)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path / "run"), "XDG_STATE_HOME": str(tmp_path / "state")}
    (tmp_path / "run").mkdir(mode=0o700)
    started = subprocess.run([sys.executable, "-m", "memfs", "mount", str(store), str(mnt), "--daemon"],
                             capture_output=True, text=True, env=env, timeout=60)
    assert started.returncode == 0, started.stderr
    pid = int(started.stdout)
    helpers: set[int] = set()
    try:  # (the warm-up asks for the build a second after mounting)
        until(lambda: any(opened(p, store) for p in children(pid)), "the build under way (the store open in its process)")
        helpers = children(pid)  # (the build's, and multiprocessing's resource tracker)
        subprocess.run(["fusermount3", "-u", str(mnt)], check=True, timeout=30)
        until(lambda: not alive(pid), "the server gone")
        until(lambda: not any(alive(p) for p in helpers), "the helper processes ended with the server")
        assert not persist.current(store, "none-none-facts")  # ended, not finished: nothing saved
    finally:
        if is_mounted(mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], check=False)
        for p in {pid, *helpers}:
            if alive(p):
                os.kill(p, signal.SIGKILL)


def opened(pid: int, path) -> bool:
    """Whether process ``pid`` has a file under ``path`` open."""
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}").startswith(str(path)) for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False



def test_log_keys_round_trip_through_the_file_whatever_their_size(tmp_path):
    """An inode number may pass 2**63 (and an mtime be before 1970): a key is saved and loaded as it was."""
    from memfs.search import SearchIndex
    from memfs.store.catalog import pack_key

    index = SearchIndex()
    index.set_session("a", "a", 1.7e9, [{"fact": "the retry loop", "turn": 1, "offset": 0}])
    keys = {"a": pack_key(2**64 - 5, 123, -5), "b": pack_key(7, 0, 1_700_000_000_123_456_789), "c": None}
    persist.save(tmp_path, "none-none-facts", index.snapshot(), keys, 42)
    loaded, got, cursor = persist.load(tmp_path, "none-none-facts")
    assert got == keys and cursor == 42
    assert loaded.search("retry", now=NOW) == index.search("retry", now=NOW)


def test_an_index_loaded_changed_and_saved_again_is_the_index_made_in_memory(tmp_path):
    """A save writes loaded sessions from the arrays they were read from and changed ones from
    their facts, across many thousand facts, whatever the mix; the file loads as the index the
    same updates made in memory."""
    from memfs.search import SearchIndex

    def facts(tag: str, n: int) -> list[dict]:
        return [{"fact": f"{tag} fact {i} é 検索 🔁 w{i % 97}", "turn": None if i % 5 == 0 else i // 3,
                 "offset": None if i % 7 == 0 else 40 * i} for i in range(n)]

    def first(index) -> None:
        for i, n in enumerate((3, 17_000, 0, 5, 2, 9)):
            index.set_session(f"s{i}", f"id-{i}", 1.7e9 + i if i != 3 else None, facts(f"s{i}", n))
        index.set_session("s1", "id-1", 1.7e9, facts("s1-out", 4), source="output")

    def then(index) -> None:
        index.extend_session("s4", facts("s4-more", 3))
        index.set_session("s5", "id-5", 1.8e9, facts("s5-new", 6))
        index.remove_session("s2")
        index.sync_session("s0", "id-0", 1.7e9, facts("s0", 4))
        index.set_session("s6", "id-6", 1.7e9 + 0.5, facts("s6", 17_000))

    made, loaded = SearchIndex(), SearchIndex()
    first(made)
    first(loaded)
    persist.save(tmp_path, "none-none-facts", loaded.snapshot(), {}, None)
    loaded = persist.load(tmp_path, "none-none-facts")[0]
    then(made)
    then(loaded)
    persist.save(tmp_path, "none-none-facts", loaded.snapshot(), {"s0": None}, None)
    again, keys, _ = persist.load(tmp_path, "none-none-facts")
    assert keys == {"s0": None} and sorted(again.sessions()) == sorted(made.sessions())
    for query in ("fact", "s1 w3", "s4 more", "s5 new 検索", "s6 fact 16999", "s0 é"):
        assert again.search(query, max_results=1000, now=NOW) == made.search(query, max_results=1000, now=NOW)
    for name in made.sessions():
        assert (again.search("fact w5", sessions=[name], max_results=1000, now=NOW)
                == made.search("fact w5", sessions=[name], max_results=1000, now=NOW))
