"""``memfs import --follow`` of OpenCode's database (SPEC §10, the fourth agent): a follow started
on a copy of a captured store (``tests/fixtures/agents/opencode``), then rows added to it as
OpenCode 1.18.33 adds them — by a SQLite connection in WAL mode that writes the captured rows
one upsert at a time, each first as OpenCode writes it while it is still going, and, when node
and the CLIs are installed, by the real ``opencode run`` against the scripted model server. The
followed session shows each new turn within a deadline, a running turn stays open, and a follow,
a plain import and a follow again store each thing once."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import orjson

from agent_helpers import events_of, import_, items, listing, of_type, started, turns
from store_helpers import wait_until as wait_for

OPENCODE = Path(__file__).parent / "fixtures" / "agents" / "opencode"


def capture(scenario: str) -> dict:
    return json.loads((OPENCODE / scenario / "capture.json").read_text())


def quoted(prompt: str) -> str:
    return f'"{prompt}"' if " " in prompt else prompt


def data_dir(where: Path, scenario: str) -> Path:
    shutil.copytree(OPENCODE / scenario / "home", where)
    return where / ".local" / "share" / "opencode"


def now_ms() -> int:
    return int(time.time() * 1000)


def safe_events(store: Path, sid: str) -> list[dict]:
    """The session's events, or none while it does not exist yet."""
    try:
        return events_of(store, sid)
    except (FileNotFoundError, OSError, ValueError):
        return []


def stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(20)


def output_until(proc: subprocess.Popen, needle: bytes, timeout: float = 20.0) -> bytes:
    """What the follow printed, read until it holds ``needle`` (the test fails at ``timeout``)."""
    deadline, out = time.monotonic() + timeout, b""
    while needle not in out:
        left = deadline - time.monotonic()
        assert left > 0 and proc.poll() is None, f"gave up waiting for {needle!r}; printed: {out!r}"
        if select.select([proc.stdout], [], [], left)[0]:
            out += os.read(proc.stdout.fileno(), 1 << 16)
    return out


def rows_of(db: Path) -> dict[str, list[dict]]:
    """A captured store's session, message and part rows (all columns), by creation time."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        return {t: [dict(r) for r in conn.execute(f"SELECT * FROM {t} ORDER BY time_created, id")]
                for t in ("session", "message", "part")}
    finally:
        conn.close()


class Writer:
    """A connection writing rows as OpenCode 1.18 does: the database in WAL mode, held open and
    never checkpointed (the rows stay in ``opencode.db-wal``), each write an upsert of the whole
    row with ``time_updated`` the time of the write, committed at once."""

    def __init__(self, db: Path):
        self.conn = sqlite3.connect(db, isolation_level=None)
        assert self.conn.execute("PRAGMA journal_mode = WAL").fetchone() == ("wal",)
        self.conn.execute("PRAGMA wal_autocheckpoint = 0")

    def close(self) -> None:
        self.conn.close()

    def write(self, *writes: tuple[str, dict]) -> None:
        """Upsert each ``(table, row)``, in one commit."""
        self.conn.execute("BEGIN IMMEDIATE")
        for table, row in writes:
            row = {**row, "time_updated": now_ms()}
            sets = ", ".join(f"{c} = excluded.{c}" for c in row if c != "id")
            self.conn.execute(f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join('?' * len(row))}) "
                              f"ON CONFLICT(id) DO UPDATE SET {sets}", list(row.values()))
        self.conn.execute("COMMIT")


def going(row: dict, **changes) -> dict:
    """``row`` as OpenCode writes it before it is final: ``changes`` made to its ``data`` (a
    key given None is left out)."""
    data = orjson.loads(row["data"])
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return {**row, "data": orjson.dumps(data).decode()}


SCENARIO = "resume_two_turns"  # one turn (a command, then the answer); then run --session, a second
FULL = OPENCODE / SCENARIO / "home" / ".local" / "share" / "opencode" / "opencode.db"


class SecondTurn:
    """The second run of ``resume_two_turns``, row by row as OpenCode writes it, and a copy of
    the data directory as it was before that run (``data``)."""

    def __init__(self, where: Path):
        rows = rows_of(FULL)
        self.user = [m for m in rows["message"] if orjson.loads(m["data"])["role"] == "user"][1]
        cut = self.user["time_created"] - 1
        self.data = data_dir(where, SCENARIO)
        conn = sqlite3.connect(self.data / "opencode.db")
        try:
            conn.execute("DELETE FROM part WHERE time_created > ?", (cut,))
            conn.execute("DELETE FROM message WHERE time_created > ?", (cut,))
            conn.commit()
        finally:
            conn.close()
        (self.answer,) = [m for m in rows["message"] if m["time_created"] > cut and m is not self.user]
        (self.prompt,) = [p for p in rows["part"] if p["message_id"] == self.user["id"]]
        self.step_start, self.text, self.step_finish = [p for p in rows["part"] if p["message_id"] == self.answer["id"]]
        (self.session,) = rows["session"]
        self.final_text = orjson.loads(self.text["data"])["text"]

    def opened(self) -> tuple:
        """The prompt's part, the answer begun: its first step, a text still streaming."""
        created = orjson.loads(self.answer["data"])["time"]["created"]
        partial = self.final_text[:7]
        return (("part", self.prompt),
                ("message", going(self.answer, time={"created": created}, finish=None, cost=0,
                                  tokens={"input": 0, "output": 0, "reasoning": 0, "cache": {"read": 0, "write": 0}})),
                ("part", self.step_start),
                ("part", going(self.text, text=partial, time={"start": orjson.loads(self.text["data"])["time"]["start"]})))


