#!/usr/bin/env python3
"""Many-sessions benchmark (issue 13, SPEC §3.5): a store-wide mount of N small sessions.

For each N (``--sessions``, default 10,000 and 100,000) it writes a store directly — per
session a log of one completed turn (``thread.started``, ``turn.started``, an agent message,
``turn.completed``), its ``manifest.json`` and ``index/turns.json`` exactly as the store
writes them (the first session is opened with the library to check that the open's fast path
trusts them) — then mounts it store-wide and measures, as a user would see it:

* **mount**: from starting ``memfs mount`` to the mountpoint being served;
* **ls**: ``ls sessions/ | wc -l`` (and that it counts N);
* **first search**: ``cat search/retry`` right after the listing, until it answers (the
  server warms its index in the background from the start; a root query waits for what is
  left and gives up with ``ETIMEDOUT`` after 10 s, then the next ``cat`` goes on): the time
  to the first result, and a second query's time (``cat search/socket``);
* **appends**: one whole turn appended with ``>>`` to each of ``--appends`` (default 1,000)
  random sessions, then every one of them checked through ``manifest.json`` (2 turns);
* throughout (a sampler thread, every 50 ms): the daemon's open descriptors
  (``/proc/PID/fd``) and RSS; their peaks per phase.

Goal (issue 13): at 100,000 sessions, mount, list, search and the appends with the daemon
under 1,000 descriptors; RSS reported. Nothing is asserted: it prints a table and, with
``--json FILE``, writes ``{"results": [...], "goals": {...}}``.

Usage: ``.venv/bin/python scripts/bench_sessions.py [--sessions 10000 100000] [--appends 1000]``
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

import memfs  # noqa: E402

from bench_fs import start_server, stop_server  # noqa: E402

WORDS = ("retry", "cache", "parser", "socket", "timeout", "schema", "worker", "router", "logger", "queue")
TS = "2025-01-01T00:00:00.000+00:00"
FD_GOAL = 1000


def wrap(event: dict) -> bytes:
    return orjson.dumps({"schema_version": "0.18.0", "event": event}) + b"\n"


def session_files(i: int) -> tuple[str, dict[str, bytes]]:
    """Session ``i``'s name and files (``events.jsonl``, ``manifest.json``, ``index/turns.json``)."""
    name = f"s{i:06d}"
    word = WORDS[i % len(WORDS)]
    lines = [wrap({"type": "thread.started", "thread_id": f"t{i}"}),
             wrap({"type": "turn.started"}),
             wrap({"type": "item.completed", "item": {"id": "m1", "type": "agent_message",
                                                      "text": f"Fixed the {word} handling in module {i % 997} ({name})."}}),
             wrap({"type": "turn.completed", "usage": {"input_tokens": 100 + i % 50, "output_tokens": 20}})]
    return one_turn_session(name, lines)


def one_turn_session(name: str, lines: list[bytes]) -> tuple[str, dict[str, bytes]]:
    """``name`` and the files of a session whose log is ``lines``: a thread start, then one
    completed turn of three events."""
    log = b"".join(lines)
    start = len(lines[0])
    turns = orjson.dumps({"entries": [{"turn_number": 1, "start_offset": start, "end_offset": len(log),
                                       "event_count": 3, "ts": TS, "outcome": "completed"}]})
    manifest = orjson.dumps({"session_id": name, "schema_version": 1, "created_at": TS, "updated_at": TS,
                             "turn_count": 1, "event_count": 4, "status": "active", "in_turn": False,
                             "persisted_file_len": len(log), "retained_turn_base": 1})
    return name, {"events.jsonl": log, "manifest.json": manifest, "index/turns.json": turns}


