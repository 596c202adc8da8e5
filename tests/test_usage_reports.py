"""``memfs usage``'s reports (SPEC §12, issue 55): periods in a time zone, filters, ccusage's JSON
names, the priced part of a total with unpriced models, billing blocks and the active block.

Small native stores whose numbers are checked by hand in the comments (gpt-5: $1.25 input, $10
output per million tokens; acme-1 has no price).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from mounting import event
from test_usage import import_all, native, run


def turn(at: str, model: str, **usage: int) -> list[str]:
    return [event("turn.started"), event("turn.completed", model=model, completed_at=at, usage=usage)]


def store_a(tmp_path: Path) -> Path:
    store = tmp_path / "store"
    native(store, "a",
           *turn("2026-11-30T02:00:00Z", "gpt-5", input_tokens=1_000_000),  # $1.25; New York: Nov 29, 21:00
           *turn("2026-12-01T02:00:00Z", "gpt-5", input_tokens=400_000),  # $0.50; New York: Nov 30, 21:00
           *turn("2026-12-08T12:00:00Z", "acme-1", input_tokens=100, output_tokens=10),  # no price
           *turn("2026-12-08T13:00:00Z", "gpt-5", output_tokens=100_000))  # $1.00
    return store


def usage_json(store: Path, *args: str) -> dict:
    return json.loads(run("usage", "--store", str(store), *args, "--json"))


def test_days_weeks_and_months_in_a_zone_with_ccusage_names(tmp_path):
    store = store_a(tmp_path)
    utc = usage_json(store, "--tz", "UTC")
    assert [(d["date"], d["totalCost"]) for d in utc["daily"]] == [("2026-11-30", 1.25), ("2026-12-01", 0.5),
                                                                   ("2026-12-08", 1.0)]
    assert utc["daily"] == utc["rows"] and utc["timezone"] == "UTC"
    last = utc["daily"][-1]
    assert (last["inputTokens"], last["outputTokens"], last["cacheCreationTokens"], last["cacheReadTokens"],
            last["totalTokens"]) == (100, 100_010, 0, 0, 100_110)
    assert last["modelsUsed"] == ["acme-1", "gpt-5"]
    assert [(m["modelName"], m["cost"]) for m in last["modelBreakdowns"]] == [("gpt-5", 1.0), ("acme-1", 0.0)]
    # the priced part, marked, and the unpriced model named with its reason; never a guessed total
    assert last["cost_usd"] is None and last["priced_cost_usd"] == 1.0 and last["cost_complete"] is False
    assert "no price for model 'acme-1'" in last["unpriced"]["acme-1"]
    assert utc["totals"]["totalCost"] == 2.75 and utc["totals"]["totalTokens"] == 1_500_110
    new_york = usage_json(store, "--tz", "America/New_York")
    assert [(d["date"], d["totalCost"]) for d in new_york["daily"]] == [("2026-11-29", 1.25), ("2026-11-30", 0.5),
                                                                        ("2026-12-08", 1.0)]
    weeks = usage_json(store, "--tz", "America/New_York", "--by", "week")  # weeks start on Monday
    assert [(w["week"], w["totalCost"]) for w in weeks["weekly"]] == [("2026-11-23", 1.25), ("2026-11-30", 0.5),
                                                                      ("2026-12-07", 1.0)]
    months = usage_json(store, "--tz", "UTC", "--by", "month", "--order", "desc")
    assert [(m["month"], m["totalCost"]) for m in months["monthly"]] == [("2026-12", 1.5), ("2026-11", 1.25)]
    window = usage_json(store, "--tz", "UTC", "--since", "20261201", "--until", "2026-12-01")
    assert [d["date"] for d in window["daily"]] == ["2026-12-01"] and window["totals"]["totalCost"] == 0.5
    # the table: the priced part marked '*', each unpriced model named under it; --breakdown, --compact
    text = run("usage", "--store", str(store), "--tz", "UTC", "--breakdown")
    lines = text.splitlines()
    assert lines[0].split()[:2] == ["DAY", "MODELS"]
    row = next(line for line in lines if line.startswith("2026-12-08"))
    assert row.endswith("$1.00*")
    assert any(line.strip().startswith("└ acme-1") and line.endswith("-") for line in lines)
    assert any(line.strip().startswith("└ gpt-5") and line.endswith("$1.00") for line in lines)
    assert "cost '*': the priced part only; no price for acme-1: no price for model 'acme-1'" in text
    assert "times in UTC" in text
    compact = run("usage", "--store", str(store), "--tz", "UTC", "--compact").splitlines()
    assert compact[0].split() == ["DAY", "INPUT", "OUTPUT", "COST"]


def test_filters_by_agent_project_and_the_last_periods(tmp_path):
    store = store_a(tmp_path)
    import_all(store, "claude")  # two turns on 2026-12-03, $0.0147 (tests/test_usage.py), project .../proj
    assert usage_json(store, "--agent", "claude")["totals"]["totalCost"] == 0.0147
    assert usage_json(store, "--project", "proj")["totals"]["totalCost"] == 0.0147
    assert usage_json(store, "--agent", "unknown")["totals"]["totalTokens"] == 1_500_110
    sessions = usage_json(store, "--by", "session", "--agent", "claude")["sessions"]
    assert [(s["sessionId"], s["lastActivity"]) for s in sessions] == [("78127aec-e908-4904-8d47-2d86e43e50f3",
                                                                       "2026-12-03")]
    now = time.time()
    stamp = lambda at: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))  # noqa: E731
    native(store, "recent", *turn(stamp(now), "gpt-5", input_tokens=8000),  # $0.01, today
           *turn(stamp(now - 40 * 86400), "gpt-5", input_tokens=16000))  # $0.02, 40 days ago
    today = usage_json(store, "--tz", "UTC", "--last", "1", "--agent", "unknown")
    assert today["totals"]["totalCost"] == 0.01 and [d["date"] for d in today["daily"]] == [stamp(now)[:10]]
    assert "--last counts periods" in run_fails(store, "--by", "model", "--last", "2")
    assert "--tz: unknown time zone 'Mars/Base'" in run_fails(store, "--tz", "Mars/Base")
    assert "--since: 'yesterday' is neither a date" in run_fails(store, "--since", "yesterday")
    assert "--token-limit must be a positive number" in run_fails(store, "--by", "block", "--token-limit", "lots")
    assert "--token-limit is for billing blocks" in run_fails(store, "--token-limit", "max")


def run_fails(store: Path, *args: str) -> str:
    from agent_helpers import cli

    proc = cli("usage", "--store", str(store), *args)
    assert proc.returncode != 0
    return proc.stderr


def test_billing_blocks_and_gaps_as_ccusage_computes_them(tmp_path):
    store = tmp_path / "store"
    native(store, "b",
           *turn("2026-12-01T10:20:00Z", "gpt-5", input_tokens=100_000),  # block 10:00-15:00
           *turn("2026-12-01T12:00:00Z", "gpt-5", input_tokens=100_000),
           *turn("2026-12-01T15:30:00Z", "gpt-5", input_tokens=200_000),  # 5.5 h after 10:00: block 15:00
           *turn("2026-12-02T03:00:00Z", "gpt-5", input_tokens=400_000))  # 11.5 h after the last: a gap, then 03:00
    doc = usage_json(store, "--by", "block", "--tz", "UTC", "--token-limit", "max")
    shape = [(b["startTime"], b["endTime"], b["isGap"], b["entries"], b["totalTokens"], b["costUSD"])
             for b in doc["blocks"]]
    assert shape == [("2026-12-01T10:00:00+00:00", "2026-12-01T15:00:00+00:00", False, 2, 200_000, 0.25),
                     ("2026-12-01T15:00:00+00:00", "2026-12-01T20:00:00+00:00", False, 1, 200_000, 0.25),
                     ("2026-12-01T20:30:00+00:00", "2026-12-02T03:00:00+00:00", True, 0, 0, 0.0),
                     ("2026-12-02T03:00:00+00:00", "2026-12-02T08:00:00+00:00", False, 1, 400_000, 0.5)]
    assert doc["tokenLimit"] == 400_000 and [b.get("percentUsed") for b in doc["blocks"]] == [50.0, 50.0, None, 100.0]
    assert doc["totals"]["totalTokens"] == 800_000 and doc["totals"]["totalCost"] == 1.0
    assert not any(b["isActive"] for b in doc["blocks"])
    last = usage_json(store, "--by", "block", "--tz", "UTC", "--last", "2", "--order", "desc")["blocks"]
    assert [(b["startTime"][11:16], b["isGap"]) for b in last] == [("03:00", False), ("20:30", True), ("15:00", False)]
    text = run("usage", "--store", str(store), "--by", "block", "--tz", "UTC").splitlines()
    assert [line.split()[:3] for line in text[1:5]] == [["2026-12-01", "10:00", "done"], ["2026-12-01", "15:00", "done"],
                                                         ["2026-12-01", "20:30", "gap"], ["2026-12-02", "03:00", "done"]]


def test_the_active_block_its_burn_rate_and_projection(tmp_path):
    store = tmp_path / "store"
    now = int(time.time())
    stamp = lambda at: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))  # noqa: E731
    native(store, "live", *turn(stamp(now - 50 * 60), "gpt-5", input_tokens=100_000),  # $0.125
           *turn(stamp(now - 10 * 60), "gpt-5", input_tokens=300_000))  # $0.375, 40 minutes later
    doc = usage_json(store, "--active")
    (block,) = doc["blocks"]
    assert block["isActive"] and block["totalTokens"] == 400_000 and block["costUSD"] == 0.5
    assert block["burnRate"] == {"tokensPerMinute": 10_000.0, "costPerHour": 0.75}  # 400k / 40 min; $0.5 / 40 min
    start = now - 50 * 60 - (now - 50 * 60) % 3600  # the hour floor of the first turn
    left = (start + 5 * 3600 - now) / 60  # minutes (the report ran a little after `now`)
    assert abs(block["remainingMinutes"] - left) <= 2
    projected = block["projection"]["totalTokens"]
    assert abs(projected - (400_000 + 10_000 * left)) <= 10_000 * 2
    text = run("usage", "--store", str(store), "--active")
    assert "burn rate: 10,000 tokens/min, $0.75/hour" in text and "time left:" in text


def test_claude_s_own_cost_shown_where_it_differs_from_the_computed_one(tmp_path):
    """claude/resume_two_turns: Claude Code's own bill (cost-state, $0.0147 for 3300 input and 75
    output tokens of claude-opus-5-5) equals memfs's at the shipped $4/$20 per million: no marker.
    With the model priced at $5/$25 in the config, memfs computes 3300*5+75*25 = $0.018375 — 25%
    off Claude's bill, so the row and the total say what the agent says."""
    store = tmp_path / "store"
    import_all(store, "claude")
    same = usage_json(store, "--by", "session")
    assert same["totals"]["cost_usd"] == 0.0147 and same["totals"]["agent_cost_usd"] == 0.0147
    assert same["totals"]["agent_cost_differs"] is False and same["totals"]["agent_cost_turns"] == 2
    assert "agent says" not in run("usage", "--store", str(store), "--by", "session")
    config = tmp_path / "memfs.toml"
    config.write_text('[prices."claude-opus-5-5"]\ninput = 5.0\noutput = 25.0\n')
    off = usage_json(store, "--by", "session", "--config", str(config))
    [row] = off["rows"]
    for part in (row, off["totals"]):
        assert part["cost_usd"] == 0.018375 and part["agent_cost_usd"] == 0.0147 and part["agent_cost_differs"] is True
    table = run("usage", "--store", str(store), "--by", "session", "--config", str(config))
    assert table.count("$0.02 (agent says $0.01)") == 2, table  # the session's row and TOTAL, in cents
    assert "'agent says $x': the agent's own bill" in table
    blocks = usage_json(store, "--by", "block", "--config", str(config))
    assert blocks["totals"]["agent_cost_usd"] == 0.0147 and blocks["totals"]["agent_cost_differs"] is True
    # a session without an agent's bill has no such field
    native(store, "n", *turn("2026-12-01T02:00:00Z", "gpt-5", input_tokens=1000))
    only_native = usage_json(store, "--by", "session", "--agent", "vtcode")
    assert "agent_cost_usd" not in only_native["totals"]
