"""The search options of SPEC §5.1 and their one validator, :func:`parse_options`.

The mount's ``search/<query>?…`` parameters, ``memfs search``'s flags and the config's
``[search]`` table all arrive as ``{name: text}`` and go through :func:`parse_options`, so a
value means the same thing everywhere and is refused with the same one-line reason
(:class:`~memfs.errors.BadQuery`: ``EINVAL`` on the mount, exit 2 in the CLI, a config error).

Names: ``k``, ``min_score``, ``stem`` (none|english), ``stopwords`` (none|english), ``in``
(facts|output|all; the field is :attr:`SearchOptions.corpus`), ``agent``, ``project``,
``status`` (failed|completed|open), ``since``, ``until``, ``session``, ``distinct``
(none|session), ``format`` (jsonl|text: the mount's rendering).

Decisions recorded here:

* ``since`` / ``until`` take what ``memfs sessions --since`` takes
  (:func:`memfs.store.listing.parse_since`: an RFC 3339 date or time, UTC without an offset,
  or an age ``7d``, ``12h``, ``30m``, ``2w``) and become unix seconds when parsed. A bare date
  as ``until`` means the end of that day, so ``since=D&until=D`` is the whole of day D.
* A key given twice (a list of values) is refused, never "last wins".
* ``agent``, ``project`` and ``session`` must be non-empty; ``session`` may be a session id or
  a directory name (the searcher sanitizes it as ``memfs search --session`` does).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

from memfs.errors import BadQuery

STEMS = ("none", "english")
STOPWORDS = ("none", "english")
CORPORA = ("facts", "output", "all")
STATUSES = ("failed", "completed", "open")
DISTINCT = ("none", "session")
FORMATS = ("jsonl", "text")

_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_DAY = 86400.0


@dataclass(frozen=True, slots=True)
class SearchOptions:
    """One search's options; the defaults are SPEC §5's exact search (``k``/``min_score`` None:
    the searcher's own defaults)."""

    k: int | None = None
    min_score: float | None = None
    stem: str = "none"
    stopwords: str = "none"
    corpus: str = "facts"  # the ``in`` parameter
    agent: str | None = None
    project: str | None = None
    status: str | None = None
    since: float | None = None  # unix seconds
    until: float | None = None
    session: str | None = None
    distinct: str = "none"
    format: str = "jsonl"

    @property
    def analysis(self) -> tuple[str, str]:
        """``(stem, stopwords)``: which analysed index answers."""
        return self.stem, self.stopwords

    @property
    def turn_filtered(self) -> bool:
        """Whether documents are kept or dropped by their turn (status, time)."""
        return self.status is not None or self.since is not None or self.until is not None


KEYS = ("k", "min_score", "stem", "stopwords", "in", "agent", "project", "status", "since", "until",
        "session", "distinct", "format")
_FIELD = {key: ("corpus" if key == "in" else key) for key in KEYS}
assert set(_FIELD.values()) == {f.name for f in fields(SearchOptions)}


def _choice(key: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise BadQuery(f"{key} must be {' or '.join(allowed)}, not {value!r}")
    return value


def _when(key: str, value: str) -> float:
    from memfs.store.listing import parse_since  # (floor 2; loaded only when a time is given)

    try:
        when = parse_since(value)
    except ValueError as exc:
        raise BadQuery(f"{key}: {exc}") from None
    if key == "until" and _DATE.fullmatch(value.strip()):
        when += _DAY - 0.001  # the end of that day
    return when


def _value(key: str, value: str):
    if key == "k":
        if not (value.isascii() and value.isdigit()) or int(value) < 1:
            raise BadQuery(f"k must be a whole number of at least 1, not {value!r}")
        return int(value)
    if key == "min_score":
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not math.isfinite(number):
            raise BadQuery(f"min_score must be a number, not {value!r}")
        return number
    if key in ("stem", "stopwords"):
        return _choice(key, value, STEMS)
    if key == "in":
        return _choice(key, value, CORPORA)
    if key == "status":
        return _choice(key, value, STATUSES)
    if key == "distinct":
        return _choice(key, value, DISTINCT)
    if key == "format":
        return _choice(key, value, FORMATS)
    if key in ("since", "until"):
        return _when(key, value)
    if not value.strip():  # agent, project, session
        raise BadQuery(f"{key} needs a value")
    return value


def parse_options(params: Mapping[str, str | list[str]], defaults: SearchOptions | None = None) -> SearchOptions:
    """``params`` (``{name: text}``) over ``defaults`` → :class:`SearchOptions`.

    :class:`~memfs.errors.BadQuery` with a one-line reason for an unknown name, a name given
    more than once (a list of several values), or a bad value.
    """
    changes = {}
    for key, raw in params.items():
        if key not in _FIELD:
            raise BadQuery(f"unknown search option {key!r} (known: {', '.join(KEYS)})")
        if isinstance(raw, list | tuple):
            if len(raw) != 1:
                raise BadQuery(f"search option {key!r} given {len(raw)} times")
            raw = raw[0]
        if not isinstance(raw, str):
            raise BadQuery(f"search option {key!r} must be text, not {type(raw).__name__}")
        changes[_FIELD[key]] = _value(key, raw)
    options = replace(defaults or SearchOptions(), **changes)
    if options.since is not None and options.until is not None and options.since > options.until:
        raise BadQuery("since is after until: no turn can match")
    return options

