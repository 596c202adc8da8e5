"""SPEC §10 "Identity": one session per agent conversation, whatever captured it and in
whatever order, each thing in it once; its metadata in ``index/about.json``; compressed,
archived and paginated inputs. Driven by the captured fixtures (tests/fixtures/agents/)
through ``memfs import`` / ``memfs record`` run as a user runs them, checked through the
store's files, the views and the CLI."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import memfs
import orjson
import pytest
from memfs.ingest.importer import import_paths

from agent_helpers import MEMFS
from store_helpers import wait_until as wait_for

AGENTS = Path(__file__).parent / "fixtures" / "agents"
REPLAY = Path(__file__).parent / "agents" / "replay.py"
CLAUDE_SID = "78127aec-e908-4904-8d47-2d86e43e50f3"
CODEX_SID = "01a23aea-0f3b-7842-be12-c9694eec882e"
GEMINI_SID = "9d58201d-6652-4a64-9d7f-8a85a2a0b0a9"
SUB_PARENT = "9be44e48-5290-41a3-a7eb-bd1463634a4c"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*MEMFS, *args], capture_output=True, timeout=120)


def import_json(store: Path, *paths) -> list[dict]:
    proc = cli("import", "--store", str(store), "--json", *map(str, paths))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return orjson.loads(proc.stdout)


def record(store: Path, session: str, stream: Path, program: list[str] | None = None) -> subprocess.CompletedProcess:
    cmd = program or [sys.executable, str(REPLAY)]
    proc = subprocess.run([*MEMFS, "record", "--store", str(store), session, "--", *cmd, str(stream)],
                          capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == stream.read_bytes()  # the agent's stdout, untouched
    return proc


def sessions(store: Path) -> list[str]:
    return sorted(p.name for p in store.iterdir() if not p.name.startswith(".") and p.is_dir())


def events_of(store: Path, session: str) -> list[dict]:
    with memfs.open_session(store, session, read_only=True) as h:
        return [orjson.loads(line)["event"] for _, line in h.iter_lines()]


def log_bytes(store: Path, session: str) -> bytes:
    return (store / session / "events.jsonl").read_bytes()


def manifest_of(store: Path, session: str) -> dict:
    with memfs.open_session(store, session, read_only=True) as h:
        return h.manifest


def about_of(store: Path, session: str) -> dict:
    return orjson.loads((store / session / "index" / "about.json").read_bytes())


def tokens(store: Path, session: str) -> tuple[int, int]:
    """(input, output) tokens as ``derived/summary.md`` says them."""
    proc = cli("show", "--store", str(store), session, "--view", "summary.md")
    assert proc.returncode == 0, proc.stderr
    m = re.search(rb"\*\*Tokens:\*\* (\d+) input .*?, (\d+) output", proc.stdout)
    assert m, proc.stdout
    return int(m[1]), int(m[2])


def assert_each_item_once(events: list[dict]) -> None:
    """No item twice: by id (Codex ``exec --json``'s ``item_N``, numbered per run, by id and
    turn), and no message or command twice by content."""
    turn, done, said = 0, [], []
    for e in events:
        if e["type"] == "turn.started":
            turn += 1
        elif e["type"] == "item.completed":
            iid = e["item"]["id"]
            done.append((iid, turn) if re.fullmatch(r"item_\d+", iid) else iid)
            if e["item"]["type"] in ("agent_message", "command_execution"):
                said.append((e["item"]["type"], e["item"].get("text") or e["item"].get("command")))
    assert len(done) == len(set(done)), f"an item twice: {done}"
    assert len(said) == len(set(said)), f"a message or command twice: {said}"
    starts = [e for e in events if e["type"] == "turn.started"]
    turn_ids = [e["context"]["turn_id"] for e in starts if "turn_id" in (e.get("context") or {})]
    assert len(turn_ids) == len(set(turn_ids)), f"a turn twice: {turn_ids}"


def one(pattern: str) -> Path:
    (path,) = AGENTS.glob(pattern)
    return path


def claude_captures() -> dict[str, Path]:
    d = AGENTS / "claude" / "resume_two_turns"
    return {"s1": d / "stream.1.jsonl", "s2": d / "stream.2.jsonl",
            "file": one("claude/resume_two_turns/home/.claude/projects/*/*.jsonl")}


def codex_captures() -> dict[str, Path]:
    d = AGENTS / "codex" / "resume_two_turns"
    return {"s1": d / "stream.1.jsonl", "s2": d / "stream.2.jsonl",
            "file": one("codex/resume_two_turns/home/.codex/sessions/*/*/*/*.jsonl")}


def gemini_captures() -> dict[str, Path]:
    d = AGENTS / "gemini" / "resume_two_turns"
    return {"s1": d / "stream.1.jsonl", "s2": d / "stream.2.jsonl", "file": d / "home" / ".gemini"}


CAPTURES = {"claude": (claude_captures, CLAUDE_SID), "codex": (codex_captures, CODEX_SID),
            "gemini": (gemini_captures, GEMINI_SID)}
ORDERS = [("s1", "s2", "file"), ("file", "s1", "s2"), ("s1", "file", "s2")]


# --- one session per conversation, each thing once -------------------------------------------


@pytest.mark.parametrize("order", ORDERS, ids=["streams-then-file", "file-then-streams", "interleaved"])
@pytest.mark.parametrize("agent", ["claude", "codex", "gemini"])
def test_every_capture_of_a_resumed_conversation_lands_once_in_one_session(tmp_path, agent, order):
    store = tmp_path / "store"
    captures, sid = CAPTURES[agent]
    paths = captures()
    for key in order:
        import_json(store, paths[key])
    assert sessions(store) == [sid]
    m = manifest_of(store, sid)
    assert (m["turn_count"], m["in_turn"]) == (2, False)  # two turns, not four
    events = events_of(store, sid)
    assert_each_item_once(events)
    assert tokens(store, sid) == (3300, 75)  # what the agent counted: usage never doubles
    meta = about_of(store, sid)
    assert (meta["agent"], meta["conversation_id"]) == (agent, sid)
    assert meta["first_prompt"] == "What files are in the project?"
    assert meta["project"] == meta["cwd"]  # (the capture's cwd does not exist on this machine)
    # importing anything again adds nothing: the same files, and copies of them elsewhere
    before = log_bytes(store, sid)
    items = import_json(store, *(paths[k] for k in order))
    assert {i["status"] for i in items} == {"up-to-date"}
    copies = tmp_path / "copies"
    shutil.copytree(paths["file"], copies / "home") if paths["file"].is_dir() else \
        (copies.mkdir(), shutil.copy(paths["file"], copies))
    shutil.copy(paths["s1"], copies / "again.1.jsonl")
    shutil.copy(paths["s2"], copies / "again.2.jsonl")
    items = import_json(store, copies)
    assert {i["session"] for i in items} == {sid} and sum(i["appended"] for i in items) == 0
    assert log_bytes(store, sid) == before


def test_what_a_later_capture_adds_is_metadata_never_a_turn(tmp_path):
    store, paths = tmp_path / "store", claude_captures()
    import_json(store, paths["s1"], paths["s2"])  # stream-json does not print the prompt
    starts = [e for e in events_of(store, CLAUDE_SID) if e["type"] == "turn.started"]
    assert not any("prompt" in (e.get("context") or {}) for e in starts)
    (item,) = import_json(store, paths["file"])
    assert item["appended"] == 0 and item["duplicates"] > 0
    notes = about_of(store, CLAUDE_SID)["turn_notes"]
    assert notes["1"]["prompt"] == "What files are in the project?"
    assert notes["2"]["prompt"] == "What is the project about?"
    assert manifest_of(store, CLAUDE_SID)["turn_count"] == 2


def test_a_record_session_named_by_the_user_receives_the_conversation(tmp_path):
    store, paths = tmp_path / "store", claude_captures()
    record(store, "mywork", paths["s1"])
    meta = about_of(store, "mywork")  # the stream named its conversation: noted at once
    assert (meta["conversation_id"], meta["agent"]) == (CLAUDE_SID, "claude")
    (item,) = import_json(store, paths["file"])
    assert item["session"] == "mywork" and sessions(store) == ["mywork"]
    record(store, "mywork", paths["s2"])  # a replay of what the session holds: nothing new
    assert manifest_of(store, "mywork")["turn_count"] == 2
    assert_each_item_once(events_of(store, "mywork"))
    before = log_bytes(store, "mywork")
    record(store, "mywork", paths["s1"])
    assert log_bytes(store, "mywork") == before
    # the root map is a cache: missing, or naming a session that moved, it is rebuilt by a scan
    conversations = store / ".memfs-conversations.json"
    conversations.unlink()
    (copy := tmp_path / "t").mkdir()
    shutil.copy(paths["file"], copy / "transcript.jsonl")
    (item,) = import_json(store, copy)
    assert item["session"] == "mywork" and item["appended"] == 0
    assert orjson.loads(conversations.read_bytes())["conversations"][CLAUDE_SID]["session"] == "mywork"
    os.rename(store / "mywork", store / "renamed")
    shutil.copy(paths["file"], copy / "transcript2.jsonl")
    items = import_json(store, copy)
    assert {i["session"] for i in items} == {"renamed"} and sessions(store) == ["renamed"]
    assert orjson.loads(conversations.read_bytes())["conversations"][CLAUDE_SID]["session"] == "renamed"
    assert log_bytes(store, "renamed") == before


def test_record_takes_the_agent_from_the_command_when_the_stream_does_not_say(tmp_path):
    store, bindir, stream = tmp_path / "store", tmp_path / "bin", tmp_path / "native.jsonl"
    bindir.mkdir()
    stream.write_bytes(b'{"type":"thread.started","thread_id":"conv-7"}\n{"type":"turn.started"}\n'
                       b'{"type":"item.completed","item":{"id":"m-1","type":"agent_message","text":"hi"}}\n'
                       b'{"type":"turn.completed","usage":{"input_tokens":5,"output_tokens":1}}\n')
    gemini = bindir / "gemini"
    gemini.write_text(f"#!{sys.executable}\nimport runpy, sys\nsys.argv[0] = {str(REPLAY)!r}\n"
                      f"runpy.run_path({str(REPLAY)!r}, run_name='__main__')\n")
    gemini.chmod(0o755)
    record(store, "g", stream, program=[str(gemini)])
    meta = about_of(store, "g")
    assert (meta["agent"], meta["conversation_id"]) == ("gemini", "conv-7")


def test_the_agent_ids_index_follows_the_log(tmp_path):
    store, paths = tmp_path / "store", claude_captures()
    import_json(store, paths["s1"])
    index = store / CLAUDE_SID / "index" / "agent-ids"
    assert b"toolu_0411000001" in index.read_bytes()
    # another writer appends the second turn (its ids as the agent gave them): the index is
    # behind the log, and catches up from it
    ref = tmp_path / "ref"
    import_json(ref, paths["s2"])
    lines = [orjson.dumps(e) + b"\n" for e in events_of(ref, CLAUDE_SID) if e["type"] != "thread.started"]
    src = tmp_path / "turn2.jsonl"
    src.write_bytes(b"".join(lines))
    assert cli("append", "--store", str(store), CLAUDE_SID, str(src)).returncode == 0
    (item,) = import_json(store, paths["file"])
    assert item["appended"] == 0 and manifest_of(store, CLAUDE_SID)["turn_count"] == 2
    assert b"msg_0411000006:0" in index.read_bytes()
    # missing or torn: rebuilt from the log (the log is the truth)
    before = log_bytes(store, CLAUDE_SID)
    for damage in (lambda: index.unlink(), lambda: index.write_bytes(index.read_bytes()[:-7])):
        damage()
        (copy := tmp_path / f"c{len(list(tmp_path.iterdir()))}").mkdir()
        shutil.copy(paths["s2"], copy / "s2.jsonl")
        (item,) = import_json(store, copy)
        assert item["appended"] == 0 and log_bytes(store, CLAUDE_SID) == before
        assert b"msg_0411000006:0" in index.read_bytes()


# --- inputs ----------------------------------------------------------------------------------


def zst(src: Path, dst: Path) -> None:
    import zstandard

    dst.write_bytes(zstandard.ZstdCompressor().compress(src.read_bytes()))


def test_codex_home_sessions_archived_and_compressed(tmp_path):
    store, home = tmp_path / "store", tmp_path / ".codex"
    plain = one("codex/ok_failing_command/home/.codex/sessions/*/*/*/*.jsonl")
    packed = one("codex/mcp_call/home/.codex/sessions/*/*/*/*.jsonl")
    (home / "sessions" / "2026" / "12" / "03").mkdir(parents=True)
    (home / "archived_sessions").mkdir()
    shutil.copy(plain, home / "sessions" / "2026" / "12" / "03" / plain.name)
    zst(packed, home / "archived_sessions" / (packed.name + ".zst"))
    (home / "history.jsonl").write_bytes(b'{"session_id":"x","ts":1,"text":"not a rollout"}\n')
    items = import_json(store, home)
    assert sorted(Path(i["source"]).name for i in items) == sorted([plain.name, packed.name + ".zst"])
    sid_of = {i["source"].endswith(".zst"): i["session"] for i in items}
    assert sorted(sessions(store)) == sorted(sid_of.values())
    # the compressed rollout reads as the plain one does
    ref = tmp_path / "ref"
    (ref_item,) = import_json(ref, packed)
    assert events_of(store, sid_of[True]) == events_of(ref, ref_item["session"])
    # once each, whether the home or its sessions folder is given
    for given in (home, home / "sessions"):
        assert {i["status"] for i in import_json(store, given)} == {"up-to-date"}


def test_a_compressed_source_past_the_size_limit_is_refused_whole(tmp_path):
    store, src = tmp_path / "store", tmp_path / "rollout-big.jsonl.zst"
    zst(one("codex/mcp_call/home/.codex/sessions/*/*/*/*.jsonl"), src)
    (item,) = import_paths(store, [src], max_decompressed=4096)
    assert item.status == "error" and "limit" in item.reason
    assert not store.exists() or sessions(store) == []


def test_a_paginated_rollout_is_one_session_each_page_once(tmp_path):
    store, pages = tmp_path / "store", tmp_path / "pages"
    pages.mkdir()
    lines = codex_captures()["file"].read_bytes().splitlines(keepends=True)
    cut = next(i for i, l in enumerate(lines) if b'"task_complete"' in l) + 1
    (pages / "rollout-a.jsonl").write_bytes(b"".join(lines[:cut]))
    (pages / "rollout-b.jsonl").write_bytes(lines[0] + b"".join(lines[cut:]))  # a page starts with the meta
    items = import_json(store, pages)
    assert {i["session"] for i in items} == {CODEX_SID} and sessions(store) == [CODEX_SID]
    assert manifest_of(store, CODEX_SID)["turn_count"] == 2
    assert_each_item_once(events_of(store, CODEX_SID))
    assert {i["status"] for i in import_json(store, pages)} == {"up-to-date"}


def test_a_paginated_rollout_counts_usage_once(tmp_path):
    store, pages = tmp_path / "store", tmp_path / "pages"
    pages.mkdir()
    lines = codex_captures()["file"].read_bytes().splitlines(keepends=True)
    cut = next(i for i, l in enumerate(lines) if b'"task_complete"' in l) + 1
    (pages / "rollout-a.jsonl").write_bytes(b"".join(lines[:cut]))
    (pages / "rollout-b.jsonl").write_bytes(lines[0] + b"".join(lines[cut:]))
    import_json(store, pages)
    assert tokens(store, CODEX_SID) == (3300, 75)


def test_a_claude_stub_transcript_is_not_a_session(tmp_path):
    store, stub = tmp_path / "store", tmp_path / f"{CLAUDE_SID}.jsonl"
    lines = claude_captures()["file"].read_bytes().splitlines(keepends=True)
    stub.write_bytes(b"".join(l for l in lines if orjson.loads(l).get("type") not in ("user", "assistant")))
    (item,) = import_json(store, stub)
    assert item["status"] == "empty"
    assert not store.exists() or sessions(store) == []


def test_sub_agent_files_go_to_child_sessions(tmp_path):
    store = tmp_path / "store"
    items = import_json(store, AGENTS / "claude" / "subagent" / "home" / ".claude")
    child = f"{SUB_PARENT}.agent-a16cdf0d8b50a0884"
    assert [i["session"] for i in items] == [SUB_PARENT, child]  # the parent first
    assert sessions(store) == sorted([SUB_PARENT, child])
    assert about_of(store, child)["parent_session"] == SUB_PARENT
    assert child in about_of(store, SUB_PARENT)["children"]
    assert manifest_of(store, child)["turn_count"] >= 1
    assert {i["status"] for i in import_json(store, AGENTS / "claude" / "subagent" / "home" / ".claude")} == \
        {"up-to-date"}


# --- import --follow -------------------------------------------------------------------------


def sources_of(store: Path, session: str) -> dict:
    try:
        return orjson.loads((store / session / "index" / "import-sources.json").read_bytes())["sources"]
    except (FileNotFoundError, orjson.JSONDecodeError):
        return {}


def test_follow_dedupes_across_captures_and_restarts(tmp_path, follower):
    store, watched, paths = tmp_path / "store", tmp_path / "watched", claude_captures()
    watched.mkdir()
    proc = follower(store, watched)
    shutil.copy(paths["s1"], watched / "s1.jsonl")
    wait_for(lambda: (store / CLAUDE_SID).is_dir() and manifest_of(store, CLAUDE_SID)["turn_count"] == 1,
             what="the first run")
    shutil.copy(paths["file"], watched / "transcript.jsonl")  # its first turn is held already
    wait_for(lambda: manifest_of(store, CLAUDE_SID)["turn_count"] == 2, what="the resumed turn")
    wait_for(lambda: len(sources_of(store, CLAUDE_SID)) == 2, what="the transcript consumed")
    shutil.copy(paths["s2"], watched / "s2.jsonl")
    wait_for(lambda: len(sources_of(store, CLAUDE_SID)) == 3, what="the second stream consumed")
    before = log_bytes(store, CLAUDE_SID)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    proc = follower(store, watched)  # a restart reads nothing twice
    other = one("codex/ok_failing_command/home/.codex/sessions/*/*/*/*.jsonl")
    shutil.copy(other, watched / other.name)  # processed after the restart's first pass
    wait_for(lambda: len(sessions(store)) == 2, what="a file written after the restart")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    assert log_bytes(store, CLAUDE_SID) == before
    assert manifest_of(store, CLAUDE_SID)["turn_count"] == 2
    assert_each_item_once(events_of(store, CLAUDE_SID))


def test_a_turn_head_held_at_the_end_of_an_import_is_kept(tmp_path):
    """An import that stops inside a turn's head (its prompt, no item yet) keeps it, and the
    next import goes on with the same turn: the same log as one import of the whole file."""
    whole, parts, src = tmp_path / "whole", tmp_path / "parts", tmp_path / f"{CLAUDE_SID}.jsonl"
    transcript = claude_captures()["file"]
    import_json(whole, transcript)
    lines = transcript.read_bytes().splitlines(keepends=True)
    cut = next(i for i, l in enumerate(lines) if orjson.loads(l).get("type") == "user") + 1
    src.write_bytes(b"".join(lines[:cut]))
    import_json(parts, src)
    assert [e["type"] for e in events_of(parts, CLAUDE_SID)][-1] == "turn.started"
    with src.open("ab") as f:
        f.write(b"".join(lines[cut:]))
    import_json(parts, src)
    assert log_bytes(parts, CLAUDE_SID) == log_bytes(whole, CLAUDE_SID)


@pytest.mark.parametrize("sid, name", [("-rf/../../x", "_rf_.._.._x"), ("..", "session"), ("a" * 300, None)])
def test_a_conversation_id_from_a_file_becomes_a_valid_new_session_name(tmp_path, sid, name):
    store, src = tmp_path / "store", tmp_path / "stream.jsonl"
    lines = claude_captures()["s1"].read_bytes().replace(CLAUDE_SID.encode(), orjson.dumps(sid)[1:-1])
    src.write_bytes(lines)
    (item,) = import_json(store, src)
    assert item["status"] == "imported" and sessions(store) == [item["session"]]
    assert memfs.store.paths.new_session_name_problem(item["session"]) is None
    if name is not None:
        assert item["session"] == name
    else:
        assert len(item["session"]) <= 255 and item["session"].startswith("a" * 200)
    assert about_of(store, item["session"])["conversation_id"] == sid


def test_a_dry_run_counts_what_would_be_new_and_writes_nothing(tmp_path):
    store, paths = tmp_path / "store", claude_captures()
    import_json(store, paths["s1"], paths["s2"])
    (store / ".memfs-conversations.json").unlink()  # (a dry run does not rebuild it)
    files = {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}
    proc = cli("import", "--store", str(store), "--dry-run", "--json", str(paths["file"]))
    (item,) = orjson.loads(proc.stdout)
    assert item["session"] == CLAUDE_SID and item["appended"] == 0 and item["duplicates"] > 0
    assert {p: p.read_bytes() for p in store.rglob("*") if p.is_file()} == files


# --- the agent-ids index taken from memory -----------------------------------------------------


def _bench_sources() -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    try:
        import bench_ingest
    finally:
        sys.path.pop(0)
    return {"claude": bench_ingest.claude_transcript, "codex-exec": bench_ingest.codex_stream,
            "codex-rollout": bench_ingest.codex_rollout}


def _import_all(store: Path, tmp: Path, agent: str, kind: str) -> None:
    """Captures of one conversation in turn, one of them big enough for several batches and
    imported in two growing steps, then the fixture's captures (most of them duplicates)."""
    lines = _bench_sources()[kind](12_000)
    src = tmp / f"{kind}.jsonl"
    src.write_bytes(b"".join(line + b"\n" for line in lines[:7_000]))
    import_paths(store, [src])
    with src.open("ab") as f:
        f.write(b"".join(line + b"\n" for line in lines[7_000:]))
    import_paths(store, [src])
    paths = CAPTURES[agent][0]()
    for key in ("s1", "file", "s2"):
        import_paths(store, [paths[key]])