def whole_import(tmp_path: Path) -> Path:
    """A plain import of the complete store, into a store of its own."""
    whole = tmp_path / "whole"
    import_(whole, data_dir(tmp_path / "whole-home", SCENARIO))
    return whole


def about(store: Path, sid: str) -> dict:
    s = listing(store)[sid]
    return {k: s.get(k) for k in ("agent", "conversation_id", "status", "model", "title", "first_prompt", "cwd")}


# --- rows added as OpenCode writes them (no node needed) -----------------------------------------


def test_a_followed_session_gets_the_new_turn_as_opencode_writes_it_each_thing_once(tmp_path, follower):
    """A follow, then (the turn still running) a plain import, then a follow again: the new turn
    opens with its prompt while its answer streams (the text not yet final is not taken, the turn
    not closed), closes once OpenCode completes it, and the session is what a plain import of
    the finished store gives."""
    doc = capture(SCENARIO)
    sid = doc["session_id"]
    turn = SecondTurn(tmp_path / "home")
    store = tmp_path / "store"
    writer = Writer(turn.data / "opencode.db")
    try:
        proc = follower(store, turn.data)
        wait_for(lambda: turns(safe_events(store, sid)) == ["turn.completed"], what="the first turn, at the start")
        writer.write(("message", turn.user))  # OpenCode writes the message, then its parts
        writer.write(*turn.opened())
        wait_for(lambda: len(started(safe_events(store, sid))) == 2, what="the new turn")
        assert stop(proc) == 0
        ev = events_of(store, sid)  # (as the follow left it: all of its pass, not a part read while it wrote)
        assert started(ev)[1]["prompt"] == quoted(doc["runs"][1]["prompt"])
        assert turns(ev) == ["turn.completed"]  # still running: open
        assert [i["text"] for i in of_type(ev, "agent_message")] == ["The project has one file: README.md."]
        assert listing(store)[sid]["status"] == "running"

        (report,) = import_(store, turn.data)  # a plain import while the turn runs
        assert (report["session"], report["status"], report["appended"]) == (sid, "up-to-date", 0)
        assert events_of(store, sid) == ev

        proc = follower(store, turn.data)
        writer.write(("part", turn.text))  # the text ends
        writer.write(("part", turn.step_finish))
        writer.write(("message", turn.answer), ("session", turn.session))  # the answer completes
        wait_for(lambda: len(turns(safe_events(store, sid))) == 2, what="the turn closed")
        assert stop(proc) == 0
        ev = events_of(store, sid)
        # (the follow wrote nothing beside the database: these are OpenCode's own, while it runs)
        assert sorted(p.name for p in turn.data.iterdir()) == ["opencode.db", "opencode.db-shm", "opencode.db-wal"]
    finally:
        writer.close()
    assert turns(ev) == ["turn.completed", "turn.completed"]
    assert [i["text"] for i in of_type(ev, "agent_message")][-1] == turn.final_text
    ids = [i["id"] for i in items(ev)]
    assert len(ids) == len(set(ids))
    whole = whole_import(tmp_path)
    assert ev == events_of(whole, sid)
    assert about(store, sid) == about(whole, sid) and about(store, sid)["status"] == "completed"


