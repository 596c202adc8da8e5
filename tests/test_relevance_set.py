"""The hand-labelled search relevance set (bench/relevance/): its labels name the sessions that
``memfs import`` makes of the real captures, and every capture is a successful real CLI run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RELEVANCE = REPO / "bench" / "relevance"
FIXTURES = REPO / "tests" / "fixtures" / "agents"


def captures() -> list[Path]:
    """Every capture the set is labelled over (its ``runs``): the relevance set's own and the
    test fixtures of its time (fixtures captured later — OpenCode's, the model switches — are
    not in it)."""
    runs = json.loads((RELEVANCE / "queries.json").read_text())["runs"]
    return [p for p in sorted(FIXTURES.glob("*/*/capture.json")) + sorted((RELEVANCE / "captures").glob("*/*/capture.json"))
            if f"{p.parts[-3]}/{p.parts[-2]}" in runs]


def test_labels_name_the_imported_sessions(tmp_path):
    spec = json.loads((RELEVANCE / "queries.json").read_text())
    store = tmp_path / "store"
    homes = [p.parent / "home" for p in captures()]
    done = subprocess.run([sys.executable, "-m", "memfs", "import", "--store", str(store), *map(str, homes)],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    listed = subprocess.run([sys.executable, "-m", "memfs", "sessions", "--json", "--store", str(store)],
                            capture_output=True, text=True, cwd=REPO, check=True)
    imported = {s["name"] for s in json.loads(listed.stdout)}

    runs = spec["runs"]
    assert set(runs.values()) == imported  # every session is a labelled capture, and vice versa
    for path in captures():
        doc = json.loads(path.read_text())
        assert runs[f"{doc['agent']}/{doc['scenario']}"] == doc["session_id"]
    for run, name in runs.items():
        if run.endswith("#child"):  # a sub-agent's session: named after its parent's
            assert name.startswith(runs[run.removesuffix("#child")] + ".")

    queries = spec["queries"]
    assert 30 <= len(queries) <= 45
    assert len({q["query"] for q in queries}) == len(queries)
    for q in queries:
        assert q["query"].strip() and q["relevant"], q
        assert q["relevant"] == [runs[r] for r in q["relevant_runs"]], q
        assert len(set(q["relevant"])) == len(q["relevant"]), q


def test_relevance_captures_are_successful_real_runs():
    docs = [json.loads(p.read_text()) for p in sorted((RELEVANCE / "captures").glob("*/*/capture.json"))]
    assert {d["agent"] for d in docs} == {"claude", "codex", "gemini"}
    assert len(docs) == 24
    for d in docs:
        assert all(run["exit_code"] == 0 for run in d["runs"]), (d["agent"], d["scenario"])
        assert d["session_id"] and d["version_output"], (d["agent"], d["scenario"])
        assert (RELEVANCE / "captures" / d["agent"] / d["scenario"] / "home").is_dir()
