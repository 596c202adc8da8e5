"""Each session's usage contribution kept in the store catalog (SPEC §12, §14): two tables of
``<root>/.memfs/catalog.sqlite`` beside the sessions' rows (:mod:`memfs.store.catalog_db`).

* ``usage_sessions``: per session the stamp its contribution was computed at — the log's
  length and ``index/about.json``'s identity, in the catalog row's own columns' form
  (``log_size``, ``about_key``) so that one query finds the contributions that are missing or
  stale — its agent, project, dated turns (the billing blocks', the status line's) and the
  fields of its total that ``memfs sessions`` shows (tokens, cost, models: :func:`totals`), as
  JSON — the one record of a session's usage in the catalog;
* ``usage_rows``: its UTC day-and-model rows, one row each, what the mount's ``usage/`` files
  and :func:`memfs.usage.report` group and sum (:mod:`memfs.usage.utcdays`);
* ``usage_buckets``: its dated turns summed per quarter hour (UTC) and model (:func:`buckets`),
  what ``memfs usage`` groups and sums in the user's zone (:mod:`memfs.usage.query`): a quarter
  hour falls in one local day in every zone, and a session's turns come in runs, so a store's
  report reads far fewer rows than it has turns.

The meta key ``usage_key`` names what the contributions were computed with (the view's version,
this format, the price table): another key and every contribution is dropped. A cache inside a
cache: deleting the catalog loses nothing (a report computes what is missing from the sessions'
``derived/usage.json`` or their logs, :func:`memfs.usage.reporting.contributions`); a session
another process changed moves its catalog row's stamp, so its contribution no longer matches
and is computed again. Writes leave the catalog's ``seq`` alone: the change feed is the rows'.
"""

from __future__ import annotations

import contextlib
import sqlite3
import zlib

import orjson

TOKENS = ("input", "cached_input", "cache_creation", "output", "reasoning", "total")  # memfs.usage.reporting._KEYS
BUCKET = 900  # seconds: every UTC offset in use, and every change of one, falls on a quarter hour

_DDL = f"""
CREATE TABLE IF NOT EXISTS usage_sessions (
  name TEXT PRIMARY KEY, log_size INTEGER, about_key TEXT, agent TEXT, project TEXT, uses TEXT, total TEXT);
CREATE TABLE IF NOT EXISTS usage_rows (
  name TEXT NOT NULL, day TEXT, model TEXT, turns INTEGER NOT NULL, {', '.join(f't_{k} INTEGER' for k in TOKENS)},
  cost REAL, reason TEXT, refused TEXT);
CREATE INDEX IF NOT EXISTS usage_rows_name ON usage_rows (name);
CREATE TABLE IF NOT EXISTS usage_buckets (
  name TEXT NOT NULL, bucket INTEGER NOT NULL, model TEXT, reason TEXT, refused TEXT, first INTEGER NOT NULL,
  turns INTEGER NOT NULL, {', '.join(f't_{k} INTEGER' for k in TOKENS)}, cost REAL, unpriced INTEGER, last REAL,
  agent_turns INTEGER, agent_cost REAL, agent_ours REAL, agent_unpriced INTEGER);
CREATE INDEX IF NOT EXISTS usage_buckets_name ON usage_buckets (name);
CREATE TABLE IF NOT EXISTS usage_answers (query TEXT PRIMARY KEY, rows BLOB NOT NULL);
"""
# a report's answers are kept until either table changes (whoever writes it, in its transaction)
_TRIGGERS = [f"CREATE TRIGGER IF NOT EXISTS {table}_{op.lower()} AFTER {op} ON {table} "
             "BEGIN DELETE FROM usage_answers; END"
             for table in ("usage_sessions", "usage_rows", "usage_buckets") for op in ("INSERT", "UPDATE", "DELETE")]
ANSWERS = 16  # the most answers kept…
ANSWER_BYTES = 1 << 20  # …and the largest, compressed

_BUCKET_COLUMNS = ("name", "bucket", "model", "reason", "refused", "first", "turns", *(f"t_{k}" for k in TOKENS),
                   "cost", "unpriced", "last", "agent_turns", "agent_cost", "agent_ours", "agent_unpriced")
_INSERT_BUCKET = (f"INSERT INTO usage_buckets ({', '.join(_BUCKET_COLUMNS)}) "
                  f"VALUES ({', '.join('?' * len(_BUCKET_COLUMNS))})")
_INSERT_ROW = f"INSERT INTO usage_rows VALUES ({', '.join('?' * (7 + len(TOKENS)))})"
_TABLES = ("usage_buckets", "usage_rows", "usage_sessions")


