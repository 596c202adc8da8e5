"""SPEC §11 export, without the CLIs: the Claude Code transcript and the Codex rollout that
``memfs export`` writes are what the CLIs need (every line parses, the parentUuid chain is
unbroken, every tool call is paired, ids agree with the file name), and import → export →
import gives the same turns, messages, tool calls, results and usage — for the captured Claude
and Codex fixtures, across agents, and for a native VT Code-dialect session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import memfs
import pytest
from memfs import views
from memfs.export import ExportExists, export_session

from export_helpers import (
    CODEX_USAGE,
    FIXTURES,
    NATIVE,
    check_claude_transcript,
    check_codex_rollout,
    conversation,
    export,
    import_files,
    norm_turn,
    run,
    sessions,
)

CLAUDE = sorted(p.name for p in (FIXTURES / "claude").iterdir())
CODEX = sorted(p.name for p in (FIXTURES / "codex").iterdir())
CASES = [("claude", s) for s in CLAUDE] + [("codex", s) for s in CODEX]


def _imported(tmp_path: Path, agent: str, scenario: str) -> tuple[Path, list[str]]:
    store = tmp_path / "a"
    import_files(store, FIXTURES / agent / scenario / "home")
    names = sessions(store)
    assert names
    return store, names


def _round_trip(tmp_path: Path, store: Path, name: str, to: str) -> tuple[Path, Path, str]:
    """Export ``name`` into a fresh CLI store, check the file, import it into a fresh store:
    (the file, the new store, the new session's name)."""
    home = tmp_path / f"home-{to}-{len(list(tmp_path.iterdir()))}"
    (home / f".{to}").mkdir(parents=True)
    result = export(store, name, to, home)
    path = Path(result["path"])
    assert path.is_relative_to(home / f".{to}")
    if to == "claude":
        assert path.parent.parent == home / ".claude" / "projects"
        check_claude_transcript(path)
    else:
        assert path.parent.parent.parent.parent == home / ".codex" / "sessions"
        check_codex_rollout(path, None)
    assert result["conversation_id"] in path.name
    again = tmp_path / f"b-{home.name}"
    reports = import_files(again, path)
    assert [r["session"] for r in reports] == [result["conversation_id"]]
    return path, again, result["conversation_id"]


@pytest.mark.parametrize("agent, scenario", CASES)
def test_import_export_import_keeps_the_conversation(agent, scenario, tmp_path):
    store, names = _imported(tmp_path, agent, scenario)
    for name in names:
        before = conversation(store, name)
        _, again, new = _round_trip(tmp_path, store, name, agent)
        after = conversation(again, new)
        assert [norm_turn(t, agent) for t in after.turns] == [norm_turn(t, agent) for t in before.turns]
        # the agent's own ids survive too (tool calls, and messages under their turn or message ids)
        kept = {i["id"] for t in after.turns for i in t.items}
        ids = {i["id"] for t in before.turns for i in t.items
               if i["type"] in ("agent_message", "command_execution", "mcp_tool_call", "todo_list", "tool_invocation")}
        assert ids <= kept, sorted(ids - kept)


@pytest.mark.parametrize("agent, scenario", CASES)
def test_a_session_exports_to_the_other_agent(agent, scenario, tmp_path):
    store, names = _imported(tmp_path, agent, scenario)
    to = "codex" if agent == "claude" else "claude"
    keys = CODEX_USAGE if to == "codex" else None
    for name in names:
        before = conversation(store, name)
        _, again, new = _round_trip(tmp_path, store, name, to)
        after = conversation(again, new)
        assert [norm_turn(t, to, keys) for t in after.turns] == [norm_turn(t, to, keys) for t in before.turns]


@pytest.mark.parametrize("to", ["claude", "codex"])
def test_a_native_session_exports_to_both(to, tmp_path):
    store = tmp_path / "a"
    code, _, err = run("append", "--store", str(store), "native", str(NATIVE))
    assert code == 0, err
    before = conversation(store, "native")
    assert [t.outcome for t in before.turns] == ["completed", "completed", "failed"]
    path, again, new = _round_trip(tmp_path, store, "native", to)
    after = conversation(again, new)
    keys = CODEX_USAGE if to == "codex" else None
    got = [norm_turn(t, to, keys) for t in after.turns]
    want = [norm_turn(t, to, keys) for t in before.turns]
    # a file change of two paths is two Claude tool calls; a call with no result gets one saying so
    for turn in got + want:
        turn["items"] = _flat(turn["items"])
    assert got[:2] == want[:2]
    assert got[2]["prompt"] == "Deploy it" and got[2]["outcome"] == "failed"
    assert got[2]["failure"] == "API Error: 500 Internal server error"
    [command] = got[2]["items"]
    assert command[1] == "make deploy" and "no result was recorded" in command[4]
    text = path.read_text()
    for said in ("The fetch call has no retry.", "Retry 3 times", "the API is flaky", "use exponential backoff",
                 "1 failed, 3 passed", "def fetch(url):", "docs/net.md"):
        assert said in text or json.dumps(said)[1:-1] in text, said


def _flat(items: list[tuple]) -> list[tuple]:
    """File changes one path each (Claude writes one Edit/Write per path)."""
    out: list[tuple] = []
    for item in items:
        if item[0] == "files":
            out += [("files", [change], item[2]) for change in item[1]]
        else:
            out.append(item)
    return out


def test_an_export_never_replaces_a_file(tmp_path):
    store, [name] = _imported(tmp_path, "claude", "resume_two_turns")
    home = tmp_path / "home"
    (home / ".claude").mkdir(parents=True)
    first = export(store, name, "claude", home)
    data = Path(first["path"]).read_bytes()
    code, _, err = run("export", "--store", str(store), name, "--to", "claude", "--out", str(home))
    assert code == 1 and "already holds conversation" in err and "nothing written" in err
    # the same conversation under another project's directory is refused too (the CLI would find either)
    code, _, err = run("export", "--store", str(store), name, "--to", "claude", "--out", str(home),
                       "--cwd", str(tmp_path))
    assert code == 1 and first["path"] in err
    with memfs.open_session(store, name, read_only=True) as h:  # the library names the file to resume
        with pytest.raises(ExportExists) as refused:
            export_session(h, "claude", home=home, cwd=str(tmp_path))
    assert refused.value.result.path == Path(first["path"]) and refused.value.result.cwd == first["cwd"]
    assert refused.value.result.argv == ["claude", "--resume", name] and refused.value.errno_name == "EEXIST"
    assert Path(first["path"]).read_bytes() == data
    target = tmp_path / "mine.jsonl"
    target.write_text("keep me\n")
    code, _, err = run("export", "--store", str(store), name, "--to", "codex", "--out", str(target))
    assert code == 1 and "exists" in err and target.read_text() == "keep me\n"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".mine")) == []  # no temp file left


