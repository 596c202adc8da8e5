"""``memfs import --jobs N`` (:mod:`memfs.ingest.shares`): a run spread over processes makes the
store one process makes — the same sessions, files and metadata, a sub-agent beside its parent,
a conversation split over files in one session — and says the same of every file."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import orjson

from agent_helpers import MEMFS

AGENTS = Path(__file__).parent / "fixtures" / "agents"
HOMES = {"claude": ".claude/projects", "codex": ".codex", "gemini": ".gemini/tmp"}
HOUR_AGO = time.time_ns() - 3600 * 10**9
VOLATILE = {"imported_at", "updated_at"}  # the import's own clock
FACTS = ("events.jsonl", "rejected.jsonl", "index/about.json", "index/import-sources.json")  # (the rest: the
# store's own bookkeeping, its clock and inode numbers)


def sources(dest: Path) -> list[Path]:
    """Every captured agent home's files, under one directory per agent and scenario."""
    roots = []
    for agent, under in HOMES.items():
        for home in sorted(AGENTS.glob(f"{agent}/*/home/{under}")):
            target = dest / agent / home.parents[len(Path(under).parts)].name / under
            shutil.copytree(home, target, ignore=shutil.ignore_patterns("*.lock"))
            roots.append(target)
    for path in dest.rglob("*"):
        os.utime(path, ns=(HOUR_AGO, HOUR_AGO))
    return roots


def without_clock(value):
    if isinstance(value, dict):
        return {k: without_clock(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [without_clock(v) for v in value]
    return value


def snapshot(store: Path) -> dict[str, object]:
    """Every session's record, what it refused and what it says it imported (less the clock)."""
    out: dict[str, object] = {}
    for session in sorted(p for p in store.iterdir() if not p.name.startswith(".")):
        for name in FACTS:
            if (session / name).exists():
                data = (session / name).read_bytes()
                out[f"{session.name}/{name}"] = without_clock(orjson.loads(data)) if name.endswith(".json") else data
    return out


def run(store: Path, roots: list[Path], *extra: str) -> tuple[int, list[dict]]:
    proc = subprocess.run([*MEMFS, "import", "--store", str(store), "--json", *extra, *map(str, roots)],
                          capture_output=True, timeout=300)
    assert proc.returncode in (0, 3), proc.stderr  # (3: the captures hold lines the import refuses)
    return proc.returncode, orjson.loads(proc.stdout)


def test_an_import_over_two_processes_makes_what_one_process_makes(tmp_path):
    roots = sources(tmp_path / "src")
    rc1, one = run(tmp_path / "one", roots, "--jobs", "1")
    rc2, two = run(tmp_path / "two", roots, "--jobs", "2")
    assert (rc2, two) == (rc1, one)
    assert sum(1 for i in one if i["status"] == "imported") >= 30
    assert any(".agent-" in (i["session"] or "") for i in one), "no sub-agent among the fixtures"
    split = [s for s in {i["session"] for i in one} if sum(1 for i in one if i["session"] == s) > 1]
    assert split, "no conversation split over files among the fixtures"
    assert snapshot(tmp_path / "two") == snapshot(tmp_path / "one")
    conversations = ".memfs-conversations.json"
    assert orjson.loads((tmp_path / "two" / conversations).read_bytes()) == \
        orjson.loads((tmp_path / "one" / conversations).read_bytes())
    rc, again = run(tmp_path / "two", roots, "--jobs", "2")
    assert {i["status"] for i in again} == {"up-to-date"}, "the workers' re-import notes were not kept"


def test_jobs_needs_a_one_shot_import(tmp_path):
    proc = subprocess.run([*MEMFS, "import", "--store", str(tmp_path / "s"), "--follow", "--jobs", "2",
                           str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--follow and --jobs do not go together" in proc.stderr
    proc = subprocess.run([*MEMFS, "import", "--store", str(tmp_path / "s"), "--jobs", "0", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--jobs" in proc.stderr
