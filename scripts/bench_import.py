#!/usr/bin/env python3
"""First-import benchmark (issue 54 item 3): ``memfs import`` of N Claude Code transcripts and N
Codex rollouts copied from the captured fixtures (``tests/fixtures/agents/{claude,codex}``, main
transcripts only), every UUID in a copy replaced by a fresh one (so each copy is a new
conversation). Beside it, in the same run: reading the same files' lines with orjson (the
baseline), and the wall of the same import again with nothing new. Each command is a fresh
process, as a user runs it; the store is new for the first import; its CPU time (user + system) is
printed beside the wall (steadier than the wall on a shared machine). Nothing is asserted.

Usage: ``.venv/bin/python scripts/bench_import.py [--per-agent N ...] [--work DIR] [--json FILE]``
(default ``--per-agent 200 1000``: 400 and 2,000 files); ``--tree DIR``: the memfs of another source
tree (a checkout of an earlier commit), for a before/after comparison.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "agents"
UUID = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def templates() -> dict[str, list[Path]]:
    return {"claude": sorted(FIXTURES.glob("claude/*/home/.claude/projects/*/*.jsonl")),
            "codex": sorted(FIXTURES.glob("codex/*/home/.codex/sessions/*/*/*/rollout-*.jsonl"))}


def fresh(key: str):
    def sub(m: re.Match) -> bytes:
        h = hashlib.blake2b(m.group(0) + key.encode(), digest_size=16).hexdigest().encode()
        return b"-".join((h[:8], h[8:12], h[12:16], h[16:20], h[20:32]))
    return sub


def make_sources(dest: Path, per_agent: int) -> list[Path]:
    files = []
    for agent, temps in templates().items():
        for copy in range(per_agent):
            template = temps[copy % len(temps)]
            sub = fresh(f"{agent}/{copy}")
            data = UUID.sub(sub, template.read_bytes())
            name = UUID.sub(sub, template.name.encode()).decode()
            path = dest / agent / f"{copy // 100:03d}" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            files.append(path)
    return files


def orjson_read(files: list[Path]) -> float:
    t = time.perf_counter()
    for f in files:
        for line in f.read_bytes().splitlines():
            orjson.loads(line)
    return time.perf_counter() - t


TREE = ROOT  # the memfs source tree whose import is measured (--tree)


def wall(cmd: list[str]) -> tuple[float, int]:
    s, rc, _ = timed(cmd)
    return s, rc


def timed(cmd: list[str]) -> tuple[float, int, float]:
    """Wall seconds, exit code, CPU seconds (user + system) of a command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, cwd=TREE, env={**os.environ, "PYTHONPATH": str(TREE)})
    took = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return took, out.returncode, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def run(per_agent: int, work: Path) -> dict:
    src = work / f"src-{per_agent}"
    if not src.is_dir():
        make_sources(src, per_agent)
    files = sorted(src.rglob("*.jsonl"))
    mb = sum(f.stat().st_size for f in files) / 1e6
    orjson_read(files)  # (the page cache, for both)
    r: dict = {"files": len(files), "MB": round(mb, 1), "orjson_MBps": round(mb / orjson_read(files), 1)}
    store = work / f"store-{per_agent}"
    shutil.rmtree(store, ignore_errors=True)
    cmd = [sys.executable, "-m", "memfs", "import", "--store", str(store), str(src / "claude"), str(src / "codex")]
    s, r["exit"], cpu = timed(cmd)
    r["import_s"], r["import_MBps"], r["import_cpu_s"] = round(s, 2), round(mb / s, 2), round(cpu, 2)
    r["sessions"] = sum(1 for p in store.iterdir() if (p / "events.jsonl").exists())
    r["again_s"] = round(wall(cmd)[0], 3)
    r["python_s"] = round(wall([sys.executable, "-c", "pass"])[0], 3)
    shutil.rmtree(store, ignore_errors=True)
    return r


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-agent", type=int, nargs="+", default=[200, 1000])
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--tree", type=Path, default=ROOT, help="measure the memfs of this source tree (e.g. "
                    "`git archive main | tar -x -C DIR`: a before/after comparison)")
    args = ap.parse_args()
    global TREE
    TREE = args.tree.resolve()
    work = args.work or Path(tempfile.mkdtemp(prefix="memfs-bench-import-"))
    work.mkdir(parents=True, exist_ok=True)
    results = {}
    print("| files | MB | first import s | MB/s | CPU s (user+sys) | orjson MB/s | again s | python -c pass s | exit |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in args.per_agent:
        r = results[n] = run(n, work)
        print(f"| {r['files']} | {r['MB']} | {r['import_s']} | {r['import_MBps']} | {r['import_cpu_s']} | {r['orjson_MBps']} | "
              f"{r['again_s']} | {r['python_s']} | {r['exit']} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"results": results}, indent=1))
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