def build_store(store: Path, n: int, files=session_files) -> float:
    """Write ``n`` sessions directly (``files(i)``: session ``i``'s name and its files by path
    relative to the session, e.g. ``index/turns.json``); seconds taken. The first session is
    opened with the library to check that the open's fast path trusts what was written."""
    t = time.perf_counter()
    store.mkdir(mode=0o700, parents=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    first = None
    for i in range(n):
        name, content = files(i)
        first = first or (name, content["events.jsonl"].count(b"\n"))
        d = os.path.join(store, name)
        os.mkdir(d, 0o700)
        made = {""}
        for rel, data in content.items():
            parent = rel.rpartition("/")[0]
            if parent not in made:
                os.makedirs(os.path.join(d, parent), 0o700, exist_ok=True)
                made.add(parent)
            fd = os.open(os.path.join(d, rel), flags, 0o600)
            os.write(fd, data)
            os.close(fd)
    if first:
        with memfs.open_session(store, first[0], read_only=True) as h:  # the files are what the store writes
            if not h.open_report.fast_path or h.manifest["event_count"] != first[1]:
                raise RuntimeError(f"generated session not trusted: {h.open_report}")
    return time.perf_counter() - t


class Sampler(threading.Thread):
    """Samples a process's open descriptors and RSS; peaks per named phase."""

    def __init__(self, pid: int, interval: float = 0.05):
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.phase = "mount"
        self.peaks: dict[str, dict] = {}
        self.stopped = threading.Event()

    def sample(self) -> None:
        try:
            fds = len(os.listdir(f"/proc/{self.pid}/fd"))
            rss = 0
            with open(f"/proc/{self.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        rss = int(line.split()[1]) // 1024
        except OSError:
            return
        peak = self.peaks.setdefault(self.phase, {"fds": 0, "rss_MiB": 0})
        peak["fds"] = max(peak["fds"], fds)
        peak["rss_MiB"] = max(peak["rss_MiB"], rss)

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            self.sample()

    def enter(self, phase: str) -> None:
        self.sample()
        self.phase = phase
        self.sample()


def run(n: int, appends: int, work: Path) -> dict:
    store, mnt = work / f"store-{n}", work / f"mnt-{n}"
    built = build_store(store, n)
    print(f"  {n:,} sessions written in {built:.1f} s", flush=True)
    mnt.mkdir()
    r: dict = {"sessions": n, "build_s": built}
    t = time.perf_counter()
    proc = start_server([sys.executable, "-m", "memfs", "mount", str(store), str(mnt), "--log-level", "WARNING"],
                        mnt, work / f"mount-{n}.log")
    r["mount_s"] = time.perf_counter() - t
    sampler = Sampler(proc.pid)
    sampler.start()
    try:
        sampler.enter("ls")
        t = time.perf_counter()
        out = subprocess.run(f"ls {mnt}/sessions/ | wc -l", shell=True, capture_output=True, text=True, check=True)
        r["ls_s"] = time.perf_counter() - t
        r["ls_count"] = int(out.stdout)
        sampler.enter("search")
        t = time.perf_counter()
        r["search_timeouts"] = 0
        while True:  # a root query gives up after 10 s (ETIMEDOUT) while the warm-up goes on
            out = subprocess.run(["cat", str(mnt / "search" / "retry")], capture_output=True)
            if not out.returncode:
                break
            if b"timed out" not in out.stderr or time.perf_counter() - t > 900:
                raise RuntimeError(f"search failed: {out.stderr!r}")
            r["search_timeouts"] += 1
        r["first_search_s"] = time.perf_counter() - t
        r["first_search_results"] = len(out.stdout.splitlines())
        t = time.perf_counter()
        subprocess.run(["cat", str(mnt / "search" / "socket")], capture_output=True, check=True)
        r["second_search_s"] = time.perf_counter() - t
        sampler.enter("appends")
        picked = random.Random(n).sample(range(n), min(appends, n))
        turn = wrap({"type": "turn.started"}) + wrap(
            {"type": "item.completed", "item": {"id": "m2", "type": "agent_message", "text": "Appended by the bench."}}) + \
            wrap({"type": "turn.completed", "usage": {"input_tokens": 1}})
        t = time.perf_counter()
        for i in picked:
            with open(mnt / "sessions" / f"s{i:06d}" / "events.jsonl", "ab") as f:
                f.write(turn)
        r["appends_s"] = time.perf_counter() - t
        r["appends"] = len(picked)
        r["appends_wrong"] = sum(
            orjson.loads((mnt / "sessions" / f"s{i:06d}" / "manifest.json").read_bytes())["turn_count"] != 2
            for i in picked)
        sampler.enter("after")
        r["fds_after"] = len(os.listdir(f"/proc/{proc.pid}/fd"))
    finally:
        sampler.stopped.set()
        sampler.join()
        stop_server(proc, mnt)
        shutil.rmtree(store, ignore_errors=True)
    r["peaks"] = sampler.peaks
    r["peak_fds"] = max(p["fds"] for p in sampler.peaks.values())
    r["peak_rss_MiB"] = max(p["rss_MiB"] for p in sampler.peaks.values())
    print(f"  {n:,} sessions: mount {r['mount_s']:.2f} s, ls {r['ls_s']:.2f} s ({r['ls_count']:,}), "
          f"first search {r['first_search_s']:.2f} s ({r['first_search_results']} results, "
          f"{r['search_timeouts']} timeouts), next {r['second_search_s']:.2f} s, "
          f"{r['appends']} appends {r['appends_s']:.2f} s ({r['appends_wrong']} wrong), "
          f"peak fds {r['peak_fds']}, peak RSS {r['peak_rss_MiB']} MiB", flush=True)
    return r


def table(rows: list[dict]) -> str:
    out = ["| sessions | mount s | ls sessions/ s | first root search s | next search s | appends (s) | "
           "peak fds | peak RSS MiB | RSS by phase (mount/ls/search/appends) MiB |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        by_phase = "/".join(str(r["peaks"].get(p, {}).get("rss_MiB", "-")) for p in ("mount", "ls", "search", "appends"))
        out.append(f"| {r['sessions']:,} | {r['mount_s']:.2f} | {r['ls_s']:.2f} | {r['first_search_s']:.2f} | "
                   f"{r['second_search_s']:.2f} | {r['appends']:,} ({r['appends_s']:.2f}) | {r['peak_fds']} | "
                   f"{r['peak_rss_MiB']} | {by_phase} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--appends", type=int, default=1000)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="memfs-bench-sessions-"))
    try:
        rows = [run(n, args.appends, work) for n in args.sessions]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(table(rows))
    goals = {}
    for r in rows:
        if r["sessions"] >= 100_000:
            ok = r["peak_fds"] < FD_GOAL and r["ls_count"] == r["sessions"] and not r["appends_wrong"] \
                and r["first_search_results"] > 0
            goals[f"{r['sessions']:,} sessions: mount, ls, search, {r['appends']:,} appends under {FD_GOAL:,} fds"] = {
                "measured": f"peak {r['peak_fds']} fds, RSS {r['peak_rss_MiB']} MiB", "met": ok}
    if args.json:
        Path(args.json).write_text(json.dumps({"results": rows, "goals": goals}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
