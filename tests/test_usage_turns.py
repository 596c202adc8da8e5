"""SPEC §10 "Per-turn facts" and §12 "Cost as billed": each turn's close carries its agent, its
model and each request's model and tokens; usage prices and groups a turn by its own requests,
not by the session's latest model or first agent. Transcripts written here line by line in the
agents' shapes (those of the captured fixtures), every figure checked by hand against
memfs/usage/prices.toml."""

from __future__ import annotations

import json
from pathlib import Path

import memfs
import pytest
from memfs.errors import ValidationError
from memfs.events import parse_line
from memfs.ingest.importer import import_into
from memfs.usage import session_usage

from agent_helpers import cli, events_of

SID = "5b0e7a8c-1d2e-4f3a-9b8c-7d6e5f4a3b2c"  # the Claude conversation
THREAD = "019b2c3d-4e5f-7a6b-8c9d-0e1f2a3b4c5d"  # the Codex thread it continued in


def claude_turn(prompt: str, at: str, requests: list[tuple[str, dict]]) -> list[dict]:
    """A prompt and one assistant line per API request (``(model, usage)``), the last ending the turn."""
    lines = [{"type": "user", "sessionId": SID, "uuid": f"u-{at}", "timestamp": at, "cwd": "/p",
              "message": {"role": "user", "content": prompt}}]
    for n, (model, usage) in enumerate(requests):
        last = n == len(requests) - 1
        lines.append({"type": "assistant", "sessionId": SID, "uuid": f"a-{at}-{n}", "timestamp": at, "cwd": "/p",
                      "message": {"id": f"msg_{at[11:19].replace(':', '')}{n}", "model": model, "role": "assistant",
                                  "content": [{"type": "text", "text": f"answer {n} to {prompt}"}],
                                  "stop_reason": "end_turn" if last else "tool_use", "usage": usage}})
    return lines


