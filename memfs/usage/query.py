"""``memfs usage``'s reports (:mod:`memfs.usage.periods`) as queries over the contributions kept
in the store catalog (:mod:`memfs.store.catalog_usage`): SQLite groups and sums the dated turns,
so a report costs what changed since the last one (:func:`memfs.usage.reporting.up_to_date`)
and a few grouped reads, not a pass in Python over every turn of the store.

The user's zone enters the query as a ``CASE`` over the instants its UTC offset changes within
the turns' span (found by probing the offset once a day and halving the day where it moved),
so a turn's local day, week (from Monday) and month are SQLite's date functions of its time
plus that offset — the same as :func:`memfs.usage.periods.period`. What is per turn and rare
(the first reason a model has no price, refused counts) is read row by row in the sessions'
order, so the report is the one :func:`memfs.usage.periods.report` makes of the same
contributions, field for field.
"""

from __future__ import annotations

import math
import time
from datetime import date, timedelta, tzinfo
from pathlib import Path

import orjson

from memfs.store import catalog_usage
from memfs.usage import periods, prices
from memfs.usage.periods import PERIODS, Options, Sum

_DAY = 86400
_EPOCH = date(1970, 1, 1)
_SUMS = ", ".join(["sum(b.turns)", *(f"sum(b.t_{k})" for k in catalog_usage.TOKENS), "total(b.cost)",
                   "sum(b.unpriced)", "max(b.last)", "sum(b.agent_turns)", "total(b.agent_cost)", "total(b.agent_ours)",
                   "sum(b.agent_unpriced)"])


def report(root: Path, opts: Options, now: float | None = None, write: bool = True) -> dict:
    """What ``periods.report(contributions(root).values(), opts, now)`` gives (not ``block``)."""
    from memfs.usage.reporting import settled

    return settled(root, lambda catalog: _report(catalog, opts, now), write)


def _report(catalog, opts: Options, now: float | None) -> dict:
    if any(at is not None and at % catalog_usage.BUCKET for at in (opts.since, opts.until)):
        # a bound within a quarter hour: summed in Python
        contribs = catalog_usage.load(catalog)
        return periods.report([contribs[n] for n in sorted(contribs)], opts, now)
    where, args, join = _where(catalog, opts)
    key, kargs, name = _key(catalog, opts)
    join = join or opts.by in ("project", "agent")
    sel = (f"FROM (SELECT b.*, {key} AS k FROM usage_buckets b "
           f"{'JOIN usage_sessions s ON s.name = b.name ' if join else ''}WHERE {where}) b WHERE 1")
    args = (*kargs, *args)
    if opts.last is not None and opts.by in PERIODS:
        keep = periods.last_periods(opts.by, opts.last, time.time() if now is None else now, opts.tz)
        lo, hi = catalog_usage.grouped(catalog, f"SELECT min(b.k), max(b.k) {sel}", args)[0]
        wanted = [k for k in range(lo, hi + 1) if name(k) in keep] if lo is not None else []  # type: ignore[misc]
        sel += f" AND b.k IN ({', '.join('?' * len(wanted))})"
        args = (*args, *wanted)
    described = prices.table().describe()
    asked = orjson.dumps([sel, args, opts.by, opts.order, periods.zone_name(opts.tz), opts.since, opts.until,
                          described], option=orjson.OPT_NON_STR_KEYS).decode()
    kept = catalog_usage.answer(catalog, asked)
    if kept is not None:  # (asked before, and the usage tables have not changed since)
        doc = orjson.loads(kept)
        doc["prices"] = described
        if opts.by in periods.LISTS:
            doc[periods.LISTS[opts.by]] = doc["rows"]  # (the same list, as periods.document makes it)
        return doc
    doc = _grouped(catalog, sel, args, opts, name)
    catalog_usage.keep(catalog, asked, orjson.dumps({k: v for k, v in doc.items() if k != periods.LISTS.get(opts.by)}
                                                    | {"prices": None}))
    return doc


def _grouped(catalog, sel: str, args: tuple, opts: Options, name) -> dict:
    groups: dict = {}
    parts: dict = {}
    for k, model, *sums in catalog_usage.grouped(catalog, f"SELECT b.k, b.model, {_SUMS} {sel} GROUP BY b.k, b.model",
                                                 args):
        part = Sum(models=False)
        part.turns, part.tokens, part.usd, part.unpriced_turns, part.last = sums[0], sums[1:7], *sums[7:10]
        part.agent = sums[10:]
        acc = groups.get(k)
        if acc is None:
            acc = groups[k] = Sum()
            acc.models = {}
        acc.models[model] = part  # type: ignore[index]
        total = parts.get(model)
        if total is None:
            total = parts[model] = Sum(models=False)
        _add(total, part)
    for acc in groups.values():
        for part in acc.models.values():  # type: ignore[union-attr]
            _add(acc, part)
    total = Sum()
    total.models = parts
    for part in parts.values():
        _add(total, part)
    for k, n in catalog_usage.grouped(catalog, f"SELECT b.k, count(DISTINCT b.name) {sel} GROUP BY b.k", args):
        groups[k].counted = n
    total.counted = catalog_usage.grouped(catalog, f"SELECT count(DISTINCT b.name) {sel}", args)[0][0] if groups else 0
    rare = catalog_usage.grouped(catalog, f"SELECT b.k, b.model, b.unpriced, b.reason, b.refused, b.turns {sel} "
                                          "AND (b.unpriced > 0 OR b.refused IS NOT NULL) ORDER BY b.name, b.first", args)
    for k, model, unpriced, reason, refused, turns in rare:  # (in the sessions' and turns' order: the first reason wins)
        acc = groups[k]
        for s in (acc, total, acc.models[model], total.models[model]):  # type: ignore[index]
            if unpriced:
                s.unpriced.setdefault(model or "(no model)", reason or "no price")
            if refused is not None:
                s.refused[refused] += turns
    projects = {}
    if opts.by == "session":
        projects = dict(catalog_usage.grouped(catalog, "SELECT name, project FROM usage_sessions"))
    if name is not None:
        groups = {name(k): acc for k, acc in groups.items()}
    return periods.document(groups, total, projects, opts)


