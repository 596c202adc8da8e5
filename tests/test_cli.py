"""The command line (SPEC §8) and the configuration file."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import memfs
import pytest
from memfs import cli
from memfs.cli.common import ProgressBar
from memfs.config import Config, ConfigError, apply_overrides, load_config
from memfs.store.meta import format_rfc3339

from mounting import cleanup, is_mounted, needs_fuse, start

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures"
PYTHON = sys.executable


def ev(type_: str, **fields) -> str:
    return json.dumps({"schema_version": "0.18.0", "event": {"type": type_, **fields}})


GOOD = [ev("thread.started", thread_id="t"), ev("turn.started"),
        ev("item.completed", item={"id": "m", "type": "agent_message", "text": "retry loop added"}),
        ev("turn.completed", usage={"input_tokens": 5})]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def make(root: Path, name: str, lines=GOOD, *, age_days: float = 0.0, completed: bool = False) -> Path:
    with memfs.open_session(root, name, durability="write", metadata_interval=0) as h:
        h.append_many(lines)
        if completed:
            h.append(ev("thread.completed", thread_id="t", session_id=name, subtype="success",
                        outcome_code="completed", usage={}, num_turns=1))
    if age_days:
        path = root / name / "manifest.json"
        m = json.loads(path.read_text())
        m["updated_at"] = format_rfc3339(time.time() - age_days * 86400)
        path.write_text(json.dumps(m))
    return root / name


# --- help and usage ----------------------------------------------------------------------

COMMANDS = [["mount"], ["umount"], ["sessions"], ["show"], ["append"], ["search"], ["gc"], ["pin"],
            ["unpin"], ["pack"], ["pack", "create"], ["pack", "verify"], ["migrate"], ["fsck"]]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_subcommand_has_help(capsys, command):
    code, out, _ = run(capsys, *command, "--help")
    assert code == 0
    assert out.startswith("usage: memfs " + " ".join(command))
    if command not in (["pack"],):
        assert "--store" in out and "--workspace" in out


def test_top_level_help_lists_the_commands(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0
    for name in ("mount", "umount", "sessions", "show", "append", "search", "gc", "pack", "migrate", "fsck"):
        assert name in out


def test_usage_errors_exit_2(capsys):
    assert run(capsys)[0] == 2
    assert run(capsys, "frobnicate")[0] == 2
    assert run(capsys, "pack")[0] == 2
    assert run(capsys, "sessions", "--store", "a", "--workspace", "b")[0] == 2
    code, _, err = run(capsys, "mount")
    assert code == 2 and "MOUNTPOINT" in err


def test_python_dash_m_runs_the_cli(store):
    store.mkdir()
    done = subprocess.run([PYTHON, "-m", "memfs", "sessions", "--json", "--store", str(store)],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0 and json.loads(done.stdout) == []
    done = subprocess.run([PYTHON, "-m", "memfs", "show", "nope", "--store", str(store)],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 1
    assert done.stderr.startswith("memfs: ") and len(done.stderr.strip().splitlines()) == 1


# --- sessions and show -------------------------------------------------------------------


def test_sessions_human_and_json(capsys, store):
    make(store, "older", age_days=2, completed=True)
    make(store, "newer")
    code, out, _ = run(capsys, "sessions", "--store", store)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["UPDATED", "AGENT", "PROJECT", "TITLE", "TURNS", "STATUS", "TOKENS", "COST", "SESSION"]
    # tokens from derived/usage.json (SPEC §12); no cost: the log names no model
    assert lines[1].split()[2:] == ["unknown", "-", "-", "1", "completed", "5", "-", "newer"]  # active, idle
    assert lines[2].split()[2:] == ["vtcode", "-", "-", "1", "completed", "5", "-", "older"]
    code, out, _ = run(capsys, "sessions", "--json", "--store", store)
    listed = json.loads(out)
    assert [s["name"] for s in listed] == ["newer", "older"]
    assert listed[1]["status"] == "completed" and listed[1]["turn_count"] == 1 and listed[1]["live"] is False
    assert (listed[0]["status"], listed[0]["manifest_status"]) == ("completed", "active")
    assert (listed[1]["agent"], listed[1]["thread_id"]) == ("vtcode", "t")  # thread.completed: VT Code's


def test_sessions_json_names_the_agent_and_thread_of_a_codex_stream(capsys, store):
    with memfs.open_session(store, "codex-run") as handle:
        handle.append_many((FIXTURES / "codex_exec.jsonl").read_bytes().splitlines())
    code, out, _ = run(capsys, "sessions", "--json", "--store", store)
    [listed] = json.loads(out)
    assert (listed["agent"], listed["thread_id"]) == ("codex", "0199a213-81c0-7800-8aa1-bbab2a035a53")
    code, out, _ = run(capsys, "sessions", "--store", store)
    assert out.splitlines()[1].split()[2] == "codex"


def test_sessions_of_a_workspace(capsys, tmp_path):
    make(tmp_path / "ws" / ".vtcode" / "sessions", "s")
    code, out, _ = run(capsys, "sessions", "--json", "--workspace", tmp_path / "ws")
    assert code == 0 and [s["name"] for s in json.loads(out)] == ["s"]


def test_sessions_of_an_empty_store(capsys, store):
    store.mkdir()
    code, out, _ = run(capsys, "sessions", "--store", store)
    assert code == 0 and "no sessions" in out


def test_show_summary_turn_and_json(capsys, store):
    make(store, "s")
    code, out, _ = run(capsys, "show", "s", "--store", store)
    assert code == 0
    assert "status    active" in out and "events    4" in out and "completed" in out
    code, out, _ = run(capsys, "show", "s", "--json", "--store", store)
    shown = json.loads(out)
    assert shown["manifest"]["event_count"] == 4 and shown["turns"][0]["turn_number"] == 1
    assert shown["rejected"] == 0 and shown["pin"] is None and shown["live"] is False
    code, out, _ = run(capsys, "show", "s", "--turn", "1", "--store", store)
    assert code == 0
    assert [json.loads(line)["type"] for line in out.splitlines()] == ["turn.started", "item.completed",
                                                                        "turn.completed"]
    code, out, _ = run(capsys, "show", "s", "--turn", "1", "--json", "--store", store)
    assert json.loads(out)["outcome"] == "completed"
    code, _, err = run(capsys, "show", "s", "--turn", "7", "--store", store)
    assert code == 1 and err.startswith("memfs: turn 7 not found")


def test_show_a_view(capsys, store):
    make(store, "s")
    code, out, _ = run(capsys, "show", "s", "--view", "memory.json", "--store", store)
    assert code == 0
    assert json.loads(out)["summary"] == "retry loop added"
    code, _, err = run(capsys, "show", "s", "--view", "nope.txt", "--store", store)
    assert code == 1 and err.startswith("memfs: ")


def test_show_of_an_unknown_session_fails_in_one_line(capsys, store):
    store.mkdir()
    code, out, err = run(capsys, "show", "ghost", "--store", store)
    assert code == 1 and out == "" and err.count("\n") == 1 and "ghost" in err


# --- append ------------------------------------------------------------------------------


def test_append_from_a_file(capsys, store, tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(GOOD) + "\n")
    code, out, _ = run(capsys, "append", "fresh", source, "--store", store)
    assert code == 0 and out.strip() == "appended 4 lines to fresh"
    with memfs.open_session(store, "fresh", read_only=True) as h:
        assert h.manifest["event_count"] == 4 and h.manifest["turn_count"] == 1


def test_append_stops_at_the_first_bad_line(capsys, store, tmp_path, monkeypatch):
    lines = GOOD[:2] + ['{"type": "turn.completed"}', GOOD[3]]
    monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(buffer=io.BytesIO("\n".join(lines).encode())))
    store.mkdir()
    code, out, err = run(capsys, "append", "s", "-", "--store", store)
    assert code == 1 and out == ""
    assert err.startswith("memfs: append: session s line 3: refused: ") and "usage" in err
    assert "2 lines before it appended" in err
    assert len(err.strip().splitlines()) == 1
    with memfs.open_session(store, "s", read_only=True) as h:
        assert h.manifest["event_count"] == 2
    rejected = [json.loads(x) for x in (store / "s" / "rejected.jsonl").read_text().splitlines()]
    assert len(rejected) == 1 and rejected[0]["line"] == lines[2]


def test_append_json_output_and_a_last_line_without_newline(capsys, store, tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text(GOOD[0] + "\n" + "not json")
    code, out, err = run(capsys, "append", "s", source, "--json", "--store", store)
    result = json.loads(out)
    assert code == 1 and result["appended"] == 1 and result["line"] == 2 and not result["ok"]
    assert "JSON" in result["reason"]
    source.write_text(GOOD[1])  # no trailing newline: still one final line
    code, out, _ = run(capsys, "append", "s", source, "--json", "--store", store)
    assert code == 0 and json.loads(out) == {"session": "s", "appended": 1, "ok": True, "line": None, "reason": None,
                                            "refused": []}


def test_append_to_a_session_held_by_another_process_fails(capsys, store, tmp_path):
    from memfs.store import lock

    path = make(store, "s")
    held = lock.acquire(path)
    try:
        source = tmp_path / "in.jsonl"
        source.write_text(GOOD[0] + "\n")
        code, _, err = run(capsys, "append", "s", source, "--store", store)
    finally:
        lock.release(held)
    assert code == 1 and f"session s is being written by process {os.getpid()}" in err


# --- search ------------------------------------------------------------------------------


def test_search_human_and_json(capsys, store):
    make(store, "s")
    make(store, "t", [ev("turn.started"), ev("item.completed", item={"id": "x", "type": "agent_message",
                                                                      "text": "unrelated words"}),
                      ev("turn.completed", usage={})])
    code, out, _ = run(capsys, "search", "retry loop", "--json", "--store", store)
    results = json.loads(out)
    assert code == 0 and [r["chunk_id"] for r in results] == ["s:0"]
    code, out, _ = run(capsys, "search", "retry loop", "--store", store)
    score, chunk, snippet = out.strip().split("\t")
    assert chunk == "s:0" and float(score) > 0 and "retry loop" in snippet
    code, out, _ = run(capsys, "search", "retry", "--session", "t", "--store", store)
    assert code == 0 and out.strip() == "no results"


# --- gc, pin, unpin ----------------------------------------------------------------------


def test_gc_human_json_and_dry_run(capsys, store):
    make(store, "old", age_days=60, completed=True)
    make(store, "new", completed=True)
    code, out, _ = run(capsys, "gc", "--dry-run", "--store", store)
    assert code == 0 and "would remove old" in out and (store / "old").exists()
    code, _, err = run(capsys, "gc", "--store", store)  # no terminal, no --yes: refused, nothing removed
    assert code == 1 and "gc would remove 1 session" in err and "--yes" in err and (store / "old").exists()
    code, out, _ = run(capsys, "gc", "--json", "--yes", "--store", store)
    report = json.loads(out)
    assert code == 0 and [r["name"] for r in report["removed"]] == ["old"]
    assert report["removed"][0]["reason"] == "age" and report["bytes_freed"] > 0
    assert not (store / "old").exists()
    code, out, _ = run(capsys, "gc", "--store", store)
    assert out.strip() == "nothing to remove"


def test_gc_policy_flags_and_preserve(capsys, store):
    for i in range(3):
        make(store, f"s{i}", age_days=i + 1, completed=True)
    code, out, _ = run(capsys, "gc", "--max-sessions", "1", "--preserve", "s2", "--yes", "--store", store)
    assert code == 0
    assert "remove s1 (beyond max_sessions 1;" in out and "removed 1 session" in out
    assert sorted(p.name for p in store.iterdir() if not p.name.startswith(".")) == ["s0", "s2"]
    assert run(capsys, "gc", "--max-sessions", "-1", "--store", store)[0] == 2


def test_gc_policy_from_a_config_file(capsys, store, tmp_path):
    for i in range(3):
        make(store, f"s{i}", age_days=i + 1, completed=True)
    config = tmp_path / "memfs.toml"
    config.write_text(f'store = "{store}"\n[retention]\nmax_sessions = 2\n')
    code, out, _ = run(capsys, "gc", "--json", "--yes", "--config", config)
    assert [r["name"] for r in json.loads(out)["removed"]] == ["s2"]
    code, out, _ = run(capsys, "gc", "--json", "--yes", "--config", config, "--max-sessions", "1")  # flag wins
    assert [r["name"] for r in json.loads(out)["removed"]] == ["s1"]


def test_gc_refuses_a_symlinked_root(capsys, tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    code, _, err = run(capsys, "gc", "--store", tmp_path / "link")
    assert code == 1 and err.startswith("memfs: refusing symlink")


def test_pin_and_unpin(capsys, store):
    make(store, "s", age_days=60, completed=True)
    code, out, _ = run(capsys, "pin", "s", "--reason", "bug evidence", "--store", store)
    assert code == 0 and out.strip() == "pinned s: bug evidence"
    assert run(capsys, "pin", "s", "--store", store)[0] == 2  # --reason is required
    assert json.loads(run(capsys, "gc", "--json", "--store", store)[1])["removed"] == []
    code, out, _ = run(capsys, "unpin", "s", "--json", "--store", store)
    assert code == 0 and json.loads(out) == {"session": "s", "unpinned": True}
    code, out, _ = run(capsys, "unpin", "s", "--store", store)
    assert code == 0 and "was not pinned" in out
    assert run(capsys, "pin", "ghost", "--reason", "x", "--store", store)[0] == 1


# --- pack --------------------------------------------------------------------------------


def test_pack_create_and_verify(capsys, store, tmp_path):
    path = make(store, "s")
    code, out, _ = run(capsys, "pack", "create", "s", "--store", store)
    assert code == 0 and out.startswith(f"wrote {path / 'derived' / 'audit-pack.json'}")
    code, out, _ = run(capsys, "pack", "verify", "s", "--store", store)
    assert code == 0 and out.startswith("verified: ")
    (path / "extra.txt").write_text("new")
    code, out, _ = run(capsys, "pack", "verify", "s", "--store", store)
    assert code == 1 and "unaccounted extra.txt" in " ".join(out.split())
    with open(path / "events.jsonl", "ab") as f:
        f.write(b"x")
    code, out, _ = run(capsys, "pack", "verify", "s", "--json", "--store", store)
    result = json.loads(out)
    assert code == 1 and result["mismatches"] == ["events.jsonl"] and result["verified"] is False
    code, out, _ = run(capsys, "pack", "verify", "s", "--store", store)
    assert code == 1 and "NOT verified" in out and "mismatch    events.jsonl" in out


def test_pack_to_a_file_and_an_invalid_pack(capsys, store, tmp_path):
    make(store, "s")
    out_file = tmp_path / "pack.json"
    code, out, _ = run(capsys, "pack", "create", "s", "-o", out_file, "--json", "--store", store)
    assert code == 0 and json.loads(out)["path"] == str(out_file)
    pack = json.loads(out_file.read_text())
    pack["entries"].append({"path": "../x", "bytes": 0, "sha256": "0" * 64})
    out_file.write_text(json.dumps(pack))
    code, out, _ = run(capsys, "pack", "verify", "s", out_file, "--store", store)
    assert code == 1 and out.startswith("invalid pack") and "unsafe path" in out
    code, _, err = run(capsys, "pack", "verify", "s", tmp_path / "none.json", "--store", store)
    assert code == 1 and err.startswith("memfs: ")


# --- migrate -----------------------------------------------------------------------------


def test_migrate(capsys, tmp_path):
    ws = tmp_path / "ws"
    (ws / ".vtcode" / "history").mkdir(parents=True)
    (ws / ".vtcode" / "logs").mkdir()
    (ws / ".vtcode" / "history" / "h1.json").write_text('{"summary": "x"}')
    (ws / ".vtcode" / "logs" / "trajectory-r1.jsonl").write_text("{}\n")
    code, out, _ = run(capsys, "migrate", ws, "--dry-run")
    assert code == 0 and "would import .vtcode/history/h1.json -> h1" in out
    assert not (ws / ".vtcode" / "sessions").exists()
    code, out, _ = run(capsys, "migrate", ws, "--json")
    report = json.loads(out)
    assert code == 0 and report["imported"] == 2
    assert sorted(p.name for p in (ws / ".vtcode" / "sessions").iterdir()) == ["h1", "traj-r1"]
    code, out, _ = run(capsys, "migrate", ws, "--remove-legacy", "--store", tmp_path / "other")
    assert code == 0 and "removed .vtcode/history/" in out
    assert sorted(p.name for p in (tmp_path / "other").iterdir()) == ["h1", "traj-r1"]
    assert not (ws / ".vtcode" / "history").exists()


def test_migrate_reports_conflicts_with_exit_1(capsys, tmp_path):
    ws = tmp_path / "ws"
    (ws / ".vtcode" / "history").mkdir(parents=True)
    (ws / ".vtcode" / "history" / "h1.json").write_text("not json")
    code, out, _ = run(capsys, "migrate", ws)
    assert code == 1 and "skip .vtcode/history/h1.json: invalid" in out


# --- fsck --------------------------------------------------------------------------------


def test_fsck_exit_codes_and_output(capsys, store):
    make(store, "good")
    bad = make(store, "bad")
    code, out, _ = run(capsys, "fsck", "--store", store)
    assert code == 0 and "good: ok" in out and "bad: ok" in out
    (bad / "manifest.json").write_text("garbage")
    with open(bad / "events.jsonl", "ab") as f:
        f.write(b'{"torn')
    code, out, _ = run(capsys, "fsck", "bad", "--store", store)
    assert code == 1 and out.startswith("bad: repaired") and "torn tail: 6" in out
    code, out, _ = run(capsys, "fsck", "bad", "--json", "--store", store)
    assert code == 0 and json.loads(out)[0]["result"] == "ok"
    with open(bad / "events.jsonl", "ab") as f:
        f.write(b"\xff\n")
    code, out, _ = run(capsys, "fsck", "--json", "--store", store)
    results = {r["name"]: r for r in json.loads(out)}
    assert code == 1 and results["bad"]["result"] == "damaged" and results["bad"]["skipped_lines"] == 1
    assert results["good"]["result"] == "ok"
    code, out, _ = run(capsys, "fsck", "ghost", "--store", store)
    assert code == 1 and "ghost: error" in out


# --- mount and umount --------------------------------------------------------------------


@pytest.fixture
def fake_mount(monkeypatch):
    """Stand-in for memfs.fs.mount: records what the CLI hands it (no FUSE needed)."""
    calls = {}
    module = types.ModuleType("memfs.fs.mount")
    module.run = lambda config: calls.setdefault("run", config) and 0
    module.unmount = lambda mountpoint: calls.setdefault("unmount", mountpoint) and 0
    monkeypatch.setitem(sys.modules, "memfs.fs.mount", module)
    return calls


def test_mount_builds_the_config_from_arguments(capsys, fake_mount, tmp_path):
    code, _, _ = run(capsys, "mount", tmp_path / "store", tmp_path / "mnt", "--session", "s1", "--read-only",
                     "--uid", "1000", "--gid", "100", "--durability", "fsync", "--max-events", "5",
                     "--log-level", "debug")
    config = fake_mount["run"]
    assert code == 0 and isinstance(config, Config)
    assert config.sessions_root() == tmp_path / "store" and config.mountpoint == str(tmp_path / "mnt")
    assert (config.session, config.read_only, config.uid, config.gid) == ("s1", True, 1000, 100)
    assert (config.durability, config.max_events, config.log_level) == ("fsync", 5, "DEBUG")
    assert config.allow_other is False and config.max_line_bytes == 16 * 1024 * 1024


def test_mount_flags_override_the_config_file(capsys, fake_mount, tmp_path):
    conf = tmp_path / "mount.toml"
    conf.write_text('workspace = "ws"\nmountpoint = "mnt"\ndurability = "buffered"\nallow_other = true\n'
                    '[search]\nmax_results = 9\n')
    assert run(capsys, "mount", "--config", conf)[0] == 0
    config = fake_mount.pop("run")
    assert config.sessions_root() == tmp_path / "ws" / ".vtcode" / "sessions"
    assert config.mountpoint == str(tmp_path / "mnt") and config.durability == "buffered"
    assert config.allow_other and config.max_results == 9
    assert run(capsys, "mount", "--config", conf, "--store", tmp_path / "s", "--durability", "write",
               tmp_path / "elsewhere")[0] == 0
    config = fake_mount["run"]
    assert config.sessions_root() == tmp_path / "s" and config.workspace is None
    assert config.durability == "write" and config.mountpoint == str(tmp_path / "elsewhere")


def test_mount_with_a_bad_config_fails_cleanly(capsys, fake_mount, tmp_path):
    conf = tmp_path / "mount.toml"
    conf.write_text('mountpiont = "typo"\n')
    code, _, err = run(capsys, "mount", "--config", conf, tmp_path)
    assert code == 1 and "unknown key 'mountpiont'" in err and "run" not in fake_mount


def test_evict_to_from_flag_option_and_file(capsys, fake_mount, tmp_path):
    conf = tmp_path / "mount.toml"
    conf.write_text('evict_to = 0.75\n')
    assert run(capsys, "mount", "--config", conf, tmp_path / "mnt")[0] == 0
    assert fake_mount.pop("run").evict_to == 0.75
    assert run(capsys, "mount", "--config", conf, "-o", "evict_to=1.0", tmp_path / "mnt")[0] == 0
    assert fake_mount.pop("run").evict_to == 1.0  # -o wins over the file
    assert run(capsys, "mount", "-o", "evict_to=1", "--evict-to", "0.5", tmp_path / "mnt")[0] == 0
    assert fake_mount.pop("run").evict_to == 0.5  # the flag wins over -o
    assert run(capsys, "mount", tmp_path / "mnt")[0] == 0
    assert fake_mount.pop("run").evict_to == 0.9  # the default
    for argv in (["--evict-to", "0.3"], ["--evict-to", "x"]):
        code, _, err = run(capsys, "mount", *argv, tmp_path / "mnt")
        assert code == 2 and "--evict-to: must be a number from 0.5 to 1.0" in err
    code, _, err = run(capsys, "mount", "-o", "evict_to=2", tmp_path / "mnt")
    assert code == 1 and "evict_to must be a number from 0.5 to 1.0" in err and "run" not in fake_mount
    code, _, err = run(capsys, "mount", "-o", "evict_to=lots", tmp_path / "mnt")
    assert code == 2 and "evict_to takes a number" in err


@pytest.mark.parametrize("evict_to, summaries", [("0.5", 9), ("1.0", 18)])
def test_append_with_a_cap_evicts_down_to_evict_to(capsys, store, tmp_path, evict_to, summaries):
    # 20 turns of 4 events at a cap of 10: the 11th event is the third of turn 3. At 1.0 it
    # evicts turn 1 (down to 7), and so does the third event of every later turn: 18 rewrites.
    # At 0.5 it must go down to 5: turns 1 and 2 go (down to 3), and the next rewrite comes
    # two turns later: 9 rewrites. Both end with turns 19 and 20.
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join([GOOD[1], GOOD[2], GOOD[2], GOOD[3]] * 20) + "\n")
    code, out, err = run(capsys, "append", "s", source, "--store", store, "--max-events", "10",
                         "--evict-to", evict_to)
    assert code == 0 and out.strip() == "appended 80 lines to s", err
    with memfs.open_session(store, "s", read_only=True) as h:
        m = h.manifest
    assert (m["turn_count"], m["retained_turn_base"], m["event_count"]) == (20, 19, 8)
    found = sorted((store / "s" / "derived").glob("eviction-summary-*.json"))
    assert len(found) == summaries
    assert sum(json.loads(p.read_text())["evicted_event_count"] for p in found) == 72


def test_append_of_a_file_over_the_cap_matches_line_by_line_appends(capsys, store, tmp_path):
    """The CLI appends a file in large batches (one rewrite per batch, however often the cap
    is crossed): the session ends as appending the lines one by one leaves it, refused lines
    keep their line numbers, and each eviction still writes its own summary."""
    from memfs.samples import turn as make_turn

    lines = []
    for t in range(60):
        lines += [x.decode() for x in make_turn(f"t{t}", 2)]
        if t % 17 == 5:
            lines.append("not json")  # refused, --keep-going goes on
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(lines) + "\n")
    store.mkdir()
    code, out, err = run(capsys, "append", "batched", source, "--store", store, "--max-events", "20",
                         "--keep-going")
    bad = [i + 1 for i, line in enumerate(lines) if line == "not json"]
    assert code == 1 and out.strip() == f"appended {len(lines) - len(bad)} lines to batched; refused 4 lines " \
                                        f"(recorded in rejected.jsonl)"
    assert [int(x.split(":")[2].split()[-1]) for x in err.strip().splitlines()] == bad
    with memfs.open_session(store, "single", max_events=20, metadata_interval=0) as h:
        for line in lines:
            if line != "not json":
                h.append(line)
    assert (store / "batched" / "events.jsonl").read_bytes() == (store / "single" / "events.jsonl").read_bytes()
    with memfs.open_session(store, "batched", read_only=True) as a, memfs.open_session(store, "single",
                                                                                        read_only=True) as b:
        assert {**a.manifest, "session_id": "single"} | {"created_at": 0, "updated_at": 0} == \
            b.manifest | {"created_at": 0, "updated_at": 0}
    counts = [[json.loads(p.read_text())["evicted_event_count"]
               for p in sorted((store / name / "derived").glob("eviction-summary-*.json"))]
              for name in ("batched", "single")]
    assert counts[0] == counts[1] and len(counts[0]) > 3


def test_append_from_a_pipe_appends_each_line_as_it_arrives(tmp_path):
    """Batches never wait for more input: a line written to the pipe is in the session while
    the writer still holds the pipe open."""
    store = tmp_path / "store"
    proc = subprocess.Popen([PYTHON, "-m", "memfs", "append", "s", "-", "--store", str(store)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    try:
        for n, line in enumerate(GOOD[:3], 1):
            proc.stdin.write(line.encode() + b"\n")
            proc.stdin.flush()
            deadline = time.monotonic() + 20
            while True:
                count = 0
                if (store / "s" / "events.jsonl").exists():
                    with memfs.open_session(store, "s", read_only=True) as h:
                        count = h.manifest["event_count"]
                if count == n:
                    break
                assert count < n and time.monotonic() < deadline, f"line {n} not appended while the pipe is open"
                time.sleep(0.01)
        proc.stdin.write(GOOD[3].encode())  # the last line without its newline: appended at EOF
        proc.stdin.close()
        assert proc.wait(timeout=20) == 0
        assert proc.stdout.read().strip() == b"appended 4 lines to s"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with memfs.open_session(store, "s", read_only=True) as h:
        assert h.manifest["event_count"] == 4 and h.manifest["turn_count"] == 1


def test_umount(capsys, fake_mount, tmp_path):
    assert run(capsys, "umount", tmp_path / "mnt")[0] == 0
    assert fake_mount["unmount"] == str(tmp_path / "mnt")


# --- the progress bar --------------------------------------------------------------------


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_draws_only_on_a_terminal():
    quiet = io.StringIO()
    with ProgressBar("x", quiet) as bar:
        bar(1, 2)
        bar(2, 2)
    assert quiet.getvalue() == ""
    tty = _Tty()
    with ProgressBar("fsck", tty) as bar:
        bar(2, 2)
    assert "fsck [" in tty.getvalue() and "2/2" in tty.getvalue() and tty.getvalue().endswith("\r")


# --- the configuration file --------------------------------------------------------------


def test_the_example_config_documents_every_setting_with_its_default():
    example = REPO / "mount.example.toml"
    text = example.read_text()
    loaded = load_config(example)
    assert loaded == Config()
    for key in ("store", "workspace", "mountpoint", "session", "read_only", "allow_other", "uid", "gid",
                "durability", "max_events", "evict_to", "max_line_bytes", "[retention]", "max_sessions",
                "max_age_days", "[search]", "max_results", "min_score", "log_level", "daemon"):
        assert key in text, key


def test_config_errors_name_the_key(tmp_path):
    conf = tmp_path / "c.toml"
    for body, message in [('nope = 1\n', "unknown key 'nope'"),
                          ('[retention]\nmax_session = 3\n', "unknown key retention.max_session"),
                          ('max_events = "10"\n', "max_events must be an integer"),
                          ('read_only = 1\n', "read_only must be true or false"),
                          ('max_events = true\n', "max_events must be an integer"),
                          ('durability = "sometimes"\n', "durability must be one of"),
                          ('store = "a"\nworkspace = "b"\n', "either store or workspace"),
                          ('max_events = -1\n', "max_events must not be negative"),
                          ('evict_to = 0.4\n', "evict_to must be a number from 0.5 to 1.0"),
                          ('evict_to = 1.01\n', "evict_to must be a number from 0.5 to 1.0"),
                          ('evict_to = "0.9"\n', "evict_to must be a number"),
                          ('= broken', "not valid TOML")]:
        conf.write_text(body)
        with pytest.raises(ConfigError, match=message):
            load_config(conf)


def test_config_paths_are_relative_to_the_file(tmp_path):
    conf = tmp_path / "sub" / "c.toml"
    conf.parent.mkdir()
    conf.write_text('store = "data"\nmountpoint = "/abs/mnt"\n[retention]\nmax_age_days = 7.5\n')
    config = load_config(conf)
    assert config.sessions_root() == tmp_path / "sub" / "data"
    assert config.mountpoint == "/abs/mnt" and config.retention.max_age_days == 7.5


def test_overrides():
    base = Config(workspace="ws")
    new = apply_overrides(base, {"store": "s", "max_sessions": 3, "search.min_score": 0.5, "uid": None})
    assert new.store == "s" and new.workspace is None and new.max_sessions == 3 and new.min_score == 0.5
    assert base.workspace == "ws" and base.max_sessions == 50  # the original is untouched
    with pytest.raises(ConfigError):
        apply_overrides(base, {"colour": "red"})
    with pytest.raises(ConfigError):
        apply_overrides(base, {"durability": "never"})


def test_default_store_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert Config().sessions_root() == tmp_path / "memfs" / "sessions"
    assert os.fspath(Config(workspace="w").sessions_root()) == "w/.vtcode/sessions"


@needs_fuse
def test_a_real_mount_and_umount(capsys, tmp_path):
    """End to end through FUSE: `memfs mount` serves the store, `memfs umount` takes it down."""
    make(tmp_path / "store", "s")
    m = start(tmp_path / "store", tmp_path / "mnt")
    try:
        assert (tmp_path / "mnt" / "sessions" / "s" / "events.jsonl").read_bytes().count(b"\n") == 4
        assert run(capsys, "umount", tmp_path / "mnt")[0] == 0
        assert m.proc.wait(15) == 0
        assert not is_mounted(tmp_path / "mnt")
    finally:
        cleanup(m)


def test_cluster_settings_from_the_file_flags_and_o_options(tmp_path):
    from memfs.cli.mount import _mount_options

    conf = tmp_path / "c.toml"
    conf.write_text('[cluster]\nservers = "nats://a:4222, nats://b:4222"\ntimeout = 2\n')
    loaded = load_config(conf)
    assert loaded.cluster.servers == ["nats://a:4222", "nats://b:4222"]
    assert (loaded.cluster.stream, loaded.cluster.timeout, loaded.cluster.effective_replicas) == ("MEMFS", 2, 1)
    assert not Config().cluster.enabled
    settings = _mount_options(["ro,cluster=nats://h1:4222,nats://h2:4222,nats://h3:4222"])
    merged = apply_overrides(loaded, settings)
    assert merged.read_only and merged.cluster.servers == ["nats://h1:4222", "nats://h2:4222", "nats://h3:4222"]
    assert merged.cluster.effective_replicas == 3 and merged.cluster.timeout == 2
    assert loaded.cluster.servers == ["nats://a:4222", "nats://b:4222"]  # the file's config is not changed
    conf.write_text('[cluster]\nservers = ["http://a"]\n')
    with pytest.raises(ConfigError, match="not a nats:// URL"):
        load_config(conf)


# --- a new user's rough edges (issue 42), each through the real command line ---------------------


def memfs_cli(*argv, input: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m memfs ARGV`` in a subprocess, as a user runs it."""
    return subprocess.run([PYTHON, "-m", "memfs", *map(str, argv)], capture_output=True, text=True, cwd=REPO,
                          input=input, env={**os.environ, **(env or {})}, timeout=60)


