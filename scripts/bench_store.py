#!/usr/bin/env python3
"""Session-store benchmark (issue 2): append throughput, rescan speed, fast-path open time and
rescan memory, measured through the library (no mount). Nothing is asserted; it prints a
table and, with ``--json FILE``, writes ``{"results": {...}, "goals": {...}}``.

Workloads (every event line is exactly 300 bytes with its newline):

* appends: ``SessionHandle.append`` per event (the library's single-event call), turns of 100
  and of 1,000 events, in ``buffered`` and ``write`` mode, ``max_events=0`` (no cap: the cap is
  a separate row), default ``metadata_interval``; ``append_many`` with one call per turn of
  100 (the goals are judged on ``append``); ``fsync`` mode one thread, eight threads (group
  commit) and ``append_many`` batches of 100. The four ``append`` configurations run 200,000
  events each, in 7 interleaved rounds, best round reported (see :func:`bench_appends`); the
  goals take the slower turn size. Rates are wall-clock; the CPU-time rate beside them
  (events per second of this thread's CPU) shows what the code costs when the machine is
  shared;
* the amortized cap (issue 14): ``memfs append`` (``memfs.cli.main`` in-process: the CLI's
  own loop, ``write`` durability) of 220,000 events in 20,000 turns of 11, at the default cap
  (10,000, ``evict_to`` 0.9) and with ``--max-events 0``, in 3 interleaved rounds (the ratio
  is the median of the per-round ratios), with the summaries left and the events evicted;
  and one run at ``evict_to`` 1.0, the behaviour before the amortized cap (``--no-before``
  skips it: it takes minutes);
* rescan: ``open_session`` of a ~200 MB log with no metadata (rescan + metadata write, best of
  3), and the bare ``rescan()`` of the same bytes (best of 5);
* fast-path open: a 1,000,000-event / 100,000-turn log written directly, opened once to write
  its metadata, then ``open_session`` timed (median of 7), with and without ``turns.cache``;
* rescan memory: peak RSS (``VmHWM``) of a fresh process that opens a 1 GB log with no
  metadata, next to the RSS of one that only imports memfs.

Big files go under ``--dir`` (default: a temporary directory in /tmp) and are deleted at the
end; peak disk use is about 1.3 GB (``--quick``: about 60 MB).

Usage: ``.venv/bin/python scripts/bench_store.py [--quick] [--json FILE] [--dir DIR]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import memfs
from memfs.samples import padded, sized_message
from memfs.store.recovery import OpenReport, rescan

LINE_BYTES = 300
GOALS = {
    "buffered": 250_000,
    "write": 150_000,
    "rescan_MBps": 100,
    "fast_open_ms": 50,
    "rescan_rss_MB": 100,
}


START = padded({"type": "turn.started", "context": {"task_id": ""}}, "context.task_id", LINE_BYTES)
DONE = padded({"type": "turn.completed", "usage": {"input_tokens": 1200, "output_tokens": 95},
               "completed_at": ""}, "completed_at", LINE_BYTES)


MESSAGES = [sized_message(i, LINE_BYTES)[:-1] for i in range(1000)]


def turn_lines(size: int, offset: int = 0) -> list[bytes]:
    return [START, *(MESSAGES[(offset + i) % 1000] for i in range(size - 2)), DONE]


def rate(n: int, wall: float, cpu: float) -> dict:
    return {"ev_s": n / wall, "cpu_ev_s": n / cpu if cpu else 0.0}


# --- appends ---------------------------------------------------------------------------------


def append_run(work: Path, mode: str, turn: int, n: int) -> dict:
    """One run of ``n`` appends, one ``append`` call per event, turns of ``turn`` events."""
    root = work / f"append-{mode}-{turn}"
    lines = turn_lines(turn)
    h = memfs.open_session(root, "s", durability=mode, max_events=0)
    app = h.append
    t, c = time.perf_counter(), time.thread_time()
    for _ in range(n // turn):
        for line in lines:
            app(line)
    h.close()  # included: the last persist is part of the work
    got = rate(n // turn * turn, time.perf_counter() - t, time.thread_time() - c)
    shutil.rmtree(root)
    return got


def bench_appends(work: Path, configs: list[tuple[str, int]], n: int, rounds: int) -> dict:
    """The best of ``rounds`` runs per (mode, turn) config, the configs interleaved round by
    round (in a rotating order): a small VM's speed drifts a lot within seconds (even a pure-CPU
    loop's), so the best run is what the code costs, and
    interleaving gives every config the same chance of the machine's good moments."""
    best: dict = {}
    for r in range(rounds):
        for k in range(len(configs)):
            config = configs[(r + k) % len(configs)]
            got = append_run(work, *config, n)
            if config not in best or got["ev_s"] > best[config]["ev_s"]:
                best[config] = got
    return best


