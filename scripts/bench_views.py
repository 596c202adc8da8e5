#!/usr/bin/env python3
"""Benchmark the derived views on a 100,000-event session (issue 4's speed goals).

Measures, with the library (no mount):

* full rebuild: every view of ``derived/`` rendered from a cold state (the fold of the whole
  log plus one render of each view) — goal: under 2 s;
* incremental: append one event, then render ``memory.json`` — median of 50 — goal: well
  under 10 ms (the mount adds its own overhead on top for ``cat``).

Usage: ``.venv/bin/python scripts/bench_views.py [--events N] [--samples K] [--store DIR] [--json FILE]``
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import memfs  # noqa: E402
import orjson  # noqa: E402
from memfs import views  # noqa: E402
from memfs.views import cache  # noqa: E402

ENV = b'{"schema_version":"0.18.0","event":'


def line(event: dict) -> bytes:
    return ENV + orjson.dumps(event) + b"}"


def item(kind: str, **fields) -> dict:
    return {"type": "item.completed", "item": {"id": f"i{kind}", "type": kind, **fields}}


def turn_events(t: int) -> list[bytes]:
    """Ten events of a plausible agent turn; every 25th turn updates a plan, every 40th fails."""
    path = f"src/module_{t % 700}.py"
    events = [
        {"type": "turn.started", "context": {"turn_id": f"t{t}", "origin": "user"}},
        item("reasoning", text=f"Thinking about step {t} of the refactor and what to check next."),
        {"type": "item.started", "item": {"id": f"c{t}", "type": "command_execution",
                                          "command": f"pytest tests/test_{t % 300}.py", "status": "in_progress"}},
        item("command_execution", command=f"pytest tests/test_{t % 300}.py", status="completed",
             exit_code=int(t % 7 == 0), aggregated_output="." * 40),
        item("tool_invocation", tool_name="read_file", status="completed"),
        item("tool_output", call_id=f"call{t}", status="completed", output="def f():\n    return 1\n"),
        item("file_change", changes=[{"path": path, "kind": "update"}], status="completed"),
        item("agent_message", text=f"Turn {t}: updated {path} and re-ran its tests; all green."),
    ]
    if t % 25 == 0:
        done = (t // 25) % 6
        plan = "\n".join(f"- [{'x' if i < done else ' '}] milestone {i}" for i in range(6))
        events.append(item("plan", text=plan))
    else:
        events.append(item("decision", summary=f"keep helper {t % 50}", rationale="smaller diff"))
    usage = {"input_tokens": 1000 + t, "cached_input_tokens": 500, "cache_creation_tokens": 0, "output_tokens": 90}
    if t % 40 == 39:
        events.append({"type": "turn.failed", "message": f"tool crashed in turn {t}", "usage": usage})
    else:
        events.append({"type": "turn.completed", "usage": usage})
    return [line(e) for e in events]


def build(root: Path, n_events: int):
    handle = memfs.open_session(root, "bench-views", max_events=0, durability="buffered")
    t = 0
    batch: list[bytes] = [line({"type": "thread.started", "thread_id": "thread-1"})]
    total = 1
    while total < n_events:
        evs = turn_events(t)[: n_events - total]
        batch += evs
        total += len(evs)
        t += 1
        if len(batch) > 5000:
            handle.append_many(batch)
            batch = []
    if batch:
        handle.append_many(batch)
    handle.flush()
    return handle


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--samples", type=int, default=50)
    ap.add_argument("--store", help="sessions root to use (default: a temporary directory)")
    ap.add_argument("--json", help="also write the results and goals here (for scripts/bench.py)")
    args = ap.parse_args()

    root = Path(args.store) if args.store else Path(tempfile.mkdtemp(prefix="memfs-bench-views-"))
    try:
        t0 = time.perf_counter()
        handle = build(root, args.events)
        print(f"built {handle.manifest['event_count']} events, {handle.file_len / 1e6:.1f} MB "
              f"in {time.perf_counter() - t0:.1f} s")

        rebuilds = []
        for _ in range(3):
            views.forget(handle.path)
            t0 = time.perf_counter()
            for name in views.VIEW_NAMES:
                views.render_view(handle, name)
            rebuilds.append(time.perf_counter() - t0)
        views.flush()
        st = cache.state_for(handle)
        mem = views.render_view(handle, "memory.json")
        print(f"full rebuild of all views: median {statistics.median(rebuilds) * 1000:.0f} ms, "
              f"max {max(rebuilds) * 1000:.0f} ms (goal < 2000 ms); memory.json {len(mem) / 1e6:.1f} MB, "
              f"{len(st.fold.facts)} facts")

        render_times, append_render = [], []
        folded = []
        for i in range(args.samples):
            ev = line(item("agent_message", text=f"bench note {i}: incremental refresh check"))
            t0 = time.perf_counter()
            handle.append(ev)
            t1 = time.perf_counter()
            before = st.folded_bytes
            data = views.render_view(handle, "memory.json")
            t2 = time.perf_counter()
            folded.append(st.folded_bytes - before)
            assert f"bench note {i}:".encode() in data
            render_times.append(t2 - t1)
            append_render.append(t2 - t0)
        med = statistics.median(render_times) * 1000
        print(f"memory.json after appending one event: median {med:.2f} ms, "
              f"p90 {sorted(render_times)[int(len(render_times) * 0.9)] * 1000:.2f} ms "
              f"(append+render median {statistics.median(append_render) * 1000:.2f} ms; goal < 10 ms); "
              f"bytes folded per refresh: {min(folded)}..{max(folded)}")
        t0 = time.perf_counter()
        views.render_view(handle, "memory.json")
        print(f"memory.json read again without new events: {(time.perf_counter() - t0) * 1e6:.0f} µs")
        t0 = time.perf_counter()
        views.flush()
        print(f"store copies written by flush: {(time.perf_counter() - t0) * 1000:.0f} ms "
              f"({views.persist.writes()} copies written in all, 1 per file per {views.persist.DELAY} s)")
        handle.close()
        if args.json:
            rebuild_ms = statistics.median(rebuilds) * 1000
            Path(args.json).write_text(json.dumps({
                "results": {"full rebuild of all views ms": rebuild_ms, "memory.json after one append ms": med},
                "goals": {
                    f"views: full rebuild of {args.events:,} events < 2 s": {"measured": f"{rebuild_ms:.0f} ms",
                                                                              "met": rebuild_ms < 2000},
                    "views: memory.json refresh after one append (library) < 10 ms": {"measured": f"{med:.2f} ms",
                                                                                        "met": med < 10},
                },
            }, indent=2))
    finally:
        if not args.store:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