@pytest.mark.parametrize("agent,kind", [("claude", "claude"), ("codex", "codex-exec"), ("codex", "codex-rollout")])
def test_the_agent_ids_index_from_memory_is_the_one_read_from_the_log(tmp_path, monkeypatch, agent, kind):
    from memfs.ingest import agent_ids

    stores = {}
    for from_memory in (True, False):
        monkeypatch.setattr(agent_ids, "FROM_MEMORY", from_memory)
        store = stores[from_memory] = tmp_path / f"store-{from_memory}"
        (tmp := tmp_path / f"src-{from_memory}").mkdir()
        _import_all(store, tmp, agent, kind)
    fast, slow = ({p.relative_to(s): p.read_bytes().split(b"\n", 1)[1]  # (the head names the log's inode)
                   for p in s.rglob("*") if p.is_file() and p.name == "agent-ids"}
                  for s in (stores[True], stores[False]))
    assert len(fast) >= 2 and fast.keys() == slow.keys()
    for name in fast:
        assert fast[name] == slow[name], name
    assert max(v.count(b'["@",') for v in fast.values()) >= 3  # caught up batch by batch
    for name in fast:  # and the log is the same
        log = Path(str(name).replace("index/agent-ids", "events.jsonl"))
        assert (stores[True] / log).read_bytes() == (stores[False] / log).read_bytes()