def buckets(name: str, uses) -> list[list]:
    """The rows of ``usage_buckets`` of one session's dated turns (:class:`memfs.usage.reporting.Use`):
    its turns summed per quarter hour (UTC), model, reason for no price and refused counts;
    ``first`` is the first such turn's place in the session."""
    out: dict[tuple, list] = {}
    n = len(TOKENS)
    for i, u in enumerate(uses):
        key = (int(u.at // BUCKET), u.model, u.reason if u.cost is None else None, u.refused, u.cost is None)
        b = out.get(key)
        if b is None:
            b = out[key] = [name, *key[:4], i, 0, *([0] * n), 0.0, 0, u.at, 0, 0.0, 0.0, 0]
        b[6] += 1
        for j, v in enumerate(u.tokens):
            b[7 + j] += v
        if u.cost is None:
            b[8 + n] += 1
        else:
            b[7 + n] += u.cost
        b[9 + n] = max(b[9 + n], u.at)
        if u.agent_cost is not None:
            b[10 + n] += 1
            b[11 + n] += u.agent_cost
            if u.cost is None:
                b[13 + n] += 1
            else:
                b[12 + n] += u.cost
    return list(out.values())


def ensure(db) -> None:
    """The tables exist in ``db`` (a :class:`memfs.store.catalog_db.CatalogDB`; made again with
    a catalog that was deleted or rebuilt)."""
    for statement in [*_DDL.split(";"), *_TRIGGERS]:
        if statement.strip():
            db.query(statement)


# a contribution computed for the log and about.json its session's catalog row has (u: usage_sessions, s: sessions)
_CURRENT = "u.log_size IS (CASE WHEN s.log_size >= 0 THEN s.log_size END) AND u.about_key IS s.about_key"


def stale(catalog, key: str) -> tuple[list[str], str | None]:
    """``(the sessions whose contribution is missing or was computed for another log or
    about.json than the catalog row's, sorted; the mark to pass to settled once they are all
    kept, None when nothing was looked at)``. Contributions of sessions the catalog no longer has are dropped, and all of them
    when ``key`` is not the one they were computed with. Nothing is looked at when no row
    changed since the last :func:`settled` (one read of the catalog's meta)."""
    db = catalog.db

    def work() -> tuple[list[str], str | None]:
        ensure(db)
        meta = dict(db.query("SELECT key, value FROM meta WHERE key IN ('generation', 'seq', 'usage_key', 'usage_seq')"))
        mark = f"{meta.get('generation')}:{meta.get('seq')}"
        if meta.get("usage_key") != key:
            with db.transaction():
                _drop_all(db.conn, key)
        elif meta.get("usage_seq") == mark:
            return [], None
        gone = db.query("SELECT name FROM usage_sessions WHERE name NOT IN (SELECT name FROM sessions)")
        if gone:
            forget(catalog, [g[0] for g in gone])
        rows = db.query(
            "SELECT s.name FROM sessions s LEFT JOIN usage_sessions u ON u.name = s.name "
            f"WHERE u.name IS NULL OR NOT ({_CURRENT}) ORDER BY s.name")
        return [r[0] for r in rows], mark

    return catalog.run(work)


def stale_among(catalog, key: str, names) -> list[str] | None:
    """Those of sessions ``names`` (each in the catalog now) whose contribution is missing or
    stale, as :func:`stale` finds them; None when the contributions kept were computed with
    another ``key`` (all of them are)."""
    db = catalog.db

    def work() -> list[str] | None:
        ensure(db)
        if db.meta("usage_key") != key:
            return None
        return [r[0] for r in db.query(
            "SELECT s.name FROM sessions s LEFT JOIN usage_sessions u ON u.name = s.name "
            f"WHERE s.name IN (SELECT value FROM json_each(?)) AND (u.name IS NULL OR NOT ({_CURRENT}))",
            (orjson.dumps(list(names)).decode(),))]

    return catalog.run(work)


def _drop_all(conn, key: str) -> None:
    for table in _TABLES:
        conn.execute(f"DELETE FROM {table}")
    conn.execute("INSERT OR REPLACE INTO meta VALUES ('usage_key', ?)", (key,))
    conn.execute("DELETE FROM meta WHERE key = 'usage_seq'")


def settled(catalog, mark: str) -> None:
    """Every session's contribution was kept as the catalog stood at ``mark`` (from :func:`stale`)."""
    db = catalog.db

    def work() -> None:
        with db.transaction():
            db.conn.execute("INSERT OR REPLACE INTO meta VALUES ('usage_seq', ?)", (mark,))

    catalog.run(work)


def _about_key(about) -> str | None:
    return orjson.dumps(list(about)).decode() if about else None


def put(catalog, contribs, key: str) -> None:
    """Keep ``contribs`` (:class:`memfs.usage.reporting.Contribution`) computed with ``key``,
    each replacing what its session had, in one transaction (those kept with another key go)."""
    contribs = list(contribs)
    if not contribs:
        return
    db = catalog.db

    def work() -> None:
        ensure(db)
        with db.transaction():
            conn = db.conn
            if db.meta("usage_key") != key:
                _drop_all(conn, key)
            for c in contribs:
                _delete(conn, c.session)
                conn.execute("INSERT INTO usage_sessions VALUES (?, ?, ?, ?, ?, ?, ?)",
                             (c.session, c.stamp[0], _about_key(c.stamp[1]), c.agent, c.project,
                              orjson.dumps([list(u) for u in c.uses]).decode(),
                              orjson.dumps(c.total).decode() if c.total is not None else None))
                conn.executemany(_INSERT_ROW, [(c.session, r.day, r.model, r.turns, *r.tokens, r.cost, r.reason,
                                                r.refused) for r in c.rows])
                conn.executemany(_INSERT_BUCKET, buckets(c.session, c.uses))

    catalog.run(work)


def _delete(conn, name: str) -> None:
    for table in _TABLES:
        conn.execute(f"DELETE FROM {table} WHERE name = ?", (name,))


def forget(catalog, names) -> None:
    """Drop the contributions of sessions ``names``."""
    names = list(names)
    if not names:
        return  # (no write transaction for nothing)
    db = catalog.db

    def work() -> None:
        ensure(db)
        with db.transaction():
            for name in names:
                _delete(db.conn, name)

    catalog.run(work)


def load(catalog) -> dict:
    """Every contribution kept, by session name (:class:`memfs.usage.reporting.Contribution`),
    sorted by name, each session's turns in order — without its day-and-model rows, which are
    summed where they are kept (:mod:`memfs.usage.utcdays`)."""
    from memfs.usage.reporting import Contribution, Use

    db = catalog.db

    def work():
        ensure(db)
        return db.query("SELECT name, log_size, about_key, agent, project, uses, total FROM usage_sessions ORDER BY name")

    out = {}
    for name, size, about_key, agent, project, turns, total in catalog.run(work):
        about = orjson.loads(about_key) if about_key else None
        out[name] = Contribution(name, agent, project, (), (size, tuple(about) if about else None),
                                 tuple(Use(u[0], u[1], tuple(u[2]), *u[3:]) for u in orjson.loads(turns)) if turns else (),
                                 orjson.loads(total) if total else None)
    return out


def totals(catalog, key: str, names=None) -> dict[str, dict | None]:
    """``{name: the listed fields of its usage total}`` (:func:`memfs.usage.reporting.listed_total`)
    of the sessions ``names`` (None: every session) whose contribution is current — computed with
    ``key``, for the log and about.json the catalog row has (what :func:`stale` does not return):
    one query (None: a contribution without one). The others are left out: the caller computes
    them and keeps them (:func:`put`)."""
    db = catalog.db

    def work() -> list[tuple]:
        ensure(db)
        if db.meta("usage_key") != key:
            return []
        sql = f"SELECT u.name, u.total FROM usage_sessions u JOIN sessions s ON s.name = u.name WHERE {_CURRENT}"
        if names is None:
            return db.query(sql)
        return db.query(sql + " AND u.name IN (SELECT value FROM json_each(?))", (orjson.dumps(list(names)).decode(),))

    return {name: orjson.loads(total) if total else None for name, total in catalog.run(work)}


def count(catalog) -> int:
    """How many sessions have a contribution kept."""
    db = catalog.db

    def work() -> int:
        ensure(db)
        return db.query("SELECT count(*) FROM usage_sessions")[0][0]

    return catalog.run(work)


def generation(catalog):
    """The catalog's generation: another once it was rebuilt (deleted, or found spoiled under use),
    so a reader that saw it change read part of its sums from the new, empty tables."""
    return catalog.run(lambda: catalog.db.meta("generation"))


def answer(catalog, key: str) -> bytes | None:
    """The answer kept for ``key`` by :func:`keep` (None: none, or the usage tables changed since)."""
    db = catalog.db

    def work() -> bytes | None:
        ensure(db)
        kept = db.query("SELECT rows FROM usage_answers WHERE query = ?", (key,))
        return zlib.decompress(kept[0][0]) if kept and type(kept[0][0]) is bytes else None

    try:
        return catalog.run(work)
    except zlib.error:
        return None


def keep(catalog, key: str, value: bytes) -> None:
    """Keep ``value`` as the answer to ``key`` until either usage table changes (their triggers
    empty ``usage_answers`` in the writer's transaction); compressed, at most :data:`ANSWERS`,
    none over :data:`ANSWER_BYTES`."""
    db = catalog.db
    packed = zlib.compress(value, 1)
    if len(packed) > ANSWER_BYTES:
        return

    def work() -> None:
        ensure(db)
        with contextlib.suppress(sqlite3.OperationalError), db.transaction():  # (busy: not kept this time)
            db.conn.execute("DELETE FROM usage_answers WHERE rowid NOT IN "
                            "(SELECT rowid FROM usage_answers ORDER BY rowid DESC LIMIT ?)", (ANSWERS - 1,))
            db.conn.execute("INSERT OR REPLACE INTO usage_answers VALUES (?, ?)", (key, packed))

    catalog.run(work)


def grouped(catalog, sql: str, args: tuple = ()) -> list[tuple]:
    """Run a read ``sql`` over the tables (:mod:`memfs.usage.query` builds them)."""
    db = catalog.db

    def work() -> list[tuple]:
        ensure(db)
        return db.query(sql, args)

    return catalog.run(work)