def test_out_a_directory_a_file_or_the_log(tmp_path):
    store, [name] = _imported(tmp_path, "codex", "ok_failing_command")
    plain = tmp_path / "plain"
    plain.mkdir()
    rollout = Path(export(store, name, "codex", plain)["path"])
    assert rollout.parent == plain and rollout.name.startswith("rollout-") and rollout.name.endswith(f"{name}.jsonl")
    check_codex_rollout(rollout, None)  # not a Codex home: no provider is named
    transcript = Path(export(store, name, "claude", plain)["path"])
    assert transcript == plain / f"{name}.jsonl"
    check_claude_transcript(transcript)
    log = Path(export(store, name, "jsonl", tmp_path / "copy.jsonl")["path"])
    assert log.read_bytes() == (store / name / "events.jsonl").read_bytes()
    proc = subprocess.run([sys.executable, "-m", "memfs", "export", "--store", str(store), name, "--to", "jsonl"],
                          capture_output=True)
    assert proc.returncode == 0 and proc.stdout == log.read_bytes()
    code, _, err = run("export", "--store", str(store), name, "--to", "claude", "--out", str(tmp_path / "no" / "x.jsonl"))
    assert code == 1 and "is not a directory" in err
    code, _, err = run("export", "--store", str(store), "nosuch", "--to", "claude", "--out", str(plain))
    assert code == 1 and err


def test_markdown_export_writes_the_renderer_s_text(tmp_path):
    markdown = pytest.importorskip("memfs.export.markdown", reason="the Markdown renderer is not in this tree yet")
    store, [name] = _imported(tmp_path, "claude", "ok_failing_command")
    path = Path(export(store, name, "markdown", tmp_path)["path"])
    assert path == tmp_path / f"{name}.md"
    with memfs.open_session(store, name, read_only=True) as h:
        assert path.read_text() == markdown.render(h)


