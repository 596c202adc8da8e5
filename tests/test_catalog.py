"""The store catalog (SPEC §14): one row per session, kept by every writer, checked against the
directory, rebuilt when it is gone or unreadable; the listing, the mount's ``sessions/`` and MCP
``list_sessions`` read it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import memfs
from memfs.store.catalog import catalog_of
from memfs.store.fork import fork_session
from memfs.store.retention import Policy, gc

from agent_helpers import MEMFS, cli
from mounting import event, mounted, needs_fuse
from store_helpers import wait_until

FIXTURES = Path(__file__).parent / "fixtures" / "agents"
TURN = ['{"type":"turn.started"}', '{"type":"turn.completed","usage":{"input_tokens":5,"output_tokens":2}}']
DONE = '{"type":"thread.completed","thread_id":"t","session_id":"s","subtype":"success","outcome_code":"completed",' \
       '"usage":{},"num_turns":1}'
CATALOG = Path(".memfs") / "catalog.sqlite"


def write(root: Path, name: str, lines=TURN) -> None:
    with memfs.open_session(root, name, durability="write", metadata_interval=0) as h:
        h.append_many(lines)


def answers(root: Path) -> list[tuple]:
    """What the catalog says of every session (all but the change feed's numbering)."""
    rows = catalog_of(root).current(verify=False).rows()
    return [(r.name, r.session_id, r.agent, r.project, r.title, r.status, r.turns, r.events, r.first_ts, r.last_ts,
             r.log_size, r.log_mtime_ns, r.log_ino) for r in rows]


def memfs_json(*argv) -> list[dict]:
    done = cli(*map(str, argv))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_each_writer_keeps_its_row_current_and_the_feed_says_what_changed(tmp_path):
    root = tmp_path / "store"
    write(root, "a")
    catalog = catalog_of(root)
    cursor, changed, removed = catalog.changes_since(0)
    assert [r.name for r in changed] == ["a"] and removed is None  # a first call: every row
    a = catalog.row("a")
    assert (a.turns, a.events, a.status, a.log_size) == (1, 2, "completed", os.lstat(root / "a/events.jsonl").st_size)

    write(root, "a", [*TURN, DONE])  # an append: through the commit's metadata persist
    cursor, changed, removed = catalog.changes_since(cursor)
    assert [r.name for r in changed] == ["a"] and removed == []
    assert (catalog.row("a").turns, catalog.row("a").manifest_status) == (2, "completed")

    fork_session(root, "a", "b", at_turn=1)  # a fork writes a new session
    cursor, changed, removed = catalog.changes_since(cursor)
    assert "b" in {r.name for r in changed} and catalog.row("b").turns == 1

    done = cli("import", "--store", str(root), str(FIXTURES / "codex" / "ok_failing_command" / "stream.jsonl"))
    assert done.returncode == 0, done.stderr  # another process's import: its persists write the same catalog
    cursor, changed, removed = catalog.changes_since(cursor)
    (imported,) = [r for r in changed if r.name not in ("a", "b")]
    assert imported.agent == "codex" and imported.turns >= 1 and imported.thread_id

    report = gc(root, Policy(max_sessions=1, max_age_days=0))  # removes all but the most recent
    gone = {r.name for r in report.removed}
    assert gone and not gone & set(catalog.names())
    cursor, changed, removed = catalog.changes_since(cursor)
    assert set(removed or []) == gone
    assert catalog.changes_since(cursor)[1:] == ([], [])  # nothing since


def test_deleted_or_corrupt_catalog_is_rebuilt_with_the_same_answers(tmp_path):
    root = tmp_path / "store"
    for name in ("a", "b", "c"):
        write(root, name)
    done = cli("import", "--store", str(root), str(FIXTURES / "claude" / "ok_failing_command" / "stream.jsonl"))
    assert done.returncode == 0, done.stderr
    before = memfs_json("sessions", "--json", "--store", root)
    assert len(before) == 4
    shutil.rmtree(root / ".memfs")  # a cache: nothing is lost
    assert memfs_json("sessions", "--json", "--store", root) == before
    assert (root / CATALOG).is_file()
    for suffix in ("-wal", "-shm"):
        (root / f"{CATALOG}{suffix}").unlink(missing_ok=True)
    (root / CATALOG).write_bytes(b"not a database" * 100)  # corrupt: deleted and made again
    assert memfs_json("sessions", "--json", "--store", root) == before
    assert (root / CATALOG).read_bytes().startswith(b"SQLite format 3")


def test_a_catalog_spoiled_past_its_first_page_is_rebuilt_when_a_read_meets_it(tmp_path):
    """The full check runs once per boot: a file spoiled later (garbage over its last pages) is
    found when a read meets a bad page, deleted and rebuilt, and answers the same (usage too:
    a report that read part of its sums before the rebuild starts again)."""
    root = tmp_path / "store"
    for source in ("claude", "codex"):  # (other processes: none of this one's connections stays open)
        done = cli("import", "--store", str(root), str(FIXTURES / source / "ok_failing_command" / "stream.jsonl"))
        assert done.returncode == 0, done.stderr
    sessions, usage = memfs_json("sessions", "--json", "--store", root), memfs_json("usage", "--json", "--store", root)
    assert not (root / f"{CATALOG}-wal").exists()  # (the last connection's close checkpointed it)
    size = (root / CATALOG).stat().st_size
    half = size // 2 // 4096 * 4096
    assert half >= 4096
    with open(root / CATALOG, "r+b") as f:  # its last pages (the header, schema and meta pass the opening)
        f.seek(half)
        f.write(b"\xde\xad" * ((size - half) // 2))
    assert memfs_json("usage", "--json", "--store", root) == usage
    assert memfs_json("sessions", "--json", "--store", root) == sessions
    assert (root / CATALOG).read_bytes().startswith(b"SQLite format 3")


def test_changes_made_without_memfs_are_noticed(tmp_path):
    root = tmp_path / "store"
    write(root, "a")
    catalog = catalog_of(root).current()
    before = answers(root)
    # another process appends through memfs: its commit writes the catalog, at once
    done = subprocess.run([*MEMFS, "append", "--store", str(root), "a"], input="\n".join(TURN) + "\n",
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert catalog.row("a").turns == 2
    # sessions copied in (cp -a): the root's mtime moved, the next read lists the names again
    # (names before and after the known one, in code point order: "B" < "a" < "copy" < "Ärger")
    for copy in ("copy", "B", "Ärger"):
        subprocess.run(["cp", "-a", str(root / "a"), str(root / copy)], check=True)
    assert catalog.current(verify=False).names() == ["B", "a", "copy", "Ärger"]
    assert catalog.row("copy").turns == 2 and catalog.row("copy").log_size == catalog.row("a").log_size
    # lines appended by a tool that is not memfs: the check of each log's stat finds them
    with open(root / "copy" / "events.jsonl", "a") as f:  # (lines as memfs stores them)
        f.write(event("turn.started") + "\n" + event("turn.completed", usage={"input_tokens": 1}) + "\n")
    assert catalog.verify() >= 1
    assert catalog.row("copy").turns == 3
    # folders deleted by hand
    for copy in ("copy", "B", "Ärger"):
        shutil.rmtree(root / copy)
    assert catalog.current(verify=False).names() == ["a"]
    assert answers(root)[0][:6] == before[0][:6]


def test_several_processes_write_the_catalog_at_once(tmp_path):
    root = tmp_path / "store"
    write(root, "first")
    data = "\n".join(TURN * 3) + "\n"
    procs = [subprocess.Popen([*MEMFS, "append", "--store", str(root), f"p{i}"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(4)]
    try:
        outs = [p.communicate(data, timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(5)
    assert all(p.returncode == 0 for p in procs), outs
    rows = {r.name: r for r in catalog_of(root).rows()}  # (their rows came from their commits)
    assert sorted(rows) == ["first", "p0", "p1", "p2", "p3"]
    assert all(rows[f"p{i}"].turns == 3 and rows[f"p{i}"].events == 6 for i in range(4))


def test_sessions_since_uses_the_records_times_of_imported_sessions(tmp_path):
    root = tmp_path / "store"
    write(root, "native")
    stream = FIXTURES / "claude" / "ok_failing_command" / "stream.jsonl"
    done = cli("import", "--store", str(root), str(stream))
    assert done.returncode == 0, done.stderr
    every = {s["name"]: s for s in memfs_json("sessions", "--json", "--store", root)}
    (name,) = set(every) - {"native"}
    records = [json.loads(line) for line in stream.read_text().splitlines() if line.strip()]
    stamps = sorted(r["timestamp"] for r in records if isinstance(r.get("timestamp"), str))
    first = memfs.store.meta.parse_rfc3339(every[name]["first_record_at"])
    last = memfs.store.meta.parse_rfc3339(every[name]["last_record_at"])
    # the records' own times (captured long before this test ran), never the import's
    assert stamps and last < time.time() - 86400
    assert abs(last - memfs.store.meta.parse_rfc3339(stamps[-1])) < 1 and first <= last
    assert [s["name"] for s in memfs_json("sessions", "--json", "--store", root, "--since", "1d")] == ["native"]
    day = stamps[0][:10]
    assert {s["name"] for s in memfs_json("sessions", "--json", "--store", root, "--since", day)} == {"native", name}
    assert list(every) == ["native", name]  # most recent record first
    done = cli("show", "--json", "--store", str(root), name)  # its turns: the records' clock, not the import's
    assert done.returncode == 0, done.stderr
    (turn,) = json.loads(done.stdout)["turns"]
    assert first - 1 <= memfs.store.meta.parse_rfc3339(turn["started_at"]) <= last + 1


@needs_fuse
def test_ls_sessions_lists_from_the_catalog_and_sees_another_process_s_session(tmp_path):
    root = tmp_path / "store"
    write(root, "a")
    with mounted(root, tmp_path / "mnt") as m:
        sessions = m.mnt / "sessions"
        assert os.listdir(sessions) == ["a"]
        done = subprocess.run([*MEMFS, "append", "--store", str(root), "b"], input="\n".join(TURN) + "\n",
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        wait_until(lambda: sorted(os.listdir(sessions)) == ["a", "b"], "ls sessions/ shows b", timeout=1.0)
        # ls -l: each session's time is its row's, the session never opened for it
        stamp = os.stat(sessions / "b").st_mtime
        assert abs(stamp - catalog_of(root).current().row("b").updated_ts) < 0.002
        shutil.rmtree(root / "b")  # removed behind the mount's back
        wait_until(lambda: os.listdir(sessions) == ["a"], "ls sessions/ drops b", timeout=1.0)


@needs_fuse
def test_mcp_list_sessions_answers_the_same_over_a_store_and_a_mount(tmp_path):
    from test_mcp import ok, over_stdio

    root = tmp_path / "store"
    write(root, "native")
    done = cli("import", "--store", str(root), str(FIXTURES / "codex" / "ok_failing_command" / "stream.jsonl"),
               str(FIXTURES / "claude" / "ok_failing_command" / "stream.jsonl"))
    assert done.returncode == 0, done.stderr
    calls = [{}, {"project": "proj"}, {"agent": "claude"}, {"status": "completed", "since": "2000-01-01"}]

    async def every_call(client):
        return [ok(await client.call_tool("list_sessions", args))["sessions"] for args in calls]

    from_store = over_stdio(tmp_path, every_call, "--store", str(root))
    with mounted(root, tmp_path / "mnt") as m:
        from_mount = over_stdio(tmp_path, every_call, "--mount", str(m.mnt))
    assert from_mount == from_store
    every, project, claude, _ = from_store
    assert len(every) == 3 and [s["agent"] for s in project] == [s["agent"] for s in claude] == ["claude"]
    assert {"project", "model", "tokens", "cost_usd", "last_record_at"} <= set(claude[0])
    assert claude[0]["project"] and claude[0]["model"] and claude[0]["tokens"]
    assert every == memfs_json("sessions", "--json", "--store", root)  # the fields of memfs sessions --json


def test_a_change_in_the_same_tick_as_the_listing_is_not_missed(tmp_path):
    """The root's mtime is the catalog's cheap check; a change made after a listing but stamped
    with the same mtime (a coarse clock; a filesystem keeping whole seconds) must still be seen."""
    root = tmp_path / "store"
    write(root, "a")
    catalog = catalog_of(root)
    for stamp in (time.time_ns() // 10**9 * 10**9, time.time_ns()):  # whole seconds, then a fine stamp
        os.utime(root, ns=(stamp, stamp))
        names = catalog.current().names()
        new = f"n{len(names)}"
        (root / new).mkdir()  # a session copied in by hand, its folder's mtime forced back to the listed one
        shutil.copy(root / "a" / "events.jsonl", root / new / "events.jsonl")
        os.utime(root, ns=(stamp, stamp))
        wanted = sorted([*names, new])
        wait_until(lambda want=wanted: catalog.current().names() == want, f"{new} listed")  # (≤ RACY_RELIST)
