#!/usr/bin/env python3
"""One benchmark report for memfs: ``bench/REPORT.md`` and ``bench/chart.png``.

Everything is measured in one run on this machine, side by side, and reported as ratios
against the physical limits and peers:

* appends: native ``write()`` to a plain file and native ``write()+fdatasync()`` per event
  (the limits), the library in each durability mode (``scripts/bench_store.py``), the mount
  in each mode and a do-nothing pyfuse3 filesystem (``scripts/bench_fs.py``);
* fast-path open and rescan versus log size, 10^3 … 10^6 events;
* ``cat derived/memory.json`` right after one append, through the mount, versus session size;
* derived views and search (``scripts/bench_views.py``, ``scripts/bench_search.py`` with
  rank_bm25 and bm25s beside memfs);
* the daemon's RSS with 1,000 sessions and 1,000,000 events mounted;
* many sessions: a store-wide mount of 10,000 and 100,000 small sessions — mount, ``ls``,
  first root search, 1,000 appends, the daemon's descriptors and RSS
  (``scripts/bench_sessions.py``).
* ``fsync`` mode beside native ``write``+``fdatasync``, 1 thread and 8 threads × 8 files
  (``scripts/bench_durability.py``), and the p99 of ``stat`` + read of an idle session's
  ``manifest.json`` while other sessions evict or the warm-up rescans a stale log
  (``scripts/bench_responsive.py``);
* scale (SPEC §14): a year of history made from the captured fixtures at 1,000, 10,000 and
  100,000 sessions — ``ls``, root search, ``memfs sessions``, MCP ``list_sessions``, ``memfs
  usage``, import of agent files, and how soon another process's session shows — each beside
  its baseline (``scripts/bench_scale.py``; ``--only scale`` runs it alone);
* cluster mode on a real three-node JetStream cluster: fenced single appends through a mount
  beside raw ``nats-py``, 8 sessions, replication lag, catch-up after 100,000 appends
  (``scripts/bench_cluster.py``; ``--only cluster`` runs this section alone and splices it
  into the existing report).

The component scripts run as subprocesses with ``--json``; this script adds the rest and
writes the report. It is not part of the test suite; nothing here is asserted.

Usage: ``bash scripts/setup.sh --bench && .venv/bin/python scripts/bench.py [--quick]``
(``--quick`` shrinks every workload for a smoke run; its numbers are not the report's).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "scripts")]  # the component scripts beside this one

import memfs  # noqa: E402
from memfs.samples import sized_message  # noqa: E402

from bench_fs import start_server, stop_server  # noqa: E402

OUT = ROOT / "bench"
CLUSTER_TITLE = "Cluster: fenced appends, lag and catch-up on a 3-node JetStream cluster (`scripts/bench_cluster.py`)"
# the components' sections of the report, in order: (script, heading); --only replaces them by heading
SECTIONS = (("bench_views.py", "Derived views"), ("bench_search.py", "Search (memfs, rank_bm25, bm25s)"),
            ("bench_search_quality.py", "Search options (SPEC §5.1): relevance set and speed beside bm25s"),
            ("bench_ingest.py", "Ingest: memfs import beside memfs append of the same events"),
            ("bench_transcript.py", "transcript.md: the view after an append beside a whole Markdown render"),
            ("bench_sessions.py", "Many sessions: a store-wide mount of 10,000 and 100,000 sessions "
                                  "(descriptors and RSS of the daemon, `scripts/bench_sessions.py`)"),
            ("bench_usage.py", "Usage and cost (SPEC §12): `memfs usage` and `usage/daily.json` after an append, "
                               "10,000 sessions (`scripts/bench_usage.py`)"),
            ("bench_scale.py", "Scale (SPEC §14): a year of history at 1,000, 10,000 and 100,000 sessions, each figure "
                               "beside its baseline (`scripts/bench_scale.py`)"),
            ("bench_durability.py", "Durability: fsync mode beside native write+fdatasync"),
            ("bench_responsive.py", "Responsiveness: an idle session while others evict or rescan"),
            ("bench_cluster.py", CLUSTER_TITLE),
            ("bench_baseline.py", "Before and after: this tree beside a baseline checkout, interleaved "
                                  "(`scripts/bench_baseline.py`)"))


def run_component(script: str, args: list[str], work: Path) -> dict:
    """Run ``scripts/<script> --json FILE ARGS``; its results, or an ``error`` entry."""
    out = work / f"{script}.json"
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / script), "--json", str(out), *args],
                          capture_output=True, text=True, cwd=ROOT)
    print(f"  {script}: {time.perf_counter() - t:.0f} s, exit {proc.returncode}", flush=True)
    (work / f"{script}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode or not out.exists():
        return {"error": (proc.stderr or proc.stdout).strip().splitlines()[-5:]}
    data = json.loads(out.read_text())
    data["stdout"] = proc.stdout
    return data


def native_appends(work: Path, n: int) -> dict:
    """The physical limits: one ``write()`` per 300-byte event, and ``write()+fdatasync()``."""
    lines = [sized_message(i) for i in range(1000)]
    results = {}
    for name, sync, count in (("native write", False, n), ("native write+fdatasync", True, max(n // 20, 500))):
        path = work / f"native-{sync}.jsonl"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        t = time.perf_counter()
        for i in range(count):
            os.write(fd, lines[i % 1000])
            if sync:
                os.fdatasync(fd)
        results[f"{name} ev/s"] = count / (time.perf_counter() - t)
        os.close(fd)
        path.unlink()
    return results


def write_log(path: Path, n_events: int, turn_len: int = 10) -> None:
    """A valid log of ``n_events`` 300-byte-ish events in turns of ``turn_len``, written directly."""
    start = b'{"schema_version":"0.18.0","event":{"type":"turn.started"}}\n'
    done = b'{"schema_version":"0.18.0","event":{"type":"turn.completed","usage":{"input_tokens":1}}}\n'
    body = [sized_message(i) for i in range(1000)]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb", buffering=1 << 20) as f:
        i = 0
        while i < n_events:
            f.write(start)
            for j in range(min(turn_len - 2, n_events - i - 2)):
                f.write(body[(i + j) % 1000])
            f.write(done)
            i += turn_len


def open_scaling(work: Path, sizes: list[int]) -> list[dict]:
    """Fast-path open and full rescan time versus log size (median of 3 fast-path opens)."""
    rows = []
    for n in sizes:
        root = work / f"open-{n}"
        write_log(root / "s" / "events.jsonl", n)
        size = (root / "s" / "events.jsonl").stat().st_size
        t = time.perf_counter()
        with memfs.open_session(root, "s", max_events=0) as h:  # no metadata yet: a rescan
            h.lock()  # the writer's open: the rescan's metadata is written (once: the open's own scan)
            assert not h.open_report.fast_path
        rescan = time.perf_counter() - t
        fast = []
        for _ in range(3):
            t = time.perf_counter()
            with memfs.open_session(root, "s", max_events=0) as h:
                assert h.open_report.fast_path
                fast.append(time.perf_counter() - t)  # the close's persist is not the open's
        rows.append({"events": n, "bytes": size, "rescan_s": rescan, "fast_open_s": statistics.median(fast),
                     "rescan_MBps": size / rescan / 1e6})
        shutil.rmtree(root)
        print(f"  open/rescan {n:>9,} events: fast {rows[-1]['fast_open_s'] * 1000:.1f} ms, "
              f"rescan {rescan * 1000:.0f} ms", flush=True)
    return rows


def memory_json_latency(work: Path, sizes: list[int], samples: int) -> list[dict]:
    """``cat derived/memory.json`` right after one appended event, through a mount."""
    from bench_views import build  # a realistic agent workload

    rows = []
    for n in sizes:
        store, mnt = work / f"mem-{n}", work / f"mem-{n}-mnt"
        build(store, n).close()
        mnt.mkdir()
        proc = start_server([sys.executable, "-m", "memfs", "mount", str(store), str(mnt), "--max-events", "0",
                             "--log-level", "WARNING"], mnt, work / f"mem-{n}.log")
        try:
            s = mnt / "sessions" / "bench-views"
            subprocess.run(["cat", str(s / "derived" / "memory.json")], stdout=subprocess.DEVNULL, check=True)
            times = []
            for i in range(samples):
                with open(s / "events.jsonl", "ab") as f:
                    f.write(b'{"type":"item.completed","item":{"id":"x%d","type":"agent_message","text":"sample %d"}}\n'
                            % (i, i))
                t = time.perf_counter()
                subprocess.run(["cat", str(s / "derived" / "memory.json")], stdout=subprocess.DEVNULL, check=True)
                times.append(time.perf_counter() - t)
            baseline = []
            for _ in range(samples):  # the cost of spawning cat on a small file, for reference
                t = time.perf_counter()
                subprocess.run(["cat", str(s / "manifest.json")], stdout=subprocess.DEVNULL, check=True)
                baseline.append(time.perf_counter() - t)
        finally:
            stop_server(proc, mnt)
        rows.append({"events": n, "median_ms": statistics.median(times) * 1000,
                     "p90_ms": sorted(times)[int(len(times) * 0.9)] * 1000,
                     "cat_manifest_median_ms": statistics.median(baseline) * 1000})
        shutil.rmtree(store)
        print(f"  memory.json after append, {n:>7,} events: {rows[-1]['median_ms']:.1f} ms median", flush=True)
    return rows


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def daemon_rss(work: Path, sessions: int, per_session: int) -> dict:
    """RSS of the daemon serving ``sessions`` sessions of ``per_session`` events each."""
    store, mnt = work / "rss-store", work / "rss-mnt"
    for i in range(sessions):
        write_log(store / f"s{i:04d}" / "events.jsonl", per_session)
    for i in range(sessions):  # metadata, as a store that was used would have
        with memfs.open_session(store, f"s{i:04d}", max_events=0) as h:
            h.lock()  # (a writer's open writes the metadata a rescan found)
    mnt.mkdir()
    proc = start_server([sys.executable, "-m", "memfs", "mount", str(store), str(mnt), "--max-events", "0",
                         "--log-level", "WARNING"], mnt, work / "rss.log")
    try:
        result = {"sessions": sessions, "events": sessions * per_session, "idle_MiB": rss_kib(proc.pid) / 1024}
        for name in sorted(os.listdir(mnt / "sessions")):
            os.stat(mnt / "sessions" / name / "manifest.json")
        result["all_sessions_open_MiB"] = rss_kib(proc.pid) / 1024
        t = time.perf_counter()
        subprocess.run(["cat", str(mnt / "search" / "agent message")], stdout=subprocess.DEVNULL, check=True)
        result["first_root_search_s"] = time.perf_counter() - t
        result["after_root_search_MiB"] = rss_kib(proc.pid) / 1024
        result["open_fds"] = len(os.listdir(f"/proc/{proc.pid}/fd"))
    finally:
        stop_server(proc, mnt)
    shutil.rmtree(store)
    print(f"  daemon RSS: {result}", flush=True)
    return result


def chart(report: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    appends = report["append_rates"]
    if appends:
        names = list(appends)
        axes[0].barh(names, [appends[k] for k in names], color="#4a7")
        axes[0].set_xscale("log")
        axes[0].set_xlabel("events/s (log scale)")
        axes[0].set_title("300-byte appends")
    rows = report["open_scaling"]
    if rows:
        axes[1].loglog([r["events"] for r in rows], [r["rescan_s"] * 1000 for r in rows], "o-", label="rescan")
        axes[1].loglog([r["events"] for r in rows], [r["fast_open_s"] * 1000 for r in rows], "s-", label="fast-path open")
        axes[1].set_xlabel("events in the log")
        axes[1].set_ylabel("ms")
        axes[1].set_title("open cost vs log size")
        axes[1].legend()
    mem = report["memory_json"]
    if mem:
        axes[2].semilogx([r["events"] for r in mem], [r["median_ms"] for r in mem], "o-", label="cat memory.json after append")
        axes[2].semilogx([r["events"] for r in mem], [r["cat_manifest_median_ms"] for r in mem], "s--", label="cat manifest.json")
        axes[2].set_ylim(bottom=0)
        axes[2].set_xlabel("events in the session")
        axes[2].set_ylabel("ms (median, incl. spawning cat)")
        axes[2].set_title("view read after one append")
        axes[2].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def fmt(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.2f}"


def write_report(report: dict, path: Path) -> None:
    r = report
    lines = [
        "# memfs benchmark report", "",
        f"Generated by `scripts/bench.py` on {r['when']} — {r['machine']}.",
        "All figures come from this one run on this machine. Appended events are 300 bytes "
        "(`item.completed` agent messages) unless a row says otherwise.", "",
        "## Appends", "",
        "| path | events/s | vs native write() | vs write()+fdatasync() |", "|---|---:|---:|---:|",
    ]
    native = r["append_rates"].get("native write ev/s") or 1
    durable = r["append_rates"].get("native write+fdatasync ev/s") or 1
    for name, rate in r["append_rates"].items():
        lines.append(f"| {name} | {fmt(rate)} | {rate / native:.3f} | {rate / durable:.2f} |")
    fs = r["components"].get("bench_fs.py", {})
    if "results" in fs:
        lines += ["", "Through the mount (`scripts/bench_fs.py`): one `write()` per event on an `O_APPEND` "
                  "descriptor; nullfs is a do-nothing pyfuse3 filesystem, the FUSE ceiling; floor is nullfs "
                  "that validates each line (memfs's `parse_line`) and `write()`s it to a file, the least "
                  "a `write`-mode append must do. The servers run on one CPU, the writer on another "
                  "(left to the kernel, their placement moved nullfs by half). The ratios are medians of "
                  "per-round ratios.", ""]
        lines += [f"- {k}: {fmt(v)}" for k, v in fs["results"].items()]
    store = r["components"].get("bench_store.py", {})
    if "results" in store:
        lines += ["", "Library without a mount (`scripts/bench_store.py`):", ""]
        lines += [f"- {k}: {fmt(v) if isinstance(v, (int, float)) else v}" for k, v in store["results"].items()]
    lines += ["", "## Open and rescan versus log size", "",
              "Logs written directly (turns of 10 events); rescan = open with no metadata; fast path = "
              "open with consistent manifest and index (median of 3).", "",
              "| events | MB | rescan ms | rescan MB/s | fast-path open ms | rescan / fast |", "|---:|---:|---:|---:|---:|---:|"]
    for row in r["open_scaling"]:
        lines.append(f"| {row['events']:,} | {row['bytes'] / 1e6:.1f} | {row['rescan_s'] * 1000:.1f} | "
                     f"{row['rescan_MBps']:.0f} | {row['fast_open_s'] * 1000:.2f} | {row['rescan_s'] / row['fast_open_s']:.0f}x |")
    lines += ["", "## `cat derived/memory.json` right after one append (through the mount)", "",
              "Sessions built with the realistic agent workload of `scripts/bench_views.py`; each sample appends "
              "one event with `>>`, then times `cat` of the view (process spawn included; the `cat "
              "manifest.json` column is the same spawn on a tiny file).", "",
              "| events | median ms | p90 ms | cat manifest.json median ms |", "|---:|---:|---:|---:|"]
    for row in r["memory_json"]:
        lines.append(f"| {row['events']:,} | {row['median_ms']:.1f} | {row['p90_ms']:.1f} | {row['cat_manifest_median_ms']:.1f} |")
    for script, title in SECTIONS:
        comp = r["components"].get(script, {})
        lines += ["", f"## {title}", ""]
        if "error" in comp:
            lines.append(f"`{script}` failed: {' / '.join(comp['error'])}")
        elif comp:
            lines += [section_body(comp)]
    if r.get("daemon_rss"):
        d = r["daemon_rss"]
        lines += ["", "## Daemon memory", "",
                  f"{d['sessions']:,} sessions holding {d['events']:,} events mounted: RSS {d['idle_MiB']:.0f} MiB idle, "
                  f"{d['all_sessions_open_MiB']:.0f} MiB with every session opened (stat of each manifest), "
                  f"{d['after_root_search_MiB']:.0f} MiB after the first root search (index of every session's facts, "
                  f"built in {d['first_root_search_s']:.1f} s); {d['open_fds']} open file descriptors."]
    lines += ["", "## Goals", "", "| goal | measured | met |", "|---|---|---|"]
    for goal, (measured, met) in r["goals"].items():
        lines.append(f"| {goal} | {measured} | {'yes' if met else '**no**'} |")
    if r.get("chart"):
        lines += ["", "![appends, open cost, view latency](chart.png)"]
    path.write_text("\n".join(lines) + "\n")


def section_body(comp: dict) -> str:
    """A component's section: the Markdown it made (``markdown`` in its JSON), else its output as is."""
    return comp["markdown"].rstrip() if comp.get("markdown") else "```\n" + comp.get("stdout", "").rstrip() + "\n```"


