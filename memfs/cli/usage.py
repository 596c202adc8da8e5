"""``memfs usage``: tokens and cost over the store (SPEC §12), a table with totals or JSON."""

from __future__ import annotations

import argparse

from memfs.cli.common import Commands, _config, _existing, _json, _out, _table
from memfs.errors import MemfsError

BY = ("day", "week", "month", "session", "model", "project", "agent", "block")


def _when(text: str | None, tz, end: bool):
    """``--since``/``--until``: a date (its start in the zone; ``--until``: the day after's
    start), else an instant or an age (:func:`memfs.store.listing.parse_since`)."""
    if text is None:
        return None
    from memfs.store.listing import parse_since
    from memfs.usage.periods import day_start

    at = day_start(text, tz, next_day=end)
    if at is not None:
        return at
    try:
        return parse_since(text)
    except ValueError as exc:
        raise MemfsError(f"--{'until' if end else 'since'}: {exc}") from None


def cmd_usage(args: argparse.Namespace) -> int:
    from pathlib import Path

    from memfs.usage import blocks, periods, query, text
    from memfs.usage.reporting import contributions

    config = _config(args)
    try:
        tz = periods.zone(args.tz)
    except ValueError as exc:
        raise MemfsError(str(exc)) from None
    if args.last is not None and args.by not in ("day", "week", "month", "block"):
        raise MemfsError("--last counts periods: use it with --by day, week, month or block")
    if args.active:
        args.by = "block"
    if args.token_limit is not None and args.by != "block":
        raise MemfsError("--token-limit is for billing blocks: use it with --by block or --active")
    opts = periods.Options(by=args.by, tz=tz, since=_when(args.since, tz, False), until=_when(args.until, tz, True),
                           last=args.last, project=args.project, agent=args.agent, order=args.order)
    root = Path(_existing(config.sessions_root()))
    if args.by == "block":
        try:
            doc = blocks.report(contributions(root).values(), opts, active_only=args.active, limit=args.token_limit)
        except ValueError as exc:
            raise MemfsError(str(exc)) from None
    else:
        doc = query.report(root, opts)
    if args.json:
        _json(doc)
        return 0
    listed = doc["rows"] if "rows" in doc else doc["blocks"]
    if not listed:
        _out("no active block" if args.active else "no usage recorded" + (
            f" since {doc['since']}" if doc.get("since") else ""))
        return 0
    cells, right = text.rows(doc, compact=args.compact, breakdown=args.breakdown)
    _table(cells, right=right)
    if args.active:
        for line in _active_lines(listed[-1]):
            _out(line)
    _out("")
    for line in text.notes(doc):
        _out(line)
    return 0


def _active_lines(row: dict) -> list[str]:
    from memfs.store.listing import usd

    out = [f"time left: {row['remainingMinutes'] // 60}h {row['remainingMinutes'] % 60:02d}m"]
    rate = row.get("burnRate")
    if rate:
        proj = row["projection"]
        out.append(f"burn rate: {rate['tokensPerMinute']:,.0f} tokens/min, {usd(rate['costPerHour'])}/hour")
        out.append(f"projected at the block's end: {proj['totalTokens']:,} tokens, {usd(proj['totalCost'])}")
    if row.get("percentUsed") is not None:
        out.append(f"token limit: {row['percentUsed']}% used")
    return out


def register(c: Commands) -> None:
    p = c.add("usage", cmd_usage, "tokens and cost per day, week, month, session, model, project, agent or "
              "billing block, with totals",
              json=True, epilog="Tokens: input (not from the cache), output (reasoning included), cache write, "
                                "cache read. Cost from the price table memfs ships, overridden per model by "
                                "[prices.\"<model>\"] in --config; a model without a price is never guessed: its "
                                "row's cost is '-', a total with priced and unpriced turns shows the priced part "
                                "marked '*'. JSON: ccusage's field names beside memfs's.")
    p.add_argument("--by", choices=BY, default="day", help="what one row is (default: day)")
    p.add_argument("--since", metavar="WHEN",
                   help="only turns since WHEN: a date (2026-01-31 or 20260131, in the zone), an instant or an age "
                        "(7d, 12h)")
    p.add_argument("--until", metavar="WHEN", help="only turns before WHEN (a date: up to its end)")
    p.add_argument("--last", type=int, metavar="N", help="only the last N periods (days, weeks, months, blocks)")
    p.add_argument("--tz", metavar="ZONE", help="the time zone of days, weeks and months (default: the local zone)")
    p.add_argument("--project", help="only sessions of this project (its path or its last component)")
    p.add_argument("--agent", help="only sessions of this agent")
    p.add_argument("--breakdown", action="store_true", help="one line per model under each row")
    p.add_argument("--compact", action="store_true", help="fewer columns, for a narrow terminal")
    p.add_argument("--order", choices=("asc", "desc"),
                   help="periods oldest first (asc, the default) or newest first; other rows most tokens first")
    p.add_argument("--active", action="store_true", help="the active billing block, its burn rate and projection")
    p.add_argument("--token-limit", metavar="N|max",
                   help="billing blocks: each block's share of N tokens (max: the most a finished block used)")
