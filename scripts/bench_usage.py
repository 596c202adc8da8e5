#!/usr/bin/env python3
"""Usage benchmark (issue 47, SPEC §12): ``memfs usage`` and the mount's ``usage/`` over N sessions.

It writes a store of N small sessions directly (as ``scripts/bench_sessions.py`` does: each a
log of one completed turn, its manifest and turn index, plus a model and a completion time on
one of 30 days), then measures, as a user would see it:

* **memfs usage, first run**: every session's ``derived/usage.json`` computed from its log and
  kept in the backing store (what a store never summed costs once);
* **memfs usage**: the next runs, which read one small file per session (wall time of the
  whole command, interpreter start included; goal: under 1 s at 10,000 sessions);
* **first read of usage/daily.json** through a store-wide mount (loads the kept summaries);
* **memfs statusline** (SPEC §12: within 2.5× a bare Python start): the command Claude Code runs
  at each redraw, with a statusLine JSON on stdin, against ``python -c pass`` (medians of 5);
* **usage/daily.json after one append**: ``--reads`` times, one whole turn appended with ``>>``
  to a random session, then ``cat usage/daily.json`` timed (open, read, close): p50 and p99
  (goal: p99 under 10 ms at 10,000 sessions), and that the total grew by each turn's tokens.

Nothing is asserted: it prints a table and, with ``--json FILE``, writes
``{"results": {...}, "goals": {...}}``.

Usage: ``.venv/bin/python scripts/bench_usage.py [--sessions 10000] [--reads 200] [--quick]``
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]


from bench_fs import start_server, stop_server  # noqa: E402
from bench_sessions import build_store, one_turn_session, wrap  # noqa: E402
from scale_measure import pct, read  # noqa: E402

MODELS = ("gpt-5", "gpt-5-mini", "claude-sonnet-4-5", "gemini-2.5-pro")


def session_files(i: int) -> tuple[str, dict[str, bytes]]:
    """Session ``i``'s name and files (``events.jsonl``, ``manifest.json``, ``index/turns.json``)."""
    name = f"s{i:06d}"
    day = 1 + i % 30
    lines = [wrap({"type": "thread.started", "thread_id": f"t{i}"}),
             wrap({"type": "turn.started", "context": {"timestamp": f"2026-11-{day:02d}T10:00:00Z"}}),
             wrap({"type": "item.completed", "item": {"id": "m1", "type": "agent_message", "text": f"done {name}"}}),
             wrap({"type": "turn.completed", "model": MODELS[i % len(MODELS)],
                   "completed_at": f"2026-11-{day:02d}T10:00:05Z",
                   "usage": {"input_tokens": 1000 + i % 500, "cached_input_tokens": 200, "output_tokens": 50}})]
    return one_turn_session(name, lines)


def timed_usage(store: Path, *args: str) -> tuple[float, str]:
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "memfs", "usage", "--store", str(store), *args],
                          capture_output=True, text=True, check=True)
    return time.perf_counter() - t, proc.stdout


def statusline_times(store: Path) -> tuple[float, float]:
    """Medians of 5: ``memfs statusline`` (a statusLine JSON on stdin) and a bare Python start."""
    stdin = json.dumps({"session_id": "s000001", "model": {"display_name": "Opus"},
                        "cost": {"total_cost_usd": 0.1}, "transcript_path": "/nonexistent"}).encode()

    def once(argv: list[str]) -> float:
        t = time.perf_counter()
        subprocess.run(argv, input=stdin, capture_output=True, check=True)
        return time.perf_counter() - t

    line = [sys.executable, "-m", "memfs", "statusline", "--store", str(store)]
    once(line)  # the first run may rewrite the index
    return (statistics.median(once(line) for _ in range(5)),
            statistics.median(once([sys.executable, "-c", "pass"]) for _ in range(5)))


