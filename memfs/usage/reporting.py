"""Store-wide usage (SPEC §12): each session's contribution, grouped by day, model, project,
agent or session, with totals — what ``memfs usage`` prints and the mount's ``usage/`` files hold.

A session's **contribution** is the ``days`` rows of its ``derived/usage.json`` (one per UTC day
and model: turns, tokens, cost) with its agent and project. It is read from the copy in the
backing store when that copy is current — its ``source`` names the log length and the
``index/about.json`` it was computed from, and its ``prices`` the table and overrides in force
— else computed from the log (a read-only opening, the views' fold) and the copy replaced, so
the next report reads one small file per session. Every contribution is also kept in the store
catalog (:mod:`memfs.store.catalog_usage`: checked against the catalog rows' stamps in one query,
dropped whole when the price table or this format changes), so a report reads one small file or
computes one log only for the sessions changed since (:func:`up_to_date`); ``memfs usage``'s
groupings are queries over it (:mod:`memfs.usage.query`), and ``memfs sessions`` reads each
session's total from it (:func:`session_totals`): one record of a session's usage.

:class:`Groups` keeps sums per group that a contribution can be added to and taken out of
again, which is how the mount updates its aggregates by one session's change
(:mod:`memfs.usage.aggregate`). A group's cost is unknown (``null``, with the reason and how many
rows had no price) as soon as one of its rows has no price: a partial sum would be a wrong number.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import orjson

from memfs.errors import MemfsError
from memfs.store.about import ABOUT
from memfs.store.listing import usd
from memfs.store.meta import parse_rfc3339
from memfs.store.paths import DERIVED_DIR, EVENTS, open_nofollow, read_fd
from memfs.usage import INDEX_FORMAT, prices
from memfs.usage.prices import TOKEN_KEYS
from memfs.usage.view import VERSION

log = logging.getLogger("memfs.usage")

BY = ("day", "model", "project", "agent", "session")
VIEW = "usage.json"
INDEX = ".usage-index.json"
_KEYS = (*TOKEN_KEYS, "total")


@dataclass(frozen=True, slots=True)
class Row:
    """One day-and-model row of one session."""

    day: str | None
    model: str | None
    turns: int
    tokens: tuple[int, ...]  # in the order of _KEYS
    cost: float | None
    reason: str | None
    refused: str | None = None  # usage_error: token counts refused (memfs.counts), tokens incomplete


class Use(NamedTuple):
    """One turn of one session, when its record dates it (the reports in a time zone and the
    billing blocks, :mod:`memfs.usage.periods`): per turn, not per request — a turn's requests
    are not dated apart in the log. A tuple: a store's index holds one per turn."""

    at: float  # seconds since the epoch: the turn's end, else its start, else its UTC day's midnight
    model: str | None
    tokens: tuple[int, ...]  # in the order of _KEYS
    cost: float | None
    reason: str | None
    refused: str | None = None
    agent_cost: float | None = None  # the agent's own bill for the turn (Claude: the growth of its total)


def _agent_cost(value) -> float | None:
    """A turn's ``agent_cost_usd`` when it is a finite amount ≥ 0 (read from a file: checked)."""
    ok = type(value) in (int, float) and math.isfinite(value) and value >= 0
    return float(value) if ok else None


@dataclass(frozen=True, slots=True)
class Contribution:
    """What one session adds to the aggregates."""

    session: str
    agent: str | None
    project: str | None
    rows: tuple[Row, ...]
    stamp: tuple  # (events length, about.json identity) it was computed from
    uses: tuple[Use, ...] = ()  # its turns, dated (see Use)
    total: dict | None = None  # what the listing shows of usage.json's ``total`` (listed_total)

    def group(self, by: str) -> str | None:
        """Its group in a grouping by one of its own fields: ``project``, ``agent`` or (any
        other ``by``) ``session``."""
        if by == "project":
            return self.project
        if by == "agent":
            return self.agent
        return self.session


def _at(turn: dict) -> float | None:
    for key in ("completed_at", "started_at"):
        value = turn.get(key)
        at = parse_rfc3339(value) if type(value) is str else None
        if at is not None:
            return at
    day = turn.get("day")
    return parse_rfc3339(day + "T00:00:00Z") if type(day) is str else None


LISTED = ("tokens", "cost_usd", "cost_reason", "usage_error", "models")  # what memfs.store.listing reads of a total


def listed_total(total) -> dict | None:
    """The fields of ``usage.json``'s ``total`` that ``memfs sessions`` and MCP ``list_sessions``
    show (:func:`memfs.store.listing.entry`): kept with the session's contribution."""
    return {k: total[k] for k in LISTED if k in total} if type(total) is dict else None


