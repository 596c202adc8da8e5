"""What the export tests share (tests/test_export.py, tests/test_export_agents.py): importing
and exporting through the command line in-process, the structural checks both CLIs need of an
exported file, and the comparison of two captures of a conversation."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path
from typing import Any

import memfs
import orjson
from memfs.agents.common import fold_text
from memfs.cli import main
from memfs.export.conversation import Conversation, Turn, read_conversation
from memfs.store import about

FIXTURES = Path(__file__).parent / "fixtures" / "agents"
FILLER = "[Tool call interrupted"  # Claude Code's patch for a call without a result; Codex's is the output "aborted"
NATIVE = Path(__file__).parent / "fixtures" / "export" / "native.jsonl"


def run(*args: str) -> tuple[int, str, str]:
    """``memfs ARGS`` in this process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def sessions(store: Path) -> list[str]:
    return sorted(p.name for p in store.iterdir() if (p / "events.jsonl").exists())


def conversation(store: Path, name: str) -> Conversation:
    with memfs.open_session(store, name, read_only=True) as h:
        return read_conversation(name, [line for _, line in h.iter_lines()], about.read(store / name))


def import_files(store: Path, *paths: Path) -> list[dict]:
    code, out, err = run("import", "--store", str(store), "--json", *map(str, paths))
    assert code == 0, err
    return json.loads(out)


def export(store: Path, name: str, to: str, out: Path, *extra: str) -> dict:
    code, text, err = run("export", "--store", str(store), name, "--to", to, "--out", str(out), "--json", *extra)
    assert code == 0, err
    return json.loads(text)


# --- what the CLIs need of the file --------------------------------------------------------


def check_claude_transcript(path: Path) -> list[dict]:
    """Every line parses and carries the fields Claude Code resumes from; the parentUuid chain
    runs unbroken from the last line to the first; every tool_use has exactly one tool_result,
    in the line right after its message's; message ids are unique; no CLI filler."""
    text = path.read_text()
    lines = [json.loads(line) for line in text.splitlines()]
    assert lines, path
    sid = path.stem
    parent = None
    for line in lines:
        assert line["sessionId"] == sid and line["uuid"] and line["timestamp"] and line["cwd"], line
        assert line["parentUuid"] == parent, "broken parentUuid chain"
        parent = line["uuid"]
    mids = [line["message"]["id"] for line in lines if line["type"] == "assistant"]
    assert len(mids) == len(set(mids)), "assistant message ids repeat"
    uses: dict[str, int] = {}
    results: dict[str, int] = {}
    for i, line in enumerate(lines):
        content = line.get("message", {}).get("content")
        for block in content if isinstance(content, list) else []:
            if block.get("type") == "tool_use":
                assert block["id"] not in uses and re.fullmatch(r"[A-Za-z0-9_-]+", block["id"]), block
                uses[block["id"]] = i
            elif block.get("type") == "tool_result":
                tid = block["tool_use_id"]
                assert tid in uses and tid not in results, f"tool_result {tid} without its call"
                results[tid] = i
                call = lines[uses[tid]]
                assert call["type"] == "assistant" and line["parentUuid"] == call["uuid"], "result not after its call"
    assert set(uses) == set(results), f"calls without a result: {set(uses) - set(results)}"
    assert FILLER not in text
    return lines


def check_codex_rollout(path: Path, provider: str | None) -> list[dict]:
    """Every line is ``{timestamp, type, payload}``; ``session_meta`` first, its id the file
    name's; the provider is the one configured (or none); every function call has exactly one
    output after it and every output a call; no CLI filler."""
    text = path.read_text()
    lines = [json.loads(line) for line in text.splitlines()]
    for line in lines:
        assert set(line) == {"timestamp", "type", "payload"} and line["timestamp"], line
    meta = lines[0]
    assert meta["type"] == "session_meta" and path.name.endswith(f"-{meta['payload']['id']}.jsonl")
    assert meta["payload"].get("model_provider") == provider
    calls: set[str] = set()
    outputs: set[str] = set()
    for line in lines:
        p = line["payload"]
        if line["type"] != "response_item":
            continue
        if p["type"] in ("function_call", "custom_tool_call"):
            assert p["call_id"] not in calls
            calls.add(p["call_id"])
        elif p["type"] in ("function_call_output", "custom_tool_call_output"):
            assert p["call_id"] in calls and p["call_id"] not in outputs, p
            assert p["output"] != "aborted"
            outputs.add(p["call_id"])
    assert calls == outputs
    assert FILLER not in text
    return lines


