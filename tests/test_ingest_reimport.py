"""A re-import decides per file from ``(inode, size, mtime)`` whether anything is new (SPEC §14,
:mod:`memfs.ingest.seen`): an unchanged source is not even read, a changed one takes the full
path (new lines appended, a rewritten prefix reported ``changed``), a removed session is made
again, and a source modified just before it was read is never trusted on its stat alone."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import orjson

from agent_helpers import MEMFS

FIXTURES = Path(__file__).parent / "fixtures"
NAMES = ("codex_exec.jsonl", "codex_rollout.jsonl", "claude_transcript.jsonl")
HOUR_AGO = time.time_ns() - 3600 * 10**9


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*MEMFS, *args], capture_output=True, timeout=120)


def import_json(store: Path, src: Path) -> tuple[int, dict[str, dict]]:
    proc = cli("import", "--store", str(store), "--json", str(src))
    return proc.returncode, {Path(i["source"]).name: i for i in orjson.loads(proc.stdout)}


def sources(tmp_path: Path, mtime_ns: int | None = HOUR_AGO) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for name in NAMES:
        (src / name).write_bytes((FIXTURES / name).read_bytes())
        if mtime_ns:
            os.utime(src / name, ns=(mtime_ns, mtime_ns))
    return src


def same_size_rewrite(path: Path) -> None:
    """Change a byte of the imported part, keeping the inode, the size and the mtime."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[20] = ord("X") if data[20] != ord("X") else ord("Y")
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (path.stat().st_ino, path.stat().st_size, path.stat().st_mtime_ns) == (st.st_ino, st.st_size,
                                                                                  st.st_mtime_ns)


def test_an_unchanged_source_is_decided_from_its_stat_without_being_read(tmp_path):
    src, store = sources(tmp_path), tmp_path / "store"
    rc, first = import_json(store, src)
    assert rc == 0 and {i["status"] for i in first.values()} == {"imported"}
    same_size_rewrite(src / "codex_rollout.jsonl")  # a full read would find its prefix changed
    rc, again = import_json(store, src)
    assert rc == 0 and {n: (i["status"], i["session"]) for n, i in again.items()} == \
        {n: ("up-to-date", i["session"]) for n, i in first.items()}
    os.utime(src / "codex_rollout.jsonl", ns=(HOUR_AGO + 10**9, HOUR_AGO + 10**9))  # its stat moves: read
    rc, after = import_json(store, src)
    assert rc == 1 and after["codex_rollout.jsonl"]["status"] == "changed"
    assert after["codex_exec.jsonl"]["status"] == "up-to-date"


def test_new_lines_and_a_removed_session_are_seen(tmp_path):
    src, store = sources(tmp_path), tmp_path / "store"
    lines = (FIXTURES / "codex_exec.jsonl").read_bytes().splitlines(keepends=True)
    (src / "codex_exec.jsonl").write_bytes(b"".join(lines[:10]))
    os.utime(src / "codex_exec.jsonl", ns=(HOUR_AGO, HOUR_AGO))
    rc, first = import_json(store, src)
    assert rc == 0
    with open(src / "codex_exec.jsonl", "ab") as f:
        f.write(b"".join(lines[10:]))
    os.utime(src / "codex_exec.jsonl", ns=(HOUR_AGO + 10**9, HOUR_AGO + 10**9))
    rc, again = import_json(store, src)
    assert rc == 0 and again["codex_exec.jsonl"]["status"] == "imported"
    assert again["codex_exec.jsonl"]["lines"] == len(lines) - 10
    session = first["claude_transcript.jsonl"]["session"]
    events = (store / session / "events.jsonl").read_bytes()
    subprocess.run(["rm", "-rf", str(store / session)], check=True)
    rc, after = import_json(store, src)
    assert rc == 0 and after["claude_transcript.jsonl"]["status"] == "imported"
    assert len((store / session / "events.jsonl").read_bytes().splitlines()) == len(events.splitlines())


def test_a_source_modified_just_before_its_import_is_read_again(tmp_path):
    src, store = sources(tmp_path, mtime_ns=None), tmp_path / "store"  # written now
    rc, first = import_json(store, src)
    assert rc == 0
    same_size_rewrite(src / "codex_rollout.jsonl")
    rc, again = import_json(store, src)
    assert rc == 1 and again["codex_rollout.jsonl"]["status"] == "changed"