def contribution(name: str, data: dict) -> Contribution:
    """A session's contribution from its ``usage.json`` content."""
    rows = []
    for r in data.get("days") or ():
        tokens = r.get("tokens") or {}
        rows.append(Row(r.get("day"), r.get("model"), int(r.get("turns") or 0),
                        tuple(int(tokens.get(k) or 0) for k in _KEYS), r.get("cost_usd"), r.get("cost_reason"),
                        r.get("usage_error")))
    uses = []
    for t in data.get("turns") or ():
        at = _at(t)
        if at is not None:
            tokens = t.get("tokens") or {}
            uses.append(Use(at, t.get("model"), tuple(int(tokens.get(k) or 0) for k in _KEYS), t.get("cost_usd"),
                            t.get("cost_reason"), t.get("usage_error"), _agent_cost(t.get("agent_cost_usd"))))
    source = data.get("source") or {}
    about = source.get("about")
    return Contribution(name, data.get("agent"), data.get("project"), tuple(rows),
                        (source.get("events_len"), tuple(about) if about else None), tuple(uses),
                        listed_total(data.get("total")))


def stamp_now(session_dir: str | Path) -> tuple:
    """``(events length, about.json identity)`` of a session now (cheap: two ``lstat``)."""
    d = os.fspath(session_dir)
    try:
        size = os.lstat(os.path.join(d, EVENTS)).st_size
    except OSError:
        size = None
    try:
        st = os.lstat(os.path.join(d, ABOUT))
        about = (st.st_ino, st.st_size, st.st_mtime_ns)
    except OSError:
        about = None
    return size, about


def stored(session_dir: Path) -> dict | None:
    """The backing store's ``derived/usage.json`` when it is current (else None)."""
    try:
        fd = open_nofollow(session_dir / DERIVED_DIR / VIEW, os.O_RDONLY | os.O_NONBLOCK)
        try:
            data = orjson.loads(read_fd(fd))
        finally:
            os.close(fd)
    except (OSError, MemfsError, orjson.JSONDecodeError):
        return None
    if type(data) is not dict or data.get("version") != VERSION or data.get("prices") != prices.table().describe():
        return None
    source = data.get("source") or {}
    about = source.get("about")
    if (source.get("events_len"), tuple(about) if about else None) != stamp_now(session_dir):
        return None
    return data


def compute(root: Path, name: str, write: bool = True) -> dict:
    """A session's ``usage.json`` from its log (a read-only opening); the backing store's copy is
    replaced when ``write`` and the store is writable."""
    from memfs.store.session import open_session
    from memfs.views import persist, render_view

    with open_session(root, name, read_only=True) as handle:
        data = render_view(handle, VIEW)
    if write and os.access(root / name, os.W_OK):
        persist.submit(root / name, VIEW, data)
    return orjson.loads(data)


def usage_of(root: Path, name: str) -> dict:
    """A session's ``usage.json`` content: the current stored copy, else computed."""
    data = stored(root / name)
    return data if data is not None else compute(root, name)


def session_totals(catalog, names) -> dict:
    """``{name: the listed fields of its usage total}`` (:func:`listed_total`) of sessions
    ``names``: from their contributions kept in the store catalog (one query,
    :func:`memfs.store.catalog_usage.totals`) where they are current, else from the session's
    ``derived/usage.json`` (stored or computed), whose contribution the catalog then keeps — the
    one record a usage report reads too. Unreadable sessions are left out."""
    global computed
    from memfs.store import catalog_usage

    key = usage_key()
    out = catalog_usage.totals(catalog, key, names)
    done = []
    for name in names:
        if name not in out:
            try:
                c = load(catalog.root, name)
            except (MemfsError, OSError):
                continue  # unreadable: its row says '-'
            computed += 1
            done.append(c)
            out[name] = c.total
    if done:  # (the views, loaded only when a usage had to be read or computed)
        from memfs.views import persist

        persist.flush()
        keep(catalog.root, done)
    return out


def listed(root: Path, keep=None, limit: int | None = None) -> tuple[int, list, dict]:
    """What ``memfs sessions`` and MCP ``list_sessions`` list: ``(how many sessions the store
    has, the :class:`~memfs.store.sessioninfo.SessionInfo` of those ``keep`` lets through — most
    recent last record first, at most ``limit`` — and their usage totals by name)``, from the store
    catalog brought up to date."""
    from memfs.store.catalog import catalog_of

    catalog = catalog_of(root).current()
    since = getattr(keep, "since", None)  # (a listing.Filter's: asked of the catalog)
    if since is not None:
        every, rows = catalog.recent_rows(since)
    else:
        rows = catalog.rows()
        every = len(rows)
    picked = [(r, r.info()) for r in rows]
    picked = [p for p in picked if keep is None or keep(p[1])][:limit]
    return every, [info for _, info in picked], session_totals(catalog, [r.name for r, _ in picked])


