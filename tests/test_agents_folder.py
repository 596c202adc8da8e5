"""Adding an agent means adding one folder (issue 53): a copy of memfs with one more folder,
``memfs/agents/toy/`` (a table, a reader, a writer, nothing else edited), imports that agent's
logs, records its command, refuses other lines under ``--format toy`` and exports a session to
its format and back — each CLI run in a subprocess on the copy. And each agent's own detection
takes its captured records and no other agent's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import memfs
import orjson
import pytest
from memfs import agents
from memfs.ingest import classify, session_id_of

from agent_helpers import events_of, items

FIXTURES = Path(__file__).parent / "fixtures" / "agents"

TOY = {
    "__init__.py": "",
    "shapes.py": '''
from memfs.agents.common import LineFormat, Shapes, UsageShape


def is_toy(obj):
    return isinstance(obj.get("toy"), str)


def session_id(obj):
    return obj["toy"] or None


SHAPES = Shapes(name="toy", tools={}, writes={}, usage=UsageShape((("in", "input_tokens"), ("out", "output_tokens"))),
                formats=(LineFormat("toy", "a toy log", is_toy, session_id, rank=5),), command="toy",
                line="a toy line")
''',
    "read.py": '''
from memfs.agents.common import read_usage
from memfs.agents.toy.shapes import SHAPES
from memfs.ingest import VarsState, dumps, parse_object


class ToyTranslator(VarsState):
    kind = "toy"

    def __init__(self):
        self.started = False
        self.meta = {}

    def feed(self, raw):
        obj = parse_object(raw, "toy")
        out = []
        if not self.started:
            self.started = True
            self.meta.update(agent="toy", conversation_id=obj["toy"])
            out.append(dumps({"type": "thread.started", "thread_id": obj["toy"], "agent": "toy"}))
        if "ask" in obj:
            out.append(dumps({"type": "turn.started", "context": {"prompt": obj["ask"]}}))
        if "say" in obj:
            out.append(dumps({"type": "item.completed", "item": {"id": obj["id"], "type": "agent_message",
                                                                 "text": obj["say"]}}))
            out.append(dumps({"type": "turn.completed", "usage": read_usage(SHAPES.usage, obj.get("tokens"))}))
        return out


TRANSLATORS = {"toy": ToyTranslator}
''',
    "write.py": '''
import orjson

from memfs.export import Placement, out_file


def place(conv, out, home, cwd):
    uid = conv.conversation_id
    lines = []
    for turn in conv.turns:
        lines.append({"toy": uid, "ask": turn.prompt})
        lines += [{"toy": uid, "id": item["id"], "say": item["text"]} for item in turn.items
                  if item.get("type") == "agent_message"]
    data = b"".join(orjson.dumps(line) + b"\\n" for line in lines)
    return Placement(out_file(out, f"{uid}.toy.jsonl"), data, uid, ["toy", "--resume", uid])
''',
}

LOG = [{"toy": "t-1", "ask": "hello"}, {"toy": "t-1", "id": "a1", "say": "hi there", "tokens": {"in": 7, "out": 3}}]


@pytest.fixture(scope="module")
def copy(tmp_path_factory) -> Path:
    """A copy of the memfs package with ``memfs/agents/toy/`` added, and a ``toy`` command."""
    root = tmp_path_factory.mktemp("withtoy")
    shutil.copytree(Path(memfs.__file__).parent, root / "memfs", ignore=shutil.ignore_patterns("__pycache__"))
    folder = root / "memfs" / "agents" / "toy"
    folder.mkdir()
    for name, text in TOY.items():
        (folder / name).write_text(text.lstrip())
    (root / "bin").mkdir()
    toy = root / "bin" / "toy"  # the agent's CLI: prints its log, as `memfs record` runs it
    text = "\n".join(json.dumps(line) for line in LOG)
    toy.write_text(f"#!{sys.executable}\nprint({text!r})\n")
    toy.chmod(0o755)
    return root


def run(copy: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(copy), "PATH": f"{copy / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run([sys.executable, "-m", "memfs", *args], capture_output=True, text=True, timeout=120,
                          env=env, cwd=copy)


def test_the_copy_is_memfs_with_one_more_agent(copy):
    proc = run(copy, "import", "--help")
    assert proc.returncode == 0 and "toy" in proc.stdout  # --format toy: from the folder
    assert "toy" not in agents.AGENTS  # (this memfs has no such folder)


def test_a_new_folder_is_imported_recorded_refused_and_exported_by_its_table(copy, tmp_path):
    log = tmp_path / "t-1.jsonl"
    log.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in LOG))
    store = tmp_path / "store"
    proc = run(copy, "import", "--store", str(store), "--json", str(log))
    assert proc.returncode == 0, proc.stderr
    (report,) = json.loads(proc.stdout)
    assert (report["session"], report["format"], report["refused"]) == ("t-1", "toy", 0)
    ev = events_of(store, "t-1")
    assert [i["text"] for i in items(ev)] == ["hi there"]
    assert ev[-1]["type"] == "turn.completed" and ev[-1]["usage"]["input_tokens"] == 7

    # memfs record knows the agent by its command (the table's ``command``)
    proc = run(copy, "record", "--store", str(tmp_path / "rec"), "live", "--", "toy")
    assert proc.returncode == 0, proc.stderr
    ev = events_of(tmp_path / "rec", "live")
    assert ev[0] == {"type": "thread.started", "thread_id": "t-1", "agent": "toy"}
    assert [i["text"] for i in items(ev)] == ["hi there"]
    proc = run(copy, "sessions", "--store", str(tmp_path / "rec"), "--json")
    assert {s["name"]: s["agent"] for s in json.loads(proc.stdout)} == {"live": "toy"}

    # --format toy takes only its own lines: another agent's is named, an unknown one refused so
    unknown = tmp_path / "unknown.jsonl"
    unknown.write_text('{"what": 1}\n')
    for n, (source, said) in enumerate(((FIXTURES / "claude" / "ok_failing_command" / "stream.jsonl", "(Claude Code"),
                                        (unknown, "not a toy line"))):
        proc = run(copy, "import", "--store", str(tmp_path / f"refused{n}"), "--format", "toy", "--json", str(source))
        (report,) = json.loads(proc.stdout)
        assert report["refused"] > 0 and report["appended"] == 0, report
        assert said in next((tmp_path / f"refused{n}").rglob("rejected.jsonl")).read_text()

    # export --to toy: the folder's write.place says where and what; it imports back the same
    proc = run(copy, "export", "--store", str(store), "t-1", "--to", "toy", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    (written,) = tmp_path.glob("*.toy.jsonl")  # (named by the conversation's UUID: memfs made one for t-1)
    uid = written.name.removesuffix(".toy.jsonl")
    assert [orjson.loads(line) for line in written.read_bytes().splitlines()] == \
        [{"toy": uid, "ask": "hello"}, {"toy": uid, "id": "a1", "say": "hi there"}]
    proc = run(copy, "import", "--store", str(tmp_path / "back"), "--json", str(written))
    assert proc.returncode == 0, proc.stderr
    (report,) = json.loads(proc.stdout)
    assert [i["text"] for i in items(events_of(tmp_path / "back", report["session"]))] == ["hi there"]


CAPTURES = {name: sorted(p for p in (FIXTURES / name).rglob("*.jsonl") if p.name != "requests.jsonl")
            for name in agents.AGENTS}


@pytest.mark.parametrize("name", agents.AGENTS)
def test_each_agents_detection_takes_its_captures_and_no_other_agents(name):
    """The first lines of each record an agent wrote (its captured runs: streams and stored
    files) are told as that agent's by classify, which asks every agent's table; the session id
    reader is the format's own; the agent's command finds it."""
    kinds = {f.kind for _, f in agents.line_formats() if agents.owner_of(f.kind) == name}
    seen = set()
    heads = [(path, obj) for path in CAPTURES[name] for obj in map(_object, path.read_bytes().splitlines()[:5])]
    for path, obj in heads:
        kind = classify(obj) if obj is not None else None
        assert kind is None or (agents.owner_of(kind) == name and kind in kinds), (path, obj)
        seen.add(kind)
        sid = session_id_of(obj) if kind else None
        assert sid is None or (isinstance(sid, str) and sid)
    seen.discard(None)
    assert seen == kinds, (name, seen)
    table = agents.shapes(name)
    assert table is not None and agents.by_command(table.command or "") == name


def _object(raw: bytes) -> dict | None:
    obj = orjson.loads(raw) if raw.strip() else None
    return obj if isinstance(obj, dict) else None
