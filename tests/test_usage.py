"""Usage and cost (SPEC §12): ``derived/usage.json`` per session, ``memfs usage``, the tokens and
cost columns of ``memfs sessions``, and the mount's ``usage/`` files.

The captured sessions are the real CLIs' own files (``tests/fixtures/agents/<agent>/
resume_two_turns``: a first run with a shell command, then a resumed run), imported with
``memfs import`` as a user runs it. Their expected numbers were checked by hand against the raw
files, as each comment says; the scripted model server answered each request with the usage in
``capture.json``'s script (1000/20, 1100/25, 1200/30 input/output tokens, no cache).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import memfs
import pytest
from memfs.usage import report, session_usage

from agent_helpers import MEMFS, cli
from mounting import event, mounted, needs_fuse
from store_helpers import wait_until

AGENTS = Path(__file__).parent / "fixtures" / "agents"
CLAUDE_SID = "78127aec-e908-4904-8d47-2d86e43e50f3"  # claude/resume_two_turns/capture.json session_id
CODEX_SID = "01a23aea-0f3b-7842-be12-c9694eec882e"  # codex: the rollout's session_meta id
GEMINI_SID = "9d58201d-6652-4a64-9d7f-8a85a2a0b0a9"  # gemini: the chat files' sessionId


def run(*args: str) -> str:
    proc = cli(*args)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def import_all(store: Path, agent: str, scenario: str = "resume_two_turns") -> None:
    """Both captures of the conversation: the stdout streams and the CLI's own store."""
    src = AGENTS / agent / scenario
    run("import", "--store", str(store), *map(str, sorted(src.glob("stream*.jsonl"))), str(src / "home"))


def usage(store: Path, session: str) -> dict:
    with memfs.open_session(store, session, read_only=True) as h:
        return session_usage(h)


def per_turn(doc: dict) -> list[tuple]:
    return [(t["tokens"]["input"], t["tokens"]["output"], t["cost_usd"]) for t in doc["turns"]]


