#!/usr/bin/env python3
"""Root search at scale (issue 54 item 2, SPEC §14): a store-wide mount of N one-turn sessions.

For each N (``--sessions``, default 2,000 and 10,000) it writes a store (the sessions of
``scripts/bench_sessions.py``), mounts it, waits for the search index's warm-up, and measures:

* **root search p50/p99**: ``open(search/<q>).read()`` for ``--queries`` distinct queries;
* **another process's append**: a turn appended to one session's log in the store, then the
  time until a root search finds it (polled);
* **first after a restart**: unmount (the index is saved), mount again, the first root search;
* **memfs search**: the CLI's wall time (a fresh process), over the saved index.

Nothing is asserted: it prints one line per N. Goals (SPEC §14, at 10,000): p50 ≤ 20 ms,
p99 ≤ 100 ms, first after a restart ≤ 1 s, ``memfs search`` ≤ 0.5 s, an append found ≤ 1 s.

Usage: ``.venv/bin/python scripts/bench_root_search.py [--sessions 2000 10000]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from bench_fs import start_server, stop_server  # noqa: E402
from bench_sessions import WORDS, build_store, wrap  # noqa: E402


def mount(store: Path, mnt: Path, log: Path):
    return start_server([sys.executable, "-m", "memfs", "mount", str(store), str(mnt), "--log-level", "WARNING"],
                        mnt, log)


def root_search(mnt: Path, query: str) -> bytes:
    with open(mnt / "search" / query, "rb") as f:
        return f.read()


def warmed(mnt: Path, timeout: float = 900) -> float:
    t = time.perf_counter()
    while os.getxattr(mnt, "user.memfs.warm_pending", follow_symlinks=True) != b"0":
        if time.perf_counter() - t > timeout:
            raise RuntimeError("the warm-up did not finish")
        time.sleep(0.05)
    return time.perf_counter() - t


def first_search(mnt: Path, query: str) -> float:
    t = time.perf_counter()
    while True:
        try:
            root_search(mnt, query)
            return time.perf_counter() - t
        except TimeoutError:  # (ETIMEDOUT while a long warm-up goes on)
            continue


def run(n: int, queries: int, work: Path) -> dict:
    store, mnt = work / f"store-{n}", work / f"mnt-{n}"
    build_store(store, n)
    mnt.mkdir()
    r: dict = {"sessions": n}
    proc = mount(store, mnt, work / f"mount-{n}.log")
    try:
        r["first_cold_s"] = first_search(mnt, "retry")  # no saved index yet: built from the logs
        r["warm_s"] = warmed(mnt)
        times = []
        for i in range(queries):
            q = f"{WORDS[i % len(WORDS)]} module {i % 997}"
            t = time.perf_counter()
            root_search(mnt, q)
            times.append(time.perf_counter() - t)
        times.sort()
        r["p50_ms"] = 1000 * statistics.median(times)
        r["p99_ms"] = 1000 * times[min(len(times) - 1, int(0.99 * len(times)))]
        # another process appends to a session's log in the store
        victim = store / f"s{n // 2:06d}" / "events.jsonl"
        turn = wrap({"type": "turn.started"}) + wrap(
            {"type": "item.completed", "item": {"id": "z", "type": "agent_message", "text": "Quuxified the frobnicator."}}) + \
            wrap({"type": "turn.completed", "usage": {"input_tokens": 1}})
        with open(victim, "ab") as f:
            f.write(turn)
        t = time.perf_counter()
        while b"frobnicator" not in root_search(mnt, "frobnicator"):
            time.sleep(0.01)
        r["append_found_s"] = time.perf_counter() - t
    finally:
        stop_server(proc, mnt)
    proc = mount(store, mnt, work / f"mount-{n}.log")
    try:
        r["first_after_restart_s"] = first_search(mnt, "socket")
    finally:
        stop_server(proc, mnt)
    walls = []
    for q in ("retry", "parser timeout", "frobnicator"):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "memfs", "search", "--store", str(store), q], check=True,
                       capture_output=True)
        walls.append(time.perf_counter() - t)
    r["cli_search_s"] = min(walls)
    r["cli_search_first_s"] = walls[0]
    shutil.rmtree(store, ignore_errors=True)
    print(f"{n:,} sessions: first (cold, no saved index) {r['first_cold_s']:.2f} s, warm-up left {r['warm_s']:.2f} s, "
          f"root search p50 {r['p50_ms']:.1f} ms p99 {r['p99_ms']:.1f} ms, other process's append found in "
          f"{r['append_found_s']:.2f} s, first after restart {r['first_after_restart_s']:.2f} s, memfs search "
          f"{r['cli_search_first_s']:.2f} s first / {r['cli_search_s']:.2f} s best", flush=True)
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, nargs="+", default=[2_000, 10_000])
    ap.add_argument("--queries", type=int, default=300)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="memfs-bench-rootsearch-"))
    try:
        for n in args.sessions:
            run(n, args.queries, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
