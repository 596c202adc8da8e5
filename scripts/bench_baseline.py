#!/usr/bin/env python3
"""This tree against a baseline tree, side by side in one run: before/after of a speed change.

``--baseline DIR`` is another checkout of memfs (``git worktree add DIR COMMIT``; a checkout
from before issue 44 has C modules: build them in place, ``cd DIR && .venv/bin/python setup.py
build_ext --inplace`` with this tree's venv). Both trees run under this venv's interpreter, each with its own ``PYTHONPATH``
and its own folder as the working directory (:func:`tree_run`; :func:`check_tree` refuses a
tree whose processes would import another memfs), interleaved round by round, so the machine's drift hits both alike:

* library: single ``append`` calls (``write`` and ``buffered``, turns of 100) and
  ``append_many`` (turns of 100), best of the rounds, each in a fresh process;
* mount: one 300-byte ``write()`` per event on ``O_APPEND`` through a ``write``-mode memfs
  mount of each tree, and through ``scripts/nullfs.py``, all mounted at once, the servers on
  one CPU and the writer on the other, the median of the per-round ratios to nullfs;
* ``fsync`` mode through a mount of each tree: one writer, and 8 writers into 8 sessions
  (``scripts/bench_durability.py``'s workload), medians of the per-round rates;
* the event cap: ``memfs append`` of ``--cap-turns`` turns of 11 events at the default cap
  (10,000, ``evict_to`` 0.9) and uncapped, with each tree's CLI, the median of the per-round
  capped / uncapped ratios (``scripts/bench_store.py``'s workload);
* concurrent writers: 4 writers into 4 sessions of a ``write``-mode mount of each tree, one
  300-byte ``write()`` per event, the median of the per-round total rates;
* responsiveness: each tree's own ``scripts/bench_responsive.py`` (quiet, (a), (b)), run by
  turns, the medians of its p50 and p99;
* group commit: 8 threads appending to one ``fsync`` session of each tree's library
  (``scripts/bench_durability.py``'s workload), each round in a fresh process that first times
  native ``write``+``fdatasync`` (1 thread) beside it; the median of the per-round ratios.

``--parts`` runs only some of them (default: all).

Usage: ``.venv/bin/python scripts/bench_baseline.py --baseline DIR [--rounds R] [--parts ...] [--json FILE]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from memfs.samples import sized_message  # noqa: E402

from bench_fs import placement, single_appends, start_server, stop_server  # noqa: E402

LIBRARY = r"""
import os, sys, tempfile, time, shutil
import memfs
mode, kind, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
ev = lambda t, **f: ('{"schema_version":"0.18.0","event":%s}' % __import__("json").dumps({"type": t, **f},
                     separators=(",", ":"))).encode()
turn = [ev("turn.started")] + [ev("item.completed", item={"id": f"m{i}", "type": "agent_message",
        "text": "x" * 200}) for i in range(98)] + [ev("turn.completed", usage={"input_tokens": 1})]