def test_a_plain_import_takes_a_running_turn_as_far_as_it_is_final(tmp_path):
    """Imports between OpenCode's writes: a user message whose parts are not written yet is no
    turn yet; a text still streaming waits; a text that ended is taken while its message still
    runs; the close comes with the completed message — each once."""
    sid = capture(SCENARIO)["session_id"]
    turn = SecondTurn(tmp_path / "home")
    store = tmp_path / "store"
    writer = Writer(turn.data / "opencode.db")
    try:
        import_(store, turn.data)
        first = events_of(store, sid)
        writer.write(("message", turn.user))
        (report,) = import_(store, turn.data)
        assert report["status"] == "up-to-date" and events_of(store, sid) == first
        writer.write(*turn.opened())
        import_(store, turn.data)
        ev = events_of(store, sid)
        assert len(started(ev)) == 2 and "prompt" in started(ev)[1] and turns(ev) == ["turn.completed"]
        assert len(of_type(ev, "agent_message")) == 1
        writer.write(("part", turn.text))
        import_(store, turn.data)
        ev = events_of(store, sid)
        assert [i["text"] for i in of_type(ev, "agent_message")][-1] == turn.final_text and len(turns(ev)) == 1
        writer.write(("part", turn.step_finish))
        writer.write(("message", turn.answer), ("session", turn.session))
        import_(store, turn.data)
    finally:
        writer.close()
    assert events_of(store, sid) == events_of(whole_import(tmp_path), sid)


def test_an_unreadable_database_is_reported_with_its_reason_and_read_again(tmp_path, follower):
    """The database replaced by something that is not one: the follow says why in one line at
    each try (after 1 s, then 2 s, …) and goes on; the store put back (grown meanwhile) is read
    whole again."""
    sid = capture(SCENARIO)["session_id"]
    turn = SecondTurn(tmp_path / "home")
    db = turn.data / "opencode.db"
    store = tmp_path / "store"
    proc = follower(store, turn.data)
    wait_for(lambda: turns(safe_events(store, sid)) == ["turn.completed"], what="the first turn")
    aside = tmp_path / "aside.db"
    aside.write_bytes(b"not a database\n" * 100)
    os.replace(aside, db)
    out = output_until(proc, b"(again in 2 s)\n")  # said, and retried: 1 s, then 2 s, …
    errors = [line for line in out.decode().splitlines() if ": error: " in line]
    assert errors[:2] == [f"skip {db}: error: {db}: not a SQLite database (again in {n} s)" for n in (1, 2)]
    shutil.copyfile(FULL, aside)
    os.replace(aside, db)
    wait_for(lambda: len(turns(safe_events(store, sid))) == 2, what="the store read again")
    assert stop(proc) == 0
    assert events_of(store, sid) == events_of(whole_import(tmp_path), sid)


def test_without_inotify_a_stat_check_finds_each_change_and_a_write_elsewhere_imports_nothing(tmp_path):
    """The follower on its own, as ``follow`` runs it when inotify is unavailable: a ``stat`` of
    the database and its WAL every half second. A write that touches no session (OpenCode's other
    tables) costs a look at what changed and no import: the session's import record is not
    rewritten; the new turn's rows are imported at the next check."""
    from memfs.agents.opencode.follow import POLL_UNWATCHED, StoreFollower

    sid = capture(SCENARIO)["session_id"]
    turn = SecondTurn(tmp_path / "home")
    store = tmp_path / "store"
    reports: list = []
    follower = StoreFollower(store, turn.data / "opencode.db", report=reports.append)
    assert follower.watch(None) is None and follower.poll == POLL_UNWATCHED

    def stepping(cond, what: str):
        return wait_for(lambda: follower.step(time.monotonic()) or cond(), what=what)

    stepping(lambda: turns(safe_events(store, sid)) == ["turn.completed"], "the first pass")
    assert [(r.session, r.status) for r in reports] == [(sid, "imported")]
    record = store / sid / "index" / "import-sources.json"
    before = record.stat().st_mtime_ns
    writer = Writer(turn.data / "opencode.db")  # (the database switched to WAL: a change of the file)
    try:
        writer.conn.execute("PRAGMA user_version = 7")  # a write to no session's rows
        stepping(lambda: follower.seen == follower.fingerprint(), "a pass over the change")
        assert record.stat().st_mtime_ns == before and len(reports) == 1
        writer.write(("message", turn.user))
        writer.write(*turn.opened())
        stepping(lambda: len(started(safe_events(store, sid))) == 2, "the new turn at the next check")
        assert [r.status for r in reports] == ["imported"] * 2
    finally:
        writer.close()


