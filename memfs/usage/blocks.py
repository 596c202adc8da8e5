"""Billing blocks (SPEC §12), as ccusage computes them: ``memfs usage --by block``, ``--active``.

Where blocks start and end: :mod:`memfs.usage.windows`.

Limit written down: memfs dates turns, not the requests inside them (:class:`memfs.usage.
reporting.Use`: a turn's end, else its start), so a turn's tokens count at that instant; a long
turn that spans a block's boundary counts whole in the block its end falls in.

An active block has a burn rate — tokens per minute and cost per hour over the time from its
first to its last turn — and a projection to its end at that rate. ``--token-limit N`` (or
``max``: the most tokens any finished block used) adds each block's share of the limit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import tzinfo

from memfs.usage import prices, windows
from memfs.usage.periods import Options, Sum, local, selected, zone_name
from memfs.usage.reporting import _KEYS
from memfs.usage.windows import BLOCK

_TOTAL = len(_KEYS) - 1


@dataclass
class Block:
    start: float
    first: float = 0.0  # its first turn's time
    last: float = 0.0  # its last turn's time (a gap: the next block's start)
    gap: bool = False
    sums: Sum = field(default_factory=Sum)

    @property
    def end(self) -> float:
        return self.start + BLOCK

    def active(self, now: float) -> bool:
        return not self.gap and windows.active(self.start, self.last, now)


def blocks(contribs, opts: Options) -> list[Block]:
    """The blocks of the turns ``opts`` lets through (its period filters apply to turns), in
    time order, gaps included (:func:`memfs.usage.windows.split`)."""
    turns = sorted(((use.at, c.session, use) for c, use in selected(contribs, Options(
        by="day", tz=opts.tz, since=opts.since, until=opts.until, project=opts.project, agent=opts.agent))),
        key=lambda t: t[0])
    out: list[Block] = []
    for start, first, stop, gap in windows.split([t[0] for t in turns]):
        if gap:
            out.append(Block(start, first=start, last=turns[first][0] - turns[first][0] % 3600, gap=True))
            continue
        block = Block(start, first=turns[first][0], last=turns[stop - 1][0])
        for _, session, use in turns[first:stop]:
            block.sums.add(session, use)
        out.append(block)
    return out


def burn(block: Block, now: float) -> dict | None:
    """Tokens per minute and cost per hour from the block's first turn to its last, and the
    projection to its end at that rate (None: one instant, no rate)."""
    minutes = (block.last - block.first) / 60
    if minutes <= 0:
        return None
    tokens, usd = block.sums.tokens[_TOTAL], block.sums.usd
    per_minute = tokens / minutes
    per_hour = usd / minutes * 60
    remaining = max(0.0, (block.end - now) / 60)
    return {"tokensPerMinute": round(per_minute, 3), "costPerHour": round(per_hour, 6),
            "projection": {"totalTokens": round(tokens + per_minute * remaining),
                           "totalCost": round(usd + per_hour * remaining / 60, 6),
                           "remainingMinutes": round(remaining)}}


def token_limit(spec: str | None, found: list[Block], now: float) -> int | None:
    """``--token-limit``: a number of tokens, or ``max`` (the most any finished block used)."""
    if spec is None:
        return None
    if spec == "max":
        done = [b.sums.tokens[_TOTAL] for b in found if not b.gap and not b.active(now)]
        return max(done) if done else None
    if spec.isdigit() and int(spec) > 0:
        return int(spec)
    raise ValueError(f"--token-limit must be a positive number of tokens or 'max', not {spec!r}")


def report(contribs, opts: Options, active_only: bool = False, limit: str | None = None,
           now: float | None = None) -> dict:
    """``{"blocks": [...], "totals", "timezone", "tokenLimit"}`` (ccusage's block fields with
    memfs's beside them); ``active_only``: the active block alone (an empty list: none)."""
    now = time.time() if now is None else now
    found = blocks(contribs, opts)
    cap = token_limit(limit, found, now)
    if opts.last is not None:
        real = [b for b in found if not b.gap][-opts.last:]
        found = [b for b in found if b.start >= real[0].start] if real else []
    rows = []
    total = Sum()
    for b in found:
        active = b.active(now)
        if active_only and not active:
            continue
        row = _row(b, active, opts.tz, now)
        if cap is not None and not b.gap:
            row["tokenLimit"] = cap
            row["percentUsed"] = round(100 * b.sums.tokens[_TOTAL] / cap, 1)
        rows.append(row)
        if not b.gap:
            for session in b.sums.sessions:
                total.sessions.add(session)
    if opts.order == "desc":
        rows.reverse()
    for b in found:
        if not b.gap and (not active_only or b.active(now)):
            _merge(total, b.sums)
    totals = total.fields()
    totals.pop("modelBreakdowns", None)
    return {"by": "block", "timezone": zone_name(opts.tz), "tokenLimit": cap, "blocks": rows,
            "totals": totals, "prices": prices.table().describe()}


def _merge(into: Sum, part: Sum) -> None:
    into.turns += part.turns
    into.tokens = [a + b for a, b in zip(into.tokens, part.tokens)]
    into.usd += part.usd
    into.unpriced_turns += part.unpriced_turns
    for model, reason in part.unpriced.items():
        into.unpriced.setdefault(model, reason)
    into.refused.update(part.refused)
    into.agent = [a + b for a, b in zip(into.agent, part.agent)]
    if into.models is not None and part.models is not None:
        for model, sub in part.models.items():
            mine = into.models.setdefault(model, Sum(models=False))
            _merge(mine, sub)


def _row(b: Block, active: bool, tz: tzinfo | None, now: float) -> dict:
    def iso(at: float) -> str:
        return local(at, tz).isoformat(timespec="seconds")

    s = b.sums
    row = {"id": iso(b.start), "startTime": iso(b.start), "endTime": iso(b.last if b.gap else b.end),
           "actualEndTime": iso(b.last) if not b.gap else None, "isActive": active, "isGap": b.gap,
           "entries": s.turns, "turns": s.turns, "sessions": len(s.sessions),
           "tokenCounts": {"inputTokens": s.tokens[0], "outputTokens": s.tokens[3],
                           "cacheCreationInputTokens": s.tokens[2], "cacheReadInputTokens": s.tokens[1]},
           "totalTokens": s.tokens[_TOTAL], "costUSD": round(s.usd, 6), "tokens": dict(zip(_KEYS, s.tokens)),
           **s.cost_fields(), "models": sorted(str(m) for m in (s.models or {}) if m is not None)}
    if active:
        row["burnRate"] = burn(b, now)
        row["projection"] = row["burnRate"].pop("projection") if row["burnRate"] else None
        row["remainingMinutes"] = round(max(0.0, (b.end - now) / 60))
    return row
