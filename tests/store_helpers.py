"""Shared helpers of the session-store tests: event lines, opening, and reading the store's
files directly (never through the code under test)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import memfs
import orjson
from memfs.samples import DONE, FAILED, START, bare, event, message, turn  # noqa: F401 (re-exported)

SV = "0.18.0"

env = event  # the tests' short name for an enveloped event line
msg = message

THREAD_START = env("thread.started", thread_id="thread-1")
THREAD_DONE = env("thread.completed", thread_id="thread-1", session_id="s", subtype="success",
                  outcome_code="completed", usage={"input_tokens": 1}, num_turns=1)


def open_s(root: Path, sid: str = "s", **kw) -> memfs.SessionHandle:
    """open_session with metadata persisted at every boundary (the spec's exact behaviour)."""
    kw.setdefault("metadata_interval", 0)
    kw.setdefault("max_events", 0)
    return memfs.open_session(root, sid, **kw)


def disk_json(path: Path):
    return orjson.loads(path.read_bytes())


def disk_manifest(session_dir: Path) -> dict:
    return disk_json(session_dir / "manifest.json")


def disk_index(session_dir: Path) -> list[dict]:
    return disk_json(session_dir / "index" / "turns.json")["entries"]


def log_lines(session_dir: Path) -> list[bytes]:
    """The lines of events.jsonl (each without its newline); the file must end with one."""
    data = (session_dir / "events.jsonl").read_bytes()
    assert data == b"" or data.endswith(b"\n")
    return data.split(b"\n")[:-1]


def without_times(manifest: dict) -> dict:
    return {k: v for k, v in manifest.items() if k not in ("created_at", "updated_at")}


def without_ts(entries: list[dict]) -> list[dict]:
    return [{k: v for k, v in e.items() if k != "ts"} for e in entries]


def state_of(handle: memfs.SessionHandle) -> tuple[dict, list[dict]]:
    """The live manifest (no timestamps) and index (no ts) of a handle."""
    return without_times(handle.manifest), without_ts(handle.turn_index)


def forget_metadata(session_dir: Path) -> None:
    """Remove everything the log's state is cached in, as if no metadata was ever written."""
    for name in ("manifest.json", "index/turns.json", "index/turns.cache"):
        try:
            os.unlink(session_dir / name)
        except FileNotFoundError:
            pass


def run_python(code: str, *args: str, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (a real second process)."""
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=timeout, **kw)


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    """``memfs ARGV...`` in this process: (exit code, stdout, stderr)."""
    from memfs import cli

    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def make_logged(root: Path, name: str, lines: list[bytes]) -> Path:
    """A session of ``lines``, metadata persisted (written through the library)."""
    with memfs.open_session(root, name, durability="write", metadata_interval=0) as h:
        h.append_many(lines)
    return root / name


def errno_of(action) -> int:
    """The errno ``action()`` fails with, or 0."""
    try:
        action()
    except OSError as exc:
        return exc.errno
    return 0


def wait_until(cond, what: str, timeout: float = 20.0):
    """``cond()``'s first true value, polled until ``timeout`` seconds; the test fails then."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        assert time.monotonic() < deadline, f"gave up waiting: {what}"
        time.sleep(0.02)


def join_all(threads, what: str, timeout: float = 60.0) -> None:
    """Start the threads not started yet and wait for all of them, ``timeout`` seconds in
    all; the test fails naming ``what`` if one is still running then (a thread that hangs)."""
    for t in threads:
        if t.ident is None:
            t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), what