@pytest.mark.parametrize("agent, status, reason", [
    ("no-such-agent-42", 127, "no-such-agent-42: command not found"),
    ("/nonexistent/agent", 127, "/nonexistent/agent: No such file or directory"),
    ("{tmp}/notes.txt", 126, "{tmp}/notes.txt: Permission denied"),  # not executable
    ("{tmp}", 126, "{tmp}: Is a directory"),
    ("{tmp}/broken", 126, "{tmp}/broken: Exec format error"),  # found and executable: it fails to start
])
def test_record_of_a_command_that_cannot_run_exits_as_a_shell_and_creates_nothing(tmp_path, agent, status, reason):
    (tmp_path / "notes.txt").write_text("not a program\n")
    (tmp_path / "broken").write_bytes(b"\x7fELF\x02\x01\x01" + bytes(64))
    (tmp_path / "broken").chmod(0o755)
    agent, reason = agent.format(tmp=tmp_path), reason.format(tmp=tmp_path)
    store = tmp_path / "store"
    done = memfs_cli("record", "--store", store, "r1", "--", agent, "--flag")
    assert done.returncode == status
    assert done.stderr == f"memfs: record: {reason}\n" and done.stdout == ""
    assert not store.exists()  # no session folder, not even the store
    store.mkdir()
    assert memfs_cli("record", "--store", store, "r1", "--", agent).returncode == status
    assert os.listdir(store) == []


