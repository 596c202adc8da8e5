"""Floor 3: usage and cost (SPEC §12) — a price table, each session's ``derived/usage.json``
and the store-wide aggregates.

* :func:`session_usage` — ``derived/usage.json`` of an open session handle, as a dict
  (:mod:`memfs.usage.view`; a view of the registry like the others, incremental);
* :func:`report` — rows grouped by UTC day, model, project, agent or session, and their totals
  (:mod:`memfs.usage.reporting`); ``memfs usage``'s reports in a zone and its billing blocks:
  :mod:`memfs.usage.periods`, :mod:`memfs.usage.blocks` (text: :mod:`memfs.usage.text`);
* :mod:`memfs.usage.prices` — the shipped table (``prices.toml``) and the config's overrides;
* :mod:`memfs.usage.aggregate` — the mount's ``usage/`` files, kept up to date by each
  session's contribution.

Imports are lazy: the views' fold imports :mod:`memfs.usage.calls` without loading the rest.
"""

from __future__ import annotations

VIEW_VERSION = 4  # derived/usage.json's "version" (2: usage_error, token counts refused: memfs.counts; 3: turns priced per request, by_model; 4: total.models)
INDEX_FORMAT = 4  # the contributions kept (2: each session's dated turns; 3: with the agent's cost; 4: in the store catalog)


def session_usage(handle) -> dict:
    """``derived/usage.json`` of ``handle``'s session as a dict."""
    import orjson

    from memfs.views import render_view

    return orjson.loads(render_view(handle, "usage.json"))


def report(store, by: str = "day", since: float | None = None) -> dict:
    """The store's usage in UTC days (what the mount's ``usage/`` files hold):
    ``{"by", "timezone", "since", "rows", "totals", "prices"}`` over every
    session of ``store`` (a path); ``since`` in seconds since the epoch (rows of days before it
    are left out). ``memfs usage`` itself reports in the user's zone (:mod:`memfs.usage.periods`)."""
    from memfs.usage.reporting import report as _report

    return _report(store, by, since)
