#!/usr/bin/env python3
"""Scale benchmark (issue 54, SPEC §14): a year of history at 1,000, 10,000 and 100,000 sessions.

The history is made from the captured fixtures (Claude Code, Codex, Gemini CLI) with fresh ids
and dates spread over a year, projects and agents varied (``scripts/scale_history.py``; stores
are cached under ``--work`` by size, generator and day). Each figure stands beside its baseline,
measured in the same run:

* **ls**: ``ls sessions/`` and ``ls -l sessions/`` through a store-wide mount, beside ``ls`` and
  ``ls -l`` of the store directory (a plain directory of the same entries); the time from
  starting ``memfs mount`` to the first listing; the daemon's peak RSS and descriptors.
* **search**: root ``search/<q>`` through the mount (open, read, close: p50 and p99 over
  ``--queries`` two-word queries), beside the same queries on memfs's in-memory index
  (``SearchIndex`` filled from every session, in this process); the first query after the
  mount starts and after a restart; the wall of ``memfs search``.
* **sessions**: the walls of ``memfs sessions --since 1d`` and ``memfs sessions --json``.
* **mcp**: ``list_sessions`` (all, and ``since: 1d``) over stdio from the MCP SDK's client
  against ``memfs mcp --store``.
* **usage**: ``memfs usage --by day`` as found, right after an import of one new session, and
  once more; beside ``ccusage daily`` over the import's Claude files when ``ccusage`` is installed.
* **import** (once, not per size): ``--import-size`` Claude Code transcripts and as many Codex
  rollouts made from the fixtures, imported into a new store (MB/s), again with nothing new, and
  again with one file grown; beside reading the same files with orjson (MB/s).
* **fresh**: while the mount runs, another process (``memfs import``) creates a session, then
  appends a turn to it: the time until it shows in ``ls``, in a root search and in
  ``usage/daily.json``.

A command's wall includes the interpreter's start: the bare ``python -c pass`` of the same
interpreter is measured in the same run and printed beside each. Commands run as a user's install
runs them: memfs is byte-compiled once at the start (``compileall``, as pip does at install) and
the commands run without ``PYTHONDONTWRITEBYTECODE``, so no command compiles memfs's modules. Goals (SPEC §14) are judged at
10,000 sessions (and RSS, descriptors and ``ls`` at 100,000); the other sizes are reported
beside. Nothing is asserted: it prints a Markdown table and, with ``--json FILE``, writes
``{"results": ..., "goals": ..., "markdown": ...}``. Whatever a run adds to a cached store is
removed at its end.

Usage: ``.venv/bin/python scripts/bench_scale.py [--sizes 1000,10000,100000]
[--only ls,search,sessions,mcp,usage,import,fresh] [--import-size 2000]``
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

import scale_history as history  # noqa: E402
from bench_fs import start_server, stop_server  # noqa: E402
from bench_sessions import Sampler  # noqa: E402
from scale_measure import Table, mcp_list_sessions, pct, poll, read, search_once, wall  # noqa: E402

PARTS = ("ls", "search", "sessions", "mcp", "usage", "import", "fresh")
VOCAB = ("README", "project", "files", "summary", "changelog", "release", "note", "numbers", "helper", "command",
         "failed", "error", "test", "output", "todo", "plan", "list", "work", "file", "tool")


def memfs(*args: str) -> list[str]:
    return [sys.executable, "-m", "memfs", *args]


def bare_python() -> float:
    """The median wall of ``python -c pass``: what every command's wall starts from."""
    return statistics.median(wall([sys.executable, "-c", "pass"]) for _ in range(5))


def repeat(cmd: list[str], times: int = 3) -> tuple[float, float]:
    """(the first run's wall, the median of ``times`` more)."""
    first = wall(cmd)
    return first, statistics.median(wall(cmd) for _ in range(times))