def test_the_commands_that_write_create_a_missing_store_and_say_so(tmp_path):
    """import, record and append write sessions: on a store that does not exist they create
    it, saying so on stderr (a mistyped --store shows); the other commands refuse it."""
    line = '{"type":"turn.started"}\n'
    cases = [(["import", FIXTURES / "codex_exec.jsonl"], None), (["record", "r", "--", "echo", line.strip()], None),
             (["append", "a"], line)]
    for i, (argv, stdin) in enumerate(cases):
        store = tmp_path / f"new{i}"
        command = argv[0]
        done = memfs_cli(*argv[:1], "--store", store, *argv[1:], input=stdin)
        assert done.returncode == 0, done.stderr
        assert f"memfs: {command}: the store {store} did not exist: created it\n" in done.stderr
        assert store.is_dir() and len([n for n in os.listdir(store) if not n.startswith(".")]) == 1  # (a session)
        again = memfs_cli(*argv[:1], "--store", store, *argv[1:], input=stdin)
        assert again.returncode == 0 and "did not exist" not in again.stderr  # said once, when created
    store = tmp_path / "dry"
    done = memfs_cli("import", "--dry-run", "--store", store, FIXTURES / "codex_exec.jsonl")
    assert done.returncode == 0 and not store.exists()
    assert f"memfs: import: the store {store} does not exist: a run without --dry-run creates it\n" in done.stderr
    for argv in (["sessions"], ["show", "s"], ["search", "x"], ["fsck"]):
        done = memfs_cli(*argv, "--store", tmp_path / "typo")
        assert done.returncode == 1 and done.stderr.startswith(f"memfs: no store at {tmp_path / 'typo'}")
    assert not (tmp_path / "typo").exists()