def splice_report(r: dict, path: Path) -> None:
    """``--only``: put the sections and goal rows of the components just run into the existing
    report in place of theirs (a missing section goes before "## Goals")."""
    text = path.read_text() if path.exists() else "# memfs benchmark report\n\n## Goals\n\n| goal | measured | met |\n|---|---|---|\n"
    titles = dict(SECTIONS)
    for script, comp in r["components"].items():
        title = titles.get(script, script)
        body = f"`{script}` failed: {' / '.join(comp['error'])}" if "error" in comp else section_body(comp)
        section = f"## {title}\n\n_{script} run alone on {r['when']} (`bench.py --only`)._\n\n{body}\n\n"
        head = f"## {title}\n"
        if head in text:
            start = text.index(head)
            end = text.find("\n## ", start + len(head))
            text = text[:start] + section + (text[end + 1:] if end >= 0 else "")
        else:
            at = text.find("## Goals")
            text = text[:at] + section + text[at:] if at >= 0 else text + "\n" + section
        for goal, value in comp.get("goals", {}).items():
            measured, met = (value.get("measured", ""), bool(value.get("met"))) if isinstance(value, dict) else ("", bool(value))
            row = f"| {goal} | {measured} | {'yes' if met else '**no**'} |"
            lines = text.split("\n")
            hit = [i for i, line in enumerate(lines) if line.startswith(f"| {goal} |")]
            if hit:
                lines[hit[0]] = row
            else:
                last = max((i for i, line in enumerate(lines) if line.startswith("| ")), default=len(lines) - 1)
                lines.insert(last + 1, row)
            text = "\n".join(lines)
    path.write_text(text)


