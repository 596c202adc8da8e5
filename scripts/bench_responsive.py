#!/usr/bin/env python3
"""Responsiveness benchmark (issue 14, item 5): an idle session stays fast while others work.

The probe: ``stat`` + read of an idle session's ``manifest.json`` (the syscalls of ``stat f;
cat f``: stat, open, fstat, read to EOF, close), timed one after another; p50, p99, max.
Five conditions, each on its own mount of its own store, in one run:

* quiet: nothing else happens (the reference);
* (a) 4 writer threads drive 4 other sessions through cap rewrites (``--max-events``, default
  500: a rewrite every few turns), one ``write()`` per line;
* (a0) the reference of (a), run right after it: the same 4 writers on a mount without a cap
  (the issue's "no cap" peer). It is not a goal: what (a) costs beyond it is the cap's
  rewrites; what it costs beyond quiet is four writers that never pause on two cores;
* (b) the mount's warm-up rescans a large stale session: a ``--big-mb`` (default 120) MB log
  whose metadata is gone (written for its first events, then removed), so opening it rescans it; the
  probe runs from the moment the mount is up for twice the time a rescan of that log takes
  (measured first through the library) plus a second. The warm-up is idle-priority work that
  gives way to requests (``memfs/pace.py``), so the condition also reports for how long it
  gave way while the probe ran (``warm_gave_way_s``, from the root's
  ``user.memfs.background_waited_ms``) and how long after the probe stopped it finished
  (``warm_done_after_s``).

* (c) a request opens another large stale session: once the mount's warm-up is done, a
  ``--big-mb`` MB stale session appears in the store (written behind the server's back, as by
  another process), and 0.2 s into the probe a client reads its ``manifest.json`` — a request,
  which its client waits for, so nothing paces it; a mount rescans a log this large in its
  helper process (``memfs/store/rescanner.py``). SPEC §6 asks the idle session to stay under
  2 ms p99 while other sessions rescan; the issue's goals are (a) and (b). The probe runs
  until that read returned and half a second more; ``request_s`` is the read's time.

Each condition also reports ``slowest_cpu_wait``: of the time of its slowest 1% of probes, the
share the probing thread itself spent waiting for a CPU (``/proc/thread-self/schedstat``) —
on a machine with two cores the client competes with the server, its worker threads and the
writers, and no server can answer faster than its client gets to run.

Goal: p99 ≤ 2 ms in (a) and (b) (issue 14), and in (c) (SPEC §6). Nothing is asserted; ``--json FILE`` writes the results.

Usage: ``.venv/bin/python scripts/bench_responsive.py [--samples N] [--json FILE]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

import memfs  # noqa: E402
from memfs.samples import sized_message  # noqa: E402

from bench_fs import report_goals, start_server, stat_and_read, stop_server  # noqa: E402


def event(etype: str, **fields) -> bytes:
    return json.dumps({"schema_version": "0.18.0", "event": {"type": etype, **fields}},
                      separators=(",", ":")).encode() + b"\n"



def runqueue_wait() -> float:
    """Seconds this thread has waited for a CPU so far (``/proc/thread-self/schedstat``)."""
    with open("/proc/thread-self/schedstat") as f:
        return int(f.read().split()[1]) / 1e9


def probe(path: Path) -> tuple[float, float]:
    """One probe: (its seconds, the seconds of them the probing thread itself waited for a CPU)."""
    waited = runqueue_wait()
    took = stat_and_read(path)
    return took, runqueue_wait() - waited


def summary(probes: list[tuple[float, float]]) -> dict:
    """p50, p99, max of the probes; and of the slowest 1%, how much was the probe's own wait
    for a CPU (on a machine with few cores the client competes with the server and writers)."""
    probes = sorted(probes)
    samples = [took for took, _ in probes]
    slowest = probes[int(len(probes) * 0.99) - 1:]
    return {"n": len(samples), "p50_ms": statistics.median(samples) * 1000,
            "p99_ms": samples[int(len(samples) * 0.99) - 1] * 1000, "max_ms": samples[-1] * 1000,
            "slowest_cpu_wait": sum(w for _, w in slowest) / sum(t for t, _ in slowest)}


def mount(store: Path, mnt: Path, log: Path, *args: str):
    mnt.mkdir(parents=True, exist_ok=True)
    return start_server([sys.executable, "-m", "memfs", "mount", str(store), str(mnt), "--log-level", "WARNING",
                         *args], mnt, log)


def idle_session(store: Path) -> None:
    with memfs.open_session(store, "idle", durability="write") as h:
        h.append(event("turn.started"))
        h.append(event("turn.completed", usage={}))


def quiet(work: Path, n: int) -> dict:
    store, mnt = work / "q-store", work / "q-mnt"
    idle_session(store)
    proc = mount(store, mnt, work / "q.log")
    try:
        manifest = mnt / "sessions" / "idle" / "manifest.json"
        for _ in range(50):
            stat_and_read(manifest)
        return summary([probe(manifest) for _ in range(n)])
    finally:
        stop_server(proc, mnt)


def evicting(work: Path, n: int, max_events: int, name: str = "a") -> dict:
    store, mnt = work / f"{name}-store", work / f"{name}-mnt"
    idle_session(store)
    proc = mount(store, mnt, work / f"{name}.log", "--max-events", str(max_events))
    stop = threading.Event()
    turns = [0] * 4

    def writer(k: int) -> None:
        path = mnt / "sessions" / f"w{k}" / "events.jsonl"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            while not stop.is_set():
                os.write(fd, event("turn.started"))
                for i in range(8):
                    os.write(fd, sized_message(i))
                os.write(fd, event("turn.completed", usage={}))
                turns[k] += 1
        finally:
            os.close(fd)

    try:
        for k in range(4):
            (mnt / "sessions" / f"w{k}").mkdir()
        pool = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
        for th in pool:
            th.start()
        manifest = mnt / "sessions" / "idle" / "manifest.json"
        deadline = time.monotonic() + 10
        # past the cap everywhere ((a0), no cap: as long as (a) at its default --max-events)
        while sum(turns) * 10 < 4 * (max_events or 500) * 2 and time.monotonic() < deadline:
            stat_and_read(manifest)
        samples = [probe(manifest) for _ in range(n)]
        stop.set()
        for th in pool:
            th.join()
        base = [json.loads((mnt / "sessions" / f"w{k}" / "manifest.json").read_bytes())["retained_turn_base"]
                for k in range(4)]
        result = summary(samples)
        result["writer_turns"] = sum(turns)
        result["turns_evicted"] = sum(b - 1 for b in base)
        return result
    finally:
        stop.set()
        stop_server(proc, mnt)


def stale_warmup(work: Path, n_max: int, big_mb: int, warm_seconds: float) -> dict:
    store, mnt = work / "b-store", work / "b-mnt"
    idle_session(store)
    size_mb = stale_session(store, "big", big_mb)
    t = time.monotonic()
    with memfs.open_session(store, "big", read_only=True) as h:  # how long the warm-up's rescan takes
        assert not h.open_report.fast_path
    rescan = time.monotonic() - t
    proc = mount(store, mnt, work / "b.log", "--max-events", "0")
    try:
        manifest = mnt / "sessions" / "idle" / "manifest.json"
        samples = []
        t0 = time.monotonic()
        while len(samples) < n_max and time.monotonic() - t0 < min(warm_seconds, 2 * rescan + 1):
            samples.append(probe(manifest))
        result = summary(samples)
        result["log_MB"] = size_mb
        result["rescan_s"] = rescan
        waited = root_xattr(mnt, "background_waited_ms")
        if waited is not None:  # (a tree without memfs/pace.py does not say)
            result["warm_gave_way_s"] = int(waited) / 1000
            t = time.monotonic()
            while root_xattr(mnt, "warm_pending") != "0" and time.monotonic() - t < 120:
                time.sleep(0.01)
            result["warm_done_after_s"] = time.monotonic() - t
        return result
    finally:
        stop_server(proc, mnt)


def stale_session(store: Path, name: str, big_mb: int) -> float:
    """A session ``name`` whose ``big_mb`` MB log no metadata describes (written for its first
    events, then extended and its manifest removed): opening it rescans it. Its size in MB."""
    with memfs.open_session(store, name, durability="write", max_events=0) as h:
        h.append(event("turn.started"))
        h.append(event("turn.completed", usage={}))
    chunk = event("turn.started") + sized_message(1) * 30 + event("turn.completed", usage={})
    with open(store / name / "events.jsonl", "ab") as f:  # behind the metadata's back: stale
        for _ in range(big_mb * 1024 * 1024 // len(chunk)):
            f.write(chunk)
    (store / name / "manifest.json").unlink()
    return os.path.getsize(store / name / "events.jsonl") / 1e6


def stale_request(work: Path, n_max: int, big_mb: int) -> dict:
    store, mnt = work / "c-store", work / "c-mnt"
    idle_session(store)
    proc = mount(store, mnt, work / "c.log", "--max-events", "0")
    try:
        manifest = mnt / "sessions" / "idle" / "manifest.json"
        deadline = time.monotonic() + 60
        while root_xattr(mnt, "warm_pending") not in (None, "0") and time.monotonic() < deadline:
            time.sleep(0.01)  # (a tree that reports no warm-up: its warm-up of one small session)
        size_mb = stale_session(store, "big", big_mb)  # after the warm-up: only a request opens it
        for _ in range(50):
            stat_and_read(manifest)
        took: list[float] = []

        def request() -> None:
            t = time.monotonic()
            (mnt / "sessions" / "big" / "manifest.json").read_bytes()
            took.append(time.monotonic() - t)

        client = threading.Timer(0.2, request)
        samples = []
        client.start()
        done_at = None
        while len(samples) < n_max:
            samples.append(probe(manifest))
            if took and done_at is None:
                done_at = time.monotonic()
            if done_at is not None and time.monotonic() - done_at > 0.5:
                break
        client.join()
        result = summary(samples)
        result["log_MB"] = size_mb
        result["request_s"] = took[0] if took else float("nan")
        return result
    finally:
        stop_server(proc, mnt)


def root_xattr(mnt: Path, name: str) -> str | None:
    try:
        return os.getxattr(mnt, f"user.memfs.{name}").decode()
    except OSError:
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=3000)
    ap.add_argument("--max-events", type=int, default=500)
    ap.add_argument("--big-mb", type=int, default=120)
    ap.add_argument("--warm-seconds", type=float, default=60)
    ap.add_argument("--json")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="memfs-bench-resp-"))
    try:
        results = {"quiet": quiet(work, args.samples),
                   "(a) 4 writers through cap rewrites": evicting(work, args.samples, args.max_events),
                   "(a0) the same 4 writers, no cap": evicting(work, args.samples, 0, "a0"),
                   "(b) warm-up rescanning a stale log": stale_warmup(work, 10 * args.samples, args.big_mb,
                                                                      args.warm_seconds),
                   "(c) a request rescanning a stale log": stale_request(work, 10 * args.samples, args.big_mb)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("probe: stat + open/fstat/read/close of an idle session's manifest.json")
    for name, r in results.items():
        extra = ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items()
                          if not k.endswith("_ms"))
        print(f"{name:<38} p50 {r['p50_ms']:.3f} ms  p99 {r['p99_ms']:.3f} ms  max {r['max_ms']:.1f} ms  ({extra})")
    goals = {goal: {"met": results[key]["p99_ms"] <= 2, "measured": f"{results[key]['p99_ms']:.1f} ms"}
             for goal, key in (("(a) p99 <= 2 ms", "(a) 4 writers through cap rewrites"),
                               ("(b) p99 <= 2 ms", "(b) warm-up rescanning a stale log"),
                               ("(c) p99 <= 2 ms (SPEC §6)", "(c) a request rescanning a stale log"))}
    report_goals(results, goals, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