def test_the_rollout_names_the_provider_the_user_configured(tmp_path):
    store, [name] = _imported(tmp_path, "claude", "ok_failing_command")
    codex_home = tmp_path / "home" / ".codex"
    codex_home.mkdir(parents=True)
    (codex_home / "config.toml").write_text('model_provider = "mine"\n[model_providers.mine]\nname = "mine"\n')
    path = Path(export(store, name, "codex", codex_home)["path"])
    check_codex_rollout(path, "mine")


def test_without_out_the_cli_s_own_store_and_the_resume_command(tmp_path):
    store, [name] = _imported(tmp_path, "codex", "resume_two_turns")
    home, codex_home = tmp_path / "home", tmp_path / "codexhome"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "CODEX_HOME": str(codex_home)}
    env.pop("CLAUDE_CONFIG_DIR", None)
    proj = tmp_path / "proj"
    proj.mkdir()
    memfs = [sys.executable, "-m", "memfs", "export", "--store", str(store), name]
    proc = subprocess.run([*memfs, "--to", "claude", "--cwd", str(proj)], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    slug = str(proj).replace("/", "-").replace("_", "-").replace(".", "-")
    path = home / ".claude" / "projects" / slug / f"{name}.jsonl"
    assert proc.stdout.splitlines() == [f"wrote {path}", f"resume: cd {proj} && claude --resume {name}"]
    lines = check_claude_transcript(path)
    assert {line["cwd"] for line in lines} == {str(proj)}
    proc = subprocess.run([*memfs, "--to", "codex"], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    [rollout] = list((codex_home / "sessions").rglob("rollout-*.jsonl"))
    assert proc.stdout.splitlines()[0] == f"wrote {rollout}"
    assert proc.stdout.splitlines()[1].endswith(f"codex exec resume {name}")
    check_codex_rollout(rollout, None)


@pytest.mark.parametrize("to", ["claude", "codex"])
def test_a_recorded_codex_stream_exports_with_the_prompts_a_later_capture_noted(to, tmp_path):
    """``codex exec --json`` prints no prompt and counts tokens over the whole thread; once the
    rollout was imported too, the prompts are the session's turn notes: the export carries
    them, each turn's own usage, and call ids unique across the runs (each run counts item_0…)."""
    scenario = FIXTURES / "codex" / "resume_two_turns"
    store = tmp_path / "a"
    import_files(store, scenario / "stream.1.jsonl", scenario / "stream.2.jsonl")
    import_files(store, scenario / "home")
    [name] = sessions(store)
    path, again, new = _round_trip(tmp_path, store, name, to)
    after = conversation(again, new)
    assert [t.prompt for t in after.turns] == ["What files are in the project?", "What is the project about?"]
    assert [t.usage["output_tokens"] for t in after.turns] == [45, 30]
    assert [[i["type"] for i in t.items] for t in after.turns] == [["command_execution", "agent_message"],
                                                                   ["agent_message"]]
    assert after.turns[0].items[0]["aggregated_output"].strip() == "README.md"
    assert "item_0" not in {i["id"] for t in after.turns for i in t.items}


def test_a_relative_cwd_read_from_the_session_is_never_where_the_export_goes(tmp_path):
    """A session ``cwd`` that is not a clean absolute path (read from a record) places and names
    nothing: the export is for the current directory; an absolute one missing here is kept."""
    store, home = tmp_path / "store", tmp_path / "home"
    (home / ".claude").mkdir(parents=True)
    [item] = import_files(store, FIXTURES / "claude" / "resume_two_turns" / "home" / ".claude")
    meta_file = store / item["session"] / "index" / "about.json"
    recorded = json.loads(meta_file.read_text())["cwd"]
    assert os.path.isabs(recorded) and not os.path.isdir(recorded)
    assert export(store, item["session"], "claude", home)["cwd"] == recorded  # (another machine's: kept)
    for bad in ("../../etc", f"{recorded}/../x", "/tmp/\x1b]0;x"):
        meta_file.write_text(json.dumps({**json.loads(meta_file.read_text()), "cwd": bad}))
        result = export(store, item["session"], "claude", tmp_path / f"out{len(bad)}.jsonl")
        assert result["cwd"] == os.getcwd()
        lines = [json.loads(line) for line in Path(result["path"]).read_text().splitlines()]
        assert {line["cwd"] for line in lines} == {os.getcwd()}


def _facts(store: Path, name: str) -> tuple[list, list]:
    """The views' facts: memory.json's facts (text, turn, type; sorted — a Codex to-do list
    closes at its turn's end, its Claude export where it changed) and each turn's trajectory
    entry without its offsets and event count (the export's lines are not the source's)."""
    with memfs.open_session(store, name, read_only=True) as h:
        memory = json.loads(views.render_view(h, "memory.json"))
        trajectory = [json.loads(line) for line in views.render_view(h, "trajectory.jsonl").splitlines()]
    facts = sorted((f["fact"], f["turn"], f["type"]) for f in memory["grounded_facts"])
    for entry in trajectory:
        for key in ("start_offset", "end_offset", "event_count"):
            entry.pop(key, None)
    return facts, trajectory


@pytest.mark.parametrize("scenario", CODEX)
def test_a_codex_session_through_claude_keeps_its_facts(scenario, tmp_path):
    """import → export to Claude → import: the same facts and trajectory, token for token."""
    store, names = _imported(tmp_path, "codex", scenario)
    for name in names:
        _, again, new = _round_trip(tmp_path, store, name, "claude")
        assert _facts(again, new) == _facts(store, name)


def test_reasoning_folded_for_claude_comes_back_as_reasoning(tmp_path):
    """Claude Code has no block for another agent's reasoning (a thinking block needs the
    model's signature) nor for a decision: the export folds them into text blocks its line
    marks, and the import restores them — no fact is added, the trajectory is the same."""
    store = tmp_path / "a"
    code, _, err = run("append", "--store", str(store), "native", str(NATIVE))
    assert code == 0, err
    path, again, new = _round_trip(tmp_path, store, "native", "claude")
    marked = [json.loads(line) for line in path.read_text().splitlines() if '"memfs"' in line]
    [line] = [m for m in marked if m["type"] == "assistant" and m["memfs"]["folded"].get("reasoning")]
    [index] = line["memfs"]["folded"]["reasoning"]
    assert line["message"]["content"][index] == {"type": "text", "text": "Reasoning: The fetch call has no retry."}
    before, after = conversation(store, "native"), conversation(again, new)
    said = [(i["type"], i["text"]) for t in after.turns for i in t.items if i["type"] == "reasoning"]
    assert said == [(i["type"], i["text"]) for t in before.turns for i in t.items if i["type"] == "reasoning"]
    facts_before, trajectory_before = _facts(store, "native")
    facts_after, trajectory_after = _facts(again, new)
    assert not [f for f in facts_after if "Reasoning:" in f[0]]
    assert facts_after == facts_before  # the decision folded beside it is a decision again
    # the item kinds per turn (a native tool_output travels as its call's result; a change of two
    # paths is two Claude calls)
    assert [set(t["item_types"]) for t in trajectory_after] == \
        [set(t["item_types"]) - {"tool_output"} for t in trajectory_before]


def test_a_text_that_only_looks_folded_stays_a_message(tmp_path):
    """The mark decides, not the words: a Claude answer beginning "Reasoning: " is a message,
    and a mark naming a block whose text is not the fold of what it names restores nothing."""
    sid = "5b0c3a52-8d7e-4e51-9a57-1f2e3d4c5b6a"
    lines = [
        {"type": "user", "uuid": "u1", "parentUuid": None, "sessionId": sid, "timestamp": "2026-12-01T10:00:00Z",
         "message": {"role": "user", "content": "why?"}},
        {"type": "assistant", "uuid": "a1", "parentUuid": "u1", "sessionId": sid, "timestamp": "2026-12-01T10:00:01Z",
         "memfs": {"folded": {"reasoning": [1, 7, "0"],
                              "items": {"0": {"type": "plan", "text": "x"}, "1": {"type": "agent_message"}}}},
         "message": {"id": "msg_1", "role": "assistant", "model": "claude-opus-5-5", "stop_reason": "end_turn",
                     "content": [{"type": "text", "text": "Reasoning: it is a plain answer."},
                                 {"type": "text", "text": "no prefix here"}],
                     "usage": {"input_tokens": 5, "output_tokens": 3}}},
    ]
    source = tmp_path / "projects" / "-p" / f"{sid}.jsonl"
    source.parent.mkdir(parents=True)
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    store = tmp_path / "s"
    import_files(store, source)
    turn = conversation(store, sid).turns[0]
    assert [(i["type"], i["text"]) for i in turn.items] == [
        ("agent_message", "Reasoning: it is a plain answer."), ("agent_message", "no prefix here")]