def load(root: Path, name: str, write: bool = True) -> Contribution:
    data = stored(root / name)
    if data is None:
        data = compute(root, name, write)
    return contribution(name, data)


class _Acc:
    __slots__ = ("sessions", "turns", "tokens", "usd", "unpriced", "reasons", "refused")

    def __init__(self) -> None:
        self.sessions: Counter = Counter()
        self.turns = 0
        self.tokens = [0] * len(_KEYS)
        self.usd = 0.0
        self.unpriced = 0
        self.reasons: Counter = Counter()
        self.refused: Counter = Counter()  # usage_error reasons of the rows whose counts were refused

    def add(self, session: str, row: Row, sign: int) -> None:
        if row.refused is not None:
            self.refused[row.refused] += sign
            if self.refused[row.refused] <= 0:
                del self.refused[row.refused]
        self.sessions[session] += sign
        if self.sessions[session] <= 0:
            del self.sessions[session]
        self.turns += sign * row.turns
        for i, n in enumerate(row.tokens):
            self.tokens[i] += sign * n
        if row.cost is None:
            self.unpriced += sign
            self.reasons[row.reason or "no price"] += sign
            if self.reasons[row.reason or "no price"] <= 0:
                del self.reasons[row.reason or "no price"]
        else:
            self.usd += sign * row.cost

    def empty(self) -> bool:
        return not self.sessions

    def to_dict(self) -> dict:
        out = {"sessions": len(self.sessions), "turns": self.turns, "tokens": dict(zip(_KEYS, self.tokens))}
        if self.unpriced:
            reason = self.reasons.most_common(1)[0][0] if self.reasons else "no price"
            out["cost_usd"] = None
            out["cost_reason"] = f"{reason} ({self.unpriced} of the day-and-model rows)"
        else:
            out["cost_usd"] = round(self.usd, 6)
        if self.refused:
            n = sum(self.refused.values())
            out["usage_error"] = f"{self.refused.most_common(1)[0][0]} ({n} of the day-and-model rows)"
        return out


def _key(by: str, c: Contribution, row: Row):
    if by == "day":
        return row.day
    if by == "model":
        return row.model
    return c.group(by)


class Groups:
    """Sums of contributions per group of one grouping, updated by adding or taking out one
    session's contribution (the cost of a change is that session's rows, not the store)."""

    def __init__(self, by: str, since_day: str | None = None):
        if by not in BY:
            raise ValueError(f"--by must be one of {', '.join(BY)}, not {by!r}")
        self.by = by
        self.since_day = since_day
        self.groups: dict = {}
        self.total = _Acc()

    def add(self, c: Contribution, sign: int = 1) -> None:
        for row in c.rows:
            if self.since_day is not None and (row.day is None or row.day < self.since_day):
                continue
            key = _key(self.by, c, row)
            acc = self.groups.get(key)
            if acc is None:
                acc = self.groups[key] = _Acc()
            acc.add(c.session, row, sign)
            if acc.empty():
                del self.groups[key]
            self.total.add(c.session, row, sign)

    def to_dict(self) -> dict:
        """``{"by", "timezone", "since", "rows", "totals", "prices"}``: rows by UTC date for
        ``day`` (``timezone`` says so), else most tokens first."""
        items = list(self.groups.items())
        if self.by == "day":
            items.sort(key=lambda kv: kv[0] or "")
        else:
            items.sort(key=lambda kv: (-kv[1].tokens[-1], str(kv[0])))
        rows = [{self.by: key, **acc.to_dict()} for key, acc in items]
        return {"by": self.by, "timezone": "UTC", "since": self.since_day, "rows": rows,
                "totals": self.total.to_dict(), "prices": prices.table().describe()}


def since_day(since: float | None) -> str | None:
    return time.strftime("%Y-%m-%d", time.gmtime(since)) if since is not None else None


def _index_key() -> list:
    return [VERSION, INDEX_FORMAT, prices.table().describe()]


def usage_key() -> str:
    """What the contributions kept in the store catalog are computed with (JSON text): the view's
    version, their format, the price table in force."""
    return orjson.dumps(_index_key()).decode()


def of_handle(handle) -> Contribution:
    """The contribution of an open session now, from the views' fold (no copy written)."""
    from memfs.views.cache import state_for

    return contribution(handle.path.name, orjson.loads(state_for(handle).render(handle, VIEW, copy=False)))