def test_a_sub_agent_session_begun_while_followed_is_its_parents_child(tmp_path):
    """``subagent``: the parent's session read first; the sub-agent's session, messages and parts
    written later (a pass that reads the child alone) make ``<parent>.<child>``, as a plain
    import of the whole store names it."""
    from memfs.agents.opencode.follow import StoreFollower

    parent = capture("subagent")["session_id"]
    full = OPENCODE / "subagent" / "home" / ".local" / "share" / "opencode" / "opencode.db"
    rows = rows_of(full)
    (sub,) = [s["id"] for s in rows["session"] if s["parent_id"] == parent]
    data = data_dir(tmp_path / "home", "subagent")
    conn = sqlite3.connect(data / "opencode.db")
    try:
        for table, column in (("part", "session_id"), ("message", "session_id"), ("session", "id")):
            conn.execute(f"DELETE FROM {table} WHERE {column} = ?", (sub,))
        conn.commit()
    finally:
        conn.close()
    store = tmp_path / "store"
    follower = StoreFollower(store, data / "opencode.db", report=lambda item: None)
    follower.watch(None)
    wait_for(lambda: follower.step(time.monotonic()) or turns(safe_events(store, parent)), what="the parent")
    writer = Writer(data / "opencode.db")
    try:
        writer.write(*(("session", s) for s in rows["session"] if s["id"] == sub))
        writer.write(*(("message", m) for m in rows["message"] if m["session_id"] == sub),
                     *(("part", p) for p in rows["part"] if p["session_id"] == sub))
        child = f"{parent}.{sub}"
        wait_for(lambda: follower.step(time.monotonic()) or turns(safe_events(store, child)), what="the sub-agent")
    finally:
        writer.close()
    whole = tmp_path / "whole"
    import_(whole, data_dir(tmp_path / "whole-home", "subagent"))
    assert events_of(store, child) == events_of(whole, child)
    sessions = listing(store)
    assert set(sessions) == {parent, child} and sessions[child]["parent_session"] == parent
    assert child in sessions[parent]["children"]


# --- the real OpenCode (node and the CLIs installed) ----------------------------------------------


def test_the_real_cli_continuing_and_starting_sessions_while_followed(tmp_path, follower):
    """``opencode run`` (1.18.33, offline, scripted model server) makes a session; a follow of its
    data directory starts; ``run --session`` continues it (a command, then the answer) and a new
    ``run`` starts another, while followed: each OpenCode session one memfs session, each new
    turn there within a deadline, and the store what a plain import of the data directory gives."""
    sys.path.insert(0, str(Path(__file__).parent / "agents"))
    from clis import OpenCode
    from model_server import ModelServer

    from test_agents_cli import need_clis

    need_clis()
    script = {"steps": [{"text": "Hello."},
                        {"tool": {"name": "bash", "arguments": {"command": "ls", "description": "List files"}}},
                        {"text": "The project has one file: README.md."},
                        {"text": "A fresh start."}], "side": OpenCode.side}
    store = tmp_path / "store"
    with ModelServer(script, tmp_path / "requests.jsonl") as server:
        agent = OpenCode(tmp_path / "sandbox", server.url)
        data = agent.home / ".local" / "share" / "opencode"
        first = agent.run("Say hello")
        assert first.exit_code == 0, first.stderr.decode(errors="replace")[-2000:]
        sid = agent.session_id(first)
        proc = follower(store, data)
        wait_for(lambda: turns(safe_events(store, sid)) == ["turn.completed"], what="the first run's turn")
        second = agent.run("List the files", resume=sid)
        assert second.exit_code == 0, second.stderr.decode(errors="replace")[-2000:]
        wait_for(lambda: len(turns(safe_events(store, sid))) == 2, what="the continued session's new turn")
        third = agent.run("Start again")
        assert third.exit_code == 0, third.stderr.decode(errors="replace")[-2000:]
        other = agent.session_id(third)
        wait_for(lambda: turns(safe_events(store, other)) == ["turn.completed"], what="the new session's turn")
        assert stop(proc) == 0
    ev = events_of(store, sid)
    assert [(c["command"], c["exit_code"]) for c in of_type(ev, "command_execution")] == [("ls", 0)]
    assert [i["text"] for i in of_type(ev, "agent_message")] == ["Hello.", "The project has one file: README.md."]
    assert set(listing(store)) == {sid, other}
    whole = tmp_path / "whole"
    import_(whole, data)
    for s in (sid, other):
        assert events_of(store, s) == events_of(whole, s)
        assert about(store, s) == about(whole, s)
    assert all(r["status"] == "up-to-date" for r in import_(store, data))
