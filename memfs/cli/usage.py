"""``memfs usage``: tokens and cost over the store (SPEC §12), a table with totals or JSON."""

from __future__ import annotations

import argparse

from memfs.cli.common import Commands, _config, _existing, _json, _out, _table
from memfs.cli.sessions import _since


def cmd_usage(args: argparse.Namespace) -> int:
    from memfs.usage import report
    from memfs.usage.reporting import table_rows

    config = _config(args)
    doc = report(_existing(config.sessions_root()), args.by, args.since)
    if args.json:
        _json(doc)
        return 0
    if not doc["rows"]:
        _out("no usage recorded" + (f" since {doc['since']}" if doc["since"] else ""))
        return 0
    _table(table_rows(doc), right=set(range(1, 9)))
    table = doc["prices"]
    _out(f"\nprices: {table['name']} ({table['date']})"
         + (f", overridden for {', '.join(table['overrides'])}" if table["overrides"] else "") + "; days are UTC")
    reason = doc["totals"].get("cost_reason")
    if reason:
        _out(f"cost '-': {reason}")
    refused = doc["totals"].get("usage_error")
    if refused:
        _out(f"tokens '-': token counts refused: {refused}")
    return 0


def register(c: Commands) -> None:
    p = c.add("usage", cmd_usage, "tokens and cost per day, model, project, agent or session, with totals",
              json=True, epilog="Tokens: input (not from the cache), output (reasoning included), cache write, "
                                "cache read. Cost from the price table memfs ships, overridden per model by "
                                "[prices.\"<model>\"] in --config; a model without a price shows '-', never a guess.")
    p.add_argument("--by", choices=("day", "model", "project", "agent", "session"), default="day",
                   help="what one row is (default: day, UTC)")
    p.add_argument("--since", type=_since, metavar="WHEN",
                   help="only days since WHEN: a date (2026-01-31, UTC) or an age (7d, 12h)")
