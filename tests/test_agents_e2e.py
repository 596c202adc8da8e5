"""SPEC §10 end to end with the real CLIs (docs/agents.md): Claude Code, Codex and Gemini CLI,
each run twice under ``memfs record`` against the scripted model server — a turn whose shell
command fails (``cat CHANGELOG.md`` in a project without it), then a resumed second turn —
and then ``memfs import`` of the CLI's own store (its HOME). The user sees ONE session, named
as they named it, with both turns once, the failed command failed with its exit code, the
prompt as the goal, and what the conversation is about in ``memfs sessions --json``.

Needs the CLIs (``bash scripts/install_agents.sh``): skipped with the reason without them,
a failure instead when MEMFS_REQUIRE_AGENTS=1 (tests/test_agents_cli.py's rule)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "agents"))
from clis import AGENTS  # noqa: E402
from clis import run_in_group as run  # noqa: E402
from model_server import ModelServer  # noqa: E402

from mounting import mounted, needs_fuse  # noqa: E402
from test_agents_cli import SHELL, need_clis  # noqa: E402

MEMFS = [sys.executable, "-m", "memfs"]
FIRST, SECOND = "Show me the changelog", "What is the project about?"
ANSWERS = ["There is no CHANGELOG.md.", "It is a tiny demo project."]
FAILED_FACT = re.compile(r"ran .*cat CHANGELOG\.md'? \(exit 1\)")  # Codex's stream: /bin/bash -lc '…'


def stored(agent: str, prompt: str) -> str:
    """The prompt as the agent records it: ``opencode run`` joins its arguments and quotes one
    that holds a space (docs/agents.md), and memfs keeps what the agent recorded."""
    return f'"{prompt}"' if agent == "opencode" and " " in prompt else prompt


def memfs(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*MEMFS, *args], capture_output=True, text=True, timeout=120)


@needs_fuse
@pytest.mark.parametrize("agent", sorted(AGENTS))
def test_record_twice_then_import_the_clis_store_is_one_faithful_session(agent, tmp_path):
    need_clis()
    store = tmp_path / "store"
    script = {"steps": [{"tool": SHELL[agent]}, {"text": ANSWERS[0]}, {"text": ANSWERS[1]}],
              "side": getattr(AGENTS[agent], "side", [])}  # OpenCode's title request
    with ModelServer(script, tmp_path / "requests.jsonl") as server:
        cli = AGENTS[agent](tmp_path / "sandbox", server.url)
        record = [*MEMFS, "record", "--store", str(store), "work", "--"]
        first = run([*record, *cli.argv(FIRST)], cli.proj, cli.env())
        assert first.exit_code == 0, first.stderr.decode(errors="replace")[-3000:]
        conversation = cli.session_id(first)
        second = run([*record, *cli.argv(SECOND, resume=conversation)], cli.proj, cli.env())
        assert second.exit_code == 0, second.stderr.decode(errors="replace")[-3000:]
        assert [r["answer"] for r in server.requests() if r["method"] == "POST" and not r["answer"].startswith("side")] \
            == ["step0", "step1", "step2"]
    assert ANSWERS[0].encode() in first.stdout and ANSWERS[1].encode() in second.stdout  # passed through

    proc = memfs("import", "--store", str(store), "--json", str(cli.home))
    assert proc.returncode == 0, proc.stderr
    reports = json.loads(proc.stdout)
    assert reports and {r["session"] for r in reports} == {"work"}, reports

    proc = memfs("sessions", "--store", str(store), "--json")
    assert proc.returncode == 0, proc.stderr
    (session,) = json.loads(proc.stdout)
    assert session["name"] == "work" and session["turn_count"] == 2, session
    assert (session["agent"], session["conversation_id"]) == (agent, conversation)
    assert session["cwd"] == str(cli.proj) and session["project"] == str(cli.proj)
    title = "Scripted title" if agent == "opencode" else FIRST  # (OpenCode titles a session itself: the side step)
    assert session["model"] and session["title"] == title, session

    with mounted(store, tmp_path / "mnt") as m:
        derived = m.mnt / "sessions" / "work" / "derived"
        memory = json.loads((derived / "memory.json").read_bytes())
        trajectory = [json.loads(line) for line in (derived / "trajectory.jsonl").read_text().splitlines()]
        progress = (derived / "progress.md").read_text()
    facts = [f["fact"] for f in memory["grounded_facts"]]
    (ran,) = [f for f in facts if f.startswith("ran ")]  # the command once, failed
    assert FAILED_FACT.fullmatch(ran), facts
    assert [t["outcome"] for t in trajectory] == ["completed", "completed"]
    (command,) = trajectory[0]["commands"]
    assert "cat CHANGELOG.md" in command["command"] and (command["exit_code"], command["status"]) == (1, "failed")
    assert [facts.count(a) for a in ANSWERS] == [1, 1], facts  # each answer once
    assert f"**Goal:** {stored(agent, SECOND)}\n" in progress  # the latest turn's prompt, which no stream printed
