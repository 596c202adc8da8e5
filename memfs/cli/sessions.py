"""``memfs sessions``, ``show`` and ``search``: reading a store."""

from __future__ import annotations

import argparse
import shutil

import orjson

from memfs.cli.common import Commands, _config, _existing, _json, _out, _out_bytes, _root, _size, _table, _Usage
from memfs.store import listing


def cmd_sessions(args: argparse.Namespace) -> int:
    from memfs.usage.reporting import listed

    root = _root(args)
    every, sessions, usage = listed(root, listing.Filter(args.agent, args.project, args.status, args.since))
    if args.json:
        _json([listing.entry(s, usage.get(s.name)) for s in sessions])
    elif not sessions:
        _out(f"no sessions in {root}" if not every else f"none of the {every} sessions in {root} match")
    else:
        _table(listing.rows(sessions, shutil.get_terminal_size((100, 24)).columns, usage), right=listing.RIGHT)
    return 0


def _since(text: str) -> float:
    try:
        return listing.parse_since(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def cmd_show(args: argparse.Namespace) -> int:
    from memfs.store.describe import describe
    from memfs.store.session import open_session

    root = _root(args)
    with open_session(root, args.session, read_only=True) as handle:
        if args.view:
            from memfs.views import render_view

            _out_bytes(render_view(handle, args.view))  # the view's bytes, control characters made visible
            return 0
        if args.turn is not None:
            start, end, outcome = handle.turn_range(args.turn)
            events = handle.reconstruct_turn(args.turn)
            if args.json:
                _json({"turn": args.turn, "outcome": outcome, "start_offset": start, "end_offset": end,
                       "events": events})
            else:
                for event in events:
                    _out(orjson.dumps(event).decode())
            return 0
        info = describe(handle)
        _record_times(handle, info["turns"])
    if args.json:
        _json(info)
        return 0
    manifest, turns, pin = info["manifest"], info["turns"], info["pin"]
    # turn_count counts closed turns (abandoned ones too); the table also lists the open one
    lines = [
        ("session", manifest["session_id"] + ("" if manifest["session_id"] == info["name"] else f" (dir {info['name']})")),
        ("status", manifest["status"] + (" (in a turn)" if manifest["in_turn"] else "")),
        ("turns", f"{manifest['turn_count']} closed" + (", 1 open" if manifest["in_turn"] else "")
                  + (f" (retained from {manifest['retained_turn_base']})"
                     if manifest["retained_turn_base"] > 1 else "")),
        ("events", str(manifest["event_count"])),
        ("created", manifest["created_at"]),
        ("updated", manifest["updated_at"]),
        ("log", _size(info["log_bytes"])),
        ("rejected", str(info["rejected"])),
        ("pinned", "no" if pin is None else f"yes ({pin.get('reason', '')})"),
        ("live", "yes" if info["live"] else "no"),
    ]
    for key, value in lines:
        _out(f"{key:<9} {value}")
    if turns:
        _out()
        rows = [["TURN", "OUTCOME", "EVENTS", "OFFSETS", "STARTED", "ENDED"]]
        for t in turns:
            rows.append([str(t["turn_number"]), t.get("outcome", "?"), str(t["event_count"]),
                         f"{t['start_offset']}-{t['end_offset']}", t["started_at"] or "-", t["completed_at"] or "-"])
        _table(rows, right={0, 2})
    return 0


def _record_times(handle, turns: list[dict]) -> None:
    """The turns' times as their records tell them (SPEC §4.2 ``trajectory.jsonl``: the agent's
    own clock when its events carry one — an imported session's original times — else when memfs
    received them), never the two mixed: a turn whose start its records tell but not its end
    has no end (the arrival of an imported turn is the import's time)."""
    from memfs.views import render_view

    told = {}
    for line in render_view(handle, "trajectory.jsonl").splitlines():
        t = orjson.loads(line)
        told[t["turn"]] = (t.get("started_at"), t.get("completed_at"))
    for t in turns:
        started, completed = told.get(t["turn_number"], (None, None))
        if started is not None and started != t["started_at"]:  # the records' clock, not memfs's
            t["started_at"], t["completed_at"] = started, completed if completed != t["completed_at"] else None


# memfs search's option flags: SPEC §5.1's names (``--in`` is stored as ``in_``)
_SEARCH_FLAGS = ("k", "min_score", "stem", "stopwords", "in", "agent", "project", "status", "since", "until",
                 "session", "distinct")


def cmd_search(args: argparse.Namespace) -> int:
    config = _config(args)
    from memfs.errors import BadQuery
    from memfs.search import search_store
    from memfs.search.options import parse_options

    given = {name: getattr(args, "in_" if name == "in" else name) for name in _SEARCH_FLAGS}
    try:  # one validator for the flags, the config's [search] and the mount's parameters
        options = parse_options({k: v for k, v in given.items() if v is not None},
                                parse_options(config.search.params()))
    except BadQuery as exc:
        raise _Usage(f"search: {exc}") from None
    results = list(search_store(_existing(config.sessions_root()), args.query, options=options))
    if args.json:
        _json(results)
        return 0
    if not results:
        _out("no results")
    for r in results:
        snippet = " ".join(str(r.get("snippet", "")).split())
        _out(f"{r['score']:.4f}\t{r['chunk_id']}\t{snippet}")
    return 0


def register(c: Commands) -> None:
    p = c.add("sessions", cmd_sessions, json=True,
              epilog="Columns: last activity (UTC), agent, project, title, turns, status, tokens, cost, session. "
                     "--json carries every field of each session's metadata (index/about.json).")
    p.add_argument("--agent", metavar="NAME", help="only sessions of this agent (claude, codex, gemini, vtcode, ...)")
    p.add_argument("--project", metavar="P", help="only sessions of this project: its path or name, or a directory "
                                                  "the session ran in or under")
    p.add_argument("--status", choices=listing.STATUSES, help="only sessions with this status")
    p.add_argument("--since", type=_since, metavar="WHEN",
                   help="only sessions active since WHEN: a date or time (2026-01-31, UTC) or an age (7d, 12h)")

    p = c.add("show", cmd_show, json=True)
    p.add_argument("session", metavar="SESSION")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--turn", type=int, metavar="N", help="print the events of turn N, one JSON object a line")
    what.add_argument("--view", metavar="NAME", help="print a derived view (e.g. memory.json, summary.md)")


def register_search(c: Commands) -> None:
    p = c.add("search", cmd_search, json=True,
              epilog="Every option is also a parameter of a mount's search files (search/<query>?in=all&stem=english) "
                     "and a [search] default of the config; unset, the search is SPEC 5's exact BM25.")
    p.add_argument("query", metavar="QUERY")
    p.add_argument("--session", metavar="S", help="search this session only")
    p.add_argument("-k", metavar="N", help="number of results, at least 1 (default 6; as ?k=N "
                                           "on a mount's search files)")
    p.add_argument("--min-score", metavar="X", help="drop results scoring below X (default 0)")
    p.add_argument("--stem", metavar="none|english", help="english: Snowball stemming, so failing finds failed")
    p.add_argument("--stopwords", metavar="none|english", help="english: drop common English words")
    p.add_argument("--in", dest="in_", metavar="facts|output|all",
                   help="output: commands' outputs, tool results and failure details; all: those and the facts")
    p.add_argument("--agent", metavar="NAME", help="only sessions of this agent (claude, codex, gemini, vtcode, ...)")
    p.add_argument("--project", metavar="P", help="only sessions of this project (a path or its basename)")
    p.add_argument("--status", metavar="failed|completed|open", help="only documents of turns with this outcome")
    p.add_argument("--since", metavar="WHEN", help="only turns from WHEN on: a date or time (UTC) or an age (7d, 12h)")
    p.add_argument("--until", metavar="WHEN", help="only turns up to WHEN (a bare date: its whole day)")
    p.add_argument("--distinct", metavar="none|session", help="session: at most one result (its best) per session")