def run(n: int, reads: int, work: Path) -> dict:
    store, mnt = work / "store", work / "mnt"
    r: dict = {"sessions": n, "build_s": build_store(store, n, session_files)}
    print(f"  {n:,} sessions written in {r['build_s']:.1f} s", flush=True)
    r["usage_first_s"], _ = timed_usage(store)
    runs = [timed_usage(store)[0] for _ in range(3)]
    r["usage_s"] = statistics.median(runs)
    r["usage_by_session_s"], _ = timed_usage(store, "--by", "session", "--json")
    print(f"  memfs usage: first {r['usage_first_s']:.2f} s, then {r['usage_s']:.3f} s", flush=True)
    r["statusline_s"], r["python_s"] = statusline_times(store)
    print(f"  memfs statusline: {r['statusline_s']:.3f} s (python -c pass: {r['python_s']:.3f} s)", flush=True)
    mnt.mkdir()
    proc = start_server([sys.executable, "-m", "memfs", "mount", str(store), str(mnt), "--log-level", "WARNING"],
                        mnt, work / "mount.log")
    try:
        daily = mnt / "usage" / "daily.json"
        t = time.perf_counter()
        before = orjson.loads(read(daily))["totals"]["tokens"]["total"]
        r["first_read_s"] = time.perf_counter() - t
        rng = random.Random(47)
        times, grew = [], 0
        for _ in range(reads):
            name = f"s{rng.randrange(n):06d}"
            turn = (wrap({"type": "turn.started", "context": {"timestamp": "2026-12-01T09:00:00Z"}})
                    + wrap({"type": "turn.completed", "model": "gpt-5", "completed_at": "2026-12-01T09:00:01Z",
                            "usage": {"input_tokens": 10, "output_tokens": 1}}))
            fd = os.open(mnt / "sessions" / name / "events.jsonl", os.O_WRONLY | os.O_APPEND)
            try:
                os.write(fd, turn)
            finally:
                os.close(fd)
            t = time.perf_counter()
            data = read(daily)
            times.append(time.perf_counter() - t)
            grew = orjson.loads(data)["totals"]["tokens"]["total"] - before
        r["append_read_p50_ms"] = pct(times, 0.5) * 1000
        r["append_read_p99_ms"] = pct(times, 0.99) * 1000
        r["append_read_max_ms"] = max(times) * 1000
        r["totals_followed"] = grew == 11 * reads
    finally:
        stop_server(proc, mnt)
    r["incremental_vs_rescan"] = r["usage_s"] / (r["append_read_p99_ms"] / 1000)
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=10_000)
    ap.add_argument("--reads", type=int, default=200)
    ap.add_argument("--quick", action="store_true", help="1,000 sessions, 50 reads: a smoke run")
    ap.add_argument("--json", metavar="FILE", help="write the results as JSON")
    args = ap.parse_args()
    n, reads = (1000, 50) if args.quick else (args.sessions, args.reads)
    with tempfile.TemporaryDirectory(prefix="memfs-bench-usage-") as tmp:
        r = run(n, reads, Path(tmp))
    goals = {"memfs_usage_under_1s": r["usage_s"] < 1.0, "daily_after_append_p99_under_10ms": r["append_read_p99_ms"] < 10,
             "statusline_within_2_5x_python": r["statusline_s"] <= 2.5 * r["python_s"]}
    print(f"{'sessions':>10} {'usage first':>12} {'usage':>8} {'by session':>11} {'1st read':>9} "
          f"{'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} followed")
    print(f"{r['sessions']:>10,} {r['usage_first_s']:>11.2f}s {r['usage_s']:>7.3f}s {r['usage_by_session_s']:>10.3f}s "
          f"{r['first_read_s']:>8.3f}s {r['append_read_p50_ms']:>8.2f} {r['append_read_p99_ms']:>8.2f} "
          f"{r['append_read_max_ms']:>8.2f} {r['totals_followed']}")
    print("goals:", goals)
    if args.json:
        Path(args.json).write_text(json.dumps({"results": r, "goals": goals}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
