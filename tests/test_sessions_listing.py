"""Session metadata where users look (SPEC §10 "Session metadata"): ``memfs sessions`` columns,
filters and ``--json``; ``summary.md`` and ``context.md`` beginning with it, through a mount."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import memfs
import pytest
from memfs.store import about
from memfs.store.meta import format_rfc3339

from mounting import event, mounted, needs_fuse, sh

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures"
DAY = 86400

STARTED, CLOSED = event("turn.started"), event("turn.completed", usage={"input_tokens": 3})
THREAD_DONE = event("thread.completed", thread_id="t", session_id="s", subtype="success", outcome_code="completed",
                    usage={}, num_turns=1)
LONG_TITLE = "Make fetch() retry with exponential backoff and jitter, then cover the timeout path with tests"
CLAUDE_ABOUT = {"agent": "claude", "agent_version": "2.1.332", "conversation_id": "3f2a9c1e-0000-4000-8000-00000000c1a0",
                "title": LONG_TITLE, "title_source": "agent", "first_prompt": "Make fetch() retry",
                "cwd": "/home/u/work/memfs/src", "project": "/home/u/work/memfs", "git_branch": "main",
                "model": "claude-sonnet-4-5", "started_at": "2026-01-01T00:00:00Z",
                "ended_at": "2026-01-01T00:05:00Z", "status": "completed", "children": ["claude-1-agent-a1"],
                "pr_link": "https://example.invalid/pr/7"}
CODEX_ABOUT = {"agent": "codex", "agent_version": "0.171.0", "conversation_id": "0199a213-81c0-7800-8aa1-bbab2a035a53",
               "first_prompt": "Fix the\nflaky API test", "cwd": "/srv/api", "project": "/srv/api", "model": "gpt-5",
               "status": "failed"}
GEMINI_ABOUT = {"agent": "gemini", "conversation_id": "gem-1", "cwd": "/home/u/work/memfs/docs",
                "title": "Docs \x1b[31mpass\x1b[0m", "title_source": "agent", "status": "running"}


def make(root: Path, name: str, lines: list[str], *, age_days: float = 0.0, meta: dict | None = None) -> None:
    with memfs.open_session(root, name, durability="write", metadata_interval=0) as h:
        h.append_many(lines)
    if meta is not None:
        about.merge(root / name, meta)
    if age_days:  # an older session: its last activity, as the manifest records it
        path = root / name / "manifest.json"
        m = json.loads(path.read_text())
        m["updated_at"] = format_rfc3339(time.time() - age_days * DAY)
        path.write_text(json.dumps(m))


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("listing") / "store"
    make(root, "vt-native", [event("thread.started", thread_id="t"), STARTED, CLOSED, THREAD_DONE], age_days=3)
    make(root, "codex-exec", (FIXTURES / "codex_exec.jsonl").read_text().splitlines(), age_days=1)
    make(root, "old-claude", [event("thread.started", thread_id="c0", agent="claude-code"), STARTED])  # open turn
    make(root, "left-open", [event("thread.started", thread_id="t"), STARTED, THREAD_DONE], age_days=2)
    make(root, "claude-1", [event("thread.started", thread_id=CLAUDE_ABOUT["conversation_id"], agent="claude"),
                            STARTED, CLOSED], meta=CLAUDE_ABOUT)
    make(root, "codex-1", [STARTED, event("turn.failed", message="boom")], age_days=10, meta=CODEX_ABOUT)
    make(root, "gemini-1", [STARTED, CLOSED], age_days=0.5, meta=GEMINI_ABOUT)
    return root


def memfs_cli(*argv, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "memfs", *map(str, argv)], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, "COLUMNS": "100"}, timeout=60)
    if check:
        assert done.returncode == 0, done.stderr
    return done


def listed(store: Path, *filters) -> dict[str, dict]:
    return {s["name"]: s for s in json.loads(memfs_cli("sessions", "--json", "--store", store, *filters).stdout)}


def table(store: Path, *filters) -> tuple[list[str], dict[str, str]]:
    lines = memfs_cli("sessions", "--store", store, *filters).stdout.splitlines()
    return lines, {line.split()[-1]: line for line in lines[1:]}


def test_the_table_shows_agent_project_title_status_and_fits_100_columns(store):
    lines, rows = table(store)
    assert lines[0].split() == ["UPDATED", "AGENT", "PROJECT", "TITLE", "TURNS", "STATUS", "TOKENS", "COST", "SESSION"]
    # dated by their records: claude-1's end on 2026-01-01 (about.json's ended_at), whenever it was captured
    assert list(rows) == ["old-claude", "gemini-1", "codex-exec", "left-open", "vt-native", "codex-1", "claude-1"]
    assert rows["claude-1"].startswith("2026-01-01 00:05")
    assert all(len(line) <= 100 for line in lines), "\n".join(lines)
    cells = {name: line.split()[2:] for name, line in rows.items()}  # past the date and time
    # tokens and cost: derived/usage.json's totals (SPEC §12): 3 input tokens of claude-sonnet-4-5 at $3/M
    assert cells["claude-1"][:2] == ["claude", "memfs"] and cells["claude-1"][-5:] == ["1", "completed", "3",
                                                                                        "<$0.0001", "claude-1"]
    title = rows["claude-1"][lines[0].index("TITLE"):lines[0].index("TURNS")].strip()
    assert title.endswith("…") and LONG_TITLE.startswith(title[:-1]) and len(title) > 16  # cut to fit, not dropped
    assert cells["codex-1"][:5] == ["codex", "api", "Fix", "the", "1"]  # no agent title: the prompt's first line
    assert cells["codex-1"][-4:-1] == ["failed", "0", "$0.00"]  # its failed turn reported no tokens
    assert cells["gemini-1"][:2] == ["gemini", "docs"]  # no project: its cwd
    assert "\x1b" not in rows["gemini-1"] and "Docs \\u001b[31mp" in rows["gemini-1"]  # never an escape sequence
    # sessions without about.json: the agent from the log (claude-code read as claude), status from the manifest
    assert cells["old-claude"][:5] == ["claude", "-", "-", "0", "running"]  # a turn open
    assert cells["codex-exec"][:5] == ["codex", "-", "-", "2", "completed"]  # active, idle
    assert cells["left-open"][:5] == ["vtcode", "-", "-", "0", "abandoned"]
    assert cells["vt-native"][:5] == ["vtcode", "-", "-", "1", "completed"]


def test_json_carries_every_about_field_and_the_listing_fields(store):
    s = listed(store)
    claude = s["claude-1"]
    assert {k: claude[k] for k in CLAUDE_ABOUT} == CLAUDE_ABOUT
    assert (claude["turn_count"], claude["event_count"], claude["manifest_status"]) == (1, 3, "active")
    assert claude["thread_id"] == CLAUDE_ABOUT["conversation_id"] and claude["live"] is False
    assert (claude["tokens"], claude["cost_usd"]) == (3, 0.000009)  # 3 input tokens at $3/M (SPEC §12)
    assert (s["codex-1"]["status"], s["codex-1"]["title"], s["codex-1"]["title_source"]) == (
        "failed", "Fix the", "prompt")
    assert s["gemini-1"]["title"] == GEMINI_ABOUT["title"]  # JSON keeps the value as recorded
    native = s["old-claude"]
    assert (native["agent"], native["thread_id"], native["status"], native["manifest_status"]) == (
        "claude", "c0", "running", "active")
    assert "project" not in native and "title" not in native


@pytest.mark.parametrize(("flags", "names"), [
    (["--agent", "claude"], {"claude-1", "old-claude"}),
    (["--agent", "claude-code"], {"claude-1", "old-claude"}),
    (["--agent", "codex"], {"codex-1", "codex-exec"}),
    (["--agent", "gemini"], {"gemini-1"}),
    (["--agent", "vtcode"], {"vt-native", "left-open"}),
    (["--project", "memfs"], {"claude-1"}),  # the project's basename
    (["--project", "/home/u/work/memfs"], {"claude-1", "gemini-1"}),  # its path; a cwd under it
    (["--project", "/home/u/work/memfs/docs/"], {"gemini-1"}),
    (["--project", "/srv/api"], {"codex-1"}),
    (["--project", "/srv/ap"], set()),
    (["--status", "running"], {"old-claude", "gemini-1"}),
    (["--status", "completed"], {"claude-1", "codex-exec", "vt-native"}),
    (["--status", "failed"], {"codex-1"}),
    (["--status", "abandoned"], {"left-open"}),
    # claude-1's records ended on 2026-01-01: never "since" a recent time, though captured today
    (["--since", "7d"], {"old-claude", "gemini-1", "codex-exec", "left-open", "vt-native"}),
    (["--since", "36h"], {"old-claude", "gemini-1", "codex-exec"}),
    (["--since", time.strftime("%Y-%m-%d", time.gmtime(time.time() - 5 * DAY))],
     {"old-claude", "gemini-1", "codex-exec", "left-open", "vt-native"}),
    (["--since", "2026-01-01T00:04:00Z"], {"claude-1", "old-claude", "gemini-1", "codex-exec", "left-open",
                                            "vt-native", "codex-1"}),
    (["--agent", "codex", "--status", "failed", "--since", "30d"], {"codex-1"}),
])
def test_filters(store, flags, names):
    assert set(listed(store, *flags)) == names
    lines, rows = table(store, *flags)
    assert set(rows) == names
    if not names:
        assert lines == [f"none of the 7 sessions in {store} match"]


def test_a_relative_project_is_a_directory_a_session_ran_under(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    make(tmp_path / "store", "here", [STARTED, CLOSED], meta={"agent": "codex", "cwd": str(work / "pkg")})
    make(tmp_path / "store", "elsewhere", [STARTED, CLOSED], meta={"agent": "codex", "cwd": str(tmp_path / "pkg")})
    done = subprocess.run([sys.executable, "-m", "memfs", "sessions", "--json", "--store", str(tmp_path / "store"),
                           "--project", "."], capture_output=True, text=True, cwd=work, timeout=60)
    assert done.returncode == 0, done.stderr
    assert [s["name"] for s in json.loads(done.stdout)] == ["here"]


def test_bad_filters_are_refused_with_a_reason(store):
    done = memfs_cli("sessions", "--store", store, "--since", "last tuesday", check=False)
    assert done.returncode == 2 and "--since" in done.stderr and "7d" in done.stderr
    done = memfs_cli("sessions", "--store", store, "--status", "active", check=False)
    assert done.returncode == 2 and "running" in done.stderr


# --- summary.md and context.md begin with it ------------------------------------------------


@needs_fuse
def test_summary_and_context_begin_with_the_metadata_and_follow_its_changes(tmp_path):
    store = tmp_path / "store"
    with mounted(store, tmp_path / "mnt") as m:
        s = m.mnt / "sessions" / "conv-1"
        os.mkdir(s)
        with open(s / "events.jsonl", "a") as f:
            f.write("\n".join([event("thread.started", thread_id="conv-1", agent="claude"), STARTED,
                               event("item.completed", item={"id": "m1", "type": "agent_message", "text": "Done."}),
                               CLOSED]) + "\n")
        before = sh("cat derived/summary.md", s).stdout
        assert before.startswith("# Session conv-1\n\n- **Status:**")  # no metadata: no block

        about.merge(store / "conv-1", {**CLAUDE_ABOUT, "parent_session": "conv-0"})
        summary = sh("cat derived/summary.md", s).stdout
        head = summary.split("\n\n")[1].splitlines()
        assert head == [
            f"**Title:** {LONG_TITLE}",
            "**Agent:** claude 2.1.332, model claude-sonnet-4-5",
            "**Project:** /home/u/work/memfs, branch main",
            "**Cwd:** /home/u/work/memfs/src",
            "**First prompt:** Make fetch() retry",
            "**Run:** completed, started 2026-01-01T00:00:00Z, ended 2026-01-01T00:05:00Z",
            "**Parent session:** conv-0",
            "**Sub-agents:** claude-1-agent-a1",
        ]
        assert summary.split("\n\n", 2)[2] == before.split("\n\n", 1)[1]  # then what it said before
        context = sh("cat derived/context.md", s).stdout
        assert context.startswith("# Context: session conv-1\n\n" + "\n".join(head) + "\n**Goal:**")
        assert int(sh("wc -c < derived/summary.md", s).stdout) == len(summary.encode())

        about.merge(store / "conv-1", {"model": "claude-opus-4", "status": "failed"})  # the log is unchanged
        for view in ("summary.md", "context.md"):
            text = sh(f"cat derived/{view}", s).stdout
            assert "**Agent:** claude 2.1.332, model claude-opus-4\n" in text, text
            assert "**Run:** failed, started" in text


def test_a_symlinked_or_fifo_about_json_is_never_read(tmp_path):
    root = tmp_path / "store"
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"title": "the private title", "agent": "codex"}))
    make(root, "linked", [STARTED, CLOSED])
    make(root, "fifo", [STARTED, CLOSED])
    (root / "linked" / "index" / "about.json").symlink_to(secret)
    os.mkfifo(root / "fifo" / "index" / "about.json")
    s = listed(root)  # a FIFO would block the listing if it were opened for a read
    assert "title" not in s["linked"] and s["linked"]["agent"] == "unknown" and "title" not in s["fifo"]
    summary = memfs_cli("show", "linked", "--view", "summary.md", "--store", root).stdout
    assert "private" not in summary and "**Title:**" not in summary
