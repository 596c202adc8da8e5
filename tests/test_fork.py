"""``memfs fork SESSION NEW [--at-turn N]`` (SPEC §11): the library call, the command line as a
user runs it, and a mount that shows the fork beside its source."""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path

import memfs
import pytest
from memfs.errors import AlreadyExists, InvalidName, TurnNotFound
from memfs.export.conversation import NAMESPACE
from memfs.ingest.conversations import find_conversation
from memfs.store import about
from memfs.store.fork import fork_session

from agent_helpers import cli, events_of
from export_helpers import FIXTURES, export, import_files, run
from mounting import event, mounted, needs_fuse, sh

LINES = [
    event("thread.started", thread_id="t-1"),
    event("turn.started", context={"origin": "user", "prompt": "first"}),
    event("item.completed", item={"id": "m1", "type": "agent_message", "text": "one"}),
    event("turn.completed", usage={"input_tokens": 10, "output_tokens": 2}),
    event("turn.started", context={"origin": "user", "prompt": "second"}),
    event("item.completed", item={"id": "c1", "type": "command_execution", "command": "false",
                                  "status": "failed", "exit_code": 1}),
    event("turn.failed", message="boom"),
    event("error", message="between turns"),
    event("turn.started", context={"origin": "user", "prompt": "third"}),
    event("item.completed", item={"id": "m3", "type": "agent_message", "text": "three"}),
    event("turn.completed", usage={"input_tokens": 30, "output_tokens": 4}),
    event("thread.completed", thread_id="t-1", session_id="src", subtype="success", outcome_code="completed",
          usage={"input_tokens": 40}, num_turns=3),
]


def make_source(root: Path, name: str = "src", lines: list[str] = LINES, meta: dict | None = None) -> Path:
    with memfs.open_session(root, name, durability="write") as h:
        h.append_many(lines)
    if meta:
        about.merge(root / name, meta)
    return root / name


def snapshot(session_dir: Path) -> dict[str, str]:
    """Every file of a session directory with its bytes' digest (and its mode)."""
    return {str(p.relative_to(session_dir)): hashlib.sha256(p.read_bytes()).hexdigest() + oct(p.stat().st_mode)
            for p in sorted(session_dir.rglob("*")) if p.is_file()}


def log_bytes(session_dir: Path) -> bytes:
    return (session_dir / "events.jsonl").read_bytes()


def turn_end(root: Path, name: str, n: int) -> int:
    with memfs.open_session(root, name, read_only=True) as h:
        return h.turn_range(n)[1]


# --- the library -----------------------------------------------------------------------------


def test_a_fork_at_a_turn_is_the_source_s_bytes_up_to_that_turn_s_end(tmp_path):
    src = make_source(tmp_path, meta={"agent": "codex", "conversation_id": "t-1", "title": "Fix it",
                                      "cwd": "/p", "children": ["src.child"],
                                      "turn_notes": {"1": {"prompt": "noted"}, "3": {"prompt": "late"}}})
    before = snapshot(src)
    forked = fork_session(tmp_path, "src", "f2", at_turn=2)
    assert (forked.name, forked.source, forked.at_turn, forked.turns, forked.open) == ("f2", "src", 2, 2, False)
    assert log_bytes(tmp_path / "f2") == log_bytes(src)[:turn_end(tmp_path, "src", 2)]
    assert forked.lines == 7 and forked.refused == 0
    with memfs.open_session(tmp_path, "f2", read_only=True) as h:
        m = h.manifest
        assert (m["turn_count"], m["in_turn"], m["event_count"]) == (2, False, 7)
        assert [e["outcome"] for e in h.turn_index] == ["completed", "failed"]
    meta = about.read(tmp_path / "f2")
    assert meta["forked_from"] == "src" and meta["forked_at_turn"] == 2
    assert (meta["agent"], meta["title"], meta["cwd"]) == ("codex", "Fix it", "/p")
    assert "children" not in meta  # the source's conversation alone
    # a conversation of its own: a fresh UUID, never the source's
    assert str(uuid.UUID(meta["conversation_id"])) == meta["conversation_id"] == forked.conversation_id
    assert fork_session(tmp_path, "src", "f3").conversation_id not in (meta["conversation_id"], "t-1")
    assert meta["turn_notes"] == {"1": {"prompt": "noted"}}  # (only the copied turns' notes)
    assert snapshot(src) == before  # the source untouched, byte for byte


def test_a_fork_by_default_is_the_whole_log(tmp_path):
    src = make_source(tmp_path)
    forked = fork_session(tmp_path, "src", "all")
    assert log_bytes(tmp_path / "all") == log_bytes(src)
    assert (forked.at_turn, forked.turns, forked.lines) == (3, 3, len(LINES))
    assert events_of(tmp_path, "all") == events_of(tmp_path, "src")