def queries(n: int) -> list[str]:
    pairs = [f"{a} {b}" for a, b in itertools.combinations(VOCAB, 2)]
    random.Random(54).shuffle(pairs)
    return (pairs * (n // len(pairs) + 1))[:n]


def total_tokens(mnt: Path) -> int:
    return orjson.loads(read(mnt / "usage" / "daily.json"))["totals"]["tokens"]["total"]


def in_memory_search(store: Path, qs: list[str]) -> dict:
    """The baseline of root search: memfs's ``SearchIndex`` filled from every session in this
    process, then the same queries (seconds to fill, query times)."""
    import memfs as lib
    from memfs.search import SearchIndex, sync_from_handle

    index = SearchIndex()
    t = time.perf_counter()
    for name in sorted(os.listdir(store)):
        if (store / name / "events.jsonl").exists():
            with lib.open_session(store, name, read_only=True) as h:
                sync_from_handle(index, h)
    build = time.perf_counter() - t
    times = []
    for q in qs:
        t = time.perf_counter()
        index.search(q)
        times.append(time.perf_counter() - t)
    return {"build_s": build, "times": times}


def new_session(store: Path, dest: Path, token: str, copy: int, anchor: float, again: int = 0) -> tuple[str, float]:
    """Another process's write: a Claude Code transcript made from a fixture (``token`` after
    each "README"), or its ``again``-th continuation, imported by ``memfs import``; (the
    session's name, when the import ended)."""
    template = next(p for p in history.source_templates()["claude"] if "tasks" in p.parts)  # its todos say README
    path = history.source_file(dest, "claude", template, copy, anchor, again, token.encode(), recent=True)
    out = subprocess.run(memfs("import", "--store", str(store), str(path)), capture_output=True, text=True, cwd=ROOT)
    done = time.perf_counter()
    if out.returncode not in (0, 3):  # 3: something skipped or refused, said on stderr
        raise RuntimeError(f"import failed: {out.stderr.strip()}")
    return re.search(r"-> (\S+) \(", out.stdout + out.stderr).group(1), done


def marker() -> str:
    return f"zq{random.randrange(16**6):06x}"


def unique() -> int:
    """A copy number no earlier run used (its ids are fresh)."""
    return time.time_ns() // 1000 % 10**12


def mount_phase(n: int, store: Path, work: Path, only: set[str], args, table: Table, r: dict) -> None:
    """One mount: first listing, ls, search, fresh; then a restart for the first search after it."""
    mnt = work / f"mnt-{n}"
    mnt.mkdir(exist_ok=True)
    cmd = memfs("mount", str(store), str(mnt), "--log-level", "WARNING")
    qs = queries(args.queries)
    t0 = time.perf_counter()
    proc = start_server(cmd, mnt, work / f"mount-{n}.log", cwd=ROOT)
    sampler = Sampler(proc.pid)
    sampler.start()
    try:
        r["mount_s"] = time.perf_counter() - t0
        sampler.enter("ls")
        listed = subprocess.run(["ls", str(mnt / "sessions")], capture_output=True, check=True).stdout
        r["mount_to_listing_s"] = time.perf_counter() - t0
        r["listed"] = len(listed.splitlines())
        if "ls" in only:
            ls_first, r["ls_s"] = repeat(["ls", str(mnt / "sessions")])
            r["ls_l_first_s"], r["ls_l_s"] = repeat(["ls", "-l", str(mnt / "sessions")])
            r["plain_ls_s"] = statistics.median(wall(["ls", str(store)]) for _ in range(3))
            r["plain_ls_l_s"] = statistics.median(wall(["ls", "-l", str(store)]) for _ in range(3))
            table.add(n, "mount to first `ls sessions/`", r["mount_to_listing_s"], None, "", 1.0, 10_000)
            table.add(n, "`ls sessions/`", r["ls_s"], r["plain_ls_s"], "`ls` of the store dir", 0.5 if n <= 10_000 else 5.0,
                      10_000 if n <= 10_000 else 100_000)
            table.add(n, "`ls -l sessions/`", r["ls_l_s"], r["plain_ls_l_s"], "`ls -l` of the store dir", 2.0, 10_000)
        if "search" in only:
            sampler.enter("search")
            r["first_search_s"] = search_once(mnt, qs[0])
            times = []
            for q in qs:
                t = time.perf_counter()
                search_once(mnt, q)
                times.append(time.perf_counter() - t)
            r["search_p50_s"], r["search_p99_s"] = pct(times, 0.5), pct(times, 0.99)
            base = in_memory_search(store, qs)
            r["index_build_s"] = base["build_s"]
            r["index_p50_s"], r["index_p99_s"] = pct(base["times"], 0.5), pct(base["times"], 0.99)
            table.add(n, "first root search after mounting and listing", r["first_search_s"], None, "", None)
            table.add(n, "root `search/<q>` p50", r["search_p50_s"], r["index_p50_s"], "in-memory index p50", 0.02, 10_000)
            table.add(n, "root `search/<q>` p99", r["search_p99_s"], r["index_p99_s"], "in-memory index p99", 0.1, 10_000)
        if "fresh" in only:
            sampler.enter("fresh")
            fresh(n, store, mnt, work, args, table, r)
        sampler.enter("after")
        r["fds_end"] = len(os.listdir(f"/proc/{proc.pid}/fd"))
    finally:
        sampler.stopped.set()
        sampler.join()
        stop_server(proc, mnt)
    r["peaks"] = sampler.peaks  # (per phase: mount, ls, search, fresh, after)
    r["peak_rss_MiB"] = max(p["rss_MiB"] for p in sampler.peaks.values())
    r["peak_fds"] = max(p["fds"] for p in sampler.peaks.values())
    table.add(n, "daemon peak RSS (MiB)", r["peak_rss_MiB"], None, "", 300, 100_000, unit="MiB")
    table.add(n, "daemon peak descriptors", r["peak_fds"], None, "", 1000, 100_000, unit="")
    if "search" in only:  # the first query after a restart (the index as the last mount left it)
        proc = start_server(cmd, mnt, work / f"mount-{n}.log", cwd=ROOT)
        try:
            r["first_search_restart_s"] = search_once(mnt, qs[1])
        finally:
            stop_server(proc, mnt)
        table.add(n, "first root search after a restart", r["first_search_restart_s"], None, "", 1.0, 10_000)


def fresh(n: int, store: Path, mnt: Path, work: Path, args, table: Table, r: dict) -> None:
    """A session created, then appended to, by another process while the mount runs: how long
    until ``ls``, a root search and ``usage/daily.json`` show it."""
    src, copy, anchor = work / "fresh-src", unique(), time.time()
    search_once(mnt, "README")  # what a running mount has done before: searched, listed, summed
    os.listdir(mnt / "sessions")
    before = total_tokens(mnt)
    token = marker()
    name, done = new_session(store, src, token, copy, anchor)
    seen = poll({"ls": lambda: name in os.listdir(mnt / "sessions"),
                 "search": lambda: name in search_once(mnt, token, text=True, deadline=0),
                 "usage": lambda: total_tokens(mnt) != before}, done, args.fresh_timeout)
    for what, secs in seen.items():
        r[f"created_in_{what}_s"] = secs
        table.add(n, f"created by another process: in {what}", secs, None, "", 1.0, 10_000)
    before = total_tokens(mnt)
    token = marker()
    _, done = new_session(store, src, token, copy, anchor, again=1)
    seen = poll({"search": lambda: name in search_once(mnt, token, text=True, deadline=0),
                 "usage": lambda: total_tokens(mnt) != before}, done, args.fresh_timeout)
    for what, secs in seen.items():
        r[f"appended_in_{what}_s"] = secs
        table.add(n, f"appended by another process: in {what}", secs, None, "", 1.0, 10_000)
    shutil.rmtree(src, ignore_errors=True)


def cli_phase(n: int, store: Path, work: Path, only: set[str], args, table: Table, r: dict, python_s: float) -> None:
    py = f"`python -c pass` {python_s:.3f} s"
    if "search" in only:
        r["cli_search_first_s"], r["cli_search_s"] = repeat(memfs("search", "--store", str(store), "README summary"), 1)
        table.add(n, "`memfs search` (first)", r["cli_search_first_s"], python_s, py, None)
        table.add(n, "`memfs search`", r["cli_search_s"], python_s, py, 0.5, 10_000)
    if "sessions" in only:
        r["cli_since_first_s"], r["cli_since_s"] = repeat(memfs("sessions", "--store", str(store), "--since", "1d"))
        r["cli_json_first_s"], r["cli_json_s"] = repeat(memfs("sessions", "--store", str(store), "--json"))
        table.add(n, "`memfs sessions --since 1d` (first)", r["cli_since_first_s"], python_s, py, None)
        table.add(n, "`memfs sessions --since 1d`", r["cli_since_s"], python_s, py, 0.3, 10_000)
        table.add(n, "`memfs sessions --json` (first)", r["cli_json_first_s"], python_s, py, None)
        table.add(n, "`memfs sessions --json`", r["cli_json_s"], python_s, py, 1.0, 10_000)
        statusline = ["sh", "-c", 'exec "$0" -m memfs statusline --store "$1" </dev/null', sys.executable, str(store)]
        r["statusline_first_s"], r["statusline_s"] = repeat(statusline)
        table.add(n, "`memfs statusline` (first)", r["statusline_first_s"], python_s, py, None)
        table.add(n, "`memfs statusline` (goal: 2.5 × `python -c pass`)", r["statusline_s"], python_s, py,
                  2.5 * python_s, 10_000)
    if "mcp" in only:
        m = mcp_list_sessions(store, work / f"mcp-{n}.log")
        r.update({f"mcp_{k}": v for k, v in m.items()})
        table.add(n, "MCP server start and initialize", m["start_s"], python_s, py, None)
        table.add(n, "MCP `list_sessions` (first)", m["all_first_s"], None, "", None)
        table.add(n, "MCP `list_sessions`", m["all_s"], None, "", 0.3, 10_000)
        table.add(n, "MCP `list_sessions` since 1d", m["since_s"], None, "", 0.3, 10_000)
    if "usage" in only:
        usage = memfs("usage", "--store", str(store), "--by", "day")
        r["usage_found_s"] = wall(usage)
        new_session(store, work / "usage-src", marker(), unique(), time.time())
        shutil.rmtree(work / "usage-src", ignore_errors=True)
        r["usage_after_import_s"] = wall(usage)
        r["usage_s"] = statistics.median(wall(usage) for _ in range(3))
        table.add(n, "`memfs usage --by day` (store as found)", r["usage_found_s"], python_s, py, None)
        table.add(n, "`memfs usage --by day` right after an import", r["usage_after_import_s"], python_s, py, 0.5, 10_000)
        table.add(n, "`memfs usage --by day` after that", r["usage_s"], python_s, py, 0.2, 10_000)


def run_size(n: int, work: Path, only: set[str], args, table: Table, python_s: float) -> dict:
    store, built = history.cached_store(work, n)
    print(f"{n:,} sessions: {'built in %.1f s' % built if built else 'cached'} at {store}", flush=True)
    r: dict = {"sessions": n, "build_s": built}
    names = set(os.listdir(store))
    conversations = store / ".memfs-conversations.json"
    kept = conversations.read_bytes() if conversations.exists() else None
    try:
        if only & {"ls", "search", "fresh"}:
            mount_phase(n, store, work, only, args, table, r)
        cli_phase(n, store, work, only, args, table, r, python_s)
    finally:  # what this run added goes, so the cached store stays as built
        for name in set(os.listdir(store)) - names:
            if (store / name / "events.jsonl").exists():
                shutil.rmtree(store / name)
        if kept is None:
            conversations.unlink(missing_ok=True)
        else:
            conversations.write_bytes(kept)
    print(f"  {json.dumps(r)}", flush=True)
    return r


def import_part(work: Path, per_agent: int, table: Table, python_s: float) -> dict:
    """Import of ``per_agent`` Claude Code transcripts and as many Codex rollouts, beside orjson."""
    src, anchor, files = history.cached_sources(work, per_agent)
    size = sum(f.stat().st_size for f in files)
    r: dict = {"files": len(files), "MB": size / 1e6}

    def orjson_read() -> float:
        t = time.perf_counter()
        for f in files:
            for line in f.read_bytes().splitlines():
                orjson.loads(line)
        return time.perf_counter() - t

    orjson_read()  # (the page cache, for both)
    r["orjson_MBps"] = size / 1e6 / orjson_read()
    store = work / "import-store"
    shutil.rmtree(store, ignore_errors=True)
    cmd = memfs("import", "--store", str(store), str(src / "claude"), str(src / "codex"))
    t = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, cwd=ROOT)
    r["import_s"] = time.perf_counter() - t
    r["import_exit"] = out.returncode
    r["import_MBps"] = size / 1e6 / r["import_s"]
    r["sessions"] = sum(1 for p in store.iterdir() if (p / "events.jsonl").exists())
    r["again_s"] = wall(cmd, check=False)
    template = history.source_templates()["claude"][0]  # copy 0 of the Claude transcripts is made from it
    uuid = history.fresh_ids("claude/0")(template.stem[-36:].encode()).decode()
    grown = next((src / "claude").rglob(f"{uuid}.jsonl"))
    length = grown.stat().st_size
    try:
        if history.source_file(src, "claude", template, 0, anchor, again=1) != grown or grown.stat().st_size == length:
            raise RuntimeError(f"{grown} did not grow")
        r["grown_s"] = wall(cmd, check=False)
    finally:
        os.truncate(grown, length)
    from memfs.ingest.shares import default_jobs

    r["jobs"] = default_jobs()  # (the import's own default here: one process per usable CPU)
    label = (f"{per_agent:,} Claude Code transcripts + {per_agent:,} Codex rollouts, {r['MB']:.0f} MB; "
             f"{r['jobs']} process{'es' if r['jobs'] > 1 else ''}")
    table.add(None, f"`memfs import` of agent files ({label})", r["import_MBps"], r["orjson_MBps"],
              "orjson read of the same files", 20, None, unit="MB/s", higher=True)
    table.add(None, "`memfs import` again, nothing new", r["again_s"], python_s, f"`python -c pass` {python_s:.3f} s", 1.0, None)
    table.add(None, "`memfs import` again, one file grown", r["grown_s"], python_s, f"`python -c pass` {python_s:.3f} s", 1.0, None)
    claude = src / "claude"
    if shutil.which("ccusage"):
        env = {**os.environ, "CLAUDE_CONFIG_DIR": str(claude)}
        t = time.perf_counter()
        subprocess.run(["ccusage", "daily", "--json"], env=env, capture_output=True)
        r["ccusage_s"] = time.perf_counter() - t
    r["usage_s"] = wall(memfs("usage", "--store", str(store), "--by", "day"))
    table.add(None, f"`memfs usage --by day` over the import ({r['sessions']:,} sessions)", r["usage_s"],
              r.get("ccusage_s"), "`ccusage daily` (Claude files)" if "ccusage_s" in r else "ccusage not installed", None)
    shutil.rmtree(store, ignore_errors=True)
    print(f"import: {json.dumps(r)}", flush=True)
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000,10000,100000", help="session counts, comma-separated")
    ap.add_argument("--only", default=",".join(PARTS), help=f"parts to run, comma-separated: {','.join(PARTS)}")
    ap.add_argument("--import-size", type=int, default=2000, help="Claude Code transcripts and as many Codex rollouts")
    ap.add_argument("--queries", type=int, default=100, help="root search queries through the mount")
    ap.add_argument("--fresh-timeout", type=float, default=60, help="give up waiting for a new session after S seconds")
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "memfs-bench-scale"),
                    help="where the generated stores and sources are cached")
    ap.add_argument("--json", metavar="FILE", help="write the results as JSON")
    args = ap.parse_args()
    only = set(args.only.split(","))
    if only - set(PARTS):
        ap.error(f"--only: unknown parts {sorted(only - set(PARTS))}")
    sizes = [int(s) for s in args.sizes.split(",") if s]
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # (the commands' environment: as a user's)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "memfs")], check=True,
                   stdout=subprocess.DEVNULL)
    python_s = bare_python()
    table = Table()
    results: dict = {"python_c_pass_s": python_s, "sizes": []}
    if "import" in only:
        results["import"] = import_part(work, args.import_size, table, python_s)
    for n in sizes:
        results["sizes"].append(run_size(n, work, only, args, table, python_s))
    markdown = table.markdown(python_s)
    print(markdown)
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "goals": table.goals(), "markdown": markdown},
                                              indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
