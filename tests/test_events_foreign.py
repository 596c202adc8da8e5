"""Every line the real agent CLIs wrote (the captured fixtures) is refused when written straight
into a log, with a reason naming its format and the command that ingests it (SPEC §2, §10) —
metadata lines included — except Codex ``exec --json``, which is this event family."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from memfs.errors import ValidationError
from memfs.events import parse_line

AGENTS = Path(__file__).parent / "fixtures" / "agents"
POINTERS = {"claude": ("Claude Code", "memfs import"), "codex": ("Codex rollout", "memfs import"),
            "gemini": ("Gemini CLI", "memfs import")}


def captured_files(agent: str) -> list[Path]:
    """The files the CLI wrote (its own store under home/, and the stream it printed), but the
    Codex streams (native) and side files that are not JSON lines."""
    files = sorted(p for p in (AGENTS / agent).rglob("*.jsonl") if p.name != "requests.jsonl")
    if agent == "codex":
        files = [p for p in files if "home" in p.parts]
    return files


@pytest.mark.parametrize("agent", sorted(POINTERS))
def test_every_captured_line_is_refused_with_its_format_and_command(agent):
    files = captured_files(agent)
    assert files, f"no captured {agent} files"
    seen = 0
    for path in files:
        for n, line in enumerate(path.read_bytes().splitlines(), 1):
            if not line.strip():
                continue
            seen += 1
            with pytest.raises(ValidationError) as refused:
                parse_line(line)
            reason = str(refused.value)
            fmt, command = POINTERS[agent]
            assert fmt in reason and command in reason, f"{path.relative_to(AGENTS)}:{n}: {reason}"
    assert seen > 20


def test_the_codex_exec_stream_is_this_family_and_accepted():
    streams = sorted((AGENTS / "codex").glob("*/stream*.jsonl"))
    assert streams
    for path in streams:
        for line in path.read_bytes().splitlines():
            if line.strip():
                parse_line(line)  # never raises


@pytest.mark.parametrize("line, fmt", [
    (b'{"type":"queue-operation","operation":"enqueue","timestamp":"2026-12-03T07:58:56Z","sessionId":"s"}',
     "Claude Code transcript metadata line"),
    (b'{"type":"cost-state","sessionId":"s","totalCostUSD":0.01}', "Claude Code transcript metadata line"),
    (b'{"sessionId":"s","projectHash":"h","startTime":"2026-12-03T07:58:56Z"}', "Gemini CLI chat file line"),
    (b'{"$set":{"lastUpdated":"2026-12-03T07:58:56Z"}}', "Gemini CLI chat file line"),
    (b'{"type":"init","timestamp":"2026-12-03T07:58:56Z","session_id":"s","model":"m"}', "Gemini CLI stream-json"),
])
def test_memfs_append_refuses_a_metadata_line_and_says_what_to_use(tmp_path, line, fmt):
    """As a user would: ``memfs append`` of such a line exits non-zero and says on stderr what
    the line is and which command takes it; nothing is stored."""
    store = tmp_path / "store"
    done = subprocess.run([sys.executable, "-m", "memfs", "append", "--store", str(store), "s1"],
                          input=line + b"\n", capture_output=True, timeout=60)
    assert done.returncode != 0
    err = done.stderr.decode()
    assert fmt in err and "memfs import" in err, err
    log = store / "s1" / "events.jsonl"
    assert not log.exists() or log.read_bytes() == b""


@pytest.mark.parametrize("line", [
    b'{"type":"error","message":"disk full"}',  # this family's error, not Gemini's (no severity, no timestamp)
    b'{"type":"progress","data":1}',  # an unknown event of this family: no Claude field
    b'{"type":"message","text":"hi"}',  # no role, no timestamp
])
def test_this_familys_lines_that_share_a_type_name_are_accepted(line):
    parse_line(line)
