"""Sessions out to OpenCode (SPEC §11): ``memfs export --to opencode`` writes the file
``opencode import`` reads; the real OpenCode (1.18.33, offline against the scripted model server)
imports it and ``opencode run --session`` continues the conversation with its history, in order.
The session exported is a Codex one (``tests/fixtures/agents/codex/resume_two_turns``: a command
and an answer, then a second prompt), imported as a user does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from agent_helpers import MEMFS, cli, events_of

sys.path.insert(0, str(Path(__file__).parent / "agents"))
from clis import OpenCode, run_in_group  # noqa: E402
from model_server import ModelServer  # noqa: E402

from test_agents_cli import need_clis  # noqa: E402

CODEX = Path(__file__).parent / "fixtures" / "agents" / "codex" / "resume_two_turns"
SID = "01a23aea-0f3b-7842-be12-c9694eec882e"


def codex_session(store: Path) -> str:
    proc = cli("import", "--store", str(store), *map(str, sorted(CODEX.glob("stream*.jsonl"))), str(CODEX / "home"))
    assert proc.returncode == 0, proc.stderr
    return SID


def export(store: Path, session: str, out: Path, home: Path, cwd: Path) -> dict:
    proc = subprocess.run([*MEMFS, "export", "--store", str(store), session, "--to", "opencode", "--out", str(out),
                           "--cwd", str(cwd), "--json"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_file_has_opencodes_shape_ascending_ids_and_one_message_per_request(tmp_path):
    store = tmp_path / "store"
    session = codex_session(store)
    home = tmp_path / "home"
    (home / ".config" / "opencode").mkdir(parents=True)
    (home / ".config" / "opencode" / "opencode.json").write_text('{"model": "scripted/gpt-5.5"}')
    out = tmp_path / "out"
    out.mkdir()
    res = export(store, session, out, home, tmp_path)
    doc = json.loads(Path(res["path"]).read_text())
    assert res["argv"] == ["opencode", "import", res["path"]] and res["conversation_id"] == doc["info"]["id"]
    assert doc["info"]["id"].startswith("ses_") and len(doc["info"]["id"]) == 30
    messages = doc["messages"]
    ids = [m["info"]["id"] for m in messages]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert [m["info"]["role"] for m in messages] == ["user", "assistant", "assistant", "user", "assistant"]
    assert {(m["info"].get("providerID"), m["info"].get("modelID")) for m in messages[1:3]} == {("scripted", "gpt-5.5")}
    assert [m["info"].get("finish") for m in messages if m["info"]["role"] == "assistant"] == ["tool-calls", "stop", "stop"]
    (tool,) = [p for m in messages for p in m["parts"] if p["type"] == "tool"]
    assert (tool["tool"], tool["state"]["output"], tool["state"]["metadata"]["exit"]) == ("bash", "README.md\n", 0)
    assert [p["text"] for m in messages for p in m["parts"] if m["info"]["role"] == "user"] == [
        "What files are in the project?", "What is the project about?"]
    # the turns' usage in OpenCode's form, on each turn's last request
    assert [m["info"]["tokens"]["input"] for m in messages if m["info"]["role"] == "assistant"] == [0, 2100, 1200]
    again = tmp_path / "again"
    again.mkdir()
    assert json.loads(Path(export(store, session, again, home, tmp_path)["path"]).read_text()) == doc  # stable
    proc = cli("export", "--store", str(store), session, "--to", "opencode", "--out", str(out))
    assert proc.returncode != 0 and "exists" in proc.stderr  # never replaced


def test_opencode_imports_the_file_and_continues_the_conversation_with_its_history(tmp_path):
    need_clis()
    store = tmp_path / "store"
    session = codex_session(store)
    script = {"steps": [{"text": "It is still a tiny demo project."}], "side": OpenCode.side}
    with ModelServer(script, tmp_path / "requests.jsonl") as server:
        agent = OpenCode(tmp_path / "sandbox", server.url)
        out = tmp_path / "out"
        out.mkdir()
        res = export(store, session, out, agent.home, agent.proj)
        opencode = agent.argv("x")[0]
        imported = run_in_group([opencode, "import", res["path"]], agent.proj, agent.env(), 120)
        assert imported.exit_code == 0, imported.stderr.decode(errors="replace")[-2000:]
        assert res["conversation_id"].encode() in imported.stdout
        run = agent.run("Anything else?", resume=res["conversation_id"])
        assert run.exit_code == 0, run.stderr.decode(errors="replace")[-2000:]
        requests = [r for r in server.requests() if r["answer"].startswith("step")]
    assert b"It is still a tiny demo project." in run.stdout
    (request,) = requests
    history = [(m["role"], m.get("content"), [c["function"]["name"] for c in m.get("tool_calls", [])])
               for m in request["body"]["messages"][1:]]
    assert history == [("user", "What files are in the project?", []), ("assistant", "", ["bash"]),
                       ("tool", "README.md\n", []), ("assistant", "The project has one file: README.md.", []),
                       ("user", "What is the project about?", []), ("assistant", "It is a tiny demo project.", []),
                       ("user", '"Anything else?"', [])]
    # OpenCode's store now holds the conversation and the new turn: memfs import reads them back
    reports = json.loads(cli("import", "--store", str(store), "--json",
                             str(agent.home / ".local" / "share" / "opencode")).stdout)
    (report,) = reports
    ev = events_of(store, report["session"])
    assert [e["type"] for e in ev].count("turn.completed") == 3
    assert ev[0] == {"type": "thread.started", "thread_id": res["conversation_id"], "agent": "opencode"}


def test_resume_in_opencode_continues_the_session_and_brings_each_new_turn_back_once(tmp_path):
    need_clis()
    store = tmp_path / "store"
    session = codex_session(store)
    before = events_of(store, session)
    script = {"steps": [{"text": "It is still a tiny demo project."}, {"text": "Nothing else."}],
              "side": OpenCode.side}
    with ModelServer(script, tmp_path / "requests.jsonl") as server:
        agent = OpenCode(tmp_path / "sandbox", server.url)
        bin_dir = str(Path(agent.argv("x")[0]).parent)
        env = {**agent.env(), "PATH": f"{bin_dir}:{os.path.dirname(sys.executable)}:{agent.env()['PATH']}"}
        for prompt in ("Anything else?", "And now?"):  # the second resume: no second opencode import
            proc = subprocess.run([*MEMFS, "resume", "--store", str(store), session, "--in", "opencode", "--", prompt],
                                  cwd=agent.proj, env=env, capture_output=True, timeout=180, stdin=subprocess.DEVNULL)
            assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
        requests = [r for r in server.requests() if r["answer"].startswith("step")]
    ev = events_of(store, session)
    assert ev[:len(before)] == before  # the session's own history untouched
    new = ev[len(before):]
    assert [e["type"] for e in new if e["type"].startswith("turn.")] == ["turn.started", "turn.completed"] * 2
    assert [e["context"]["prompt"] for e in new if e["type"] == "turn.started"] == ['"Anything else?"', '"And now?"']
    assert [e["item"]["text"] for e in new if e["type"] == "item.completed"] == [
        "It is still a tiny demo project.", "Nothing else."]
    # the second run's request carries the first resume's turn too, in order, after the exported ones
    users = [m["content"] for m in requests[-1]["body"]["messages"] if m["role"] == "user"]
    assert users == ["What files are in the project?", "What is the project about?", '"Anything else?"', '"And now?"']
    about = json.loads(cli("sessions", "--store", str(store), "--json").stdout)[0]
    assert about["conversation_id"] == SID and about["name"] == session  # still the conversation it was
    # a plain import of OpenCode's store afterwards: the resumed OpenCode session is this session's,
    # and holds nothing it lacks
    proc = cli("import", "--store", str(store), "--json", str(agent.home / ".local" / "share" / "opencode"))
    assert proc.returncode == 0, proc.stderr
    assert {i["session"] for i in json.loads(proc.stdout)} == {session}
    assert events_of(store, session) == ev
    (listed,) = json.loads(cli("sessions", "--store", str(store), "--json").stdout)
    assert listed["conversation_id"] == SID
