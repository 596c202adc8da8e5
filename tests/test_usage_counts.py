"""Hostile usage inputs (SPEC §12): a token count that is not an integer in 0..2^53 is refused with
its reason, never read as 0 tokens and $0.00; a price that would make a cost non-finite is refused
when the config loads; a partial ``[prices."<model>"]`` keeps its model's shipped rates.

Every case goes through a real log (``memfs import`` of a Claude stream, ``memfs append``) and is
read back as a user reads it: ``derived/usage.json``, ``derived/trajectory.jsonl``, ``memfs usage``
and ``memfs sessions``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import memfs
import pytest
from memfs.usage import session_usage

from agent_helpers import MEMFS, cli, view
from mounting import event
from test_usage import native, run

SID = "0c0ffee0-0000-4000-8000-000000000052"


def usage(store: Path, session: str) -> dict:
    with memfs.open_session(store, session, read_only=True) as h:
        return session_usage(h)


def claude_stream(path: Path, raw_input_tokens: str) -> Path:
    """A Claude ``stream-json`` run of one turn whose result's usage says ``input_tokens`` is
    ``raw_input_tokens`` (JSON text, written as is)."""
    lines = [
        json.dumps({"type": "system", "subtype": "init", "session_id": SID, "model": "claude-opus-4-1", "cwd": "/p"}),
        json.dumps({"type": "assistant", "session_id": SID, "timestamp": "2026-12-03T07:58:55Z",
                    "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-opus-4-1",
                                "content": [{"type": "text", "text": "hi"}],
                                "usage": {"input_tokens": 10, "output_tokens": 1}}}),
        '{"type":"result","subtype":"success","is_error":false,"session_id":"%s","num_turns":1,"result":"hi",'
        '"usage":{"input_tokens":%s,"output_tokens":5}}' % (SID, raw_input_tokens),
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("raw, shown", [
    ("-1e9", "-1000000000"),
    ("1e308", "1e+308"),
    ('"1000"', '"1000"'),
    (str(2**70), "1.1805916207174113e+21"),  # a JSON reader keeps it as a float: not an integer either
    ("true", "true"),
])
def test_a_hostile_count_is_refused_with_its_reason_never_read_as_zero(tmp_path, raw, shown):
    store = tmp_path / "store"
    run("import", "--store", str(store), str(claude_stream(tmp_path / "stream.jsonl", raw)))
    reason = f"input_tokens: {shown} is not an integer in 0..2^53"
    doc = usage(store, SID)
    (turn,) = doc["turns"]
    assert turn["usage_error"] == reason
    assert turn["cost_usd"] is None and reason in turn["cost_reason"]
    assert turn["tokens"]["output"] == 5  # the counts that were valid are kept
    assert doc["total"]["cost_usd"] is None and doc["total"]["usage_error"].startswith(reason)
    assert doc["days"][0]["usage_error"] == reason
    stored = json.loads(view(store, SID, "trajectory.jsonl").splitlines()[0])
    assert stored["usage_error"] == reason
    # memfs usage: no token sum and no cost for the row, the reason said under the table
    text = run("usage", "--store", str(store))
    total = next(line for line in text.splitlines() if line.startswith("TOTAL")).split()
    assert total[-6:] == ["-"] * 6, text  # five token columns and the cost
    assert f"tokens '-': token counts refused: {reason}" in text and "$0.00" not in text
    report = json.loads(run("usage", "--store", str(store), "--json"))
    assert report["totals"]["cost_usd"] is None and reason in report["totals"]["usage_error"]
    (listed,) = json.loads(run("sessions", "--store", str(store), "--json"))
    assert listed["tokens"] is None and listed["cost_usd"] is None and reason in listed["usage_error"]
    # the same count written straight into a log is refused at the door, with its reason
    proc = subprocess.run([*MEMFS, "append", "--store", str(tmp_path / "native"), "n", "-"], capture_output=True,
                          text=True, timeout=60,
                          input='{"type":"turn.started"}\n{"type":"turn.completed","usage":{"input_tokens":%s}}\n' % raw)
    assert proc.returncode == 1 and '"usage.input_tokens" must be a non-negative integer' in proc.stderr


def test_counts_past_2_53_and_unchecked_counters_of_a_native_log_are_refused(tmp_path):
    store = tmp_path / "store"
    native(store, "n",
           event("turn.started"),  # 2^53 is a count; 2^53 + 1 is not (an integer the log accepts)
           event("turn.completed", model="gpt-5", usage={"input_tokens": 2**53, "output_tokens": 2**53 + 1}),
           event("turn.started"),  # the fold's extra counters go through the same validator
           event("turn.completed", model="gpt-5", usage={"input_tokens": 100, "reasoning_output_tokens": -5}),
           event("turn.started"),
           event("turn.completed", model="gpt-5", usage={"input_tokens": 1000, "output_tokens": 10}),
           event("turn.started"),  # a running total with a refused count (this turn's own usage is valid)
           event("turn.completed", model="gpt-5", usage={"input_tokens": 10},
                 thread_usage={"input_tokens": "lots"}),
           event("turn.started"),  # … then the next turn's own, its growth since, is unknown
           event("turn.completed", model="gpt-5", usage={"input_tokens": 40}, thread_usage={"input_tokens": 50}))
    doc = usage(store, "n")
    errors = [t.get("usage_error") for t in doc["turns"]]
    assert errors == [f"output_tokens: {2**53 + 1} is not an integer in 0..2^53",
                      "reasoning_output_tokens: -5 is not an integer in 0..2^53", None, None,
                      'input_tokens: "lots" is not an integer in 0..2^53']
    assert doc["turns"][2]["cost_usd"] == 0.00135  # 1000*1.25 + 10*10 per million: a valid turn keeps its cost
    assert doc["total"]["usage_error"] == f"{errors[0]} (3 turns with refused token counts)"
    lines = [json.loads(line) for line in view(store, "n", "trajectory.jsonl").splitlines()]
    assert [line.get("usage_error") for line in lines] == errors
    assert lines[0]["usage"]["input_tokens"] == 2**53 and lines[0]["usage"]["output_tokens"] == 0
    text = run("sessions", "--store", str(store))
    assert text.splitlines()[1].split()[-3:] == ["-", "-", "n"]  # TOKENS and COST: never 0 / $0.00


@pytest.mark.parametrize("value, reason", [
    ("1e308", "1e+308 is too large"),
    ("1e293", "1e+293 is too large"),  # 2^53 tokens at this rate: past the largest float
    ("inf", "inf is too large"),
    ("-1", "must be a non-negative number"),
    ("nan", "must be a non-negative number"),
    ('"5"', "must be a number"),
])
def test_a_price_that_makes_a_cost_non_finite_is_refused_when_the_config_loads(tmp_path, value, reason):
    store = tmp_path / "store"
    store.mkdir()
    config = tmp_path / "memfs.toml"
    config.write_text(f'[prices."m"]\ninput = {value}\n')
    proc = cli("usage", "--store", str(store), "--config", str(config))
    assert proc.returncode == 1 and reason in proc.stderr and "prices.'m'.input" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_partial_dated_override_keeps_the_shipped_rates_of_its_model(tmp_path):
    store = tmp_path / "store"
    tokens = {"input_tokens": 1_000_000, "cached_input_tokens": 200_000, "cache_creation_tokens": 100_000,
              "output_tokens": 10_000}  # a native log counts cached and written tokens inside input
    for name, model in (("dated", "claude-opus-4-1-20250805"), ("at", "claude-opus-4-1@20250805"),
                        ("plain", "claude-opus-4-1")):
        native(store, name, event("turn.started"), event("turn.completed", model=model, usage=tokens))
    config = tmp_path / "memfs.toml"
    config.write_text('[prices."claude-opus-4-1-20250805"]\ninput = 20.0\noutput = 80.0\n'
                      '[prices."claude-opus-4-1@20250805"]\noutput = 100.0\n')
    doc = json.loads(run("usage", "--store", str(store), "--config", str(config), "--by", "session", "--json"))
    cost = {r["session"]: r["cost_usd"] for r in doc["rows"]}
    # 700k fresh input, 200k cache reads, 100k cache writes, 10k output; the shipped claude-opus-4-1:
    # $15 input, $1.50 cache read, $18.75 cache write, $75 output per million
    assert cost["dated"] == round(0.7 * 20 + 0.2 * 1.5 + 0.1 * 18.75 + 0.01 * 80, 6)  # 16.975
    assert cost["at"] == round(0.7 * 15 + 0.2 * 1.5 + 0.1 * 18.75 + 0.01 * 100, 6)  # 13.675
    assert cost["plain"] == round(0.7 * 15 + 0.2 * 1.5 + 0.1 * 18.75 + 0.01 * 75, 6)  # 13.425: not overridden
    assert doc["totals"]["cost_usd"] == round(16.975 + 13.675 + 13.425, 6)


@pytest.mark.parametrize("to", ["claude", "codex"])
def test_a_refused_count_stays_refused_through_an_export_and_a_re_import(tmp_path, to):
    store = tmp_path / "store"
    native(store, "x", event("turn.started"),
           event("item.completed", item={"id": "m1", "type": "agent_message", "text": "one"}),
           event("turn.completed", model="gpt-5", usage={"input_tokens": 100, "output_tokens": 2**53 + 1}),
           event("turn.started"),
           event("item.completed", item={"id": "m2", "type": "agent_message", "text": "two"}),
           event("turn.completed", model="gpt-5", usage={"input_tokens": 50, "output_tokens": 5}))
    out = tmp_path / f"{to}.jsonl"
    run("export", "x", "--store", str(store), "--to", to, "--out", str(out))
    again = tmp_path / "again"
    run("import", "--store", str(again), str(out))
    (listed,) = json.loads(run("sessions", "--store", str(again), "--json"))
    doc = usage(again, listed["name"])
    reason = f"output_tokens: {2**53 + 1} is not an integer in 0..2^53"
    assert [t.get("usage_error") for t in doc["turns"]] == [reason, None]  # never exported as 0 tokens
    assert [t["tokens"]["input"] for t in doc["turns"]] == [100, 50]
