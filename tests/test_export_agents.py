"""SPEC §11 acceptance with the real CLIs (docs/agents.md): a session exported by ``memfs export``
into a sandbox HOME / CODEX_HOME is resumed by ``claude --resume <uuid> -p next`` /
``codex exec resume <uuid> next`` against the scripted model server, and the FIRST request the
CLI sends carries the session's prompts, answers, tool calls and their results — each call
paired with its result, and none of the CLIs' own filler for a call without one (Claude Code's
"[Tool call interrupted…", Codex's "aborted"). Claude → Claude, Codex → Codex, Codex → Claude,
Claude → Codex, and a native VT Code-dialect session → both.

Needs the CLIs (``bash scripts/install_agents.sh``): skipped with the reason without them, a
failure instead when MEMFS_REQUIRE_AGENTS=1 (tests/test_agents_cli.py's rule)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "agents"))
from clis import AGENTS, run_in_group  # noqa: E402
from model_server import ModelServer  # noqa: E402

from export_helpers import FIXTURES, NATIVE, conversation, import_files, run, sessions  # noqa: E402
from test_agents_cli import need_clis  # noqa: E402

ANSWER = "Continuing from the exported session."
SOURCES = {"claude": FIXTURES / "claude" / "resume_two_turns" / "home",
           "codex": FIXTURES / "codex" / "resume_two_turns" / "home", "native": NATIVE}


def _source(store: Path, source: str) -> str:
    if source == "native":
        code, _, err = run("append", "--store", str(store), "native", str(NATIVE))
        assert code == 0, err
        return "native"
    import_files(store, SOURCES[source])
    [name] = sessions(store)
    return name


def _expected(store: Path, name: str) -> dict[str, list[str]]:
    """What the first request must carry: prompts, answers, the calls' ids and their results."""
    conv = conversation(store, name)
    want: dict[str, list[str]] = {"prompts": [], "answers": [], "calls": [], "results": []}
    for turn in conv.turns:
        if turn.prompt:
            want["prompts"].append(turn.prompt)
        for item in turn.items:
            kind = item["type"]
            if kind == "agent_message":
                want["answers"].append(item["text"])
            elif kind in ("command_execution", "tool_invocation", "mcp_tool_call"):
                want["calls"].append(item["id"])
                if kind == "command_execution" and item.get("status") != "in_progress":
                    want["results"].append(item["aggregated_output"].removeprefix("Exit code 1\n").strip())
                elif kind == "tool_invocation":
                    want["results"].append((item.get("result") or item)["output"].strip())
                elif kind == "mcp_tool_call":
                    want["results"].append(item["result"]["content"][0]["text"])
    assert want["prompts"] and want["answers"] and want["calls"] and want["results"]
    return want


def _pairs_claude(messages: list[dict]) -> tuple[dict[str, int], dict[str, str]]:
    uses, results = {}, {}
    for i, message in enumerate(messages):
        content = message.get("content")
        for block in content if isinstance(content, list) else []:
            if block.get("type") == "tool_use":
                uses[block["id"]] = i
            elif block.get("type") == "tool_result":
                assert block["tool_use_id"] in uses and uses[block["tool_use_id"]] < i
                results[block["tool_use_id"]] = json.dumps(block.get("content"))
    return uses, results


def _pairs_codex(items: list[dict]) -> tuple[dict[str, int], dict[str, str]]:
    calls, outputs = {}, {}
    for i, item in enumerate(items):
        if item.get("type") in ("function_call", "custom_tool_call"):
            calls[item["call_id"]] = i
        elif item.get("type") in ("function_call_output", "custom_tool_call_output"):
            assert item["call_id"] in calls and calls[item["call_id"]] < i
            outputs[item["call_id"]] = json.dumps(item.get("output"))
    return calls, outputs


@pytest.mark.parametrize("source, target", [("claude", "claude"), ("codex", "codex"), ("codex", "claude"),
                                            ("claude", "codex"), ("native", "claude"), ("native", "codex")])
def test_the_real_cli_resumes_an_exported_session(source, target, tmp_path):
    need_clis()
    store = tmp_path / "store"
    name = _source(store, source)
    want = _expected(store, name)
    with ModelServer({"steps": [{"text": ANSWER}]}, tmp_path / "requests.jsonl") as server:
        cli = AGENTS[target](tmp_path / "sandbox", server.url)
        code, out, err = run("export", "--store", str(store), name, "--to", target,
                             "--out", str(cli.home / f".{target}"), "--cwd", str(cli.proj), "--json")
        assert code == 0, err
        exported = json.loads(out)
        if target == "codex":  # the provider this Codex is configured with, never another
            meta = json.loads(Path(exported["path"]).read_text().splitlines()[0])
            assert meta["payload"]["model_provider"] == "scripted"
        resumed = run_in_group(cli.argv("next", resume=exported["conversation_id"]), cli.proj, cli.env(), 120)
        assert resumed.exit_code == 0, resumed.stderr.decode(errors="replace")[-3000:]
        assert ANSWER.encode() in resumed.stdout
        posts = [r for r in server.requests() if r["method"] == "POST"]
    assert posts, "the CLI sent no request"
    body = posts[0]["body"]
    history = body["messages"] if target == "claude" else body["input"]
    text = json.dumps(history)
    for kind, strings in want.items():
        for s in strings:
            assert json.dumps(s)[1:-1] in text, f"{kind}: {s!r} is not in the first request"
    calls, results = (_pairs_claude if target == "claude" else _pairs_codex)(history)
    assert set(calls) == set(results), f"calls without a result: {set(calls) - set(results)}"
    assert set(want["calls"]) <= set(calls)
    assert "[Tool call interrupted" not in text
    assert all(json.loads(r) != "aborted" for r in results.values())
    assert json.dumps("next") in text or "next" in text
