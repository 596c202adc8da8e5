"""gc and audit packs against other processes' writes (issue 42 items 4, 7, 8), with real
processes: a writer killed with SIGKILL before it persisted its metadata, ``memfs gc`` and
``memfs pack`` run as commands, ``memfs append`` as the other process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from memfs.samples import event, message
from memfs.store.meta import format_rfc3339

DAY = 86400
THREAD_START = event("thread.started", thread_id="t")
THREAD_DONE = event("thread.completed", thread_id="t", session_id="s", subtype="success",
                    outcome_code="completed", usage={}, num_turns=0)
OPEN_TURN = [event("turn.started")] + [message(f"acknowledged {i}", f"m{i}") for i in range(4)]  # 5 lines
CLOSED_TURN = [event("turn.started"), message("done", "d"), event("turn.completed", usage={"input_tokens": 1})]

# Appends its lines through the library (durability "write": each is in the file when append
# returns) with metadata persisted only at close, says "ready", then waits to be killed.
WRITER = r"""
import sys, memfs
h = memfs.open_session(sys.argv[1], sys.argv[2], durability="write", metadata_interval=3600)
for line in sys.stdin.buffer.read().splitlines(keepends=True):
    h.append(line)
print("ready", flush=True)
import time
while True:
    time.sleep(3600)
"""


def memfs_cli(*argv, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    """``python -m memfs ARGV`` in a subprocess, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "memfs", *map(str, argv)], capture_output=True, input=stdin,
                          timeout=120)


def append_cli(store: Path, name: str, lines: list[bytes]) -> None:
    done = memfs_cli("append", "--store", store, name, "-", stdin=b"".join(line + b"\n" for line in lines))
    assert done.returncode == 0, done.stderr


def killed_writer(store: Path, name: str, lines: list[bytes]) -> None:
    """A real process appends ``lines`` to the session and is SIGKILLed before it persists
    metadata (the turn is open: no boundary persisted anything)."""
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(store), name], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    try:
        proc.stdin.write(b"".join(line + b"\n" for line in lines))
        proc.stdin.close()
        assert proc.stdout.readline().strip() == b"ready"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(60)
    assert proc.returncode == -signal.SIGKILL


def set_manifest(session: Path, **fields) -> None:
    manifest = json.loads((session / "manifest.json").read_bytes())
    manifest.update(fields)
    (session / "manifest.json").write_text(json.dumps(manifest))


def age_log(session: Path, days: float) -> None:
    when = time.time() - days * DAY
    os.utime(session / "events.jsonl", (when, when))


def gc_json(store: Path, *flags) -> dict:
    done = memfs_cli("gc", "--store", store, "--json", *flags)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def abandoned(tmp_path) -> tuple[Path, bytes]:
    """A session that completed with no turns (manifest: completed, 0 turns), then a writer
    appended a turn's first 5 lines and was killed before persisting: the manifest on disk
    is stale. Returns the session folder and its log's bytes."""
    store = tmp_path / "store"
    append_cli(store, "s", [THREAD_START, THREAD_DONE])
    session = store / "s"
    before = json.loads((session / "manifest.json").read_bytes())
    assert (before["status"], before["turn_count"], before["event_count"]) == ("completed", 0, 2)
    killed_writer(store, "s", OPEN_TURN)
    log = (session / "events.jsonl").read_bytes()
    assert log.count(b"\n") == 7 and all(line in log for line in OPEN_TURN)
    stale = json.loads((session / "manifest.json").read_bytes())
    assert (stale["status"], stale["turn_count"], stale["event_count"]) == ("completed", 0, 2)
    assert stale["persisted_file_len"] < len(log)
    return session, log


def test_gc_keeps_a_session_a_killed_writer_was_in_a_turn_of(abandoned):
    """Item 4: the stale manifest says "completed, 0 turns"; the log says a turn is open.
    The default policy must keep it (it is active, and recently so), its lines intact."""
    session, log = abandoned
    store = session.parent
    done = memfs_cli("gc", "--store", store, "--yes")
    assert done.returncode == 0, done.stderr
    assert b"nothing to remove" in done.stdout
    assert (session / "events.jsonl").read_bytes() == log
    report = gc_json(store, "--yes")
    assert report["removed"] == [] and report["kept"] == {"s": "active"}
    assert (session / "events.jsonl").read_bytes() == log