def test_show_says_how_many_turns_are_closed_and_open_as_its_table_lists_them(tmp_path):
    store = tmp_path / "store"
    lines = [ev("thread.started", thread_id="t"), ev("turn.started"), ev("turn.completed", usage={}),
             ev("turn.started"), ev("turn.started"), ev("turn.failed", message="x"), ev("turn.started")]
    assert memfs_cli("append", "--store", store, "d", input="\n".join(lines) + "\n").returncode == 0
    done = memfs_cli("show", "--store", store, "d")
    assert done.returncode == 0, done.stderr
    head, _, table = done.stdout.partition("\nTURN ")
    rows = table.splitlines()[1:]
    assert [r.split()[1] for r in rows] == ["completed", "abandoned", "failed", "open"]
    assert "\nturns     3 closed, 1 open\n" in head
    appended = memfs_cli("append", "--store", store, "d", input=ev("turn.completed", usage={}) + "\n")
    assert appended.returncode == 0
    assert "\nturns     4 closed\n" in memfs_cli("show", "--store", store, "d").stdout


def test_a_refused_append_names_the_session_and_line(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    lines = [ev("thread.started", thread_id="t"), ev("turn.started"), '{"type":"turn.failed"}']
    done = memfs_cli("append", "--store", store, "demo", input="\n".join(lines) + "\n")
    assert done.returncode == 1
    assert done.stderr.startswith('memfs: append: session demo line 3: refused: turn.failed: "message" must be ')
    assert len(done.stderr.splitlines()) == 1
    done = memfs_cli("append", "--store", store, "demo", "--keep-going", input='{"type":"turn.failed"}\n')
    assert done.returncode == 1 and done.stderr.startswith("memfs: append: session demo line 1: refused: ")


def test_the_readme_says_how_to_call_memfs_by_name(tmp_path):
    """The README's recipes call ``memfs``: its set-up section gives the line that puts
    ``.venv/bin`` on PATH, and that line, run in a shell at the checkout, makes ``memfs`` the
    virtualenv's command."""
    readme = (REPO / "README.md").read_text()
    setup = readme.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    exports = [line.strip() for line in setup.splitlines() if line.strip().startswith("export PATH=")]
    assert len(exports) == 1, "the set-up section gives one export PATH= line"
    path = ":".join(p for p in os.environ["PATH"].split(":") if not p.startswith(str(REPO)))
    done = subprocess.run(["bash", "-c", exports[0] + "\ncommand -v memfs && memfs --version"], cwd=REPO,
                          capture_output=True, text=True, env={**os.environ, "PATH": path}, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [str(REPO / ".venv" / "bin" / "memfs"), f"memfs {memfs.__version__}"]
