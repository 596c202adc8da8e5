#!/usr/bin/env python3
"""Ingest benchmark (issue 15): ``memfs import`` of a generated Codex ``exec --json`` stream, of
a generated Codex rollout and of a generated Claude Code transcript, beside ``memfs append`` of
the same events in the native dialect, through the command line (a fresh process each run, as a user runs them). Nothing is
asserted; it prints a table and, with ``--json FILE``, writes ``{"results": {...}}``.

Workloads (``--events``, default 100,000):

* a Codex stream of N events: turns of ``turn.started``, a reasoning item, a command started and
  completed, a file change, an agent message, ``turn.completed`` (7 events a turn; already this
  family, so import passes each line through);
* a Codex rollout of N lines, in Codex CLI 0.171's shapes (as in
  ``tests/fixtures/agents/codex/*/home/.codex/sessions``): a ``session_meta``, then turns of
  ``task_started``, ``turn_context``, the prompt (a ``response_item`` message and an
  ``item_completed`` ``UserMessage``), a shell ``function_call``, its ``CommandExecution``
  item and ``function_call_output``, ``token_count``s, the answer (``AgentMessage`` item and
  ``response_item`` message), ``task_complete`` (12 lines, 4 events a turn);
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


def codex_rollout(n: int) -> list[bytes]:
    thread = "01a23ae9-0000-7000-8000-00000000beef"
    lines = [{"type": "session_meta", "payload": {
        "session_id": thread, "id": thread, "timestamp": "2026-12-03T00:00:00.000Z", "cwd": "/home/dev/proj",
        "originator": "codex_exec", "cli_version": "0.171.0", "source": "exec", "model_provider": "openai",
        "base_instructions": {"text": "You are Codex, a coding agent."}, "git": {"branch": "main"}}}]
    t, total = 0, [0, 0]

    def usage(inp: int, out: int) -> dict:
        return {"input_tokens": inp, "cached_input_tokens": 0, "output_tokens": out, "reasoning_output_tokens": 0,
                "total_tokens": inp + out}

    while len(lines) < n:
        t += 1
        turn, call = f"01a23ae9-{t:08x}-7000-8000-000000000000", f"call_{t}"
        turn_meta = {"turn_id": turn}
        prompt, command, answer = f"Make test t{t} pass", f"pytest -q -k t{t}", f"t{t} passes now."
        total = [total[0] + 2000, total[1] + 40]

        def item(kind: str, body: dict, turn: str = turn) -> dict:  # (this iteration's turn)
            return {"type": "event_msg", "payload": {"type": "item_completed", "thread_id": thread, "turn_id": turn,
                                                     "item": {"type": kind, **body}}}

        def count(inp: int, out: int, total: list = total) -> dict:
            return {"type": "event_msg", "payload": {"type": "token_count", "info": {
                "total_token_usage": usage(*total), "last_token_usage": usage(inp, out), "model_context_window": 258400}}}

        lines += [
            {"type": "event_msg", "payload": {"type": "task_started", "turn_id": turn, "model_context_window": 258400}},
            {"type": "turn_context", "payload": {"turn_id": turn, "cwd": "/home/dev/proj", "approval_policy": "never",
                                                 "model": "gpt-5.5", "summary": "none"}},
            {"type": "response_item", "payload": {"type": "message", "id": f"msg_u{t}", "role": "user",
                                                  "content": [{"type": "input_text", "text": prompt}],
                                                  "internal_chat_message_metadata_passthrough": turn_meta}},
            item("UserMessage", {"id": f"u{t}", "content": [{"type": "text", "text": prompt, "text_elements": []}]}),
            {"type": "response_item", "payload": {"type": "function_call", "status": "completed", "id": f"fc_{t}",
                                                  "name": "exec_command", "arguments": orjson.dumps({"cmd": command}).decode(),
                                                  "call_id": call, "internal_chat_message_metadata_passthrough": turn_meta}},
            item("CommandExecution", {"id": call, "command": ["/bin/bash", "-lc", command], "cwd": "file:///home/dev/proj",
                                      "status": "completed", "aggregated_output": "1 passed in 0.01s\n", "exit_code": 0}),
            {"type": "response_item", "payload": {"type": "function_call_output", "id": f"fco_{t}", "call_id": call,
                                                  "output": "Process exited with code 0\nOutput:\n1 passed in 0.01s\n"}},
            count(1000, 20),
            item("AgentMessage", {"id": f"msg_a{t}", "content": [{"type": "Text", "text": answer}]}),
            {"type": "response_item", "payload": {"type": "message", "status": "completed", "id": f"msg_a{t}",
                                                  "role": "assistant", "content": [{"type": "output_text", "text": answer}],
                                                  "internal_chat_message_metadata_passthrough": turn_meta}},
            count(1000, 20),
            {"type": "event_msg", "payload": {"type": "task_complete", "turn_id": turn, "last_agent_message": answer,
                                              "duration_ms": 195}}]
    return [orjson.dumps({"timestamp": f"2026-12-{3 + i // 86_400_000:02d}T{i // 3_600_000 % 24:02d}:{i // 60_000 % 60:02d}:"
                                       f"{i // 1000 % 60:02d}.{i % 1000:03d}Z", "ordinal": i, **line})
            for i, line in enumerate(lines[:n])]


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
        sources = {"codex exec --json": codex_stream(args.events), "codex rollout": codex_rollout(args.events),
                   "claude transcript": claude_transcript(args.events)}
        configs = []
        for name, lines in sources.items():
            slug = "-".join(w for w in name.split() if w.isalnum())
            src = work / f"{slug}-source.jsonl"
            src.write_bytes(b"\n".join(lines) + b"\n")
            events = native(lines)
            nat = work / f"{slug}-native.jsonl"
            nat.write_bytes(b"\n".join(events) + b"\n")
            configs.append((f"import {name} ({len(lines):,} lines)", len(events), "import", src))
            configs.append((f"append the same {len(events):,} events, native ({slug})", len(events), "append", nat))
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
