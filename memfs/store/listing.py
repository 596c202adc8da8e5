"""What ``memfs sessions`` shows of each session (SPEC §8, §10 "Session metadata"): its status,
project and title, the filters, the JSON entry and the table rows.

A row is a :class:`memfs.store.retention.SessionInfo` (the manifest with live counts) and the
session's ``index/about.json`` (:mod:`memfs.store.about`, read by the listing: one small file
per session; a log is never read for this).

Decisions recorded here:

* **status** is ``about.json``'s ``status`` when it has one (``running``, ``completed``,
  ``failed``, ``abandoned``: what the agent's record says); otherwise it comes from the store
  (:func:`status`): a turn open or the session live (a process holds its lock) → ``running``;
  ``active`` with its last turn closed and nobody holding it → ``completed`` (Codex ``exec``
  streams never write ``thread.completed``, so ``active`` alone does not mean running);
  ``completed`` with a turn left open (``memfs gc``'s sweep closed it) → ``abandoned``;
  ``completed`` → ``completed``; an unreadable manifest → ``unknown``. A failed last turn shows
  as ``failed`` only through ``about.json`` (telling it otherwise would read the turn index).
* **project** is ``about.json``'s ``project``, else its ``cwd``; the table shows the basename.
  ``--project P`` matches a session whose project is ``P``, whose project's basename is ``P``,
  or whose cwd or project is ``P`` (made absolute) or under it.
* **title** is ``about.json``'s ``title``, else one made from its ``first_prompt``.
* **tokens** (every token: input, cache reads and writes, output) and **cost** (USD, ``-`` when a
  model has no price) are the session's totals in ``derived/usage.json`` (SPEC §12), which the
  command passes in (``usage``: ``{name: total}``, :mod:`memfs.usage`); ``-`` without one.
* **--since** compares the last activity (``updated_at``, as the listing sorts): an RFC 3339
  date or time (UTC when it has no offset) or an age such as ``7d``, ``12h``, ``30m``, ``2w``.
* The JSON entry is the listing's fields with every ``about.json`` field beside them; ``agent``
  and ``status`` are the ones shown (``about.json``'s when it has them), ``manifest_status`` is
  the store's ``active``/``completed``; ``models`` (the usage total's: every model the turns ran
  on, in order of first use) beside ``model`` (the last turn's).
* Text from ``about.json`` (untrusted: it comes from the agent's files) is shown on one line
  with control characters made visible (:func:`memfs.text.one_line`), so a title never writes
  to the terminal.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass

from memfs.agents import agent_name
from memfs.store.about import prompt_title
from memfs.store.meta import parse_rfc3339
from memfs.text import one_line

STATUSES = ("running", "completed", "failed", "abandoned")
HEADER = ["UPDATED", "AGENT", "PROJECT", "TITLE", "TURNS", "STATUS", "TOKENS", "COST", "SESSION"]
RIGHT = frozenset({4, 6, 7})  # right-aligned columns (numbers)
TITLE_COLUMN = 3
PROJECT_CHARS = 16  # the project's basename is cut to this many characters
MIN_TITLE = 16  # the title keeps at least this many characters, however narrow the terminal
WORD_CHARS = 12  # an agent or status name (from about.json: anything) is cut to this many
_AGE = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhdw])")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def _text(value) -> str | None:
    return value if type(value) is str and value else None


def cut(text: str, chars: int) -> str:
    """``text`` in at most ``chars`` characters, an ellipsis marking a cut."""
    return text if len(text) <= chars else text[:max(chars - 1, 0)] + "…"


def status(info) -> str:
    """The session's status as listed (see the module docstring)."""
    return status_of(info.about, info.status, info.in_turn, info.live, info.readable)


def status_of(about: dict, manifest_status: str, in_turn: bool, live: bool = False, readable: bool = True) -> str:
    """The one status of a session (the module docstring's rule) — the listing's, the store
    catalog's and the views' (``summary.md``, ``context.md``: ``live`` False, a view being a
    function of the records)."""
    told = _text(about.get("status"))
    if told is not None:
        return told
    if not readable:
        return "unknown"
    if manifest_status == "completed":
        return "abandoned" if in_turn else "completed"
    if manifest_status == "active":
        return "running" if in_turn or live else "completed"
    return manifest_status


def project(info) -> str | None:
    """The session's project path (``about.json``'s ``project``, else its ``cwd``)."""
    return _text(info.about.get("project")) or _text(info.about.get("cwd"))