def collect_goals(r: dict) -> dict:
    goals = {}
    fs = r["components"].get("bench_fs.py", {}).get("results", {})
    if fs:
        ratio = fs.get("memfs write / nullfs", 0)
        goals["mount single appends ≥ 75% of nullfs"] = (f"{ratio:.0%}", ratio >= 0.75)
        bulk = fs.get("memfs write bulk cat ev/s", 0)
        goals["bulk cat ≥ 100,000 ev/s"] = (fmt(bulk), bulk >= 100_000)
        ms = fs.get("stat+read manifest.json median ms", 99)
        goals["stat + cat manifest.json < 1 ms median"] = (f"{ms:.2f} ms", ms < 1)
    store = r["components"].get("bench_store.py", {}).get("goals", {})
    for goal, value in store.items():
        goals[goal] = (value.get("measured", ""), bool(value.get("met"))) if isinstance(value, dict) else ("", bool(value))
    for row in r["open_scaling"]:
        if row["events"] == 1_000_000:
            goals["fast-path open of 1,000,000 events < 50 ms"] = (f"{row['fast_open_s'] * 1000:.1f} ms",
                                                                   row["fast_open_s"] < 0.05)
    for row in r["memory_json"]:
        if row["events"] == 100_000:
            goals["cat memory.json after an append, 100,000 events < 10 ms"] = (f"{row['median_ms']:.1f} ms",
                                                                                  row["median_ms"] < 10)
    for script in ("bench_views.py", "bench_search.py", "bench_search_quality.py", "bench_sessions.py", "bench_scale.py",
                   "bench_durability.py", "bench_responsive.py", "bench_cluster.py"):
        for goal, value in r["components"].get(script, {}).get("goals", {}).items():
            goals[goal] = (value.get("measured", ""), bool(value.get("met"))) if isinstance(value, dict) else ("", bool(value))
    return goals


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small workloads: a smoke run, not the report")
    ap.add_argument("--out", default=str(OUT), help="report directory (default bench/)")
    ap.add_argument("--skip", nargs="*", default=[], help="component scripts to skip, e.g. bench_search.py")
    ap.add_argument("--only", nargs="+", metavar="SCRIPT", default=[],
                    help="run only these component scripts (e.g. bench_cluster.py, or cluster) and replace their sections "
                         "and goal rows in the existing report (the rest of it is kept as it was)")
    ap.add_argument("--baseline", metavar="DIR",
                    help="also run scripts/bench_baseline.py against this checkout (before/after of a change)")
    args = ap.parse_args()
    q = args.quick
    work = Path(tempfile.mkdtemp(prefix="memfs-bench-"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Linux {platform.release()}, Python {platform.python_version()}",
        "components": {},
    }
    try:
        print("native limits", flush=True)
        report["append_rates"] = native_appends(work, 20_000 if q else 200_000)
        components = {
            "bench_store.py": ["--quick"] if q else [],
            "bench_fs.py": ["--events", "3000", "--bulk", "20000"] if q else [],
            "bench_views.py": ["--events", "20000", "--samples", "10"] if q else [],
            "bench_search.py": ["--small", "2000", "--large", "50000", "--sessions", "50"] if q else [],
            "bench_search_quality.py": ["--quick"] if q else [],
            "bench_ingest.py": ["--events", "10000", "--rounds", "1"] if q else [],
            "bench_transcript.py": ["--quick"] if q else [],
            "bench_sessions.py": ["--sessions", "2000", "--appends", "200"] if q else [],
            "bench_usage.py": ["--quick"] if q else [],
            "bench_scale.py": ["--sizes", "1000", "--import-size", "100", "--queries", "50"] if q else [],
            "bench_durability.py": ["--rounds", "3", "--events", "100"] if q else [],
            "bench_responsive.py": ["--samples", "500", "--big-mb", "20"] if q else [],
            "bench_cluster.py": ["--rounds", "2", "--events", "200", "--lag", "50", "--catchup", "5000"] if q else [],
        }
        if args.baseline:
            components["bench_baseline.py"] = ["--baseline", args.baseline, *(["--rounds", "2"] if q else [])]
        if args.only:
            for script in (s if s.endswith(".py") else f"bench_{s}.py" for s in args.only):  # cluster = bench_cluster.py
                report["components"][script] = run_component(script, components.get(script, []), work)
            splice_report(report, out / "REPORT.md")
            print(f"updated {out / 'REPORT.md'}")
            return 0
        for script, extra in components.items():
            if script not in args.skip and (ROOT / "scripts" / script).exists():
                report["components"][script] = run_component(script, extra, work)
        for script in ("bench_store.py", "bench_fs.py"):
            for k, v in report["components"].get(script, {}).get("results", {}).items():
                if k.endswith("ev/s"):
                    report["append_rates"][f"{script.removeprefix('bench_').removesuffix('.py')}: {k.removesuffix(' ev/s')}"] = v
        print("open scaling", flush=True)
        report["open_scaling"] = open_scaling(work, [1_000, 10_000, 100_000] if q else [1_000, 10_000, 100_000, 1_000_000])
        print("memory.json latency", flush=True)
        report["memory_json"] = memory_json_latency(work, [1_000, 10_000] if q else [1_000, 10_000, 100_000], 10 if q else 50)
        print("daemon RSS", flush=True)
        report["daemon_rss"] = daemon_rss(work, 50 if q else 1_000, 1_000)
        report["goals"] = collect_goals(report)
        report["chart"] = chart(report, out / "chart.png")
        write_report(report, out / "REPORT.md")
        (out / "results.json").write_text(json.dumps({k: v for k, v in report.items() if k != "components"} |
                                                     {"components": {k: {kk: vv for kk, vv in v.items() if kk != "stdout"}
                                                                     for k, v in report["components"].items()}},
                                                     indent=2, default=str))
        print(f"wrote {out / 'REPORT.md'}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
