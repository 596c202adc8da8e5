#!/usr/bin/env python3
"""Durability benchmark (issue 14, item 2): ``fsync`` mode beside native ``write``+``fdatasync``.

Measured in one run, side by side, in interleaved rounds (a small VM's speed drifts within
seconds, so each goal is the median of the ratios of neighbours in time; 15 rounds by default,
enough rounds for that median to settle). Each goal's line also gives the quartiles of its
ratio's per-round values, so a verdict a few hundredths either side of its target reads as what
it is: one round's ratio strays further than that from the median:

* native, 1 thread: one ``write()`` of a 300-byte event then ``fdatasync()`` per event;
* native, 8 threads × 8 files: the same, each thread on its own file;
* memfs ``fsync`` mount, one writer: one ``write()`` per event on an ``O_APPEND`` descriptor of
  ``sessions/s0/events.jsonl``; goal ≥ 0.6 of native 1 thread (issue 57);
* memfs ``fsync`` mount, 8 writers into 8 sessions of the same mount (8 threads of this
  process: ``write()`` releases the GIL); goal ≥ 0.5 of native 8 × 8;
* library, 8 threads appending to one ``fsync`` session (group commit); goal ≥ 3× one native
  sync per event (native 1 thread);
* the same 8 threads, each confined to one CPU (the one that takes the disk's interrupts, else
  the lowest this process may use) by ``sched_setaffinity`` of its own before it appends. No
  goal: it shows what the appenders' hand-offs cost when they cross CPUs — a woken appender
  placed on the idle CPU, its wake an inter-processor interrupt, the interpreter lock passed
  back and forth between CPUs — which the library cannot choose for its callers' threads;
* the floor of the first goal: ``scripts/nullfs.py`` with ``NULLFS_FLOOR_SYNC`` — a pyfuse3
  server that validates the line, ``write()``s it and ``fdatasync``s inline before replying,
  one writer. It is the least an ``fsync``-mode append through any pyfuse3 server does (one
  FUSE round trip around native ``write``+``fdatasync``), so ``floor 1 writer / native 1
  thread`` is the most the first goal's ratio can be on this machine and stack, and ``mount 1
  writer / floor 1 writer`` is what memfs's own work (its commit, the hop to the syncer and
  back) leaves of it;
* the reference of the library goal: ``scripts/groupcommit_ref.c``, the same 8 threads × 300-byte
  appends to one file with the same group commit (one thread runs ``fdatasync`` for everything
  written, its end wakes whom it covered, and the next sync waits, bounded, for those to write
  their next lines and is run by the last of them: :meth:`memfs.store.writer.LogFile.sync_to`),
  in C: no Python, no interpreter lock, no validation. ``C reference / native 1 thread`` is what that algorithm
  reaches on this machine and ``library / C reference`` what memfs's library keeps of it. It
  is compiled at the start with the C compiler Python was built with; without one the row is
  left out.

Where one durable append's time goes (one writer), printed as a table after the rows: each
round also times one writer through ``nullfs.py`` (a do-nothing pyfuse3 server), the floor
without its ``fdatasync`` and a ``write``-mode memfs mount, plus native ``write()`` alone, and
reads each server's event-loop CPU (``/proc/PID/task/PID/schedstat``) around its writer. Each
part is a difference of per-append times of the same round — the FUSE round trip (nullfs less
its loop's CPU), the loop's own CPU per request (nullfs's), validation and ``write()`` (the floor
without its sync less nullfs), memfs's commit beyond that (``write`` mode less that floor), the
hand-off to the syncer and back (``fsync`` less ``write`` mode less native ``fdatasync``, and the
loop CPU of it), ``fdatasync`` (native's: with less without) — beside native's and the floor's.

A slower disk, emulated: the library's 8 threads again, with 1 ms added after each
``fdatasync`` the library runs (``os.fdatasync`` wrapped in this process, for these rows
only), with the group commit's wait for the appenders the last sync woke (``memfs.store.
writer.OWED_WAIT_MAX`` as shipped) and without it (``OWED_WAIT_MAX`` 0: the next sync starts
at once, the classic form), in interleaved rounds; ``slow disk: owed wait / none`` is what the
wait brings where ``fdatasync`` is slow. No goal; ``--slow-rounds 0`` leaves it out.

The fsync rows through the mount depend on where the kernel runs the server's event loop: on
the CPU that takes the disk's interrupts (on the benchmark machine one CPU takes all of the
virtio disk's), the loop spends much more CPU per write than on the other, and it migrates
between them. The run therefore prints where the loop ran, sampled around its rounds, beside the CPUs of the
disk's interrupts, and reports the share of samples on them.

All files live in one directory on the same filesystem (``--dir``, default a temporary
directory in /tmp). Nothing is asserted; ``--json FILE`` writes ``{"results", "goals"}``.

Usage: ``.venv/bin/python scripts/bench_durability.py [--rounds R] [--events N] [--json FILE]``
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

import memfs  # noqa: E402
from memfs.samples import sized_message  # noqa: E402

from bench_fs import report_goals, start_server, stop_server  # noqa: E402

LINES = [sized_message(i) for i in range(1000)]
THREADS = 8


def _writer(path: Path, n: int, sync: bool, flags: int) -> None:
    fd = os.open(path, flags, 0o600)
    try:
        for i in range(n):
            os.write(fd, LINES[i % 1000])
            if sync:
                os.fdatasync(fd)
    finally:
        os.close(fd)


def run_threads(paths: list[Path], n: int, sync: bool, flags: int = os.O_WRONLY | os.O_APPEND) -> float:
    """Events per second of ``len(paths)`` threads each writing ``n`` events to its path."""
    pool = [threading.Thread(target=_writer, args=(p, n, sync, flags)) for p in paths]
    t = time.perf_counter()
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    return n * len(paths) / (time.perf_counter() - t)


def disk_irq_cpus(path: Path) -> set[int]:
    """The CPUs that take the interrupts of the block device holding ``path`` (its PCI
    function's MSI vectors' ``effective_affinity_list``); empty when this cannot be told."""
    st = os.stat(path)
    node = Path(os.path.realpath(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}"))
    cpus: set[int] = set()
    for d in (node, *node.parents):
        if (d / "msi_irqs").is_dir():
            for irq in os.listdir(d / "msi_irqs"):
                try:
                    text = Path(f"/proc/irq/{irq}/effective_affinity_list").read_text().strip()
                except OSError:
                    continue
                for part in filter(None, text.split(",")):
                    lo, _, hi = part.partition("-")
                    cpus.update(range(int(lo), int(hi or lo) + 1))
            break
    return cpus


def loop_cpu_ns(pid: int) -> int:
    """Nanoseconds the server's event loop (its main thread) has run on a CPU so far."""
    return int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[0])


