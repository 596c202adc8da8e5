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

from agent_helpers import MEMFS, cli, events_of

sys.path.insert(0, str(Path(__file__).parent / "agents"))
from clis import AGENTS, BIN  # noqa: E402
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


def resume(store: Path, session: str, agent: str, prompt: str, sandbox) -> subprocess.CompletedProcess:
    env = sandbox.env()
    env["PATH"] = f"{BIN}:{env['PATH']}"  # (the tools as a user has them: on PATH)
    return subprocess.run([*MEMFS, "resume", "--store", str(store), session, "--in", agent, "--",
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
        assert new[1][-1]["type"] == "turn.completed"
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