# --- comparing two captures of one conversation -------------------------------------------

CODEX_USAGE = ("input_tokens", "cached_input_tokens", "output_tokens")
_EXIT = re.compile(r"\AExit code \d+\n?")


def _output(text: Any) -> str:
    return _EXIT.sub("", text if isinstance(text, str) else "").rstrip("\n")


def _result_text(item: dict) -> Any:
    error = item.get("error")
    if isinstance(error, dict):
        return ("error", error.get("message"))
    result = item.get("result")
    if isinstance(result, dict):
        return "\n".join(b.get("text", "") for b in result.get("content") or [] if isinstance(b, dict))
    return None


def norm_item(item: dict, target: str | None) -> tuple | None:
    """What of an item must survive an export to ``target`` (None: as it is, same agent);
    what Codex folds into text compares as that text (Claude's import restores what its export
    folded: reasoning, plans, decisions, harness events come back as they were)."""
    kind = item.get("type")
    if target == "codex" and kind in ("harness", "plan", "decision", "tool_output"):
        return ("message", fold_text(item))
    if kind == "agent_message":
        return ("message", item.get("text"))
    if kind in ("reasoning", "user_message"):
        return (kind, item.get("text"))
    if kind == "command_execution":
        return ("command", item.get("command"), item.get("status"), item.get("exit_code"),
                _output(item.get("aggregated_output")))
    if kind == "mcp_tool_call":
        return ("mcp", item.get("server"), item.get("tool"), item.get("arguments"), _result_text(item))
    if kind == "file_change":
        return ("files", sorted((c["path"], c["kind"]) for c in item.get("changes") or []), item.get("status"))
    if kind == "todo_list":
        return ("todo", [(t.get("text"), t.get("completed")) for t in item.get("items") or []])
    if kind == "web_search":
        return ("search", item.get("query"))
    if kind == "tool_invocation":
        paired = item.get("result") if isinstance(item.get("result"), dict) else None
        output = (paired or item).get("output")
        args = item.get("arguments")
        return ("tool", item.get("tool_name"), args if args is not None else {}, _output(output))
    if kind == "error":
        return ("error", item.get("message"))
    return ("message", fold_text(item))


def norm_turn(turn: Turn, target: str | None, usage_keys: tuple[str, ...] | None = None) -> dict:
    items = [norm_item(i, target) for i in turn.items]
    if target is not None:  # a Codex turn has one to-do list (its last state); Claude one per change
        todos = [i for i in items if i and i[0] == "todo"]
        items = [i for i in items if i and i[0] != "todo"] + todos[-1:]
    # usage in memfs's disjoint form (each agent counts the cache its own way); Codex has no field for
    # cache writes (usage_keys: a Codex target), which its input then holds
    usage = turn.disjoint_usage()
    if usage_keys is not None:
        usage["input_tokens"] += usage.pop("cache_creation_tokens")
    usage = {k: v for k, v in usage.items() if v and (usage_keys is None or k in usage_keys)}
    return {"prompt": turn.prompt, "outcome": turn.outcome, "failure": turn.failure, "usage": usage, "items": items}


def same_agent_items(turn: Turn) -> list[dict]:
    """A turn's items as the agent's own import recorded them (ids included)."""
    return [orjson.loads(orjson.dumps(i)) for i in turn.items]