def title(info) -> str | None:
    about = info.about
    if _text(about.get("title")):
        return about["title"]
    return prompt_title(about["first_prompt"]) if _text(about.get("first_prompt")) else None


def _under(path: str | None, top: str) -> bool:
    if path is None or not path.startswith("/"):
        return False
    path = os.path.normpath(path)
    return path == top or path.startswith(top.rstrip("/") + "/")


def project_matches(info, wanted: str) -> bool:
    """``--project wanted``: the project path, its basename, or a cwd (or project) under it."""
    proj = project(info)
    if proj is not None and wanted in (proj, os.path.basename(proj.rstrip("/"))):
        return True
    top = os.path.normpath(os.path.abspath(os.path.expanduser(wanted)))
    return _under(proj, top) or _under(_text(info.about.get("cwd")), top)


def parse_since(text: str, now: float | None = None) -> float:
    """Seconds since the epoch for ``--since`` (see the module docstring); ``ValueError`` with
    the reason otherwise."""
    m = _AGE.fullmatch(text.strip())
    if m is not None:
        return (time.time() if now is None else now) - float(m.group(1)) * _UNIT[m.group(2)]
    when = parse_rfc3339(text.strip())
    if when is None:
        raise ValueError(f"{text!r} is neither a date (2026-01-31, 2026-01-31T12:00Z) nor an age (7d, 12h, 30m, 2w)")
    return when


@dataclass(frozen=True, slots=True)
class Filter:
    """The listing's filters; ``None`` lets everything through."""

    agent: str | None = None
    project: str | None = None
    status: str | None = None
    since: float | None = None  # seconds since the epoch

    def __call__(self, info) -> bool:
        if self.agent is not None and agent_name(self.agent.lower()) != info.agent.lower():
            return False
        if self.status is not None and status(info) != self.status:
            return False
        if self.since is not None and info.updated_ts < self.since:
            return False
        return self.project is None or project_matches(info, self.project)


def usd(value: float | None) -> str:
    """A cost in USD as a listing or a usage table shows it (``-`` for none)."""
    if value is None:
        return "-"
    return f"${value:,.2f}" if value >= 0.01 or value == 0 else f"${value:.4f}" if value >= 0.0001 else "<$0.0001"


def entry(info, total: dict | None = None) -> dict:
    """The ``--json`` entry of a session (see the module docstring)."""
    d = info.to_dict()
    d["status"], d["manifest_status"] = status(info), info.status
    for key, value in info.about.items():
        d.setdefault(key, value)  # agent and status: the ones shown (about.json's when it has them)
    # SPEC §12: derived/usage.json; refused token counts (usage_error): no total
    d["tokens"] = total["tokens"]["total"] if total and not total.get("usage_error") else None
    d["cost_usd"] = total.get("cost_usd") if total else None
    if total and total.get("models"):
        d["models"] = total["models"]  # SPEC §10: the turns' models, in order of first use
    if total and total.get("cost_reason"):
        d["cost_reason"] = total["cost_reason"]
    if total and total.get("usage_error"):
        d["usage_error"] = total["usage_error"]
    return d


def rows(infos, columns: int, usage: dict | None = None) -> list[list[str]]:
    """The table: :data:`HEADER` and one row per session, the titles cut so that a row fits
    ``columns`` characters when it can (the session name is never cut: commands take it)."""
    table = [list(HEADER)]
    for s in infos:
        total = (usage or {}).get(s.name)
        proj = project(s)
        name = s.name if s.session_id == s.name else f"{s.name} ({one_line(s.session_id)})"
        table.append([
            time.strftime("%Y-%m-%d %H:%M", time.gmtime(s.updated_ts)) if s.updated_at else "-",
            cut(one_line(s.agent), WORD_CHARS),
            cut(one_line(os.path.basename(proj.rstrip("/")) or proj), PROJECT_CHARS) if proj else "-",
            one_line(title(s) or "") or "-",
            str(s.turn_count), cut(one_line(status(s)), WORD_CHARS),
            f"{total['tokens']['total']:,}" if total and not total.get("usage_error") else "-",
            usd(total.get("cost_usd")) if total else "-", name])
    widths = [max(len(r[i]) for r in table) for i in range(len(HEADER))]
    rest = sum(widths) - widths[TITLE_COLUMN] + 2 * (len(HEADER) - 1)
    room = max(MIN_TITLE, columns - rest)
    for r in table[1:]:
        r[TITLE_COLUMN] = cut(r[TITLE_COLUMN], room)
    return table
