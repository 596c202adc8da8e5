"""``memfs resume SESSION --in claude|codex [-- ARGS…]`` (SPEC §11): a captured session continues
in the real CLI (offline, against tests/agents/model_server.py) and its new turn comes back into
the same session, the old turns once.

The real-CLI tests skip without node and the CLIs (`bash scripts/install_agents.sh`), and fail
instead when MEMFS_REQUIRE_AGENTS=1 (tests/test_agents_cli.py's rule)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from memfs.agents.claude.write import slug
from memfs.export.resume import ResumeRefused, checked_cwd, cwd_problem

from agent_helpers import MEMFS, cli, events_of

sys.path.insert(0, str(Path(__file__).parent / "agents"))
from clis import AGENTS, BIN, make_project  # noqa: E402
from model_server import ModelServer  # noqa: E402

from test_agents_cli import need_clis  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "agents"
STORE_DIR = {"claude": ".claude", "codex": ".codex"}
# a non-interactive resume: the prompt in ARGS, in each tool's own syntax
PROMPT_ARGS = {"claude": lambda p: ["-p", p], "codex": lambda p: [p]}


def imported(store: Path, agent: str, scenario: str = "ok_failing_command") -> str:
    proc = cli("import", "--store", str(store), "--json", str(FIXTURES / agent / scenario / "home" / STORE_DIR[agent]))
    assert proc.returncode == 0, proc.stderr
    (item,) = json.loads(proc.stdout)
    return item["session"]


def turns_of(events: list[dict]) -> list[list[dict]]:
    out: list[list[dict]] = []
    for e in events:
        if e["type"] == "turn.started":
            out.append([])
        if out:
            out[-1].append(e)
    return out


def answers(turn: list[dict]) -> list[str]:
    return [e["item"]["text"] for e in turn if e["type"] == "item.completed" and e["item"]["type"] == "agent_message"]


def resume(store: Path, session: str, agent: str, prompt: str, sandbox, *options: str) -> subprocess.CompletedProcess:
    env = sandbox.env()
    env["PATH"] = f"{BIN}:{env['PATH']}"  # (the tools as a user has them: on PATH)
    return subprocess.run([*MEMFS, "resume", "--store", str(store), session, "--in", agent, *options, "--",
                           *PROMPT_ARGS[agent](prompt)], env=env, cwd=sandbox.proj, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize("origin, agent", [("claude", "claude"), ("codex", "codex"),
                                           ("codex", "claude"), ("claude", "codex")])
def test_a_resumed_session_gets_the_new_turn_and_keeps_the_old_ones_once(origin, agent, tmp_path):
    """A session captured from ``origin`` resumed in ``agent`` (across agents too: what the export
    had to make up for the other tool does not come back as a second copy)."""
    need_clis()
    store = tmp_path / "store"
    session = imported(store, origin)
    before = events_of(store, session)
    assert len(turns_of(before)) == 1
    script = {"steps": [{"text": "Scripted reply."}, {"text": "Second scripted reply."}]}
    with ModelServer(script, tmp_path / "requests.jsonl") as srv:
        sandbox = AGENTS[agent](tmp_path / "sandbox", srv.url)
        proc = resume(store, session, agent, "next", sandbox)
        assert proc.returncode == 0, (proc.stdout, proc.stderr)
        assert "Scripted reply." in proc.stdout  # the tool's own output, passed through
        first = srv.requests()
        assert first and "Show me the changelog" in json.dumps(first[-1]["body"])  # it resumed the old turn
        after = events_of(store, session)
        assert after[:len(before)] == before  # the old turns once, unchanged
        new = turns_of(after)
        assert len(new) == 2
        assert new[1][0]["context"]["prompt"] == "next"
        assert answers(new[1]) == ["Scripted reply."]
        closes = [e for e in new[1] if e["type"] in ("turn.completed", "turn.failed")]
        assert [e["type"] for e in closes] == ["turn.completed"] and closes[0]["agent"] == agent
        # (Claude Code's transcript then records its bill, cost-state: a thread.completed with the running cost)
        assert all(e["type"] == "thread.completed" for e in new[1][new[1].index(closes[0]) + 1:])
        # again: the tool's store already holds the conversation; resume goes on with it
        proc = resume(store, session, agent, "and again", sandbox)
        assert proc.returncode == 0, (proc.stdout, proc.stderr)
    again = turns_of(events_of(store, session))
    assert [t[0]["context"].get("prompt") for t in again] == ["Show me the changelog", "next", "and again"]
    assert answers(again[2]) == ["Second scripted reply."]
    assert [e for e in events_of(store, session)][:len(after)] == after


def test_resume_of_a_missing_session_or_tool_says_why(tmp_path):
    store = tmp_path / "store"
    session = imported(store, "claude")
    proc = cli("resume", "--store", str(store), "nope", "--in", "claude")
    assert proc.returncode == 1 and "memfs: no session 'nope'" in proc.stderr
    proc = cli("resume", "--store", str(store), session, "--in", "gemini")
    assert proc.returncode == 2 and "argument --in: invalid choice: 'gemini'" in proc.stderr
    env_path = "/nonexistent-bin"
    proc = subprocess.run([*MEMFS, "resume", "--store", str(store), session, "--in", "codex", "--", "hi"],
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": env_path, "HOME": str(tmp_path / "home")})
    assert proc.returncode == 127 and proc.stderr == "memfs: resume: codex: command not found\n"
    assert not (tmp_path / "home").exists()  # nothing exported


@pytest.mark.parametrize("agent", ["claude", "codex"])
def test_a_fork_and_its_source_resumed_side_by_side_each_keep_only_their_own_turns(agent, tmp_path):
    """SPEC §11 "a fork is its own conversation": the fork is exported under an id of its own, so
    the tool continues two files; each session gets back only the turns resumed in it."""
    need_clis()
    store = tmp_path / "store"
    source = imported(store, agent)
    proc = cli("fork", "--store", str(store), source, "fork1")
    assert proc.returncode == 0, proc.stderr
    order = [(source, "src one"), ("fork1", "fork one"), (source, "src two"), ("fork1", "fork two")]
    script = {"steps": [{"text": f"Reply to {prompt}."} for _, prompt in order]}
    with ModelServer(script, tmp_path / "requests.jsonl") as srv:
        sandbox = AGENTS[agent](tmp_path / "sandbox", srv.url)
        for session, prompt in order:
            proc = resume(store, session, agent, prompt, sandbox)
            assert proc.returncode == 0, (session, proc.stdout, proc.stderr)
            assert f"Reply to {prompt}." in proc.stdout
            # the directory the tool runs in is said before it starts
            assert f"memfs resume: {agent} runs in {sandbox.proj.resolve()} (" in proc.stderr
            body = json.dumps(srv.requests()[-1]["body"])
            other = "fork" if session == source else "src"
            assert prompt in body and f"{other} one" not in body  # the tool saw only this session's turns
        for request in srv.requests():
            body = json.dumps(request["body"])
            assert not ("src one" in body and "fork one" in body)
    for session, mine in ((source, ["src one", "src two"]), ("fork1", ["fork one", "fork two"])):
        turns = turns_of(events_of(store, session))
        assert [t[0]["context"].get("prompt") for t in turns] == ["Show me the changelog", *mine], session
        assert [answers(t) for t in turns[1:]] == [[f"Reply to {p}."] for p in mine]
    meta = {s: json.loads((store / s / "index" / "about.json").read_text()) for s in (source, "fork1")}
    assert meta[source]["conversation_id"] != meta["fork1"]["conversation_id"]
    files = sorted(p for p in (sandbox.home / STORE_DIR[agent]).rglob("*.jsonl"))
    assert len([p for p in files if meta["fork1"]["conversation_id"] in p.name]) == 1
    assert len([p for p in files if meta[source]["conversation_id"] in p.name]) == 1
    # the fork's own file, imported on its own, lands in the fork (the map knows its conversation)
    proc = cli("import", "--store", str(store), "--json", str(sandbox.home / STORE_DIR[agent]))
    assert proc.returncode == 0, proc.stderr
    assert sorted(item["session"] for item in json.loads(proc.stdout)) == sorted([source, "fork1"])
    assert len(turns_of(events_of(store, "fork1"))) == 3 and len(turns_of(events_of(store, source))) == 3


def test_a_working_directory_read_from_a_file_is_checked_before_the_tool_runs(tmp_path):
    """``--cwd DIR`` chooses where the tool runs; a directory read back from the tool's own file or
    from the session's metadata is used only when absolute and an existing directory (its real
    path), said before the tool starts, else refused with a one-line reason and nothing run."""
    need_clis()
    store = tmp_path / "store"
    session = imported(store, "claude")
    script = {"steps": [{"text": "First."}, {"text": "Second."}]}
    with ModelServer(script, tmp_path / "requests.jsonl") as srv:
        sandbox = AGENTS["claude"](tmp_path / "sandbox", srv.url)
        other = make_project(tmp_path / "other")
        link = tmp_path / "link"
        link.symlink_to(other)
        proc = resume(store, session, "claude", "one", sandbox, "--cwd", str(link))
        assert proc.returncode == 0, proc.stderr
        assert f"memfs resume: claude runs in {other.resolve()} (--cwd)\n" in proc.stderr  # (its real path)
        [transcript] = (sandbox.home / ".claude" / "projects").rglob(f"*/{session}.jsonl")
        assert transcript.parent.name == slug(str(other.resolve()))
        # the transcript now says the conversation ran in a relative directory: refused, nothing run
        kept = transcript.read_bytes()
        lines = [json.loads(line) for line in kept.decode().splitlines()]
        transcript.write_text("".join(json.dumps({**line, "cwd": "../../.."} if "cwd" in line else line) + "\n"
                                      for line in lines))
        asked = len(srv.requests())
        proc = resume(store, session, "claude", "two", sandbox)
        assert proc.returncode == 1 and proc.stdout == ""
        assert proc.stderr == (f"memfs: resume: the working directory recorded in {transcript} ('../../..') is "
                               "not used: it is not absolute (choose one with --cwd DIR)\n")
        assert len(srv.requests()) == asked and len(turns_of(events_of(store, session))) == 2
        # the user's --cwd decides (the transcript as Claude Code wrote it)
        transcript.write_bytes(kept)
        proc = resume(store, session, "claude", "two", sandbox, "--cwd", str(sandbox.proj))
        assert proc.returncode == 0, proc.stderr
        assert f"memfs resume: claude runs in {sandbox.proj.resolve()} (--cwd)\n" in proc.stderr
        assert [answers(t) for t in turns_of(events_of(store, session))[1:]] == [["First."], ["Second."]]
        for bad, why in [(str(tmp_path / "nowhere"), "it is not a directory here"),
                         (str(tmp_path / "other" / "README.md"), "it is not a directory here"),
                         ("relative/dir\x1b[2J", "it holds control characters")]:
            proc = resume(store, session, "claude", "three", sandbox, "--cwd", bad)
            assert proc.returncode == 1 and why in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr
            assert "\x1b" not in proc.stderr
        # a session whose metadata names a relative cwd: refused before anything is exported
        fresh = imported(tmp_path / "store2", "codex")
        meta_file = tmp_path / "store2" / fresh / "index" / "about.json"
        meta_file.write_text(json.dumps({**json.loads(meta_file.read_text()), "cwd": "../../proj"}))
        proc = resume(tmp_path / "store2", fresh, "claude", "four", sandbox)
        assert proc.returncode == 1
        assert proc.stderr == ("memfs: resume: the working directory the session records ('../../proj') is not "
                               "used: it is not absolute (choose one with --cwd DIR)\n")
        assert not list((sandbox.home / ".claude" / "projects").rglob(f"*/{fresh}.jsonl"))
        assert len(srv.requests()) == asked + 1


def test_cwd_problem_says_why_a_recorded_directory_is_not_used(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    (tmp_path / "file").write_text("x")
    assert cwd_problem(str(real)) is None and checked_cwd(str(tmp_path / "link"), "x") == str(real.resolve())
    for value, why in [(None, "it is not a path"), ("", "it is not a path"), (7, "it is not a path"),
                       ("../../..", "it is not absolute"), ("proj", "it is not absolute"),
                       (f"{real}/../real", "it has a '.' or '..' component"), (f"{real}/.", "it has a '.' or '..'"),
                       (f"{real}\n", "it holds control characters"), (str(tmp_path / "file"), "not a directory here"),
                       (str(tmp_path / "gone"), "it is not a directory here")]:
        assert why in cwd_problem(value), value
        with pytest.raises(ResumeRefused, match="choose one with --cwd DIR"):
            checked_cwd(value, "recorded in f")
