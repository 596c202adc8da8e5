"""The store's usage by UTC day, model, project, agent or session (SPEC §12): the mount's
``usage/`` files and :func:`memfs.usage.report`. ``memfs usage`` itself reports in the user's
zone (:mod:`memfs.usage.query`).

A report sums the sessions' day-and-model rows (the ``days`` of each ``derived/usage.json``),
kept one per table row in the store catalog (``usage_rows``, :mod:`memfs.store.catalog_usage`):
SQLite groups them, so a report holds its groups, never the store's contributions. A group's
cost is unknown (``null``, with the most frequent reason and how many rows had no price) as soon
as one of its rows has no price: a partial sum would be a wrong number; a row whose token counts
were refused (:mod:`memfs.counts`) makes its group's ``usage_error``.
"""

from __future__ import annotations

from collections import Counter

from memfs.store import catalog_usage
from memfs.usage import prices

BY = ("day", "model", "project", "agent", "session")
_GROUP = {"day": "r.day", "model": "r.model", "project": "s.project", "agent": "s.agent", "session": "r.name"}
_SUMS = ", ".join(["count(DISTINCT r.name)", "coalesce(sum(r.turns), 0)",
                   *(f"coalesce(sum(r.t_{k}), 0)" for k in catalog_usage.TOKENS), "total(r.cost)",
                   "count(*) - count(r.cost)"])


class _Group:
    __slots__ = ("sums", "reasons", "refused")

    def __init__(self, sums) -> None:
        self.sums = sums  # sessions, turns, the tokens (catalog_usage.TOKENS), cost, rows without a price
        self.reasons: Counter = Counter()  # why rows have no price: how many
        self.refused: Counter = Counter()  # the refused token counts' reasons: how many rows

    def to_dict(self) -> dict:
        sessions, turns, *tokens, usd, unpriced = self.sums
        out = {"sessions": sessions, "turns": turns, "tokens": dict(zip(catalog_usage.TOKENS, tokens))}
        if unpriced:
            reason = self.reasons.most_common(1)[0][0] if self.reasons else "no price"
            out["cost_usd"] = None
            out["cost_reason"] = f"{reason} ({unpriced} of the day-and-model rows)"
        else:
            out["cost_usd"] = round(usd, 6)
        if self.refused:
            n = sum(self.refused.values())
            out["usage_error"] = f"{self.refused.most_common(1)[0][0]} ({n} of the day-and-model rows)"
        return out


def document(catalog, by: str = "day", since_day: str | None = None) -> dict:
    """``{"by", "timezone", "since", "rows", "totals", "prices"}`` over every contribution the
    catalog keeps (:func:`memfs.usage.reporting.up_to_date` first): rows by UTC date for ``day``,
    else most tokens first; ``since_day`` (``YYYY-MM-DD``) leaves out the rows of days before
    it, and those without a day."""
    if by not in BY:
        raise ValueError(f"--by must be one of {', '.join(BY)}, not {by!r}")
    key = _GROUP[by]
    join = "JOIN usage_sessions s ON s.name = r.name " if key.startswith("s.") else ""
    sel = f"FROM usage_rows r {join}WHERE " + ("r.day >= ?" if since_day is not None else "1")
    args = (since_day,) if since_day is not None else ()
    groups = {k: _Group(sums) for k, *sums in catalog_usage.grouped(catalog, f"SELECT {key}, {_SUMS} {sel} GROUP BY 1",
                                                                     args)}
    total = _Group(catalog_usage.grouped(catalog, f"SELECT {_SUMS} {sel}", args)[0])
    rare = catalog_usage.grouped(  # (in the sessions' order: of reasons as frequent, the first one's wins)
        catalog, f"SELECT {key}, r.cost IS NULL, coalesce(r.reason, 'no price'), r.refused {sel} "
                 "AND (r.cost IS NULL OR r.refused IS NOT NULL) ORDER BY r.name, r.rowid", args)
    for k, unpriced, reason, refused in rare:
        for acc in (groups[k], total):
            if unpriced:
                acc.reasons[reason] += 1
            if refused is not None:
                acc.refused[refused] += 1
    items = list(groups.items())
    if by == "day":
        items.sort(key=lambda kv: kv[0] or "")
    else:
        items.sort(key=lambda kv: (-kv[1].sums[-3], str(kv[0])))
    return {"by": by, "timezone": "UTC", "since": since_day, "rows": [{by: k, **acc.to_dict()} for k, acc in items],
            "totals": total.to_dict(), "prices": prices.table().describe()}