def bench_append_many(work: Path, mode: str, n: int, repeats: int) -> dict:
    """Best of ``repeats`` runs of ``n`` events in ``append_many`` calls of one turn (100)."""
    best = None
    for r in range(repeats):
        root = work / f"many-{mode}-{r}"
        lines = turn_lines(100)
        h = memfs.open_session(root, "s", durability=mode, max_events=0)
        many = h.append_many
        t, c = time.perf_counter(), time.thread_time()
        for _ in range(n // 100):
            many(lines)
        h.close()
        got = rate(n // 100 * 100, time.perf_counter() - t, time.thread_time() - c)
        shutil.rmtree(root)
        if best is None or got["ev_s"] > best["ev_s"]:
            best = got
    return best


def bench_append_capped(work: Path, n: int) -> dict:
    """Buffered appends with the default cap (10,000): turns of 100 evicted as they close."""
    root = work / "append-capped"
    lines = turn_lines(100)
    h = memfs.open_session(root, "s", durability="buffered")
    t, c = time.perf_counter(), time.thread_time()
    for _ in range(n // 100):
        for line in lines:
            h.append(line)
    h.close()
    got = rate(n // 100 * 100, time.perf_counter() - t, time.thread_time() - c)
    shutil.rmtree(root)
    return got


def capped_input(work: Path, turns: int, turn: int) -> Path:
    """The input of the capped-append comparison: ``turns`` turns of ``turn`` 300-byte events."""
    path = work / f"capped-input-{turns}x{turn}.jsonl"
    with open(path, "wb") as f:
        for t in range(turns):
            f.write(b"\n".join(turn_lines(turn, t)) + b"\n")
    return path


def capped_run(work: Path, source: Path, max_events: int, evict_to: float) -> dict:
    """One ``memfs append`` of ``source`` into a new store (the CLI's own code, in-process:
    ``memfs.cli.main``, ``write`` durability, one ``append`` per line), and what it left:
    rate, summaries and events evicted."""
    import contextlib
    import io

    from memfs import cli

    root = work / f"capped-{max_events}-{evict_to}"
    argv = ["append", "s", str(source), "--store", str(root), "--max-events", str(max_events),
            "--evict-to", str(evict_to)]
    t, c = time.perf_counter(), time.thread_time()
    with contextlib.redirect_stdout(io.StringIO()) as out:
        code = cli.main(argv)
    wall, cpu = time.perf_counter() - t, time.thread_time() - c
    if code != 0:
        raise RuntimeError(f"memfs append failed ({code}): {out.getvalue()}")
    manifest = json.loads((root / "s" / "manifest.json").read_bytes())
    appended = sum(1 for _ in open(source, "rb"))
    summaries = list((root / "s" / "derived").glob("eviction-summary-*.json")) if max_events else []
    got = {**rate(appended, wall, cpu), "s": wall, "events": appended, "turns": manifest["turn_count"],
           "summaries": len(summaries), "summary_bytes": sum(p.stat().st_size for p in summaries),
           "evicted": appended - manifest["event_count"], "log_bytes": (root / "s" / "events.jsonl").stat().st_size}
    shutil.rmtree(root)
    return got


def bench_capped_vs_uncapped(work: Path, turns: int, turn: int, rounds: int, before: bool) -> dict:
    """``memfs append`` of ``turns × turn`` events at the default cap (10,000, ``evict_to``
    0.9) and with no cap, in ``rounds`` interleaved rounds (alternating which goes first),
    best round each, and the ratio of the two per round (its median: the drift of this
    machine's speed hits both runs of a round alike). ``before``: one run more at
    ``evict_to`` 1.0 (the behaviour before the amortized cap), in the middle of the rounds —
    once only: it takes minutes."""
    source = capped_input(work, turns, turn)
    configs = {"uncapped": (0, 0.9), "capped 0.9": (10_000, 0.9)}
    best: dict = {}
    ratios = []
    old = None
    for r in range(rounds):
        got = {}
        for name in (list(configs) if r % 2 == 0 else list(configs)[::-1]):
            got[name] = capped_run(work, source, *configs[name])
            if name not in best or got[name]["ev_s"] > best[name]["ev_s"]:
                best[name] = got[name]
        ratios.append(got["capped 0.9"]["ev_s"] / got["uncapped"]["ev_s"])
        if before and old is None and r >= rounds // 2:
            old = capped_run(work, source, 10_000, 1.0)
    source.unlink()
    return {"best": best, "ratio_median": statistics.median(ratios), "ratios": ratios, "before": old}


def bench_fsync(work: Path, n: int, threads: int, batch: int) -> dict:
    root = work / f"fsync-{threads}-{batch}"
    h = memfs.open_session(root, "s", durability="fsync", max_events=0)
    h.append(START)
    per = n // threads

    def writer(k: int) -> None:
        if batch == 1:
            for i in range(per):
                h.append(MESSAGES[(k * per + i) % 1000])
        else:
            for i in range(0, per, batch):
                h.append_many(MESSAGES[(k + j) % 1000] for j in range(i, i + batch))

    t = time.perf_counter()
    pool = [threading.Thread(target=writer, args=(k,)) for k in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    wall = time.perf_counter() - t
    h.close()
    shutil.rmtree(root)
    return {"ev_s": per * threads / wall}


# --- logs written directly -------------------------------------------------------------------


def write_log(path: Path, turns: int, turn: int) -> int:
    """A log of ``turns`` turns of ``turn`` events, written in big blocks; its size."""
    path.parent.mkdir(parents=True, exist_ok=True)
    block_turns = max(1, (1 << 20) // (turn * LINE_BYTES))
    block = b"".join(b"".join(line + b"\n" for line in turn_lines(turn, k)) for k in range(block_turns))
    with open(path, "wb") as f:
        done = 0
        while done < turns:
            k = min(block_turns, turns - done)
            f.write(block if k == block_turns else block[: k * turn * LINE_BYTES])
            done += k
    return path.stat().st_size


def forget_metadata(sdir: Path) -> None:
    for name in ("manifest.json", "index/turns.json", "index/turns.cache"):
        try:
            os.unlink(sdir / name)
        except FileNotFoundError:
            pass


def bench_rescan(work: Path, turns: int) -> dict:
    root = work / "rescan"
    sdir = root / "s"
    size = write_log(sdir / "events.jsonl", turns, 100)
    out = {"bytes": size}
    for _ in range(3):  # the first run also warms the page cache
        forget_metadata(sdir)
        t, c = time.perf_counter(), time.thread_time()
        h = memfs.open_session(root, "s", max_events=0)
        h.lock()  # the writer's open: rescan + metadata write, one pass over the log
        wall, cpu = time.perf_counter() - t, time.thread_time() - c
        assert not h.open_report.fast_path and h.open_report.scanned_bytes == size
        h.close()
        out["open_MBps"] = max(out.get("open_MBps", 0), size / 1e6 / wall)
        out["open_cpu_MBps"] = max(out.get("open_cpu_MBps", 0), size / 1e6 / cpu)
    fd = os.open(sdir / "events.jsonl", os.O_RDONLY)
    try:
        for _ in range(5):  # best of 5: see bench_appends on this machine's drift
            t, c = time.perf_counter(), time.thread_time()
            rescan(fd, size, OpenReport())
            wall, cpu = time.perf_counter() - t, time.thread_time() - c
            out["rescan_MBps"] = max(out.get("rescan_MBps", 0), size / 1e6 / wall)
            out["rescan_cpu_MBps"] = max(out.get("rescan_cpu_MBps", 0), size / 1e6 / cpu)
    finally:
        os.close(fd)
    shutil.rmtree(root)
    return out


def bench_fast_open(work: Path, events: int, turn: int, samples: int) -> dict:
    root = work / "fastopen"
    sdir = root / "s"
    size = write_log(sdir / "events.jsonl", events // turn, turn)
    h = memfs.open_session(root, "s", max_events=0)
    h.lock()  # as the writer: the rescan writes metadata (a reader's open repairs nothing)
    assert h.manifest["event_count"] == events and len(h.turn_index) == events // turn
    h.close()
    out = {"bytes": size, "events": events, "turns": events // turn}
    for label in ("cache", "json"):
        if label == "json" and (sdir / "index" / "turns.cache").exists():
            os.unlink(sdir / "index" / "turns.cache")
        times = []
        for _ in range(samples):
            t = time.perf_counter()
            h = memfs.open_session(root, "s", max_events=0)
            times.append(time.perf_counter() - t)
            report = h.open_report
            h.close()
            assert report.fast_path, report.reason
        out[f"{label}_source"] = report.index_source
        out[f"{label}_median_ms"] = statistics.median(times) * 1000
        out[f"{label}_min_ms"] = min(times) * 1000
    shutil.rmtree(root)
    return out


# Peak RSS is the child's VmHWM (this address space's high-water mark, in kB). ru_maxrss would
# also count the benchmark process itself: a forked child inherits its parent's maximum.
RSS_CHILD = """
import sys, time
import memfs

def hwm():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))

base = hwm()
if sys.argv[2] == "open":
    t = time.perf_counter()
    h = memfs.open_session(sys.argv[1], "s", max_events=0)
    h.lock()
    assert not h.open_report.fast_path
    print(h.open_report.scanned_bytes, time.perf_counter() - t, end=" ")
    h.close()
print(base, hwm())
"""


def bench_rescan_rss(work: Path, size_bytes: int) -> dict:
    root = work / "rss"
    sdir = root / "s"
    turns = size_bytes // (100 * LINE_BYTES)
    size = write_log(sdir / "events.jsonl", turns, 100)
    base = subprocess.run([sys.executable, "-c", RSS_CHILD, str(root), "import"], capture_output=True, text=True,
                          check=True).stdout.split()
    res = subprocess.run([sys.executable, "-c", RSS_CHILD, str(root), "open"], capture_output=True, text=True,
                         check=True).stdout.split()
    shutil.rmtree(root)
    scanned, seconds, _, peak_kb = int(res[0]), float(res[1]), int(res[2]), int(res[3])
    assert scanned == size
    return {"bytes": size, "peak_rss_MB": peak_kb / 1024, "import_only_rss_MB": int(base[1]) / 1024,
            "open_s": seconds, "open_MBps": size / 1e6 / seconds}


# --- report ----------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small workloads: a smoke run")
    ap.add_argument("--json", metavar="FILE", help="write the results as JSON")
    ap.add_argument("--dir", help="where the big files go (default: a new directory in /tmp)")
    ap.add_argument("--no-before", action="store_true",
                    help="skip the capped append at evict_to 1.0 (the behaviour before the amortized cap: minutes)")
    args = ap.parse_args()
    q = args.quick
    work = Path(tempfile.mkdtemp(prefix="memfs-bench-store-", dir=args.dir or "/tmp"))
    n = 20_000 if q else 200_000
    results: dict = {}
    rows: list[tuple[str, str, str]] = []
    try:
        load_before = os.getloadavg()[0]
        configs = [(mode, turn) for mode in ("buffered", "write") for turn in (100, 1000)]
        best = bench_appends(work, configs, n, 1 if q else 7)
        for mode, turn in configs:
            r = best[(mode, turn)]
            results[f"append {mode}, turns of {turn} ev/s"] = r["ev_s"]
            results[f"append {mode}, turns of {turn}, per CPU-second ev/s"] = r["cpu_ev_s"]
            rows.append((f"append {mode}, turns of {turn}", f"{r['ev_s']:,.0f} ev/s",
                         f"{r['cpu_ev_s']:,.0f} ev/CPU-s"))
        for mode in ("buffered", "write"):
            r = bench_append_many(work, mode, n, 1 if q else 3)
            results[f"append_many {mode}, one call per turn of 100 ev/s"] = r["ev_s"]
            rows.append((f"append_many {mode}, one call per turn of 100", f"{r['ev_s']:,.0f} ev/s",
                         f"{r['cpu_ev_s']:,.0f} ev/CPU-s"))
        r = bench_append_capped(work, n // 3)
        results["append buffered, default cap 10,000, turns of 100 ev/s"] = r["ev_s"]
        rows.append(("append buffered, default cap 10,000 (evicting)", f"{r['ev_s']:,.0f} ev/s",
                      f"{r['cpu_ev_s']:,.0f} ev/CPU-s"))
        cap_turns = 2_000 if q else 20_000
        r = bench_capped_vs_uncapped(work, cap_turns, 11, 1 if q else 3, before=not args.no_before)
        capped, uncapped, old = r["best"]["capped 0.9"], r["best"]["uncapped"], r["before"]
        label = f"memfs append of {cap_turns * 11:,} events in {cap_turns:,} turns"
        results[f"{label}, no cap ev/s"] = uncapped["ev_s"]
        results[f"{label}, cap 10,000 evict_to 0.9 ev/s"] = capped["ev_s"]
        results[f"{label}, cap 10,000 evict_to 0.9 / no cap (median of rounds)"] = r["ratio_median"]
        results[f"{label}, cap 10,000 evict_to 0.9 summaries"] = capped["summaries"]
        results[f"{label}, cap 10,000 evict_to 0.9 events evicted"] = capped["evicted"]
        rows.append((f"{label}, no cap", f"{uncapped['ev_s']:,.0f} ev/s", f"{uncapped['s']:.1f} s"))
        rows.append(("  cap 10,000, evict_to 0.9 (the default)", f"{capped['ev_s']:,.0f} ev/s",
                     f"{capped['s']:.1f} s; {r['ratio_median']:.2f} of no cap (median of rounds "
                     f"{', '.join(f'{x:.2f}' for x in r['ratios'])}); {capped['summaries']} summaries "
                     f"({capped['summary_bytes'] / 1e6:.1f} MB) for {capped['evicted']:,} evicted events"))
        if old is not None:
            results[f"{label}, cap 10,000 evict_to 1.0 (before) ev/s"] = old["ev_s"]
            results[f"{label}, cap 10,000 evict_to 1.0 (before) summaries"] = old["summaries"]
            rows.append(("  cap 10,000, evict_to 1.0 (before: just under the cap)", f"{old['ev_s']:,.0f} ev/s",
                         f"{old['s']:.1f} s; {old['summaries']:,} summaries ({old['summary_bytes'] / 1e6:.1f} MB) "
                         f"for {old['evicted']:,} evicted events; one run"))
        per_1000 = capped["summaries"] / (capped["evicted"] / 1000) if capped["evicted"] else 0.0
        for label_, threads, batch, count in (("fsync, 1 thread", 1, 1, 300 if q else 2000),
                                             ("fsync, 8 threads (group commit)", 8, 1, 800 if q else 8000),
                                             ("fsync, append_many of 100", 1, 100, 2000 if q else 50_000)):
            r = bench_fsync(work, count, threads, batch)
            results[f"append {label_} ev/s"] = r["ev_s"]
            rows.append((f"append {label_}", f"{r['ev_s']:,.0f} ev/s", ""))

        r = bench_rescan(work, 200 if q else 7000)
        results["rescan log MB"] = r["bytes"] / 1e6
        results["rescan() MB/s"] = r["rescan_MBps"]
        results["rescan() per CPU-second MB/s"] = r["rescan_cpu_MBps"]
        results["open with rescan MB/s"] = r["open_MBps"]
        rows.append((f"rescan() of {r['bytes'] / 1e6:.0f} MB", f"{r['rescan_MBps']:.0f} MB/s",
                     f"{r['rescan_cpu_MBps']:.0f} MB/CPU-s"))
        rows.append((f"open with rescan of {r['bytes'] / 1e6:.0f} MB", f"{r['open_MBps']:.0f} MB/s",
                     f"{r['open_cpu_MBps']:.0f} MB/CPU-s"))

        events = 20_000 if q else 1_000_000
        r = bench_fast_open(work, events, 10, 3 if q else 7)
        results["fast-path open events"] = r["events"]
        results["fast-path open turns"] = r["turns"]
        results["fast-path open median ms"] = r["cache_median_ms"]
        results["fast-path open without turns.cache median ms"] = r["json_median_ms"]
        rows.append((f"fast-path open, {r['events']:,} events / {r['turns']:,} turns", f"{r['cache_median_ms']:.1f} ms",
                     f"min {r['cache_min_ms']:.1f} ms ({r['cache_source']})"))
        rows.append(("  same, turns.cache deleted", f"{r['json_median_ms']:.1f} ms", f"({r['json_source']})"))

        r = bench_rescan_rss(work, (40 if q else 1000) * 1_000_000)
        results["rescan RSS log MB"] = r["bytes"] / 1e6
        results["rescan peak RSS MB"] = r["peak_rss_MB"]
        results["import-only RSS MB"] = r["import_only_rss_MB"]
        rows.append((f"peak RSS, open with rescan of {r['bytes'] / 1e6:.0f} MB", f"{r['peak_rss_MB']:.0f} MB",
                     f"import only: {r['import_only_rss_MB']:.0f} MB; {r['open_MBps']:.0f} MB/s"))
        load_after = os.getloadavg()[0]
    finally:
        shutil.rmtree(work, ignore_errors=True)

    fast_goal = "fast-path open of 1,000,000 events / 100,000 turns < 50 ms"
    goals = {
        "library appends, buffered ≥ 250,000 ev/s": _goal(
            min(results["append buffered, turns of 100 ev/s"], results["append buffered, turns of 1000 ev/s"]),
            GOALS["buffered"], "{:,.0f} ev/s"),
        "library appends, write ≥ 150,000 ev/s": _goal(
            min(results["append write, turns of 100 ev/s"], results["append write, turns of 1000 ev/s"]),
            GOALS["write"], "{:,.0f} ev/s"),
        "rescan ≥ 100 MB/s": _goal(results["rescan() MB/s"], GOALS["rescan_MBps"], "{:.0f} MB/s"),
        fast_goal: _goal(results["fast-path open median ms"], GOALS["fast_open_ms"], "{:.1f} ms", below=True),
        "rescan of a 1 GB log < 100 MB RSS": _goal(results["rescan peak RSS MB"], GOALS["rescan_rss_MB"], "{:.0f} MB",
                                                   below=True),
        "memfs append at the default cap ≥ 0.5 of its uncapped speed (220,000 events, 20,000 turns)": _goal(
            results[f"{label}, cap 10,000 evict_to 0.9 / no cap (median of rounds)"], 0.5, "{:.2f}"),
        "≤ 1 eviction summary per 1,000 evicted events": _goal(
            per_1000, 1.0, "{:.3f} per 1,000", below=False) | {"met": per_1000 <= 1.0},
    }
    if q:
        goals = {f"{k} (quick run: not the measured sizes)": v for k, v in goals.items()}
    results["load average before/after"] = f"{load_before:.2f} / {load_after:.2f} on {os.cpu_count()} cores"

    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  {'value':>16}  note")
    for name, value, note in rows:
        print(f"{name:<{width}}  {value:>16}  {note}")
    print(f"\nload average {results['load average before/after']}; 300-byte events; best of runs for rates")
    print("\ngoals:")
    for goal, g in goals.items():
        print(f"  {'met   ' if g['met'] else 'NOT met'}  {goal}: {g['measured']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "goals": goals}, indent=2) + "\n")
    return 0


def _goal(value: float, target: float, fmt: str, below: bool = False) -> dict:
    return {"measured": fmt.format(value), "met": value < target if below else value >= target}


if __name__ == "__main__":
    sys.exit(main())