def write(path: Path, lines: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def imported(store: Path, path: Path) -> dict:
    proc = cli("import", "--store", str(store), "--json", str(path))
    assert proc.returncode == 0, proc.stderr
    (item,) = json.loads(proc.stdout)
    with memfs.open_session(store, item["session"], read_only=True) as h:
        return session_usage(h)


def usage(store: Path, name: str) -> dict:
    with memfs.open_session(store, name, read_only=True) as h:
        return session_usage(h)


def test_each_turn_is_priced_and_grouped_by_its_own_model(tmp_path):
    """Turn 1 ran Opus 5.5, turn 2 Haiku 4.5: before, both were priced and grouped as Haiku (the
    session's latest model)."""
    lines = [*claude_turn("one", "2026-12-01T10:00:00.000Z",
                          [("claude-opus-5-5", {"input_tokens": 1000, "output_tokens": 100})]),
             *claude_turn("two", "2026-12-01T10:05:00.000Z",
                          [("claude-haiku-4-5", {"input_tokens": 2000, "cache_read_input_tokens": 10000,
                                                 "cache_creation_input_tokens": 500, "output_tokens": 200})])]
    doc = imported(tmp_path / "store", write(tmp_path / "t" / f"{SID}.jsonl", lines))
    one, two = doc["turns"]
    assert (one["model"], one["agent"], one["requests"]) == ("claude-opus-5-5", "claude", 1)
    assert (two["model"], two["agent"], two["requests"]) == ("claude-haiku-4-5", "claude", 1)
    # Opus 5.5 at $4 in / $20 out: 1000*4 + 100*20 = 6000 µ$ = $0.006
    assert one["cost_usd"] == 0.006
    # Haiku 4.5 at $1 in / $0.1 cache read / $1.25 cache write / $5 out:
    # 2000*1 + 10000*0.1 + 500*1.25 + 200*5 = 2000 + 1000 + 625 + 1000 = 4625 µ$
    assert two["cost_usd"] == 0.004625
    assert two["tokens"] == {"input": 2000, "cached_input": 10000, "cache_creation": 500, "output": 200,
                             "reasoning": 0, "total": 12700}
    assert [(d["model"], d["turns"], d["tokens"]["total"], d["cost_usd"]) for d in doc["days"]] == [
        ("claude-haiku-4-5", 1, 12700, 0.004625), ("claude-opus-5-5", 1, 1100, 0.006)]
    assert doc["total"]["cost_usd"] == 0.010625


def test_a_turn_of_two_models_counts_each_request_under_its_own(tmp_path):
    lines = claude_turn("mixed", "2026-12-01T11:00:00.000Z",
                        [("claude-opus-5-5", {"input_tokens": 1000, "output_tokens": 10}),
                         ("claude-haiku-4-5", {"input_tokens": 500, "output_tokens": 50})])
    path = write(tmp_path / "t" / f"{SID}.jsonl", lines)
    doc = imported(tmp_path / "store", path)
    [turn] = doc["turns"]
    close = [e for e in events_of(tmp_path / "store", SID) if e["type"] == "turn.completed"][0]
    assert close["requests"] == [
        {"model": "claude-opus-5-5", "at": "2026-12-01T11:00:00.000Z", "input": 1000, "output": 10},
        {"model": "claude-haiku-4-5", "at": "2026-12-01T11:00:00.000Z", "input": 500, "output": 50}]
    assert close["model"] == turn["model"] == "claude-haiku-4-5"  # the last request's
    # Opus: 1000*4 + 10*20 = 4200 µ$; Haiku: 500*1 + 50*5 = 750 µ$
    assert [(p["model"], p["requests"], p["tokens"]["total"], p["cost_usd"]) for p in turn["by_model"]] == [
        ("claude-opus-5-5", 1, 1010, 0.0042), ("claude-haiku-4-5", 1, 550, 0.00075)]
    assert turn["cost_usd"] == 0.00495 and turn["tokens"]["total"] == 1560
    # the turn counts once (under its close's model); each model's tokens and cost in its own row
    assert [(d["model"], d["turns"], d["tokens"]["total"], d["cost_usd"]) for d in doc["days"]] == [
        ("claude-haiku-4-5", 1, 550, 0.00075), ("claude-opus-5-5", 0, 1010, 0.0042)]


def test_long_context_tiers_apply_per_request(tmp_path):
    """Two Sonnet 4.5 requests of 150,000 prompt tokens each: the turn passes 200,000, no request
    does — before, the turn had no cost ("per-request sizes unknown"). A request over the tier
    alone has none, with its own reason (the shipped table has no long-context rates)."""
    lines = [*claude_turn("long", "2026-12-01T12:00:00.000Z", [
        ("claude-sonnet-4-5", {"input_tokens": 100, "cache_read_input_tokens": 149900, "output_tokens": 1000}),
        ("claude-sonnet-4-5", {"input_tokens": 200, "cache_read_input_tokens": 149800, "output_tokens": 2000})]),
        *claude_turn("longer", "2026-12-01T12:10:00.000Z", [
            ("claude-sonnet-4-5", {"input_tokens": 10, "cache_read_input_tokens": 210000, "output_tokens": 5})])]
    doc = imported(tmp_path / "store", write(tmp_path / "t" / f"{SID}.jsonl", lines))
    long, longer = doc["turns"]
    # $3 in / $0.3 cache read / $15 out: 100*3 + 149900*0.3 + 1000*15 = 300 + 44970 + 15000 = 60270 µ$;
    # 200*3 + 149800*0.3 + 2000*15 = 600 + 44940 + 30000 = 75540 µ$; together $0.13581
    assert long["cost_usd"] == 0.13581 and long["requests"] == 2
    assert longer["cost_usd"] is None
    assert longer["cost_reason"] == ("a request of 210010 input tokens passes claude-sonnet-4-5's long-context "
                                     "tier (200000): memfs-prices has no long-context rate")


def test_codex_turns_continued_in_a_claude_session_count_cached_tokens_once(tmp_path):
    """A Claude session resumed in Codex (``memfs resume --in codex`` brings the rollout back into
    it): Codex counts cache reads inside input_tokens; its turns are read as Codex's, not as the
    session's first agent's."""
    store = tmp_path / "store"
    imported(store, write(tmp_path / "t" / f"{SID}.jsonl", claude_turn(
        "one", "2026-12-01T10:00:00.000Z", [("claude-opus-5-5", {"input_tokens": 1000, "output_tokens": 100})])))
    at = "2026-12-01T13:00:0"

    def line(n: int, kind: str, payload: dict) -> dict:
        return {"timestamp": f"{at}{n}.000Z", "type": kind, "payload": payload}

    rollout = write(tmp_path / "codex" / f"rollout-2026-12-01T13-00-00-{THREAD}.jsonl", [
        line(0, "session_meta", {"id": THREAD, "timestamp": f"{at}0.000Z", "cwd": "/p", "originator": "codex_exec",
                                 "cli_version": "0.171.0", "source": "exec"}),
        line(1, "turn_context", {"cwd": "/p", "model": "gpt-5.5"}),
        line(1, "event_msg", {"type": "task_started", "turn_id": "t-2"}),
        line(1, "event_msg", {"type": "user_message", "message": "two", "images": []}),
        line(2, "event_msg", {"type": "token_count", "info": {"total_token_usage": {
            "input_tokens": 3000, "cached_input_tokens": 2500, "output_tokens": 40, "reasoning_output_tokens": 10}}}),
        line(3, "event_msg", {"type": "agent_message", "message": "done"}),
        line(4, "event_msg", {"type": "token_count", "info": {"total_token_usage": {
            "input_tokens": 8000, "cached_input_tokens": 6500, "output_tokens": 100, "reasoning_output_tokens": 30}}}),
        line(5, "event_msg", {"type": "task_complete", "turn_id": "t-2", "last_agent_message": "done"})])
    import_into(store, rollout, SID)
    doc = usage(store, SID)
    assert doc["agent"] == "claude"
    one, two = doc["turns"]
    assert (one["agent"], two["agent"], two["model"], two["requests"]) == ("claude", "codex", "gpt-5.5", 2)
    # 8000 input of which 6500 cache reads: 1500 uncached; output 100 (30 of them reasoning)
    assert two["tokens"] == {"input": 1500, "cached_input": 6500, "cache_creation": 0, "output": 100,
                             "reasoning": 30, "total": 8100}
    # gpt-5.5 at $5 in / $0.5 cache read / $30 out, per request: (500*5 + 2500*0.5 + 40*30) = 4950 µ$,
    # then the growth (1000*5 + 4000*0.5 + 60*30) = 8800 µ$; 13750 µ$ = 1500*5 + 6500*0.5 + 100*30
    assert two["cost_usd"] == 0.01375
    close = [e for e in events_of(store, SID) if e["type"] == "turn.completed"][-1]
    assert close["requests"] == [
        {"model": "gpt-5.5", "at": f"{at}2.000Z", "input": 500, "cached_input": 2500, "output": 40, "reasoning": 10},
        {"model": "gpt-5.5", "at": f"{at}4.000Z", "input": 1000, "cached_input": 4000, "output": 60, "reasoning": 20}]


def test_claude_cost_state_lines_are_the_agent_s_own_bill_per_turn(tmp_path):
    """Claude Code's ``cost-state`` (the conversation's running cost, written when a run's turn is
    done) keeps the agent's own cost with a transcript-only import: each turn gets the growth."""
    def cost_state(total: float) -> dict:
        return {"type": "cost-state", "sessionId": SID, "totalCostUSD": total, "modelUsage": {}}

    lines = [cost_state(0),  # (before the conversation has a turn: nothing)
             *claude_turn("one", "2026-12-01T10:00:00.000Z",
                          [("claude-opus-5-5", {"input_tokens": 1000, "output_tokens": 100})]),
             cost_state(0.006), cost_state(0.006),  # (the same total again: once)
             *claude_turn("two", "2026-12-01T10:05:00.000Z",
                          [("claude-haiku-4-5", {"input_tokens": 2000, "output_tokens": 200})]),
             cost_state(0.009)]
    store = tmp_path / "store"
    doc = imported(store, write(tmp_path / "t" / f"{SID}.jsonl", lines))
    # computed: Opus 1000*4 + 100*20 = 6000 µ$; Haiku 2000*1 + 200*5 = 3000 µ$ — the agent's bill agrees
    assert [(t["cost_usd"], t["agent_cost_usd"]) for t in doc["turns"]] == [(0.006, 0.006), (0.003, 0.003)]
    assert doc["total"]["agent_cost_usd"] == 0.009
    ends = [e for e in events_of(store, SID) if e["type"] == "thread.completed"]
    assert [(e["num_turns"], e["total_cost_usd"], e["subtype"]) for e in ends] == [(1, 0.006, "success"),
                                                                                  (2, 0.009, "success")]
    # a transcript of metadata lines only (cost-state included) is still not a session
    proc = cli("import", "--store", str(tmp_path / "other"), "--json",
               str(write(tmp_path / "m" / "6a1f0e2d-0000-4000-8000-000000000001.jsonl", [cost_state(0.5)])))
    assert proc.returncode == 0 and json.loads(proc.stdout)[0]["status"] == "empty"


def test_each_turn_s_model_survives_an_export_and_import_back(tmp_path):
    lines = [*claude_turn("one", "2026-12-01T10:00:00.000Z",
                          [("claude-opus-5-5", {"input_tokens": 1000, "output_tokens": 100})]),
             *claude_turn("two", "2026-12-01T10:05:00.000Z",
                          [("claude-haiku-4-5", {"input_tokens": 2000, "output_tokens": 200})])]
    imported(tmp_path / "a", write(tmp_path / "t" / f"{SID}.jsonl", lines))
    out = tmp_path / "out.jsonl"
    proc = cli("export", "--store", str(tmp_path / "a"), SID, "--to", "claude", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    doc = imported(tmp_path / "b", out)
    assert [(t["model"], t["cost_usd"]) for t in doc["turns"]] == [("claude-opus-5-5", 0.006),
                                                                   ("claude-haiku-4-5", 0.003)]


def test_the_close_s_turn_facts_are_checked_by_the_contract(tmp_path):
    """``agent``, ``model`` and ``requests`` on a close are optional, typed fields of the event
    contract (memfs.events): a malformed one refuses the close with its reason, never a turn
    closed on a wrong figure."""
    ok = {"type": "turn.completed", "usage": {"input_tokens": 3}, "agent": "claude", "model": "m",
          "requests": [{"model": "m", "at": "2026-12-01T10:00:00Z", "input": 3, "output": 0}]}
    parse_line(json.dumps(ok).encode())
    parse_line(json.dumps({"type": "turn.failed", "error": {"message": "x"}, "requests": []}).encode())
    for bad, reason in [({**ok, "model": 5}, 'turn.completed: "model" must be a string'),
                        ({**ok, "agent": None, "requests": {}}, 'turn.completed: "requests" must be a list of request objects'),
                        ({**ok, "requests": [{"input": -1}]}, '"requests[0].input" must be a non-negative integer'),
                        ({**ok, "requests": [{"output": True}]}, '"requests[0].output" must be a non-negative integer'),
                        ({"type": "turn.failed", "message": "x", "requests": ["m"]}, '"requests[0]" must be a request object')]:
        with pytest.raises(ValidationError) as exc:
            parse_line(json.dumps(bad).encode())
        assert reason in str(exc.value), str(exc.value)


FIXTURES = Path(__file__).parent / "fixtures" / "agents"


@pytest.mark.parametrize("agent, models, costs", [
    # Claude Code 2.1.332, `--model` per run: Opus 5.5 at $4/$20 (1000/20 + 1100/25 = $0.0093, as its
    # cost-state says), then Haiku 4.5 at $1/$5 (1200/30 = $0.00135; cost-state total $0.01065)
    ("claude", ("claude-opus-5-5", "claude-haiku-4-5"), (0.0093, 0.00135)),
    # Gemini CLI 0.61.0, `-m` per run: gemini-2.5-pro at $1.25/$10, then gemini-2.5-flash (not priced)
    ("gemini", ("gemini-2.5-pro", "gemini-2.5-flash"), (0.003075, None)),
    # Codex CLI 0.171.0, `codex exec -m gpt-5.5` then `codex exec resume -m gpt-5.4-mini`: the rollout's
    # turn_context names each turn's model; $5/$30 (1000/20 + 1100/25 = $0.01185), then $0.75/$4.5
    # (1200/30 = $0.001035)
    ("codex", ("gpt-5.5", "gpt-5.4-mini"), (0.01185, 0.001035)),
])
def test_a_model_switch_between_runs_comes_through_per_request(agent, models, costs, tmp_path):
    """tests/fixtures/agents/<agent>/model_switch (captured from the real CLIs): a first run of two
    requests (a shell command, then the answer) on one model, the conversation resumed on another.
    Each turn's close names its requests' models and usage; usage.json prices each turn on its
    own model and the session lists both."""
    src = FIXTURES / agent / "model_switch"
    sid = json.loads((src / "capture.json").read_text())["session_id"]
    store = tmp_path / "store"
    proc = cli("import", "--store", str(store), str(src / "home"))
    assert proc.returncode == 0, proc.stderr
    closes = [e for e in events_of(store, sid) if e["type"] == "turn.completed"]
    assert [[(r["model"], r["input"], r["output"]) for r in c["requests"]] for c in closes] == [
        [(models[0], 1000, 20), (models[0], 1100, 25)], [(models[1], 1200, 30)]]
    assert [c["model"] for c in closes] == list(models) and {c["agent"] for c in closes} == {agent}
    with memfs.open_session(store, sid, read_only=True) as h:
        doc = session_usage(h)
    assert [(t["model"], t["requests"], t["cost_usd"]) for t in doc["turns"]] == [
        (models[0], 2, costs[0]), (models[1], 1, costs[1])]
    assert sorted(d["model"] for d in doc["days"]) == sorted(models)  # a day row per model
    if agent == "claude":  # Claude's own bill, turn by turn (the growth of its cost-state total)
        assert [t["agent_cost_usd"] for t in doc["turns"]] == [0.0093, 0.00135]


def test_a_model_command_in_print_mode_lasts_only_its_own_run(tmp_path):
    """tests/fixtures/agents/claude/model_command (Claude Code 2.1.332): `/model claude-haiku-4-5`
    as the prompt of a resumed `-p` run is a local command ("Set model to `Haiku 4.5` for this
    session only") plus a one-token probe of that model which the transcript does not record and
    cost-state does not bill; the next resumed run is on the default model again. So the
    conversation is two turns, both on Opus 5.5, each priced as Claude billed it ($4/$20:
    1000/20 = $0.0044, 1200/30 = $0.0054), whether read from the transcript, the streams (the
    command's run, a `result` with `num_turns: 0`, is no turn) or both."""
    src = FIXTURES / "claude" / "model_command"
    sid = json.loads((src / "capture.json").read_text())["session_id"]
    streams = sorted(src.glob("stream*.jsonl"))
    for n, sources in enumerate(([src / "home"], streams, [*streams, src / "home"])):
        store = tmp_path / f"store{n}"
        proc = cli("import", "--store", str(store), *map(str, sources))
        assert proc.returncode == 0, proc.stderr
        with memfs.open_session(store, sid, read_only=True) as h:
            doc = session_usage(h)
        assert [(t["model"], t["tokens"]["input"], t["tokens"]["output"], t["cost_usd"], t["agent_cost_usd"])
                for t in doc["turns"]] == [("claude-opus-5-5", 1000, 20, 0.0044, 0.0044),
                                           ("claude-opus-5-5", 1200, 30, 0.0054, 0.0054)], sources
        if n == 0:  # (stream-json does not repeat the prompt; a later transcript notes it in about.json)
            starts = [e for e in events_of(store, sid) if e["type"] == "turn.started"]
            assert [e["context"].get("prompt") for e in starts] == ["What files are in the project?",
                                                                    "What is the project about?"]
