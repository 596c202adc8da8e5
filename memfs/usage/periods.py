"""``memfs usage``'s reports (SPEC §12): rows by day, week, month, session, model, project or
agent in the user's time zone, filtered by period, project and agent, with ccusage's JSON names.

Built from each session's dated turns (:class:`memfs.usage.reporting.Use`), not from its UTC day
rows, so a period is the user's: ``--tz ZONE`` (a zoneinfo name; ``UTC`` too), else the local
zone (``TZ`` and the system's). A week starts on Monday (ISO 8601) and is named by that date; a
month is ``YYYY-MM``. The mount's ``usage/`` files stay in UTC days (:mod:`memfs.usage.aggregate`).

A row's JSON has memfs's fields (the grouping's key, ``sessions``, ``turns``, ``tokens``,
``cost_usd``: null unless every turn is priced, ``cost_reason``, ``usage_error``) and, for the
same meaning, ccusage's (``date``/``week``/``month``/``sessionId``, ``inputTokens``,
``outputTokens``, ``cacheCreationTokens``, ``cacheReadTokens``, ``totalTokens``, ``totalCost``,
``modelsUsed``, ``modelBreakdowns``); the report lists the rows under ``rows`` and under ccusage's
name (``daily``, ``weekly``, ``monthly``, ``sessions``). ``totalCost`` is the priced part: where
a model has no price, ``priced_cost_usd`` says the same, ``cost_complete`` is false and
``unpriced`` names each such model with its reason. Where turns carry the agent's own bill
(Claude Code's cost, ``agent_cost_usd`` of usage.json's turns), a row says it
(``agent_cost_usd``, ``agent_cost_turns``) and whether it differs by more than 1% from memfs's cost
of those same turns (``agent_cost_differs``; the table then shows "agent says $x").
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo

from memfs.usage import prices
from memfs.usage.reporting import _KEYS, Contribution, Use

BY = ("day", "week", "month", "session", "model", "project", "agent", "block")
PERIODS = ("day", "week", "month")
LISTS = {"day": "daily", "week": "weekly", "month": "monthly", "session": "sessions"}
CCUSAGE_KEYS = {"day": "date", "week": "week", "month": "month", "session": "sessionId"}
CCUSAGE_TOKENS = (("inputTokens", "input"), ("outputTokens", "output"), ("cacheCreationTokens", "cache_creation"),
                  ("cacheReadTokens", "cached_input"), ("totalTokens", "total"))
_INDEX = {k: i for i, k in enumerate(_KEYS)}
AGENT_COST_TOLERANCE = 0.01  # the agent's own cost is shown where it differs from ours by more (relative)


def zone(name: str | None) -> tzinfo | None:
    """The zone ``--tz`` names (None: the local zone); ``ValueError`` with the reason."""
    if name is None:
        return None
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"--tz: unknown time zone {name!r} (a zoneinfo name: UTC, Europe/Paris, "
                         "America/New_York)") from None


def zone_name(tz: tzinfo | None) -> str:
    if tz is not None:
        return str(tz)
    return f"local ({time.strftime('%Z')})"


def local(at: float, tz: tzinfo | None) -> datetime:
    return datetime.fromtimestamp(at, tz) if tz is not None else datetime.fromtimestamp(at).astimezone()


def period(at: float, by: str, tz: tzinfo | None) -> str:
    """The name of the period of ``by`` that ``at`` falls in, in ``tz``."""
    d = local(at, tz)
    if by == "day":
        return d.strftime("%Y-%m-%d")
    if by == "week":
        return (d.date() - timedelta(days=d.weekday())).isoformat()
    return d.strftime("%Y-%m")


def last_periods(by: str, n: int, now: float, tz: tzinfo | None) -> set[str]:
    """The names of the ``n`` periods of ``by`` up to the one ``now`` is in."""
    d = local(now, tz).date()
    out = []
    if by == "day":
        out = [(d - timedelta(days=i)).isoformat() for i in range(n)]
    elif by == "week":
        monday = d - timedelta(days=d.weekday())
        out = [(monday - timedelta(weeks=i)).isoformat() for i in range(n)]
    else:
        y, m = d.year, d.month
        for _ in range(n):
            out.append(f"{y:04d}-{m:02d}")
            y, m = (y, m - 1) if m > 1 else (y - 1, 12)
    return set(out)


def day_start(text: str, tz: tzinfo | None, next_day: bool = False) -> float | None:
    """Seconds since the epoch of the start of the day ``text`` names (``2026-01-31`` or
    ccusage's ``20260131``) in ``tz`` (of the day after, ``next_day``); None: not a date."""
    for fmt in ("%Y-%m-%d", "%Y%m%d"):
        try:
            day = datetime.strptime(text.strip(), fmt)
        except ValueError:
            continue
        if next_day:
            day += timedelta(days=1)
        if tz is not None:
            return day.replace(tzinfo=tz).timestamp()
        return time.mktime(day.timetuple())
    return None


@dataclass(frozen=True, slots=True)
class Options:
    """What rows a report has: the grouping and its filters."""

    by: str = "day"
    tz: tzinfo | None = None
    since: float | None = None  # seconds since the epoch: turns at or after it
    until: float | None = None  # turns before it
    last: int | None = None  # the last N periods (day, week, month)
    project: str | None = None  # a project's path or its last component
    agent: str | None = None
    order: str | None = None  # asc | desc (periods: asc; other groupings: most tokens first)


class Sum:
    """Turns added up: tokens, the priced cost and what has no price, refused counts."""

    __slots__ = ("sessions", "turns", "tokens", "usd", "unpriced", "unpriced_turns", "refused", "models", "last",
                 "agent", "counted")

    def __init__(self, models: bool = True) -> None:
        self.sessions: set[str] = set()
        self.turns = 0
        self.tokens = [0] * len(_KEYS)
        self.usd = 0.0  # the priced part
        self.unpriced: dict[str, str] = {}  # model -> the first reason it has no cost
        self.unpriced_turns = 0
        self.refused: Counter = Counter()  # usage_error -> turns
        self.models: dict[str | None, Sum] | None = {} if models else None
        self.last = 0.0  # the latest turn's time
        self.agent = [0, 0.0, 0.0, 0]  # turns with the agent's own cost: count, its sum, ours, ours unpriced
        self.counted: int | None = None  # how many sessions, when counted elsewhere (memfs.usage.query): not in sessions

    def add(self, session: str, use: Use) -> None:
        self.sessions.add(session)
        self.turns += 1
        for i, n in enumerate(use.tokens):
            self.tokens[i] += n
        self.last = max(self.last, use.at)
        if use.cost is None:
            self.unpriced_turns += 1
            self.unpriced.setdefault(use.model or "(no model)", use.reason or "no price")
        else:
            self.usd += use.cost
        if use.refused is not None:
            self.refused[use.refused] += 1
        if use.agent_cost is not None:
            self.agent[0] += 1
            self.agent[1] += use.agent_cost
            if use.cost is None:
                self.agent[3] += 1
            else:
                self.agent[2] += use.cost
        if self.models is not None:
            part = self.models.get(use.model)
            if part is None:
                part = self.models[use.model] = Sum(models=False)
            part.add(session, use)

    def cost_fields(self) -> dict:
        out: dict = {"cost_usd": round(self.usd, 6) if not self.unpriced_turns else None}
        if self.unpriced_turns:
            first = next(iter(self.unpriced.values()))
            out["cost_reason"] = f"{first} ({self.unpriced_turns} turns without a price)"
            out["priced_cost_usd"] = round(self.usd, 6)
            out["unpriced_turns"] = self.unpriced_turns
            out["cost_complete"] = False
            out["unpriced"] = dict(sorted(self.unpriced.items()))
        out.update(self.agent_fields())
        if self.refused:
            reason, _ = self.refused.most_common(1)[0]
            out["usage_error"] = f"{reason} ({sum(self.refused.values())} turns with refused token counts)"
        return out

    def agent_fields(self) -> dict:
        """The agents' own bill for the turns that carry one (Claude Code's cost) and whether it
        differs from memfs's cost of those same turns by more than 1% (or they have no price)."""
        turns, said, ours, unpriced = self.agent
        if not turns:
            return {}
        differs = unpriced > 0 or abs(said - ours) > AGENT_COST_TOLERANCE * max(ours, said)
        return {"agent_cost_usd": round(said, 6), "agent_cost_turns": turns, "agent_cost_differs": differs}

    def ccusage(self) -> dict:
        out: dict = {name: self.tokens[_INDEX[key]] for name, key in CCUSAGE_TOKENS}
        out["totalCost"] = round(self.usd, 6)
        return out

    def fields(self) -> dict:
        out = {"sessions": len(self.sessions) if self.counted is None else self.counted, "turns": self.turns, "tokens": dict(zip(_KEYS, self.tokens)),
               **self.cost_fields(), **self.ccusage()}
        if self.models is not None:
            models = sorted(self.models.items(), key=lambda kv: (-kv[1].usd, -kv[1].tokens[-1], str(kv[0])))
            out["modelsUsed"] = sorted(str(m) for m in self.models if m is not None)
            out["modelBreakdowns"] = [
                {"modelName": model, **{name: part.tokens[_INDEX[key]] for name, key in CCUSAGE_TOKENS[:4]},
                 "cost": round(part.usd, 6), "turns": part.turns, **part.cost_fields()}
                for model, part in models]
        return out


def selected(contribs, opts: Options, now: float | None = None):
    """``(session, contribution, use)`` of every turn the options let through."""
    keep = last_periods(opts.by, opts.last, time.time() if now is None else now, opts.tz) \
        if opts.last is not None and opts.by in PERIODS else None
    for c in contribs:
        if opts.agent is not None and (c.agent or "unknown") != opts.agent:
            continue
        if opts.project is not None and not _project_is(c.project, opts.project):
            continue
        for use in c.uses:
            if opts.since is not None and use.at < opts.since:
                continue
            if opts.until is not None and use.at >= opts.until:
                continue
            if keep is not None and period(use.at, opts.by, opts.tz) not in keep:
                continue
            yield c, use


def _project_is(project: str | None, wanted: str) -> bool:
    if not project:
        return False
    return project == wanted or project.rstrip("/").rsplit("/", 1)[-1] == wanted


def _key(by: str, c: Contribution, use: Use, tz: tzinfo | None):
    if by in PERIODS:
        return period(use.at, by, tz)
    if by == "model":
        return use.model
    return c.group(by)


def report(contribs, opts: Options, now: float | None = None) -> dict:
    """The rows of ``opts.by`` (not ``block``: :mod:`memfs.usage.blocks`) and their totals."""
    groups: dict = {}
    projects: dict[str, str | None] = {}
    total = Sum()
    for c, use in selected(contribs, opts, now):
        key = _key(opts.by, c, use, opts.tz)
        acc = groups.get(key)
        if acc is None:
            acc = groups[key] = Sum()
        acc.add(c.session, use)
        total.add(c.session, use)
        projects[c.session] = c.project
    return document(groups, total, projects, opts)


def document(groups: dict, total: Sum, projects: dict[str, str | None], opts: Options) -> dict:
    """The report of ``groups`` (key -> :class:`Sum`), their ``total`` and the sessions'
    ``projects`` (for ``by == "session"``)."""
    items = list(groups.items())
    if opts.by in PERIODS:
        items.sort(key=lambda kv: kv[0], reverse=opts.order == "desc")
    else:
        items.sort(key=lambda kv: (-kv[1].tokens[-1], str(kv[0])), reverse=opts.order == "asc")
    rows = []
    for key, acc in items:
        row = {opts.by: key, **acc.fields()}
        if opts.by in CCUSAGE_KEYS:
            row[CCUSAGE_KEYS[opts.by]] = key
        if opts.by == "session":
            row["projectPath"] = projects.get(key)
            row["lastActivity"] = local(acc.last, opts.tz).strftime("%Y-%m-%d")
        rows.append(row)
    totals = total.fields()
    totals.pop("modelBreakdowns", None)
    doc = {"by": opts.by, "timezone": zone_name(opts.tz), "since": _iso(opts.since, opts.tz),
           "until": _iso(opts.until, opts.tz), "rows": rows, "totals": totals, "prices": prices.table().describe()}
    if opts.by in LISTS:
        doc[LISTS[opts.by]] = rows
    return doc


def _iso(at: float | None, tz: tzinfo | None) -> str | None:
    return local(at, tz).isoformat(timespec="seconds") if at is not None else None