def timed_on(pid: int, rates: list[float], cpu: list[float], fn, *args) -> None:
    """``fn(*args)`` (a rate of one writer: events/s) appended to ``rates``, and the loop CPU
    of server ``pid`` per event (µs) it took appended to ``cpu``; ``args[1]`` is the count."""
    before = loop_cpu_ns(pid)
    rates.append(fn(*args))
    cpu.append((loop_cpu_ns(pid) - before) / 1000 / args[1])


def loop_cpu(pid: int) -> int:
    """The CPU the server's event loop (its main thread) last ran on."""
    stat = Path(f"/proc/{pid}/task/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[36])


def library_group_commit(handle, n: int, cpu: int | None = None) -> float:
    """Events per second of THREADS threads × ``n`` appends through ``handle``; ``cpu``: each
    thread confines itself to that CPU first (``sched_setaffinity`` of the calling thread)."""
    def work(k: int) -> None:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
        for i in range(n):
            handle.append(LINES[(i + k) % 1000])

    pool = [threading.Thread(target=work, args=(k,)) for k in range(THREADS)]
    t = time.perf_counter()
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    return n * THREADS / (time.perf_counter() - t)


def slow_disk_group_commit(handle, n: int, rounds: int, extra: float = 0.001) -> dict[str, list[float]]:
    """The library's group commit with ``extra`` seconds added after each ``fdatasync``, with
    and without the wait for owed appenders, ``rounds`` interleaved rounds of ``n`` appends per
    thread: ``{"owed wait": [...], "none": [...]}`` (ev/s)."""
    from memfs.store import writer
    real_sync, shipped = os.fdatasync, writer.OWED_WAIT_MAX

    def slow_sync(fd: int) -> None:
        real_sync(fd)
        time.sleep(extra)

    rates: dict[str, list[float]] = {"owed wait": [], "none": []}
    os.fdatasync = slow_sync
    try:
        for _ in range(rounds):
            for name, limit in (("owed wait", shipped), ("none", 0.0)):
                writer.OWED_WAIT_MAX = limit
                rates[name].append(library_group_commit(handle, n))
    finally:
        os.fdatasync, writer.OWED_WAIT_MAX = real_sync, shipped
    return rates


def build_reference(work: Path) -> Path | None:
    """Compile ``scripts/groupcommit_ref.c`` into ``work``; None (and why, on stderr) when it
    cannot be built here."""
    exe = work / "groupcommit_ref"
    cc = shlex.split(sysconfig.get_config_var("CC") or "cc")
    try:
        subprocess.run([*cc, "-O2", "-o", str(exe), str(ROOT / "scripts" / "groupcommit_ref.c"), "-lpthread"],
                       check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"the C group-commit reference is left out: it does not build here ({exc})", file=sys.stderr)
        return None
    return exe


def reference_group_commit(exe: Path, path: Path, n: int) -> float:
    """Events per second of the C reference: THREADS threads × ``n`` appends to ``path``."""
    out = subprocess.run([str(exe), str(path), str(THREADS), str(n)], check=True, capture_output=True, text=True)
    return float(out.stdout.split()[0])


BREAKDOWN_RATES = ("native write() only, 1 thread", "nullfs (do-nothing pyfuse3), 1 writer",
                   "floor without its fdatasync, 1 writer", "memfs write-mode mount, 1 writer")


def breakdown(rates: dict[str, list[float]], parts: dict[str, list[float]], loop_us: dict[str, list[float]]) -> str:
    """The table of where one durable append's time goes, one writer: each part a difference
    of per-event times (µs) measured side by side in the same round, its median over the
    rounds (so the parts add up to the total only roughly)."""
    def us(table: dict[str, list[float]], key: str) -> list[float]:
        return [1e6 / rate for rate in table[key]]

    native, write = us(rates, "native 1 thread"), us(parts, "native write() only, 1 thread")
    null, bare = us(parts, "nullfs (do-nothing pyfuse3), 1 writer"), us(parts, "floor without its fdatasync, 1 writer")
    plain, memfs = us(parts, "memfs write-mode mount, 1 writer"), us(rates, "memfs fsync mount, 1 writer")
    floor = us(rates, "floor: pyfuse3 write+fdatasync inline, 1 writer")
    sync = [a - b for a, b in zip(native, write)]

    def med(values) -> str:
        return f"{statistics.median(list(values)):8.0f}"

    blank = f"{'—':>8}"
    rows = [
        ("FUSE round trip: kernel, wake-ups (nullfs − its loop's CPU)", blank,
         med(a - b for a, b in zip(null, loop_us["nullfs"])), None),
        ("event loop: pyfuse3 + trio per request (nullfs's loop CPU)", blank, med(loop_us["nullfs"]), None),
        ("validation + write() (floor without fdatasync − nullfs; native: write())", med(write),
         med(a - b for a, b in zip(bare, null)), None),
        ("memfs's commit beyond that (memfs write mode − floor without fdatasync)", blank, blank,
         med(a - b for a, b in zip(plain, bare))),
        ("hand-off to the syncer and back (memfs fsync − write mode − fdatasync)", blank, blank,
         med(a - b - c for a, b, c in zip(memfs, plain, sync))),
        ("  of it, the loop's CPU (memfs fsync − write mode, loop CPU)", blank, blank,
         med(a - b for a, b in zip(loop_us["memfs fsync"], loop_us["memfs write"]))),
        ("fdatasync (native write+fdatasync − write(); floor: with − without)", med(sync),
         med(a - b for a, b in zip(floor, bare)), med(sync)),
        ("total: one append, median", med(native), med(floor), med(memfs)),
        ("  the event loop's CPU per append", blank, med(loop_us["floor"]), med(loop_us["memfs fsync"])),
    ]
    width = max(len(r[0]) for r in rows)
    lines = ["where one durable append's time goes, 1 writer (µs per append; each part a difference of per-append "
             "times measured in the same round, its median over the rounds; the floor's column: the same parts "
             "of the floor server, its loop CPU per append measured without fdatasync)",
             f"{'part':<{width}}  {'native':>8}  {'floor':>8}  {'memfs':>8}"]
    for name, a, b, c in rows:
        if c is None:  # the floor's parts are memfs's too (nullfs and the floor's work are in memfs's round trip)
            c = b
        lines.append(f"{name:<{width}}  {a}  {b}  {c}")
    spread = statistics.quantiles(native, n=4, method="inclusive") if len(native) > 1 else [native[0]] * 3
    lines.append(f"(the time parts are differences of rates taken moments apart, so they hold only while the disk's "
                 f"speed does — native's append took {spread[0]:.0f}–{spread[2]:.0f} µs between the rounds' quartiles "
                 f"here; while it moves they can even come out below 0. The loop-CPU rows do not depend on the disk.)")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--events", type=int, default=400, help="events per writer per round")
    ap.add_argument("--slow-rounds", type=int, default=3, help="rounds of the emulated slow disk (0: none)")
    ap.add_argument("--dir", help="where the files go (default: a temporary directory in /tmp)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="memfs-bench-dur-", dir=args.dir))
    native = work / "native"
    native.mkdir()
    create = os.O_WRONLY | os.O_APPEND | os.O_CREAT
    store, mnt = work / "store", work / "mnt"
    mnt.mkdir()
    proc = floor = null = bare = plain = None
    handle = slow = None
    placements: list[int] = []  # the memfs server's event loop's CPU, sampled around its rounds
    rates: dict[str, list[float]] = {k: [] for k in (
        "native 1 thread", "native 8 threads x 8 files", "memfs fsync mount, 1 writer",
        "memfs fsync mount, 8 writers x 8 sessions", "library fsync, 8 threads, 1 session",
        "library fsync, 8 threads on one CPU, 1 session",
        "floor: pyfuse3 write+fdatasync inline, 1 writer", "C reference: group commit, 8 threads, 1 file")}
    parts = {k: [] for k in BREAKDOWN_RATES}  # the breakdown's own rows (breakdown())
    loop_us: dict[str, list[float]] = {k: [] for k in ("nullfs", "floor", "memfs write", "memfs fsync")}
    reference = build_reference(work)
    irq_cpus = disk_irq_cpus(work)  # the CPUs that take the disk's interrupts (empty: unknown)
    try:
        floor_mnt = work / "floor"
        floor_mnt.mkdir()
        floor = start_server([sys.executable, str(ROOT / "scripts" / "nullfs.py"), str(floor_mnt)], floor_mnt,
                             work / "floor.log", env={**os.environ, "NULLFS_DIRECT_IO": "1",
                                                      "NULLFS_FLOOR": str(work / "floor.jsonl"),
                                                      "NULLFS_FLOOR_SYNC": "1"})
        # the breakdown's servers: do-nothing pyfuse3, the floor without its fdatasync, memfs in write mode
        null_mnt, bare_mnt, plain_mnt = work / "null", work / "bare", work / "plain"
        for d in (null_mnt, bare_mnt, plain_mnt):
            d.mkdir()
        null = start_server([sys.executable, str(ROOT / "scripts" / "nullfs.py"), str(null_mnt)], null_mnt,
                            work / "null.log", env={**os.environ, "NULLFS_DIRECT_IO": "1"})
        bare = start_server([sys.executable, str(ROOT / "scripts" / "nullfs.py"), str(bare_mnt)], bare_mnt,
                            work / "bare.log", env={**os.environ, "NULLFS_DIRECT_IO": "1",
                                                    "NULLFS_FLOOR": str(work / "bare.jsonl")})
        plain = start_server([sys.executable, "-m", "memfs", "mount", str(work / "plain-store"), str(plain_mnt),
                              "--durability", "write", "--max-events", "0", "--log-level", "WARNING"],
                             plain_mnt, work / "plain.log")
        (plain_mnt / "sessions" / "s0").mkdir()
        plain_log = plain_mnt / "sessions" / "s0" / "events.jsonl"
        proc = start_server([sys.executable, "-m", "memfs", "mount", str(store), str(mnt), "--durability", "fsync",
                             "--max-events", "0", "--log-level", "WARNING"], mnt, work / "server.log")
        sessions = []
        for i in range(THREADS):
            (mnt / "sessions" / f"s{i}").mkdir()
            sessions.append(mnt / "sessions" / f"s{i}" / "events.jsonl")
        handle = memfs.open_session(work / "lib", "g", durability="fsync", max_events=0)
        allowed = os.sched_getaffinity(0)
        one_cpu = min(irq_cpus & allowed or allowed)  # where the disk's completions arrive
        n = args.events
        run_threads([native / "warm"], 50, True, create)  # warm-up
        run_threads(sessions, 50, False)
        for path in (floor_mnt / "sink", null_mnt / "sink", bare_mnt / "sink", plain_log):
            run_threads([path], 50, False)
        for _ in range(args.rounds):
            rates["native 1 thread"].append(run_threads([native / "one"], n, True, create))
            parts["native write() only, 1 thread"].append(run_threads([native / "plain"], n, False, create))
            timed_on(null.pid, parts["nullfs (do-nothing pyfuse3), 1 writer"], loop_us["nullfs"],
                     run_threads, [null_mnt / "sink"], n, False)
            timed_on(bare.pid, parts["floor without its fdatasync, 1 writer"], loop_us["floor"],
                     run_threads, [bare_mnt / "sink"], n, False)
            timed_on(plain.pid, parts["memfs write-mode mount, 1 writer"], loop_us["memfs write"],
                     run_threads, [plain_log], n, False)
            placements.append(loop_cpu(proc.pid))
            timed_on(proc.pid, rates["memfs fsync mount, 1 writer"], loop_us["memfs fsync"],
                     run_threads, sessions[:1], n, False)  # the mount syncs
            rates["native 8 threads x 8 files"].append(
                run_threads([native / f"f{i}" for i in range(THREADS)], n, True, create))
            rates["memfs fsync mount, 8 writers x 8 sessions"].append(run_threads(sessions, n, False))
            placements.append(loop_cpu(proc.pid))
            rates["library fsync, 8 threads, 1 session"].append(library_group_commit(handle, n))
            rates["library fsync, 8 threads on one CPU, 1 session"].append(library_group_commit(handle, n, one_cpu))
            rates["floor: pyfuse3 write+fdatasync inline, 1 writer"].append(
                run_threads([floor_mnt / "sink"], n, False))  # the floor server syncs
            if reference is not None:
                rates["C reference: group commit, 8 threads, 1 file"].append(
                    reference_group_commit(reference, native / "reference", n))
        slow = slow_disk_group_commit(handle, min(n, 200), args.slow_rounds) if args.slow_rounds > 0 else None
    finally:
        if handle is not None:
            handle.close()
        if proc is not None:
            stop_server(proc, mnt)
        for server, where in ((floor, work / "floor"), (null, work / "null"), (bare, work / "bare"),
                              (plain, work / "plain")):
            if server is not None:
                stop_server(server, where)
    results = {f"{k} ev/s": statistics.median(v) for k, v in rates.items() if v}

    per_round: dict[str, list[float]] = {}  # each ratio's value in each round, by the ratio's name

    def ratio(name: str, a: str, b: str, table: dict[str, list[float]] = rates) -> None:
        """``results[name]``: the median of the per-round ratios of ``table``'s rates ``a`` and
        ``b``."""
        per_round[name] = [x / y for x, y in zip(table[a], table[b])]
        results[name] = statistics.median(per_round[name])

    def quartiles(name: str) -> str:
        """The first and third quartiles of a ratio's per-round values: how far one round's
        ratio strays from the median that the goal is judged by."""
        values = per_round[name]
        if len(values) < 2:
            return ""
        q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
        return f"; rounds' quartiles {q1:.2f}–{q3:.2f}"

    ratio("mount 1 writer / native 1 thread", "memfs fsync mount, 1 writer", "native 1 thread")
    ratio("mount 8x8 / native 8x8", "memfs fsync mount, 8 writers x 8 sessions", "native 8 threads x 8 files")
    ratio("library 8 threads / native 1 thread", "library fsync, 8 threads, 1 session", "native 1 thread")
    ratio("library 8 threads on one CPU / native 1 thread", "library fsync, 8 threads on one CPU, 1 session",
          "native 1 thread")
    ratio("library 8 threads on one CPU / on any", "library fsync, 8 threads on one CPU, 1 session",
          "library fsync, 8 threads, 1 session")
    ratio("floor 1 writer / native 1 thread", "floor: pyfuse3 write+fdatasync inline, 1 writer", "native 1 thread")
    ratio("mount 1 writer / floor 1 writer", "memfs fsync mount, 1 writer",
          "floor: pyfuse3 write+fdatasync inline, 1 writer")
    if reference is not None:
        ratio("C reference 8 threads / native 1 thread", "C reference: group commit, 8 threads, 1 file",
              "native 1 thread")
        ratio("library 8 threads / C reference", "library fsync, 8 threads, 1 session",
              "C reference: group commit, 8 threads, 1 file")
    if slow is not None:
        for name, values in slow.items():
            results[f"slow disk (+1 ms per fdatasync): library, 8 threads, {name} ev/s"] = statistics.median(values)
        ratio("slow disk: owed wait / none", "owed wait", "none", slow)
    if irq_cpus and placements:
        results["memfs loop samples on the disk-interrupt CPUs (share)"] = (
            sum(cpu in irq_cpus for cpu in placements) / len(placements))
    goals = {goal: {"met": results[key] >= target, "measured": f"{results[key]:.3f}{quartiles(key)}"}
             for goal, key, target in (
                 ("fsync mount, 1 writer >= 0.6 of native 1 thread", "mount 1 writer / native 1 thread", 0.6),
                 ("fsync mount, 8 writers x 8 sessions >= 0.5 of native 8x8", "mount 8x8 / native 8x8", 0.5),
                 ("library 8 threads 1 session >= 3x native 1 thread", "library 8 threads / native 1 thread", 3))}
    width = max(map(len, results))
    print(f"workload: 300-byte events, one write() each, fdatasync per event; {args.rounds} interleaved rounds of "
          f"{args.events} events per writer (medians; ratios are medians of neighbours' ratios)")
    for key, value in results.items():
        print(f"{key:<{width}}  {value:,.2f}" if value < 100 else f"{key:<{width}}  {value:,.0f}")
    print(f"placement: the memfs server's event loop ran on CPU {', '.join(map(str, placements))} (sampled "
          f"around its rounds); the store's disk interrupts go to CPU "
          f"{', '.join(map(str, sorted(irq_cpus))) or 'unknown'}; the library's threads on one CPU ran on CPU {one_cpu}")
    if rates["native 1 thread"]:
        print(breakdown(rates, parts, loop_us))
    report_goals(results, goals, args.json)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