def _usage_tokens(store: Path) -> dict[str, tuple]:
    """derived/usage.json per session: (its total's tokens, wall time and cost; each turn's
    tokens, times, cost and model)."""
    from memfs import views

    out = {}
    for name in sessions(store):
        with memfs.open_session(store, name, read_only=True) as h:
            usage = orjson.loads(views.render_view(h, "usage.json"))
        out[name.replace("rec", "", 1) if name.startswith("rec") else name] = (
            {k: usage["total"][k] for k in ("tokens", "wall_seconds", "cost_usd")},
            [{k: turn[k] for k in ("tokens", "started_at", "completed_at", "wall_seconds", "cost_usd", "model")}
             for turn in usage["turns"]])
    return out


@pytest.mark.parametrize("agent, scenario", [("gemini", "compact"), ("gemini", "subagent"),
                                             ("claude", "resume_two_turns"), ("claude", "model_switch"),
                                             ("gemini", "model_switch"), ("codex", "model_switch")])
def test_recorded_then_imported_ends_with_the_file_s_totals(agent, scenario, tmp_path):
    """A conversation captured by ``record`` and then imported from the agent's own file ends
    with the file's token counts, times and cost, turn for turn: the file is the agent's final record (Gemini's
    stream adds a compression request and a sub-agent's tokens; Claude's stream may carry a
    placeholder output count)."""
    fixture = AGENTS / agent / scenario
    alone, both = tmp_path / "alone", tmp_path / "both"
    import_json(alone, fixture / "home")
    for stream in sorted(fixture.glob("stream*.jsonl")):
        record(both, "rec", stream)
    import_json(both, fixture / "home")
    want = _usage_tokens(alone)
    got = _usage_tokens(both)
    conversation = next(name for name in want if "." not in name)
    assert got[""] == want[conversation]
    assert sorted(v for k, v in got.items() if k) == sorted(v for k, v in want.items() if k != conversation)