def keep(root: Path, contribs: list[Contribution]) -> None:
    """Keep ``contribs`` in the store catalog (what a writer that has them in hand calls: an
    import), then forget them from the list. A cache: a failure is left for the next report."""
    from memfs.store import catalog_usage
    from memfs.store.catalog import catalog_of

    if not contribs:
        return
    try:
        catalog_usage.put(catalog_of(root), contribs, usage_key())
    except Exception as exc:  # (the next report computes what is missing)
        log.debug("usage contributions not kept in the catalog of %s: %s", root, exc)
    contribs.clear()


def up_to_date(root: Path, write: bool = True):
    """The store catalog (:class:`memfs.store.catalog.Catalog`) brought up to date, with every
    session's contribution kept in it (:mod:`memfs.store.catalog_usage`): those missing or stale
    are read from the session's current ``derived/usage.json``, else computed from its log (the
    copy then replaced). ``write`` false (a read-only mount): nothing is written, and the
    contributions computed are returned as ``(catalog, {name: Contribution})`` instead of kept."""
    global computed
    from memfs.store import catalog_usage
    from memfs.store.catalog import catalog_of

    catalog = catalog_of(root).current()
    done = {}
    names, mark = catalog_usage.stale(catalog, usage_key())
    failed = False
    for name in names:
        try:
            done[name] = load(root, name, write)
        except (MemfsError, OSError):
            failed = True
            continue  # a session that went away, or cannot be opened: the listing shows why
        computed += 1
    if done and write:
        from memfs.views import persist

        persist.flush()
        catalog_usage.put(catalog, done.values(), usage_key())
        done = {}
    if write and mark is not None and not failed:
        catalog_usage.settled(catalog, mark)
    if write:
        try:
            os.unlink(root / INDEX)  # (the store-level index of earlier versions: the catalog holds it now)
        except OSError:
            pass
    return catalog, done


computed = 0  # contributions this process had to read or compute (not kept in the catalog): tests, benchmarks


def contributions(root: Path, write: bool = True, uses: bool = True) -> dict[str, Contribution]:
    """Every session's contribution now (:func:`up_to_date`); the status line's summary
    (:mod:`memfs.usage.recent`) is rewritten when it is not current, unless ``write`` is false.
    ``uses`` false: the kept contributions without their dated turns (and no summary written)."""
    from memfs.store import catalog_usage
    from memfs.usage import recent

    cursor = recent.catalog_cursor(root)  # (read before the rows: a change meanwhile leaves it stale)
    while True:  # (once more when the catalog was found spoiled and rebuilt meanwhile: its sums are gone)
        catalog, extra = up_to_date(root, write)
        generation = catalog_usage.generation(catalog)
        out = catalog_usage.load(catalog, uses)
        if catalog_usage.generation(catalog) == generation:
            break
    if extra:
        out.update(extra)
        out = dict(sorted(out.items()))
    index_key = usage_key()
    if write and uses and cursor is not None and (recent.read(root) or ("",))[0] != index_key:  # the status line's summary
        recent.write(root, {n: c.uses for n, c in out.items()}, index_key, cursor)
    return out


def report(store, by: str = "day", since: float | None = None) -> dict:
    """See :func:`memfs.usage.report` (the package's function)."""
    groups = Groups(by, since_day(since))
    for c in contributions(Path(store)).values():
        groups.add(c)
    return groups.to_dict()


# --- text ---------------------------------------------------------------------------------------

COLUMNS = ("input", "output", "cache_creation", "cached_input", "total")
TITLES = ("INPUT", "OUTPUT", "CACHE WRITE", "CACHE READ", "TOTAL TOKENS")


def table_rows(doc: dict) -> list[list[str]]:
    """The text table of a report: a header, one line per row, a TOTAL line."""
    by = doc["by"]
    out = [[by.upper(), "SESSIONS", "TURNS", *TITLES, "COST"]]
    for r in [*doc["rows"], {by: "TOTAL", **doc["totals"]}]:
        key = r[by]
        refused = r.get("usage_error")  # token counts refused: the sums are incomplete, never shown
        out.append([str(key) if key is not None else "-", str(r["sessions"]), str(r["turns"]),
                    *("-" if refused else f"{r['tokens'][k]:,}" for k in COLUMNS), usd(r["cost_usd"])])
    return out


def markdown(doc: dict, title: str) -> str:
    """A report as Markdown (the mount's ``usage/*.md``)."""
    rows = table_rows(doc)
    lines = [f"# {title}", "", f"Prices: {doc['prices']['name']} ({doc['prices']['date']}); days are UTC.", "",
             "| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows[1:]]
    unpriced = [r for r in [*doc["rows"], doc["totals"]] if r.get("cost_reason")]
    if unpriced:
        lines += ["", f"No cost where a model has no price: {unpriced[-1]['cost_reason']}."]
    if doc["totals"].get("usage_error"):
        lines += ["", f"No tokens where token counts were refused: {doc['totals']['usage_error']}."]
    return "\n".join(lines) + "\n"
