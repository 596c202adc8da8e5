"""Floor 3: usage and cost (SPEC §12) — a price table, each session's ``derived/usage.json``
and the store-wide aggregates.

* :func:`session_usage` — ``derived/usage.json`` of an open session handle, as a dict
  (:mod:`memfs.usage.view`; a view of the registry like the others, incremental);
* :func:`report` — ``memfs usage --json``: rows grouped by day, model, project, agent or
  session, and their totals (:mod:`memfs.usage.reporting`);
* :mod:`memfs.usage.prices` — the shipped table (``prices.toml``) and the config's overrides;
* :mod:`memfs.usage.aggregate` — the mount's ``usage/`` files, kept up to date by each
  session's contribution.

Imports are lazy: the views' fold imports :mod:`memfs.usage.calls` without loading the rest.
"""

from __future__ import annotations


def session_usage(handle) -> dict:
    """``derived/usage.json`` of ``handle``'s session as a dict."""
    import orjson

    from memfs.views import render_view

    return orjson.loads(render_view(handle, "usage.json"))


def report(store, by: str = "day", since: float | None = None) -> dict:
    """What ``memfs usage --by BY [--since …] --json`` prints: ``{"by", "since", "rows",
    "totals", "prices"}`` over every session of ``store`` (a path); ``since`` in seconds since
    the epoch (rows of days before it are left out)."""
    from memfs.usage.reporting import report as _report

    return _report(store, by, since)