root = tempfile.mkdtemp(prefix="memfs-bl-")
h = memfs.open_session(root, "s", durability=mode, max_events=0)
t = time.perf_counter()
if kind == "single":
    app = h.append
    for _ in range(n // 100):
        for line in turn:
            app(line)
else:
    for _ in range(n // 100):
        h.append_many(turn)
h.close()
print(n // 100 * 100 / (time.perf_counter() - t))
shutil.rmtree(root)
"""

LIBRARY_CONFIGS = [("write", "single"), ("buffered", "single"), ("write", "many")]

# bench_durability.py's library workload, written out: importing that module would put this
# tree's root first on sys.path, and the baseline's process would then import this tree's memfs.
GROUP_COMMIT = r"""
import os, sys, tempfile, threading, time, shutil
import memfs
from memfs.samples import sized_message
n, threads = int(sys.argv[1]), 8
lines = [sized_message(i) for i in range(1000)]
root = tempfile.mkdtemp(prefix="memfs-bl-gc-")
fd = os.open(os.path.join(root, "native"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
t = time.perf_counter()
for i in range(n):
    os.write(fd, lines[i % 1000])
    os.fdatasync(fd)
native = n / (time.perf_counter() - t)
os.close(fd)
h = memfs.open_session(root, "g", durability="fsync", max_events=0)
work = lambda k: [h.append(lines[(i + k) % 1000]) for i in range(n)]
pool = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
t = time.perf_counter()
for th in pool:
    th.start()
for th in pool:
    th.join()
rate = n * threads / (time.perf_counter() - t)
h.close()
shutil.rmtree(root)
print(rate, rate / native)
"""


def group_commit(trees: dict[str, Path], rounds: int, n: int) -> dict[str, dict[str, float]]:
    """Per tree: medians of the library's 8-thread ``fsync`` rate and of its ratio to native."""
    got: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
    for _ in range(rounds):
        for name, tree in trees.items():
            out = subprocess.run([sys.executable, "-c", GROUP_COMMIT, str(n)], check=True, capture_output=True,
                                 text=True, **tree_run(tree)).stdout.split()
            got[name].append((float(out[0]), float(out[1])))
    return {name: {"ev/s": statistics.median(r for r, _ in runs), "ratio": statistics.median(q for _, q in runs)}
            for name, runs in got.items()}


def tree_run(tree: Path) -> dict:
    """How a process runs ``tree``'s memfs: its ``PYTHONPATH`` *and* its folder as the working
    directory (``python -c``/``-m`` put the working directory first on ``sys.path``: run from
    another checkout, they would import that one's memfs whatever ``PYTHONPATH`` says)."""
    return {"env": {**os.environ, "PYTHONPATH": str(tree)}, "cwd": tree}


def check_tree(tree: Path) -> None:
    """Refuse to compare a tree whose processes would not import its own memfs."""
    out = subprocess.run([sys.executable, "-c", "import memfs, memfs.store.writer as w; "
                          "print(memfs.__file__, getattr(w, 'IMPL', 'py'))"],
                         check=True, capture_output=True, text=True, **tree_run(tree)).stdout.split()
    built = not (tree / "setup.py").exists() or out[1] == "c"  # (before issue 44: its C modules built)
    if not Path(out[0]).resolve().is_relative_to(tree.resolve()) or not built:
        raise SystemExit(f"{tree}: its processes import {out[0]} ({out[1]} twin), not the tree's own built memfs")


def library_rate(tree: Path, mode: str, kind: str, n: int) -> float:
    out = subprocess.run([sys.executable, "-c", LIBRARY, mode, kind, str(n)], check=True,
                         capture_output=True, text=True, **tree_run(tree)).stdout
    return float(out)


CAPPED = r"""
import sys, pathlib
sys.path.insert(0, sys.argv[1])
import bench_store
work, source, max_events = pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3]), int(sys.argv[4])
print(bench_store.capped_run(work, source, max_events, 0.9)["ev_s"])
"""


def capped_ratios(trees: dict[str, Path], turns: int, rounds: int) -> dict[str, dict[str, float]]:
    """Per tree: the median over ``rounds`` of capped ÷ uncapped ``memfs append`` rates (the
    workload of this tree's bench_store.py, run by each tree's memfs), and the median rates."""
    from bench_store import capped_input

    work = Path(tempfile.mkdtemp(prefix="memfs-bench-cap-"))
    try:
        source = capped_input(work, turns, 11)
        runs: dict[str, list[dict[int, float]]] = {name: [] for name in trees}
        for _ in range(rounds):
            for name, tree in trees.items():
                rate = {}
                for max_events in (0, 10_000):
                    out = subprocess.run([sys.executable, "-c", CAPPED, str(ROOT / "scripts"), str(work), str(source),
                                          str(max_events)], check=True, capture_output=True, text=True,
                                         **tree_run(tree))
                    rate[max_events] = float(out.stdout.split()[-1])
                runs[name].append(rate)
        return {name: {"ratio": statistics.median(r[10_000] / r[0] for r in got),
                       "capped ev/s": statistics.median(r[10_000] for r in got),
                       "uncapped ev/s": statistics.median(r[0] for r in got)} for name, got in runs.items()}
    finally:
        subprocess.run(["rm", "-rf", str(work)], check=False)


def mount_tree(work: Path, name: str, tree: Path, durability: str, cpus=None) -> tuple:
    """Mount a new store with ``tree``'s memfs (its ``PYTHONPATH``), uncapped; ``(server, mountpoint)``."""
    store, mnt = work / f"store-{name}", work / f"mnt-{name}"
    mnt.mkdir()
    return (start_server([sys.executable, "-m", "memfs", "mount", str(store), str(mnt), "--durability", durability,
                          "--max-events", "0", "--log-level", "WARNING"], mnt, work / f"{name}.log", cpus=cpus,
                         **tree_run(tree)), mnt)


@contextlib.contextmanager
def tree_sessions(trees: dict[str, Path], durability: str, n: int, warm: int):
    """Per tree a new store mounted with that tree's memfs in ``durability`` mode and ``n``
    new sessions in it: yields ``{tree name: [their events.jsonl]}`` (each written ``warm``
    events first); unmounts and removes everything after."""
    from bench_durability import run_threads

    work = Path(tempfile.mkdtemp(prefix=f"memfs-bench-{durability}-"))
    servers = {}
    sessions: dict[str, list[Path]] = {}
    try:
        for name, tree in trees.items():
            servers[name] = mount_tree(work, name, tree, durability)
            mnt = servers[name][1]
            sessions[name] = []
            for i in range(n):
                (mnt / "sessions" / f"s{i}").mkdir()
                sessions[name].append(mnt / "sessions" / f"s{i}" / "events.jsonl")
            run_threads(sessions[name], warm, False)  # warm-up
        yield sessions
    finally:
        for proc, mnt in servers.values():
            stop_server(proc, mnt)
        subprocess.run(["rm", "-rf", str(work)], check=False)


def fsync_rates(trees: dict[str, Path], rounds: int, events: int) -> dict[str, dict[str, float]]:
    """Per tree: medians of ``fsync``-mode mount rates, one writer and 8 writers × 8 sessions."""
    from bench_durability import THREADS, run_threads

    with tree_sessions(trees, "fsync", THREADS, 50) as sessions:
        got: dict[str, dict[str, list[float]]] = {name: {"1 writer": [], "8x8": []} for name in trees}
        for _ in range(rounds):
            for name in trees:
                got[name]["1 writer"].append(run_threads(sessions[name][:1], events, False))
                got[name]["8x8"].append(run_threads(sessions[name], events, False))
    return {name: {k: statistics.median(v) for k, v in rates.items()} for name, rates in got.items()}


def concurrent_rates(trees: dict[str, Path], rounds: int, events: int) -> dict[str, float]:
    """Per tree: the median total rate of 4 writers into 4 sessions of a ``write``-mode mount."""
    from bench_durability import run_threads

    with tree_sessions(trees, "write", 4, 200) as sessions:
        got: dict[str, list[float]] = {name: [] for name in trees}
        for _ in range(rounds):
            for name in trees:
                got[name].append(run_threads(sessions[name], events, False))
    return {name: statistics.median(rates) for name, rates in got.items()}


RESPONSIVE = ("quiet", "(a) 4 writers through cap rewrites", "(b) warm-up rescanning a stale log")


def responsiveness(trees: dict[str, Path], rounds: int) -> dict[str, dict[str, float]]:
    """Per tree and condition of ``bench_responsive.py`` (each tree's own): median p50 and p99."""
    got: dict[str, dict[str, list[dict]]] = {name: {c: [] for c in RESPONSIVE} for name in trees}
    with tempfile.TemporaryDirectory(prefix="memfs-bench-resp-") as work:
        for _ in range(rounds):
            for name, tree in trees.items():
                out = Path(work) / f"{name}.json"
                subprocess.run([sys.executable, str(tree / "scripts" / "bench_responsive.py"), "--json", str(out)],
                               check=True, capture_output=True, **tree_run(tree))
                results = json.loads(out.read_text())["results"]
                for condition in RESPONSIVE:
                    got[name][condition].append(results[condition])
    return {name: {f"{c} {q}": statistics.median(r[f"{q}_ms"] for r in runs)
                   for c, runs in conditions.items() for q in ("p50", "p99")}
            for name, conditions in got.items()}


PARTS = ("fsync", "capped", "library", "mount", "concurrent", "responsive", "groupcommit")


def revision(tree: Path) -> str:
    """The tree's checked-out commit, ``+`` when its tracked files differ from it; "unknown"
    outside git. The report then says which code was compared, after the checkout is gone."""
    try:
        rev = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(tree), "diff", "--quiet", "HEAD"], capture_output=True).returncode
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return rev + ("+" if dirty else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", required=True, type=Path, help="a checkout to compare against")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--events", type=int, default=50_000, help="library appends per run")
    ap.add_argument("--writes", type=int, default=2_000, help="mount writes per target and round")
    ap.add_argument("--cap-turns", type=int, default=20_000, help="turns of 11 events for the capped append")
    ap.add_argument("--fsync-events", type=int, default=400, help="fsync-mode writes per writer and round")
    ap.add_argument("--concurrent-events", type=int, default=2_000, help="writes per writer and round, 4 writers")
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="which comparisons to run")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    trees = {"baseline": args.baseline.resolve(), "this": ROOT}
    for tree in trees.values():
        check_tree(tree)
    results: dict[str, float] = {}

    parts = set(args.parts)

    if "fsync" in parts:
        fsync = fsync_rates(trees, args.rounds, args.fsync_events)
        for kind in ("1 writer", "8x8"):
            for name in trees:
                results[f"mount fsync, {kind} ({name}) ev/s"] = fsync[name][kind]
            results[f"mount fsync, {kind}: this / baseline"] = fsync["this"][kind] / fsync["baseline"][kind]
    if "capped" in parts:
        capped = capped_ratios(trees, args.cap_turns, max(1, args.rounds // 2))
        for name in trees:
            results[f"memfs append at the default cap / uncapped ({name})"] = capped[name]["ratio"]
        for key in ("capped ev/s", "uncapped ev/s"):
            for name in trees:
                results[f"memfs append, {key.replace(' ev/s', '')} ({name}) ev/s"] = capped[name][key]
    if "concurrent" in parts:
        conc = concurrent_rates(trees, args.rounds, args.concurrent_events)
        for name in trees:
            results[f"mount, 4 writers into 4 sessions ({name}) ev/s"] = conc[name]
        results["mount, 4 writers into 4 sessions: this / baseline"] = conc["this"] / conc["baseline"]
    if "responsive" in parts and not all((tree / "scripts" / "bench_responsive.py").exists() for tree in trees.values()):
        print("responsiveness: skipped, a tree has no scripts/bench_responsive.py", file=sys.stderr)
    elif "responsive" in parts:
        resp = responsiveness(trees, max(1, args.rounds // 2))
        for key in resp["this"]:
            for name in trees:
                results[f"responsiveness {key} ({name}) ms"] = resp[name][key]

    if "groupcommit" in parts:
        gc = group_commit(trees, args.rounds, args.fsync_events)
        for name in trees:
            results[f"library group commit, 8 threads ({name}) ev/s"] = gc[name]["ev/s"]
            results[f"library group commit, 8 threads / native 1 thread ({name})"] = gc[name]["ratio"]
        results["library group commit: this / baseline"] = gc["this"]["ratio"] / gc["baseline"]["ratio"]

    if "library" in parts:
        best: dict[tuple, float] = {}
        for _ in range(args.rounds):
            for config in LIBRARY_CONFIGS:
                for name, tree in trees.items():
                    got = library_rate(tree, *config, args.events)
                    best[(name, *config)] = max(best.get((name, *config), 0.0), got)
        for mode, kind in LIBRARY_CONFIGS:
            label = f"library {kind} append, {mode}"
            for name in trees:
                results[f"{label} ({name}) ev/s"] = best[(name, mode, kind)]
            results[f"{label}: this / baseline"] = best[("this", mode, kind)] / best[("baseline", mode, kind)]

    if "mount" in parts:
        mount_singles(trees, args, results)

    width = max(map(len, results))
    print(f"baseline: {trees['baseline']} ({revision(trees['baseline'])}), this: {revision(trees['this'])}; library "
          f"best of {args.rounds} rounds, mount medians of {args.rounds * 3} rounds")
    for key, value in results.items():
        print(f"{key:<{width}}  {value:,.3f}" if value < 100 else f"{key:<{width}}  {value:,.0f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"baseline": str(trees["baseline"]),
                                               "revisions": {name: revision(tree) for name, tree in trees.items()},
                                               "results": results}, indent=2))
    return 0


def mount_singles(trees: dict[str, Path], args, results: dict[str, float]) -> None:
    """Single appends through a ``write``-mode mount of each tree and through nullfs."""
    work = Path(tempfile.mkdtemp(prefix="memfs-bench-bl-"))
    writer_cpus, server_cpus = placement()
    if writer_cpus:
        os.sched_setaffinity(0, writer_cpus)
    servers = {}
    targets: dict[str, Path] = {}
    lines = [sized_message(i) for i in range(1000)]
    try:
        mnt = work / "nullfs"
        mnt.mkdir()
        env = {**os.environ, "NULLFS_DIRECT_IO": "0", "NULLFS_FLOOR": ""}
        servers["nullfs"] = (start_server([sys.executable, str(ROOT / "scripts" / "nullfs.py"), str(mnt)], mnt,
                                          work / "nullfs.log", env=env, cpus=server_cpus), mnt)
        targets["nullfs"] = mnt / "sink"
        for name, tree in trees.items():
            servers[name] = mount_tree(work, name, tree, "write", server_cpus)
            mnt = servers[name][1]
            (mnt / "sessions" / "b").mkdir()
            targets[name] = mnt / "sessions" / "b" / "events.jsonl"
        for _ in range(3):  # warm-up
            for path in targets.values():
                single_appends(path, args.writes, lines)
        rates: dict[str, list[float]] = {name: [] for name in targets}
        for _ in range(args.rounds * 3):
            for name, path in targets.items():
                rates[name].append(single_appends(path, args.writes, lines))
        for name in trees:
            results[f"mount single appends ({name}) ev/s"] = statistics.median(rates[name])
            results[f"mount single appends ({name}) / nullfs"] = statistics.median(
                m / n for m, n in zip(rates[name], rates["nullfs"]))
        results["mount single appends: this / baseline"] = statistics.median(
            m / n for m, n in zip(rates["this"], rates["baseline"]))
    finally:
        for proc, mnt in servers.values():
            stop_server(proc, mnt)
        subprocess.run(["rm", "-rf", str(work)], check=False)


if __name__ == "__main__":
    sys.exit(main())