def test_the_sweep_persists_an_abandoned_session_with_its_real_counts(abandoned):
    """Item 4: an abandoned session (no activity for longer than max_age_days) is swept to
    completed with metadata that describes the log as it is (7 events, the turn still open),
    and a later gc removes it for its age, never as an empty session."""
    from memfs.store import retention

    session, log = abandoned
    store = session.parent
    set_manifest(session, updated_at=format_rfc3339(time.time() - 40 * DAY))
    age_log(session, 40)
    dry = memfs_cli("gc", "--store", store, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    out = dry.stdout.decode()
    assert "would mark s completed" in out
    assert "would remove s (old: last activity " in out and "days > max_age_days 30)" in out
    assert "empty" not in out
    # the sweep alone (gc removes what it swept in the same run: look at its rewrite first)
    assert retention.mark_completed(session, time.time() - 30 * DAY)
    manifest = json.loads((session / "manifest.json").read_bytes())
    assert (manifest["status"], manifest["event_count"], manifest["turn_count"], manifest["in_turn"]) == \
        ("completed", 7, 0, True)
    assert manifest["persisted_file_len"] == len(log)
    assert (session / "events.jsonl").read_bytes() == log
    report = gc_json(store, "--yes")
    assert [(r["name"], r["reason"]) for r in report["removed"]] == [("s", "age")]


def test_an_old_manifest_over_a_log_written_since_is_not_old(tmp_path):
    """Item 8: max_age_days is the age of the last activity. A writer killed after closing a
    turn left the manifest's updated_at 60 days old; the log's last line is from now."""
    store = tmp_path / "store"
    append_cli(store, "s", [THREAD_START] + CLOSED_TURN + [THREAD_DONE])
    session = store / "s"
    set_manifest(session, updated_at=format_rfc3339(time.time() - 60 * DAY))
    killed_writer(store, "s", CLOSED_TURN + [THREAD_DONE] + OPEN_TURN[:1])
    log = (session / "events.jsonl").read_bytes()
    report = gc_json(store, "--dry-run")
    assert report["removed"] == [] and report["marked_completed"] == []
    assert memfs_cli("gc", "--store", store, "--yes").returncode == 0
    assert (session / "events.jsonl").read_bytes() == log


def test_gc_dry_run_says_why_each_session_would_go(tmp_path):
    """Item 8: each listed session with its reason; a session with events but no turns is not
    empty (empty means no events)."""
    store = tmp_path / "store"
    append_cli(store, "shell", [THREAD_START, THREAD_DONE])  # events, zero turns: kept
    append_cli(store, "old", [THREAD_START] + CLOSED_TURN + [THREAD_DONE])
    set_manifest(store / "old", updated_at=format_rfc3339(time.time() - 63 * DAY))
    for i in range(2):
        append_cli(store, f"n{i}", [THREAD_START] + CLOSED_TURN + [THREAD_DONE])
    assert memfs_cli("append", "--store", store, "void", "-", stdin=b"").returncode == 0  # no events
    set_manifest(store / "void", status="completed")

    def said(*flags) -> dict[str, str]:
        dry = memfs_cli("gc", "--store", store, "--dry-run", *flags)
        assert dry.returncode == 0, dry.stderr
        lines = dry.stdout.decode().splitlines()
        return {line.split()[2]: line for line in lines if line.startswith("would remove ") and "(" in line}

    default = said()
    assert set(default) == {"void", "old"}, default
    assert "(empty: no events;" in default["void"]
    when = time.strftime("%Y-%m-%d", time.gmtime(time.time() - 63 * DAY))
    assert f"(old: last activity {when} (63 days > max_age_days 30);" in default["old"]
    capped = said("--max-sessions", "2")  # newest first: n1, n0 stay; shell and old go
    assert set(capped) == {"void", "old", "shell"}, capped
    assert "(beyond max_sessions 2;" in capped["shell"] and "(beyond max_sessions 2;" in capped["old"]


# --- item 7: audit packs and another process's appends ------------------------------------


def test_pack_verifies_after_another_process_appends_and_tampering_still_fails(tmp_path):
    store = tmp_path / "store"
    append_cli(store, "s", [THREAD_START] + CLOSED_TURN)
    session = store / "s"
    created = memfs_cli("pack", "create", "s", "--store", store)
    assert created.returncode == 0, created.stderr
    append_cli(store, "s", CLOSED_TURN + OPEN_TURN[:2])  # another process: 5 events, takes the lock
    done = memfs_cli("pack", "verify", "s", "--store", store)
    out = done.stdout.decode()
    assert done.returncode == 0, out
    assert out.splitlines()[-1].startswith("verified (grown by 5 events since the pack)")
    assert "session.lock" not in out

    # tampering still fails: a packed line edited (the same length), a file deleted, a file added
    log = (session / "events.jsonl").read_bytes()
    edited = log.replace(b"done", b"DONE", 1)
    assert edited != log and len(edited) == len(log)
    (session / "events.jsonl").write_bytes(edited)
    done = memfs_cli("pack", "verify", "s", "--store", store)
    assert done.returncode == 1 and b"mismatch    events.jsonl" in done.stdout
    (session / "events.jsonl").write_bytes(log)
    assert memfs_cli("pack", "verify", "s", "--store", store).returncode == 0

    (session / "notes.txt").write_text("smuggled")
    done = memfs_cli("pack", "verify", "s", "--store", store)
    assert done.returncode == 1 and b"unaccounted notes.txt" in done.stdout
    os.unlink(session / "notes.txt")

    # a line refused since (another process): rejected.jsonl is new, and noted, not a failure
    refused = memfs_cli("append", "--store", store, "s", "-", "--keep-going",
                        stdin=b"not json\n" + message("after", "a") + b"\n")
    assert refused.returncode == 1 and (session / "rejected.jsonl").exists()
    done = memfs_cli("pack", "verify", "s", "--store", store)
    assert done.returncode == 0 and b"refreshed   rejected.jsonl" in done.stdout
    assert b"verified (grown by 6 events since the pack)" in done.stdout

    os.unlink(session / "events.jsonl")
    done = memfs_cli("pack", "verify", "s", "--store", store)
    assert done.returncode == 1 and b"missing     events.jsonl" in done.stdout