def test_events_after_the_nth_turn_are_not_copied(tmp_path):
    make_source(tmp_path)
    fork_session(tmp_path, "src", "f3", at_turn=3)
    assert [e["type"] for e in events_of(tmp_path, "f3")][-1] == "turn.completed"  # not thread.completed
    fork_session(tmp_path, "src", "f1", at_turn=1)
    assert "between turns" not in log_bytes(tmp_path / "f1").decode()


def test_a_fork_at_the_open_turn_ends_in_that_open_turn(tmp_path):
    make_source(tmp_path, lines=LINES[:6])  # turn 2 still open
    forked = fork_session(tmp_path, "src", "open", at_turn=2)
    assert (forked.at_turn, forked.open) == (2, True)
    with memfs.open_session(tmp_path, "open", read_only=True) as h:
        assert (h.manifest["turn_count"], h.manifest["in_turn"]) == (1, True)
    assert log_bytes(tmp_path / "open") == log_bytes(tmp_path / "src")


@pytest.mark.parametrize("new, at_turn, error, reason", [
    ("src", None, AlreadyExists, "already exists"),
    ("taken", None, AlreadyExists, "'taken' already exists"),
    ("bad name", None, InvalidName, "invalid session name"),
    ("-rf", None, InvalidName, "must not begin with '-'"),
    (".hidden", None, InvalidName, "invalid session name"),
    ("f", 4, TurnNotFound, "turn 4 is out of range: session 'src' has turns 1..3"),
    ("f", 0, TurnNotFound, "out of range"),
])
def test_refusals_say_why_and_make_nothing(tmp_path, new, at_turn, error, reason):
    src = make_source(tmp_path)
    make_source(tmp_path, "taken", LINES[:2])
    taken, before = snapshot(tmp_path / "taken"), snapshot(src)
    names = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(error, match=reason):
        fork_session(tmp_path, "src", new, at_turn=at_turn)
    assert sorted(p.name for p in tmp_path.iterdir()) == names
    assert snapshot(src) == before and snapshot(tmp_path / "taken") == taken


def test_a_missing_source_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="no session 'nope'"):
        fork_session(tmp_path, "nope", "new")
    assert not (tmp_path / "new").exists()


def test_an_evicted_turn_cannot_be_forked_at(tmp_path):
    with memfs.open_session(tmp_path, "capped", durability="write", max_events=12) as h:
        for _ in range(8):
            h.append_many([event("turn.started"), event("turn.completed", usage={})])
        base, last = h.manifest["retained_turn_base"], h.manifest["turn_count"]
    assert 1 < base < last == 8
    with pytest.raises(TurnNotFound, match=f"turns before {base} were evicted"):
        fork_session(tmp_path, "capped", "f", at_turn=base - 1)
    forked = fork_session(tmp_path, "capped", "f", at_turn=last)
    assert forked.turns == last - base + 1
    assert log_bytes(tmp_path / "f") == log_bytes(tmp_path / "capped")
    with memfs.open_session(tmp_path, "f", read_only=True) as h:
        assert h.manifest["turn_count"] == forked.turns  # the fork numbers its turns from 1


def test_a_fork_goes_on_as_a_session_of_its_own(tmp_path):
    make_source(tmp_path)
    before = snapshot(tmp_path / "src")
    fork_session(tmp_path, "src", "f1", at_turn=1)
    with memfs.open_session(tmp_path, "f1", durability="write") as h:
        h.append_many([event("turn.started"), event("turn.completed", usage={})])
        assert h.manifest["turn_count"] == 2
    assert snapshot(tmp_path / "src") == before


# --- the command line ------------------------------------------------------------------------