def _add(into: Sum, part: Sum) -> None:
    into.turns += part.turns
    into.tokens = [a + b for a, b in zip(into.tokens, part.tokens)]
    into.usd += part.usd
    into.unpriced_turns += part.unpriced_turns
    into.last = max(into.last, part.last)
    into.agent = [a + b for a, b in zip(into.agent, part.agent)]


def _where(catalog, opts: Options) -> tuple[str, tuple, bool]:
    """The SQL condition of the options' filters, its arguments, and whether it needs the
    sessions' table."""
    parts: list[str] = ["1"]
    args: list = []
    if opts.since is not None:
        parts.append(f"b.bucket * {catalog_usage.BUCKET} >= ?")
        args.append(opts.since)
    if opts.until is not None:
        parts.append(f"b.bucket * {catalog_usage.BUCKET} < ?")
        args.append(opts.until)
    if opts.agent is not None:
        parts.append("coalesce(s.agent, 'unknown') = ?")
        args.append(opts.agent)
    if opts.project is not None:
        found = [p for (p,) in catalog_usage.grouped(catalog, "SELECT DISTINCT project FROM usage_sessions")
                 if periods._project_is(p, opts.project)]
        parts.append(f"s.project IN ({', '.join('?' * len(found))})" if found else "0")
        args.extend(found)
    return " AND ".join(parts), tuple(args), opts.agent is not None or opts.project is not None


def _key(catalog, opts: Options):
    """``(the SQL of a turn's group, its arguments, the group's name from the SQL's value)``.
    A period is an integer in SQL — days since the epoch in the zone, weeks from a Monday, months
    from the first one — named here (SQLite's date functions per row cost more than the sums)."""
    if opts.by == "model":
        return "b.model", (), None
    if opts.by == "session":
        return "b.name", (), None
    if opts.by in ("project", "agent"):
        return f"s.{opts.by}", (), None
    if opts.by not in PERIODS:
        raise ValueError(f"no query for --by {opts.by}")
    lo, hi = catalog_usage.grouped(catalog, "SELECT min(bucket), max(bucket) FROM usage_buckets")[0]
    lo, hi = (lo * catalog_usage.BUCKET, (hi + 1) * catalog_usage.BUCKET) if lo is not None else (0, 0)
    first, changes = offsets(lo, hi, opts.tz)
    local = f"(b.bucket * {catalog_usage.BUCKET} + ?)"
    args: list = [first]
    if changes:
        local = (f"(b.bucket * {catalog_usage.BUCKET} + CASE "
                 + " ".join("WHEN b.bucket < ? THEN ?" for _ in changes) + " ELSE ? END)")
        args, off = [], first
        for at, new in changes:
            args += [at // catalog_usage.BUCKET, off]
            off = new
        args.append(off)
    day = f"({local} / {_DAY})"  # (integers: SQLite divides them as such)
    if opts.by == "day":
        return day, tuple(args), lambda k: (_EPOCH + timedelta(days=k)).isoformat()
    if opts.by == "week":  # (the epoch's day was a Thursday: day + 3 counts from a Monday)
        return f"(({day} + 3) / 7)", tuple(args), lambda k: (_EPOCH + timedelta(days=7 * k - 3)).isoformat()
    d0, d1 = (lo + first) // _DAY - 1, (hi + max([first, *(o for _, o in changes)])) // _DAY + 1
    start = (_EPOCH + timedelta(days=d0)).replace(day=1)
    months, m = [], start
    while (m - _EPOCH).days <= d1:
        m = (m + timedelta(days=32)).replace(day=1)
        months.append((m - _EPOCH).days)
    case = "CASE " + " ".join(f"WHEN {day} < ? THEN {i}" for i in range(len(months))) + f" ELSE {len(months)} END"

    def month(k: int) -> str:
        y, mo = divmod(start.year * 12 + start.month - 1 + k, 12)
        return f"{y:04d}-{mo + 1:02d}"

    return case, tuple(x for n in months for x in (*args, n)), month


def _offset(at: float, tz: tzinfo | None) -> int:
    off = periods.local(at, tz).utcoffset()
    return int(off.total_seconds()) if off is not None else 0


def offsets(lo: float, hi: float, tz: tzinfo | None) -> tuple[int, list[tuple[int, int]]]:
    """``(the UTC offset at lo, [(instant, the offset from it on)])`` of ``tz`` (None: the local
    zone) between ``lo`` and ``hi`` (seconds since the epoch)."""
    t = math.floor(lo)
    off = first = _offset(t, tz)
    out = []
    while t < hi:
        nxt = min(t + _DAY, math.floor(hi) + 1)
        new = _offset(nxt, tz)
        if new != off:
            a, b = t, nxt  # offset(a) is off, offset(b) is new: the change is in (a, b]
            while b - a > 1:
                m = (a + b) // 2
                if _offset(m, tz) == off:
                    a = m
                else:
                    b = m
            out.append((b, new))
            off = new
        t = nxt
    return first, out