def native(store: Path, name: str, *events: str) -> None:
    """``memfs append`` of native events to session ``name`` (created when new)."""
    proc = subprocess.run([*MEMFS, "append", "--store", str(store), name, "-"], input="".join(e + "\n" for e in events),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


# --- captured sessions, checked by hand --------------------------------------------------------


def test_codex_cumulative_counts_are_differenced_and_the_rollout_adds_nothing(tmp_path):
    store = tmp_path / "store"
    import_all(store, "codex")
    doc = usage(store, CODEX_SID)
    # stream.1.jsonl's turn.completed says 2100/45 (1000+1100 input, 20+25 output: two requests);
    # stream.2.jsonl (the resumed run) says 3300/75, the thread's running total: its own is 1200/30.
    # Cost at gpt-5.5's $5 / $30 per million: 2100*5+45*30 = $0.01185; 1200*5+30*30 = $0.0069.
    assert per_turn(doc) == [(2100, 45, 0.01185), (1200, 30, 0.0069)]
    assert doc["total"]["tokens"] == {"input": 3300, "cached_input": 0, "cache_creation": 0, "output": 75,
                                      "reasoning": 0, "total": 3375}  # = the rollout's last total_token_usage
    assert doc["total"]["cost_usd"] == 0.01875 and doc["total"]["agent_cost_usd"] is None
    assert doc["model"] == "gpt-5.5" and doc["prices"]["name"] == "memfs-prices" and doc["prices"]["date"]
    # the first run's `ls` (exec_command_end in the rollout), once however many captures carry it
    assert doc["turns"][0]["tools"] == {"command_execution": {"count": 1, "failures": 0, "median_ms": None}}
    assert [d["day"] for d in doc["days"]] == ["2026-12-03"]  # the rollout's session_meta timestamp (UTC)


def test_claude_usage_and_its_own_reported_cost_beside_the_computed_one(tmp_path):
    store = tmp_path / "store"
    import_all(store, "claude")
    doc = usage(store, CLAUDE_SID)
    # stream.1.jsonl's result: usage 2100/45, total_cost_usd 0.0093; stream.2.jsonl's result: usage
    # 1200/30, total_cost_usd 0.0147 — the conversation's running cost (its modelUsage says 3300/75).
    # Opus 5.5 at $4 / $20: 2100*4+45*20 = $0.0093 and 1200*4+30*20 = $0.0054, as Claude computed.
    assert per_turn(doc) == [(2100, 45, 0.0093), (1200, 30, 0.0054)]
    assert [t["agent_cost_usd"] for t in doc["turns"]] == [0.0093, 0.0054]
    assert doc["total"]["cost_usd"] == 0.0147 and doc["total"]["agent_cost_usd"] == 0.0147
    assert doc["turns"][0]["model"] == "claude-opus-5-5"


def test_claude_lines_of_one_api_message_are_counted_once(tmp_path):
    store = tmp_path / "store"
    src = AGENTS / "claude" / "tasks"
    sid = json.loads((src / "capture.json").read_text())["session_id"]
    run("import", "--store", str(store), str(src / "home"))
    # msg_0332000006 and msg_0332000013 are each two assistant lines in the transcript; the CLI's own
    # total (its cost-state line and stream.jsonl's result) is 6000 input, 150 output.
    tokens = usage(store, sid)["total"]["tokens"]
    assert (tokens["input"], tokens["output"]) == (6000, 150)


def test_gemini_usage_from_the_chat_files_and_the_stream(tmp_path):
    store = tmp_path / "store"
    import_all(store, "gemini")
    doc = usage(store, GEMINI_SID)
    # stream.1.jsonl's result stats: 2100/45; stream.2.jsonl's: 1200/30 (the chat files' gemini
    # records carry the same per request). gemini-2.5-pro at $1.25 / $10: $0.003075 and $0.0018.
    assert per_turn(doc) == [(2100, 45, 0.003075), (1200, 30, 0.0018)]
    # the chat file's own record of the first turn (it is the final record: ingest.identity's
    # ``final`` note): its user message at 07:59:58.649Z, its last record at 07:59:58.912Z
    assert doc["turns"][0]["wall_seconds"] == 0.263


# --- native sessions with known usage ---------------------------------------------------------


def test_a_native_session_tools_durations_wall_time_and_the_day_its_record_gives(tmp_path):
    store = tmp_path / "store"
    native(store, "n1",
           event("turn.started", context={"timestamp": "2026-11-30T23:59:00Z"}),
           event("item.started", item={"id": "c1", "type": "command_execution", "command": "make",
                                       "status": "in_progress", "context": {"timestamp": "2026-11-30T23:59:01Z"}}),
           event("item.completed", item={"id": "c1", "type": "command_execution", "command": "make",
                                         "status": "failed", "exit_code": 2,
                                         "context": {"timestamp": "2026-11-30T23:59:04.5Z"}}),
           event("item.completed", item={"id": "c2", "type": "command_execution", "command": "make",
                                         "status": "completed", "exit_code": 0, "duration_ms": 1500}),
           event("item.completed", item={"id": "m1", "type": "mcp_tool_call", "server": "notes", "tool": "find",
                                         "status": "failed", "error": {"message": "down"}}),
           event("turn.completed", model="gpt-5", completed_at="2026-12-01T00:00:30Z",
                 usage={"input_tokens": 1_000_000, "cached_input_tokens": 400_000, "output_tokens": 100_000,
                        "reasoning_output_tokens": 30_000}))
    doc = usage(store, "n1")
    (turn,) = doc["turns"]
    assert turn["day"] == "2026-12-01" and turn["wall_seconds"] == 90.0  # closed after midnight UTC
    assert turn["tools"] == {"command_execution": {"count": 2, "failures": 1, "median_ms": 2500.0},
                             "notes.find": {"count": 1, "failures": 1, "median_ms": None}}
    # input counts the cached tokens (OpenAI's convention): 600k fresh + 400k cached;
    # gpt-5: 0.6*1.25 + 0.4*0.125 + 0.1*10 = $1.80
    assert turn["tokens"] == {"input": 600_000, "cached_input": 400_000, "cache_creation": 0, "output": 100_000,
                              "reasoning": 30_000, "total": 1_100_000}
    assert turn["cost_usd"] == 1.8


def test_a_model_without_a_price_shows_tokens_and_a_null_cost_with_a_reason(tmp_path):
    store = tmp_path / "store"
    native(store, "n2", event("turn.started"),
           event("turn.completed", model="acme-coder-1", usage={"input_tokens": 500, "output_tokens": 5}),
           event("turn.started"),
           event("turn.completed", model="gpt-5", usage={"input_tokens": 1000, "output_tokens": 10}))
    doc = usage(store, "n2")
    first = doc["turns"][0]
    assert first["tokens"]["input"] == 500 and first["cost_usd"] is None
    assert "no price for model 'acme-coder-1'" in first["cost_reason"]
    assert doc["turns"][1]["cost_usd"] == 0.00135  # 1000*1.25 + 10*10 per million
    assert doc["total"]["cost_usd"] is None and "acme-coder-1" in doc["total"]["cost_reason"]  # never a partial sum
    # a known model whose cache-read rate the table lacks (Opus 5.5), with cache reads: no cost either
    native(store, "n3", event("turn.started"),
           event("turn.completed", model="claude-opus-5-5", usage={"input_tokens": 10, "cached_input_tokens": 90}))
    assert usage(store, "n3")["turns"][0]["cost_usd"] is None
    # past a long-context tier the per-request sizes decide the rate: no cost
    native(store, "n4", event("turn.started"),
           event("turn.completed", model="gpt-5.5", usage={"input_tokens": 300_000, "output_tokens": 1}))
    assert "long-context" in usage(store, "n4")["turns"][0]["cost_reason"]


# --- memfs usage and memfs sessions ------------------------------------------------------------


def test_memfs_usage_table_json_groupings_since_and_config_prices(tmp_path):
    store = tmp_path / "store"
    for agent in ("claude", "codex", "gemini"):
        import_all(store, agent)
    native(store, "old", event("turn.started"),
           event("turn.completed", model="acme-coder-1", completed_at="2025-01-02T03:04:05Z",
                 usage={"input_tokens": 7, "output_tokens": 3}))
    doc = json.loads(run("usage", "--store", str(store), "--by", "agent", "--json"))
    same = ("agent", "sessions", "turns", "tokens", "cost_usd")  # the mount's usage/ and MCP's report: same sums
    assert [{k: r[k] for k in same} for r in doc["rows"]] == [{k: r[k] for k in same} for r in report(store, "agent")["rows"]]
    by_agent = {r["agent"]: (r["turns"], r["tokens"]["total"], r["cost_usd"]) for r in doc["rows"]}
    assert by_agent == {"claude": (2, 3375, 0.0147), "codex": (2, 3375, 0.01875), "gemini": (2, 3375, 0.004875),
                        "unknown": (1, 10, None)}  # a native writer that names no agent
    assert doc["totals"]["cost_usd"] is None and doc["totals"]["tokens"]["total"] == 3 * 3375 + 10
    since = json.loads(run("usage", "--store", str(store), "--since", "2026-01-01", "--json"))
    assert [r["day"] for r in since["rows"]] == ["2026-12-03"] and since["totals"]["cost_usd"] == 0.038325
    text = run("usage", "--store", str(store), "--by", "model")
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["MODEL", "SESSIONS", "TURNS"] and lines[5].startswith("TOTAL")
    assert "$0.02" in text and "acme-coder-1" in text and "memfs-prices" in text
    config = tmp_path / "memfs.toml"
    config.write_text('[prices."acme-coder-1"]\ninput = 1000.0\noutput = 1000.0\n')
    priced = json.loads(run("usage", "--store", str(store), "--config", str(config), "--by", "model", "--json"))
    assert {r["model"]: r["cost_usd"] for r in priced["rows"]}["acme-coder-1"] == 0.01  # 10 tokens at $1000/M
    assert priced["prices"]["overrides"] == {"acme-coder-1": {"input": 1000.0, "output": 1000.0}}
    bad = tmp_path / "bad.toml"
    bad.write_text('[prices."x"]\ninput = -1\n')
    proc = cli("usage", "--store", str(store), "--config", str(bad))
    assert proc.returncode == 1 and "prices.'x'.input" in proc.stderr


def test_memfs_sessions_shows_tokens_and_cost_and_usage_follows_an_append(tmp_path):
    store = tmp_path / "store"
    import_all(store, "codex")
    native(store, "n5", event("turn.started"), event("turn.completed", model="gpt-5", usage={"input_tokens": 800}))
    rows = {line.split()[-1]: line for line in run("sessions", "--store", str(store)).splitlines()[1:]}
    assert "3,375" in rows[CODEX_SID] and "$0.02" in rows[CODEX_SID]
    assert " 800 " in rows["n5"] and "$0.0010" in rows["n5"]
    listed = {s["name"]: (s["tokens"], s["cost_usd"]) for s in json.loads(run("sessions", "--store", str(store),
                                                                              "--json"))}
    assert listed == {CODEX_SID: (3375, 0.01875), "n5": (800, 0.001)}
    assert (store / "n5" / "derived" / "usage.json").exists()  # kept: the next listing reads one small file
    native(store, "n5", event("turn.started"), event("turn.completed", model="gpt-5", usage={"input_tokens": 200}))
    listed = {s["name"]: s["tokens"] for s in json.loads(run("sessions", "--store", str(store), "--json"))}
    assert listed["n5"] == 1000  # the stored copy was stale (the log grew): computed again


# --- the mount -----------------------------------------------------------------------------------


@needs_fuse
def test_the_mount_usage_files_follow_appends_and_render_markdown(tmp_path):
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    import_all(store, "gemini")
    with mounted(store, mnt):
        usage_dir = mnt / "usage"
        assert sorted(os.listdir(usage_dir)) == sorted(f"{s}.{e}" for s in ("daily", "by-model", "by-project",
                                                                           "by-agent") for e in ("json", "md"))
        daily = json.loads((usage_dir / "daily.json").read_text())
        assert daily["totals"]["tokens"]["total"] == 3375 and daily["totals"]["cost_usd"] == 0.004875
        (mnt / "sessions" / "live").mkdir()
        with open(mnt / "sessions" / "live" / "events.jsonl", "a") as f:
            f.write(event("turn.started", context={"timestamp": "2026-12-04T10:00:00Z"}) + "\n")
            f.write(event("turn.completed", model="gpt-5", completed_at="2026-12-04T10:00:02Z",
                          usage={"input_tokens": 4000, "output_tokens": 100}) + "\n")
        daily = json.loads((usage_dir / "daily.json").read_text())  # right after the append: no waiting
        assert [(r["day"], r["tokens"]["total"]) for r in daily["rows"]] == [("2026-12-03", 3375),
                                                                             ("2026-12-04", 4100)]
        assert daily["totals"]["cost_usd"] == round(0.004875 + 0.006, 6)  # 4000*1.25 + 100*10 per million
        md = (usage_dir / "by-model.md").read_text()
        assert md.startswith("# Usage by model") and "| gpt-5 | 1 | 1 | 4,000 | 100 |" in md
        assert "| TOTAL | 2 | 3 |" in md
        stat = os.stat(usage_dir / "daily.json")
        assert stat.st_size == len((usage_dir / "daily.json").read_bytes())
        # another process appends to the store directly: a sweep finds it
        native(store, "other", event("turn.started"),
               event("turn.completed", model="gpt-5", completed_at="2026-12-05T00:00:00Z",
                     usage={"input_tokens": 10}))
        wait_until(lambda: "2026-12-05" in (usage_dir / "daily.json").read_text(), "the change feed had the session")
        # …and appends a turn to it: that session alone is read again, from the catalog's change feed
        native(store, "other", event("turn.started"),
               event("turn.completed", model="gpt-5", completed_at="2026-12-06T00:00:00Z",
                     usage={"input_tokens": 20}))
        wait_until(lambda: "2026-12-06" in (usage_dir / "daily.json").read_text(), "the change feed had the append",
                   timeout=10)
        daily = json.loads((usage_dir / "daily.json").read_text())
        assert [(r["day"], r["tokens"]["total"]) for r in daily["rows"]][-2:] == [("2026-12-05", 10), ("2026-12-06", 20)]
        mtime = os.stat(usage_dir / "daily.json").st_mtime_ns
        shutil.rmtree(store / "other")  # …and removes it: its rows go from the sums
        wait_until(lambda: "2026-12-05" not in (usage_dir / "daily.json").read_text(), "the change feed had the removal",
                   timeout=10)
        assert os.stat(usage_dir / "daily.json").st_mtime_ns > mtime
        # the session's own view is kept on disk by the views' write-behind
        wait_until(lambda: (store / "live" / "derived" / "usage.json").exists(), "derived/usage.json was written")


@needs_fuse
def test_two_mounts_of_one_store_both_follow_another_process(tmp_path):
    store = tmp_path / "store"
    native(store, "a", event("turn.started"), event("turn.completed", model="gpt-5", usage={"input_tokens": 100}))
    with mounted(store, tmp_path / "m1"), mounted(store, tmp_path / "m2", "--read-only"):
        files = [tmp_path / m / "usage" / "daily.json" for m in ("m1", "m2")]

        def totals() -> list[int]:
            return [json.loads(f.read_text())["totals"]["tokens"]["total"] for f in files]

        assert totals() == [100, 100]
        for want, more in ((110, 10), (111, 1)):  # (each mount renders again after the other did)
            native(store, "a", event("turn.started"),
                   event("turn.completed", model="gpt-5", usage={"input_tokens": more}))
            wait_until(lambda w=want: totals() == [w, w], f"both mounts showed {want}", timeout=10)


@pytest.mark.parametrize("by", ["nonsense"])
def test_an_unknown_grouping_is_refused(tmp_path, by):
    store = tmp_path / "store"
    store.mkdir()
    proc = cli("usage", "--store", str(store), "--by", by)
    assert proc.returncode == 2 and "invalid choice" in proc.stderr
    with pytest.raises(ValueError, match="--by must be one of"):
        report(store, by)


def test_reasoning_tokens_are_part_of_output_and_cumulative_totals_are_differenced(tmp_path):
    from memfs.agents.codex import shapes as codex_shapes
    from memfs.agents.gemini import shapes as gemini_shapes

    # what the translators keep of the agents' counters: Codex reasoning_output_tokens; Gemini thoughts
    assert codex_shapes.usage_of({"input_tokens": 9, "output_tokens": 5, "reasoning_output_tokens": 3}) == {
        "input_tokens": 9, "output_tokens": 5, "reasoning_output_tokens": 3}
    assert gemini_shapes.usage_of({"input": 9, "cached": 2, "output": 5, "thoughts": 7}) == {
        "input_tokens": 9, "cached_input_tokens": 2, "output_tokens": 12, "reasoning_output_tokens": 7}
    store = tmp_path / "store"
    # a rollout's closes carry the thread's running total as thread_usage; an exec --json stream's
    # turn.completed has only the running total as usage (the second turn: its 250/30/10)
    native(store, "n6", event("turn.started"),
           event("turn.completed", model="gpt-5", usage={"input_tokens": 100, "output_tokens": 10,
                                                         "reasoning_output_tokens": 4},
                 thread_usage={"input_tokens": 100, "output_tokens": 10, "reasoning_output_tokens": 4}),
           event("turn.started"),
           event("turn.completed", model="gpt-5", usage={"input_tokens": 150, "output_tokens": 20},
                 thread_usage={"input_tokens": 250, "output_tokens": 30, "reasoning_output_tokens": 10}))
    doc = usage(store, "n6")
    assert [(t["tokens"]["input"], t["tokens"]["output"], t["tokens"]["reasoning"]) for t in doc["turns"]] == [
        (100, 10, 4), (150, 20, 6)]
    assert doc["total"]["tokens"]["reasoning"] == 10


def test_the_kept_contributions_are_checked_session_by_session(tmp_path):
    store = tmp_path / "store"
    native(store, "a", event("turn.started"), event("turn.completed", model="gpt-5", usage={"input_tokens": 100}))
    native(store, "b", event("turn.started"), event("turn.completed", model="gpt-5", usage={"input_tokens": 10}))
    first = json.loads(run("usage", "--store", str(store), "--by", "session", "--json"))
    assert (store / ".memfs" / "catalog.sqlite").exists()  # the contributions are kept in the store catalog
    assert [(r["session"], r["tokens"]["total"]) for r in first["rows"]] == [("a", 100), ("b", 10)]
    native(store, "b", event("turn.started"), event("turn.completed", model="gpt-5", usage={"input_tokens": 1000}))
    again = json.loads(run("usage", "--store", str(store), "--by", "session", "--json"))
    assert [(r["session"], r["tokens"]["total"]) for r in again["rows"]] == [("b", 1010), ("a", 100)]
    assert [s["name"] for s in json.loads(run("sessions", "--store", str(store), "--json"))] == ["b", "a"]


@needs_fuse
def test_a_read_only_mount_shows_usage_and_writes_nothing(tmp_path):
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    native(store, "a", event("turn.started"), event("turn.completed", model="gpt-5", usage={"input_tokens": 100}))
    with mounted(store, mnt, "--read-only"):
        daily = json.loads((mnt / "usage" / "daily.json").read_text())
        assert daily["totals"]["tokens"]["total"] == 100
        assert (mnt / "usage" / "by-agent.md").read_text().startswith("# Usage by agent")
    assert not (store / ".usage-index.json").exists() and not (store / "a" / "derived" / "usage.json").exists()
