#!/usr/bin/env python3
"""``derived/transcript.md`` benchmark (SPEC §11): the view kept up per turn beside a whole render.

For sessions of T turns (each a prompt, a command with a few hundred bytes of output, a tool
call with arguments, a message and a close with usage), written through the store, it measures:

* **whole render**: :func:`memfs.export.markdown.render` of the session (what ``memfs export
  --to markdown`` does, and what a view regenerated on every read would cost);
* **view after one append**: ``--rounds`` times, one turn appended, then
  ``views.render_view(handle, "transcript.md")`` timed — the view renders only the new turn and
  joins the cached text of the others (plus the views' shared fold of the new bytes);
* the ratio of the two (p50), side by side in one process.

Nothing is asserted: it prints a table and, with ``--json FILE``, writes ``{"results": [...]}``.

Usage: ``.venv/bin/python scripts/bench_transcript.py [--turns 500,2000] [--rounds 50] [--quick]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import memfs  # noqa: E402
from memfs import views  # noqa: E402
from memfs.export.markdown import render  # noqa: E402


def wrap(event: dict) -> bytes:
    return orjson.dumps({"schema_version": "0.18.0", "event": event})


def turn(i: int) -> list[bytes]:
    output = "\n".join(f"line {j} of the output of step {i}" for j in range(12))
    return [wrap({"type": "turn.started", "context": {"origin": "user", "prompt": f"Do step {i} of the plan"}}),
            wrap({"type": "item.completed", "item": {"id": f"c{i}", "type": "command_execution",
                                                     "command": f"make step-{i}", "status": "failed" if i % 7 == 0
                                                     else "completed", "exit_code": 1 if i % 7 == 0 else 0,
                                                     "aggregated_output": output}}),
            wrap({"type": "item.completed", "item": {"id": f"x{i}", "type": "mcp_tool_call", "server": "notes",
                                                     "tool": "lookup", "arguments": {"key": f"k{i}"},
                                                     "result": {"content": [{"type": "text", "text": f"note {i}"}]},
                                                     "status": "completed"}}),
            wrap({"type": "item.completed", "item": {"id": f"m{i}", "type": "agent_message",
                                                     "text": f"Step {i} is done; the build passes again."}}),
            wrap({"type": "turn.completed", "usage": {"input_tokens": 1000 + i, "output_tokens": 50}})]


def measure(root: Path, turns: int, rounds: int) -> dict:
    name = f"t{turns}"
    with memfs.open_session(root, name, durability="write", max_events=0) as h:
        lines = [wrap({"type": "thread.started", "thread_id": name})]
        for i in range(turns):
            lines += turn(i)
        h.append_many(lines)
        t = time.perf_counter()
        text = render(h)
        whole_first = time.perf_counter() - t
        views.render_view(h, "transcript.md")  # the view's first read (renders every turn once)
        view, whole = [], []
        for r in range(rounds):
            h.append_many(turn(turns + r))
            t = time.perf_counter()
            data = views.render_view(h, "transcript.md")
            view.append(time.perf_counter() - t)
            t = time.perf_counter()
            fresh = render(h)
            whole.append(time.perf_counter() - t)
            assert data.decode() == fresh  # the same text
    return {"turns": turns, "bytes_md": len(text.encode()), "whole_render_ms": whole_first * 1e3,
            "whole_render_p50_ms": statistics.median(whole) * 1e3,
            "view_after_append_p50_ms": statistics.median(view) * 1e3,
            "ratio_whole_over_view": statistics.median(whole) / statistics.median(view)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", default="500,2000", help="session sizes in turns (comma-separated)")
    ap.add_argument("--rounds", type=int, default=50, help="appends measured per size")
    ap.add_argument("--quick", action="store_true", help="small sizes, few rounds (a smoke run)")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args()
    sizes = [100] if args.quick else [int(x) for x in args.turns.split(",")]
    rounds = 5 if args.quick else args.rounds
    results = []
    with tempfile.TemporaryDirectory(prefix="memfs-bench-transcript-") as tmp:
        for n in sizes:
            results.append(measure(Path(tmp), n, rounds))
    print(f"{'turns':>6} {'md bytes':>10} {'whole render ms':>16} {'view after append ms':>21} {'ratio':>6}")
    for r in results:
        print(f"{r['turns']:>6} {r['bytes_md']:>10,} {r['whole_render_p50_ms']:>16.1f} "
              f"{r['view_after_append_p50_ms']:>21.2f} {r['ratio_whole_over_view']:>6.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
