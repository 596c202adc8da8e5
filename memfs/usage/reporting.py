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
computes one log only for the sessions changed since (:func:`up_to_date`); the reports are
queries over it (:mod:`memfs.usage.query`, :mod:`memfs.usage.utcdays`), and ``memfs sessions``
reads each session's total from it (:func:`session_totals`): one record of a session's usage.

:func:`report` (the mount's ``usage/`` files, by UTC day) sums the contributions' day-and-model
rows where the catalog keeps them (:mod:`memfs.usage.utcdays`).
"""

from __future__ import annotations

import logging
import math
import os
import time
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


def session_totals(catalog, names, every: bool = False) -> dict:
    """``{name: the listed fields of its usage total}`` (:func:`listed_total`) of sessions
    ``names`` (``every``: they are all the catalog's sessions): from their contributions kept in
    the store catalog (one query, :func:`memfs.store.catalog_usage.totals`) where they are
    current, else from the session's ``derived/usage.json`` (stored or computed), whose
    contribution the catalog then keeps — the one record a usage report reads too. Unreadable
    sessions are left out."""
    global computed
    from memfs.store import catalog_usage

    key = usage_key()
    out = catalog_usage.totals(catalog, key, None if every else names)
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
    return every, [info for _, info in picked], session_totals(catalog, [r.name for r, _ in picked],
                                                               every=len(picked) == every)


def load(root: Path, name: str, write: bool = True) -> Contribution:
    data = stored(root / name)
    if data is None:
        data = compute(root, name, write)
    return contribution(name, data)


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


def up_to_date(root: Path, write: bool = True, background: bool = False):
    """The store catalog (:class:`memfs.store.catalog.Catalog`, its checks of the disk on a thread
    of their own with ``background``) brought up to date, with every session's contribution kept
    in it (:mod:`memfs.store.catalog_usage`): those missing or stale are read from the session's
    current ``derived/usage.json``, else computed from its log (the copy then replaced, unless
    ``write`` is false: a read-only mount writes no session; the catalog is memfs's own cache,
    in memory when the store cannot be written)."""
    global computed
    from memfs.store import catalog_usage
    from memfs.store.catalog import catalog_of

    catalog = catalog_of(root).current(background=background)
    key = usage_key()
    names, mark = catalog_usage.stale(catalog, key)
    failed = False
    done: list[Contribution] = []
    for i, name in enumerate(names, 1):
        try:
            done.append(load(root, name, write))
        except (MemfsError, OSError):
            failed = True  # a session that went away, or cannot be opened: the listing shows why
        else:
            computed += 1
        if done and (len(done) >= KEEP or i == len(names)):  # (kept as they come: a store's are not held at once)
            if write:
                from memfs.views import persist

                persist.flush()
            catalog_usage.put(catalog, done, key)
            done.clear()
    if mark is not None and not failed:
        catalog_usage.settled(catalog, mark)
    if write:
        try:
            os.unlink(root / INDEX)  # (the store-level index of earlier versions: the catalog holds it now)
        except OSError:
            pass
    return catalog


KEEP = 500  # contributions computed before they are kept (one transaction)
computed = 0  # contributions this process had to read or compute (not kept in the catalog): tests, benchmarks


def settled(root: Path, read, write: bool = True):
    """``read(catalog)`` over the catalog :func:`up_to_date` made, asked again when the catalog
    was found spoiled and rebuilt meanwhile (its sums gone)."""
    from memfs.store import catalog_usage

    while True:
        catalog = up_to_date(root, write)
        generation = catalog_usage.generation(catalog)
        out = read(catalog)
        if catalog_usage.generation(catalog) == generation:
            return out


def contributions(root: Path, write: bool = True) -> dict[str, Contribution]:
    """Every session's contribution now (:func:`up_to_date`), without its day-and-model rows
    (:func:`memfs.store.catalog_usage.load`); the status line's summary (:mod:`memfs.usage.recent`)
    is rewritten when it is not current, unless ``write`` is false."""
    from memfs.store import catalog_usage
    from memfs.usage import recent

    cursor = recent.catalog_cursor(root)  # (read before the rows: a change meanwhile leaves it stale)
    out = settled(root, catalog_usage.load, write)
    index_key = usage_key()
    if write and cursor is not None and (recent.read(root) or ("",))[0] != index_key:  # the status line's summary
        recent.write(root, {n: c.uses for n, c in out.items()}, index_key, cursor)
    return out


def report(store, by: str = "day", since: float | None = None) -> dict:
    """See :func:`memfs.usage.report` (the package's function)."""
    from memfs.usage import utcdays

    return settled(Path(store), lambda catalog: utcdays.document(catalog, by, since_day(since)))


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