def test_the_command_line_forks_and_refuses_with_one_line_reasons(tmp_path):
    store = tmp_path / "store"
    src = make_source(store)
    before = snapshot(src)
    proc = cli("fork", "--store", str(store), "src", "copy", "--at-turn", "1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "forked src -> copy: 1 turn (to turn 1), 4 lines\n"
    proc = cli("fork", "--store", str(store), "src", "whole", "--json")
    assert proc.returncode == 0, proc.stderr
    whole = json.loads(proc.stdout)
    cid = about.read(store / "whole")["conversation_id"]
    assert whole == {"name": "whole", "source": "src", "at_turn": 3, "turns": 3, "open": False,
                     "lines": len(LINES), "refused": 0, "conversation_id": cid, "agent": None}
    # the conversation map knows the fork's own conversation: an import of its export lands there
    assert find_conversation(store, cid) == "whole"
    assert find_conversation(store, about.read(store / "copy")["conversation_id"]) == "copy"
    for args, status, reason in [
        (("src", "copy"), 1, "memfs: session 'copy' already exists\n"),
        (("src", "a/b"), 1, "memfs: invalid session name 'a/b'"),
        (("src", "x", "--at-turn", "9"), 1, "memfs: turn 9 is out of range: session 'src' has turns 1..3\n"),
        (("nope", "x"), 1, "memfs: no session 'nope'"),
        (("src", "x", "--at-turn", "0"), 2, "argument --at-turn: must be at least 1"),
        (("src", "x", "--at-turn", "two"), 2, "argument --at-turn"),
    ]:
        proc = cli("fork", "--store", str(store), *args)
        assert proc.returncode == status, (args, proc.stderr)
        assert reason in proc.stderr and proc.stdout == "", (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 or status == 2
    assert not (store / "x").exists()
    assert snapshot(src) == before
    assert log_bytes(store / "whole") == log_bytes(src)


# --- through a mount -------------------------------------------------------------------------


@needs_fuse
def test_a_fork_appears_in_a_running_mount_with_the_source_s_turns(tmp_path):
    store = tmp_path / "store"
    make_source(store)
    with mounted(store, tmp_path / "mnt") as m:
        sessions = m.mnt / "sessions"
        assert sh("cat src/derived/summary.md", sessions).returncode == 0
        before = sh("sha256sum src/events.jsonl src/manifest.json src/index/turns.json", sessions).stdout
        proc = cli("fork", "--store", str(store), "src", "fork2", "--at-turn", "2")
        assert proc.returncode == 0, proc.stderr
        assert "fork2" in sh("ls", sessions).stdout.split()
        for n in (1, 2):
            assert sh(f"cat fork2/derived/turns/{n}.jsonl", sessions).stdout == \
                sh(f"cat src/derived/turns/{n}.jsonl", sessions).stdout
        assert sh("ls fork2/derived/turns", sessions).stdout.split() == ["1.jsonl", "2.jsonl"]
        manifest = json.loads(sh("cat fork2/manifest.json", sessions).stdout)
        assert (manifest["turn_count"], manifest["in_turn"]) == (2, False)
        assert sh("getfattr --only-values -n user.memfs.turn_count fork2", sessions).stdout.strip() == "2"
        assert "Forked from:** `src` at turn 2" in sh("cat fork2/derived/transcript.md", sessions).stdout
        # the fork goes on by itself; the source does not change
        sh(f"echo '{event('turn.started')}' >> fork2/events.jsonl", sessions)
        assert sh("sha256sum src/events.jsonl src/manifest.json src/index/turns.json", sessions).stdout == before


# --- a fork is its own conversation (SPEC §11) -------------------------------------------------


@pytest.mark.parametrize("agent, home_dir", [("claude", ".claude"), ("codex", ".codex")])
def test_a_fork_exports_to_a_file_of_its_own_beside_its_source_s(agent, home_dir, tmp_path):
    store, home = tmp_path / "store", tmp_path / "home"
    [item] = import_files(store, FIXTURES / agent / "resume_two_turns" / "home" / home_dir)
    source = item["session"]
    source_cid = about.read(store / source)["conversation_id"]
    (home / home_dir).mkdir(parents=True)
    first = export(store, source, agent, home)
    assert first["conversation_id"] == source_cid
    assert cli("fork", "--store", str(store), source, "fork1", "--at-turn", "1").returncode == 0
    fork_cid = about.read(store / "fork1")["conversation_id"]
    second = export(store, "fork1", agent, home)  # (the source's file is there: no "already holds")
    assert second["conversation_id"] == fork_cid != source_cid and second["path"] != first["path"]
    assert source_cid not in Path(second["path"]).read_text() and fork_cid not in Path(first["path"]).read_text()
    # the fork's file imported on its own goes to the fork, and only its one turn is there
    before = events_of(store, "fork1")
    [back] = import_files(store, Path(second["path"]))
    assert back["session"] == "fork1"
    after = events_of(store, "fork1")
    assert after[:len(before)] == before
    assert [e["type"] for e in after[len(before):]] == ["thread.started"] and after[-1]["thread_id"] == fork_cid
    assert about.read(store / source)["conversation_id"] == source_cid


def test_a_fork_made_before_forks_had_ids_of_their_own_is_never_exported_as_its_source(tmp_path):
    store, home = tmp_path / "store", tmp_path / "home"
    [item] = import_files(store, FIXTURES / "claude" / "resume_two_turns" / "home" / ".claude")
    source = item["session"]
    source_cid = about.read(store / source)["conversation_id"]
    (home / ".claude").mkdir(parents=True)
    for name, cid in (("old", None), ("taken", source_cid)):
        fork_session(store, source, name)
        meta = about.read(store / name)
        meta.pop("conversation_id")
        if cid:
            meta["conversation_id"] = cid  # (what a resume of such a fork used to write)
        (store / name / "index" / "about.json").write_bytes(json.dumps(meta).encode())
    # no id of its own: the log's thread (its source's) is not taken, the name's UUID is
    assert export(store, "old", "claude", home)["conversation_id"] == str(uuid.uuid5(NAMESPACE, "old"))
    code, out, err = run("export", "--store", str(store), "taken", "--to", "claude", "--out", str(home))
    assert code == 1 and out == ""
    assert err == (f"memfs: export: conversation {source_cid} is session {source}'s, not taken's (taken was "
                   f"forked from it before forks got conversation ids of their own: fork {source} again) "
                   "(nothing written)\n")
    assert not list(home.rglob(f"*{source_cid}*"))
