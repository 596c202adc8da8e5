#!/usr/bin/env python3
"""Benchmark appends and reads through a real memfs mount (issue 3's goals).

Measured in one run on this machine, side by side:

* single-event appends: one ``write()`` of a 300-byte event per call on an ``O_APPEND``
  descriptor, through memfs (each durability mode) and through ``scripts/nullfs.py``, a
  do-nothing pyfuse3 filesystem (the FUSE ceiling; also with ``direct_io`` as memfs opens
  ``events.jsonl``), all mounted at once and measured in interleaved rounds (medians); goal:
  memfs ``write`` ≥ 75% of nullfs (the median of the rounds' ratios). A third nullfs,
  "floor", validates each line with memfs's ``parse_line`` and ``write()``s it to a file —
  the least any ``write``-mode append must do — so the report shows how much of the gap is
  that unavoidable work and how much is memfs's own bookkeeping;
* bulk ``cat`` of a 100,000-event file into ``events.jsonl``; goal ≥ 100,000 events/s;
* ``stat`` + read of ``manifest.json``: the syscalls ``stat`` and ``cat`` make (stat, open,
  fstat, read to EOF, close) without the cost of spawning a process, median; goal < 1 ms.

With two CPUs or more, every server runs on one CPU and the writer (this process) on another.
Left to the kernel, where the two land decided more than the filesystem did: the same nullfs,
and its ratios to memfs, moved a lot from one run to the next on a 2-core machine.

Usage: ``.venv/bin/python scripts/bench_fs.py [--events N] [--rounds R] [--bulk N] [--json FILE]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from memfs.fs.registry import is_mounted  # noqa: E402
from memfs.samples import sized_message  # noqa: E402


def stat_and_read(path: Path) -> float:
    """Seconds for the syscalls of ``stat FILE; cat FILE`` (stat, open, fstat, read to EOF,
    close), without the cost of spawning a process."""
    t = time.perf_counter()
    os.stat(path)
    fd = os.open(path, os.O_RDONLY)
    os.fstat(fd)
    while os.read(fd, 131072):
        pass
    os.close(fd)
    return time.perf_counter() - t


def placement() -> tuple[set[int] | None, set[int] | None]:
    """(the writer's CPUs, the servers' CPUs): one each when there are two or more, else None."""
    cpus = sorted(os.sched_getaffinity(0))
    return ({cpus[0]}, {cpus[1]}) if len(cpus) >= 2 else (None, None)


def start_server(cmd: list[str], mnt: Path, log: Path, env: dict | None = None,
                 cpus: set[int] | None = None, cwd: Path | None = None) -> subprocess.Popen:
    out = open(log, "ab")
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env, cwd=cwd,
                            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    deadline = time.monotonic() + 20
    while not is_mounted(mnt):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{cmd} did not mount: {log.read_text()}")
        time.sleep(0.02)
    return proc


def stop_server(proc: subprocess.Popen, mnt: Path) -> None:
    """SIGTERM, wait, and make sure nothing stays mounted."""
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
    if is_mounted(mnt):
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)], check=False)


def single_appends(path: Path, n: int, lines: list[bytes]) -> float:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        t = time.perf_counter()
        for i in range(n):
            os.write(fd, lines[i % len(lines)])
        return n / (time.perf_counter() - t)
    finally:
        os.close(fd)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=40000, help="single appends per target, over all rounds")
    ap.add_argument("--rounds", type=int, default=20, help="interleaved rounds (medians are reported)")
    ap.add_argument("--bulk", type=int, default=100000, help="events in the bulk cat file")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="memfs-bench-"))
    lines = [sized_message(i) for i in range(1000)]
    servers: dict[str, tuple[subprocess.Popen, Path]] = {}
    targets: dict[str, Path] = {}
    results: dict[str, float] = {}
    writer_cpus, server_cpus = placement()
    if writer_cpus:
        os.sched_setaffinity(0, writer_cpus)
    try:
        # Every server runs at once and the rounds interleave them, so drift in the machine's
        # speed (other load, CPU placement of writer and server) hits all of them alike.
        for name, direct, floor in (("nullfs", "0", ""), ("nullfs direct_io", "1", ""),
                                    ("floor: validate + write()", "1", str(work / "floor.jsonl"))):
            mnt = work / name.split(":")[0].replace(" ", "-")
            mnt.mkdir()
            env = {**os.environ, "NULLFS_DIRECT_IO": direct, "NULLFS_FLOOR": floor}
            servers[name] = (start_server([sys.executable, str(ROOT / "scripts" / "nullfs.py"), str(mnt)],
                                          mnt, work / f"{mnt.name}.log", env=env, cpus=server_cpus), mnt)
            targets[name] = mnt / "sink"
        for mode in ("buffered", "write", "fsync"):
            store, mnt = work / f"store-{mode}", work / f"mnt-{mode}"
            mnt.mkdir()
            servers[mode] = (start_server([sys.executable, "-m", "memfs", "mount", str(store), str(mnt),
                                           "--durability", mode, "--max-events", "0", "--log-level", "WARNING"],
                                          mnt, work / f"{mode}.log", cpus=server_cpus), mnt)
            (mnt / "sessions" / "b").mkdir()
            targets[f"memfs {mode}"] = mnt / "sessions" / "b" / "events.jsonl"
        for _ in range(3):  # warm-up: the first thousands of requests run markedly slower here
            for name, path in targets.items():
                single_appends(path, 2000 if "fsync" not in name else 200, lines)
        rates: dict[str, list[float]] = {name: [] for name in targets}
        per_round = max(args.events // args.rounds, 100)
        for _ in range(args.rounds):
            for name, path in targets.items():
                n = per_round if "fsync" not in name else max(per_round // 10, 50)
                rates[name].append(single_appends(path, n, lines))
        for name, values in rates.items():
            results[f"{name} single appends ev/s"] = statistics.median(values)
        # the ratio of neighbours in time, then its median: robust to the machine's drift
        results["memfs write / nullfs"] = statistics.median(
            m / n for m, n in zip(rates["memfs write"], rates["nullfs"]))
        results["floor / nullfs"] = statistics.median(
            m / n for m, n in zip(rates["floor: validate + write()"], rates["nullfs"]))

        mnt = servers["write"][1]
        bulk = work / "bulk.jsonl"
        with open(bulk, "wb") as f:
            for i in range(args.bulk):
                f.write(lines[i % len(lines)])
        (mnt / "sessions" / "c").mkdir()
        t = time.perf_counter()
        subprocess.run(f"cat {bulk} >> {mnt}/sessions/c/events.jsonl", shell=True, check=True)
        results["memfs write bulk cat ev/s"] = args.bulk / (time.perf_counter() - t)
        manifest = mnt / "sessions" / "c" / "manifest.json"
        samples = [stat_and_read(manifest) for _ in range(500)]
        results["stat+read manifest.json median ms"] = statistics.median(samples) * 1000
    finally:
        for proc, mnt in servers.values():
            stop_server(proc, mnt)

    ratio = results["memfs write / nullfs"]
    width = max(map(len, results))
    print(f"workload: 300-byte item.completed events, one write() each, {args.rounds} interleaved rounds "
          f"(medians); bulk: {args.bulk} events via cat; "
          + (f"writer on CPU {min(writer_cpus)}, servers on CPU {min(server_cpus)}" if writer_cpus else "one CPU"))
    for key, value in results.items():
        print(f"{key:<{width}}  {value:,.3f}" if value < 100 else f"{key:<{width}}  {value:,.0f}")
    goals = {
        "single appends (write) >= 75% of nullfs": ratio >= 0.75,
        "bulk cat >= 100,000 ev/s": results["memfs write bulk cat ev/s"] >= 100_000,
        "stat + cat manifest.json < 1 ms median": results["stat+read manifest.json median ms"] < 1,
    }
    report_goals(results, goals, args.json)
    subprocess.run(["rm", "-rf", str(work)], check=False)
    return 0


def report_goals(results: dict, goals: dict, json_path: str | None) -> None:
    """How a component script ends: a MET/MISS line per goal (``goals``: name → bool, or → a
    dict with ``met`` and ``measured``), and ``{"results", "goals"}`` in ``json_path`` for
    ``scripts/bench.py``."""
    for goal, g in goals.items():
        met, measured = (g["met"], f" ({g['measured']})") if isinstance(g, dict) else (g, "")
        print(f"{'MET ' if met else 'MISS'} {goal}{measured}")
    if json_path:
        Path(json_path).write_text(json.dumps({"results": results, "goals": goals}, indent=2))


if __name__ == "__main__":
    sys.exit(main())
