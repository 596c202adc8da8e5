#!/usr/bin/env python3
"""Ingest benchmark (issue 15): ``memfs import`` of a generated Codex ``exec --json`` stream and
of a generated Claude Code transcript, beside ``memfs append`` of the same events in the native
dialect, through the command line (a fresh process each run, as a user runs them). Nothing is
asserted; it prints a table and, with ``--json FILE``, writes ``{"results": {...}}``.

Workloads (``--events``, default 100,000):

* a Codex stream of N events: turns of ``turn.started``, a reasoning item, a command started and
  completed, a file change, an agent message, ``turn.completed`` (7 events a turn; already this
  family, so import passes each line through);
* a Claude Code transcript of N messages: turns of a prompt, an assistant text, a Bash
  ``tool_use``, its ``tool_result``, a closing assistant text (5 messages, 7 events a turn);
* ``memfs append`` of each source's translated events (the native dialect), the same events.

Every run writes a fresh store with ``--max-events 0`` (no cap). ``import`` appends in
batches with ``buffered`` durability and flushes at the end; ``append`` appends line by line
with ``write`` durability. The configurations run interleaved in ``--rounds`` rounds (default
3); the best round is reported, as the other bench scripts do (this machine's speed drifts).

Usage: ``.venv/bin/python scripts/bench_ingest.py [--events N] [--rounds R] [--json FILE]``
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from memfs.ingest import AutoTranslator  # noqa: E402


def codex_stream(n: int) -> list[bytes]:
    lines = [orjson.dumps({"type": "thread.started", "thread_id": "bench-codex"})]
    t = 0
    while len(lines) < n:
        t += 1
        lines += [orjson.dumps(e) for e in (
            {"type": "turn.started"},
            {"type": "item.completed", "item": {"id": f"r{t}", "type": "reasoning", "text": f"**Planning step {t}**"}},
            {"type": "item.started", "item": {"id": f"c{t}", "type": "command_execution", "command": f"pytest -q -k t{t}",
                                              "aggregated_output": "", "exit_code": None, "status": "in_progress"}},
            {"type": "item.completed", "item": {"id": f"c{t}", "type": "command_execution", "command": f"pytest -q -k t{t}",
                                                "aggregated_output": "1 passed in 0.01s\n", "exit_code": 0, "status": "completed"}},
            {"type": "item.completed", "item": {"id": f"f{t}", "type": "file_change", "status": "completed",
                                                "changes": [{"path": f"src/mod{t % 50}.py", "kind": "update"}]}},
            {"type": "item.completed", "item": {"id": f"m{t}", "type": "agent_message", "text": f"Fixed test t{t}."}},
            {"type": "turn.completed", "usage": {"input_tokens": 1200, "cached_input_tokens": 900, "output_tokens": 80}})]
    return lines[:n]


def claude_transcript(n: int) -> list[bytes]:
    sid = "3b7e1f2a-0000-4000-8000-00000000beef"
    base = {"isSidechain": False, "userType": "external", "cwd": "/home/dev/proj", "sessionId": sid,
            "version": "1.0.98", "gitBranch": "main"}
    lines, parent, t = [], None, 0
    usage = {"input_tokens": 6, "cache_creation_input_tokens": 100, "cache_read_input_tokens": 12000, "output_tokens": 40}

    def add(kind: str, message: dict, **extra) -> None:
        nonlocal parent
        uuid = f"00000000-0000-4000-8000-{len(lines):012d}"
        lines.append(orjson.dumps({"parentUuid": parent, **base, "type": kind, "message": message, "uuid": uuid,
                                   "timestamp": "2025-09-20T10:00:00.000Z", **extra}))
        parent = uuid

    while len(lines) < n:
        t += 1
        add("user", {"role": "user", "content": f"Make test t{t} pass"})
        add("assistant", {"id": f"msg_{t}a", "type": "message", "role": "assistant", "model": "claude-opus-4-1",
                          "content": [{"type": "text", "text": f"Running t{t} first."}], "stop_reason": None,
                          "usage": usage})
        add("assistant", {"id": f"msg_{t}a", "type": "message", "role": "assistant", "model": "claude-opus-4-1",
                          "content": [{"type": "tool_use", "id": f"toolu_{t}", "name": "Bash",
                                       "input": {"command": f"pytest -q -k t{t}"}}], "stop_reason": None, "usage": usage})
        add("user", {"role": "user", "content": [{"tool_use_id": f"toolu_{t}", "type": "tool_result",
                                                  "content": "1 passed in 0.01s"}]})
        add("assistant", {"id": f"msg_{t}b", "type": "message", "role": "assistant", "model": "claude-opus-4-1",
                          "content": [{"type": "text", "text": f"t{t} passes now."}], "stop_reason": "end_turn",
                          "usage": usage})
    return lines[:n]


def native(lines: list[bytes]) -> list[bytes]:
    t = AutoTranslator("auto")
    return [out for raw in lines for out in t.feed(raw)]


def timed(cmd: list[str]) -> float:
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True)
    elapsed = time.perf_counter() - t
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd[:4])}… failed: {proc.stderr.decode()[-500:]}")
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100_000, help="events of the Codex stream, messages of the transcript")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="memfs-bench-ingest-"))
    memfs_cli = [sys.executable, "-m", "memfs"]
    try:
        sources = {"codex exec --json": codex_stream(args.events), "claude transcript": claude_transcript(args.events)}
        configs = []
        for name, lines in sources.items():
            src = work / f"{name.split()[0]}-source.jsonl"
            src.write_bytes(b"\n".join(lines) + b"\n")
            events = native(lines)
            nat = work / f"{name.split()[0]}-native.jsonl"
            nat.write_bytes(b"\n".join(events) + b"\n")
            configs.append((f"import {name} ({len(lines):,} lines)", len(events), "import", src))
            configs.append((f"append the same {len(events):,} events, native ({name.split()[0]})", len(events), "append", nat))
        best: dict[str, float] = {}
        for r in range(args.rounds):
            for label, n, verb, path in configs:
                store = work / f"store-{r}-{len(best)}-{verb}"
                cmd = memfs_cli + (["import", "--store", str(store), "--max-events", "0", str(path)] if verb == "import"
                                   else ["append", "--store", str(store), "--max-events", "0", "bench", str(path)])
                rate = n / timed(cmd)
                best[label] = max(best.get(label, 0.0), rate)
                shutil.rmtree(store, ignore_errors=True)
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        results = {f"{label} ev/s": round(rate) for label, rate in best.items()}
        width = max(map(len, best))
        print(f"{'configuration':<{width}}  events/s (best of {args.rounds} rounds, whole command)")
        for label, rate in best.items():
            print(f"{label:<{width}}  {rate:>10,.0f}")
        if args.json:
            Path(args.json).write_text(json.dumps({"results": results}, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
