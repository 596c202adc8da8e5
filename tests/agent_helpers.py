"""What the agent-format tests share: the CLI as a user runs it, a session's events, its views
and facts (the ``follower`` fixture is in conftest.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import memfs
import orjson

from mounting import mounted, sh

MEMFS = [sys.executable, "-m", "memfs"]
REPLAY = Path(__file__).parent / "agents" / "replay.py"  # prints a captured stdout, exits a status


def cli(*args: str) -> subprocess.CompletedProcess:
    """``memfs ARGS`` in a subprocess (text output)."""
    return subprocess.run([*MEMFS, *args], capture_output=True, text=True, timeout=120)


def events_of(store: Path, session: str) -> list[dict]:
    """The session's events, in log order (read-only: never the writer's lock)."""
    with memfs.open_session(store, session, read_only=True) as h:
        return [orjson.loads(line)["event"] for _, line in h.iter_lines()]


def view(store: Path, session: str, name: str) -> str:
    """``memfs show SESSION --view NAME``'s output."""
    proc = cli("show", "--store", str(store), session, "--view", name)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def facts(store: Path, session: str) -> list[str]:
    return [f["fact"] for f in json.loads(view(store, session, "memory.json"))["grounded_facts"]]


def items(events: list[dict], etype: str = "item.completed") -> list[dict]:
    return [e["item"] for e in events if e["type"] == etype]


def of_type(events: list[dict], itype: str) -> list[dict]:
    return [i for i in items(events) if i["type"] == itype]


def import_(store: Path, *paths: Path, ok: bool = True) -> list[dict]:
    """``memfs import --json PATHS``'s reports; ``ok`` is whether the command must succeed."""
    proc = cli("import", "--store", str(store), "--json", *map(str, paths))
    assert (proc.returncode == 0) == ok, proc.stderr + proc.stdout
    return json.loads(proc.stdout)


def listing(store: Path) -> dict[str, dict]:
    """``memfs sessions --json``, by session name."""
    proc = cli("sessions", "--store", str(store), "--json")
    assert proc.returncode == 0, proc.stderr
    return {s["name"]: s for s in json.loads(proc.stdout)}


def turns(events: list[dict]) -> list[str]:
    """How each turn ended, in order (``turn.completed`` or ``turn.failed``)."""
    return [e["type"] for e in events if e["type"] in ("turn.completed", "turn.failed")]


def started(events: list[dict]) -> list[dict]:
    """Each ``turn.started``'s context, in order."""
    return [e.get("context", {}) for e in events if e["type"] == "turn.started"]


def mounted_views(store: Path, mnt: Path, session: str) -> tuple[list[str], str, str]:
    """The session's facts (``derived/memory.json``), ``context.md`` and ``summary.md``, read
    with ``cat`` through a mount of ``store`` at ``mnt`` (unmounted before it returns)."""
    with mounted(store, mnt) as m:
        s = m.mnt / "sessions" / session
        memory = json.loads(sh("cat derived/memory.json", s).stdout)
        context = sh("cat derived/context.md", s).stdout
        summary = sh("cat derived/summary.md", s).stdout
    return [f["fact"] for f in memory["grounded_facts"]], context, summary


def record_replayed(store: Path, session: str, streams: list[Path], runs: list[dict]) -> list[dict]:
    """``memfs record SESSION`` of each captured run (its stdout replayed, with its exit status,
    from the capture's ``runs``): each passes its output through unchanged; the recorded events."""
    for stream, run in zip(streams, runs, strict=True):
        proc = subprocess.run([*MEMFS, "record", "--store", str(store), session, "--", sys.executable,
                               str(REPLAY), str(stream), "--status", str(run["exit_code"])],
                              capture_output=True, timeout=120)
        assert proc.returncode == run["exit_code"], proc.stderr
        assert proc.stdout == stream.read_bytes()  # passed through unchanged
    return events_of(store, session)
